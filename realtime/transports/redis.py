"""The Redis transport: a stream per channel for history, sharded Pub/Sub for the live path.

Each transport channel is a stream of its own (see ``redis_keys``), ordered by Redis: a
publish is one ``RELAY`` script call (``redis_scripts``) per chunk of ``PUBLISH_CHUNK``
messages that gives every message the next dense offset of its stream, appends it and sends
it live, atomically; there is no global lock. A Lua call blocks the whole server while it
runs, so a large publish is not one call: its chunks go one round after the other, each a
few milliseconds, and other publishes may land between them. A position is
``StreamPos(channel, epoch, offset)``; the epoch changes when a stream lost history (a server
restarted or failed over: Redis replicates asynchronously; a flush; an expiry), so that
nothing is ever skipped silently.

A worker holds one Pub/Sub connection (``redis_listener``), ``SSUBSCRIBE``d to the shard
channel of each channel it follows; on a Redis Cluster, one per node serving a channel it
follows (``redis_cluster_listener``), moved with the channel's slot, and its stream reads go
to the node serving each stream's slot in the same map of slots (``redis_cluster_reads``).
``follow`` returns once the subscription is confirmed and the stream's current ``(epoch,
top)`` is read: only what comes after is handed over. Messages are handed over per stream in
offset order, with no gap and no duplicate (``redis_sequencer``): what is missing, too large
to travel live (over ``LIVE_INLINE``, or past the ``limits.LIVE_CALL_BYTES`` its script call
sends live), or beyond the listeners' room is read from the stream; each (re)subscription
reads what was sent while the connection was down.

Streams keep what a resume may ask for: entries of the last ``REALTIME_RESUME_WINDOW`` (plus
a margin for clocks), at most ``REALTIME_RESUME_MAX_FRAMES`` times the resume's scan budget
per frame; a stream expires after the window without a write, its meta (and so its epoch)
after twice the window or an hour, whichever is longer, refreshed meanwhile by the workers
that follow it. ``stream_bounds`` and ``read_streams`` answer the resumes from them.

``publish`` may be given a transaction key (``txn``): a stream that already holds a relay of
that key drops the second one (an outbox's relay that is retried); every chunk carries it,
and a stream's messages of one keyed publish all go in one chunk (``publish_chunks``).

On a Redis Cluster, every key of one channel shares its hash tag, so one slot: a publish runs
the script once per slot its channels fall in (and chunk), pipelined (one round trip per
node). Each call is atomic, and a stream's calls run in order, so every stream still gets
its messages in publish order; across slots and chunks a publish is not atomic: a failure
may leave some relayed and others not (``PublishError`` is raised). Relaying it again with
the same ``txn`` is harmless, whatever the relay made again holds: the streams that took it
drop their part, and the others take theirs whole. Messages of one publish on
different slots reach a worker over different connections, so their order across streams is
not kept (within each stream it is). A slot being migrated takes no publish (each names a
key never written, ``redis_keys``'s guard): the outbox relays it once the slot has moved.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import operator
import secrets
import threading
import time
from collections.abc import Collection, Sequence
from typing import Any, Final

import redis
import redis.asyncio
import redis.cluster
from django.core.exceptions import ImproperlyConfigured

from realtime import limits, metrics
from realtime.chunks import grouped_chunks, weighed_chunks
from realtime.conf import conf
from realtime.exceptions import PublishError, TransportError
from realtime.messages import base_channel
from realtime.positions import StreamPos, Vector
from realtime.transports.base import StreamBounds, StreamEntry, Transport, or_setting
from realtime.transports.redis_calls import Call, call_each
from realtime.transports.redis_check import check_server
from realtime.transports.redis_client import (
    LISTENER_NAME,
    READER_NAME,
    TOPOLOGY_NAME,
    UrlError,
    async_client,
    cluster_sync_client,
    node_name,
    node_url,
    parse_url,
    sync_client,
)
from realtime.transports.redis_cluster_listener import ClusterListener
from realtime.transports.redis_cluster_reads import ClusterReads
from realtime.transports.redis_keys import (
    dedupe_key,
    guard_key,
    meta_key,
    parse_live,
    shard_channel,
    stream_key,
)
from realtime.transports.redis_listener import ListenerOptions, RedisListener
from realtime.transports.redis_scripts import READ, RELAY
from realtime.transports.redis_sequencer import RETRY_WAIT, Entry, StreamRead, StreamSequencer
from realtime.transports.table_store import encode_channel
from realtime.transports.tasks import Tasks, cancelled_meanwhile

logger = logging.getLogger(__name__)

#: The largest payload sent live; a larger one goes by its offset, and is read from the stream.
LIVE_INLINE: Final = 65536
#: Seconds a stream keeps entries beyond the resume window: cursor stamps come from the
#: workers' clocks, trimming follows the Redis server's.
TRIM_MARGIN: Final = 60.0
#: The mark of a publish's random key (one not from an outbox), and how long streams
#: remember it: long enough for the client's retry of a publish whose reply was lost.
RANDOM_KEY: Final = "~"
REMEMBER_RANDOM_MS: Final = 10_000
#: Seconds a stream's meta (its epoch) lives without a write, at least.
META_TTL_MIN: Final = 3600.0


def publish_chunks(
    messages: Sequence[tuple[str, bytes]], txn: str | None
) -> Sequence[Sequence[tuple[str, bytes]]]:
    """The script calls of one slot's messages: chunks of ``PUBLISH_CHUNK`` messages (a Lua
    call blocks every client of its server while it runs).

    With a key (``txn``), a stream's messages are never parted between calls: each call
    carries the whole of the streams it names, under the publish's key. A relay made again
    may build fewer messages (a row written since is left out, audiences are asked again),
    so where a message stands in the list is no mark of what landed before; a stream's
    ``T:t`` set is: a stream that took the key took all its messages of the publish at once,
    and drops them all the second time, and one that did not takes them all. (So a stream
    given more than ``PUBLISH_CHUNK`` messages in one publish gets them in one longer call:
    the outbox relays at most ``RELAY_ROWS`` rows per publish.) Without a key, each chunk
    gets a random key of its own, and the chunks are cut by count and by weight
    (``PUBLISH_CHUNK_BYTES``: a single heavier message goes alone)."""
    if txn is None:
        return list(
            weighed_chunks(messages, limits.PUBLISH_CHUNK, limits.PUBLISH_CHUNK_BYTES, _weight)
        )
    return grouped_chunks(messages, limits.PUBLISH_CHUNK, operator.itemgetter(0))


def _weight(message: tuple[str, bytes]) -> int:
    return len(message[1])


def new_epoch() -> str:
    """A candidate epoch: 72 random bits, 12 URL-safe characters (never a ``:``)."""
    return secrets.token_urlsafe(9)


class RedisTransport(Transport):
    """Publish with one script call per publish, listen on one Pub/Sub connection per
    worker; see the module docstring."""

    #: Announcements made in a transaction wait in the database's outbox until relayed: Redis
    #: is away at times, and a relay it already holds (the same ``txn``) is dropped.
    durable = True

    def __init__(
        self,
        *,
        url: str | None = None,
        heartbeat_interval: float | None = None,
        heartbeat_timeout: float | None = None,
        backoff_start: float | None = None,
        backoff_max: float | None = None,
        supervise_interval: float | None = None,
        resume_window: float | None = None,
    ) -> None:
        super().__init__()
        try:
            target = parse_url(url if url is not None else conf.REDIS_URL)
        except UrlError as exc:
            raise ImproperlyConfigured(f"REALTIME_REDIS_URL {exc}") from exc
        #: The standalone server's URL (``None`` on a Cluster).
        self.url = target.url
        #: The Cluster's startup nodes' URLs (empty on a standalone server).
        self.cluster_nodes = target.cluster
        self.max_message_bytes = conf.MAX_PAYLOAD
        self.options = ListenerOptions(
            heartbeat_interval=or_setting(heartbeat_interval, conf.HEARTBEAT_INTERVAL),
            heartbeat_timeout=or_setting(heartbeat_timeout, conf.HEARTBEAT_TIMEOUT),
            backoff_start=or_setting(backoff_start, conf.RECONNECT_BACKOFF_START),
            backoff_max=or_setting(backoff_max, conf.RECONNECT_BACKOFF_MAX),
            stall_bound=0.0,
        )
        for name in ("heartbeat_interval", "heartbeat_timeout", "backoff_start", "backoff_max"):
            if not getattr(self.options, name) > 0:
                raise ImproperlyConfigured(f"Redis transport: {name} must be > 0")
        # Reads or a connection failing for longer than a silent connection may go unnoticed
        # leave their sockets staler than an outage would: they are made to read again.
        stall_bound = self.options.heartbeat_interval + self.options.heartbeat_timeout
        self.options = ListenerOptions(**{**vars(self.options), "stall_bound": stall_bound})
        self.keepalive = (conf.TCP_KEEPIDLE, conf.TCP_KEEPINTVL, conf.TCP_KEEPCNT)
        self.supervise_interval = or_setting(supervise_interval, conf.SUPERVISE_INTERVAL)
        window = or_setting(resume_window, conf.RESUME_WINDOW)
        #: Milliseconds a stream keeps entries (and lives without a write).
        self.keep_ms = int((window + TRIM_MARGIN) * 1000)
        #: Entries a stream keeps at most: what the resume's scan budget may read.
        self.max_entries = conf.RESUME_MAX_FRAMES * limits.RESUME_SCAN_PER_FRAME
        #: Milliseconds a meta lives without a write (workers following it refresh it).
        self.meta_ttl_ms = int(max(2 * window, META_TTL_MIN) * 1000)
        self.sequencer = StreamSequencer(
            self.dispatch,
            self._read,
            self.room,
            stall_bound=stall_bound,
            missed=self.report_missed,
        )
        self.listener: RedisListener | ClusterListener | None = None
        #: Shard channel → the channel followed.
        self._names: dict[str, str] = {}
        #: Follows reading their anchor: a second follow of the channel waits for it.
        self._anchoring: dict[str, asyncio.Future[None]] = {}
        self._publisher: redis.Redis | redis.cluster.RedisCluster | None = None
        #: ``RELAY`` and ``READ`` on the publisher's client.
        self._scripts: tuple[Any, Any] = (None, None)
        self._publisher_lock = threading.Lock()
        #: The stream reads' client (on a Cluster, one per node, as the listener's map says).
        self._reader: redis.asyncio.Redis | ClusterReads | None = None
        self._read_script: Any = None
        self._tasks: Tasks | None = None
        self._refreshed_at = 0.0
        #: Rounds that renewed the metas of the streams followed here.
        self.meta_refreshes = 0

    # Publishing ---------------------------------------------------------------------------

    def publish(self, messages: Sequence[tuple[str, bytes]], *, txn: str | None = None) -> None:
        """Publish in one script call (atomic) per chunk (``publish_chunks``), on a Cluster
        per slot; with ``txn``, a stream that already holds a relay of that key drops its
        messages of this one.

        A Lua call blocks every client of its server while it runs (about 20 µs per
        message): chunks keep that short for a transaction of 100,000 messages. The chunks
        of one round (the first of each slot, then the second, ...) go in one round trip;
        the next round is sent once they are done, so other clients are served between."""
        for channel, _ in messages:
            encode_channel(channel)  # the same 1,024-byte limit as the other transports
        if not messages:
            return
        client, relay = self._publishing()
        slots: dict[int, list[tuple[str, bytes]]] = {}
        for channel, payload in messages:
            slot = client.keyslot(stream_key(channel)) if self.cluster_nodes else 0
            slots.setdefault(slot, []).append((channel, payload))
        epoch = new_epoch()
        rounds: list[list[Call]] = []
        for part in slots.values():
            for index, chunk in enumerate(publish_chunks(part, txn)):
                if index == len(rounds):
                    rounds.append([])
                rounds[index].append(self._relay_call(chunk, epoch, txn))
        started = time.monotonic()
        try:
            results = [reply for calls in rounds for reply in call_each(client, relay, calls)]
        except redis.RedisError as exc:
            raise PublishError(f"could not publish {len(messages)} message(s) to Redis") from exc
        # Per stream: {number, epoch, top offset, 1 if it held this relay already}.
        dropped = sum(1 for result in results for stream in result if int(stream[3]) == 1)
        metrics.redis_published(time.monotonic() - started, dropped)

    def _relay_call(
        self, messages: Sequence[tuple[str, bytes]], epoch: str, txn: str | None
    ) -> Call:
        """``RELAY``'s keys and arguments for ``messages`` (their streams in one slot)."""
        numbers: dict[str, int] = {}
        pairs: list[Any] = []
        for channel, payload in messages:
            pairs += [numbers.setdefault(channel, len(numbers) + 1), payload]
        keys = [key for channel in numbers for key in _keys(channel)]
        # The base channel carries every account's events: kept by time only (the resume's
        # scan budget does not count them either).
        uncapped = [number for channel, number in numbers.items() if channel == base_channel()]
        args = [
            epoch,
            txn or f"{RANDOM_KEY}{secrets.token_hex(8)}",
            self.keep_ms,
            self.max_entries,
            self.meta_ttl_ms,
            LIVE_INLINE,
            self.keep_ms if txn else REMEMBER_RANDOM_MS,
            "," + "".join(f"{number}," for number in uncapped),
            limits.LIVE_CALL_BYTES,
            *pairs,
        ]
        return keys, args

    def _publishing(self) -> tuple[Any, Any]:
        with self._publisher_lock:
            if self._publisher is None:
                timeout = self.options.heartbeat_timeout
                self._publisher = (
                    cluster_sync_client(self.cluster_nodes, timeout, self.keepalive)
                    if self.url is None
                    else sync_client(self.url, timeout, self.keepalive)
                )
                self._scripts = (
                    self._publisher.register_script(RELAY),
                    self._publisher.register_script(READ),
                )
                check_server(self._publisher)
            return self._publisher, self._scripts[0]

    def close(self) -> None:
        """Close the publisher's connections."""
        with self._publisher_lock:
            publisher, self._publisher = self._publisher, None
        if publisher is not None:
            publisher.close()

    # The streams ------------------------------------------------------------------------------

    def stream_of(self, channel: str) -> str:
        """Each channel is a stream of its own."""
        return channel

    def stream_bounds(self, streams: Collection[str]) -> dict[str, StreamBounds] | None:
        """Each stream's epoch (rotated first if its server changed, as a publish would),
        first offset held and top offset, in one round trip (per node on a Cluster)."""
        streams = list(dict.fromkeys(streams))
        reads = self._read_streams([(stream, 0, 0) for stream in streams])
        return {
            stream: StreamBounds(read.epoch, read.first, read.top)
            for stream, read in zip(streams, reads, strict=True)
        }

    def read_streams(self, channels: Sequence[str], after: Vector, limit: int) -> list[StreamEntry]:
        """What ``channels``' streams hold after their entries of ``after``, at most ``limit``
        in all, in publication order (across streams: as their server's clock tells it).

        A stream whose epoch is no longer ``after``'s, or that no longer holds the entry
        right after it (trimmed), raises ``TransportError``: nothing is skipped silently
        (``stream_bounds`` tells beforehand).
        """
        asked = {
            channel: (position.epoch, position.seq)
            for channel in dict.fromkeys(channels)
            if (position := after.position(channel)) is not None
        }
        if not asked or limit <= 0:
            return []
        # Each stream that may hold more is asked its share of what is still wanted, until
        # ``limit`` entries are in hand or every stream is read to its end: a page over many
        # streams reads about ``limit`` entries, not ``limit`` from each.
        found: dict[str, list[Entry]] = {channel: [] for channel in asked}
        more = {channel: seq for channel, (_, seq) in asked.items()}
        total = 0
        while more and total < limit:
            share = -(-(limit - total) // len(more))
            reads = self._read_streams([(channel, seq, share) for channel, seq in more.items()])
            for (channel, seq), read in zip(list(more.items()), reads, strict=True):
                if read.epoch != asked[channel][0]:
                    raise TransportError(f"stream {channel!r} is in another epoch than asked")
                entries = [entry for entry in read.entries if entry.seq > seq]
                if read.top > seq and (not entries or entries[0].seq != seq + 1):
                    raise TransportError(f"stream {channel!r} no longer holds offset {seq + 1}")
                found[channel] += entries
                total += len(entries)
                if not entries or entries[-1].seq >= read.top:
                    del more[channel]  # read to its end (a read cut by weight ends below it)
                else:
                    more[channel] = entries[-1].seq
        merged = [
            [
                (
                    entry.order,
                    number,
                    (channel, entry.payload, StreamPos(channel, epoch, entry.seq)),
                )
                for entry in found[channel]
            ]
            for number, (channel, (epoch, _)) in enumerate(asked.items())
        ]
        # In the order they were published across streams (the server's clock to the
        # microsecond, then their place in one publish; on a Cluster, each node's clock): each
        # stream's entries stay a prefix of what it holds, whatever ``limit`` cuts.
        return [entry for _, _, entry in heapq.merge(*merged)][:limit]

    def _read_streams(self, asks: list[tuple[str, int, int]]) -> list[StreamRead]:
        """``(stream, after, count)`` each, read in one pipelined round trip (per node on a
        Cluster)."""
        if not asks:
            return []
        client, _ = self._publishing()
        read = self._scripts[1]
        epoch = new_epoch()
        calls = [
            (_keys(stream)[:2], [epoch, self.meta_ttl_ms, after, count, limits.READ_CHUNK_BYTES])
            for stream, after, count in asks
        ]
        try:
            replies = call_each(client, read, calls)
        except redis.RedisError as exc:
            raise TransportError(f"could not read {len(asks)} stream(s) from Redis") from exc
        return [_stream_read(reply) for reply in replies]

    async def _read(self, channel: str, after: int, count: int) -> StreamRead:
        """One stream's entries after ``after`` (the sequencer's reads), on this loop."""
        if self._read_script is None:
            raise TransportError("the Redis transport is not started")
        reply = await self._read_script(
            keys=_keys(channel)[:2],
            args=[new_epoch(), self.meta_ttl_ms, after, count, limits.READ_CHUNK_BYTES],
        )
        return _stream_read(reply)

    # Listening ------------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self._tasks is None or self._tasks.loop is not loop:
            # First start, or a start on a new loop (a test's): begin from scratch.
            self._tasks = Tasks(loop, "the Redis")
            wanted = self.listener.wanted if self.listener is not None else set()
            timeout = self.options.heartbeat_timeout
            if self.url is None:
                self.listener = ClusterListener(
                    lambda host, port: self._node_client(host, port, TOPOLOGY_NAME),
                    [node_name(node) for node in self.cluster_nodes],
                    lambda host, port: self._node_client(host, port, LISTENER_NAME),
                    self.options,
                    self._received,
                    self._subscribed,
                    self._stalled,
                    self._node_answers,
                )
                self._reader = ClusterReads(
                    self.listener,
                    lambda host, port: self._node_client(host, port, READER_NAME, retry=True),
                )
            else:
                url = self.url
                self._reader = async_client(url, timeout, self.keepalive, READER_NAME, retry=True)
                self.listener = RedisListener(
                    lambda: async_client(url, timeout, self.keepalive, LISTENER_NAME, retry=False),
                    self.options,
                    self._received,
                    self._subscribed,
                    self._stalled,
                    self._redis_answers,
                )
            self._read_script = self._reader.register_script(READ)
            self.listener.wanted |= wanted
        self._ensure_tasks()

    def _ensure_tasks(self) -> None:
        listener, tasks = self.listener, self._tasks
        if listener is not None and tasks is not None:
            tasks.ensure("listener", listener.run)
            tasks.ensure("supervisor", self._supervise)

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, None
        if tasks is not None:
            await tasks.stop(self.options.stall_bound)
        self.sequencer.stop()
        for channel in self.sequencer.channels():
            self.sequencer.forget(channel)
        reader, self._reader, self._read_script = self._reader, None, None
        if reader is not None:
            with contextlib.suppress(Exception):
                await reader.aclose()
        if isinstance(self.listener, ClusterListener):
            await self.listener.close()
        self.listener = None
        self._names.clear()

    async def follow(self, channel: str) -> StreamPos | None:
        encode_channel(channel)
        name = shard_channel(channel)
        self._names[name] = channel
        await self.start()
        listener = self.listener
        assert listener is not None
        if channel in self.sequencer:
            await listener.subscribe(name)
            anchoring = self._anchoring.get(channel)
            if anchoring is not None:
                await asyncio.shield(anchoring)
            return None
        self.sequencer.expect(channel)
        anchoring = self._anchoring[channel] = asyncio.get_running_loop().create_future()
        try:
            await listener.subscribe(name)
            read = await self._anchor(channel)
            if read is None:
                return None
            self.sequencer.anchored(channel, read.epoch, read.top)
            return StreamPos(channel, read.epoch, read.top)
        except BaseException:
            if self.sequencer.position(channel) is None:
                self.sequencer.forget(channel)  # a later follow starts over
            raise
        finally:
            self._anchoring.pop(channel, None)
            anchoring.set_result(None)

    async def _anchor(self, channel: str) -> StreamRead | None:
        """Where ``channel``'s stream stands now, read again until Redis answers (``None``:
        unfollowed meanwhile)."""
        while channel in self.sequencer:
            try:
                return await self._read(channel, 0, 0)
            except (redis.RedisError, OSError, TimeoutError) as exc:
                if cancelled_meanwhile():
                    raise asyncio.CancelledError from exc
                logger.debug("realtime: reading where %s stands failed: %s", channel, exc)
                await asyncio.sleep(RETRY_WAIT)
        return None

    async def unfollow(self, channel: str) -> None:
        encode_channel(channel)
        name = shard_channel(channel)
        self._names.pop(name, None)
        self.sequencer.forget(channel)
        if self.listener is not None:
            await self.listener.unsubscribe(name)

    def watch(self) -> None:
        """Restart a listener task that stopped, and one that no longer turns (a bug: its
        waits are all bounded)."""
        listener, tasks = self.listener, self._tasks
        if listener is None or tasks is None or tasks.loop is not _running_loop():
            return
        options = self.options
        bound = 2 * (options.heartbeat_interval + options.heartbeat_timeout) + options.backoff_max
        task = tasks.get("listener")
        if task is not None and not task.done() and time.monotonic() - listener.beat > bound:
            logger.error(
                "realtime: the Redis Pub/Sub connection made no progress for %.1f s; restarting it",
                time.monotonic() - listener.beat,
            )
            tasks.cancel("listener")
            listener.beat = time.monotonic()
        self._ensure_tasks()

    def _received(self, name: str, data: bytes) -> None:
        channel = self._names.get(name)
        live = parse_live(data)
        if channel is not None and live is not None:
            self.sequencer.received(channel, live)

    def _subscribed(self, name: str) -> None:
        channel = self._names.get(name)
        if channel is not None:
            self.sequencer.resubscribed(channel)

    def _stalled(self, names: frozenset[str]) -> None:
        """A connection is down past the stall bound: every channel it serves may be
        missing messages for longer than a socket should wait."""
        channels = frozenset(channel for name in names if (channel := self._names.get(name)))
        if channels:
            self.report_missed(channels)

    async def _redis_answers(self) -> bool:
        """Whether Redis answers a command of another connection now."""
        reader = self._reader
        if not isinstance(reader, redis.asyncio.Redis):
            return False  # not started (a Cluster's nodes answer ``_node_answers``)
        try:
            async with asyncio.timeout(self.options.heartbeat_timeout):
                return bool(await reader.ping())
        except (redis.RedisError, OSError, TimeoutError):
            return False

    def _node_client(
        self, host: str, port: int, name: str, *, retry: bool = False
    ) -> redis.asyncio.Redis:
        """A client of one Cluster node, reached as the URL's nodes are (without retries,
        as the Pub/Sub connections are; with, for the stream reads)."""
        url = node_url(self.cluster_nodes[0], host, port)
        return async_client(url, self.options.heartbeat_timeout, self.keepalive, name, retry=retry)

    async def _node_answers(self, host: str, port: int) -> bool:
        """Whether a Cluster node answers a command of another connection now."""
        client = self._node_client(host, port, READER_NAME)
        try:
            async with asyncio.timeout(self.options.heartbeat_timeout):
                return bool(await client.ping())
        except (redis.RedisError, OSError, TimeoutError):
            return False
        finally:
            with contextlib.suppress(Exception):
                await client.aclose()

    async def _supervise(self) -> None:
        while True:
            await asyncio.sleep(self.supervise_interval)
            try:
                self._ensure_tasks()
                await self._refresh_metas()
            except Exception as exc:
                logger.debug("realtime: a Redis supervisor round failed: %s", exc)

    async def _refresh_metas(self) -> None:
        """Keep the metas of the streams followed here alive (every quarter of their
        lifetime), so that a quiet stream keeps its epoch while sockets may resume it."""
        now = time.monotonic()
        reader, channels = self._reader, list(self._names.values())
        if reader is None or not channels or now - self._refreshed_at < self.meta_ttl_ms / 4000:
            return
        self._refreshed_at = now
        keys = [meta_key(channel) for channel in channels]
        if isinstance(reader, ClusterReads):
            await reader.pexpire_each(keys, self.meta_ttl_ms)
        else:
            async with reader.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.pexpire(key, self.meta_ttl_ms)
                await pipe.execute()
        self.meta_refreshes += 1


def _keys(channel: str) -> list[str]:
    """``RELAY``'s keys of ``channel`` (``READ`` takes the first two)."""
    return [stream_key(channel), meta_key(channel), dedupe_key(channel), guard_key(channel)]


def _stream_read(reply: list[Any]) -> StreamRead:
    epoch, top, first, *rest = reply
    entries = [
        Entry(int(rest[i]), int(rest[i + 1]), bytes(rest[i + 2]), _order(rest[i + 3]))
        for i in range(0, len(rest), 4)
    ]
    return StreamRead(
        epoch.decode("ascii") if isinstance(epoch, bytes) else str(epoch),
        int(top),
        None if int(first) < 0 else int(first),
        entries,
    )


def _entry_of(channel: str, epoch: str, entry: Entry) -> StreamEntry:
    return channel, entry.payload, StreamPos(channel, epoch, entry.seq)


def _order(field: Any) -> tuple[int, int]:
    """An entry's ``o``: (microseconds, index in its publish); ``(0, 0)`` when unreadable."""
    at, _, index = bytes(field).partition(b":")
    try:
        return int(at), int(index)
    except ValueError:
        return 0, 0


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
