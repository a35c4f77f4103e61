"""The mistakes a newcomer makes installing realtime, each a system check id: realtime left out
of ``INSTALLED_APPS`` (``E040``), daphne left out in development (``W040``), the socket routed
without realtime's origin validator (``W041``) or inside Channels' (``W042``), SQLite's options
left on PostgreSQL or MySQL (``E022``). Each is made for real (settings, ASGI modules of
``tests/asgi_routes.py``, the quickstart's own ``asgi.py`` and ``OPTIONS``), beside the setup
that is right.
"""

from __future__ import annotations

import ast
import importlib
import json
import logging
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.checks import CheckMessage
from django.db import DatabaseError, connection
from django.db.utils import ConnectionHandler
from django.test import override_settings

from realtime.checks.database import sqlite_options_elsewhere
from realtime.checks.serving import check_serving
from realtime.compat import channels
from realtime.writes.decorator import check_installed
from tests.helpers import ROOT, only_on, subprocess_env

QUICKSTART = ROOT / "docs" / "quickstart.md"
QUICKSTART_ASGI = re.compile(r"```python\n# mysite/asgi\.py\n(.*?)^```", re.DOTALL | re.MULTILINE)
QUICKSTART_OPTIONS = re.compile(
    r'^DATABASES\["default"\]\["OPTIONS"\] = (\{.*?^\})', re.DOTALL | re.MULTILINE
)
ROUTE = "SocketOriginValidator(URLRouter(websocket_urlpatterns))"
ROUTER_IMPORT = "from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402\n"
CHANNELS_VALIDATOR_IMPORT = (
    "from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402\n"
)
ENGINES = {"django.db.backends.postgresql": "PostgreSQL", "django.db.backends.mysql": "MySQL"}
FLAGGED = re.compile(r"holds (?:a PRAGMA )?'(\w+)'")
# A realtime logger that exists before the checks run, and logs an ERROR after them.
LOGGING_PROBE = """
import json, logging, django
django.setup()
from django.core.checks import run_checks
realtime = logging.getLogger("realtime.checks.serving")
messages = run_checks()
realtime.error("realtime still logs after the checks")
print(json.dumps({"ids": [m.id for m in messages], "disabled": realtime.disabled}))
"""


def quickstart_options() -> dict[str, Any]:
    """The quickstart's SQLite ``OPTIONS``, as the page prints them."""
    match = QUICKSTART_OPTIONS.search(QUICKSTART.read_text())
    assert match, "docs/quickstart.md sets no DATABASES OPTIONS"
    options: dict[str, Any] = ast.literal_eval(match[1])
    return options


def quickstart_asgi_text() -> str:
    match = QUICKSTART_ASGI.search(QUICKSTART.read_text())
    assert match, "docs/quickstart.md has no mysite/asgi.py block"
    assert ROUTE in match[1]
    assert ROUTER_IMPORT in match[1]
    return match[1]


#: The ``vendor`` of each engine's connections, as Django's backends name them: written out
#: rather than loaded, since a backend needs its driver to load (mysqlclient is installed only
#: where the suite runs on MariaDB).
VENDORS = {
    "django.db.backends.sqlite3": "sqlite",
    "django.db.backends.postgresql": "postgresql",
    "django.db.backends.mysql": "mysql",
}


def vendor_of(engine: str) -> str:
    return VENDORS[engine]


def mysite(tmp_path: Path, settings_text: str, asgi_text: str | None = None) -> dict[str, str]:
    """A project ``mysite`` in ``tmp_path`` (its settings on top of the suite's), and the
    environment of a process that runs it."""
    (tmp_path / "mysite").mkdir()
    (tmp_path / "mysite" / "__init__.py").write_text("")
    (tmp_path / "mysite" / "settings.py").write_text(
        "from tests.settings import *  # noqa: F403\n" + settings_text
    )
    if asgi_text is not None:
        (tmp_path / "mysite" / "asgi.py").write_text(asgi_text)
    env = subprocess_env()
    env["DJANGO_SETTINGS_MODULE"] = "mysite.settings"
    env["PYTHONPATH"] = f"{tmp_path}{':'}{ROOT}"
    return env


def ids(messages: list[CheckMessage]) -> list[str | None]:
    for message in messages:
        assert isinstance(message.hint, str), message
        assert message.hint.strip(), message
    return [message.id for message in messages]


