"""Run the ORM (auth hooks, audience checks) off the event loop, on threads of our own.

Under daphne, ``database_sync_to_async`` funnels every call through one thread shared with
the application's sync views; realtime's hot paths (handshakes, recheck rounds, audience
checks) get a small pool instead. Each call closes connections that are stale or broken
before and after it, as a request would.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from django.db import close_old_connections

P = ParamSpec("P")
T = TypeVar("T")

THREADS = 4

_executor: ThreadPoolExecutor | None = None


def _with_fresh_connections(function: Callable[[], T]) -> T:
    close_old_connections()
    try:
        return function()
    finally:
        close_old_connections()


async def run_blocking(function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Await ``function(*args, **kwargs)`` run on realtime's thread pool."""
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="realtime-orm")
    call = functools.partial(function, *args, **kwargs)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_executor, _with_fresh_connections, call)
