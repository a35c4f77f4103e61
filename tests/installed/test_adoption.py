"""What a newcomer meets, tried with the wheel installed: one virtualenv, one small project.

The project (``adopt``, its app ``shop``) is written outside the source tree. Its settings
modules each make one newcomer's mistake, and ``manage.py check --settings=...`` must report
it, and only it; the project without mistakes reports none. Then one daphne serves it: a model
with a ``payload`` is heard with the payload's keys, and an auth class's ``may_subscribe``
refuses one channel to one account, with ``DEBUG``'s INFO lines saying why channels were
dropped in the log, through ``LOGGING`` as a user writes it.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect

from tests.helpers import WAIT
from tests.installed.conftest import (
    Dist,
    Venv,
    asgi_py,
    free_port,
    manage_py,
    serve,
    write_files,
)

SETTINGS = """
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "adoption-test-only"
DEBUG = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
INSTALLED_APPS = [
    "daphne",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "channels",
    "realtime",
    "shop",
]
ASGI_APPLICATION = "adopt.asgi.application"
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
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
REALTIME_SCOPE_MODEL = "shop.Workspace"
REALTIME_AUTH = "shop.auth.ChoosyAuth"
REALTIME_POLLING_INTERVAL = 0.05

# realtime's INFO lines on the console: with DEBUG, why a channel a client named was dropped.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "{levelname} {name} {message}", "style": "{"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {"realtime": {"handlers": ["console"], "level": "INFO", "propagate": False}},
}
"""
MODELS = """
from django.conf import settings
from django.db import models

from realtime import realtime_model


class Workspace(models.Model):
    slug = models.SlugField(unique=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL)


def card_extra(card):
    return {"shout": card.title.upper(), "workspace_slug": card.workspace.slug}


@realtime_model(fields=["title"], payload=card_extra)
class Card(models.Model):
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    title = models.CharField(max_length=100)


@realtime_model(fields=["title"])
class Memo(models.Model):
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    title = models.CharField(max_length=100)
"""
AUTH = """
from realtime.auth import RealtimeAuth


class ChoosyAuth(RealtimeAuth):
    def may_subscribe(self, user, scope_id, channel):
        # ann may not hear memos; every other channel, and every other account, may.
        return not (user.username == "ann" and channel.partition(":")[0] == "memo")
"""
#: SQLite's options, as the quickstart sets them, kept when the engine changes.
SQLITE_OPTIONS = """
    "OPTIONS": {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
    },
"""


def variant(change: str) -> str:
    """A settings module: the project's settings, then ``change``."""
    return f"from adopt.settings import *  # noqa: F403\n\n{change}\n"


def postgresql(options: str, port: int) -> str:
    """Settings naming PostgreSQL on a port where nothing listens: ``check`` must not connect."""
    return variant(
        'DATABASES = {\n    "default": {\n        "ENGINE": "django.db.backends.postgresql",\n'
        f'        "NAME": "adopt",\n        "HOST": "127.0.0.1",\n        "PORT": "{port}",\n'
        f"{options}    }}\n}}"
    )


def project_files(port: int) -> dict[str, str]:
    return {
        "manage.py": manage_py("adopt.settings"),
        "adopt/__init__.py": "",
        "adopt/settings.py": SETTINGS,
        "adopt/asgi.py": asgi_py("adopt.settings"),
        "adopt/asgi_unguarded.py": asgi_py("adopt.settings", "URLRouter(websocket_urlpatterns)"),
        "adopt/asgi_channels_validator.py": asgi_py(
            "adopt.settings", "AllowedHostsOriginValidator(URLRouter(websocket_urlpatterns))"
        ),
        "adopt/settings_without_realtime.py": variant(
            'INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "realtime"]'
        ),
        "adopt/settings_without_daphne.py": variant(
            'INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "daphne"]'
        ),
        "adopt/settings_unguarded.py": variant(
            'ASGI_APPLICATION = "adopt.asgi_unguarded.application"'
        ),
        "adopt/settings_channels_validator.py": variant(
            'ASGI_APPLICATION = "adopt.asgi_channels_validator.application"'
        ),
        "adopt/settings_postgresql.py": postgresql("", port),
        "adopt/settings_postgresql_sqlite_options.py": postgresql(SQLITE_OPTIONS, port),
        "shop/__init__.py": "",
        "shop/models.py": MODELS,
        "shop/auth.py": AUTH,
    }


