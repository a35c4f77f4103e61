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

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run a command in the folder; fail the test with its output unless it succeeds."""
        done = subprocess.run(
            args,
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=COMMAND_WAIT,
            check=False,
        )
        assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"
        return done

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
