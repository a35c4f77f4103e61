"""The outbox's sweeper: relay what writers left in ``realtime_outbox``.

A writer relays its own rows right after its commit and deletes them (``realtime.writes
.outbox``). Rows still there later are those of a writer that died between its commit and its
relay, or whose publish failed (the transport or its database away). Every worker whose
listener runs sweeps every database that holds an outbox, every half
``REALTIME_COMMIT_GRACE``; ``manage.py realtime_relay`` does the same on demand.

A row becomes visible when its transaction commits, and its writer relays it at once; so a
sweeper relays the rows of a transaction only once it has *seen* them for
``REALTIME_COMMIT_GRACE`` seconds (by its own clock): a transaction that ran for minutes
before committing is not taken from its writer as it commits, as its rows' insert times would
suggest. Each sweep:

1. counts the rows and the age of the oldest (a worker's sweeps set the gauges
   ``realtime_outbox_pending`` and ``realtime_outbox_oldest_seconds``); most find none and
   stop there;
2. reads the oldest rows nobody holds (``OUTBOX_ROWS_PER_SWEEP``) and notes when it first saw
   each transaction;
3. claims the rows of those seen long enough (``OUTBOX_TXNS_PER_SWEEP`` transactions) in a
   short transaction of its own — ``SELECT ... FOR UPDATE SKIP LOCKED`` and a lease
   (``OUTBOX_LEASE``), so that two sweepers never relay one row;
4. per transaction: loads the announcements, reads each created or updated row again (a
   late relay tells the record as it is now: ``realtime.writes.late``), builds their messages
   as the writer would (coalesced, the audiences asked now), publishes them with the key of
   those rows (a transport that remembers keys drops the relay of rows it already had), and
   deletes them.

The publish runs outside any transaction (as every publish does), which is why rows are held
by a lease rather than by the claim's locks. A row that cannot be read is logged (counted, one
line per interval) and dropped. A transaction whose relay fails in a way no retry changes (a
value refused: a channel over 1,024 bytes, say) is logged with its cause and dropped too, and
the sweep goes on: kept, it would be claimed first and fail again in every sweep, holding
back every transaction after it. A failure of the transport or a database (``unrelayable``
tells them apart) ends the sweep: the transactions after it would meet it too, and are
relayed in their order by a later sweep. Each database is swept on its own: one whose sweeps
fail logs one line when they start failing and one when they work again, and lets go of what
it held for the next sweep; the others go on.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import weakref
from typing import Any

from django.conf import settings
from django.db import DatabaseError

from realtime import limits, metrics
from realtime.blocking import run_blocking
from realtime.conf import conf
from realtime.exceptions import ChannelTooLongError, PublishError, TransportError
from realtime.logs import log_operation_failure
from realtime.transports import current_transport, get_transport
from realtime.transports.base import Transport, on_listening
from realtime.transports.outage import Outage
from realtime.transports.tally import Tally
from realtime.writes import order, outbox, outbox_form
from realtime.writes.late import as_now
from realtime.writes.on_commit import relay_key
from realtime.writes.publish import Built, build, send_now

logger = logging.getLogger(__name__)


class Sweeper:
    """Relays the rows writers left, in every database that holds an outbox."""

    def __init__(self, grace: float | None = None, measured: bool = True) -> None:
        #: Seconds a transaction's rows must have been seen before they are relayed here.
        self.grace = conf.COMMIT_GRACE if grace is None else grace
        #: Whether its sweeps set the outbox gauges: a worker's do; a command's do not (a
        #: gauge is kept per process, and would go on showing what the command last found
        #: after it ended).
        self.measured = measured
        #: By database: when each transaction with rows left was first seen (monotonic).
        self.seen: dict[str, dict[str, float]] = {}
        #: By database: the state of its sweeps, for the logs.
        self.outages: dict[str, Outage] = {}
        self.unreadable = Tally(
            "realtime: %d row(s) of realtime_outbox could not be read and were dropped since "
            "the last report (%d in all)"
        )
        #: Rows dropped because no relay of them could succeed (``unrelayable``).
        self.unrelayable = 0
        #: Whether the last sweep left transactions it found ready for the next (it claimed
        #: its most): a worker sweeps again at once rather than after ``interval()``.
        self.behind = False

    def sweep(self) -> int:
        """One sweep of every database that holds an outbox; how many rows were relayed.
        Raises what failed (the databases after it are not swept)."""
        self.behind = False
        return sum(self.sweep_database(alias) for alias in outbox_databases())

    def sweep_database(self, alias: str) -> int:
        """One sweep of the outbox of ``alias``; how many rows were relayed."""
        backlog = outbox.backlog(alias)
        if self.measured:
            metrics.outbox_backlog(alias, backlog.rows, backlog.oldest)
        if not backlog.rows:
            self.seen.pop(alias, None)
            return 0
        now = time.monotonic()
        earlier = self.seen.get(alias, {})
        seen = {
            txn: earlier.get(txn, now)
            for _, txn in outbox.visible(alias, limits.OUTBOX_ROWS_PER_SWEEP)
        }
        self.seen[alias] = seen
        ready = [txn for txn, since in seen.items() if now - since >= self.grace]
        if not ready:
            return 0
        rows = outbox.claim(alias, ready[: limits.OUTBOX_TXNS_PER_SWEEP], limits.OUTBOX_LEASE)
        by_txn = itertools.groupby(sorted(rows, key=lambda r: (r.txn, r.seq)), lambda r: r.txn)
        groups = sorted((list(group) for _, group in by_txn), key=lambda group: group[0].id)
        relayed = done = 0
        try:
            for group in groups:
                try:
                    self._relay(alias, group)
                except Exception as exc:
                    if not unrelayable(exc):
                        raise
                    self._drop(alias, group, exc)
                else:
                    relayed += len(group)
                done += len(group)
        except BaseException:
            left = [row.id for group in groups for row in group][done:]
            self._let_go(alias, left)
            raise
        finally:
            metrics.outbox_relayed(relayed)
        # Behind only after a sweep that worked: one that failed waits for the interval.
        self.behind = self.behind or len(ready) > limits.OUTBOX_TXNS_PER_SWEEP
        return relayed

    def _relay(self, alias: str, rows: list[outbox.Row]) -> None:
        """Publish the announcements of one transaction's rows, then delete the rows."""
        items: list[Any] = []
        seqs: list[int] = []
        for row in rows:
            try:
                item = outbox_form.load(row.item)
            except outbox_form.UnreadableError as exc:
                logger.debug("realtime: row %s of realtime_outbox is unreadable: %s", row.id, exc)
                self.unreadable.add()
                continue
            order.relayed(item, alias, row.id)
            items.append(item)
            seqs.append(row.seq)
        if items:
            transport = get_transport()
            now = [
                (item, seq)
                for item, seq in zip(as_now(items, alias), seqs, strict=True)
                if item is not None
            ]
            built = build(
                [item for item, _ in now],
                transport.max_message_bytes,
                [s for _, s in now],
                alias,
            )
            if built.messages:
                _send(transport, built, relay_key(rows[0].txn, [r.seq for r in rows]))
        outbox.delete(alias, [row.id for row in rows])
        self.seen.get(alias, {}).pop(rows[0].txn, None)

    def _drop(self, alias: str, rows: list[outbox.Row], error: Exception) -> None:
        """Delete the rows of a transaction whose relay fails whatever the retry, saying why
        (the cause, and that the announcement itself must change)."""
        outbox.delete(alias, [row.id for row in rows])
        self.seen.get(alias, {}).pop(rows[0].txn, None)
        self.unrelayable += len(rows)
        log_operation_failure(
            logger,
            "realtime: %d row(s) of realtime_outbox on %r (transaction %s) can never be "
            "relayed, and were dropped (%d in all): fix what announces them (a scope id too "
            "long for a channel, say)",
            error,
            len(rows),
            alias,
            rows[0].txn,
            self.unrelayable,
        )

    def _let_go(self, alias: str, ids: list[int]) -> None:
        """Give back rows claimed and not relayed, for the next sweep (best effort: the lease
        lets them go anyway)."""
        try:
            outbox.release(alias, ids)
        except Exception:
            logger.debug("realtime: letting go of claimed outbox rows failed", exc_info=True)

    def sweep_logged(self) -> int:
        """``sweep``, each database on its own: a failure is logged as an outage of that
        database's sweeps (one line when they start failing, one when they work again)."""
        relayed = 0
        self.behind = False
        for alias in outbox_databases():
            outage = self.outages.get(alias)
            if outage is None:
                outage = self.outages[alias] = Outage(
                    f"relaying realtime_outbox on {alias!r}", "failed", "works again"
                )
            try:
                relayed += self.sweep_database(alias)
            except Exception as exc:
                outage.failed(exc, interval())
                continue
            outage.recovered()
        return relayed


