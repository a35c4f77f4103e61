"""The Redis transport against a real redis-server: the shared contract, and what its streams
add — dense offsets per stream, epochs, payloads too large to travel live, relays dropped by
transaction key, the listeners' room, and the history resumes read (``stream_bounds``,
``read_streams``).

Faults (cuts, half-open connections, restarts) are in ``test_redis_faults``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import REGISTRY

from tests.helpers import Inbox, SmallQueue, eventually, off_loop, start_worker
from tests.redis_server import RedisServer
from tests.transport_contract import MARKER, TransportContract

pytest.importorskip("redis", reason='redis-py is not installed ("[redis]" extra)')

from realtime import limits
from realtime.exceptions import PublishError, TransportError
from realtime.messages import base_channel, scope_channel
from realtime.positions import StreamPos, Vector
from realtime.transports import redis as redis_module
from realtime.transports import redis_keys
from realtime.transports.base import StreamBounds
from realtime.transports.redis import LIVE_INLINE, RedisTransport
from realtime.transports.redis_calls import call_each
from realtime.transports.redis_check import OLDEST, version_of
from realtime.transports.redis_keys import parse_live
from realtime.transports.redis_listener import RedisListener
from realtime.transports.redis_sequencer import StreamRead
from realtime.writes.publish import Built, send_now

MakeTransport = Callable[..., RedisTransport]


class TestRedisContract(TransportContract):
    @pytest.fixture
    def transport(
        self, make_redis_transport: MakeTransport, redis_server: RedisServer
    ) -> RedisTransport:
        self.url = redis_server.url  # for the publisher in another process
        return make_redis_transport()

    @pytest.fixture
    def idle_transport(self, make_redis_transport: MakeTransport) -> RedisTransport:
        return make_redis_transport(heartbeat_interval=60.0)

    def publish_from_another_process(self, channel: str, payload: str) -> None:
        worker = start_worker("publish-redis", self.url, channel, payload)
        out, _ = worker.communicate(timeout=60)
        assert worker.returncode == 0
        assert out.strip() == "published"


async def publish(
    transport: RedisTransport, *messages: tuple[str, bytes], txn: str | None = None
) -> None:
    await off_loop(transport.publish, list(messages), txn=txn)


def counted(name: str) -> float:
    """A counter's value in this process (0 before its first count)."""
    return REGISTRY.get_sample_value(name) or 0.0


# Offsets and epochs ---------------------------------------------------------------------------


async def test_each_channel_is_a_stream_with_dense_offsets_in_one_epoch(
    make_redis_transport: MakeTransport, inbox: Inbox
) -> None:
    transport = make_redis_transport()
    transport.add_listener(inbox)
    await transport.follow("a")
    await transport.follow("b")
    await publish(transport, ("a", b"a1"), ("b", b"b1"), ("a", b"a2"))
    await publish(transport, ("a", b"a3"))
    await inbox.wait_for("a", b"a3")
    assert inbox.messages == [("a", b"a1"), ("b", b"b1"), ("a", b"a2"), ("a", b"a3")]
    found = inbox.heard_at()
    assert [(p.stream, p.seq) for p in found] == [("a", 1), ("b", 1), ("a", 2), ("a", 3)]
    epochs = {p.stream: {q.epoch for q in found if q.stream == p.stream} for p in found}
    assert all(len(values) == 1 for values in epochs.values())
    assert transport.stream_of("a") == "a"


async def test_a_unix_socket_url_publishes_and_follows(
    make_redis_transport: MakeTransport, redis_server: RedisServer, inbox: Inbox
) -> None:
    transport = make_redis_transport(url=redis_server.unix_url)
    transport.add_listener(inbox)
    await transport.follow("a")
    await publish(transport, ("a", b"over the socket"))
    await inbox.wait_for("a", b"over the socket")
    assert inbox.messages == [("a", b"over the socket")]


