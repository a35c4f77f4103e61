"""Trimming the log as it grows: expired rows of ``firm_channel_messages`` deleted beside
publishing, by every transport that writes the table (the table transport, and pg_notify
keeping its log).

Each published message has a ``2 / batch_size`` chance of submitting a trim of one batch of
expired rows to one background thread, so trimming keeps pace with publishing on average
without a scheduler, and a publisher never waits for it. ``manage.py realtime_trim`` does the
same work on demand.

The trimming thread's connection is held open, so it is bounded like the poller's (see
``bounds``): ``watch``, called by the worker's housekeeping, cuts a trim that outlived its
bound. A failing trim logs one line when trims start failing and one when they work again.

Trims wait for the thread in a bounded queue (``PENDING_TRIMS``, the one running included):
while the database is slow, publishing keeps asking for trims faster than they run, and every
request would otherwise wait in memory. A request over the bound is not made, only counted
(``realtime_queue_overflows_total{queue="trim_requests"}``, one line per interval): a trim
deletes whatever has expired, so those already waiting will delete its rows.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from django.core.exceptions import ImproperlyConfigured

from realtime import metrics
from realtime.compat.django import socket_of
from realtime.statement_clock import StatementClock
from realtime.transports.bounds import Bounds, bounded_connection
from realtime.transports.outage import Outage
from realtime.transports.table_store import MessageStore, close_connection
from realtime.transports.tally import Tally

logger = logging.getLogger(__name__)

#: Trims submitted and not finished, at most (each deletes up to a batch of expired rows).
PENDING_TRIMS = 10


class Trimmer:
    """Deletes expired rows of one store, now (``trim``) or beside publishing (``published``)."""

    def __init__(
        self, store: MessageStore, retention: float, batch_size: int, auto: bool, owner: str
    ) -> None:
        if not retention >= 0:
            raise ImproperlyConfigured(f"{owner}: the retention must be >= 0")
        if batch_size < 1:
            raise ImproperlyConfigured(f"{owner}: the trim batch size must be >= 1")
        self.store = store
        self.retention = retention
        self.batch_size = batch_size
        self.auto = auto
        self._thread: ThreadPoolExecutor | None = None
        self._last: Future[int] | None = None
        self.bounds = Bounds.from_settings()
        self.clock = StatementClock()
        self.outage = Outage("trimming firm_channel_messages", "failed", "works again")
        #: Trims the watchdog cut.
        self.cuts = 0
        #: Trims submitted and not finished (publishers submit from any thread).
        self.pending = 0
        self._pending_lock = threading.Lock()
        #: Trims not submitted because ``PENDING_TRIMS`` were waiting.
        self.overflows = Tally(
            "realtime: %d trim(s) of firm_channel_messages not asked for since the last "
            "report (%d in all): the trims already waiting are behind (a slow database?)"
        )

    def trim(
        self,
        retention: float | None = None,
        batch_size: int | None = None,
        turn_wait: float | None = None,
    ) -> int:
        """Delete one batch of expired rows now, in this thread; return how many went.
        ``turn_wait``: see ``MessageStore.trim_batch``."""
        count = len(
            self.store.trim_batch(
                self.retention if retention is None else retention,
                self.batch_size if batch_size is None else batch_size,
                turn_wait,
            )
        )
        metrics.trimmed(count)
        return count

    def published(self, count: int) -> None:
        """``count`` messages were published: maybe submit trims, as many as they earn.

        Never raises: the messages are published, whatever becomes of their trims. A trim
        not submitted is skipped (the next one, or ``manage.py realtime_trim``, deletes its
        rows), as when the interpreter is shutting down: a script's last broadcasts, run on
        asgiref's thread as it exits, find the executor refusing new work."""
        if not self.auto:
            return
        try:
            expected = count * 2 / self.batch_size
            for _ in range(int(expected) + (random.random() < expected % 1)):
                self._submit()
        except Exception:
            logger.debug("realtime: a trim of firm_channel_messages was skipped", exc_info=True)

    def wait(self, timeout: float | None = None) -> None:
        """Block until the trims submitted so far have run (for tests and benchmarks)."""
        if self._last is not None:
            self._last.result(timeout)

    def close(self) -> None:
        """Finish the trims submitted and release the thread (and its connection)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.submit(close_connection, self.store.using)
            thread.shutdown(wait=True)

    def _submit(self) -> None:
        with self._pending_lock:
            full = self.pending >= PENDING_TRIMS
            if not full:
                self.pending += 1
                if self._thread is None:
                    self._thread = ThreadPoolExecutor(
                        max_workers=1, thread_name_prefix="realtime-trim"
                    )
                try:
                    self._last = self._thread.submit(self._trim_in_background)
                except BaseException:
                    self.pending -= 1
                    raise
        if full:
            metrics.overflowed("trim_requests")
            self.overflows.add()

    def _finished(self) -> None:
        with self._pending_lock:
            self.pending -= 1

    def watch(self) -> None:
        """Cut a background trim whose statement outlived its bound (on the event loop)."""
        bound = self.bounds.statement_timeout
        self.cuts += self.clock.cut_overdue(time.monotonic(), bound, "a trim")

    def _trim_in_background(self) -> int:
        try:
            connection = bounded_connection(self.store.using, self.bounds)
            with self.clock.running(socket_of(connection)):
                trimmed = self.trim()
        except Exception as exc:
            # The next trim is submitted by a later publish: no retry of its own.
            self.outage.failed(exc, 0.0)
            close_connection(self.store.using)
            return 0
        finally:
            self._finished()
        self.outage.recovered()
        return trimmed