@pytest.fixture(scope="module")
def project(dist: Dist, venv: Venv) -> Venv:
    """The project in a virtualenv that installed the wheel with PostgreSQL's driver (the
    PostgreSQL settings load its backend, as a user's would), migrated."""
    venv.run("python", "-m", "pip", "install", "--quiet", f"{dist.wheel}[postgresql]")
    write_files(venv.cwd, project_files(free_port()))
    venv.run("python", "manage.py", "makemigrations", "shop")
    venv.run("python", "manage.py", "migrate", "--no-input")
    return venv


# manage.py check ---------------------------------------------------------------------------

#: The checks of a newcomer's mistakes, as ``check`` lists them (``?: (realtime.W040) ...``).
MISTAKES = re.compile(r"\((realtime\.(?:E040|W040|W041|W042|E022))\)")


@dataclass
class Checked:
    passed: bool
    output: str
    mistakes: list[str]


def check(project: Venv, settings: str) -> Checked:
    done = project.attempt("python", "manage.py", "check", f"--settings=adopt.{settings}")
    output = done.stdout + done.stderr
    return Checked(done.returncode == 0, output, sorted(MISTAKES.findall(output)))


def test_check_reports_no_mistake_of_the_project_that_makes_none(project: Venv) -> None:
    checked = check(project, "settings")
    assert checked.passed, checked.output
    assert "System check identified no issues (0 silenced)." in checked.output


def test_check_reports_e040_when_realtime_is_not_installed_beside_decorated_models(
    project: Venv,
) -> None:
    checked = check(project, "settings_without_realtime")
    assert not checked.passed
    assert checked.mistakes == ["realtime.E040"], checked.output
    assert "shop.Card, shop.Memo are decorated with @realtime_model" in checked.output


def test_check_warns_w040_when_daphne_is_not_installed(project: Venv) -> None:
    checked = check(project, "settings_without_daphne")
    assert checked.passed, checked.output  # a warning
    assert checked.mistakes == ["realtime.W040"], checked.output


def test_check_warns_w041_when_the_socket_is_routed_without_socket_origin_validator(
    project: Venv,
) -> None:
    checked = check(project, "settings_unguarded")
    assert checked.passed, checked.output
    assert checked.mistakes == ["realtime.W041"], checked.output
    assert "adopt.asgi_unguarded.application" in checked.output


def test_check_warns_w042_when_the_socket_is_routed_inside_channels_origin_validator(
    project: Venv,
) -> None:
    checked = check(project, "settings_channels_validator")
    assert checked.passed, checked.output
    assert checked.mistakes == ["realtime.W042"], checked.output


def test_check_reports_e022_for_sqlite_options_on_postgresql_without_connecting(
    project: Venv,
) -> None:
    checked = check(project, "settings_postgresql_sqlite_options")
    assert not checked.passed
    assert checked.mistakes == ["realtime.E022"] * 3, checked.output
    assert "SystemCheckError" in checked.output
    for option in ("'init_command'", "'transaction_mode'", "'timeout'"):
        assert option in checked.output


def test_check_passes_on_postgresql_without_sqlites_options_and_without_a_server(
    project: Venv,
) -> None:
    # Nothing listens on the settings' port: a check that connected would fail.
    checked = check(project, "settings_postgresql")
    assert checked.passed, checked.output
    assert "System check identified no issues (0 silenced)." in checked.output


# One daphne --------------------------------------------------------------------------------


@dataclass
class Served:
    port: int
    log: Path
    tokens: dict[str, str]
    project: Venv

    def write(self, code: str) -> Any:
        """Run ``code`` (the models imported, ``acme`` the workspace) in the project; the JSON
        its last line printed."""
        setup = "from shop.models import Card, Memo, Workspace; import json\n"
        setup += "acme = Workspace.objects.get(slug='acme')\n"
        return json.loads(self.project.django_shell(setup + code))