def _send(transport: Transport, built: Built, key: str) -> None:
    """``send_now``, any failure inside the transport a ``PublishError`` but a channel no
    transport takes: a ``TypeError`` or ``ValueError`` raised there (a client library
    refusing its own options, say) is the transport failing, not the announcement's values,
    and a later sweep may find it fixed."""
    try:
        send_now(transport, built, key)
    except ChannelTooLongError:
        raise
    except (ValueError, TypeError) as exc:
        raise PublishError(f"the transport failed: {type(exc).__name__}: {exc}") from exc


def unrelayable(error: Exception) -> bool:
    """Whether a relay that raised ``error`` would raise it again whatever the retry: a value
    refused before the transport is reached (``ValueError``, ``TypeError``: a payload that
    cannot be encoded) or a channel no transport takes, not a transport, database or
    connection failing, which a later sweep may find working again."""
    if isinstance(error, (TransportError, DatabaseError, OSError)):
        return False
    return isinstance(error, (ValueError, TypeError))


def outbox_databases() -> list[str]:
    """The aliases whose outbox is swept: those that hold one, but for a test mirror (a
    replica of another alias, declared with ``TEST["MIRROR"]``: its rows are that one's)."""
    aliases = []
    for alias in settings.DATABASES:
        database: dict[str, Any] = settings.DATABASES[alias]
        if not (database.get("TEST") or {}).get("MIRROR") and outbox.holds_outbox(alias):
            aliases.append(alias)
    return aliases


