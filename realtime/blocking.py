"""Run the ORM (auth hooks, audience checks, rechecks) off the event loop, on threads of our own.

Under daphne, ``database_sync_to_async`` funnels every call through one thread shared with
the application's sync views; realtime's hot paths get small pools of their own, one per lane:
handshakes and live queries' first reads (``run_blocking``), recheck rounds
(``run_in_background``), and the reads a live frame waits for, a message's audience and live
queries' refills (``run_for_delivery``). So a recheck round never takes a thread delivery
waits for, and neither does a burst of handshakes (every socket of a worker reconnecting and
asking its queries again): frames of writes are not queued behind it.

Each thread keeps its database connections from one call to the next, whatever the
application's ``CONN_MAX_AGE``: opening a connection per handshake is what made a burst of
sockets slow. A kept connection is checked (``SELECT 1``) before a call when it sat unused for
``IDLE_CHECK`` seconds or a statement failed on it, and replaced when it no longer answers;
one a call left with autocommit off is closed (nothing realtime runs leaves it so).
``close_connections`` closes them all (a test database about to be dropped, say). Which
connections a thread keeps, and which failed, realtime learns from its own execute wrapper
(Django's documented instrumentation), not from the connections' internal state.

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

from django.conf import settings
from django.db import Error, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from realtime.compat.django import socket_of
from realtime.conf import conf
from realtime.statement_clock import StatementClock

logger = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

THREADS = 4
#: Threads of the delivery lane, and of the recheck lane.
DELIVERY_THREADS = 2
RECHECK_THREADS = 1
#: Seconds a kept connection may sit unused before it is checked again before use.
IDLE_CHECK = 1.0

#: Each lane's pool once made, by name: ``(threads, thread name prefix)`` in ``LANES``.
_pools: dict[str, ThreadPoolExecutor] = {}
LANES = {
    "orm": (THREADS, "realtime-orm"),
    "recheck": (RECHECK_THREADS, "realtime-recheck"),
    "delivery": (DELIVERY_THREADS, "realtime-delivery"),
}
_lock = threading.Lock()


class _Thread:
    """What one pool thread keeps: its statement clock, the connections realtime's statements
    ran on (each with when a call last finished with it), and those a statement failed on
    since they were last checked. Only that thread touches ``kept`` and ``failed``."""

    __slots__ = ("clock", "failed", "kept")

    def __init__(self) -> None:
        self.clock = StatementClock()
        self.kept: dict[BaseDatabaseWrapper, float] = {}
        self.failed: set[BaseDatabaseWrapper] = set()


#: Each pool thread's state, by thread.
_threads: dict[int, _Thread] = {}


def _pool(lane: str) -> ThreadPoolExecutor:
    with _lock:
        pool = _pools.get(lane)
        if pool is None:
            threads, prefix = LANES[lane]
            pool = _pools[lane] = ThreadPoolExecutor(threads, thread_name_prefix=prefix)
        return pool


def _thread() -> _Thread:
    """This thread's state."""
    ident = threading.get_ident()
    with _lock:
        state = _threads.get(ident)
        if state is None:
            state = _threads[ident] = _Thread()
        return state


def _ready_connections(state: _Thread) -> None:
    """Drop this thread's kept connections that a statement failed on, or that sat idle, and
    no longer answer."""
    now = time.monotonic()
    for conn, last in list(state.kept.items()):
        if (conn in state.failed or now - last >= IDLE_CHECK) and not _answers(conn, state):
            _drop(conn, state)
        state.failed.discard(conn)


def _answers(conn: BaseDatabaseWrapper, state: _Thread) -> bool:
    """Whether ``conn`` answers a query now (under the thread's clock: a silent one is cut)."""
    try:
        with state.clock.running(socket_of(conn)), conn.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Error:
        return False
    return True


def _keep_connections(state: _Thread) -> None:
    """Note this thread's connections as kept; close those left in a bad state: a
    transaction left open (autocommit off), or a failed statement and no answer since."""
    now = time.monotonic()
    for conn in list(state.kept):
        if not transaction.get_autocommit(conn.alias) or (
            conn in state.failed and not _answers(conn, state)
        ):
            _drop(conn, state)
        else:
            state.kept[conn] = now
            state.failed.discard(conn)


def _drop(conn: BaseDatabaseWrapper, state: _Thread) -> None:
    state.kept.pop(conn, None)
    state.failed.discard(conn)
    conn.close()


def _with_kept_connections(function: Callable[[], T]) -> T:
    state = _thread()
    _ready_connections(state)
    timed = functools.partial(_timed, state)
    try:
        with contextlib.ExitStack() as stack:
            for alias in settings.DATABASES:
                stack.enter_context(connections[alias].execute_wrapper(timed))
            return function()
    finally:
        _keep_connections(state)


def _timed(
    state: _Thread,
    execute: Callable[..., Any],
    sql: str,
    params: Any,
    many: bool,
    context: dict[str, Any],
) -> Any:
    """Django's execute wrapper: run the statement under the thread's clock, and note the
    connection as kept (and as failed, if the statement failed)."""
    conn = context["connection"]
    if conn not in state.kept:
        state.kept[conn] = time.monotonic()
    try:
        with state.clock.running(socket_of(conn)):
            return execute(sql, params, many, context)
    except Error:
        state.failed.add(conn)
        raise


def cut_stuck_statements() -> int:
    """Cut the connection of every pool thread's statement that has had no answer for
    ``REALTIME_HEARTBEAT_TIMEOUT`` plus ``statement_clock.CUT_GRACE`` seconds; how many were
    cut.

    Called on the event loop by the worker's housekeeping, every tick.
    """
    bound, now = conf.HEARTBEAT_TIMEOUT, time.monotonic()
    with _lock:
        clocks = [state.clock for state in _threads.values()]
    what = "a statement of a handshake, recheck or audience check"
    return sum(clock.cut_overdue(now, bound, what) for clock in clocks)


async def run_blocking(function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Await ``function(*args, **kwargs)`` run on realtime's thread pool."""
    return await _run("orm", functools.partial(function, *args, **kwargs))


async def run_in_background(function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Await ``function(*args, **kwargs)`` run on the thread of background work (rechecks)."""
    return await _run("recheck", functools.partial(function, *args, **kwargs))


async def run_for_delivery(function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Await ``function(*args, **kwargs)`` run on the threads of the delivery path: a read
    that frames of writes wait for."""
    return await _run("delivery", functools.partial(function, *args, **kwargs))


async def _run(lane: str, call: Callable[[], T]) -> T:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_pool(lane), _with_kept_connections, call)


def close_connections(timeout: float = 10.0) -> None:
    """Close the connections every pool thread keeps, each on its own thread between two
    calls (they open new ones on their next call); wait for that at most ``timeout`` seconds.

    For a test database about to be dropped: PostgreSQL refuses while connections remain.
    """
    with _lock:
        pools = [(pool, LANES[lane][0]) for lane, pool in _pools.items()]
    for pool, threads in pools:
        # Every job waits for all the others: so each runs on a thread of its own.
        barrier = threading.Barrier(threads, timeout=timeout)
        jobs = [pool.submit(_close_own, barrier) for _ in range(threads)]
        concurrent.futures.wait(jobs, timeout)


def _close_own(barrier: threading.Barrier) -> None:
    state = _thread()
    state.kept.clear()
    state.failed.clear()
    for alias in settings.DATABASES:
        connections[alias].close()
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait()
