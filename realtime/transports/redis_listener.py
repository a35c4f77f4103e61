"""The Redis transport's Pub/Sub connection: one per worker (per Cluster node it needs),
read by one task.

The task connects (redis-py's asyncio ``PubSub``, on a client of its own, without redis-py's
silent reconnects: see ``redis_client``), ``SSUBSCRIBE``s every shard channel wanted (one
command each: a Cluster refuses a command whose channels lie in two slots), then reads.
Each subscription confirmed is passed on (``on_subscribed``): the transport reads what the
channel may have missed (a gap fill), so a subscription made again after a reconnect loses
nothing. Subscriptions are sent as they are asked for (``subscribe`` returns once the
server confirmed it), beside the reads: Pub/Sub replies come in order on the connection.

Idle flows die quietly behind NAT and overlay networks: a ``PING`` every heartbeat interval
keeps the flow warm, and a connection whose answer does not come within the heartbeat
timeout is given up (half-open: nothing errors, nothing answers). A lost connection is opened
again with exponential backoff and every channel subscribed again; while it waits, the
listener asks Redis every ``backoff_start`` seconds whether it answers, and once it does
after it did not, the next attempt goes at once.

Logs follow the divergence, one line per change (see ``outage``): a loss is a WARNING; a
connection that still cannot come back while Redis answers other clients is an ERROR (once);
a connection down for longer than ``stall_bound`` is an ERROR too, and every channel wanted
is reported (``on_stalled``) so that its sockets are closed 1012 and read again, rather than
wait for a connection that may not come (again after each further bound); its return is a
WARNING saying how long it was gone, said once the server confirmed every channel wanted
(a connection whose subscriptions are refused is not back: its stall bound still runs). The
attempts between are DEBUG.

On a Redis Cluster (``redis_cluster_listener``) each connection serves one node, and the
node may stop serving a channel's slot: it fails over, or the slot migrates. A connection
that fails, a subscription refused with ``MOVED``, and a subscription the server takes back
(Redis unsubscribes the shard channels of a slot that leaves the node) are then told
(``on_displaced``) rather than retried here: the Cluster listener looks up who serves each
slot now, and moves the channels there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from redis.asyncio.client import PubSub
from redis.exceptions import ClusterDownError, MovedError, RedisError, ResponseError

from realtime import metrics
from realtime.transports.outage import Backoff, Outage
from realtime.transports.tasks import cancelled_meanwhile

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ListenerOptions:
    heartbeat_interval: float
    heartbeat_timeout: float
    backoff_start: float
    backoff_max: float
    #: Seconds the connection may stay down before its channels are reported missed.
    stall_bound: float


class Connection:
    """One Pub/Sub connection and the client it came from, closed together."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.pubsub: PubSub = client.pubsub()

    async def close(self, bound: float) -> None:
        """Close both, each within ``bound`` seconds: a close waits for the server to see it
        (a node that stopped answering would hold a stopping listener for good); one that
        takes longer is let go of, its socket closed once the server answers."""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(bound):
                await self.pubsub.aclose()  # type: ignore[no-untyped-call]  # untyped in redis-py
        with contextlib.suppress(Exception):
            async with asyncio.timeout(bound):
                await self.client.aclose()