async def test_a_follow_starts_at_the_top_of_a_stream_already_written(
    make_redis_transport: MakeTransport, inbox: Inbox
) -> None:
    transport = make_redis_transport()
    transport.add_listener(inbox)
    await publish(transport, ("late", b"1"), ("late", b"2"))
    await transport.follow("late")
    await publish(transport, ("late", b"3"))
    await inbox.wait_for("late", b"3")
    assert inbox.messages == [("late", b"3")]
    assert [p.seq for p in inbox.heard_at()] == [3]


async def test_channels_holding_braces_get_a_hash_tag_of_their_own(
    make_redis_transport: MakeTransport, inbox: Inbox
) -> None:
    assert redis_keys.tag("realtime_7") == "{realtime_7}"
    odd = ["scope_{a}", "scope_}{", "scope_{b}"]
    assert len({redis_keys.tag(channel) for channel in odd}) == 3
    assert all(redis_keys.tag(c).count("{") == 1 for c in odd)
    transport = make_redis_transport()
    transport.add_listener(inbox)
    for channel in odd:
        await transport.follow(channel)
    await publish(transport, *[(channel, channel.encode()) for channel in odd])
    await inbox.wait_for(odd[-1], odd[-1].encode())
    assert inbox.messages == [(channel, channel.encode()) for channel in odd]


async def test_a_payload_too_large_to_travel_live_is_sent_by_offset_and_read_from_the_stream(
    make_redis_transport: MakeTransport, inbox: Inbox, redis_server: RedisServer
) -> None:
    transport = make_redis_transport()
    transport.add_listener(inbox)
    await transport.follow("big")
    # What the server sends live, seen by a subscriber of our own.
    raw = redis_server.client().pubsub()  # type: ignore[no-untyped-call]
    raw.ssubscribe(redis_keys.shard_channel("big"))
    assert raw.get_message(timeout=5)["type"] == "ssubscribe"
    large = b"x" * (LIVE_INLINE + 1)
    await publish(transport, ("big", b"small"), ("big", large), ("big", MARKER))
    await inbox.wait_for("big", MARKER)
    assert inbox.messages == [("big", b"small"), ("big", large), ("big", MARKER)]
    assert [p.seq for p in inbox.heard_at()] == [1, 2, 3]
    sent = [raw.get_message(timeout=5) for _ in range(3)]
    raw.close()
    data = [message["data"] for message in sent if message is not None]
    epoch = inbox.heard_at()[0].epoch.encode()
    assert data == [epoch + b":1:small", epoch + b":2:", epoch + b":3:" + MARKER]


