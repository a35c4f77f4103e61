"""The pg_notify transport's log: rows in ``firm_channel_messages`` beside each NOTIFY.

With ``REALTIME_PG_NOTIFY_LOG`` (the default) a publish is one statement: it takes the
publish lock (so ids grow in commit order, as on the table transport), turns off the wait for
the WAL flush for this transaction only (the user's write is already durable; the log is a
buffer), inserts the messages, and NOTIFYs each with ``<id>:<message>``, or only ``<id>``
when the message does not fit a notification. Row and notification become visible at the
same commit.

A worker hands messages over in position order through a ``Sequencer``: a notification that
carried only its id waits for its row to be read, and those after it wait behind it; after a
lost LISTEN connection comes back, the rows published meanwhile are read from the log and
handed over first; a position already handed over is skipped, so nothing arrives twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

from django.db.backends.base.base import BaseDatabaseWrapper

from realtime.transports.table_store import (
    PG_PUBLISH_START,
    PUBLISH_LOCK_KEY,
    TABLE,
    Row,
    channel_hash,
)

logger = logging.getLogger(__name__)

#: Characters a position prefix may take (``<id>:``), kept free in the notification budget.
POSITION_ROOM = 21

Dispatch = Callable[[str, bytes, int], None]
ReadRows = Callable[[list[int]], Awaitable[list[Row]]]


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

    def __init__(self, dispatch: Dispatch, read_rows: ReadRows) -> None:
        self.dispatch = dispatch
        self.read_rows = read_rows
        #: The highest position handed over; ``None`` until the start is known.
        self.last: int | None = None
        self._queue: deque[tuple[str, bytes | None, int]] = deque()
        self._reading: asyncio.Task[None] | None = None

    def received(self, channel: str, message: bytes | None, position: int) -> None:
        """A notification arrived (in commit order)."""
        self._queue.append((channel, message, position))
        self._drain()

    def caught_up(self, entries: Sequence[tuple[str, bytes, int]]) -> None:
        """Messages read from the log after a gap: they go before anything queued."""
        for entry in reversed(entries):
            self._queue.appendleft(entry)
        self._drain()

    def _drain(self) -> None:
        while self._queue and self._reading is None:
            channel, message, position = self._queue[0]
            if self.last is not None and position <= self.last:
                self._queue.popleft()
                continue
            if message is None:
                self._reading = asyncio.get_running_loop().create_task(self._read_missing())
                return
            self._queue.popleft()
            self.last = position
            self.dispatch(channel, message, position)

    async def _read_missing(self) -> None:
        """Read the rows of the queued notifications that came without their message."""
        try:
            missing = [position for _, message, position in self._queue if message is None]
            rows = {row.id: row.payload for row in await self.read_rows(missing)}
            filled: deque[tuple[str, bytes | None, int]] = deque()
            for channel, message, position in self._queue:
                if message is None:
                    message = rows.get(position)
                    if message is None:
                        logger.error("realtime: logged message %d is gone; skipped", position)
                        continue
                filled.append((channel, message, position))
            self._queue = filled
        except Exception:
            logger.exception("realtime: reading logged messages failed; retrying")
            await asyncio.sleep(0.5)
        finally:
            self._reading = None
        self._drain()
