"""The package as users get it: the sdist and wheel built once per session, virtualenvs
outside the source tree that install the wheel, and processes that run in them.

Nothing here imports the source tree's ``realtime``: each command runs in a fresh virtualenv,
in a temporary folder, with ``PYTHONPATH`` and ``DJANGO_SETTINGS_MODULE`` cleared.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import ROOT

#: The name pip installs.
DISTRIBUTION = "django-realtime-models"
#: Seconds a build, an install or a management command may take; a server may take to listen.
COMMAND_WAIT = 600
LISTEN_WAIT = 30


@dataclass
class Dist:
    """The built distributions."""

    sdist: Path
    wheel: Path


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    """Build the sdist, then the wheel from it (as ``python -m build`` does by default)."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=COMMAND_WAIT,
    )
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return Dist(sdist, wheel)


class Venv:
    """A fresh virtualenv in ``root``; commands run in ``cwd`` with only its ``bin`` added."""

    def __init__(self, root: Path, cwd: Path) -> None:
        self.root = root
        self.cwd = cwd
        subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=120)
        self.env = {
            name: value
            for name, value in os.environ.items()
            if name not in {"PYTHONPATH", "DJANGO_SETTINGS_MODULE", "VIRTUAL_ENV", "PYTHONHOME"}
        }
        self.env["PATH"] = f"{root / 'bin'}{os.pathsep}{self.env.get('PATH', '')}"
        self.env["VIRTUAL_ENV"] = str(root)
        self.processes: list[subprocess.Popen[str]] = []

    @property
    def python(self) -> str:
        return str(self.root / "bin" / "python")

    def attempt(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run a command in the folder, whatever its exit code (for commands meant to fail)."""
        return subprocess.run(
            args,
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=COMMAND_WAIT,
            check=False,
        )

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run a command in the folder; fail the test with its output unless it succeeds."""
        done = self.attempt(*args)
        assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"
        return done

    def django_shell(self, code: str) -> str:
        """Run ``code`` with ``manage.py shell -c``; the last line it printed (``shell`` may
        first say what it imported), or ``""``."""
        printed = self.run("python", "manage.py", "shell", "-c", code).stdout.strip()
        return printed.splitlines()[-1] if printed else ""

    def shell(self, script: str) -> subprocess.CompletedProcess[str]:
        """Run a bash script in the folder, stopping at its first failing command."""
        return self.run("bash", "-e", "-o", "pipefail", "-c", script)

    def start(self, *args: str, log: Path) -> subprocess.Popen[str]:
        """Start a long-running command; its output goes to ``log``. Stopped at teardown."""
        with open(log, "w") as out:
            process = subprocess.Popen(
                args, cwd=self.cwd, env=self.env, stdout=out, stderr=subprocess.STDOUT, text=True
            )
        self.processes.append(process)
        return process

    def stop_all(self) -> None:
        for process in self.processes:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Venv]:
    """A fresh virtualenv and an empty working folder, both outside the source tree."""
    base = tmp_path_factory.mktemp("installed")
    (base / "work").mkdir()
    environment = Venv(base / "venv", base / "work")
    yield environment
    environment.stop_all()


def write_files(root: Path, files: dict[str, str]) -> None:
    """Write each file (a path relative to ``root``: its text), making its folders."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def manage_py(settings_module: str) -> str:
    """A project's ``manage.py``, as ``startproject`` writes it in essence."""
    return f"""
import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "{settings_module}")
from django.core.management import execute_from_command_line

execute_from_command_line(sys.argv)
"""


#: The socket's route as the quickstart writes it.
GUARDED_ROUTE = "SocketOriginValidator(URLRouter(websocket_urlpatterns))"


def asgi_py(settings_module: str, route: str = GUARDED_ROUTE) -> str:
    """A project's ``asgi.py`` serving HTTP with Django and the socket by ``route``."""
    return f"""
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "{settings_module}")
django_application = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter
from channels.security.websocket import AllowedHostsOriginValidator

from realtime.origins import SocketOriginValidator
from realtime.routing import websocket_urlpatterns

application = ProtocolTypeRouter(
    {{
        "http": django_application,
        "websocket": {route},
    }}
)
"""


def serve(venv: Venv, application: str, log: Path) -> int:
    """Start daphne on a free port with ``application``; its port, once it listens."""
    port = free_port()
    server = venv.start("daphne", "-p", str(port), application, log=log)
    wait_for_port(port, server, log)
    return port


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for_port(port: int, process: subprocess.Popen[str], log: Path) -> None:
    """Wait (bounded) until something listens on ``port``; fail if ``process`` exits first."""
    deadline = time.monotonic() + LISTEN_WAIT
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the server exited:\n{log.read_text()}"
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise AssertionError(f"nothing listened on {port}:\n{log.read_text()}")