def manage_py_check(
    settings_module: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``manage.py check`` in a process of its own, under ``settings_module``."""
    env = env or subprocess_env()
    env["DJANGO_SETTINGS_MODULE"] = settings_module
    return subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def route_ids(asgi_application: str) -> list[str | None]:
    with override_settings(ASGI_APPLICATION=asgi_application, DEBUG=False):
        return ids(check_serving())


@pytest.fixture
def quickstart_asgi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The quickstart's ``mysite/asgi.py``, as the page prints it, importable as ``mysite``."""
    (tmp_path / "mysite").mkdir()
    (tmp_path / "mysite" / "__init__.py").write_text("")
    (tmp_path / "mysite" / "asgi.py").write_text(quickstart_asgi_text())
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "mysite.asgi.application"
    for name in ("mysite.asgi", "mysite"):
        sys.modules.pop(name, None)


# E040: @realtime_model without realtime in INSTALLED_APPS


def test_decorated_models_without_realtime_installed_is_error_e040_from_manage_py_check() -> None:
    done = manage_py_check("tests.settings_uninstalled")

    assert done.returncode == 1, done.stderr
    assert re.findall(r"realtime\.\w+", done.stderr) == ["realtime.E040"]
    assert "testapp.Contact" in done.stderr
    assert 'HINT: Add "channels" and "realtime" to INSTALLED_APPS' in done.stderr


def test_with_realtime_installed_the_test_settings_report_no_issue() -> None:
    assert check_installed() == []
    done = manage_py_check("tests.settings")

    assert done.returncode == 0, done.stderr
    assert "System check identified no issues (0 silenced)." in done.stdout, done.stdout
    assert done.stderr == ""


# W040: daphne not in INSTALLED_APPS


def test_daphne_missing_from_installed_apps_under_debug_is_warning_w040() -> None:
    with override_settings(DEBUG=True):
        messages = check_serving()

    assert ids(messages) == ["realtime.W040"]
    assert 'Put "daphne" first in INSTALLED_APPS' in str(messages[0].hint)
    assert '"realtime.W040" to SILENCED_SYSTEM_CHECKS' in str(messages[0].hint)


def test_daphne_missing_from_production_settings_gives_no_w040() -> None:
    # The suite's settings: DEBUG off, no daphne, served by daphne's and uvicorn's commands.
    assert not settings.DEBUG
    assert "realtime.W040" not in settings.SILENCED_SYSTEM_CHECKS
    done = manage_py_check("tests.settings")

    assert done.returncode == 0, done.stderr
    assert "realtime.W040" not in done.stderr


def test_the_example_project_with_daphne_first_reports_no_issue() -> None:
    # In a process of its own: once installed, daphne stays in this one's check registry.
    done = manage_py_check("example_project.settings")

    assert done.returncode == 0, done.stderr
    assert "System check identified no issues (0 silenced)." in done.stdout, done.stdout
    assert done.stderr == ""


# W041 to W043: how ASGI_APPLICATION routes realtime's consumer


@pytest.mark.parametrize(
    "application",
    [
        "tests.asgi.application",  # bare
        "tests.asgi.wrapped",  # inside AuthMiddlewareStack
        "tests.asgi.opaque",  # inside a middleware of the project's own (``inner``)
        "tests.asgi_routes.nested",  # under a nested URLRouter, beside another consumer
        "tests.asgi_routes.any_origin",  # inside Channels' validator admitting "*"
        "tests.asgi_routes.with_workers_unguarded",  # beside a ChannelNameRouter
    ],
)
def test_the_consumer_routed_without_socket_origin_validator_is_warning_w041(
    application: str,
) -> None:
    with override_settings(ASGI_APPLICATION=application):
        messages = check_serving()

    assert ids(messages) == ["realtime.W041"]
    assert "SocketOriginValidator(URLRouter(websocket_urlpatterns))" in str(messages[0].hint)
    assert application in messages[0].msg


@pytest.mark.parametrize(
    "application", ["tests.asgi_routes.allowed_hosts", "tests.asgi_routes.inside_ours"]
)
def test_the_consumer_routed_inside_channels_origin_validator_is_warning_w042(
    application: str,
) -> None:
    with override_settings(ASGI_APPLICATION=application):
        messages = check_serving()

    assert ids(messages) == ["realtime.W042"]
    assert "Replace Channels' validator with" in str(messages[0].hint)


@pytest.mark.parametrize(
    "application",
    [
        "tests.asgi.guarded",
        "tests.asgi_routes.nested_guarded",
        "tests.asgi_routes.with_workers",  # beside a ChannelNameRouter of the project's workers
        "example_project.asgi.application",
    ],
)
def test_the_consumer_routed_inside_socket_origin_validator_gives_no_warning(
    application: str,
) -> None:
    assert route_ids(application) == []


def test_the_quickstarts_asgi_application_as_printed_gives_no_warning(
    quickstart_asgi: str,
) -> None:
    assert route_ids(quickstart_asgi) == []


@pytest.mark.parametrize(
    "application",
    [
        "tests.asgi_routes.hidden",  # a wrapper keeping its application where no check looks
        "tests.asgi_routes.elsewhere",  # no realtime consumer at all
        "tests.asgi_routes.plain",  # the ASGI application is a plain function
        "tests.asgi_routes.plain_socket",  # the socket is routed to a plain function
        "tests.no_such_module.application",  # cannot be imported
    ],
)
def test_a_consumer_the_check_cannot_find_gives_no_warning(application: str) -> None:
    assert route_ids(application) == []


@pytest.mark.parametrize(
    ("application", "why"),
    [
        # Django's own ASGI handler, as startproject wrote it
        ("tests.asgi_routes.startproject", "Django's own ASGI handler takes HTTP only"),
        # a ProtocolTypeRouter with no "websocket" route
        ("tests.asgi_routes.http_only", 'it routes no "websocket" protocol'),
    ],
)
def test_an_asgi_application_that_takes_no_socket_is_warning_w043(
    application: str, why: str
) -> None:
    with override_settings(ASGI_APPLICATION=application):
        messages = check_serving()

    assert ids(messages) == ["realtime.W043"]
    assert messages[0].msg == (
        f"ASGI_APPLICATION ({application}) serves no WebSocket: every socket is answered with an "
        f"error ({why})."
    )
    assert '"websocket": SocketOriginValidator(URLRouter(websocket_urlpatterns))' in str(
        messages[0].hint
    )


def test_without_asgi_application_the_route_is_not_checked() -> None:
    assert not hasattr(settings, "ASGI_APPLICATION")
    assert ids(check_serving()) == []


@pytest.mark.parametrize(
    ("route", "expected"),
    [
        (ROUTE, []),  # as printed
        ("URLRouter(websocket_urlpatterns)", ["realtime.W041"]),
        (
            "AllowedHostsOriginValidator(URLRouter(websocket_urlpatterns))",
            ["realtime.W042"],
        ),
    ],
)
def test_checking_the_quickstarts_asgi_module_leaves_realtimes_loggers_enabled(
    tmp_path: Path, route: str, expected: list[str]
) -> None:
    asgi = quickstart_asgi_text().replace(ROUTE, route)
    asgi = asgi.replace(ROUTER_IMPORT, ROUTER_IMPORT + CHANNELS_VALIDATOR_IMPORT)
    # A LOGGING that leaves disable_existing_loggers at dictConfig's default, True.
    logging_settings = {"version": 1, "root": {"level": "WARNING"}}
    env = mysite(
        tmp_path,
        f'ASGI_APPLICATION = "mysite.asgi.application"\nLOGGING = {logging_settings!r}\n',
        asgi,
    )
    done = subprocess.run(
        [sys.executable, "-c", LOGGING_PROBE],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert [i for i in found["ids"] if i and i.startswith("realtime.")] == expected
    assert found["disabled"] is False
    assert "realtime still logs after the checks" in done.stderr


def test_the_routing_walk_passes_its_self_test_under_the_installed_channels() -> None:
    assert channels.routing_missing() == []


def test_channels_keeping_its_routes_elsewhere_fails_the_self_test_and_nothing_is_reported(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from channels.routing import URLRouter

    # Built before the patch: tests.asgi stays imported, and other tests check its routes.
    importlib.import_module("tests.asgi")

    def keep_elsewhere(self: Any, routes: Any) -> None:
        self.patterns = routes

    monkeypatch.setattr(URLRouter, "__init__", keep_elsewhere)
    monkeypatch.setattr(channels, "_routing_verdict", None)

    assert route_ids("tests.asgi.application") == []
    assert route_ids("tests.asgi.wrapped") == []  # the verdict holds: one line, once
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "cannot follow the ASGI application to realtime's consumer under channels 4." in line
    assert "URLRouter.__init__ does not keep routes" in line


# E022: SQLite's OPTIONS on PostgreSQL or MySQL


@pytest.mark.parametrize("engine", ENGINES)
def test_every_option_of_the_quickstarts_sqlite_settings_on_another_database_is_error_e022(
    engine: str,
) -> None:
    options = quickstart_options()
    messages = sqlite_options_elsewhere("default", vendor_of(engine), options)

    assert ids(messages) == ["realtime.E022"] * len(options)
    assert [FLAGGED.search(m.msg)[1] for m in messages] == list(options)  # type: ignore[index]
    init_command, _, timeout = messages
    assert init_command.msg.startswith('DATABASES["default"]["OPTIONS"] holds a PRAGMA ')
    assert f"{ENGINES[engine]} fails at the first connection" in init_command.msg
    assert 'Remove "init_command" from DATABASES["default"]["OPTIONS"]' in str(init_command.hint)
    assert timeout.msg.startswith('DATABASES["default"]["OPTIONS"] holds \'timeout\', ')
    assert 'Remove "timeout"' in str(timeout.hint)


@only_on("postgresql", "mysql")
@pytest.mark.django_db
@pytest.mark.parametrize("option", quickstart_options())
def test_each_option_e022_reports_fails_the_first_connection_on_this_database(
    option: str,
) -> None:
    database = {**connection.settings_dict}
    database["OPTIONS"] = {**database["OPTIONS"], option: quickstart_options()[option]}
    probe = ConnectionHandler({"default": database})["default"]  # a connection of its own
    messages = sqlite_options_elsewhere("default", probe.vendor, database["OPTIONS"])

    assert [FLAGGED.search(m.msg)[1] for m in messages] == [option]  # type: ignore[index]
    try:
        with pytest.raises((DatabaseError, TypeError)):
            probe.ensure_connection()
    finally:
        probe.close()


@pytest.mark.parametrize(
    "database",
    [
        {"ENGINE": "django.db.backends.sqlite3", "OPTIONS": quickstart_options()},
        {"ENGINE": "django.db.backends.postgresql", "OPTIONS": {"pool": True}},
        {
            "ENGINE": "django.db.backends.postgresql",
            "OPTIONS": {"pool": {"timeout": 20}, "connect_timeout": 20},
        },
        {
            "ENGINE": "django.db.backends.mysql",
            "OPTIONS": {"init_command": "SET sql_mode=''", "connect_timeout": 20},
        },
        {"ENGINE": "django.db.backends.postgresql"},
    ],
)
def test_options_that_fit_their_database_give_no_e022(database: dict[str, Any]) -> None:
    vendor = vendor_of(database["ENGINE"])
    assert sqlite_options_elsewhere("default", vendor, database.get("OPTIONS", {})) == []


def test_manage_py_check_names_the_alias_holding_sqlite_options(tmp_path: Path) -> None:
    # Not migrated, as a project's warehouse is not: Django's own checks of a GeneratedField
    # (Django 6.1) connect to every database its model may be migrated to.
    (tmp_path / "warehouse_router.py").write_text(
        "class NotOnTheWarehouse:\n"
        "    def allow_migrate(self, db, app_label, **hints):\n"
        "        return False if db == 'warehouse' else None\n"
    )
    env = mysite(
        tmp_path,
        "DATABASES = {**DATABASES, "
        '"warehouse": {"ENGINE": "django.db.backends.postgresql", "OPTIONS": {"timeout": 20}}}\n'
        'DATABASE_ROUTERS = ["warehouse_router.NotOnTheWarehouse", *DATABASE_ROUTERS]\n',
    )
    done = manage_py_check("mysite.settings", env)

    assert done.returncode == 1, done.stderr
    assert re.findall(r"realtime\.\w+", done.stderr) == ["realtime.E022"]
    assert 'DATABASES["warehouse"]["OPTIONS"] holds \'timeout\'' in done.stderr
    assert "Traceback" not in done.stderr
