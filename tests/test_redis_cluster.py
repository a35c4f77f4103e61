"""The Redis transport on a real local Redis Cluster (three primaries, a replica each).

The shared contract, then what a Cluster adds: a worker subscribes on the nodes serving the
channels it follows and nowhere else; a publish spreads over the slots of its channels and
each stream keeps its order; a primary killed or frozen under traffic, a slot migrated under
traffic, and a subscription refused because the worker's map of slots was stale move the
worker's subscription to the node serving the slot now, and each stream is then delivered
whole and in order, or, if the stream changed epoch (the node serving it now did not write
it: it may lack what was acknowledged), its channel is reported missed — never a gap without
a report.

One Cluster serves the whole session (``redis_cluster`` in ``conftest``), flushed between
tests; nodes a test killed are started again after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from tests.helpers import WAIT, Inbox, eventually, off_loop, start_worker
from tests.live import free_port
from tests.redis_cluster import NODE_TIMEOUT_MS, Node, RedisCluster
from tests.redis_server import transports
from tests.transport_contract import MARKER, TransportContract

pytest.importorskip("redis", reason='redis-py is not installed ("[redis]" extra)')

from redis.crc import key_slot

from realtime.exceptions import PublishError, TransportError
from realtime.positions import Vector
from realtime.sockets.manager import LISTEN_WAIT
from realtime.transports import redis as redis_module
from realtime.transports.base import Transport
from realtime.transports.redis import LIVE_INLINE, RedisTransport
from realtime.transports.redis_client import async_client, node_url
from realtime.transports.redis_cluster_listener import ClusterListener
from realtime.transports.redis_keys import shard_channel

pytestmark = pytest.mark.redis_cluster

MakeTransport = Callable[..., RedisTransport]
#: Seconds a test waits for a failover or a migration to be over and delivered.
SETTLE = 30.0
#: Heartbeat timings of the failover and migration tests: their stall bound (the sum) is
#: longer than a failover, which must close nothing by itself.
SLOW_BEAT = {"heartbeat_interval": 5.0, "heartbeat_timeout": 5.0}


@pytest.fixture
async def make_cluster_transport(
    redis_cluster: RedisCluster,
) -> AsyncIterator[MakeTransport]:
    """Build Redis transports on the test Cluster with fast test timings; stop and close them
    afterwards."""
    async with transports(redis_cluster.url, heartbeat_interval=0.5, heartbeat_timeout=1.0) as make:
        yield make


class TestRedisClusterContract(TransportContract):
    @pytest.fixture
    def transport(
        self, make_cluster_transport: MakeTransport, redis_cluster: RedisCluster
    ) -> RedisTransport:
        self.url = redis_cluster.url  # for the publisher in another process
        return make_cluster_transport()

    @pytest.fixture
    def idle_transport(self, make_cluster_transport: MakeTransport) -> RedisTransport:
        return make_cluster_transport(heartbeat_interval=60.0)

    def publish_from_another_process(self, channel: str, payload: str) -> None:
        worker = start_worker("publish-redis", self.url, channel, payload)
        out, _ = worker.communicate(timeout=60)
        assert worker.returncode == 0
        assert out.strip() == "published"

    # On a Cluster, streams on different slots reach a worker over different connections:
    # the order holds within each stream, not across them (the contract's two tests that
    # compare the order across channels compare it per channel here).

    async def test_messages_of_one_publish_arrive_in_order(
        self, transport: Transport, inbox: Inbox
    ) -> None:
        transport.add_listener(inbox)
        await transport.follow("a")
        await transport.follow("b")
        messages = [("a" if n % 2 else "b", str(n).encode()) for n in range(20)]
        await self.publish(transport, *messages)
        await inbox.wait_for("b", b"18")
        await inbox.wait_for("a", b"19")
        for channel in ("a", "b"):
            assert inbox.payloads(channel) == [p for c, p in messages if c == channel]

    async def test_long_channel_names_round_trip(self, transport: Transport, inbox: Inbox) -> None:
        transport.add_listener(inbox)
        longest = "é" * 512  # 1,024 bytes in UTF-8: the most a channel may take
        near_twin = "é" * 511 + "e"
        await transport.follow(longest)
        await transport.follow(near_twin)
        await self.publish(transport, (longest, b"long"), (near_twin, b"twin"))
        await inbox.wait_for(near_twin, b"twin")
        await inbox.wait_for(longest, b"long")
        assert sorted(inbox.messages) == sorted([(longest, b"long"), (near_twin, b"twin")])


# Helpers ----------------------------------------------------------------------------------------


def owners(cluster: RedisCluster, channels: list[str]) -> dict[str, int]:
    """The port of the primary serving each channel's slot now."""
    import redis.cluster

    running = next(node for node in cluster.nodes if node.process is not None)
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=running.port)
    try:
        nodes = {c: client.get_node_from_key(shard_channel(c)) for c in channels}  # type: ignore[no-untyped-call]
        return {c: int(node.port) for c, node in nodes.items()}
    finally:
        client.close()


def channels_by_node(cluster: RedisCluster, count: int = 60) -> dict[int, list[str]]:
    """Scope-like channels grouped by the port of the primary serving them."""
    found: dict[int, list[str]] = {}
    names = [f"realtime_{n}" for n in range(count)]
    for channel, port in owners(cluster, names).items():
        found.setdefault(port, []).append(channel)
    assert len(found) == 3, found
    return found


def primary_on(cluster: RedisCluster, port: int) -> Node:
    """The primary listening on ``port``."""
    return next(node for node in cluster.primaries() if node.port == port)


def migration_parts(cluster: RedisCluster) -> tuple[str, str, Node]:
    """For a slot migration: a channel served by the first primary (by port), one by the
    second, and the third primary, where the first channel's slot is to go."""
    by_node = channels_by_node(cluster)
    ports = sorted(by_node)
    return by_node[ports[0]][0], by_node[ports[1]][0], primary_on(cluster, ports[2])