ACCOUNTS = """
import json
from django.contrib.auth.models import User
from realtime.auth import issue_token
from shop.models import Workspace

acme = Workspace.objects.create(slug="acme")
users = [User.objects.create_user(name) for name in ("ann", "bob")]
acme.members.add(*users)
print(json.dumps({user.username: issue_token(user) for user in users}))
"""


@pytest.fixture(scope="module")
def served(project: Venv) -> Served:
    """The project under daphne; ``ann`` and ``bob``, members of ``acme``, and their tokens."""
    tokens = json.loads(project.django_shell(ACCOUNTS))
    log = project.cwd / "daphne.log"
    port = serve(project, "adopt.asgi:application", log=log)
    return Served(port, log, tokens, project)


@asynccontextmanager
async def listening(
    served: Served, name: str, channels: list[str]
) -> AsyncIterator[ClientConnection]:
    """A socket of ``name`` reading ``acme``, subscribed to ``channels`` as it authenticates."""
    async with connect(f"ws://127.0.0.1:{served.port}/api/ws", open_timeout=WAIT) as socket:
        token = served.tokens[name]
        data = {"token": token, "scope": "acme", "channels": channels}
        await socket.send(json.dumps({"type": "authenticate", "data": data}))
        answer = json.loads(await asyncio.wait_for(socket.recv(), WAIT))
        assert answer["type"] == "auth_success", answer
        yield socket


async def frames_until(socket: ClientConnection, event_type: str) -> list[dict[str, Any]]:
    """The frames the socket hears up to the first of ``event_type``, that one included."""
    frames: list[dict[str, Any]] = []
    async with asyncio.timeout(WAIT):
        while not frames or frames[-1]["type"] != event_type:
            frames.append(json.loads(await socket.recv()))
    return frames


async def test_a_payloads_keys_are_in_the_frame_heard_under_daphne(served: Served) -> None:
    async with listening(served, "bob", ["card"]) as socket:
        card = await asyncio.to_thread(
            served.write, "print(Card.objects.create(workspace=acme, title='hello').pk)"
        )
        (frame,) = await frames_until(socket, "card.created")
    assert frame["data"] == {
        "model": "card",
        "id": card,
        "title": "hello",
        "shout": "HELLO",
        "workspace_slug": "acme",
    }


async def test_a_channel_may_subscribe_refuses_hears_nothing_and_the_allowed_one_hears(
    served: Served,
) -> None:
    async with (
        listening(served, "ann", ["memo", "card"]) as ann,
        listening(served, "bob", ["memo"]) as bob,
    ):
        # The memo first, then the card: ann's marker, announced after the memo.
        memo, card = await asyncio.to_thread(
            served.write,
            "memo = Memo.objects.create(workspace=acme, title='m')\n"
            "card = Card.objects.create(workspace=acme, title='c')\n"
            "print(json.dumps([memo.pk, card.pk]))",
        )
        ann_heard = await frames_until(ann, "card.created")
        bob_heard = await frames_until(bob, "memo.created")
    assert [(frame["type"], frame["data"]["id"]) for frame in ann_heard] == [("card.created", card)]
    # The memo was announced: bob, whom the hook allows, heard it.
    assert [(frame["type"], frame["data"]["id"]) for frame in bob_heard] == [("memo.created", memo)]


def logged(log: Path, line: str) -> bool:
    """Whether ``line`` is in the log within ``WAIT`` seconds (it is written before the
    socket's ``auth_success``; the wait only covers the file's buffering)."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if line in log.read_text().splitlines():
            return True
        time.sleep(0.05)
    return False


async def test_with_debug_the_log_says_why_each_channel_was_dropped_naming_the_nearest_known_one(
    served: Served,
) -> None:
    async with listening(served, "ann", ["cards", "memo:1"]):
        pass
    prefix = "INFO realtime.sockets.subscriptions realtime: dropped channel"
    misspelled = f"{prefix} 'cards': no such channel (did you mean 'card'?)"
    refused = f"{prefix} 'memo:1': refused by may_subscribe"
    assert await asyncio.to_thread(logged, served.log, misspelled), served.log.read_text()
    assert await asyncio.to_thread(logged, served.log, refused), served.log.read_text()
