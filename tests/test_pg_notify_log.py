"""The pg_notify transport with its log: whole messages of any size, positions, and nothing
lost while the LISTEN connection is down (it reads from the log what it missed)."""

from __future__ import annotations

import asyncio
import logging
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from django.db import connection

from realtime.transports.pg_notify import PgNotifyTransport, conninfo_of
from realtime.transports.table_store import PUBLISH_LOCK_KEY, MessageStore, Row, channel_hash
from tests.helpers import (
    ROOT,
    WAIT,
    Inbox,
    SmallQueue,
    eventually,
    off_loop,
    only_on,
    subprocess_env,
)
from tests.proxy import Proxy
from tests.test_pg_notify_resilience import listener_backends, terminate
from tests.transport_contract import MARKER, TransportContract

pytestmark = [pytest.mark.django_db(transaction=True), only_on("postgresql")]

MakeTransport = Callable[..., PgNotifyTransport]


@pytest.fixture
async def make_pg_transport() -> AsyncIterator[MakeTransport]:
    built: list[PgNotifyTransport] = []

    def make(**options: Any) -> PgNotifyTransport:
        options.setdefault("supervise_interval", 0.2)
        options.setdefault("backoff_start", 0.05)
        options.setdefault("backoff_max", 0.4)
        transport = PgNotifyTransport(**options)
        built.append(transport)
        return transport

    yield make
    for transport in built:
        await transport.stop()
        transport.close()