def shard_channels(cluster: RedisCluster) -> dict[int, set[str]]:
    """``PUBSUB SHARDCHANNELS`` of each primary."""
    return {
        node.port: set(cluster.cli(node, "PUBSUB", "SHARDCHANNELS").split())
        for node in cluster.primaries()
    }


def subscribed_on(cluster: RedisCluster, node: Node) -> set[str]:
    """``PUBSUB SHARDCHANNELS`` of ``node`` (a primary just promoted: ``primaries`` may not
    see it yet when a ``redis-cli`` call is slow)."""
    return set(cluster.cli(node, "PUBSUB", "SHARDCHANNELS").split())


def connections_named(cluster: RedisCluster, name: str) -> int:
    """The connections named ``name`` on the Cluster's running nodes (``CLIENT LIST``)."""
    running = [node for node in cluster.nodes if node.process is not None]
    return sum(cluster.cli(node, "CLIENT", "LIST").count(f" name={name} ") for node in running)


def cluster_listener(transport: RedisTransport) -> ClusterListener:
    assert isinstance(transport.listener, ClusterListener)
    return transport.listener


class Traffic:
    """Publishes ``channel:<n>`` to each channel, n = 1, 2, ... in a thread, each publish
    retried until Redis takes it (as the outbox's relay would), with a transaction key so
    that a retry of a publish that was applied is dropped."""

    def __init__(self, transport: RedisTransport, channels: list[str]) -> None:
        self.transport = transport
        self.channels = channels
        self.sent = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + 2 * SETTLE
        while not self._stop.is_set() and time.monotonic() < deadline:
            n = self.sent + 1
            messages = [(c, f"{c}:{n}".encode()) for c in self.channels]
            try:
                self.transport.publish(messages, txn=f"t{n}")
            except PublishError:
                self.failures += 1
                time.sleep(0.05)
                continue
            self.sent = n
            time.sleep(0.01)

    async def stop(self) -> int:
        self._stop.set()
        await off_loop(self._thread.join, WAIT)
        return self.sent


async def follow(transport: RedisTransport, channel: str) -> str:
    """Follow ``channel``; the epoch its stream is in."""
    position = await transport.follow(channel)
    assert position is not None
    return position.epoch


def numbers(inbox: Inbox, channel: str) -> list[int]:
    return [int(p.rsplit(b":", 1)[1]) for p in inbox.payloads(channel)]


async def settle_and_check(
    transport: RedisTransport,
    inbox: Inbox,
    missed: list[frozenset[str]],
    channel: str,
    epoch: str,
    sent: int,
) -> bool:
    """Wait until ``channel``'s last message is delivered, then check the delivery against
    the stream's epoch: the same epoch, every message once in order and no report; another
    epoch, a report of the channel and what was delivered in order, once each. Returns
    whether the epoch changed."""
    await inbox.wait_for(channel, f"{channel}:{sent}".encode(), timeout=SETTLE)
    bounds = await off_loop(transport.stream_bounds, [channel])
    assert bounds is not None
    got = numbers(inbox, channel)
    assert got == sorted(set(got)), "out of order, or a duplicate"
    if bounds[channel].epoch == epoch:
        assert got == list(range(1, sent + 1))
        assert not any(channel in report for report in missed)
        return False
    assert any(channel in report for report in missed), "a new epoch without a report"
    return True


# Subscriptions ----------------------------------------------------------------------------------


async def test_a_worker_subscribes_only_on_the_nodes_serving_its_channels(
    make_cluster_transport: MakeTransport, redis_cluster: RedisCluster, inbox: Inbox
) -> None:
    by_node = channels_by_node(redis_cluster)
    served, other, idle = sorted(by_node)
    first, second = by_node[served][:2]
    third = by_node[other][0]
    transport = make_cluster_transport()
    transport.add_listener(inbox)
    for channel in (first, second, third):
        await transport.follow(channel)
    subscribed = shard_channels(redis_cluster)
    assert subscribed[served] == {shard_channel(first), shard_channel(second)}
    assert subscribed[other] == {shard_channel(third)}
    assert subscribed[idle] == set()
    assert sorted(cluster_listener(transport).nodes) == sorted(
        f"127.0.0.1:{port}" for port in (served, other)
    )
    # A node left with nothing to serve is let go: its connection closes.
    await transport.unfollow(third)
    await eventually(lambda: len(cluster_listener(transport).nodes) == 1)
    await eventually(lambda: shard_channels(redis_cluster)[other] == set())
    await off_loop(transport.publish, [(third, b"after unfollow"), (first, MARKER)])
    await inbox.wait_for(first, MARKER)
    assert inbox.payloads(third) == []


async def test_publishes_over_every_node_arrive_in_order_per_stream(
    make_cluster_transport: MakeTransport, redis_cluster: RedisCluster, inbox: Inbox
) -> None:
    by_node = channels_by_node(redis_cluster)
    channels = [name for names in by_node.values() for name in names[:2]]
    transport = make_cluster_transport()
    transport.add_listener(inbox)
    for channel in channels:
        await transport.follow(channel)
    publisher = make_cluster_transport()

    def publish_many(offset: int) -> None:
        for n in range(1, 31):
            # Each publish touches every node; its messages per channel in order.
            publisher.publish(
                [(c, f"{c}:{offset + n}".encode()) for c in channels[1 if offset else 0 :]]
            )

    # Two publishers at once: each stream still orders every message once.
    await asyncio.gather(off_loop(publish_many, 0), off_loop(publish_many, 1000))
    for channel in channels:
        await inbox.wait_for(channel, f"{channel}:30".encode())
    for channel in channels[1:]:
        await inbox.wait_for(channel, f"{channel}:1030".encode())
    for channel in channels:
        heard = [p for p in inbox.heard_at() if p.stream == channel]
        assert [p.seq for p in heard] == list(range(1, len(heard) + 1))
        got = numbers(inbox, channel)
        assert [n for n in got if n < 1000] == list(range(1, 31))
        if channel != channels[0]:
            assert [n for n in got if n > 1000] == list(range(1001, 1031))
    bounds = await off_loop(publisher.stream_bounds, channels)
    assert bounds is not None
    assert {c: b.last for c, b in bounds.items()} == {
        c: 30 if c == channels[0] else 60 for c in channels
    }


