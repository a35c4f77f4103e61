"""The quickstart's "Add realtime to a new project" section, run as written.

Its fenced blocks are taken from ``docs/quickstart.md`` in order, so the test follows the page:

- ``sh`` blocks run with bash in an empty folder, in a fresh virtualenv; ``pip install
  ./django-realtime-models[...]`` (or ``"django-realtime-models[...] @ git+https://..."``)
  installs the wheel built from this tree instead (``tests/installed/test_wheel.py`` installs
  from a git URL of this tree).
  ``python manage.py runserver`` (without its reloader), ``daphne`` and ``python listen.py``
  keep running, in the background; ``<token>`` stands for
  the token a block printed last. Port 8000 becomes a free port, everywhere.
- ``python`` blocks whose first line is ``# <path>`` are that file (``(add at the end)``:
  appended to it).
- ``json`` blocks are the frames the page promises: ``listen.py`` must print exactly those.
- Other blocks (``html``, ``js``) are for browsers, tested by the JavaScript client's tests.

No command may print a system check warning.
"""

from __future__ import annotations

import http.cookiejar
import json
import re
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import ROOT
from tests.installed.conftest import DISTRIBUTION, Dist, Venv, free_port, wait_for_port

QUICKSTART = ROOT / "docs" / "quickstart.md"
SECTION = "## Add realtime to a new project"
PAGE_PORT = "8000"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)
FILE_COMMENT = re.compile(r"#\s*(\S+\.py)(\s*\(add at the end\))?\s*$")
INSTALL = re.compile(
    rf"(pip install\s+)[\"']?(?:\./)?{DISTRIBUTION}(\[[\w,]+\])?(?:\s*@\s*git\+https://[^\s\"']+)?[\"']?"
)
#: Seconds a promised frame may take to arrive.
FRAME_WAIT = 20


@dataclass
class Block:
    language: str
    code: str


def section_blocks() -> list[Block]:
    """The fenced blocks of the section, in order (up to the next second-level heading)."""
    text = QUICKSTART.read_text()
    assert SECTION in text, f"{QUICKSTART} has no {SECTION!r} section"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return [Block(match[1], match[2]) for match in FENCE.finditer(section)]


class Page:
    """Runs the blocks one by one, remembering what later blocks need."""

    def __init__(self, venv: Venv, wheel: Path) -> None:
        self.venv = venv
        self.wheel = wheel
        self.port = str(free_port())
        self.token: str | None = None
        self.listener_log: Path | None = None
        self.promised: list[dict[str, object]] = []
        self.listener_command = ""

    def run(self, block: Block) -> None:
        if block.language == "python" and FILE_COMMENT.match(block.code.splitlines()[0]):
            self.write_file(block.code)
        elif block.language == "sh":
            self.run_shell(block.code)
        elif block.language == "json":
            self.expect_frames(block.code)

    def write_file(self, code: str) -> None:
        match = FILE_COMMENT.match(code.splitlines()[0])
        assert match is not None
        path = self.venv.cwd / match[1]
        code = code.replace(PAGE_PORT, self.port)
        if match[2]:
            path.write_text(path.read_text() + "\n" + code)
        else:
            path.write_text(code)

    def run_shell(self, script: str) -> None:
        script = INSTALL.sub(lambda found: f"{found[1]}'{self.wheel}{found[2] or ''}'", script)
        script = script.replace(PAGE_PORT, self.port)
        lines = [line for line in script.splitlines() if line.strip()]
        if lines[0].startswith(("daphne ", "python manage.py runserver")):
            self.start_server(lines[0])
            return
        last = lines[-1]
        if "listen.py" in last:
            if len(lines) > 1:
                self.check_quiet(self.venv.shell("\n".join(lines[:-1])))
            self.start_listener(last)
            return
        done = self.venv.shell(script)
        self.check_quiet(done)
        printed = done.stdout.strip().splitlines()
        if printed:
            self.token = printed[-1]

    def check_quiet(self, done: object) -> None:
        output = f"{getattr(done, 'stdout', '')}{getattr(done, 'stderr', '')}"
        assert "WARNINGS:" not in output, output
        assert "realtime.W" not in output, output

    def start_server(self, command: str) -> None:
        log = self.venv.cwd / "server.log"
        args = command.split()
        if "runserver" in args:
            args.append("--noreload")  # the reloader's child would outlive the test's terminate
        process = self.venv.start(*args, log=log)
        wait_for_port(int(self.port), process, log)

    def start_listener(self, command: str) -> None:
        assert self.token, "no block printed a token before the listener"
        assert "<token>" in command
        self.listener_log = self.venv.cwd / "listen.log"
        process = self.venv.start(
            *command.replace("<token>", self.token).split(), log=self.listener_log
        )
        self.wait_for_lines(1, process)
        self.listener_command = command

    def wait_for_lines(self, count: int, process: object = None) -> list[dict[str, object]]:
        assert self.listener_log is not None, "the page promises frames before it listens"
        return [json.loads(line) for line in wait_for_output(self.listener_log, count)]

    def expect_frames(self, code: str) -> None:
        promised = [json.loads(line) for line in code.splitlines() if line.strip()]
        self.promised += promised
        assert self.wait_for_lines(len(self.promised)) == self.promised