class TestPgNotifyWithoutTheLogContract(TransportContract):
    """With ``REALTIME_PG_NOTIFY_LOG = False`` the bare NOTIFY transport keeps the contract."""

    @pytest.fixture
    def transport(self, make_pg_transport: MakeTransport) -> PgNotifyTransport:
        return make_pg_transport(log=False)

    @pytest.fixture
    def idle_transport(self, make_pg_transport: MakeTransport) -> PgNotifyTransport:
        return make_pg_transport(log=False, heartbeat_interval=60.0)

    def publish_from_another_process(self, channel: str, payload: str) -> None:
        env = {**subprocess_env(), "REALTIME_TEST_SETTINGS": '{"REALTIME_PG_NOTIFY_LOG": false}'}
        done = subprocess.run(
            [sys.executable, "-m", "tests.worker", "publish-pg", channel, payload],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.stdout.strip() == "published", done.stderr


def stored() -> list[tuple[int, bytes, bytes]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, channel, payload FROM firm_channel_messages ORDER BY id")
        return [(int(i), bytes(c), bytes(p)) for i, c, p in cursor.fetchall()]


async def test_every_message_is_a_row_of_the_log_and_arrives_with_its_position(
    make_pg_transport: MakeTransport, inbox: Inbox
) -> None:
    transport = make_pg_transport()
    transport.add_listener(inbox)
    await transport.follow("logged")
    await off_loop(transport.publish, [("logged", b"one"), ("logged", b"two")])
    await inbox.wait_for("logged", b"two")
    rows = [row for row in await off_loop(stored) if row[1] == b"logged"]
    assert [payload for _, _, payload in rows] == [b"one", b"two"]
    assert inbox.positions == [position for position, _, _ in rows]


def test_a_publish_whose_log_trim_cannot_be_scheduled_is_published_without_an_error(
    caplog: pytest.LogCaptureFixture, settings: Any
) -> None:
    """As the table transport (tests/test_table_transport.py): the executor refusing new work
    once the rows are in, as while the interpreter exits, skips the trim only."""
    settings.REALTIME_TRIM_BATCH_SIZE = 2  # a trim asked for on every message
    transport = PgNotifyTransport()
    refusing = transport.trimmer._thread = ThreadPoolExecutor(max_workers=1)
    refusing.shutdown()
    try:
        with caplog.at_level(logging.DEBUG, logger="realtime"):
            transport.publish([("logged", b"published")])
    finally:
        transport.trimmer._thread = None
    assert [payload for _, _, payload in stored()] == [b"published"]
    assert transport.trimmer.pending == 0
    assert [r.getMessage() for r in caplog.records if r.levelno > logging.DEBUG] == []


async def test_a_message_too_large_for_a_notification_arrives_whole_and_in_its_place(
    make_pg_transport: MakeTransport, inbox: Inbox
) -> None:
    transport = make_pg_transport()
    transport.add_listener(inbox)
    await transport.follow("sizes")
    big = ("é" * 20_000).encode()
    await off_loop(transport.publish, [("sizes", b"small"), ("sizes", big)])
    await off_loop(transport.publish, [("sizes", b"after")])
    await inbox.wait_for("sizes", b"after")
    assert inbox.payloads("sizes") == [b"small", big, b"after"]


class HeldRowReads:
    """The transport's real row read, held until the test lets it go (a busy database)."""

    def __init__(self, transport: PgNotifyTransport) -> None:
        self.read = transport._sequencer.read_rows
        self.started = asyncio.Event()
        self.go = asyncio.Event()
        transport._sequencer.read_rows = self

    async def __call__(self, positions: list[int]) -> list[Row]:
        self.started.set()
        await self.go.wait()
        return await self.read(positions)


async def test_a_message_too_large_heard_while_an_earlier_row_is_read_arrives_too(
    make_pg_transport: MakeTransport, inbox: Inbox
) -> None:
    transport = make_pg_transport()
    transport.add_listener(inbox)
    await transport.follow("rows")
    reads = HeldRowReads(transport)
    first, second = b"1" * 9000, b"2" * 9000
    await off_loop(transport.publish, [("rows", first)])
    async with asyncio.timeout(WAIT):
        await reads.started.wait()
    # Heard while the first row is read: its row is not part of that read.
    await off_loop(transport.publish, [("rows", second)])
    await off_loop(transport.publish, [("rows", MARKER)])
    await eventually(lambda: len(transport._sequencer._queue) == 3)
    reads.go.set()
    await inbox.wait_for("rows", MARKER)
    assert inbox.payloads("rows") == [first, second, MARKER]


async def test_messages_published_while_the_listen_connection_is_down_arrive_once_in_order(
    make_pg_transport: MakeTransport, inbox: Inbox, caplog: pytest.LogCaptureFixture
) -> None:
    transport = make_pg_transport(backoff_start=1.0, backoff_max=1.0)
    transport.add_listener(inbox)
    await transport.follow("outage")
    await off_loop(transport.publish, [("outage", b"before")])
    await inbox.wait_for("outage", b"before")
    listener = transport.listener
    assert listener is not None
    old_pid = listener.backend_pid
    assert old_pid is not None
    with caplog.at_level(logging.INFO, logger="realtime"):
        assert await off_loop(terminate, old_pid)
        # The listener waits a second before it reconnects: these are published meanwhile.
        for number in range(5):
            await off_loop(transport.publish, [("outage", f"during {number}".encode())])
        await eventually(lambda: listener.backend_pid != old_pid, timeout=10.0)
        await off_loop(transport.publish, [("outage", MARKER)])
        await inbox.wait_for("outage", MARKER)
    during = [f"during {number}".encode() for number in range(5)]
    assert inbox.payloads("outage") == [b"before", *during, MARKER]
    positions = [p for p in inbox.positions if p is not None]
    assert positions == sorted(positions)
    assert len(set(positions)) == len(positions)
    assert any("missed 5 message(s)" in r.getMessage() for r in caplog.records)
    assert listener.backend_pid in await off_loop(listener_backends)


async def test_an_outage_whose_messages_were_trimmed_meanwhile_closes_the_sockets_to_read_again(
    make_pg_transport: MakeTransport, inbox: Inbox, proxy: Proxy, caplog: pytest.LogCaptureFixture
) -> None:
    # Only the LISTEN connection goes through the relay: the publisher still reaches the log.
    transport = make_pg_transport(listen_database=proxy.dsn(str(connection.settings_dict["NAME"])))
    reports: list[frozenset[str]] = []
    transport.add_listener(inbox, missed=reports.append)
    await transport.follow("trimmed")
    await off_loop(transport.publish, [("trimmed", b"before")])
    await inbox.wait_for("trimmed", b"before")
    listener = transport.listener
    assert listener is not None
    with caplog.at_level(logging.WARNING, logger="realtime"):
        await proxy.close()
        await eventually(lambda: not listener.connected.is_set())
        for number in range(3):
            await off_loop(transport.publish, [("trimmed", f"during {number}".encode())])
        # An outage longer than the retention (or a manual realtime_trim --retention 0).
        assert await off_loop(transport.trimmer.trim, 0.0, 1000) >= 4
        await proxy.open()
        await eventually(lambda: listener.connected.is_set())
        await off_loop(transport.publish, [("trimmed", MARKER)])
        await inbox.wait_for("trimmed", MARKER)
    assert inbox.payloads("trimmed") == [b"before", MARKER]
    assert reports == [frozenset({"trimmed"})]
    assert any("trimmed from the log before they could" in r.getMessage() for r in caplog.records)


async def test_a_worker_that_started_on_a_log_trimmed_empty_owes_nothing_from_before_it(
    make_pg_transport: MakeTransport, inbox: Inbox, proxy: Proxy
) -> None:
    transport = make_pg_transport(listen_database=proxy.dsn(str(connection.settings_dict["NAME"])))
    await off_loop(transport.publish, [("elsewhere", b"long ago")])
    assert await off_loop(transport.trimmer.trim, 0.0, 1000) >= 1
    reports: list[frozenset[str]] = []
    transport.add_listener(inbox, missed=reports.append)
    await transport.follow("fresh")
    listener = transport.listener
    assert listener is not None
    await proxy.close()
    await eventually(lambda: not listener.connected.is_set())
    await off_loop(transport.publish, [("fresh", b"during")])
    await proxy.open()
    await off_loop(transport.publish, [("fresh", MARKER)])
    await inbox.wait_for("fresh", MARKER)
    # The ids trimmed before the worker started were never its to hand over.
    assert inbox.payloads("fresh") == [b"during", MARKER]
    assert reports == []


async def test_a_log_found_empty_is_looked_at_again_once_a_publish_under_way_has_committed() -> (
    None
):
    # Found empty, the log's start is one past the last id handed out, read under the
    # publish lock: a publish holding it commits first, and its row must count as kept.
    await off_loop(trim_everything)
    store = MessageStore()
    with psycopg.connect(**conninfo_of(None)) as publishing:
        publishing.execute("SELECT pg_advisory_xact_lock(%s)", [PUBLISH_LOCK_KEY])
        row = publishing.execute(
            "INSERT INTO firm_channel_messages (channel, payload, channel_hash, created_at) "
            "VALUES (%s, %s, %s, now()) RETURNING id",
            [b"late", b"m", channel_hash(b"late")],
        ).fetchone()
        assert row is not None
        looking = asyncio.ensure_future(off_loop(store.first_kept))
        # Found the log empty, it waits for the lock.
        await eventually(lambda: lock_awaited(publishing))
        publishing.commit()
        async with asyncio.timeout(WAIT):
            assert await looking == row[0]


def trim_everything() -> None:
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM firm_channel_messages")


def lock_awaited(session: psycopg.Connection[Any]) -> bool:
    waiting = session.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
    ).fetchone()
    return waiting is not None and waiting[0] > 0


async def test_a_message_too_large_whose_row_is_trimmed_before_it_is_read_closes_its_sockets(
    make_pg_transport: MakeTransport, inbox: Inbox
) -> None:
    transport = make_pg_transport()
    reports: list[frozenset[str]] = []
    transport.add_listener(inbox, missed=reports.append)
    await transport.follow("gone")
    reads = HeldRowReads(transport)
    await off_loop(transport.publish, [("gone", b"x" * 9000)])
    async with asyncio.timeout(WAIT):
        await reads.started.wait()
    assert await off_loop(transport.trimmer.trim, 0.0, 1000) >= 1
    reads.go.set()
    await off_loop(transport.publish, [("gone", MARKER)])
    await inbox.wait_for("gone", MARKER)
    assert inbox.payloads("gone") == [MARKER]
    assert reports == [frozenset({"gone"})]


async def test_catching_up_skips_what_a_channel_published_before_it_was_followed(
    make_pg_transport: MakeTransport, inbox: Inbox
) -> None:
    transport = make_pg_transport(backoff_start=1.0, backoff_max=1.0)
    transport.add_listener(inbox)
    await transport.follow("early")
    await off_loop(transport.publish, [("late", b"before its follow")])
    await transport.follow("late")
    listener = transport.listener
    assert listener is not None
    old_pid = listener.backend_pid
    assert old_pid is not None
    assert await off_loop(terminate, old_pid)
    await off_loop(transport.publish, [("late", b"during")])
    await eventually(lambda: listener.backend_pid != old_pid, timeout=10.0)
    await off_loop(transport.publish, [("late", MARKER)])
    await inbox.wait_for("late", MARKER)
    assert inbox.payloads("late") == [b"during", MARKER]


async def test_without_the_log_the_last_position_is_unknown_and_nothing_is_stored(
    make_pg_transport: MakeTransport, inbox: Inbox
) -> None:
    transport = make_pg_transport(log=False)
    transport.add_listener(inbox)
    await transport.follow("bare")
    before = await off_loop(stored)
    await off_loop(transport.publish, [("bare", b"x")])
    await inbox.wait_for("bare", b"x")
    assert await off_loop(stored) == before
    assert inbox.positions == [None]
    assert await off_loop(transport.last_position) is None
    assert await off_loop(transport.read_log, ["bare"], 0, 10) == []


async def test_notifications_beyond_the_listeners_room_are_caught_up_from_the_log_whole(
    make_pg_transport: MakeTransport, caplog: pytest.LogCaptureFixture
) -> None:
    transport = make_pg_transport()
    queue = SmallQueue(size=20, per_tick=7)
    transport.add_listener(queue, room=queue.room)
    drain = asyncio.ensure_future(queue.drain())
    try:
        await transport.follow("burst")
        sent = [f"{n}".encode() for n in range(150)]
        with caplog.at_level(logging.WARNING, logger="realtime"):
            await off_loop(transport.publish, [("burst", payload) for payload in sent])
            await off_loop(transport.publish, [("burst", MARKER)])
            await eventually(lambda: MARKER in queue.heard)
    finally:
        drain.cancel()
    assert queue.overflowed == 0
    assert queue.heard == [*sent, MARKER]
    # Counted, and said once for the burst (at most once per interval), with the count.
    overflows = [
        r.getMessage() for r in caplog.records if "delivery queue was full" in r.getMessage()
    ]
    assert len(overflows) == 1
    assert re.search(r"full \d+ time\(s\) since the last report \(\d+ in all\)", overflows[0])
    assert transport.overflows.total >= 1


async def test_a_worker_without_the_log_delivers_what_a_publisher_keeping_it_sends(
    make_pg_transport: MakeTransport, inbox: Inbox, caplog: pytest.LogCaptureFixture
) -> None:
    # A deploy turning the log on or off runs both kinds of process for a while.
    worker = make_pg_transport(log=False)
    worker.add_listener(inbox)
    await worker.follow("mixed")
    publisher = make_pg_transport(log=True)
    messages = [b'{"n": 1}', b'{"n": 2}']
    with caplog.at_level(logging.WARNING, logger="realtime"):
        await off_loop(publisher.publish, [("mixed", message) for message in messages])
        await inbox.wait_for("mixed", messages[-1])
    assert inbox.payloads("mixed") == messages
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [
        "realtime: a publisher keeps the pg_notify log but this worker does not; "
        "set REALTIME_PG_NOTIFY_LOG the same on every process"
    ]
