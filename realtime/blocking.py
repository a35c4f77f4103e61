"""Run the ORM (auth hooks, audience checks, rechecks) off the event loop, on threads of our own.

Under daphne, ``database_sync_to_async`` funnels every call through one thread shared with
the application's sync views; realtime's hot paths (handshakes, recheck rounds, audience
checks) get a small pool instead, and recheck rounds a thread of their own
(``run_in_background``) so that a round never takes a thread delivery is waiting for.

Each thread keeps its database connections from one call to the next, whatever the
application's ``CONN_MAX_AGE``: opening a connection per handshake is what made a burst of
sockets slow. A kept connection is checked (one cheap query) before a call when it sat unused
for ``IDLE_CHECK`` seconds or an error occurred on it, and replaced when it no longer answers;
one a call left with autocommit off is closed (nothing realtime runs leaves it so).
``close_connections`` closes them all (a test database about to be dropped, say).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

from django.db import connections

P = ParamSpec("P")
T = TypeVar("T")

THREADS = 4
#: Seconds a kept connection may sit unused before it is checked again before use.
IDLE_CHECK = 1.0

_executor: ThreadPoolExecutor | None = None
_background: ThreadPoolExecutor | None = None
_lock = threading.Lock()
#: Every connection a pool thread keeps -> when a call last finished with it.
_kept: dict[Any, float] = {}


def _pool(background: bool) -> ThreadPoolExecutor:
    global _executor, _background
    with _lock:
        if background:
            if _background is None:
                _background = ThreadPoolExecutor(1, thread_name_prefix="realtime-recheck")
            return _background
        if _executor is None:
            _executor = ThreadPoolExecutor(THREADS, thread_name_prefix="realtime-orm")
        return _executor


def _ready_connections() -> None:
    """Drop this thread's kept connections that are broken, or idle and no longer answering."""
    now = time.monotonic()
    for conn in connections.all(initialized_only=True):
        if conn.connection is None:
            continue
        with _lock:
            last = _kept.get(conn, now)
        suspect = conn.errors_occurred or now - last >= IDLE_CHECK
        if not conn.get_autocommit() or (suspect and not conn.is_usable()):
            conn.close()
        else:
            conn.errors_occurred = False


def _keep_connections() -> None:
    """Note this thread's connections as kept; close those left in a bad state."""
    now = time.monotonic()
    for conn in connections.all(initialized_only=True):
        if conn.connection is None:
            continue
        if not conn.get_autocommit() or (conn.errors_occurred and not conn.is_usable()):
            conn.close()
            continue
        with _lock:
            _kept[conn] = now


def _with_kept_connections(function: Callable[[], T]) -> T:
    _ready_connections()
    try:
        return function()
    finally:
        _keep_connections()


async def run_blocking(function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Await ``function(*args, **kwargs)`` run on realtime's thread pool."""
    call = functools.partial(function, *args, **kwargs)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_pool(False), _with_kept_connections, call)


async def run_in_background(function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Await ``function(*args, **kwargs)`` run on the thread of background work (rechecks)."""
    call = functools.partial(function, *args, **kwargs)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_pool(True), _with_kept_connections, call)


def close_connections(timeout: float = 10.0) -> None:
    """Close the connections every pool thread keeps, each on its own thread between two
    calls (they open new ones on their next call); wait for that at most ``timeout`` seconds.

    For a test database about to be dropped: PostgreSQL refuses while connections remain.
    """
    with _lock:
        pools = [(pool, n) for pool, n in ((_executor, THREADS), (_background, 1)) if pool]
    for pool, threads in pools:
        # Every job waits for all the others: so each runs on a thread of its own.
        barrier = threading.Barrier(threads, timeout=timeout)
        jobs = [pool.submit(_close_own, barrier) for _ in range(threads)]
        concurrent.futures.wait(jobs, timeout)


def _close_own(barrier: threading.Barrier) -> None:
    for conn in connections.all(initialized_only=True):
        with _lock:
            _kept.pop(conn, None)
        conn.close()
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait()
