"""When a thread's database statement under way began, so another thread can cut it.

A statement waiting on a connection whose peer silently went away (a NAT that forgot the
flow, a frozen proxy, a failover) blocks its thread until the kernel gives up, which without
keepalives takes hours. A ``StatementClock`` notes when the statement under way began and
which socket it waits on; a watchdog on another thread (a worker's housekeeping) reads how
long it has run and, past a bound, shuts the socket down: the blocked read fails at once, and
the connection is replaced like any broken one. It knows sockets, not Django's connections:
its callers find a connection's socket (``realtime.compat.django.socket_of``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

logger = logging.getLogger(__name__)

#: Seconds a statement may outlive its bound before a watchdog cuts its connection: a bound
#: the server enforces itself (a statement timeout) gets the first chance to end it.
CUT_GRACE = 1.0


class StatementClock:
    """When one thread's statement under way began, and the socket it waits on."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since: float | None = None
        self._fd: int | None = None

    @contextmanager
    def running(self, fd: int | None) -> Iterator[None]:
        """Time the statements of the block, which wait on socket ``fd`` (``None``: one that
        cannot be cut, such as SQLite's, which has none)."""
        with self._lock:
            self._since, self._fd = time.monotonic(), fd
        try:
            yield
        finally:
            # Under the lock: once it is released the connection may be closed and its
            # descriptor reused, so ``cut`` must never act after this point.
            with self._lock:
                self._since, self._fd = None, None

    def running_for(self, now: float) -> float | None:
        """Seconds the statement under way has run (``None``: none is)."""
        since = self._since
        return None if since is None else now - since

    def cut_overdue(self, now: float, bound: float, what: str) -> bool:
        """Cut the statement under way if it has run past ``bound`` plus ``CUT_GRACE``
        seconds, and say so in one WARNING naming ``what``; whether it was cut."""
        running = self.running_for(now)
        if running is None or running <= bound + CUT_GRACE or not self.cut():
            return False
        logger.warning(
            "realtime: %s had no answer for %.1f s (bound %.1f s); cut its connection",
            what,
            running,
            bound,
        )
        return True

    def cut(self) -> bool:
        """Shut the socket of the statement under way down, so its read fails now."""
        with self._lock:
            if self._fd is None:
                return False
            try:
                # A duplicate of the descriptor: shutting it down ends the connection for
                # its owner too, closing it leaves the owner's descriptor alone.
                with socket.socket(fileno=os.dup(self._fd)) as duplicate:
                    duplicate.shutdown(socket.SHUT_RDWR)
            except OSError:
                logger.debug("realtime: cutting a stuck connection failed", exc_info=True)
                return False
            return True