async def test_a_publish_relayed_again_after_reaching_only_some_slots_completes_once(
    make_cluster_transport: MakeTransport, redis_cluster: RedisCluster, inbox: Inbox
) -> None:
    by_node = channels_by_node(redis_cluster)
    ports = sorted(by_node)
    reached, missing = by_node[ports[0]][0], by_node[ports[1]][0]
    transport = make_cluster_transport()
    transport.add_listener(inbox)
    await transport.follow(reached)
    await transport.follow(missing)
    # A relay across two nodes that reached only one of them (the other failed midway) ...
    await off_loop(transport.publish, [(reached, b"r1")], txn="t1")
    # ... relayed again whole, with the same transaction key: each stream has it once.
    await off_loop(transport.publish, [(reached, b"r1"), (missing, b"m1")], txn="t1")
    await off_loop(transport.publish, [(reached, MARKER), (missing, MARKER)])
    await inbox.wait_for(reached, MARKER)
    await inbox.wait_for(missing, MARKER)
    assert inbox.payloads(reached) == [b"r1", MARKER]
    assert inbox.payloads(missing) == [b"m1", MARKER]


async def test_stream_reads_span_the_nodes(
    make_cluster_transport: MakeTransport, redis_cluster: RedisCluster
) -> None:
    by_node = channels_by_node(redis_cluster)
    channels = [names[0] for names in by_node.values()]
    transport = make_cluster_transport()
    await off_loop(transport.publish, [(c, f"{c}:{n}".encode()) for n in (1, 2) for c in channels])
    bounds = await off_loop(transport.stream_bounds, channels)
    assert bounds is not None
    assert all(b.first == 1 and b.last == 2 for b in bounds.values())
    after = Vector({c: (bounds[c].epoch, 1) for c in channels})
    entries = await off_loop(transport.read_streams, channels, after, 10)
    assert sorted((channel, payload) for channel, payload, _ in entries) == sorted(
        (c, f"{c}:2".encode()) for c in channels
    )


async def test_quiet_streams_on_every_node_keep_their_epoch_while_a_worker_follows_them(
    make_cluster_transport: MakeTransport,
    redis_cluster: RedisCluster,
    inbox: Inbox,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Metas live 0.4 s here: the worker renews them, each on the node serving its slot.
    monkeypatch.setattr(redis_module, "META_TTL_MIN", 0.4)
    channels = [names[0] for names in channels_by_node(redis_cluster).values()]
    transport = make_cluster_transport(resume_window=0.1, supervise_interval=0.05)
    transport.add_listener(inbox)
    for channel in channels:
        await transport.follow(channel)
    await off_loop(transport.publish, [(channel, b"first") for channel in channels])
    for channel in channels:
        await inbox.wait_for(channel, b"first")
    # Rounds spanning more than twice the metas' lifetime: without them they would be gone.
    start = transport.meta_refreshes
    await eventually(lambda: transport.meta_refreshes >= start + 8)
    await off_loop(transport.publish, [(channel, b"second") for channel in channels])
    for channel in channels:
        await inbox.wait_for(channel, b"second")
    places = [place for place in inbox.heard_at() if place.stream in channels]
    for channel in channels:
        first, second = [place for place in places if place.stream == channel]
        assert (second.epoch, second.seq) == (first.epoch, 2)


async def test_a_node_connection_that_cannot_come_back_while_the_node_answers_is_one_error(
    make_cluster_transport: MakeTransport,
    redis_cluster: RedisCluster,
    inbox: Inbox,
    caplog: pytest.LogCaptureFixture,
) -> None:
    by_node = channels_by_node(redis_cluster)
    ports = sorted(by_node)
    cut, other = by_node[ports[0]][0], by_node[ports[1]][0]
    transport = make_cluster_transport(heartbeat_interval=5.0, heartbeat_timeout=5.0)
    transport.add_listener(inbox)
    await transport.follow(cut)
    await transport.follow(other)
    listener = cluster_listener(transport)
    # From now on this worker's Pub/Sub connections to the node of ``cut`` go nowhere (a
    # firewall in between), while the node answers everyone else.
    nowhere, build = free_port(), listener.client
    cut_port = ports[0]
    listener.client = lambda host, port: build(host, nowhere if port == cut_port else port)
    node = primary_on(redis_cluster, cut_port)
    with caplog.at_level(logging.WARNING, logger="realtime"):
        redis_cluster.cli(node, "CLIENT", "KILL", "TYPE", "pubsub")
        await eventually(lambda: bool(realtime_errors(caplog)))
        # The other node's connection is not concerned.
        await off_loop(transport.publish, [(other, MARKER)])
        await inbox.wait_for(other, MARKER)
    name = f"node 127.0.0.1:{cut_port}"
    (error,) = realtime_errors(caplog)
    assert f"Pub/Sub connection to {name} cannot come back although Redis answers" in (
        error.getMessage()
    )
    lost = [r for r in caplog.records if "is lost" in r.getMessage()]
    assert len(lost) == 1
    assert name in lost[0].getMessage()


async def test_the_client_of_the_map_of_slots_is_closed_whole_though_its_close_was_cancelled(
    make_cluster_transport: MakeTransport, redis_cluster: RedisCluster
) -> None:
    # The listener closes the client that read the map once it answered, and a transport
    # that stops waits for that close, and may be cancelled meanwhile. redis-py's close,
    # cancelled midway, left the node connected, for the garbage collector to close (a
    # ResourceWarning).
    (channel, *_), *_ = channels_by_node(redis_cluster).values()
    transport = make_cluster_transport()
    await transport.start()
    listener = cluster_listener(transport)
    name = f"map-{uuid.uuid4().hex[:8]}"  # this test's connections, by name
    built: list[Any] = []  # kept: a connection left open stays open, the GC closes none

    def topology(host: str, port: int) -> Any:
        url = node_url(transport.cluster_nodes[0], host, port)
        client = async_client(url, 1.0, transport.keepalive, name, retry=False)
        built.append(client)
        return client

    listener.topology = topology
    await transport.follow(channel)
    assert built
    closing = asyncio.create_task(listener.close())
    await asyncio.sleep(0)  # redis-py's close is under way
    closing.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await closing
    await transport.stop()
    await eventually(lambda: connections_named(redis_cluster, name) == 0)


async def test_pubsub_clients_of_a_node_killed_come_back_on_every_slot_and_lose_nothing(
    make_cluster_transport: MakeTransport,
    redis_cluster: RedisCluster,
    inbox: Inbox,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A deployment follows many scopes per node, in many slots. One cut between the worker
    # and that node (no failover: the node stays primary) must bring every one back.
    by_node = channels_by_node(redis_cluster)
    port = sorted(by_node)[0]
    channels = by_node[port][:4]
    assert len({key_slot(shard_channel(c).encode()) for c in channels}) == len(channels)
    transport = make_cluster_transport()
    missed: list[frozenset[str]] = []
    transport.add_listener(inbox, missed=missed.append)
    epochs = {c: await follow(transport, c) for c in channels}
    traffic = Traffic(make_cluster_transport(), channels)
    traffic.start()
    await eventually(lambda: all(len(inbox.payloads(c)) >= 5 for c in channels))
    node = primary_on(redis_cluster, port)
    with caplog.at_level(logging.WARNING, logger="realtime"):
        redis_cluster.cli(node, "CLIENT", "KILL", "TYPE", "pubsub")
        await eventually(
            lambda: shard_channels(redis_cluster)[port] >= {shard_channel(c) for c in channels},
            timeout=SETTLE,
        )
        sent_then = traffic.sent
        for channel in channels:
            await inbox.wait_for(channel, f"{channel}:{sent_then + 3}".encode(), timeout=SETTLE)
        sent = await traffic.stop()
        for channel in channels:
            # The same epoch (no failover): every message once, in order, no report.
            assert not await settle_and_check(
                transport, inbox, missed, channel, epochs[channel], sent
            )
    assert not realtime_errors(caplog)
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("realtime")]
    assert len([line for line in lines if "is lost" in line]) == 1
    assert len([line for line in lines if "is back" in line]) == 1


def realtime_errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r for r in caplog.records if r.name.startswith("realtime") and r.levelno >= logging.ERROR
    ]


