"""Every wait that can stall is watched, and every queue realtime fills is bounded.

A pg_notify worker whose log reads keep failing (its connections to the database cut through
``Proxy``, its LISTEN connection direct) escalates once and closes the sockets it owes
messages 1012; a delivery task that dies takes what it held with it, and the sockets of those
messages are closed 1012; ``event_delivered`` signals and trim requests beyond their bounds are
not made, only counted. Sockets are real: a daphne worker, or a uvicorn server in this process
where the test must reach the worker's own objects (to kill a task, to connect a receiver).
Waits are bounded; absence is proven with a marker sent afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
import time
from collections.abc import AsyncIterator, Iterator
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import pytest
import uvicorn
from django.contrib.auth import get_user_model
from django.db import connection, connections, transaction
from prometheus_client import REGISTRY

from realtime import signals
from realtime.broadcast import broadcast_to_scope
from realtime.messages import scope_channel
from realtime.positions import StreamPos
from realtime.sockets.manager import SocketManager, get_manager
from realtime.transports import trimming
from realtime.transports.table_store import MessageStore, db_seconds_ago

if TYPE_CHECKING:
    from realtime.transports.pg_notify import PgNotifyTransport
from tests.helpers import WAIT, Inbox, eventually, off_loop, only_on, vendor
from tests.live import Client, Clients, LiveServers, Server, free_port
from tests.proxy import Proxy, databases_through
from tests.test_outage_e2e import (
    BURST,
    FAST_BACK,
    MARKER,
    PG_NOTIFY,
    burst,
    marker,
    members,
    numbers_until_marker,
    use,
)
from tests.testapp.models import Company, Membership, Workspace

pytestmark = pytest.mark.django_db(transaction=True)


def overflowed(queue: str) -> float:
    """This process's count of what the bounded queue ``queue`` turned away."""
    value = REGISTRY.get_sample_value("realtime_queue_overflows_total", {"queue": queue})
    return value or 0.0


def realtime_lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("realtime") and r.levelno == level
    ]


def second_workspace(username: str) -> int:
    """A workspace ``beta`` of which ``username`` alone is a member; its id."""
    beta = Workspace.objects.create(name="Beta", slug="beta")
    Membership.objects.create(workspace=beta, user=get_user_model().objects.get(username=username))
    return beta.pk


