"""The long-running tasks a transport keeps on its event loop — a listening connection, its
supervisor, a Cluster's listener per node — started again when they stop, stopped within a
bound.

A task that ended by an exception is a bug or a failure its own loop did not handle: it is
logged with its traceback before it is started again, never restarted silently. Stopping
cancels every task and waits a bounded time: a task still running then has an await that is
not bounded, which is logged rather than left to hang a worker's shutdown (or a test).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

logger = logging.getLogger("realtime.transports")

Work = Callable[[], Coroutine[Any, Any, None]]


def cancelled_meanwhile() -> bool:
    """Whether the running task was asked to stop while it met a failure it handles.

    A reconnect loop catches ``TimeoutError``; a cancellation that arrives as an
    ``asyncio.timeout`` expires can reach it as that ``TimeoutError`` (or be consumed by a
    library's own handling): the loop would go on, and the task never stop. A request to
    cancel stays counted on the task (``Task.cancelling()``) until it is withdrawn, so the
    loop asks this before it retries, and stops."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class Tasks:
    """Named tasks on one event loop, for the part of realtime that ``what`` names (as in
    "the Redis listener stopped")."""

    def __init__(self, loop: asyncio.AbstractEventLoop, what: str) -> None:
        self.loop = loop
        self.what = what
        self._running: dict[str, asyncio.Task[None]] = {}

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._running))

    def get(self, name: str) -> asyncio.Task[None] | None:
        return self._running.get(name)

    def ensure(self, name: str, work: Work) -> None:
        """Run ``work()`` as ``name`` unless it runs already (on the tasks' loop)."""
        task = self._running.get(name)
        if task is not None and not task.done():
            return
        if task is not None and not task.cancelled():
            logger.error(
                "realtime: %s %s stopped; restarting it",
                self.what,
                name,
                exc_info=task.exception(),
            )
        self._running[name] = self.loop.create_task(work(), name=f"realtime: {self.what} {name}")

    def cancel(self, name: str) -> asyncio.Task[None] | None:
        """Cancel ``name`` and forget it; return its task (its ending may be awaited)."""
        task = self._running.pop(name, None)
        if task is not None:
            task.cancel()
        return task

    async def stop(self, bound: float) -> None:
        """Cancel every task and wait for them to end, at most ``bound`` seconds."""
        tasks = [task for name in self if (task := self.cancel(name)) is not None]
        if not tasks:
            return
        done, pending = await asyncio.wait(tasks, timeout=bound)
        for task in done:
            if not task.cancelled():
                task.exception()  # retrieved: a task that failed as it stopped is not news
        if pending:
            logger.error(
                "realtime: %s task(s) did not stop within %.1f s of being cancelled (an "
                "unbounded wait): %s",
                self.what,
                bound,
                ", ".join(task.get_name() for task in pending),
            )
