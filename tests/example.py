"""The example project in processes of its own, on its own SQLite file, for end-to-end tests.

``ExampleProject`` migrates and seeds a fresh database, serves the project either as
``scripts/example`` does (``manage.py runserver``) or with daphne on its own ASGI application
(``example_project.asgi:application``), and makes writes from other processes
(``manage.py shell``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import ROOT
from tests.live import free_port

#: Seconds a server may take to listen, and a management command to finish.
START_WAIT = 30
COMMAND_WAIT = 120


class ExampleProject:
    """The example project with its settings read from ``env`` (as from its ``.env``)."""

    def __init__(self, workdir: Path, **env: str) -> None:
        self.port = free_port()
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "example_project.settings",
            "DATABASE_URL": f"sqlite:///{workdir / 'example.sqlite3'}",
            "REALTIME_POLLING_INTERVAL": "0.05",
            "PYTHONPATH": str(ROOT),
            **env,
        }
        self.log = workdir / "server.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.command: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def socket_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/api/ws"

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=COMMAND_WAIT,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def shell(self, code: str) -> str:
        return self.manage("shell", "--no-imports", "-c", code)

    def token(self, username: str) -> str:
        """A bearer for ``username``, issued by another process as the project's views do."""
        return self.shell(
            "from django.contrib.auth.models import User; "
            "from realtime.auth import issue_token; "
            f"print(issue_token(User.objects.get(username={username!r})))"
        ).strip()

    def prepare(self) -> None:
        self.manage("migrate", "--no-input")
        self.manage("seed_demo")

    def start_runserver(self) -> None:
        """Serve as ``scripts/example`` does: ``runserver``, which is daphne's."""
        self.command = ["manage.py", "runserver", "--noreload", f"127.0.0.1:{self.port}"]
        self.start()

    def start_daphne(self) -> None:
        """Serve the project's own ASGI application with daphne."""
        self.command = [
            "-m",
            "daphne",
            "-b",
            "127.0.0.1",
            "-p",
            str(self.port),
            "example_project.asgi:application",
        ]
        self.start()

    def start(self) -> None:
        """Start the server the last ``start_*`` chose (again, after ``stop``)."""
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, *self.command],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + START_WAIT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the example project exited; see {self.log}")
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return
            time.sleep(0.05)
        raise RuntimeError(f"the example project did not start; see {self.log}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
            self.process = None