@pytest.fixture
async def here(settings: Any) -> AsyncIterator[Server]:
    """A uvicorn server in this process, on this test's event loop: its manager is this
    loop's (``get_manager()``), its transport this process's."""
    from tests.asgi import application

    settings.REALTIME_POLLING_INTERVAL = 0.02
    port = free_port()
    config = uvicorn.Config(
        application,
        host="127.0.0.1",
        port=port,
        lifespan="off",
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    serving = asyncio.ensure_future(server.serve())
    await eventually(lambda: server.started or serving.done())
    yield cast(Server, SimpleNamespace(url=f"ws://127.0.0.1:{port}/api/ws", port=port))
    server.should_exit = True
    async with asyncio.timeout(WAIT):
        await serving


# The pg_notify log ---------------------------------------------------------------------------


@only_on("postgresql")
async def test_log_reads_failing_past_their_bound_are_one_error_and_close_the_owed_sockets_1012(
    live_servers: LiveServers, ws: Clients, settings: Any, proxy: Proxy
) -> None:
    # The worker reads its log through the relay; its LISTEN connection goes straight to the
    # database, so it keeps hearing notifications while every read of the log fails.
    use(settings, PG_NOTIFY)
    direct = proxy.dsn(str(connection.settings_dict["NAME"])).replace(
        f"host=127.0.0.1 port={proxy.port}",
        f"host={connection.settings_dict['HOST']} port={connection.settings_dict['PORT']}",
    )
    server = live_servers.get(
        "log-reads-cut",
        DATABASES=databases_through(proxy),
        REALTIME_LISTEN_DATABASE=direct,
        # The bound: a heartbeat interval and timeout (one second here).
        REALTIME_HEARTBEAT_INTERVAL=0.5,
        REALTIME_HEARTBEAT_TIMEOUT=0.5,
        **PG_NOTIFY,
        **FAST_BACK,
    )
    workspace, tokens = await off_loop(members, 2)
    beta = await off_loop(second_workspace, "member1")
    owed = await ws.authenticated(server, tokens[0], scope="acme")
    other = await ws.authenticated(server, tokens[1], scope="beta")
    await off_loop(burst, workspace.pk, 0, 1)
    await off_loop(marker, workspace.pk)
    assert await numbers_until_marker(owed) == [0]

    await proxy.close()
    # Too large for its notification: the worker must read it from the log, and cannot.
    await off_loop(broadcast_to_scope, workspace.pk, BURST, {"n": 1, "blob": "x" * 8000})
    assert await owed.closed_with() == 1012

    # Once the log reads again, the other scope's socket, owed nothing, hears on.
    await proxy.open()
    await off_loop(marker, beta)
    assert await numbers_until_marker(other) == []
    again = await ws.authenticated(server, tokens[0], scope="acme")
    await off_loop(burst, workspace.pk, 2, 1)
    await off_loop(marker, workspace.pk)
    assert await numbers_until_marker(again) == [2]
    log = server.log_text()
    assert log.count("reading the log keeps failing for over 1.0 s") == 1, log
    assert "1 socket(s) may have missed messages; closed 1012" in log


# Delivery tasks ------------------------------------------------------------------------------


class KillsOnce:
    """A transport listener heard after the manager's: at the first message of ``channel``
    (queued by then, not yet planned), it cancels one of the manager's delivery tasks."""

    def __init__(self, manager: SocketManager, task: int, channel: str) -> None:
        self.manager, self.task, self.channel = manager, task, channel
        self.killed = False

    def __call__(self, channel: str, payload: bytes, position: StreamPos | None = None) -> None:
        if channel == self.channel and not self.killed:
            self.killed = True
            self.manager.dispatcher._tasks[self.task].cancel()


@pytest.mark.parametrize("task", [pytest.param(0, id="planner"), pytest.param(1, id="sender")])
async def test_a_delivery_task_that_dies_closes_the_sockets_of_what_it_held_1012(
    here: Server, ws: Clients, caplog: pytest.LogCaptureFixture, task: int
) -> None:
    workspace, tokens = await off_loop(members, 2)
    beta = await off_loop(second_workspace, "member1")
    owed = await ws.authenticated(here, tokens[0], scope="acme")
    other = await ws.authenticated(here, tokens[1], scope="beta")
    manager = get_manager()
    transport = manager.transport()
    kill = KillsOnce(manager, task, scope_channel(workspace.pk))
    transport.add_listener(kill)
    try:
        with caplog.at_level(logging.WARNING, logger="realtime"):
            await off_loop(burst, workspace.pk, 0, 3)
            assert await owed.closed_with() == 1012
            # The other scope lost nothing: its socket hears on.
            await off_loop(marker, beta)
            assert await numbers_until_marker(other) == []
    finally:
        transport.remove_listener(kill)
    assert kill.killed
    assert not [frame for frame in owed.received if frame.get("type") == MARKER]
    errors = realtime_lines(caplog, logging.ERROR)
    assert len(errors) == 1, errors
    found = re.search(r"a delivery task stopped \(cancelled\); restarted: (\d+) message", errors[0])
    assert found, errors
    assert int(found.group(1)) >= 1, errors


# The event_delivered signal ------------------------------------------------------------------


class Held:
    """An ``event_delivered`` receiver that waits until the test lets it go."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.release = asyncio.Event()

    async def receive(self, sender: Any, event_type: str, **kwargs: Any) -> None:
        self.calls.append(event_type)
        await self.release.wait()


@pytest.fixture
def held() -> Iterator[Held]:
    receiver = Held()
    signals.event_delivered.connect(receiver.receive, sender=SocketManager, weak=False)
    yield receiver
    receiver.release.set()
    signals.event_delivered.disconnect(receiver.receive, sender=SocketManager)


def company(workspace: Workspace, name: str) -> None:
    Company.objects.create(workspace=workspace, name=name)


async def created(client: Client, name: str) -> None:
    await client.wait_for(
        lambda frame: frame.get("type") == "company.created" and frame["data"]["name"] == name
    )


async def test_event_delivered_signals_past_their_bound_are_not_sent_and_are_counted(
    here: Server,
    ws: Clients,
    settings: Any,
    held: Held,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings.REALTIME_NOTIFY_QUEUE_SIZE = 2  # the bound of signals being sent, too
    workspace, tokens = await off_loop(members, 1)
    # Subscribed in the handshake: held before the first write, whatever the machine's load.
    client = await ws.authenticated(here, tokens[0], scope="acme", channels=["company"])
    before = overflowed("event_delivered_signals")
    with caplog.at_level(logging.WARNING, logger="realtime"):
        # One event at a time: the delivery queue never holds more than one.
        for name in ("a", "b", "c", "d"):
            await off_loop(company, workspace, name)
            await created(client, name)
    # Every frame went out; two receivers still wait, two signals were not sent.
    assert held.calls == ["company.created", "company.created"]
    assert overflowed("event_delivered_signals") - before == 2
    lines = [line for line in realtime_lines(caplog, logging.WARNING) if "event_delivered" in line]
    assert lines == [
        "realtime: 1 event_delivered signal(s) not sent since the last report (1 in all): as "
        "many as REALTIME_NOTIFY_QUEUE_SIZE were still being sent (slow receivers)"
    ]
    held.release.set()
    await off_loop(company, workspace, "e")
    await created(client, "e")
    await eventually(lambda: len(held.calls) == 3)


# Trim requests -------------------------------------------------------------------------------


@contextlib.contextmanager
def log_table_locked() -> Iterator[None]:
    """Hold a lock on ``firm_channel_messages`` that keeps trims waiting, on a thread of its
    own, until the block ends."""
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        from django.db import connections

        try:
            with transaction.atomic(), connections["default"].cursor() as cursor:
                if vendor() == "postgresql":
                    cursor.execute("LOCK TABLE firm_channel_messages IN EXCLUSIVE MODE")
                elif vendor() == "mysql":
                    cursor.execute("LOCK TABLES firm_channel_messages WRITE")
                # SQLite: the atomic block began IMMEDIATE, holding the write lock.
                locked.set()
                release.wait(WAIT)
                if vendor() == "mysql":
                    cursor.execute("UNLOCK TABLES")
        finally:
            connections.close_all()

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert locked.wait(WAIT)
        yield
    finally:
        release.set()
        thread.join(WAIT)


def insert_expired_rows(store: MessageStore, count: int) -> None:
    """Insert ``count`` rows into ``store``'s log and return once a trim with no retention
    would find them expired (the database's clock has moved past their time)."""
    store.insert([(b"trimmed", b"{}")] * count)
    expired = (
        f"SELECT 1 FROM firm_channel_messages WHERE created_at < {db_seconds_ago(store.connection)}"
    )
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        with connections[store.using].cursor() as cursor:
            cursor.execute(expired, [0.0])
            if cursor.fetchone() is not None:
                return
    raise AssertionError("the rows inserted never expired")


async def test_trim_requests_past_their_bound_are_not_made_and_are_counted(
    make_table_transport: Any, caplog: pytest.LogCaptureFixture
) -> None:
    transport = make_table_transport(auto_trim=True, trim_batch_size=1, retention=0)
    trimmer = transport.trimmer
    before = overflowed("trim_requests")
    wanted = trimming.PENDING_TRIMS + 5
    # Trims look for expired rows before they lock, and that look is not held by the lock
    # (SQLite's readers, PostgreSQL's EXCLUSIVE mode): only with rows to delete do they wait.
    await off_loop(insert_expired_rows, transport.store, trimming.PENDING_TRIMS)
    with caplog.at_level(logging.WARNING, logger="realtime"), log_table_locked():
        # Each message published earns two trims of one row: twice as many as are let wait.
        trimmer.published(wanted)
        assert trimmer.pending == trimming.PENDING_TRIMS
    await asyncio.to_thread(transport.wait_for_trims, WAIT)
    await eventually(lambda: trimmer.pending == 0)
    assert trimmer.overflows.total == 2 * wanted - trimming.PENDING_TRIMS
    assert overflowed("trim_requests") - before == 2 * wanted - trimming.PENDING_TRIMS
    lines = [line for line in realtime_lines(caplog, logging.WARNING) if "trim" in line]
    assert len(lines) == 1, lines
    assert "trim(s) of firm_channel_messages not asked for" in lines[0]


# Pending notifications -----------------------------------------------------------------------


@contextlib.contextmanager
def log_reads_denied() -> Iterator[None]:
    """The role may no longer read the log's rows (publishing, which reads back only ids,
    still works): every read of the log fails, as long as the block lasts."""
    role = connection.settings_dict["USER"]
    with connection.cursor() as cursor:
        cursor.execute(f'REVOKE SELECT ON firm_channel_messages FROM "{role}"')
        cursor.execute(f'GRANT SELECT (id) ON firm_channel_messages TO "{role}"')
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'GRANT SELECT ON firm_channel_messages TO "{role}"')


@only_on("postgresql")
async def test_notifications_waiting_behind_an_unreadable_row_are_bounded_and_read_from_the_log(
    inbox: Inbox, settings: Any
) -> None:
    from realtime.transports.pg_notify import PgNotifyTransport

    settings.REALTIME_NOTIFY_QUEUE_SIZE = 3
    transport = PgNotifyTransport(backoff_start=0.05, backoff_max=0.4)
    try:
        await notifications_behind_an_unreadable_row(transport, inbox)
    finally:
        await transport.stop()
        transport.close()


async def notifications_behind_an_unreadable_row(
    transport: PgNotifyTransport, inbox: Inbox
) -> None:
    transport.add_listener(inbox)
    await transport.follow("c")
    before = overflowed("pending_notifications")
    big = b'{"blob": "' + b"x" * 8000 + b'"}'  # read from its row
    small = [f'{{"n": {n}}}'.encode() for n in range(4)]
    denied = log_reads_denied()
    await off_loop(denied.__enter__)
    try:
        await off_loop(transport.publish, [("c", big)])
        await eventually(lambda: transport._sequencer.reads.outage.attempts >= 1)
        for payload in small:
            await off_loop(transport.publish, [("c", payload)])
        # The fourth waiting behind the row let them all go: the log holds them.
        await eventually(lambda: overflowed("pending_notifications") - before == 4)
    finally:
        await off_loop(denied.__exit__, None, None, None)
    await off_loop(transport.publish, [("c", MARKER.encode())])
    await inbox.wait_for("c", MARKER.encode())
    assert inbox.payloads("c") == [big, *small, MARKER.encode()]
    assert transport._sequencer.caught >= 4
