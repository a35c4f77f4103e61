"""Fixtures shared by the whole suite: transports that clean up after themselves.

The ``stall`` tests (a socket that stops reading, and readers beside it) run
``REALTIME_SLOW_REPEAT`` times each (1 by default, 3 in CI's ``py312-django60`` cell, 20 in the
long run), with ``REALTIME_CPU_LOAD`` cores kept busy meanwhile by a helper process
(``tests.cpu_load``; 0 by default): a stall must never be missed, nor a reader dropped, when
the machine is loaded.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from realtime.transports.table import TableTransport
from tests.helpers import Inbox
from tests.proxy import Proxy
from tests.redis_cluster import RedisCluster
from tests.redis_cluster import available as cluster_available
from tests.redis_server import RedisServer, missing, transports

#: Runs of each ``stall`` test.
SLOW_REPEAT = int(os.environ.get("REALTIME_SLOW_REPEAT") or 1)
#: Cores the helper process keeps busy while the tests run.
CPU_LOAD = int(os.environ.get("REALTIME_CPU_LOAD") or 0)


@pytest.fixture(scope="session", autouse=True)
def _preparation_failures_raise() -> Iterator[None]:
    """A failure to prepare an announcement fails the test that met it (realtime logs it and
    goes on, in production): a systematic one cannot hide behind a green run. Tests of that
    logging turn it off for themselves (``quiet_preparation_failures``)."""
    from realtime.testing import raise_preparation_failures

    raise_preparation_failures(True)
    yield
    raise_preparation_failures(False)


@pytest.fixture
def quiet_preparation_failures() -> Iterator[None]:
    """Within the test: a failure to prepare an announcement is logged, as in production."""
    from realtime.testing import raise_preparation_failures

    raise_preparation_failures(False)
    yield
    raise_preparation_failures(True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``server`` each test served by real daphne or uvicorn workers (it needs the
    ``live_servers`` fixture), so that a run can leave them out with ``-m "not server"``;
    bound the body of each coroutine test (see ``bounded``)."""
    default = float(config.getini("timeout") or 0)
    for item in items:
        if "live_servers" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.server)
        function = getattr(item, "obj", None)
        marked = item.get_closest_marker("timeout")
        limit = float(marked.args[0]) if marked is not None and marked.args else default
        if limit > BODY_MARGIN and inspect.iscoroutinefunction(function):
            item.obj = bounded(function, limit - BODY_MARGIN)  # type: ignore[attr-defined]


#: Seconds before pytest-timeout's limit at which a coroutine test's body is cancelled.
BODY_MARGIN = 15.0


def bounded(test: Callable[..., Any], seconds: float) -> Callable[..., Any]:
    """``test`` cancelled after ``seconds``: the failure's traceback then goes through the
    await that never returned (pytest-timeout, later, shows only the event loop's wait)."""

    @functools.wraps(test)
    async def run(*args: Any, **kwargs: Any) -> Any:
        async with asyncio.timeout(seconds):
            return await test(*args, **kwargs)

    return run


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
    connections that would keep PostgreSQL from dropping it), and the connections of the
    thread asgiref runs thread-sensitive sync code on when no sync code waits (a broadcast or
    ``announce`` from a test's async code, Django's async ORM there)."""
    yield
    from asgiref.sync import sync_to_async
    from django.db import connections

    from realtime.blocking import close_connections
    from realtime.transports import reset_transport

    reset_transport()
    close_connections()
    asyncio.run(sync_to_async(connections.close_all)())


#: The transports ``each_transport`` runs a test on: all of them, or those
#: ``REALTIME_TEST_TRANSPORTS`` names (comma-separated; CI runs Redis in a cell of its own).
TRANSPORTS = [
    name
    for name in ["table", "pg_notify", "redis"]
    if name in os.environ.get("REALTIME_TEST_TRANSPORTS", "table,pg_notify,redis").split(",")
]


@pytest.fixture(params=TRANSPORTS)
def each_transport(request: pytest.FixtureRequest, live_servers: Any, settings: Any) -> Any:
    """Run a test once per transport: in this process and in the daphne servers it starts.

    pg_notify needs PostgreSQL, and redis a ``redis-server``; elsewhere their runs are skipped.
    """
    from django.db import connection

    if request.param == "pg_notify" and connection.vendor != "postgresql":
        pytest.skip("pg_notify needs PostgreSQL")
    chosen = {"REALTIME_TRANSPORT": request.param}
    if request.param == "redis":
        chosen["REALTIME_REDIS_URL"] = request.getfixturevalue("sockets_redis").url
    for name, value in chosen.items():
        setattr(settings, name, value)
    live_servers.defaults = chosen
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


@pytest.fixture(scope="session")
def _redis_process() -> Iterator[RedisServer]:
    """This run's ``redis-server``, started on first use (see ``tests.redis_server``)."""
    reason = missing()
    if reason is not None:
        pytest.skip(reason)
    server = RedisServer()
    server.start()
    yield server
    server.close()


@pytest.fixture(scope="session")
def sockets_redis() -> Iterator[RedisServer]:
    """The ``redis-server`` of the tests over sockets (``each_transport``): one of its own,
    never flushed nor restarted, since the run's daphne servers outlive each test and keep
    following its streams (a flush would change their epochs: every socket closed 1012)."""
    reason = missing()
    if reason is not None:
        pytest.skip(reason)
    server = RedisServer()
    server.start()
    yield server
    server.close()


@pytest.fixture
def redis_server(_redis_process: RedisServer) -> RedisServer:
    """The run's ``redis-server``, running (a test may have stopped it) and flushed."""
    _redis_process.start()
    _redis_process.flush()
    return _redis_process


@pytest.fixture(scope="session")
def _redis_cluster_process() -> Iterator[RedisCluster]:
    """This run's Redis Cluster (three primaries, a replica each), started on first use (see
    ``tests.redis_cluster``)."""
    reason = missing() or (None if cluster_available() else "redis-cli is not installed")
    if reason is not None:
        pytest.skip(reason)
    cluster = RedisCluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture
def redis_cluster(_redis_cluster_process: RedisCluster) -> Iterator[RedisCluster]:
    """The run's Redis Cluster, every node running and every slot served, flushed; nodes a
    test killed are started again afterwards."""
    cluster = _redis_cluster_process
    cluster.wait_ok()
    cluster.flush()
    yield cluster
    stopped = [node for node in cluster.nodes if node.process is None]
    for node in stopped:
        cluster.launch(node)
    if stopped:
        cluster.wait_ok()


@pytest.fixture
async def make_redis_transport(redis_server: RedisServer) -> AsyncIterator[Callable[..., Any]]:
    """Build Redis transports on the test server with fast test timings; stop and close
    them afterwards."""
    async with transports(redis_server.url) as make:
        yield make


@pytest.fixture(autouse=True)
def _fresh_log_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Give each test whole budgets of limited log lines (``realtime.logs``): lines other
    tests logged in this process must not hold back the ones a test looks for."""
    from realtime import logs

    monkeypatch.setattr(logs, "client_budget", logs.LogLimiter(logs.CLIENT_LINES_PER_MINUTE))
    monkeypatch.setattr(logs, "operation_budget", logs.LogLimiter(logs.OPERATION_LINES_PER_MINUTE))
    monkeypatch.setattr(logs, "place_budgets", logs.PlaceLimiter())
