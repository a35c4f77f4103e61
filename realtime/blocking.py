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

A kept connection whose peer silently went away would block its thread, and after a few such
calls every handshake, recheck and audience check, without a word. So each thread's
statements (and the checks of idle connections) run under a ``StatementClock``, and
``cut_stuck_statements``, called by the worker's housekeeping, cuts the connection of a
statement that has had no answer for ``REALTIME_HEARTBEAT_TIMEOUT`` plus a second: the call
fails (or, for a check, the connection is replaced), and the thread is free again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from realtime.conf import conf
from realtime.statement_clock import StatementClock

logger = logging.getLogger(__name__)

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
#: The statement clock of each pool thread, by thread.
_clocks: dict[int, StatementClock] = {}


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


def _clock() -> StatementClock:
    """This thread's statement clock."""
    ident = threading.get_ident()
    with _lock:
        clock = _clocks.get(ident)
        if clock is None:
            clock = _clocks[ident] = StatementClock()
        return clock


def _ready_connections(clock: StatementClock) -> None:
    """Drop this thread's kept connections that are broken, or idle and no longer answering."""
    now = time.monotonic()
    for conn in connections.all(initialized_only=True):
        if conn.connection is None:
            continue
        with _lock:
            last = _kept.get(conn, now)
        suspect = conn.errors_occurred or now - last >= IDLE_CHECK
        if not conn.get_autocommit() or (suspect and not _answers(conn, clock)):
            conn.close()
        else:
            conn.errors_occurred = False


def _answers(conn: BaseDatabaseWrapper, clock: StatementClock) -> bool:
    with clock.running(conn):
        return bool(conn.is_usable())


def _keep_connections(clock: StatementClock) -> None:
    """Note this thread's connections as kept; close those left in a bad state."""
    now = time.monotonic()
    for conn in connections.all(initialized_only=True):
        if conn.connection is None:
            continue
        if not conn.get_autocommit() or (conn.errors_occurred and not _answers(conn, clock)):
            conn.close()
            continue
        with _lock:
            _kept[conn] = now


def _with_kept_connections(function: Callable[[], T]) -> T:
    clock = _clock()
    _ready_connections(clock)
    timed = functools.partial(_timed, clock)
    try:
        with contextlib.ExitStack() as stack:
            for conn in connections.all():
                stack.enter_context(conn.execute_wrapper(timed))
            return function()
    finally:
        _keep_connections(clock)


def _timed(
    clock: StatementClock,
    execute: Callable[..., Any],
    sql: str,
    params: Any,
    many: bool,
    context: dict[str, Any],
) -> Any:
    """Django's execute wrapper: run the statement under the thread's clock."""
    with clock.running(context["connection"]):
        return execute(sql, params, many, context)


def cut_stuck_statements() -> int:
    """Cut the connection of every pool thread's statement that has had no answer for
    ``REALTIME_HEARTBEAT_TIMEOUT`` plus ``statement_clock.CUT_GRACE`` seconds; how many were
    cut.

    Called on the event loop by the worker's housekeeping, every tick.
    """
    bound, now = conf.HEARTBEAT_TIMEOUT, time.monotonic()
    with _lock:
        clocks = list(_clocks.values())
    what = "a statement of a handshake, recheck or audience check"
    return sum(clock.cut_overdue(now, bound, what) for clock in clocks)


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
