"""The pg_notify transport's log: rows in ``firm_channel_messages`` beside each NOTIFY.

With ``REALTIME_PG_NOTIFY_LOG`` (the default) a publish is one statement (per chunk of
``PUBLISH_CHUNK`` messages, each its own transaction: a large one holds the lock for a
chunk at a time): it takes the
publish lock (so ids grow in commit order, as on the table transport), turns off the wait for
the WAL flush for this transaction only (the user's write is already durable; the log is a
buffer), inserts the messages, and NOTIFYs each with ``<id>:<message>``, or only ``<id>``
when the message does not fit a notification. Row and notification become visible at the
same commit.

A worker hands messages over in position order through a ``Sequencer``: a notification that
carried only its id waits for its row to be read, and those after it wait behind it; a
position already handed over is skipped, so nothing arrives twice.

The sequencer *falls behind* when the listeners have no room for the next message (their
delivery queue is full) and when a lost LISTEN connection comes back. Behind, it keeps no
notification, only the highest position heard, and catches up from the log: it reads, after
the last position handed over, as many rows as there is room for, hands them over, and goes
on until a read comes back short after every position heard — then it follows the
notifications again. Nothing is dropped, and the queue is never overrun. The notifications
waiting for a row, and behind it, are bounded too (``max_pending``): past it, the sequencer
falls behind and reads them from the log (counted as
``realtime_queue_overflows_total{queue="pending_notifications"}``).

What the log no longer holds cannot be read from it: a catch-up that finds the log starting
above the position after the last one handed over (trimmed past it: an outage longer than
the retention, or a manual trim), and a row read that finds a row gone, report the channels
concerned missed — those the catch-up owes (every channel followed, after a lost LISTEN
connection), or the row's — so that their sockets are closed 1012 and read again rather than
believe they heard everything.

Reading the log is watched. A read that fails is retried; the first failure is one WARNING
(``outage``). Past ``stall_bound`` seconds of failures, one ERROR, and the channels whose
messages the sequencer holds or is behind on — every channel followed, after a lost LISTEN
connection — are reported missed, so that the sockets concerned are closed 1012 and read
again rather than wait for a read that may never work; again after each further
``stall_bound`` while the reads still fail (sockets that came back meanwhile hear nothing
either). A catch-up or a row read that stops (cancelled, or a bug) is logged as an ERROR and
started again.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from realtime import metrics
from realtime.logs import describe
from realtime.transports.outage import WatchedReads
from realtime.transports.table_store import (
    PG_PUBLISH_START,
    PUBLISH_LOCK_KEY,
    TABLE,
    Row,
    channel_hash,
)
from realtime.transports.tally import Tally

logger = logging.getLogger(__name__)

#: Characters a position prefix may take (``<id>:``), kept free in the notification budget.
POSITION_ROOM = 21

#: Seconds between two looks at the listeners' room while it is full, and between two
#: attempts of a catch-up read that failed.
ROOM_WAIT = 0.02
RETRY_WAIT = 0.5

Dispatch = Callable[[str, bytes, int], None]
ReadRows = Callable[[list[int]], Awaitable[list[Row]]]
#: ``read_after(after, limit)``: the log's entries after ``after`` (at most ``limit``), the
#: last position the read covered, whether it reached the end of the log, and the first
#: position the log still held once read (one past the last handed out when it was empty).
ReadAfter = Callable[[int, int], Awaitable[tuple[list[tuple[str, bytes, int]], int, bool, int]]]


def publish_logged(
    connection: BaseDatabaseWrapper,
    messages: Sequence[tuple[str, bytes, str]],
    budget: int,
) -> None:
    """Insert and notify ``(channel, payload, PostgreSQL channel name)`` in one statement."""
    channels = [channel.encode("utf-8") for channel, _, _ in messages]
    payloads = [payload for _, payload, _ in messages]
    names = [name for _, _, name in messages]
    fits = [len(payload) + POSITION_ROOM <= budget for payload in payloads]
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH lock AS MATERIALIZED (SELECT {PG_PUBLISH_START}),
            given AS (
                SELECT * FROM unnest(%s::bytea[], %s::bytea[], %s::bigint[], %s::text[],
                                     %s::boolean[]) WITH ORDINALITY
                    AS g(channel, payload, hash, name, fits, ord)
            ),
            stored AS (
                INSERT INTO {TABLE} (channel, payload, channel_hash, created_at)
                SELECT given.channel, given.payload, given.hash,
                       statement_timestamp() AT TIME ZONE 'UTC'
                FROM lock, given ORDER BY given.ord
                RETURNING id
            ),
            numbered AS (SELECT id, row_number() OVER (ORDER BY id) AS ord FROM stored)
            SELECT pg_notify(
                given.name,
                CASE WHEN given.fits
                     THEN numbered.id::text || ':' || convert_from(given.payload, 'UTF8')
                     ELSE numbered.id::text END
            )
            FROM numbered JOIN given USING (ord) ORDER BY numbered.id
            """,
            [
                PUBLISH_LOCK_KEY,
                channels,
                payloads,
                [channel_hash(channel) for channel in channels],
                names,
                fits,
            ],
        )