def test_the_quickstart_runs_as_written_and_delivers_the_promised_frames(
    dist: Dist, venv: Venv
) -> None:
    blocks = section_blocks()
    assert any(block.language == "json" for block in blocks), "the page promises no frames"
    page = Page(venv, dist.wheel)
    for block in blocks:
        page.run(block)
    assert page.promised, "no frame was checked"
    done = venv.run("python", "manage.py", "check")
    assert "System check identified no issues (0 silenced)." in done.stdout

    # The listener prints a refusal's reason before the socket closes.
    refused_log = venv.cwd / "refused.log"
    venv.start(*page.listener_command.replace("<token>", "not-a-token").split(), log=refused_log)
    first = wait_for_output(refused_log, 1)[0]
    assert json.loads(first)["type"] == "auth_error", refused_log.read_text()

    # The server the page starts serves realtime's client, as the "In a page" block loads it.
    with urllib.request.urlopen(f"http://127.0.0.1:{page.port}/static/realtime/realtime.js") as got:
        assert b"class RealtimeClient" in got.read()

    # The page's sign-in: the account signs in at accounts/login/, then fetches its token.
    token = signed_in_token(page.port, "ann", "change-me")
    done = venv.run("python", "-c", CHECK_TOKEN, token)
    assert done.stdout.strip() == "ann", done.stdout


def wait_for_output(log: Path, count: int) -> list[str]:
    """The lines a background command printed, once there are at least ``count`` (bounded)."""
    deadline = time.monotonic() + FRAME_WAIT
    while True:
        lines = log.read_text().splitlines()
        if len(lines) >= count:
            return lines
        assert time.monotonic() < deadline, f"{log.name} printed only:\n{lines}"
        time.sleep(0.05)


#: Prints the username the token stands for, as the project's realtime reads it.
CHECK_TOKEN = """
import os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
import django
django.setup()
from realtime.auth import get_auth
print(get_auth().user_of_token(sys.argv[1]).username)
"""


def signed_in_token(port: str, username: str, password: str) -> str:
    """Sign in through the login form as a browser does (CSRF cookie and field), then GET the
    token view with the session."""
    base = f"http://127.0.0.1:{port}"
    jar = http.cookiejar.CookieJar()
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    login = f"{base}/accounts/login/?next=/realtime/token"
    form = browser.open(login, timeout=FRAME_WAIT).read().decode()
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form)
    assert found, form
    fields = {"username": username, "password": password, "csrfmiddlewaretoken": found[1]}
    fields["next"] = "/realtime/token"
    request = urllib.request.Request(  # noqa: S310 (an http URL built above)
        login, data=urllib.parse.urlencode(fields).encode(), headers={"Referer": login}
    )
    # Signing in redirects to the token view, as the page says.
    answer = browser.open(request, timeout=FRAME_WAIT).read()
    token = json.loads(answer)["token"]
    assert isinstance(token, str)
    return token
