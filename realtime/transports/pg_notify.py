"""The pg_notify transport: PostgreSQL LISTEN/NOTIFY, for the lowest latency on PostgreSQL.

Publishing is ``SELECT pg_notify(channel, payload), ...`` in one statement, in a transaction
of its own on the default database, so the notifications of one call are delivered together
at its commit; the publishing process needs no listener. Listening is one dedicated
connection per worker (see ``pg_listener``), opened with the first follow, on the DSN of the
default database or of ``REALTIME_LISTEN_DATABASE`` (LISTEN needs a session of its own, so it
must bypass a transaction-pooling PgBouncer). A supervisor restarts the listener task if it
ever stops and has the listener check, against the server, what it LISTENs to.

With ``REALTIME_PG_NOTIFY_LOG`` (the default) every message is also a row of
``firm_channel_messages``, written in the same statement as its NOTIFY (see ``pg_log``): a
message too large for a notification travels by its row, positions make delivery resumable,
and a LISTEN connection that comes back reads from the log what it missed; the log is trimmed
beside publishing as the table transport's is (``trimming``). Without the log,
PostgreSQL caps a notification below 8,000 bytes (messages get a 7,000-byte budget and are
shrunk by the publisher before that) and what is sent while the connection is down is lost.
Channel names over 63 bytes are shortened the same way on both sides (a hash suffix) and
mapped back on receipt.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
from collections.abc import Collection, Sequence
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections, transaction

from realtime import limits
from realtime.blocking import run_blocking
from realtime.chunks import chunked
from realtime.conf import conf
from realtime.exceptions import PublishError
from realtime.transports.base import LogEntry, Transport, or_setting
from realtime.transports.pg_listener import ListenerOptions, PgListener
from realtime.transports.pg_log import Sequencer, parse, publish_logged
from realtime.transports.table_store import MessageStore, Row, encode_channel
from realtime.transports.tally import Tally
from realtime.transports.tasks import Tasks
from realtime.transports.trimming import Trimmer

logger = logging.getLogger(__name__)

#: Longest PostgreSQL identifier, in bytes.
MAX_IDENTIFIER_BYTES = 63
#: Notifications per SELECT when one publish carries many.
NOTIFY_CHUNK = 100
# Connection settings Django keeps in OPTIONS that are not libpq parameters.
NOT_LIBPQ = {
    "isolation_level",
    "assume_role",
    "pool",
    "server_side_binding",
    "context",
    "cursor_factory",
    "prepare_threshold",
}


def pg_channel(channel: str) -> str:
    """The PostgreSQL name of a channel: itself, or shortened with a hash when over 63 bytes."""
    encoded = channel.encode("utf-8")
    if len(encoded) <= MAX_IDENTIFIER_BYTES:
        return channel
    digest = hashlib.sha256(encoded).hexdigest()[:12]
    head = encoded[: MAX_IDENTIFIER_BYTES - len(digest) - 1].decode("utf-8", "ignore")
    return f"{head}_{digest}"


def conninfo_of(target: str | None) -> dict[str, Any]:
    """libpq parameters for a ``DATABASES`` alias (default: ``default``) or a DSN."""
    from psycopg.conninfo import conninfo_to_dict

    if target is not None and target not in settings.DATABASES:
        return dict(conninfo_to_dict(target))
    settings_dict: dict[str, Any] = settings.DATABASES[target or "default"]
    if connections[target or "default"].vendor != "postgresql":
        raise ImproperlyConfigured("the pg_notify transport needs a PostgreSQL database")
    params: dict[str, Any] = {
        key: value
        for key, value in settings_dict.get("OPTIONS", {}).items()
        if key not in NOT_LIBPQ
    }
    for key, name in (
        ("NAME", "dbname"),
        ("USER", "user"),
        ("PASSWORD", "password"),
        ("HOST", "host"),
        ("PORT", "port"),
    ):
        if settings_dict.get(key):
            params[name] = settings_dict[key]
    return params


class PgNotifyTransport(Transport):
    """Publish with ``pg_notify``, listen on one LISTEN connection per worker."""

    def __init__(
        self,
        *,
        using: str = "default",
        listen_database: str | None = None,
        heartbeat_interval: float | None = None,
        heartbeat_timeout: float | None = None,
        backoff_start: float | None = None,
        backoff_max: float | None = None,
        supervise_interval: float | None = None,
        log: bool | None = None,
    ) -> None:
        super().__init__()
        self.using = self.publishes_on = using
        self.log = conf.PG_NOTIFY_LOG if log is None else log
        self.max_message_bytes = conf.MAX_PAYLOAD if self.log else limits.PG_NOTIFY_BUDGET
        self.store = MessageStore(using)
        #: The log is trimmed as the table transport's is (nothing to trim without it).
        self.trimmer = Trimmer(
            self.store,
            conf.MESSAGE_RETENTION,
            conf.TRIM_BATCH_SIZE,
            conf.AUTO_TRIM and self.log,
            "pg_notify transport",
        )
        #: Overflows of the listeners' queue: with the log, caught up from it; without,
        #: dropped and reported missed.
        self.overflows = Tally(
            "realtime: pg_notify: the delivery queue was full %d time(s) since the last "
            "report (%d in all); "
            + ("caught up from the log" if self.log else "messages dropped, sockets closed 1012")
        )
        #: Whether a LISTEN connection was up before (the next one replaces a lost one).
        self._listened = False
        #: Where each channel was followed: catching up never hands over what came before.
        self._anchors: dict[str, int] = {}
        #: The read of the log's last position under way, shared by the follows waiting on it.
        self._anchoring: asyncio.Future[int] | None = None
        self._told_mixed = False
        self.listen_database = (
            listen_database if listen_database is not None else conf.LISTEN_DATABASE
        )
        self.options = ListenerOptions(
            heartbeat_interval=or_setting(heartbeat_interval, conf.HEARTBEAT_INTERVAL),
            heartbeat_timeout=or_setting(heartbeat_timeout, conf.HEARTBEAT_TIMEOUT),
            backoff_start=or_setting(backoff_start, conf.RECONNECT_BACKOFF_START),
            backoff_max=or_setting(backoff_max, conf.RECONNECT_BACKOFF_MAX),
            keepidle=conf.TCP_KEEPIDLE,
            keepintvl=conf.TCP_KEEPINTVL,
            keepcnt=conf.TCP_KEEPCNT,
        )
        self.supervise_interval = or_setting(supervise_interval, conf.SUPERVISE_INTERVAL)
        for name in ("heartbeat_interval", "heartbeat_timeout", "backoff_start", "backoff_max"):
            if not getattr(self.options, name) > 0:
                raise ImproperlyConfigured(f"pg_notify transport: {name} must be > 0")
        self._sequencer = Sequencer(
            self.dispatch,
            self._read_rows,
            self._read_after,
            self.room,
            # As many notifications as the delivery queue holds messages.
            max_pending=conf.NOTIFY_QUEUE_SIZE,
            # Log reads failing for longer than a silent LISTEN connection may go unnoticed
            # leave their sockets staler than an outage would: they are made to read again.
            stall_bound=self.options.heartbeat_interval + self.options.heartbeat_timeout,
            missed=self.report_missed,
            followed=self._followed,
        )
        self._sequencer.on_overflow = self.overflows.add
        self.listener: PgListener | None = None
        self._names: dict[str, str] = {}
        self._tasks: Tasks | None = None

    # Publishing ---------------------------------------------------------------------------

    def publish(self, messages: Sequence[tuple[str, bytes]], *, txn: str | None = None) -> None:
        if self.log:
            named = [(_checked(c), payload, pg_channel(c)) for c, payload in messages]
            if not named:
                return
            try:
                # A chunk per statement: the log's publish lock is held for one at a time.
                for part in chunked(named, limits.PUBLISH_CHUNK):
                    publish_logged(connections[self.using], part, limits.PG_NOTIFY_BUDGET)
            except DatabaseError as exc:
                raise PublishError(f"could not publish {len(named)} message(s)") from exc
            self.trimmer.published(len(named))
            return
        pairs = [
            (pg_channel(_checked(channel)), payload.decode("utf-8"))
            for channel, payload in messages
        ]
        if not pairs:
            return
        # One statement is atomic by itself; several go in one transaction, so that all the
        # notifications are delivered together at its commit.
        several = len(pairs) > NOTIFY_CHUNK
        atomic = transaction.atomic(using=self.using) if several else contextlib.nullcontext()
        try:
            with atomic, connections[self.using].cursor() as cursor:
                for chunk in chunked(pairs, NOTIFY_CHUNK):
                    calls = ", ".join(["pg_notify(%s, %s)"] * len(chunk))
                    cursor.execute(f"SELECT {calls}", [value for pair in chunk for value in pair])
        except DatabaseError as exc:
            raise PublishError(f"could not notify {len(pairs)} message(s)") from exc

    def watch(self) -> None:
        """The LISTEN connection bounds itself (probes); the trimming thread is watched."""
        self.trimmer.watch()

    def close(self) -> None:
        """Finish the log trims submitted and release their thread."""
        self.trimmer.close()

    # Listening ----------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self._tasks is None or self._tasks.loop is not loop:
            # First start, or a start on a new loop (a test's): begin from scratch.
            self._tasks = Tasks(loop, "the pg_notify")
            wanted = self.listener.wanted if self.listener is not None else set()
            self.listener = PgListener(
                conninfo_of(self.listen_database),
                self.options,
                self._received,
                _database_answers,
                self._before_listening if self.log else None,
                self._after_listening,
            )
            self.listener.wanted |= wanted
        self._ensure_tasks()

    def _ensure_tasks(self) -> None:
        listener, tasks = self.listener, self._tasks
        if listener is not None and tasks is not None:
            tasks.ensure("listener", listener.run)
            tasks.ensure("supervisor", self._supervise)

    async def _supervise(self) -> None:
        while True:
            await asyncio.sleep(self.supervise_interval)
            try:
                self._ensure_tasks()
                if self.listener is not None and self.listener.connected.is_set():
                    self.listener.verify()
            except Exception:
                logger.exception("realtime: a pg_notify supervisor round failed")

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, None
        if tasks is not None:
            await tasks.stop(self.options.heartbeat_interval + self.options.heartbeat_timeout)
        self._sequencer.stop()
        self.listener = None
        self._names.clear()

    async def follow(self, channel: str) -> None:
        name = pg_channel(_checked(channel))
        self._names[name] = channel
        await self.start()
        if self.log and channel not in self._anchors:
            # Read before the LISTEN: everything committed before it has a position at or
            # below the anchor, and a catch-up (after an overflow or a lost connection)
            # hands over nothing at or below it. Read after, the anchor could pass messages
            # committed after the LISTEN, and a catch-up would skip them.
            self._anchors[channel] = await self._anchor()
        if self.listener is not None:
            await self.listener.listen(name)

    async def unfollow(self, channel: str) -> None:
        name = pg_channel(_checked(channel))
        self._names.pop(name, None)
        self._anchors.pop(channel, None)
        if self.listener is not None:
            self.listener.unlisten(name)

    def _received(self, name: str, payload: str) -> None:
        channel = self._names.get(name)
        if channel is None:
            return
        logged = parse(payload) if self.log else None
        if logged is not None:
            self._sequencer.received(channel, logged[1], logged[0])
            return
        room = self.room()
        if room is not None and room <= 0:
            # No log to catch up from: the sockets of the channel must read again.
            self.overflows.add()
            self.report_missed(frozenset([channel]))
        elif not self.log and _LOGGED_MESSAGE.match(payload):
            self._foreign_logged(channel, payload.partition(":")[2].encode("utf-8"))
        else:
            self.dispatch(channel, payload.encode("utf-8"))

    def _foreign_logged(self, channel: str, message: bytes) -> None:
        """Deliver the message of a publisher that keeps the log, heard by this worker, which
        does not (``REALTIME_PG_NOTIFY_LOG`` differs between processes, e.g. during a deploy
        that turns it on or off). Said once, so that the setting is made the same everywhere;
        a message too large to ride in its notification cannot be read without the log."""
        if not self._told_mixed:
            self._told_mixed = True
            logger.warning(
                "realtime: a publisher keeps the pg_notify log but this worker does not; "
                "set REALTIME_PG_NOTIFY_LOG the same on every process"
            )
        self.dispatch(channel, message)

    # The log ---------------------------------------------------------------------------------

    def log_bounds(self) -> tuple[int | None, int] | None:
        return self.store.bounds() if self.log else None

    def marked_log_bounds(self) -> tuple[int | None, int, str] | None:
        return self.store.marked_bounds() if self.log else None

    def log_marks(self, positions: Collection[int]) -> dict[int, str]:
        return self.store.marks(positions) if self.log else {}

    def read_log(self, channels: Sequence[str], after: int, limit: int) -> list[LogEntry]:
        return self.store.read_log(channels, after, limit) if self.log else []

    async def _anchor(self) -> int:
        """The log's last position, read since this call began (where the sequencer stands,
        if it cannot be read: lower, so a catch-up may hand over a message from just before a
        follow, never skip one after it). Follows asked for at once share one read, so that
        their LISTENs still go out together."""
        if self._anchoring is None or self._anchoring.done():
            self._anchoring = asyncio.ensure_future(self._read_anchor())
        return await asyncio.shield(self._anchoring)

    async def _read_anchor(self) -> int:
        try:
            return int(await run_blocking(self.store.max_id))
        except Exception as exc:
            logger.debug("realtime: reading the log's last position failed: %s", exc)
            return self._sequencer.last or 0

    async def _read_rows(self, positions: list[int]) -> list[Row]:
        return await run_blocking(self.store.read_ids, positions)

    async def _before_listening(self) -> None:
        """On the first connection, start the log here: what commits later is delivered.
        The last position handed out, even when trimming emptied the log, so that a catch-up
        does not take the ids trimmed before the start for messages it owes."""
        if self._sequencer.last is None:
            self._sequencer.last = (await run_blocking(self.store.bounds))[1]

    async def _read_after(self, after: int, limit: int) -> tuple[list[LogEntry], int, bool, int]:
        """The log's messages of the channels followed after ``after`` (each only after its
        follow), the last position read, whether the read reached the end, and the first
        position the log still held once read (see ``_read_log_kept``)."""
        channels = list(self._names.values())
        if not channels:
            return [], after, True, after + 1  # nothing followed, nothing owed
        batch, kept = await run_blocking(self._read_log_kept, channels, after, limit)
        entries = [e for e in batch if e[2] > self._anchors.get(e[0], after)]
        return entries, batch[-1][2] if batch else after, len(batch) < limit, kept

    def _read_log_kept(
        self, channels: list[str], after: int, limit: int
    ) -> tuple[list[LogEntry], int]:
        """``read_log``, then the first position the log still holds (``first_kept``).
        Looked at after the read: a trim that cut after ``after`` before the read shows."""
        return self.store.read_log(channels, after, limit), self.store.first_kept()

    def _followed(self) -> frozenset[str]:
        """Every channel followed here."""
        return frozenset(self._names.values())

    async def _after_listening(self) -> None:
        """On a connection that replaced a lost one: with the log, catch up from it (after
        the last position handed over); without, report every channel followed as missed."""
        replaced, self._listened = self._listened, True
        if not replaced:
            return
        if self.log:
            self._sequencer.fall_behind("the LISTEN connection", everything=True)
        elif self._names:
            self.report_missed(frozenset(self._names.values()))


#: A notification of a publisher that keeps the log: the row's id, then realtime's message (a
#: JSON object). Bare notifications are the message alone.
_LOGGED_MESSAGE = re.compile(r"[0-9]+:\{")


def _checked(channel: str) -> str:
    encode_channel(channel)  # the same 1,024-byte limit as the table transport
    return channel


async def _database_answers() -> bool:
    """Whether the default database answers a query right now (through Django)."""

    def ask() -> bool:
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT 1")
        return True

    try:
        return await asyncio.wait_for(run_blocking(ask), 5.0)
    except Exception:
        return False
