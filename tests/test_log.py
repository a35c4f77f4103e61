"""The log under the table transport: ids grow in commit order, positions, reading after one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from django.db import connection

from realtime import limits
from realtime.positions import GLOBAL, Vector, global_position, mark_of
from realtime.transports.table import TableTransport
from tests.helpers import WAIT, Inbox, off_loop, only_on, start_worker

pytestmark = pytest.mark.django_db(transaction=True)

MakeTransport = Callable[..., TableTransport]


def publishers_waiting_for_the_lock() -> int:
    """How many connections wait for realtime's publish lock right now."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT COUNT(*) FROM pg_stat_activity "
                "WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'"
            )
        else:
            cursor.execute(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST "
                "WHERE INFO LIKE 'SELECT GET_LOCK%%' AND STATE LIKE '%%lock%%'"
            )
        row = cursor.fetchone()
    return int(row[0]) if row else 0


async def until(predicate: Callable[[], bool]) -> None:
    """Ask ``predicate`` (off the loop) until it holds, for at most ``WAIT`` seconds."""
    async with asyncio.timeout(WAIT):
        while True:
            if await off_loop(predicate):
                return
            await asyncio.sleep(0.02)


def ids_and_payloads(channel: bytes) -> list[tuple[int, bytes]]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, payload FROM firm_channel_messages WHERE channel = %s ORDER BY id",
            [channel],
        )
        return [(int(i), bytes(p)) for i, p in cursor.fetchall()]


@only_on("postgresql", "mysql")
async def test_a_publisher_waits_for_one_still_committing_so_ids_grow_in_commit_order() -> None:
    holder = start_worker("hold-publish", "order", "first")
    assert holder.stdout is not None
    assert holder.stdin is not None
    try:
        assert (await off_loop(holder.stdout.readline)).strip() == "inserted"
        second = asyncio.ensure_future(
            off_loop(TableTransport(auto_trim=False).publish, [("order", b"second")])
        )
        await until(lambda: publishers_waiting_for_the_lock() > 0)
        assert not second.done()
        assert await off_loop(ids_and_payloads, b"order") == []
        holder.stdin.write("commit\n")
        holder.stdin.flush()
        assert (await off_loop(holder.stdout.readline)).strip() == "committed"
        await asyncio.wait_for(second, WAIT)
    finally:
        holder.communicate(timeout=30)
    rows = await off_loop(ids_and_payloads, b"order")
    assert [payload for _, payload in rows] == [b"first", b"second"]


async def test_the_last_position_is_the_highest_id_and_grows_with_each_publish(
    make_table_transport: MakeTransport,
) -> None:
    transport = make_table_transport()
    before = await off_loop(transport.last_position)
    await off_loop(transport.publish, [("pos", b"a"), ("pos", b"b")])
    after = await off_loop(transport.last_position)
    assert before is not None
    assert after is not None
    assert after >= before + 2
    assert [i for i, _ in await off_loop(ids_and_payloads, b"pos")][-1] == after


async def test_the_log_tells_the_mark_of_each_message_it_holds_and_of_its_last_with_its_bounds(
    make_table_transport: MakeTransport,
) -> None:
    transport = make_table_transport()
    await off_loop(transport.publish, [("mark", b"a"), ("mark", b"b")])
    (first, a), (_, b) = await off_loop(ids_and_payloads, b"mark")
    bounds = (await off_loop(transport.stream_bounds, [GLOBAL]) or {})[GLOBAL]
    assert (bounds.epoch, bounds.last) == (mark_of(b), first + 1)
    assert mark_of(a) != mark_of(b)
    marks = await off_loop(transport.log_marks, [first, first + 1, first + 2])
    assert marks == {first: mark_of(a), first + 1: mark_of(b)}
    # Read from the log, a message's position carries its mark, as a worker is handed it.
    read = await off_loop(transport.read_streams, ["mark"], Vector({GLOBAL: ("", 0)}), 10)
    assert [position for _, _, position in read][-2:] == [
        global_position(first, mark_of(a)),
        global_position(first + 1, mark_of(b)),
    ]


async def test_reading_the_log_after_a_position_gives_those_channels_in_order(
    make_table_transport: MakeTransport,
) -> None:
    transport = make_table_transport()
    await off_loop(transport.publish, [("a", b"1")])
    start = await off_loop(transport.last_position)
    assert start is not None
    await off_loop(transport.publish, [("a", b"2"), ("b", b"3"), ("c", b"4"), ("a", b"5")])
    read = await off_loop(transport.read_log, ["a", "b"], start, 100)
    assert [(channel, payload) for channel, payload, _ in read] == [
        ("a", b"2"),
        ("b", b"3"),
        ("a", b"5"),
    ]
    positions = [position for _, _, position in read]
    assert positions == sorted(positions)
    assert positions[0] > start
    limited = await off_loop(transport.read_log, ["a", "b"], start, 2)
    assert [payload for _, payload, _ in limited] == [b"2", b"3"]


async def test_delivered_messages_carry_their_position(
    make_table_transport: MakeTransport, inbox: Inbox
) -> None:
    transport = make_table_transport()
    transport.add_listener(inbox)
    await transport.follow("where")
    await off_loop(transport.publish, [("where", b"x"), ("where", b"y")])
    await inbox.wait_for("where", b"y")
    stored = await off_loop(ids_and_payloads, b"where")
    assert inbox.positions == [i for i, _ in stored]


def count_of(channel: bytes) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM firm_channel_messages WHERE channel = %s", [channel])
        row = cursor.fetchone()
    return int(row[0]) if row else 0


async def test_a_publish_heavier_than_a_statement_can_carry_is_inserted_whole(
    make_table_transport: MakeTransport,
) -> None:
    # 200 messages of 90 kB, each far under REALTIME_MAX_PAYLOAD: 18 MB in one INSERT is more
    # than MariaDB takes in a packet (16 MiB), which dropped the connection with the publish.
    transport = make_table_transport()
    messages = [("heavy", bytes([65 + n % 26]) * 90_000) for n in range(200)]
    await off_loop(transport.publish, messages)
    rows = await off_loop(ids_and_payloads, b"heavy")
    assert [payload for _, payload in rows] == [payload for _, payload in messages]


async def test_a_large_publish_holds_the_lock_and_commits_one_chunk_at_a_time(
    make_table_transport: MakeTransport,
) -> None:
    # Another publisher waits for one chunk at most, not for a whole large transaction.
    transport = make_table_transport()
    total = 40 * limits.PUBLISH_CHUNK
    messages = [("big", str(n).encode()) for n in range(total)]
    publishing = asyncio.ensure_future(off_loop(transport.publish, messages))
    seen = set()
    async with asyncio.timeout(WAIT):
        while not publishing.done():
            seen.add(await off_loop(count_of, b"big"))
    await publishing
    assert any(0 < n < total for n in seen), seen
    # Each chunk is a transaction of its own: visible whole, never in part.
    assert all(n % limits.PUBLISH_CHUNK == 0 for n in seen), seen
    rows = await off_loop(ids_and_payloads, b"big")
    assert [payload for _, payload in rows] == [payload for _, payload in messages]
