"""The wheel as users install it: what it holds, and a small project running on it.

The project below is written into a folder outside the source tree and runs in a virtualenv
that installed only the wheel: migrations, management commands, static files, a socket
handshake and one event under daphne (the WebSocket client is this test's).
"""

from __future__ import annotations

import asyncio
import json
import tarfile
import zipfile
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from tests.helpers import ROOT, WAIT
from tests.installed.conftest import Dist, Venv, free_port, wait_for_port

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
ASGI = """
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "smoke.settings")
django_application = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter

from realtime.origins import SocketOriginValidator
from realtime.routing import websocket_urlpatterns

application = ProtocolTypeRouter(
    {
        "http": django_application,
        "websocket": SocketOriginValidator(URLRouter(websocket_urlpatterns)),
    }
)
"""
MANAGE = """
import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "smoke.settings")
from django.core.management import execute_from_command_line

execute_from_command_line(sys.argv)
"""
PACKAGE_DATA = ["realtime/static/realtime/realtime.js", "realtime/py.typed"]


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
    (venv.cwd / "smoke").mkdir()
    (venv.cwd / "smoke" / "__init__.py").write_text("")
    (venv.cwd / "smoke" / "settings.py").write_text(SETTINGS)
    (venv.cwd / "smoke" / "urls.py").write_text(URLS)
    (venv.cwd / "smoke" / "asgi.py").write_text(ASGI)
    (venv.cwd / "manage.py").write_text(MANAGE)
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
    issued = await asyncio.to_thread(
        project.run,
        "python",
        "manage.py",
        "shell",
        "-c",
        "from django.contrib.auth.models import User; from realtime.auth import issue_token; "
        "print(issue_token(User.objects.create_user('smoke')))",
    )
    token = issued.stdout.strip().splitlines()[-1]  # shell may first say what it imported
    port = free_port()
    log = project.cwd / "daphne.log"
    server = project.start("daphne", "-p", str(port), "smoke.asgi:application", log=log)
    wait_for_port(port, server, log)

    async with connect(f"ws://127.0.0.1:{port}/api/ws", open_timeout=WAIT) as socket:
        await socket.send(json.dumps({"type": "authenticate", "data": {"token": token}}))
        frames = [json.loads(await asyncio.wait_for(socket.recv(), WAIT))]
        await asyncio.to_thread(
            project.run,
            "python",
            "manage.py",
            "shell",
            "-c",
            "from realtime.broadcast import broadcast_to_user; "
            "broadcast_to_user(1, 'smoke.hello', {'ok': True})",
        )
        frames.append(json.loads(await asyncio.wait_for(socket.recv(), WAIT)))
    assert frames == [
        {"type": "auth_success", "data": {"user_id": 1, "scope": None, "scopes": []}},
        {"type": "smoke.hello", "data": {"ok": True}},
    ]