# Failover and migration ---------------------------------------------------------------------


async def test_a_primary_killed_under_traffic_moves_the_worker_and_loses_nothing_silently(
    make_cluster_transport: MakeTransport,
    redis_cluster: RedisCluster,
    inbox: Inbox,
    caplog: pytest.LogCaptureFixture,
) -> None:
    by_node = channels_by_node(redis_cluster)
    ports = sorted(by_node)
    # Several scopes on the node that dies, in several slots, as in a real deployment.
    doomed, survivor = by_node[ports[0]][:3], by_node[ports[1]][0]
    transport = make_cluster_transport(**SLOW_BEAT)
    missed: list[frozenset[str]] = []
    transport.add_listener(inbox, missed=missed.append)
    epochs = {c: await follow(transport, c) for c in (*doomed, survivor)}
    traffic = Traffic(make_cluster_transport(), [*doomed, survivor])
    traffic.start()
    await eventually(lambda: all(len(inbox.payloads(c)) >= 20 for c in doomed))
    victim = redis_cluster.primary_of(shard_channel(doomed[0]))
    with caplog.at_level(logging.WARNING, logger="realtime"):
        await off_loop(redis_cluster.kill, victim)
        await off_loop(redis_cluster.wait_ok)
        new_home = redis_cluster.primary_of(shard_channel(doomed[0]))
        assert new_home is not victim
        # The worker follows the slots to the promoted replica, and hears what comes next.
        await eventually(
            lambda: (
                shard_channels(redis_cluster)[new_home.port] >= {shard_channel(c) for c in doomed}
            ),
            timeout=SETTLE,
        )
        sent_then = traffic.sent
        for channel in doomed:
            await inbox.wait_for(channel, f"{channel}:{sent_then + 3}".encode(), timeout=SETTLE)
        sent = await traffic.stop()
        # A failover may have lost acknowledged writes: each stream gets a new epoch, and
        # its channel is reported missed.
        for channel in doomed:
            assert await settle_and_check(transport, inbox, missed, channel, epochs[channel], sent)
        assert not await settle_and_check(
            transport, inbox, missed, survivor, epochs[survivor], sent
        )
    # The node's loss is one WARNING, and so is the move; the worker never connected to the
    # dead node again once its channels had moved.
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    victim_name = f"node 127.0.0.1:{victim.port}"
    assert len([line for line in lines if victim_name in line and "is lost" in line]) == 1
    assert len([line for line in lines if "moved from Redis Cluster node" in line]) == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert f"127.0.0.1:{victim.port}" not in cluster_listener(transport).nodes


