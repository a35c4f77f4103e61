"""The LISTEN connection of the pg_notify transport: one per worker, owned by one task.

The task connects (psycopg 3, async, autocommit, TCP keepalive, ``application_name`` so that
operators and tests can find it), LISTENs to every channel wanted, then reads notifications
until a command (LISTEN/UNLISTEN), a probe or a stop needs the connection. psycopg's
``notifies()`` holds the connection's lock while it waits, so every other use of the
connection happens here, between two reads.

Idle flows die quietly behind NAT and overlay networks: a ``SELECT 1`` probe every heartbeat
interval keeps the flow warm and surfaces a dead connection. A lost connection is opened again
with exponential backoff and every channel LISTENed again. While it waits, the listener looks
every ``backoff_start`` seconds whether the server accepts TCP connections again: once it does
after it did not, the next attempt goes at once (the backoff spares a server that is down,
not one that is back). The backend of a connection that was given up (it timed out, so it may
still be alive behind a dead flow) is terminated from the new connection, so that a worker
never leaves LISTEN backends behind.

Logs follow the divergence, one line per change (see ``outage``): a loss is a warning, a
connection that still cannot come back while the database answers other queries is an error
(once), and its return a warning saying how long it was gone; the attempts between are DEBUG.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from realtime import metrics
from realtime.chunks import chunked
from realtime.transports.outage import Backoff, Outage
from realtime.transports.tasks import cancelled_meanwhile

logger = logging.getLogger(__name__)

APPLICATION_NAME = "realtime-listener"
#: LISTENs (or UNLISTENs) sent in one statement, at most: a channel name is at most 63 bytes.
CHANNELS_PER_STATEMENT = 100


@dataclass(frozen=True)
class ListenerOptions:
    heartbeat_interval: float
    heartbeat_timeout: float
    backoff_start: float
    backoff_max: float
    keepidle: int
    keepintvl: int
    keepcnt: int


class PgListener:
    """Hold the LISTEN connection; call ``on_notify(channel, payload)`` for each notification."""

    def __init__(
        self,
        conninfo: dict[str, Any],
        options: ListenerOptions,
        on_notify: Callable[[str, str], None],
        database_answers: Callable[[], Awaitable[bool]],
        before_listening: Callable[[], Awaitable[None]] | None = None,
        after_listening: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.conninfo = conninfo
        self.options = options
        self.on_notify = on_notify
        self.database_answers = database_answers
        #: Awaited on each connection before its LISTENs, and after them (before any read):
        #: where the transport's log starts, and catches up on what a lost connection missed.
        self.before_listening = before_listening
        self.after_listening = after_listening
        #: Channels that should be LISTENed (PostgreSQL names).
        self.wanted: set[str] = set()
        #: Channels LISTENed on the current connection.
        self.listening: set[str] = set()
        #: Channels whose UNLISTEN is under way: still in ``listening``, but not for long.
        self._unlistening: set[str] = set()
        self.backend_pid: int | None = None
        #: A backend given up on that may still be alive: (pid, its start time).
        self.abandoned: tuple[int, Any] | None = None
        self.outage = Outage("the LISTEN connection")
        #: The waits between attempts; a look at the server (a TCP connect) cuts one short.
        self.backoff = Backoff(options.backoff_start, options.backoff_max, self._reachable)
        self.probes = 0
        self.connected = asyncio.Event()
        self._wake = asyncio.Event()
        self._verify = False
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}

    async def listen(self, channel: str) -> None:
        """LISTEN ``channel``; return once it is LISTENed on a live connection."""
        self.wanted.add(channel)
        if channel in self.listening and channel not in self._unlistening:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(channel, []).append(future)
        self._wake.set()
        await future

    def unlisten(self, channel: str) -> None:
        """Stop wanting ``channel``; the UNLISTEN goes out at the next turn of the loop."""
        self.wanted.discard(channel)
        self._wake.set()

    def verify(self) -> None:
        """Ask the loop to compare what the server says is LISTENed with what is wanted."""
        self._verify = True
        self._wake.set()

    async def run(self) -> None:
        """Connect, serve, and reconnect with backoff, until cancelled."""
        while True:
            connection: psycopg.AsyncConnection[Any] | None = None
            started: Any = None
            try:
                connection = await self._connect()
                started = await self._forget_abandoned(connection)
                self.listening = set()
                if self.before_listening is not None:
                    await self._bounded(self.before_listening())
                await self._sync(connection)
                if self.after_listening is not None:
                    await self._bounded(self.after_listening())
                self.connected.set()
                self.backoff.away = False
                if self.outage.since is not None:
                    metrics.listen_reconnected()
                self.outage.recovered()
                await self._serve(connection)
            except (psycopg.Error, OSError, TimeoutError) as exc:
                if cancelled_meanwhile():
                    raise asyncio.CancelledError from exc
                self.connected.clear()
                if isinstance(exc, TimeoutError) and started is not None:
                    # Given up without an answer: the backend may live on behind the flow.
                    assert self.backend_pid is not None
                    self.abandoned = (self.backend_pid, started)
                delay = self.backoff.delay(self.outage.attempts + 1)
                self.outage.failed(exc, delay)
                await self._escalate(exc)
                await self.backoff.wait(delay, min(self.options.backoff_start, delay))
            finally:
                self.connected.clear()
                self.listening = set()
                if connection is not None:
                    with contextlib.suppress(Exception):
                        await connection.close()

    @property
    def prompt_retries(self) -> int:
        """Attempts made at once because the server came back within a backoff."""
        return self.backoff.prompt_retries

    async def _escalate(self, exc: BaseException) -> None:
        """From the second failed attempt: an ERROR if the database answers other queries.

        The database may have come back between the failed attempt and the question (a
        restart): so the LISTEN connection is tried once more before judging, and only
        another failure is an error.
        """
        if self.outage.attempts < 2 or self.outage.escalated:
            return
        if not await self.database_answers():
            return
        try:
            probe = await self._connect()
        except (psycopg.Error, OSError, TimeoutError) as again:
            self.outage.escalate("cannot come back although the database answers", again)
        else:
            with contextlib.suppress(Exception):
                await probe.close()

    async def _bounded(self, work: Awaitable[None]) -> None:
        """Await a hook of the transport, bounded like a statement (they read the log)."""
        # ``asyncio.timeout``, not ``wait_for``: on Python 3.11 the latter swallows a
        # cancellation that comes as the work ends.
        async with asyncio.timeout(max(self.options.heartbeat_timeout, 5.0)):
            await work

    async def _reachable(self) -> bool:
        """Whether the server accepts a TCP (or Unix socket) connection now."""
        host = str(self.conninfo.get("host") or "localhost").split(",")[0]
        port = int(str(self.conninfo.get("port") or 5432).split(",")[0])
        timeout = self.options.backoff_start
        try:
            if host.startswith("/"):
                opening = asyncio.open_unix_connection(f"{host}/.s.PGSQL.{port}")
            else:
                opening = asyncio.open_connection(host, port, family=socket.AF_UNSPEC)
            _, writer = await asyncio.wait_for(opening, timeout)
        except (OSError, TimeoutError):
            return False
        writer.transport.abort()
        return True

    async def _forget_abandoned(self, connection: psycopg.AsyncConnection[Any]) -> Any:
        """Terminate the backend given up on last time, if it is still there; return this
        connection's backend start time (with its pid, it names the backend uniquely)."""
        abandoned, self.abandoned = self.abandoned, None
        if abandoned is not None:
            await self._execute(
                connection,
                sql.SQL(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE pid = {} AND backend_start = {} AND application_name = {}"
                ).format(
                    sql.Literal(abandoned[0]),
                    sql.Literal(abandoned[1]),
                    sql.Literal(APPLICATION_NAME),
                ),
            )
        rows = await self._execute(
            connection,
            "SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()",
        )
        return rows[0][0] if rows else None

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        options = self.options
        connection = await asyncio.wait_for(
            psycopg.AsyncConnection.connect(
                **self.conninfo,
                autocommit=True,
                application_name=APPLICATION_NAME,
                keepalives=1,
                keepalives_idle=options.keepidle,
                keepalives_interval=options.keepintvl,
                keepalives_count=options.keepcnt,
            ),
            timeout=max(options.heartbeat_timeout, 1.0),
        )
        self.backend_pid = connection.info.backend_pid
        return connection

    async def _execute(self, connection: psycopg.AsyncConnection[Any], query: Any) -> Any:
        """Run one statement, bounded by the heartbeat timeout: a silent server is a dead one.

        On timeout the statement is cancelled twice, which makes psycopg drop the connection
        at once rather than ask the server to cancel it (and wait up to ten seconds).
        """
        task = asyncio.ensure_future(self._fetch(connection, query))
        try:
            done, _ = await asyncio.wait({task}, timeout=self.options.heartbeat_timeout)
        finally:
            if not task.done():
                await _abandon(task)
        if not done:
            raise TimeoutError("the database did not answer within the heartbeat timeout")
        return task.result()

    @staticmethod
    async def _fetch(connection: psycopg.AsyncConnection[Any], query: Any) -> list[Any]:
        cursor = await connection.execute(query)
        return await cursor.fetchall() if cursor.description else []

    async def _sync(self, connection: psycopg.AsyncConnection[Any]) -> None:
        """Issue the LISTENs and UNLISTENs that bring the connection to what is wanted.

        Up to ``CHANNELS_PER_STATEMENT`` of them in one round trip: a burst of handshakes
        asks for hundreds of scopes at once, and one round trip each, on a busy event loop,
        kept the last of them waiting for seconds. Each batch's waiters are answered as soon
        as it is done.
        """
        if self._verify:
            self._verify = False
            rows = await self._execute(connection, "SELECT pg_listening_channels()")
            self.listening = {row[0] for row in rows}
        for command, channels in (
            ("LISTEN", sorted(self.wanted - self.listening)),
            ("UNLISTEN", sorted(self.listening - self.wanted)),
        ):
            for batch in chunked(channels, CHANNELS_PER_STATEMENT):
                if command == "LISTEN":
                    await self._execute(connection, _statement(command, batch))
                    self.listening.update(batch)
                else:
                    # Wanted again since the pass began: kept. Wanted again while the UNLISTEN
                    # is under way: LISTENed anew on the next pass.
                    batch = [channel for channel in batch if channel not in self.wanted]
                    if not batch:
                        continue
                    self._unlistening.update(batch)
                    try:
                        await self._execute(connection, _statement(command, batch))
                    finally:
                        self._unlistening.difference_update(batch)
                    self.listening.difference_update(batch)
                self._answer_waiters()
        self._answer_waiters()  # those that asked for a channel already listened to

    def _answer_waiters(self) -> None:
        for channel in [c for c in self._waiters if c in self.listening]:
            for future in self._waiters.pop(channel):
                if not future.done():
                    future.set_result(None)

    async def _serve(self, connection: psycopg.AsyncConnection[Any]) -> None:
        options = self.options
        next_probe = time.monotonic() + options.heartbeat_interval
        while True:
            # Cleared before the sync, not after: a channel asked for while its statements
            # run sets it again, and is LISTENed on the next pass rather than at the next probe.
            self._wake.clear()
            await self._sync(connection)
            now = time.monotonic()
            if now >= next_probe:
                await self._execute(connection, "SELECT 1")
                self.probes += 1
                next_probe = now + options.heartbeat_interval
                continue
            reading = asyncio.ensure_future(self._read(connection, next_probe - now))
            woken = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait({reading, woken}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                woken.cancel()
                reading.cancel()
                # Not ``await reading``: a cancellation of this task arriving just as the
                # read ended would be taken for the read's own and swallowed.
                await asyncio.wait({reading})
            if not reading.cancelled() and (error := reading.exception()) is not None:
                raise error

    async def _read(self, connection: psycopg.AsyncConnection[Any], timeout: float) -> None:
        async for notify in connection.notifies(timeout=max(timeout, 0.0)):
            self.on_notify(notify.channel, notify.payload)


def _statement(command: str, channels: Sequence[str]) -> sql.Composed:
    """``LISTEN a; LISTEN b; ...`` (or UNLISTEN): one round trip for many channels."""
    return sql.SQL("; ").join(
        sql.SQL(command + " {}").format(sql.Identifier(channel)) for channel in channels
    )


async def _abandon(task: asyncio.Task[Any]) -> None:
    """Cancel a statement until it gives up; its connection is lost anyway."""
    for _ in range(100):
        task.cancel()
        await asyncio.wait({task}, timeout=0.05)
        if task.done():
            break
    if task.done() and not task.cancelled():
        task.exception()  # retrieved: the caller reports the timeout, not this
