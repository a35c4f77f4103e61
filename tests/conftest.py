"""Fixtures shared by the whole suite: transports that clean up after themselves.

The ``stall`` tests (a socket that stops reading, and readers beside it) run
``REALTIME_SLOW_REPEAT`` times each (1 by default, 3 in CI's ``py312-django60`` cell, 20 in the
long run), with ``REALTIME_CPU_LOAD`` cores kept busy meanwhile by a helper process
(``tests.cpu_load``; 0 by default): a stall must never be missed, nor a reader dropped, when
the machine is loaded.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from realtime.transports.table import TableTransport
from tests.helpers import Inbox
from tests.proxy import Proxy

#: Runs of each ``stall`` test.
SLOW_REPEAT = int(os.environ.get("REALTIME_SLOW_REPEAT") or 1)
#: Cores the helper process keeps busy while the tests run.
CPU_LOAD = int(os.environ.get("REALTIME_CPU_LOAD") or 0)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``server`` each test served by real daphne or uvicorn workers (it needs the
    ``live_servers`` fixture), so that a run can leave them out with ``-m "not server"``."""
    for item in items:
        if "live_servers" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.server)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run each ``stall`` test ``SLOW_REPEAT`` times."""
    if SLOW_REPEAT > 1 and metafunc.definition.get_closest_marker("stall") is not None:
        metafunc.fixturenames.append("stall_round")
        metafunc.parametrize(
            "stall_round", range(1, SLOW_REPEAT + 1), ids=lambda n: f"round{n}", scope="function"
        )


@pytest.fixture(scope="session", autouse=True)
def _cpu_load() -> Iterator[None]:
    """Keep ``CPU_LOAD`` cores busy for the whole run (none by default)."""
    if CPU_LOAD <= 0:
        yield
        return
    from tests.helpers import ROOT

    helper = subprocess.Popen(
        [sys.executable, "-m", "tests.cpu_load", str(CPU_LOAD)], stdin=subprocess.PIPE, cwd=ROOT
    )
    try:
        yield
    finally:
        assert helper.stdin is not None
        helper.stdin.close()
        try:
            helper.wait(10)
        except subprocess.TimeoutExpired:
            helper.kill()
            helper.wait(10)


@pytest.fixture
async def make_table_transport() -> AsyncIterator[Callable[..., TableTransport]]:
    """Build table transports with fast test timings; stop and close them afterwards."""
    built: list[TableTransport] = []

    def make(**options: Any) -> TableTransport:
        options.setdefault("polling_interval", 0.02)
        options.setdefault("auto_trim", False)
        transport = TableTransport(**options)
        built.append(transport)
        return transport

    yield make
    for transport in built:
        await transport.stop()
        transport.close()


@pytest.fixture
def inbox() -> Inbox:
    return Inbox()


@pytest.fixture
def workspace(db: None) -> Any:
    from tests.testapp.models import Workspace

    return Workspace.objects.create(name="Acme", slug="acme")


@pytest.fixture
def make_user(db: None) -> Callable[..., Any]:
    from django.contrib.auth import get_user_model

    def make(username: str, *, member_of: Any = None, **fields: Any) -> Any:
        from tests.testapp.models import Membership

        user = get_user_model().objects.create_user(username=username, **fields)
        for scope in member_of if isinstance(member_of, list | tuple) else [member_of]:
            if scope is not None:
                Membership.objects.create(workspace=scope, user=user)
        return user

    return make


@pytest.fixture
async def ws() -> AsyncIterator[Any]:
    """WebSocket clients opened by a test (``tests.live.Clients``), closed after it."""
    from tests.live import Clients

    pool = Clients()
    yield pool
    await pool.close_all()


@pytest.fixture(scope="session")
def live_servers(django_db_setup: None, django_db_blocker: Any) -> Any:
    """Daphne servers on the test database, started on first use, stopped at the end."""
    from tests.live import LiveServers

    servers = LiveServers()
    yield servers
    servers.stop_all()


@pytest.fixture(scope="session", autouse=True)
def _release_transports(django_db_setup: None) -> Any:
    """Close this process's transport before the test database goes (its threads hold
    connections that would keep PostgreSQL from dropping it)."""
    yield
    from realtime.blocking import close_connections
    from realtime.transports import reset_transport

    reset_transport()
    close_connections()


@pytest.fixture(params=["table", "pg_notify"])
def each_transport(request: pytest.FixtureRequest, live_servers: Any, settings: Any) -> Any:
    """Run a test once per transport: in this process and in the daphne servers it starts.

    pg_notify needs PostgreSQL; elsewhere its run is skipped.
    """
    from django.db import connection

    if request.param == "pg_notify" and connection.vendor != "postgresql":
        pytest.skip("pg_notify needs PostgreSQL")
    settings.REALTIME_TRANSPORT = request.param
    live_servers.defaults = {"REALTIME_TRANSPORT": request.param}
    yield request.param
    live_servers.defaults = {}


@pytest.fixture
async def proxy() -> AsyncIterator[Proxy]:
    """A relay to the test database's server, open; closed after the test."""
    from django.db import connection

    settings = connection.settings_dict
    relay = Proxy(str(settings["HOST"] or "127.0.0.1"), int(settings["PORT"] or 5432))
    await relay.open()
    yield relay
    await relay.close()


@pytest.fixture(autouse=True)
def _fresh_log_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Give each test whole budgets of limited log lines (``realtime.logs``): lines other
    tests logged in this process must not hold back the ones a test looks for."""
    from realtime import logs

    monkeypatch.setattr(logs, "client_budget", logs.LogLimiter(logs.CLIENT_LINES_PER_MINUTE))
    monkeypatch.setattr(logs, "operation_budget", logs.LogLimiter(logs.OPERATION_LINES_PER_MINUTE))
    monkeypatch.setattr(logs, "place_budgets", logs.PlaceLimiter())