async def test_a_keyed_relay_sends_live_only_its_call_budget_of_payload_the_rest_by_offset(
    make_redis_transport: MakeTransport,
    inbox: Inbox,
    redis_server: RedisServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(limits, "LIVE_CALL_BYTES", 10_000)
    transport = make_redis_transport()
    transport.add_listener(inbox)
    await transport.follow("a")
    await transport.follow("b")
    raw = redis_server.client().pubsub()  # type: ignore[no-untyped-call]
    raw.ssubscribe(redis_keys.shard_channel("a"), redis_keys.shard_channel("b"))
    assert [raw.get_message(timeout=5)["type"] for _ in range(2)] == ["ssubscribe"] * 2
    # One script call (keyed: a stream's messages are never parted), ten messages of 3,000
    # bytes: three fit the call's budget, the other seven travel by their offset.
    sent = [("ab"[n % 2], b"%02d" % n + b"x" * 2998) for n in range(10)]
    await publish(transport, *sent, txn="t1")
    await publish(transport, ("b", b"next call"), ("a", MARKER))
    await inbox.wait_for("a", MARKER)
    await inbox.wait_for("b", b"next call")
    # Each stream's messages in their order, whether they travelled live or not.
    assert inbox.payloads("a") == [payload for c, payload in sent if c == "a"] + [MARKER]
    assert inbox.payloads("b") == [payload for c, payload in sent if c == "b"] + [b"next call"]
    assert [p.seq for p in inbox.heard_at() if p.stream == "a"] == [1, 2, 3, 4, 5, 6]
    heard = [raw.get_message(timeout=5) for _ in range(12)]
    raw.close()
    data = [message["data"] for message in heard if message is not None]
    assert [d.rpartition(b":")[2] == b"" for d in data] == [False] * 3 + [True] * 7 + [False] * 2


async def test_a_keyed_relay_of_large_messages_leaves_an_idle_subscriber_under_redis_limit(
    make_redis_transport: MakeTransport, inbox: Inbox, redis_server: RedisServer
) -> None:
    """A call's messages all wait in a subscriber's output buffer until it reads them: one
    relay's call of 400 messages of 60 kB (24 MB: a stream's messages are never parted) had
    Redis cut every worker following the stream. Under a limit a quarter of Redis's default
    (32 MB), the default budget leaves even a subscriber that reads nothing connected."""
    import redis

    assert limits.LIVE_CALL_BYTES <= 2 << 20
    with contextlib.closing(redis_server.client()) as admin:
        kept = str(admin.config_get("client-output-buffer-limit")["client-output-buffer-limit"])
        admin.config_set("client-output-buffer-limit", "pubsub 8mb 8mb 60")
        idle = redis.Redis(host="127.0.0.1", port=redis_server.port, client_name="idle")
        try:
            transport = make_redis_transport()
            transport.add_listener(inbox)
            await transport.follow("big")
            raw = idle.pubsub()  # type: ignore[no-untyped-call]
            raw.ssubscribe(redis_keys.shard_channel("big"))
            assert raw.get_message(timeout=5)["type"] == "ssubscribe"
            large = [b"%03d" % n + b"x" * 60_000 for n in range(400)]
            await publish(transport, *[("big", payload) for payload in large], txn="t1")
            await publish(transport, ("big", MARKER))
            await inbox.wait_for("big", MARKER, timeout=60)
            assert inbox.payloads("big") == [*large, MARKER]
            listener = transport.listener
            assert isinstance(listener, RedisListener)
            assert listener.connections == 1  # never cut
            assert "idle" in [client["name"] for client in admin.client_list()]
            heard = [raw.get_message(timeout=5) for _ in range(len(large) + 1)]
            data = [message["data"] for message in heard if message is not None]
            assert len(data) == len(large) + 1
            relayed = [parse_live(d) for d in data[:-1]]
            sent_live = [len(live.payload) for live in relayed if live and live.payload]
            assert 0 < sum(sent_live) <= limits.LIVE_CALL_BYTES
            raw.close()
        finally:
            idle.close()
            admin.config_set("client-output-buffer-limit", kept)


# Relays dropped by transaction key -----------------------------------------------------------


async def test_a_relay_of_a_transaction_already_relayed_is_dropped_per_stream(
    make_redis_transport: MakeTransport, inbox: Inbox, redis_server: RedisServer
) -> None:
    transport = make_redis_transport()
    transport.add_listener(inbox)
    await transport.follow("a")
    await transport.follow("b")
    dropped = counted("realtime_redis_relays_dropped_total")
    await publish(transport, ("a", b"first"), txn="t1")
    # Relayed again (a retry): "a" drops it; "b" never had t1, so it takes its message.
    await publish(transport, ("a", b"again"), ("b", b"b of t1"), txn="t1")
    await publish(transport, ("a", b"second"), txn="t2")
    await publish(transport, ("a", MARKER))
    await inbox.wait_for("a", MARKER)
    assert inbox.payloads("a") == [b"first", b"second", MARKER]
    assert inbox.payloads("b") == [b"b of t1"]
    assert [p.seq for p in inbox.heard_at() if p.stream == "a"] == [1, 2, 3]
    entries = redis_server.entries(redis_keys.stream_key("a"))
    assert [fields.get(b"k") for _, fields in entries] == [b"t1", b"t2", None]
    assert counted("realtime_redis_relays_dropped_total") == dropped + 1


# The listeners' room ---------------------------------------------------------------------------


async def test_messages_beyond_the_listeners_room_are_read_from_the_stream_whole(
    make_redis_transport: MakeTransport,
) -> None:
    transport = make_redis_transport()
    queue = SmallQueue(size=20, per_tick=7)
    transport.add_listener(queue, room=queue.room)
    drain = asyncio.ensure_future(queue.drain())
    try:
        await transport.follow("burst")
        sent = [f"{n}".encode() for n in range(150)]
        await publish(transport, *[("burst", payload) for payload in sent])
        await publish(transport, ("burst", MARKER))
        await eventually(lambda: MARKER in queue.heard)
    finally:
        drain.cancel()
    assert queue.overflowed == 0
    assert queue.heard == [*sent, MARKER]
    assert transport.sequencer.overflows.total >= 1
    assert transport.sequencer.caught > 0


async def test_a_live_message_that_went_missing_is_read_from_the_stream_before_the_next(
    make_redis_transport: MakeTransport, inbox: Inbox, redis_server: RedisServer
) -> None:
    transport = make_redis_transport()
    transport.add_listener(inbox)
    await transport.follow("gap")
    await publish(transport, ("gap", b"1"))
    await inbox.wait_for("gap", b"1")
    # Offset 2 is appended to the stream, but its live message is lost (never sent).
    client = redis_server.client()
    (meta,) = [client.hgetall(redis_keys.meta_key("gap"))]
    client.xadd(redis_keys.stream_key("gap"), {"p": b"2"}, id=f"{int(meta[b't'])}-2")
    client.hset(redis_keys.meta_key("gap"), "n", 2)
    client.close()
    await publish(transport, ("gap", b"3"))
    await inbox.wait_for("gap", b"3")
    assert inbox.payloads("gap") == [b"1", b"2", b"3"]
    assert [p.seq for p in inbox.heard_at()] == [1, 2, 3]


# Epochs ----------------------------------------------------------------------------------------


async def test_a_stream_last_written_by_another_server_gets_a_new_epoch_and_is_reported_missed(
    make_redis_transport: MakeTransport, inbox: Inbox, redis_server: RedisServer
) -> None:
    missed: list[frozenset[str]] = []
    transport = make_redis_transport()
    transport.add_listener(inbox, missed=missed.append)
    await transport.follow("e")
    await transport.follow("other")
    await publish(transport, ("e", b"before"))
    await inbox.wait_for("e", b"before")
    # As after a failover or a restart with an append-only file: the data is there, but the
    # server is another one, which may have lost acknowledged writes.
    client = redis_server.client()
    client.hset(redis_keys.meta_key("e"), "r", "another-server")
    client.close()
    await publish(transport, ("e", b"after"), ("other", MARKER))
    await inbox.wait_for("other", MARKER)
    await eventually(lambda: b"after" in inbox.payloads("e"))
    assert missed == [frozenset(["e"])]
    before, after = inbox.heard_at()[0], inbox.heard_at()[1]
    assert after.epoch != before.epoch
    assert after.seq == before.seq + 1  # offsets go on, in the new epoch
    bounds = await off_loop(transport.stream_bounds, ["e"])
    assert bounds == {"e": StreamBounds(after.epoch, after.seq, after.seq)}


async def test_a_quiet_stream_followed_by_a_worker_keeps_its_epoch(
    make_redis_transport: MakeTransport,
    redis_server: RedisServer,
    inbox: Inbox,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Metas live 0.4 s here (instead of an hour at least): the worker renews them every
    # quarter of that, in its supervisor's rounds.
    monkeypatch.setattr(redis_module, "META_TTL_MIN", 0.4)
    transport = make_redis_transport(resume_window=0.1, supervise_interval=0.05)
    transport.add_listener(inbox)
    await transport.follow("quiet")
    await publish(transport, ("quiet", b"first"))
    await inbox.wait_for("quiet", b"first")
    # Rounds spanning more than twice the meta's lifetime: without them it would be gone.
    start = transport.meta_refreshes
    await eventually(lambda: transport.meta_refreshes >= start + 8)
    await publish(transport, ("quiet", b"second"))
    await inbox.wait_for("quiet", b"second")
    first, second = inbox.heard_at()
    assert (second.epoch, second.seq) == (first.epoch, 2)


async def test_a_stream_keeps_its_epoch_and_expires_after_the_window(
    make_redis_transport: MakeTransport, redis_server: RedisServer
) -> None:
    transport = make_redis_transport(resume_window=300.0)
    await publish(transport, ("q", b"1"))
    client = redis_server.client()
    stream_ttl = client.pttl(redis_keys.stream_key("q"))
    meta_ttl = client.pttl(redis_keys.meta_key("q"))
    client.close()
    assert 300_000 < stream_ttl <= 360_000  # the window and a margin for clocks
    assert 3_500_000 < meta_ttl <= 3_600_000  # an hour at least: quiet streams keep epochs


# The history resumes read --------------------------------------------------------------------


async def test_stream_bounds_give_epoch_first_and_top_of_each_stream(
    make_redis_transport: MakeTransport,
) -> None:
    transport = make_redis_transport()
    await publish(transport, ("a", b"1"), ("a", b"2"), ("b", b"1"))
    bounds = await off_loop(transport.stream_bounds, ["a", "b", "never"])
    assert bounds is not None
    assert (bounds["a"].first, bounds["a"].last) == (1, 2)
    assert (bounds["b"].first, bounds["b"].last) == (1, 1)
    assert (bounds["never"].first, bounds["never"].last) == (None, 0)
    # A stream never written gets its epoch when asked, and keeps it when written.
    inbox = Inbox()
    transport.add_listener(inbox)
    await transport.follow("never")
    await publish(transport, ("never", b"first"))
    await inbox.wait_for("never", b"first")
    assert inbox.heard_at() == [StreamPos("never", bounds["never"].epoch, 1)]
    assert await off_loop(transport.log_bounds) is None
    assert await off_loop(transport.read_log, ["a"], 0, 10) == []


async def test_read_streams_reads_each_stream_after_its_position_in_order(
    make_redis_transport: MakeTransport,
) -> None:
    transport = make_redis_transport()
    for n in range(1, 6):
        await publish(transport, ("a", f"a{n}".encode()), ("b", f"b{n}".encode()))
    bounds = await off_loop(transport.stream_bounds, ["a", "b"])
    assert bounds is not None
    ea, eb = bounds["a"].epoch, bounds["b"].epoch
    after = Vector({"a": (ea, 3), "b": (eb, 1)})
    entries = await off_loop(transport.read_streams, ["a", "b", "unnamed"], after, 100)
    by_stream = {
        stream: [(payload, pos) for channel, payload, pos in entries if channel == stream]
        for stream in ("a", "b")
    }
    assert by_stream["a"] == [(b"a4", StreamPos("a", ea, 4)), (b"a5", StreamPos("a", ea, 5))]
    assert [pos.seq for _, pos in by_stream["b"]] == [2, 3, 4, 5]
    assert len(entries) == 6
    # A limit cuts the whole, each stream keeping a prefix (no gap): page on from there.
    first = await off_loop(transport.read_streams, ["a", "b"], after, 3)
    assert len(first) == 3
    moved = Vector.of(pos for _, _, pos in first)
    rest = await off_loop(transport.read_streams, ["a", "b"], after.merged(moved), 100)
    assert sorted(pos for _, _, pos in first + rest) == sorted(pos for _, _, pos in entries)
    # Nothing after the top.
    assert await off_loop(transport.read_streams, ["a"], Vector({"a": (ea, 5)}), 10) == []


async def test_a_page_over_many_streams_reads_about_its_limit_not_its_limit_from_each(
    make_redis_transport: MakeTransport, monkeypatch: pytest.MonkeyPatch
) -> None:
    transport = make_redis_transport()
    streams = [f"s{n}" for n in range(20)]
    for n in range(1, 31):
        await publish(transport, *[(stream, f"{stream}-{n}".encode()) for stream in streams])
    bounds = await off_loop(transport.stream_bounds, streams)
    assert bounds is not None
    start = Vector({stream: (bounds[stream].epoch, 0) for stream in streams})
    fetched: list[int] = []
    reading = transport._read_streams

    def counting(asks: list[tuple[str, int, int]]) -> list[StreamRead]:
        reads = reading(asks)
        fetched.append(sum(len(read.entries) for read in reads))
        return reads

    monkeypatch.setattr(transport, "_read_streams", counting)
    pages, after = [], start
    while page := await off_loop(transport.read_streams, streams, after, 100):
        pages.append(page)
        after = after.merged(Vector.of(pos for _, _, pos in page))
    # Every entry once, each stream in order; every page full but the last.
    read = [pos for page in pages for _, _, pos in page]
    assert sorted((pos.stream, pos.seq) for pos in read) == sorted(
        (stream, n) for stream in streams for n in range(1, 31)
    )
    for stream in streams:
        assert [pos.seq for pos in read if pos.stream == stream] == list(range(1, 31))
    assert [len(page) for page in pages] == [100] * 6
    # 600 entries in 6 pages of 100: Redis was asked for about that, not 20 x 100 per page.
    assert sum(fetched) <= 2 * 600


async def test_a_read_of_large_entries_is_cut_by_weight_and_read_streams_still_returns_them_all(
    make_redis_transport: MakeTransport, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Entries near REALTIME_MAX_PAYLOAD would make a page of 1,000 one script call of
    # hundreds of MB, holding every client of the server for seconds: each call stops at a
    # byte budget (scaled down here), and the reader asks again rather than taking a call
    # cut by weight for the end of the stream.
    monkeypatch.setattr(limits, "READ_CHUNK_BYTES", 10_000)
    transport = make_redis_transport()
    large = [b"%04d" % n + b"x" * 2996 for n in range(60)]
    await publish(transport, *[("big", payload) for payload in large])
    bounds = await off_loop(transport.stream_bounds, ["big"])
    assert bounds is not None
    calls: list[list[int]] = []
    reading = transport._read_streams

    def weighing(asks: list[tuple[str, int, int]]) -> list[StreamRead]:
        reads = reading(asks)
        calls.extend([len(entry.payload) for entry in read.entries] for read in reads)
        return reads

    monkeypatch.setattr(transport, "_read_streams", weighing)
    start = Vector({"big": (bounds["big"].epoch, 0)})
    entries = await off_loop(transport.read_streams, ["big"], start, 1000)
    assert [payload for _, payload, _ in entries] == large
    assert [pos.seq for _, _, pos in entries] == list(range(1, 61))
    assert len(calls) >= 60 * 3000 // 12_000
    # Each call stops once its entries reach the budget: one entry past it at most.
    assert all(sum(sizes) - sizes[-1] < 10_000 for sizes in calls)


async def test_a_worker_behind_on_large_entries_catches_up_in_reads_cut_by_weight(
    make_redis_transport: MakeTransport, inbox: Inbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "READ_CHUNK_BYTES", 200_000)
    transport = make_redis_transport()
    transport.add_listener(inbox)
    await transport.follow("big")
    counts: list[int] = []
    reading = transport._read

    async def counting(channel: str, after: int, count: int) -> StreamRead:
        read = await reading(channel, after, count)
        counts.append(len(read.entries))
        return read

    monkeypatch.setattr(transport.sequencer, "read", counting)
    # Too large to travel live: every one of them is read from the stream.
    large = [b"%04d" % n + b"x" * LIVE_INLINE for n in range(12)]
    await publish(transport, *[("big", payload) for payload in large], ("big", MARKER))
    await inbox.wait_for("big", MARKER)
    assert inbox.payloads("big") == [*large, MARKER]
    assert max(counts) <= 4  # 200,000 bytes reached by the 4th entry of 65,540
    assert sum(counts) >= len(large)


async def test_an_unkeyed_publish_of_large_messages_goes_in_calls_cut_by_weight(
    make_redis_transport: MakeTransport, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    publisher = make_redis_transport()
    large = [b"%04d" % n + b"x" * 400_000 for n in range(8)]
    sizes: list[int] = []
    real_calls = call_each

    def weighing(client: Any, script: Any, calls: list[Any]) -> Any:
        sizes.extend(sum(len(arg) for arg in args if isinstance(arg, bytes)) for _, args in calls)
        return real_calls(client, script, calls)

    monkeypatch.setattr(redis_module, "call_each", weighing)
    await off_loop(publisher.publish, [("big", payload) for payload in large])
    assert len(sizes) == 4  # two messages of 400 kB a call: a third would pass 1 MiB
    assert all(size <= limits.PUBLISH_CHUNK_BYTES for size in sizes)
    took = [fields[b"p"] for _, fields in redis_server.entries(redis_keys.stream_key("big"))]
    assert took == large


async def test_read_streams_refuses_a_stream_of_another_epoch_or_trimmed_past_the_position(
    make_redis_transport: MakeTransport, redis_server: RedisServer
) -> None:
    transport = make_redis_transport()
    for n in range(1, 6):
        await publish(transport, ("t", str(n).encode()))
    bounds = await off_loop(transport.stream_bounds, ["t"])
    assert bounds is not None
    epoch = bounds["t"].epoch
    with pytest.raises(TransportError, match="another epoch"):
        await off_loop(transport.read_streams, ["t"], Vector({"t": ("old-epoch", 1)}), 10)
    third = redis_server.entries(redis_keys.stream_key("t"))[2][0]
    client = redis_server.client()
    client.xtrim(redis_keys.stream_key("t"), minid=third, approximate=False)  # 1, 2 gone
    client.close()
    with pytest.raises(TransportError, match="no longer holds offset 2"):
        await off_loop(transport.read_streams, ["t"], Vector({"t": (epoch, 1)}), 10)
    entries = await off_loop(transport.read_streams, ["t"], Vector({"t": (epoch, 2)}), 10)
    assert [pos.seq for _, _, pos in entries] == [3, 4, 5]
    assert (await off_loop(transport.stream_bounds, ["t"])) == {"t": StreamBounds(epoch, 3, 5)}


async def test_follows_of_one_channel_at_once_both_return_anchored_and_deliver_once(
    make_redis_transport: MakeTransport, inbox: Inbox
) -> None:
    transport = make_redis_transport()
    transport.add_listener(inbox)
    await publish(transport, ("twice", b"before"))
    await asyncio.gather(transport.follow("twice"), transport.follow("twice"))
    assert transport.sequencer.position("twice") is not None  # both returned anchored
    await publish(transport, ("twice", MARKER))
    await inbox.wait_for("twice", MARKER)
    assert inbox.messages == [("twice", MARKER)]


# The server, checked at first use ---------------------------------------------------------------


def test_a_server_that_may_evict_realtime_s_keys_is_one_warning_at_the_first_publish(
    make_redis_transport: MakeTransport, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    with contextlib.closing(redis_server.client()) as client:
        client.config_set("maxmemory", "512mb")
        client.config_set("maxmemory-policy", "volatile-lru")
        try:
            transport = make_redis_transport()
            with caplog.at_level(logging.WARNING, logger="realtime"):
                transport.publish([("evictable", b"one")])
                transport.publish([("evictable", b"two")])
        finally:
            client.config_set("maxmemory", "0")
            client.config_set("maxmemory-policy", "noeviction")
    warnings = [r.getMessage() for r in caplog.records if r.name.startswith("realtime")]
    assert len(warnings) == 1, warnings
    assert "maxmemory-policy is volatile-lru" in warnings[0]


def test_a_server_that_keeps_its_keys_is_not_warned_about(
    make_redis_transport: MakeTransport, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="realtime"):
        make_redis_transport().publish([("kept", b"one")])
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_redis_version_older_than_7_is_told_apart() -> None:
    assert version_of({"redis_version": "6.2.14"}) < OLDEST
    assert version_of({"redis_version": "7.0.15"}) >= OLDEST
    assert version_of({"redis_version": "garbage"}) == (0,)


def test_the_base_channel_is_kept_by_time_only_the_scopes_also_by_count(
    make_redis_transport: MakeTransport, redis_server: RedisServer, settings: Any
) -> None:
    settings.REALTIME_RESUME_MAX_FRAMES = 2  # streams keep about 100 entries
    transport = make_redis_transport()
    base, scope = base_channel(), scope_channel(1)
    for n in range(1000):
        transport.publish([(base, b"account %d" % n), (scope, b"scope %d" % n)])
    # Every account's events share the base channel: a count would cut the window short for
    # all of them (the resume's scan budget leaves them out too).
    assert len(redis_server.entries(redis_keys.stream_key(base))) == 1000
    assert len(redis_server.entries(redis_keys.stream_key(scope))) < 1000


async def test_a_transaction_of_100000_messages_never_blocks_redis_for_100_ms(
    make_redis_transport: MakeTransport, redis_server: RedisServer
) -> None:
    # A Lua call blocks every client of the server while it runs: a transaction's publish
    # goes in chunks, each call short, whether it comes in one call (no outbox) or as the
    # outbox relays it, keyed runs of its rows. Redis's own slow log times each command on
    # the server (the client's view would time this test's threads on a busy machine too).
    import redis

    admin = redis.Redis.from_url(redis_server.url)
    admin.config_set("slowlog-log-slower-than", 20_000)  # microseconds
    admin.config_set("slowlog-max-len", 1024)
    admin.slowlog_reset()

    def longest() -> int:
        slow = admin.slowlog_get(1024)
        return max((int(entry["duration"]) for entry in slow), default=0)

    try:
        publisher = make_redis_transport()
        channels = [f"big{n}" for n in range(10)]
        messages = [(channels[n % 10], b'{"n": %d}' % n) for n in range(100_000)]

        async def tops() -> set[int]:
            bounds = await off_loop(publisher.stream_bounds, channels)
            assert bounds is not None
            return {b.last for b in bounds.values()}

        await off_loop(publisher.publish, messages)
        assert longest() < 100_000, admin.slowlog_get(5)
        assert await tops() == {10_000}
        runs = [(run, limits.RELAY_ROWS) for run in range(len(messages) // limits.RELAY_ROWS)]
        relay = Built(messages, runs)  # a row a message, as the outbox relays them
        await off_loop(send_now, publisher, relay, "t-big")
        assert longest() < 100_000, admin.slowlog_get(5)
        assert await tops() == {20_000}
        # Relayed again whole (a sweeper's relay of the same rows): every run is dropped.
        await off_loop(send_now, publisher, relay, "t-big")
        assert await tops() == {20_000}
    finally:
        admin.config_set("slowlog-log-slower-than", 10_000)
        admin.config_set("slowlog-max-len", 128)
        admin.close()


async def test_a_keyed_publish_made_again_with_fewer_messages_lands_each_message_once(
    make_redis_transport: MakeTransport, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A relay cut between two script calls and made again by a sweeper builds its messages
    # afresh: a row written since is left out, so every message after it moves up the list.
    # Whatever landed the first time is dropped, and the rest lands, once.
    publisher = make_redis_transport()
    first = [(stream, b"%s %d" % (stream.encode(), n)) for n in range(400) for stream in "ab"]
    import redis

    calls = 0
    real_calls = call_each

    def cut_at_the_second(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise redis.ConnectionError("cut")
        return real_calls(*args, **kwargs)

    monkeypatch.setattr(redis_module, "call_each", cut_at_the_second)
    with pytest.raises(PublishError):
        await off_loop(publisher.publish, first, txn="t-cut")
    assert calls == 2  # 800 messages: more than one call, the second cut
    monkeypatch.undo()
    again = [message for message in first if message[1] not in (b"a 3", b"b 3")]
    await off_loop(publisher.publish, again, txn="t-cut")
    for stream in "ab":
        took = [fields[b"p"] for _, fields in redis_server.entries(redis_keys.stream_key(stream))]
        assert len(took) == len(set(took))  # none twice
        assert {payload for channel, payload in again if channel == stream} <= set(took)
