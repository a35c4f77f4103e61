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

One caller's transaction is on no thread asgiref picks: the event loop's own thread's. Sync
code in ``atomic()`` (a task) that runs an async helper with ``asyncio.run`` rather than
``async_to_sync`` runs the loop on its own thread, in its block, and asgiref's shared thread
is outside it. No statement may run on the loop's thread, so the work waits there for the
block's commit (``on_commit.after_commit``) and is dropped if it rolls back. Whether that
thread's sync code is in a block is read without a statement
(``realtime.compat.django.sync_connection``: on the loop, ``connections`` answers a
connection of the loop's own); the thread of an ASGI server's loop, or of the loop
``async_to_sync`` starts, is in none.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from django.db import DEFAULT_DB_ALIAS
from django.db.backends.base.base import BaseDatabaseWrapper

from realtime.compat import asgiref
from realtime.compat.django import in_atomic_block, sync_connection
from realtime.writes import on_commit

logger = logging.getLogger(__name__)

_tasks: set[asyncio.Task[None]] = set()


def in_async_code() -> bool:
    """Whether the caller runs on an event loop's thread (where Django refuses queries)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def hand_over(work: Callable[[], None], aliases: Iterable[str] = (DEFAULT_DB_ALIAS,)) -> None:
    """Run ``work`` on the thread of the caller's transaction, from async code: ``aliases``
    are the databases whose transaction it joins (an atomic block open on the event loop's
    own thread, on the first of them that has one, runs it at that block's commit).

    ``work`` logs its own failures: nothing is raised into the caller, not even asgiref's
    refusal to start it."""
    try:
        here = _atomic_here(aliases)
        if here is not None:
            on_commit.after_commit(work, here)
            return
        task = asgiref.start_task(work)
    except Exception:
        logger.exception("realtime: the work could not be handed to the caller's thread")
        return
    if task is not None:
        _tasks.add(task)
        task.add_done_callback(_tasks.discard)


def _atomic_here(aliases: Iterable[str]) -> BaseDatabaseWrapper | None:
    """The connection of the first of ``aliases`` that this (the loop's) thread's sync code
    holds in an atomic block."""
    for alias in aliases:
        connection = sync_connection(alias)
        if connection is not None and in_atomic_block(connection):
            return connection
    return None