async def test_a_primary_frozen_under_traffic_is_given_up_and_the_worker_moves(
    make_cluster_transport: MakeTransport, redis_cluster: RedisCluster, inbox: Inbox
) -> None:
    # A frozen primary (SIGSTOP) keeps its connections open and answers nothing: only the
    # heartbeat can tell. Its replica takes over meanwhile.
    by_node = channels_by_node(redis_cluster)
    ports = sorted(by_node)
    frozen, survivor = by_node[ports[0]][0], by_node[ports[1]][0]
    transport = make_cluster_transport(heartbeat_interval=0.5, heartbeat_timeout=1.0)
    missed: list[frozenset[str]] = []
    transport.add_listener(inbox, missed=missed.append)
    epochs = {c: await follow(transport, c) for c in (frozen, survivor)}
    traffic = Traffic(make_cluster_transport(), [frozen, survivor])
    traffic.start()
    await eventually(lambda: len(inbox.payloads(frozen)) >= 20)
    victim = redis_cluster.primary_of(shard_channel(frozen))
    process, victim.process = victim.process, None  # the helpers' questions skip it
    assert process is not None
    process.send_signal(signal.SIGSTOP)
    try:
        await off_loop(redis_cluster.wait_ok)
        new_home = redis_cluster.primary_of(shard_channel(frozen))
        await eventually(
            lambda: shard_channel(frozen) in shard_channels(redis_cluster)[new_home.port],
            timeout=SETTLE,
        )
        sent_then = traffic.sent
        await inbox.wait_for(frozen, f"{frozen}:{sent_then + 3}".encode(), timeout=SETTLE)
        sent = await traffic.stop()
        await settle_and_check(transport, inbox, missed, frozen, epochs[frozen], sent)
        assert not await settle_and_check(
            transport, inbox, missed, survivor, epochs[survivor], sent
        )
    finally:
        await traffic.stop()
        # Thawed, it finds a new primary serving its slots and becomes its replica.
        process.send_signal(signal.SIGCONT)
        victim.process = process
        await off_loop(redis_cluster.wait_ok)


async def test_a_primary_that_lost_its_role_and_got_it_back_gives_its_streams_a_new_epoch(
    make_cluster_transport: MakeTransport, redis_cluster: RedisCluster
) -> None:
    # The primary becomes a replica without restarting (a partition healed, a manual
    # failover) and takes over again later: meanwhile its data was replaced by its
    # successor's, which may have lacked its last writes. Same process, same run_id: the
    # stream must still get a new epoch, even one nobody touched in between.
    (channel, *_), *_ = channels_by_node(redis_cluster).values()
    transport = make_cluster_transport()
    await off_loop(transport.publish, [(channel, b"1")])
    before = await off_loop(transport.stream_bounds, [channel])
    assert before is not None
    primary = redis_cluster.primary_of(shard_channel(channel))
    replica = replica_of(redis_cluster, primary)
    await off_loop(manual_failover, redis_cluster, replica)
    await off_loop(manual_failover, redis_cluster, primary)
    after = await off_loop(bounds_once_answered, transport, channel)
    assert after[channel].epoch != before[channel].epoch


def bounds_once_answered(transport: RedisTransport, channel: str) -> Any:
    """The stream's bounds, read again while a node just back in its role does not answer in
    time yet (on a loaded machine its first reads may time out; that is not what is tested)."""
    deadline = time.monotonic() + SETTLE
    while True:
        try:
            found = transport.stream_bounds([channel])
        except TransportError:
            assert time.monotonic() < deadline, "the stream's node never answered"
            time.sleep(0.2)
            continue
        assert found is not None
        return found


def replica_of(cluster: RedisCluster, primary: Node) -> Node:
    return next(
        node
        for node in cluster.nodes
        if node.process is not None
        and f"master_port:{primary.port}" in cluster.cli(node, "INFO", "replication").split()
    )


def manual_failover(cluster: RedisCluster, replica: Node) -> None:
    """``CLUSTER FAILOVER`` on ``replica`` once it is a replica in sync (a primary that just
    handed over learns its new role a moment later), again if Redis gave it up (its manual
    failovers time out after 5 s); wait until it serves its primary's slots."""
    deadline = time.monotonic() + SETTLE
    while True:
        assert time.monotonic() < deadline, "the manual failover did not happen"
        info = cluster.cli(replica, "INFO", "replication").split()
        if "role:master" in info:
            break
        if "master_link_status:up" in info and known_as_replica(cluster, replica, info):
            cluster.cli(replica, "CLUSTER", "FAILOVER")
            asked = time.monotonic()
            while time.monotonic() - asked < 6 and "role:master" not in cluster.cli(
                replica, "INFO", "replication"
            ):
                time.sleep(0.05)
        else:
            time.sleep(0.05)
    cluster.wait_ok()


def known_as_replica(cluster: RedisCluster, replica: Node, info: list[str]) -> bool:
    """Whether ``replica``'s primary knows it as its replica yet (a manual failover asked
    before it does times out)."""
    port = next(field for field in info if field.startswith("master_port:")).split(":")[1]
    primary = next(node for node in cluster.nodes if str(node.port) == port)
    primary_id = cluster.cli(primary, "CLUSTER", "MYID").strip()
    return replica.address in cluster.cli(primary, "CLUSTER", "REPLICAS", primary_id)


def migrate(cluster: RedisCluster, key: str, target: Node) -> None:
    """Move ``key``'s slot to ``target`` as ``redis-cli --cluster reshard`` does: importing,
    migrating, the keys moved, then the slot given to ``target`` on every primary."""
    finish_migration(cluster, start_migration(cluster, key, target), target)


async def test_a_slot_migrated_under_traffic_moves_the_worker_and_loses_nothing_silently(
    make_cluster_transport: MakeTransport, redis_cluster: RedisCluster, inbox: Inbox
) -> None:
    moving, staying, target = migration_parts(redis_cluster)
    transport = make_cluster_transport(**SLOW_BEAT)
    missed: list[frozenset[str]] = []
    transport.add_listener(inbox, missed=missed.append)
    epochs = {c: await follow(transport, c) for c in (moving, staying)}
    traffic = Traffic(make_cluster_transport(), [moving, staying])
    traffic.start()
    await eventually(lambda: len(inbox.payloads(moving)) >= 20)
    await off_loop(migrate, redis_cluster, shard_channel(moving), target)
    await eventually(
        lambda: shard_channel(moving) in shard_channels(redis_cluster)[target.port],
        timeout=SETTLE,
    )
    sent_then = traffic.sent
    await inbox.wait_for(moving, f"{moving}:{sent_then + 3}".encode(), timeout=SETTLE)
    sent = await traffic.stop()
    await settle_and_check(transport, inbox, missed, moving, epochs[moving], sent)
    assert not await settle_and_check(transport, inbox, missed, staying, epochs[staying], sent)
    assert cluster_listener(transport).moves >= 1