class RedisListener:
    """Hold the Pub/Sub connection; call ``on_message(shard channel, data)`` for each
    message heard."""

    def __init__(
        self,
        client: Callable[[], Any],
        options: ListenerOptions,
        on_message: Callable[[str, bytes], None],
        on_subscribed: Callable[[str], None],
        on_stalled: Callable[[frozenset[str]], None],
        redis_answers: Callable[[], Awaitable[bool]],
        *,
        on_displaced: Callable[[], None] | None = None,
        what: str = "the Redis Pub/Sub connection",
    ) -> None:
        #: Builds a new asyncio client (one per connection).
        self.client = client
        self.options = options
        self.on_message = on_message
        self.on_subscribed = on_subscribed
        self.on_stalled = on_stalled
        self.redis_answers = redis_answers
        #: On a Cluster: the channels here may be served elsewhere now (see the module
        #: docstring); ``None`` on a standalone server, whose channels never move.
        self.on_displaced = on_displaced
        #: Shard channels that should be subscribed.
        self.wanted: set[str] = set()
        #: Shard channels the server confirmed on the current connection.
        self.subscribed: set[str] = set()
        self.outage = Outage(what)
        self.connected = asyncio.Event()
        #: ``time.monotonic()`` of the loop's last turn (``watch`` looks at it).
        self.beat = time.monotonic()
        self.pings = 0
        self.connections = 0
        self._connection: Connection | None = None
        self._sending = asyncio.Lock()
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._stalled_at: float | None = None
        #: The waits between attempts; a look at Redis (does it answer?) cuts one short.
        self.backoff = Backoff(
            options.backoff_start, options.backoff_max, lambda: self.redis_answers()
        )

    async def subscribe(self, name: str) -> None:
        """``SSUBSCRIBE name``; return once the server confirmed it on a live connection."""
        self.wanted.add(name)
        if name in self.subscribed:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(name, []).append(future)
        await self.want(name)
        await future

    async def want(self, name: str) -> None:
        """Want ``name`` subscribed, and ask for it on the live connection (without waiting
        for the confirmation); the next connection subscribes it otherwise."""
        self.wanted.add(name)
        connection = self._connection
        if name not in self.subscribed and connection is not None and self.connected.is_set():
            # A failure here is the reader's to see: it reconnects and subscribes again.
            with contextlib.suppress(RedisError, OSError, TimeoutError):
                await self._send(connection, "ssubscribe", name)

    async def unsubscribe(self, name: str) -> None:
        """Stop wanting ``name``; ``SUNSUBSCRIBE`` it on the live connection."""
        self.wanted.discard(name)
        self.subscribed.discard(name)
        for future in self._waiters.pop(name, []):  # a follow taken back: nothing to wait for
            if not future.done():
                future.set_result(None)
        connection = self._connection
        if connection is not None and self.connected.is_set():
            with contextlib.suppress(RedisError, OSError, TimeoutError):
                await self._send(connection, "sunsubscribe", name)

    async def run(self) -> None:
        """Connect, serve, and reconnect with backoff, until cancelled."""
        while True:
            connection: Connection | None = None
            self.beat = time.monotonic()
            try:
                connection = Connection(self.client())
                async with asyncio.timeout(self.options.heartbeat_timeout):
                    await connection.pubsub.connect()  # type: ignore[no-untyped-call]
                # Connected first, then the channels wanted now: a channel asked for
                # meanwhile is either among them or sent by ``subscribe`` itself.
                self._connection = connection
                self.subscribed = set()
                self.connected.set()
                # One command per channel: on a Cluster, one SSUBSCRIBE naming channels of
                # two slots is refused whole (CROSSSLOT).
                for name in sorted(self.wanted):
                    await self._send(connection, "ssubscribe", name)
                self.connections += 1
                self.backoff.away = False
                await self._serve(connection)
            except (RedisError, OSError, TimeoutError) as exc:
                if cancelled_meanwhile():
                    raise asyncio.CancelledError from exc
                self.connected.clear()
                delay = self.backoff.delay(self.outage.attempts + 1)
                self.outage.failed(exc, delay)
                if self.on_displaced is not None:
                    self.on_displaced()  # a failover, perhaps: who serves the slots now?
                await self._escalate(exc)
                await self._pause(delay)
            finally:
                self.connected.clear()
                self.subscribed = set()
                self._connection = None
                if connection is not None:
                    await connection.close(self.options.heartbeat_timeout)

    @property
    def prompt_retries(self) -> int:
        """Attempts made at once because Redis came back within a backoff."""
        return self.backoff.prompt_retries

    async def _pause(self, delay: float) -> None:
        """Wait ``delay`` seconds (less once Redis answers again: ``Backoff``), reporting the
        channels wanted whenever the connection has been down for longer than the stall
        bound (once per bound)."""
        step = min(self.options.backoff_start, self.options.stall_bound / 4)
        await self.backoff.wait(delay, step, self._turn)
        self._check_stall()

    def _turn(self) -> None:
        self.beat = time.monotonic()
        self._check_stall()

    def _check_stall(self) -> None:
        bound, since = self.options.stall_bound, self.outage.since
        now = time.monotonic()
        if since is None or now - since < bound:
            return
        if self._stalled_at is None or now - self._stalled_at >= bound:
            self._stalled_at = now
            self.outage.escalate(
                f"is down for over {bound:.1f} s: the sockets of its channels are closed 1012"
            )
            if self.wanted:
                self.on_stalled(frozenset(self.wanted))

    async def _escalate(self, exc: BaseException) -> None:
        """From the second failed attempt: an ERROR if Redis answers other clients.

        Redis may have come back between the failed attempt and the question (a restart):
        so the connection is tried once more before judging, and only another failure is an
        error.
        """
        if self.outage.attempts < 2 or self.outage.escalated:
            return
        if not await self.redis_answers():
            return
        probe = Connection(self.client())
        try:
            async with asyncio.timeout(self.options.heartbeat_timeout):
                await probe.pubsub.connect()  # type: ignore[no-untyped-call]
                await probe.pubsub.ping()
                await probe.pubsub.get_message(timeout=self.options.heartbeat_timeout)
        except (RedisError, OSError, TimeoutError) as again:
            self.outage.escalate("cannot come back although Redis answers", again)
        finally:
            await probe.close(self.options.heartbeat_timeout)

    async def _send(self, connection: Connection, command: str, *names: str) -> None:
        """Send one Pub/Sub command, bounded by the heartbeat timeout."""
        async with self._sending, asyncio.timeout(self.options.heartbeat_timeout):
            if command == "ssubscribe":
                await connection.pubsub.ssubscribe(*names)
            elif command == "sunsubscribe":
                await connection.pubsub.sunsubscribe(*names)
            else:
                await connection.pubsub.ping()

    async def _serve(self, connection: Connection) -> None:
        """Read until the connection fails or a PING goes unanswered past the timeout."""
        options = self.options
        next_ping = time.monotonic() + options.heartbeat_interval
        pinged: float | None = None
        while True:
            now = self.beat = time.monotonic()
            if self.outage.down:
                self._back_when_confirmed()
            if pinged is not None and now - pinged > options.heartbeat_timeout:
                raise TimeoutError("Redis did not answer a PING within the heartbeat timeout")
            if pinged is None and now >= next_ping:
                await self._send(connection, "ping")
                self.pings += 1
                pinged = now
            deadline = pinged + options.heartbeat_timeout if pinged is not None else next_ping
            if self.outage.down:  # look again at the confirmations and at the stall bound
                deadline = min(deadline, now + options.stall_bound / 4)
            try:
                message = await connection.pubsub.get_message(
                    timeout=max(deadline - time.monotonic(), 0.0)
                )
            except ResponseError as exc:
                if self.on_displaced is None or not isinstance(exc, MovedError | ClusterDownError):
                    raise
                self.on_displaced()  # a subscription went to a node that no longer serves it
                continue
            if message is None:
                continue
            kind = message["type"]
            if kind == "smessage":
                self.on_message(_text(message["channel"]), message["data"])
            elif kind == "pong":
                pinged = None
                next_ping = time.monotonic() + options.heartbeat_interval
            elif kind == "ssubscribe":
                self._confirmed(_text(message["channel"]))
            elif kind == "sunsubscribe":
                name = _text(message["channel"])
                if name in self.wanted:
                    # Not ours: the server let go of it (its slot moved away).
                    self.subscribed.discard(name)
                    if self.on_displaced is not None:
                        self.on_displaced()
                    else:
                        await self._send(connection, "ssubscribe", name)

    def _back_when_confirmed(self) -> None:
        """The connection is back once the server confirmed every channel wanted, not when
        it connects: a subscription refused on each new connection (say, a Redis error)
        keeps the outage open, so its stall bound still closes the sockets owed."""
        if not self.wanted <= self.subscribed:
            self._check_stall()
            return
        metrics.listen_reconnected()
        self.outage.recovered()
        self._stalled_at = None

    def _confirmed(self, name: str) -> None:
        if name not in self.wanted:
            return  # unfollowed while the subscription went out: its SUNSUBSCRIBE followed
        self.subscribed.add(name)
        self.on_subscribed(name)
        for future in self._waiters.pop(name, []):
            if not future.done():
                future.set_result(None)


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)