def interval() -> float:
    """Seconds between two sweeps of a worker: half the commit grace."""
    return max(0.05, conf.COMMIT_GRACE / 2)


# Every worker sweeps --------------------------------------------------------------------------

#: The sweeping task of each event loop that hears a durable transport, and that transport.
_sweeping: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, tuple[Transport, asyncio.Task[None]]
] = weakref.WeakKeyDictionary()


def start_sweeping(transport: Transport) -> None:
    """Sweep on this event loop while it hears ``transport`` (when durable): called when a
    listener is added to a transport (``Transport.add_listener``), that is in every worker."""
    if not transport.durable:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    running = _sweeping.get(loop)
    if running is not None and running[0] is transport and not running[1].done():
        return
    _sweeping[loop] = (transport, loop.create_task(_sweep_while_heard(transport)))


async def _sweep_while_heard(transport: Transport) -> None:
    """Sweep every ``interval()``, and at once again while a sweep leaves transactions
    ready (a backlog after an outage drains at the pace of the relays, not of the
    interval)."""
    sweeper = Sweeper()
    while current_transport() is transport and transport.listening():
        await asyncio.sleep(0 if sweeper.behind else interval())
        try:
            await run_blocking(sweeper.sweep_logged)
        except Exception:
            logger.exception("realtime: a sweep of the outbox failed")


def connect() -> None:
    """Have every worker hearing a durable transport sweep (wired once, by the app)."""
    on_listening(start_sweeping)
