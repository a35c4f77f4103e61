"""Work the application asks for from async code without awaiting it, run in its transaction.

``broadcast_*``, ``recheck_users`` and ``announce`` are synchronous functions the caller does
not await, and their work is database work: reading whether a transaction is open, registering
the ``on_commit`` callback (with a durable transport, writing the outbox row), reading a row's
readers. That work must run on the thread whose connection holds the caller's transaction —
the one asgiref's ``sync_to_async(thread_sensitive=True)`` runs on, as Django's async ORM does:
under ``async_to_sync`` (a sync view under ``ATOMIC_REQUESTS``, a task in ``atomic()``, calling
an async helper) the sync thread waiting for the helper; in an async view, the request's
thread; under a bare ``asyncio.run``, asgiref's one shared thread. Any other thread has a
connection of its own, outside that transaction: what it registered would publish before the
commit, even after a rollback, and on SQLite wait on the caller's lock.

The work is queued on that thread at the call (``realtime.compat.asgiref``), not when a task
first runs: a helper that broadcasts and returns at once ends ``async_to_sync``, whose thread
then stops taking work. A task sees the call through, referenced until it is done.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from realtime.compat import asgiref

logger = logging.getLogger(__name__)

_tasks: set[asyncio.Task[None]] = set()


def in_async_code() -> bool:
    """Whether the caller runs on an event loop's thread (where Django refuses queries)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def hand_over(work: Callable[[], None]) -> None:
    """Run ``work`` on the thread of the caller's transaction, from async code.

    ``work`` logs its own failures: nothing is raised into the caller, not even asgiref's
    refusal to start it."""
    try:
        task = asgiref.start_task(work)
    except Exception:
        logger.exception("realtime: the work could not be handed to the caller's thread")
        return
    if task is not None:
        _tasks.add(task)
        task.add_done_callback(_tasks.discard)
