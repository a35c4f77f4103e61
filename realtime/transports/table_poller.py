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
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

from realtime import metrics
from realtime.transports.table_store import MessageStore, channel_hash, close_connection

logger = logging.getLogger(__name__)

# Longest pause between polls while the database keeps failing.
MAX_ERROR_BACKOFF = 5.0

Deliver = Callable[[list[tuple[str, bytes, int]]], None]


class Poller:
    """Poll for the followed channels on a thread and deliver their new rows to a loop."""

    def __init__(self, store: MessageStore, interval: float, commit_grace: float) -> None:
        self.store = store
        self.interval = interval
        self.commit_grace = commit_grace
        self._lock = threading.Lock()
        self._anchors: dict[bytes, int] = {}
        self._pending: dict[bytes, list[asyncio.Future[None]]] = {}
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._floor: int | None = None
        self._delivered: set[int] = set()
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
        self._thread = threading.Thread(target=self._run, name="realtime-table-poller", daemon=True)
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

    def _run(self) -> None:
        failures = 0
        try:
            while not self._stopping.is_set():
                started = time.monotonic()
                try:
                    self._take_anchors()
                    self._poll()
                    metrics.polled(time.monotonic() - started)
                    failures = 0
                except Exception:
                    failures += 1
                    logger.exception(
                        "realtime: polling firm_channel_messages failed (attempt %d); retrying",
                        failures,
                    )
                    close_connection(self.store.using)
                # The interval runs from the start of a poll: its cost is not added to it.
                delay = max(0.0, self.interval - (time.monotonic() - started))
                if failures:
                    delay = min(self.interval * 2**failures, max(MAX_ERROR_BACKOFF, self.interval))
                self._wake.wait(delay)
                self._wake.clear()
        finally:
            close_connection(self.store.using)

    def _take_anchors(self) -> None:
        with self._lock:
            if not self._pending:
                return
        anchor = self.store.max_id()
        with self._lock:
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

    def _poll(self) -> None:
        with self._lock:
            anchors = dict(self._anchors)
        if not anchors or self._floor is None:
            return
        hashes = {channel_hash(c) for c in anchors}
        read = self.store.poll(hashes, self._floor, self.commit_grace, self._delivered)
        floor = max(self._floor, read.settled or 0)
        ready: list[tuple[str, bytes, int]] = []
        for row in read.rows:
            self._delivered.add(row.id)
            anchor = anchors.get(row.channel)
            # The hash may collide: only the exact channel, and only what came after its anchor.
            if anchor is not None and row.id > anchor:
                ready.append((row.channel.decode("utf-8"), row.payload, row.id))
        if floor != self._floor:
            self._floor = floor
            self._delivered = {id_ for id_ in self._delivered if id_ > floor}
        if ready and self._deliver is not None:
            self._call_on_loop(self._deliver, ready)

    def _call_on_loop(self, callback: Callable[..., None], *args: object) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            logger.warning("realtime: the event loop of the table listener is gone; stopping")
            self._stopping.set()
            return
        loop.call_soon_threadsafe(callback, *args)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _cancel(future: asyncio.Future[None]) -> None:
    future.cancel()
