"""The wheel as users install it: what it holds, and a small project running on it.

The project below is written into a folder outside the source tree and runs in a virtualenv
that installed only the wheel: migrations, management commands, static files, a socket
handshake and one event under daphne (the WebSocket client is this test's).
"""

from __future__ import annotations

import asyncio
import json
import re
import tarfile
import zipfile
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from tests.helpers import ROOT, WAIT
from tests.installed.conftest import (
    DISTRIBUTION,
    Dist,
    Venv,
    asgi_py,
    manage_py,
    serve,
    write_files,
)

SETTINGS = """
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "smoke-test-only"
DEBUG = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
INSTALLED_APPS = [
    "daphne",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.staticfiles",
    "channels",
    "realtime",
]
ROOT_URLCONF = "smoke.urls"
ASGI_APPLICATION = "smoke.asgi.application"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": BASE_DIR / "db.sqlite3",
        "OPTIONS": {
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
        },
    }
}
USE_TZ = True
STATIC_URL = "static/"
REALTIME_POLLING_INTERVAL = 0.05
"""
URLS = """
from django.urls import include, path

urlpatterns = [path("realtime/", include("realtime.urls"))]
"""
CLIENT = "realtime/static/realtime"
#: The JavaScript client: the file Django serves, and with it the npm package of that folder.
CLIENT_FILES = ["package.json", "realtime.js", "realtime.cjs", "realtime.d.ts", "realtime.d.cts"]
PACKAGE_DATA = [*(f"{CLIENT}/{name}" for name in CLIENT_FILES), "realtime/py.typed"]


def test_the_wheel_holds_the_package_its_data_and_its_migrations(dist: Dist) -> None:
    names = set(zipfile.ZipFile(dist.wheel).namelist())
    for name in [*PACKAGE_DATA, "realtime/migrations/0001_initial.py"]:
        assert name in names
    assert "realtime/management/commands/realtime_trim.py" in names
    assert not any(name.startswith(("tests/", "example_project/")) for name in names)


def test_the_sdist_holds_the_package_data_and_the_readme(dist: Dist) -> None:
    with tarfile.open(dist.sdist) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    for name in [*PACKAGE_DATA, "README.md", "pyproject.toml"]:
        assert name in names


@pytest.fixture(scope="module")
def project(dist: Dist, venv: Venv) -> Venv:
    """The smoke project in the virtualenv that installed the wheel, migrated."""
    venv.run("python", "-m", "pip", "install", "--quiet", str(dist.wheel))
    write_files(
        venv.cwd,
        {
            "smoke/__init__.py": "",
            "smoke/settings.py": SETTINGS,
            "smoke/urls.py": URLS,
            "smoke/asgi.py": asgi_py("smoke.settings"),
            "manage.py": manage_py("smoke.settings"),
        },
    )
    venv.run("python", "manage.py", "migrate", "--no-input")
    return venv


def test_realtime_is_imported_from_the_virtualenv_not_the_source_tree(project: Venv) -> None:
    where = project.run("python", "-c", "import realtime; print(realtime.__file__)").stdout
    assert Path(where.strip()).is_relative_to(project.root)
    assert not Path(where.strip()).is_relative_to(ROOT)


def test_the_installed_realtime_js_is_the_source_trees(project: Venv) -> None:
    found = project.run("python", "manage.py", "findstatic", "realtime/realtime.js").stdout
    path = Path(found.strip().splitlines()[-1].strip())
    assert path.is_relative_to(project.root)
    assert path.read_bytes() == (ROOT / "realtime/static/realtime/realtime.js").read_bytes()


def test_the_installed_client_folder_installs_with_npm_as_the_docs_say(project: Venv) -> None:
    # The install commands of docs/javascript-client.md, run in a fresh npm project with the
    # virtualenv's python: they pack the installed package's folder, offline.
    page = (ROOT / "docs" / "javascript-client.md").read_text()
    section = page[page.index("\n## With npm\n") :]
    section = section[: section.index("\n## ", 1)]
    install = re.search(r"^```sh\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)
    assert install is not None
    project.shell(
        "export npm_config_offline=true npm_config_audit=false npm_config_fund=false"
        f" npm_config_cache={project.cwd / 'npm-cache'}\n"
        f"mkdir npm-project && cd npm-project && npm init -y >/dev/null\n{install[1]}"
    )
    installed = project.cwd / "npm-project" / "node_modules" / "django-realtime-models"
    assert sorted(path.name for path in installed.iterdir()) == sorted(CLIENT_FILES)
    for name in CLIENT_FILES:
        assert (installed / name).read_bytes() == (ROOT / CLIENT / name).read_bytes()


def test_migrations_created_the_table_and_the_commands_are_there(project: Venv) -> None:
    commands = project.run("python", "manage.py", "help", "--commands").stdout.split()
    assert {"realtime_trim", "realtime_stats"} <= set(commands)
    stats = project.run("python", "manage.py", "realtime_stats").stdout
    # The table exists and was read (other tests of this project may have written rows).
    rows = next(line for line in stats.splitlines() if line.startswith("rows:"))
    assert rows.split(":")[1].strip().isdigit()
    project.run("python", "manage.py", "realtime_trim")
    check = project.run("python", "manage.py", "check")
    assert "System check identified no issues" in check.stdout


async def test_a_socket_authenticates_and_hears_an_event_under_daphne(project: Venv) -> None:
    token = await asyncio.to_thread(
        project.django_shell,
        "from django.contrib.auth.models import User; from realtime.auth import issue_token; "
        "print(issue_token(User.objects.create_user('smoke')))",
    )
    port = serve(project, "smoke.asgi:application", log=project.cwd / "daphne.log")

    async with connect(f"ws://127.0.0.1:{port}/api/ws", open_timeout=WAIT) as socket:
        await socket.send(json.dumps({"type": "authenticate", "data": {"token": token}}))
        frames = [json.loads(await asyncio.wait_for(socket.recv(), WAIT))]
        await asyncio.to_thread(
            project.django_shell,
            "from realtime.broadcast import broadcast_to_user; "
            "broadcast_to_user(1, 'smoke.hello', {'ok': True})",
        )
        frames.append(json.loads(await asyncio.wait_for(socket.recv(), WAIT)))
    assert frames == [
        {"type": "auth_success", "data": {"user_id": 1, "scope": None, "scopes": []}},
        {"type": "smoke.hello", "data": {"ok": True}},
    ]


def test_pip_installs_from_a_git_url_of_the_repository(tmp_path: Path) -> None:
    """The quickstart's install command names a git URL; this one names this tree's repository
    (its committed ``HEAD``), so pip builds it from git as it would from the hosted one.

    ``localhost`` because the pip Python 3.11 ships refuses a ``git+file:`` URL with no host."""
    assert (ROOT / ".git").exists(), "the tests run from a git checkout"
    (tmp_path / "work").mkdir()
    venv = Venv(tmp_path / "venv", tmp_path / "work")
    venv.run(
        "python", "-m", "pip", "install", "--quiet", f"{DISTRIBUTION} @ git+file://localhost{ROOT}"
    )
    found = venv.run(
        "python",
        "-c",
        "import pathlib, realtime; "
        "print(pathlib.Path(realtime.__file__).parent / 'static/realtime/realtime.js')",
    )
    script = Path(found.stdout.strip())
    assert script.is_relative_to(venv.root)
    assert script.is_file()
