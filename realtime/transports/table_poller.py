"""The table transport's listener: one thread per process polling ``firm_channel_messages``.

It reads the rows of the followed channels above a *floor* and remembers which ids it already
handed over. Why not a max-id watermark: ids are given at INSERT but become visible at COMMIT,
so two publishers can commit out of id order and a watermark would skip the lower id for ever.
The floor only rises past rows older than the commit grace, so a publish is delivered provided
it commits within that grace (and the clocks of publisher and listener agree within it).

A per-channel *anchor*, the highest id when the channel became followed, keeps a follower
from hearing what predates its follow. The thread takes anchors itself, on its own connection,
so a follow completes only once the channel is really heard. Rows go to the event loop in
batches with ``call_soon_threadsafe``: a slow listener never stalls polling.

Back-pressure: with a ``room`` (how many more messages the listeners can take now), a poll
reads at most that many new rows, and none while a batch is still on its way to the loop;
the floor never passes a row left unread. Rows wait in the table, never dropped.

Every statement is bounded (see ``bounds``), and ``watch`` — called by the worker's
housekeeping — cuts a statement that outlived its bound and restarts a thread that stopped
completing rounds. A restarted thread carries on from the same floor and delivered ids; the
thread it replaces, should it ever wake, finds its generation gone and changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from realtime import metrics, statement_clock
from realtime.compat.django import socket_of
from realtime.statement_clock import StatementClock
from realtime.transports.bounds import Bounds, bounded_connection
from realtime.transports.outage import Outage
from realtime.transports.table_store import MessageStore, channel_hash, close_connection

logger = logging.getLogger(__name__)

# Longest pause between polls while the database keeps failing.
MAX_ERROR_BACKOFF = 5.0
#: Seconds of outage after which the lost connection is logged again, as an error.
ERROR_AFTER = 60.0

T = TypeVar("T")
Deliver = Callable[[list[tuple[str, bytes, int]]], None]


class Poller:
    """Poll for the followed channels on a thread and deliver their new rows to a loop."""

    def __init__(
        self,
        store: MessageStore,
        interval: float,
        commit_grace: float,
        bounds: Bounds | None = None,
    ) -> None:
        self.store = store
        self.interval = interval
        self.commit_grace = commit_grace
        self.bounds = bounds or Bounds.from_settings()
        #: How many more messages the listeners can take now (``None``: no limit).
        self.room: Callable[[], int | None] | None = None
        self.clock = StatementClock()
        self.outage = Outage("polling firm_channel_messages", "failed", "works again")
        #: ``time.monotonic()`` of the last round completed, failed or not.
        self.last_round = time.monotonic()
        #: Rounds that read nothing because the listeners had no room (back-pressure).
        self.paused_rounds = 0
        #: Times the watchdog cut a statement, and restarted the thread.
        self.cuts = 0
        self.restarts = 0
        self._lock = threading.Lock()
        self._anchors: dict[bytes, int] = {}
        self._pending: dict[bytes, list[asyncio.Future[None]]] = {}
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._handed = threading.Event()
        self._handed.set()
        #: Waiting for room in the listeners' queue (logged when it starts and ends).
        self._waiting = False
        self._floor: int | None = None
        self._delivered: set[int] = set()
        self._generation = 0
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._deliver: Deliver | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._loop

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, loop: asyncio.AbstractEventLoop, deliver: Deliver) -> None:
        """Start the thread; rows will be handed to ``deliver`` on ``loop``."""
        self._loop, self._deliver = loop, deliver
        self._stopping.clear()
        self._spawn()

    def _spawn(self) -> None:
        with self._lock:
            self._generation += 1
            generation = self._generation
        self.last_round = time.monotonic()
        self._handed.set()
        self._thread = threading.Thread(
            target=self._run, args=(generation,), name="realtime-table-poller", daemon=True
        )
        self._thread.start()

    def request_stop(self) -> None:
        """Ask the thread to stop, without waiting for it."""
        self._stopping.set()
        self._wake.set()

    def stop(self) -> None:
        """Stop the thread (interrupting its sleep), wait for it, and forget every channel."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(self.bounds.statement_timeout + statement_clock.CUT_GRACE)
            if self._thread.is_alive():
                self.clock.cut()
                self._thread.join()
            self._thread = None
        with self._lock:
            self._anchors.clear()
            pending, self._pending = self._pending, {}
        for futures in pending.values():
            for future in futures:
                self._call_on_loop(_cancel, future)

    def follow(self, channel: bytes, future: asyncio.Future[None]) -> None:
        """Follow ``channel``; ``future`` completes once the thread has anchored it."""
        with self._lock:
            if channel in self._anchors:
                future.set_result(None)
                return
            self._pending.setdefault(channel, []).append(future)
        self._wake.set()

    def follows(self, channel: bytes) -> bool:
        """Whether ``channel`` is followed (anchored) now."""
        with self._lock:
            return channel in self._anchors

    def unfollow(self, channel: bytes) -> None:
        with self._lock:
            self._anchors.pop(channel, None)
            futures = self._pending.pop(channel, [])
        for future in futures:
            future.cancel()

    # The watchdog -----------------------------------------------------------------------

    def watch(self) -> None:
        """Cut a statement that outlived its bound; restart a thread that stopped polling.

        Called on the event loop by the worker's housekeeping, every tick.
        """
        if self._thread is None or self._stopping.is_set():
            return
        now = time.monotonic()
        bound = self.bounds.statement_timeout
        self.cuts += self.clock.cut_overdue(now, bound, "a statement of the table poller")
        idle = now - self.last_round
        if not self._thread.is_alive():
            why = "its thread stopped"
        elif idle > 2 * (bound + statement_clock.CUT_GRACE) + MAX_ERROR_BACKOFF + self.interval:
            why = f"it completed no round for {idle:.1f} s"
        else:
            return
        self.restarts += 1
        logger.error("realtime: the table poller is restarted: %s", why)
        self.clock.cut()
        self._spawn()

    # The thread ---------------------------------------------------------------------------

    def _current(self, generation: int) -> bool:
        return generation == self._generation and not self._stopping.is_set()

    def _run(self, generation: int) -> None:
        failures = 0
        try:
            while self._current(generation):
                started = time.monotonic()
                try:
                    self._take_anchors(generation)
                    self._poll(generation)
                    metrics.polled(time.monotonic() - started)
                    failures = 0
                except Exception as exc:
                    if not self._current(generation):
                        break
                    failures += 1
                    self.outage.failed(exc, self._backoff(failures))
                    if self.outage.duration() > ERROR_AFTER:
                        self.outage.escalate("is still lost")
                    close_connection(self.store.using)
                if generation == self._generation:
                    self.last_round = time.monotonic()
                # The interval runs from the start of a poll: its cost is not added to it.
                delay = max(0.0, self.interval - (time.monotonic() - started))
                if failures:
                    delay = self._backoff(failures)
                self._wake.wait(delay)
                self._wake.clear()
        finally:
            close_connection(self.store.using)

    def _backoff(self, failures: int) -> float:
        """The pause after ``failures`` failed rounds in a row: doubling, within a cap."""
        return float(min(self.interval * 2**failures, max(MAX_ERROR_BACKOFF, self.interval)))

    def _take_anchors(self, generation: int) -> None:
        with self._lock:
            if not self._pending:
                return
        anchor = self._read(generation, self.store.max_id)
        with self._lock:
            if generation != self._generation:
                return
            if not self._anchors:
                # Nothing was followed, so no lower id is owed to anyone: start afresh here.
                self._floor = anchor
                self._delivered.clear()
            pending, self._pending = self._pending, {}
            for channel in pending:
                self._anchors[channel] = anchor
        for futures in pending.values():
            for future in futures:
                self._call_on_loop(_resolve, future)

    def _poll(self, generation: int) -> None:
        with self._lock:
            anchors = dict(self._anchors)
            # Not copied: only the current thread changes it (under the lock, see below).
            floor, delivered = self._floor, self._delivered
        if not anchors or floor is None:
            return
        limit = None
        if self.room is not None:
            # Until the last batch reached the listeners, the room they report is stale.
            limit = self.room() if self._handed.is_set() else 0
            if limit is not None and limit <= 0:
                self.paused_rounds += 1
                if self._handed.is_set() and not self._waiting:
                    self._waiting = True
                    logger.debug("realtime: the delivery queue is full; the table poller waits")
                return
            if self._waiting:
                self._waiting = False
                logger.debug("realtime: the delivery queue has room; the table poller reads on")
        hashes = {channel_hash(c) for c in anchors}
        read = self._read(
            generation, lambda: self.store.poll(hashes, floor, self.commit_grace, delivered, limit)
        )
        ready: list[tuple[str, bytes, int]] = []
        with self._lock:
            if generation != self._generation:
                return
            for row in read.rows:
                self._delivered.add(row.id)
                anchor = anchors.get(row.channel)
                # The hash may collide: only the exact channel, and only what came after its
                # anchor.
                if anchor is not None and row.id > anchor:
                    ready.append((row.channel.decode("utf-8"), row.payload, row.id))
            new_floor = max(floor, read.settled or 0)
            if new_floor != floor:
                self._floor = new_floor
                self._delivered = {id_ for id_ in self._delivered if id_ > new_floor}
            if ready:
                self._handed.clear()
                self._call_on_loop(self._hand_over, ready, generation)

    def _read(self, generation: int, statement: Callable[[], T]) -> T:
        """Run ``statement`` on this thread's bounded connection, timed by the clock."""
        connection = bounded_connection(self.store.using, self.bounds)
        with self.clock.running(socket_of(connection)):
            result = statement()
        if generation == self._generation:
            self.outage.recovered()
        return result

    def _hand_over(self, rows: list[tuple[str, bytes, int]], generation: int) -> None:
        """On the loop: deliver a batch of the current thread's rows."""
        try:
            if generation == self._generation and self._deliver is not None:
                self._deliver(rows)
        finally:
            self._handed.set()

    def _call_on_loop(self, callback: Callable[..., None], *args: object) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            logger.warning("realtime: the event loop of the table listener is gone; stopping")
            self._stopping.set()
            self._handed.set()
            return
        loop.call_soon_threadsafe(callback, *args)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _cancel(future: asyncio.Future[None]) -> None:
    future.cancel()