def start_migration(cluster: RedisCluster, key: str, target: Node) -> str:
    """Begin moving ``key``'s slot to ``target`` and move its keys, but leave the slot open
    (an interrupted ``redis-cli --cluster reshard``); its number."""
    source = cluster.primary_of(key)
    slot = cluster.cli(source, "CLUSTER", "KEYSLOT", key).strip()
    target_id = cluster.cli(target, "CLUSTER", "MYID").strip()
    source_id = cluster.cli(source, "CLUSTER", "MYID").strip()
    assert cluster.cli(target, "CLUSTER", "SETSLOT", slot, "IMPORTING", source_id).strip() == "OK"
    assert cluster.cli(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", target_id).strip() == "OK"
    while keys := cluster.cli(source, "CLUSTER", "GETKEYSINSLOT", slot, "100").split():
        answer = cluster.cli(
            source, "MIGRATE", "127.0.0.1", str(target.port), "", "0", "5000", "KEYS", *keys
        )
        assert answer.strip() in ("OK", "NOKEY"), answer
    return slot


def finish_migration(cluster: RedisCluster, slot: str, target: Node) -> None:
    """Give ``slot`` to ``target`` on every primary (``redis-cli --cluster fix``)."""
    target_id = cluster.cli(target, "CLUSTER", "MYID").strip()
    for node in [target, *cluster.primaries()]:
        cluster.cli(node, "CLUSTER", "SETSLOT", slot, "NODE", target_id)


async def test_a_publish_to_a_slot_being_migrated_is_refused_and_relayed_once_it_moved(
    make_cluster_transport: MakeTransport, redis_cluster: RedisCluster, inbox: Inbox
) -> None:
    # While a slot is being migrated, once a channel's keys moved, a publish run on the node
    # taking the slot (ASK) sent its live messages to that node's subscribers alone: the
    # workers are subscribed on the node giving it away, which serves the shard channel
    # until the migration is done. Nothing reached them, nothing was reported, for as long
    # as the migration stayed open. The publish is refused instead, and its relay made
    # again (as the outbox does) once the slot has moved reaches the worker, its stream in a
    # new epoch: the channel is reported missed (its sockets closed 1012).
    moving, other, target = migration_parts(redis_cluster)
    publisher = make_cluster_transport()
    worker = make_cluster_transport()
    missed: list[frozenset[str]] = []
    worker.add_listener(inbox, missed=missed.append)
    await worker.follow(moving)
    await worker.follow(other)
    await off_loop(publisher.publish, [(moving, b"before")], txn="k1")
    await inbox.wait_for(moving, b"before")
    slot = await off_loop(start_migration, redis_cluster, shard_channel(moving), target)
    try:
        with pytest.raises(PublishError):
            await off_loop(publisher.publish, [(moving, MARKER), (other, MARKER)], txn="k2")
        await inbox.wait_for(other, MARKER)  # the other slots took their part
    finally:
        await off_loop(finish_migration, redis_cluster, slot, target)
    await off_loop(publisher.publish, [(moving, MARKER), (other, MARKER)], txn="k2")
    await eventually(lambda: any(moving in report for report in missed), timeout=SETTLE)
    await off_loop(publisher.publish, [(other, b"after")])
    await inbox.wait_for(other, b"after")
    assert inbox.payloads(other) == [MARKER, b"after"]
    assert inbox.payloads(moving) in ([b"before"], [b"before", MARKER])


async def test_a_follow_on_a_stale_map_of_slots_is_refused_and_goes_where_the_slot_is(
    make_cluster_transport: MakeTransport,
    redis_cluster: RedisCluster,
    inbox: Inbox,
    caplog: pytest.LogCaptureFixture,
) -> None:
    first, later, target = migration_parts(redis_cluster)
    transport = make_cluster_transport()
    transport.add_listener(inbox)
    await transport.follow(first)  # the worker reads the map of slots
    reads = cluster_listener(transport).map_reads
    # The slot of ``later`` moves before the worker follows it: its map is stale, Redis
    # refuses the subscription with MOVED, and the worker reads the map again.
    await off_loop(migrate, redis_cluster, shard_channel(later), target)
    with caplog.at_level(logging.WARNING, logger="realtime"):
        await transport.follow(later)
    assert cluster_listener(transport).map_reads > reads
    # A refusal is no outage: the connection that was refused goes on serving ``first``.
    assert not [r for r in caplog.records if "is lost" in r.getMessage()]
    assert shard_channel(later) in shard_channels(redis_cluster)[target.port]
    await off_loop(transport.publish, [(later, MARKER)])
    await inbox.wait_for(later, MARKER)


async def test_a_worker_whose_url_names_only_a_node_gone_for_good_follows_the_failover(
    redis_cluster: RedisCluster, inbox: Inbox, make_cluster_transport: MakeTransport
) -> None:
    # The URL names some of the Cluster's nodes; here one, which dies for good. The map of
    # slots is read again from the nodes the last map named, not from the URL's alone.
    by_node = channels_by_node(redis_cluster)
    ports = sorted(by_node)
    named = primary_on(redis_cluster, ports[0])
    on_named, elsewhere, later = by_node[ports[0]][0], by_node[ports[1]][0], by_node[ports[2]][0]
    publisher = make_cluster_transport()
    url = f"redis+cluster://{named.address}"
    async with transports(url, heartbeat_interval=0.5, heartbeat_timeout=1.0) as make:
        worker = make(backoff_start=0.1, backoff_max=1.0)
        worker.add_listener(inbox)
        await worker.follow(on_named)
        await worker.follow(elsewhere)
        await off_loop(redis_cluster.kill, named)
        await off_loop(redis_cluster.wait_ok)
        new_home = redis_cluster.primary_of(shard_channel(on_named))
        listener = cluster_listener(worker)
        await eventually(
            lambda: listener.home.get(shard_channel(on_named)) == new_home.address,
            timeout=SETTLE,
        )
        await asyncio.wait_for(worker.follow(later), LISTEN_WAIT)
        await off_loop(publisher.publish, [(c, MARKER) for c in (on_named, elsewhere, later)])
        for channel in (on_named, elsewhere, later):
            await inbox.wait_for(channel, MARKER)


def ports_from_slot_zero_last(cluster: RedisCluster, by_node: dict[int, list[str]]) -> list[int]:
    """The primaries' ports, slot 0's last: the tests that kill the first ones leave slot
    0's shard alone for the slow failovers below, which kill its primary. Redis gives no
    vote about a primary whose replica it voted for within twice the node timeout (16 s
    there): a shard failed over just before would not fail over in time."""
    last = slot_zero_primary(cluster).port
    return sorted(by_node, key=lambda port: (port == last, port))


async def test_a_node_answering_an_empty_map_of_slots_is_passed_over_and_the_failover_followed(
    redis_cluster: RedisCluster, inbox: Inbox, make_cluster_transport: MakeTransport
) -> None:
    # The node that answered the map last is asked first next time. Restarted without its
    # nodes.conf (a pod back on an empty volume), it answers CLUSTER SLOTS with no slot
    # served: taken as a map, it held the worker to it for good (no failover followed, no
    # stream read, no follow), though every other node answered the right map.
    by_node = channels_by_node(redis_cluster)
    ports = ports_from_slot_zero_last(redis_cluster, by_node)
    victim = primary_on(redis_cluster, ports[0])
    healthy = primary_on(redis_cluster, ports[1])
    source, promoted = replica_of(redis_cluster, healthy), replica_of(redis_cluster, victim)
    doomed, kept, later = by_node[ports[0]][0], by_node[ports[1]][0], by_node[ports[2]][0]
    publisher = make_cluster_transport()
    url = f"redis+cluster://{source.address},{healthy.address}"  # the replica asked first
    async with transports(url, heartbeat_interval=0.5, heartbeat_timeout=1.0) as make:
        worker = make(backoff_start=0.1, backoff_max=1.0)
        worker.add_listener(inbox)
        await worker.follow(doomed)
        await worker.follow(kept)
        listener = cluster_listener(worker)
        assert listener._source == source.address
        try:
            await off_loop(redis_cluster.launch_blank, source)
            assert redis_cluster.cli(source, "CLUSTER", "SLOTS").strip() == ""
            await off_loop(redis_cluster.kill, victim)
            await eventually(lambda: not not_promoted(redis_cluster, promoted), timeout=SETTLE)
            await eventually(
                lambda: shard_channel(doomed) in subscribed_on(redis_cluster, promoted),
                timeout=SETTLE,
            )
            assert listener._source != source.address
            await asyncio.wait_for(worker.follow(later), LISTEN_WAIT)
            await off_loop(publisher.publish, [(doomed, MARKER), (kept, LARGE), (later, MARKER)])
            await inbox.wait_for(doomed, MARKER)
            await inbox.wait_for(kept, LARGE)  # read from its stream
            await inbox.wait_for(later, MARKER)
        finally:
            await off_loop(redis_cluster.restore, source)
            await off_loop(redis_cluster.wait_ok)


def sockets_to(port: int) -> set[str]:
    """The inodes of this process's TCP sockets to 127.0.0.1:``port``, open or half-closed
    (Linux's ``/proc``)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    with open("/proc/net/tcp") as table:
        rows = [line.split() for line in list(table)[1:]]
    return {row[9] for row in rows if row[9] in inodes and int(row[2].split(":")[1], 16) == port}


async def test_the_stream_reads_let_go_of_a_dead_primarys_connections(
    redis_cluster: RedisCluster, inbox: Inbox, make_cluster_transport: MakeTransport
) -> None:
    # The reads keep a client per node, with its pooled connections: those of a primary that
    # died stayed open (CLOSE_WAIT) for good once its channels had moved, at each failover.
    by_node = channels_by_node(redis_cluster)
    port = ports_from_slot_zero_last(redis_cluster, by_node)[0]
    victim = primary_on(redis_cluster, port)
    doomed = by_node[port][:8]
    before = sockets_to(port)  # other tests' (this process's), not this worker's
    publisher = make_cluster_transport()
    worker = make_cluster_transport(backoff_start=0.1, backoff_max=1.0)
    worker.add_listener(inbox)
    await asyncio.gather(*(worker.follow(c) for c in doomed))  # anchors read side by side
    assert len(sockets_to(port) - before) > 2  # reads' connections besides the Pub/Sub one
    replica = replica_of(redis_cluster, victim)
    await off_loop(redis_cluster.kill, victim)
    await off_loop(redis_cluster.wait_ok)
    await eventually(
        lambda: subscribed_on(redis_cluster, replica) >= {shard_channel(c) for c in doomed},
        timeout=SETTLE,
    )
    await off_loop(publisher.publish, [(c, MARKER) for c in doomed])
    for channel in doomed:
        await inbox.wait_for(channel, MARKER)
    await eventually(lambda: not sockets_to(port) - before)


async def test_the_stream_reads_let_go_of_a_primary_that_became_a_replica(
    redis_cluster: RedisCluster, inbox: Inbox, make_cluster_transport: MakeTransport
) -> None:
    # No read fails on a primary that hands over to its replica (a manual failover): once
    # the map read again names it no more, its read connections are closed.
    by_node = channels_by_node(redis_cluster)
    port = ports_from_slot_zero_last(redis_cluster, by_node)[0]
    primary = primary_on(redis_cluster, port)
    channels = by_node[port][:4]
    worker = make_cluster_transport()
    worker.add_listener(inbox)
    await asyncio.gather(*(worker.follow(c) for c in channels))

    def readers() -> int:
        return redis_cluster.cli(primary, "CLIENT", "LIST").count(" name=realtime-reader ")

    assert readers() > 0
    replica = replica_of(redis_cluster, primary)
    await off_loop(manual_failover, redis_cluster, replica)
    await eventually(
        lambda: subscribed_on(redis_cluster, replica) >= {shard_channel(c) for c in channels},
        timeout=SETTLE,
    )
    await eventually(lambda: readers() == 0)
    await off_loop(make_cluster_transport().publish, [(c, MARKER) for c in channels])
    for channel in channels:
        await inbox.wait_for(channel, MARKER)


def slot_zero_primary(cluster: RedisCluster) -> Node:
    """The primary serving slot 0: the node a redis-py Cluster client asks first."""
    return next(node for node in cluster.primaries() if "0" in slot_starts(cluster, node))


def slot_starts(cluster: RedisCluster, node: Node) -> list[str]:
    """The first slot of each range ``node`` serves, in its own view."""
    for line in cluster.cli(node, "CLUSTER", "NODES").splitlines():
        parts = line.split()
        if "myself" in parts[2]:
            return [span.partition("-")[0] for span in parts[8:]]
    return []


@contextlib.contextmanager
def slow_failover(cluster: RedisCluster, timeout_ms: int = 8000) -> Iterator[None]:
    """A primary killed meanwhile stays in the map of slots for ``timeout_ms`` (its
    failover window: dead, its replica not promoted yet) rather than one second."""
    for node in cluster.nodes:
        cluster.cli(node, "CONFIG", "SET", "cluster-node-timeout", str(timeout_ms))
    try:
        yield
    finally:
        for node in cluster.nodes:
            if node.process is not None:
                cluster.cli(node, "CONFIG", "SET", "cluster-node-timeout", str(NODE_TIMEOUT_MS))


def not_promoted(cluster: RedisCluster, replica: Node) -> bool:
    """Whether ``replica`` is a replica still: its primary's failover window is not over."""
    return "role:slave" in cluster.cli(replica, "INFO", "replication").split()


#: A payload too large to travel live: the worker reads it from its stream.
LARGE = b"x" * (LIVE_INLINE + 1)


async def test_a_running_worker_follows_and_reads_healthy_primaries_during_a_failover(
    redis_cluster: RedisCluster, inbox: Inbox, make_cluster_transport: MakeTransport
) -> None:
    # Until its replica takes over (after cluster-node-timeout, 8 s here), a dead primary
    # still has its slots in every node's map: the other primaries' channels are followed
    # (subscribed, then their stream's top read) and their streams read, within the bound
    # of a follow, and none of them is reported missed. The dead one serves slot 0, the
    # default node of a redis-py Cluster client.
    by_node = channels_by_node(redis_cluster)
    victim = slot_zero_primary(redis_cluster)
    healthy = [port for port in by_node if port != victim.port]
    publisher = make_cluster_transport()
    running = make_cluster_transport(backoff_start=0.2, backoff_max=2.0)
    missed: list[frozenset[str]] = []
    running.add_listener(inbox, missed=missed.append)
    for port in by_node:
        await running.follow(by_node[port][0])
    listener = cluster_listener(running)
    replica = replica_of(redis_cluster, victim)
    with slow_failover(redis_cluster):
        await off_loop(redis_cluster.kill, victim)
        # The dead node's connection fails, and its streams' reads with it.
        await eventually(lambda: listener.nodes[victim.address].outage.down)
        await asyncio.sleep(0.5)
        new = by_node[healthy[0]][1]
        await asyncio.wait_for(running.follow(new), LISTEN_WAIT)
        assert listener.home[shard_channel(new)] == f"127.0.0.1:{healthy[0]}"
        await off_loop(publisher.publish, [(new, LARGE), (by_node[healthy[1]][0], LARGE)])
        await inbox.wait_for(new, LARGE, timeout=LISTEN_WAIT)
        await inbox.wait_for(by_node[healthy[1]][0], LARGE, timeout=LISTEN_WAIT)
        assert not_promoted(redis_cluster, replica)
    assert not [report for report in missed if report - {by_node[victim.port][0]}]
    await off_loop(redis_cluster.wait_ok)


async def test_a_worker_starting_during_a_primarys_failover_follows_and_reads_healthy_primaries(
    redis_cluster: RedisCluster, inbox: Inbox, make_cluster_transport: MakeTransport
) -> None:
    # A worker (and a publisher) starting while a primary is in its failover window: the
    # other primaries' channels are followed and read, published to, within the bound of a
    # follow; the dead primary's are followed once its replica took over.
    by_node = channels_by_node(redis_cluster)
    victim = slot_zero_primary(redis_cluster)
    doomed, healthy = by_node[victim.port][0], [by_node[p][0] for p in by_node if p != victim.port]
    replica = replica_of(redis_cluster, victim)
    with slow_failover(redis_cluster):
        await off_loop(redis_cluster.kill, victim)
        publisher = make_cluster_transport()
        fresh = make_cluster_transport(backoff_start=0.2, backoff_max=2.0)
        fresh.add_listener(inbox)
        waiting = asyncio.ensure_future(fresh.follow(doomed))
        for channel in healthy:
            await asyncio.wait_for(fresh.follow(channel), LISTEN_WAIT)
        await off_loop(publisher.publish, [(channel, LARGE) for channel in healthy])
        for channel in healthy:
            await inbox.wait_for(channel, LARGE, timeout=LISTEN_WAIT)
        assert not waiting.done()
        assert not_promoted(redis_cluster, replica)
        await off_loop(redis_cluster.wait_ok)
        await asyncio.wait_for(waiting, SETTLE)
        await off_loop(publisher.publish, [(doomed, MARKER)])
        await inbox.wait_for(doomed, MARKER)
