"""asgiref: thread-sensitive sync work queued at the call, for async code that will not await it.

``broadcast_*``, ``recheck_users`` and ``announce`` are synchronous functions that async code
calls without awaiting, and their work must run on the thread whose connection holds the
caller's transaction. asgiref documents that ``sync_to_async(thread_sensitive=True)`` runs a
function there (the sync thread waiting in ``async_to_sync``, the request's thread under ASGI,
one shared thread otherwise), as Django's async ORM relies on. It does not document *when* its
coroutine chooses that thread and queues the work on it: in its first step, before it first
waits. ``start_task`` takes that step at the call, through Python's coroutine protocol
(``send``), and leaves the rest to a task. That matters: a helper that broadcasts and returns at
once ends ``async_to_sync``, whose thread then runs what was queued and takes no more work; a
task's first step would come too late, and the work would be lost without a word.

``check`` is the self-test, once per process, in a thread of its own: sync code calls, through
``async_to_sync``, a helper that starts a piece of work and returns at once; the work must have
run on that sync thread before ``async_to_sync`` returned. Where it did not, one ERROR line says
so and ``start_task`` hands the work to a task as any coroutine (what asgiref documents), which
loses the work of such a helper.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import types
from collections.abc import Callable, Coroutine, Generator
from importlib import metadata
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async

logger = logging.getLogger(__name__)

#: How long the self-test waits for its thread, in seconds.
CHECK_TIMEOUT = 10.0


def start_task(work: Callable[[], None]) -> asyncio.Task[None] | None:
    """Run ``work`` on the thread ``sync_to_async(thread_sensitive=True)`` picks, queued there
    now; the task returned sees it through (``None``: nothing is left to wait for).

    When the task is cancelled (``asyncio.run`` cancels what is left once its coroutine
    returns), work already queued still runs: only the wait for it stops."""
    if check():
        return _started(work)
    call = sync_to_async(work, thread_sensitive=True)()
    return asyncio.get_running_loop().create_task(call, context=contextvars.copy_context())


def _started(work: Callable[[], None]) -> asyncio.Task[None] | None:
    """``work``'s call, its first step taken now in a context of its own (as a task's first
    step would be), the rest left to a task."""
    call = sync_to_async(work, thread_sensitive=True)()
    context = contextvars.copy_context()
    try:
        waiting = context.run(call.send, None)
    except StopIteration:
        return None
    return asyncio.get_running_loop().create_task(_finish(call, waiting), context=context)


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


# The self-test ---------------------------------------------------------------------------

_verdict: bool | None = None
_verdict_lock = threading.Lock()


def check() -> bool:
    """Whether work started by ``start_task`` is queued at the call, checked once per process;
    if not, one ERROR line says so under which version."""
    global _verdict
    with _verdict_lock:
        if _verdict is None:
            problem = _probe()
            _verdict = problem is None
            if problem is not None:
                logger.error(
                    "realtime: under %s, %s: broadcast_*, recheck_users and announce called "
                    "from an async helper that returns right after are not published. Await "
                    "something after them in such a helper (await asyncio.sleep(0)).",
                    versions(),
                    problem,
                )
    return _verdict


def versions() -> str:
    """The version of asgiref, for the log."""
    try:
        return f"asgiref {metadata.version('asgiref')}"
    except metadata.PackageNotFoundError:
        return "asgiref (version unknown)"


def _probe() -> str | None:
    """What went wrong when a helper run by ``async_to_sync`` started a piece of work and
    returned at once (``None``: it ran on the caller's thread before ``async_to_sync``
    returned)."""
    outcome: list[str | None] = []

    def caller() -> None:
        ran_on: list[int] = []
        tasks: list[asyncio.Task[None]] = []

        async def helper() -> None:
            task = _started(lambda: ran_on.append(threading.get_ident()))
            if task is not None:
                tasks.append(task)

        try:
            async_to_sync(helper)()
        except Exception as error:  # reported, not raised: realtime then falls back
            outcome.append(f"the probe raised {error!r}")
            return
        if ran_on != [threading.get_ident()]:
            outcome.append("sync_to_async(thread_sensitive=True) did not queue its work at once")
        else:
            outcome.append(None)

    thread = threading.Thread(target=caller, name="realtime asgiref check", daemon=True)
    thread.start()
    thread.join(CHECK_TIMEOUT)
    return outcome[0] if outcome else f"the probe did not end in {CHECK_TIMEOUT:g} s"