def parse(text: str) -> tuple[int, bytes | None] | None:
    """``(position, message or None)`` of a logged notification; ``None`` if it is not one."""
    head, colon, message = text.partition(":")
    if not head.isdigit():
        return None
    return int(head), message.encode("utf-8") if colon else None


class Sequencer:
    """Hand messages over in position order, once each; see the module docstring."""

    def __init__(
        self,
        dispatch: Dispatch,
        read_rows: ReadRows,
        read_after: ReadAfter | None = None,
        room: Callable[[], int | None] | None = None,
        *,
        max_pending: int | None = None,
        stall_bound: float | None = None,
        missed: Callable[[frozenset[str]], None] | None = None,
        followed: Callable[[], frozenset[str]] | None = None,
    ) -> None:
        self.dispatch = dispatch
        self.read_rows = read_rows
        self.read_after = read_after
        self.room = room or (lambda: None)
        #: Notifications waiting (for a row, or behind one) at most; ``None``: no bound.
        self.max_pending = max_pending
        self.missed = missed or _ignore
        #: Every channel followed: what a catch-up after a lost connection may owe.
        self.followed = followed or frozenset
        #: Called each time the sequencer falls behind for lack of room.
        self.on_overflow: Callable[[], None] = lambda: None
        #: Notifications let go (to be read from the log) past ``max_pending``.
        self.pending_overflows = Tally(
            "realtime: pg_notify: %d notification(s) waiting behind a logged message that "
            "could not be read let go since the last report (%d in all); caught up from the log"
        )
        #: Times messages owed were trimmed from the log before they could be read.
        self.losses = Tally(
            "realtime: pg_notify: messages owed were trimmed from the log before they could "
            "be read %d time(s) since the last report (%d in all); their sockets are closed "
            "1012 to read again"
        )
        #: The highest position handed over; ``None`` until the start is known.
        self.last: int | None = None
        #: Catching up from the log; the highest position heard meanwhile.
        self.behind = False
        self.heard = 0
        #: Times the listeners had no room and the sequencer fell behind.
        self.overflows = 0
        #: Messages handed over from the log by catch-ups (after an overflow or an outage).
        self.caught = 0
        self._queue: deque[tuple[str, bytes | None, int]] = deque()
        self._reading: asyncio.Task[None] | None = None
        self._catching: asyncio.Task[None] | None = None
        self._why: str | None = None
        #: Past ``stall_bound`` seconds of failed reads, the channels concerned are reported
        #: ``missed`` (``None``: never).
        self.reads = WatchedReads("reading the log", stall_bound, self.missed)
        #: The first position heard while behind: what comes before it was missed.
        self._first_heard: int | None = None
        self._missed = 0
        #: Channels whose messages the catch-up owes (``None``: every channel followed).
        self._owed: set[str] | None = set()

    def received(self, channel: str, message: bytes | None, position: int) -> None:
        """A notification arrived (in commit order)."""
        if self.behind:
            self.heard = max(self.heard, position)
            if self._first_heard is None:
                self._first_heard = position
            if self._owed is not None:
                self._owed.add(channel)
            return
        self._queue.append((channel, message, position))
        if self.max_pending is not None and len(self._queue) > self.max_pending:
            # Waiting behind a row that cannot be read yet: the log holds them all.
            metrics.overflowed("pending_notifications", len(self._queue))
            self.pending_overflows.add(len(self._queue))
            self.fall_behind()
        self._drain()

    def fall_behind(self, why: str | None = None, *, everything: bool = False) -> None:
        """Stop following notifications and catch up from the log (see the module
        docstring); without a start position or a log reader there is nothing to do.

        With ``why`` (what missed messages), the count read is logged once caught up;
        ``everything``: messages of any channel followed may have been missed.
        """
        if self.last is None or self.read_after is None:
            return
        if why is not None:
            self._why = why
        if not self.behind:
            self._first_heard, self._missed = None, 0
            self._owed = set()
        if everything:
            self._owed = None
        elif self._owed is not None:
            self._owed.update(channel for channel, _, _ in self._queue)
        self.behind = True
        self.heard = max([self.heard, *(position for _, _, position in self._queue)])
        self._queue.clear()
        if self._catching is None or self._catching.done():
            self._catching = self._watched(self._catch_up(), "catching up from the log")

    def stop(self) -> None:
        """Cancel the reads under way (the transport stops); the next fall behind starts
        catching up again."""
        tasks = [self._catching, self._reading]
        self._catching = self._reading = None
        for task in tasks:
            if task is not None:
                task.cancel()

    def _watched(self, work: Coroutine[Any, Any, None], what: str) -> asyncio.Task[None]:
        """A task of ``work`` whose end while it is still needed is an ERROR and a restart:
        the sequencer must never wait for a read that nobody makes."""
        task = asyncio.get_running_loop().create_task(work)
        task.add_done_callback(lambda done: self._ended(done, what))
        return task

    def _ended(self, task: asyncio.Task[None], what: str) -> None:
        catching = task is self._catching and self.behind
        reading = task is self._reading
        if not (catching or reading):
            return  # its work done, or stopped
        error = None if task.cancelled() else task.exception()
        logger.error(
            "realtime: pg_notify: %s stopped (%s); started again",
            what,
            "cancelled" if error is None else describe(error),
            exc_info=error,
        )
        if catching:
            self._catching = self._watched(self._catch_up(), what)
        else:
            self._reading = None
            self._drain()

    def _owed_channels(self) -> frozenset[str]:
        return self.followed() if self._owed is None else frozenset(self._owed)

    def _queued_channels(self) -> frozenset[str]:
        return frozenset(channel for channel, _, _ in self._queue)

    async def _catch_up(self) -> None:
        assert self.read_after is not None
        while self.behind:
            room = self.room()
            if room is not None and room <= 0:
                await asyncio.sleep(ROOM_WAIT)
                continue
            after = self.last or 0
            heard = self.heard  # every position up to it committed before this read
            try:
                entries, covered, complete, kept = await self.read_after(after, room or 1000)
            except Exception as exc:
                self.reads.failed(exc, RETRY_WAIT, self._owed_channels)
                await asyncio.sleep(RETRY_WAIT)
                continue
            self.reads.worked()
            if kept > after + 1:
                self._lost(self._owed_channels())  # trimmed past ``after``
            for channel, message, position in entries:
                if position > (self.last or 0):
                    self.last = position
                    self.caught += 1
                    first = self._first_heard
                    self._missed += first is None or position < first
                    self.dispatch(channel, message, position)
            self.last = max(self.last or 0, covered, kept - 1, heard if complete else 0)
            if complete and self.heard <= self.last:
                self.behind = False
                self._owed = set()
                why, self._why = self._why, None
                if why is not None:
                    logger.info(
                        "realtime: %s missed %d message(s); read from the log",
                        why,
                        self._missed,
                    )

    def _drain(self) -> None:
        if self.behind:
            self._queue.clear()  # the catch-up reads them from the log
            return
        while self._queue and self._reading is None:
            channel, message, position = self._queue[0]
            if self.last is not None and position <= self.last:
                self._queue.popleft()
                continue
            room = self.room()
            if room is not None and room <= 0 and self.read_after is not None:
                self.overflows += 1
                self.on_overflow()
                self.fall_behind()
                return
            if message is None:
                self._reading = self._watched(self._read_missing(), "reading a logged message")
                return
            self._queue.popleft()
            self.last = position
            self.dispatch(channel, message, position)

    async def _read_missing(self) -> None:
        """Read the rows of the queued notifications that came without their message."""
        try:
            missing = [position for _, message, position in self._queue if message is None]
            rows = {row.id: row.payload for row in await self.read_rows(missing)}
            self.reads.worked()
            # Fallen behind meanwhile: the catch-up reads them.
            if not self.behind:
                self._fill(missing, rows)
        except Exception as exc:
            self.reads.failed(exc, RETRY_WAIT, self._queued_channels)
            await asyncio.sleep(RETRY_WAIT)
        # Not in a ``finally``: a read cancelled or broken is restarted by ``_ended``.
        self._reading = None
        self._drain()

    def _fill(self, missing: list[int], rows: dict[int, bytes]) -> None:
        """Put the messages read in their notifications' places. Only a row the read asked
        for and did not find is gone: a notification heard while it read, without its
        message, waits for the next read."""
        asked = set(missing)
        filled: deque[tuple[str, bytes | None, int]] = deque()
        gone: set[str] = set()
        for channel, message, position in self._queue:
            if message is None:
                message = rows.get(position)
                if message is None and position in asked:
                    gone.add(channel)  # trimmed before it was read
                    continue
            filled.append((channel, message, position))
        self._queue = filled
        self._lost(frozenset(gone))

    def _lost(self, channels: frozenset[str]) -> None:
        """Messages of ``channels`` are gone from the log: their sockets must read again."""
        if channels:
            self.losses.add()
            self.missed(channels)


def _ignore(channels: frozenset[str]) -> None:
    """No one to tell of missed messages."""
