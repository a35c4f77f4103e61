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

The work is handed to that thread at the call, not when a task first runs: a helper that
broadcasts and returns at once ends ``async_to_sync``, whose thread then stops taking work. A
task then sees the call through, referenced until it is done; when it is cancelled
(``asyncio.run`` cancels what is left once its coroutine returns) the work already handed
over still runs: only the wait for it stops.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import types
from collections.abc import Callable, Coroutine, Generator
from typing import Any

from asgiref.sync import sync_to_async

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

    ``work`` logs its own failures: nothing is raised into the caller. Its call is started here,
    in a context of its own (as a task's first step would be): asgiref picks the thread and
    queues the work on it before it first waits."""
    call = sync_to_async(work, thread_sensitive=True)()
    context = contextvars.copy_context()
    try:
        waiting = context.run(call.send, None)
    except StopIteration:
        return
    except Exception:
        logger.exception("realtime: the work could not be handed to the caller's thread")
        return
    task = asyncio.get_running_loop().create_task(_finish(call, waiting), context=context)
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)


async def _finish(call: Coroutine[Any, Any, None], waiting: Any) -> None:
    await _resume(call, waiting)


@types.coroutine
def _resume(call: Coroutine[Any, Any, None], waiting: Any) -> Generator[Any, Any, None]:
    """Go on with ``call`` from where its first step stopped, as ``await call`` would, except
    when cancelled: ``call`` is then closed rather than told, as asgiref would withdraw work its
    thread has not started yet."""
    while True:
        try:
            sent = yield waiting
        except asyncio.CancelledError:
            call.close()
            raise
        except BaseException as error:  # handed on to the call, as await does
            try:
                waiting = call.throw(error)
            except StopIteration:
                return
        else:
            try:
                waiting = call.send(sent)
            except StopIteration:
                return
