"""``Batcher``: questions asked at about the same time answered together, off the event loop.

Concurrent handshakes share statements this way: each asks its question and awaits its answer,
while up to ``lanes`` batches run at once, each taking every question waiting when it starts
(up to ``size``). A lone question is answered at once, in a batch of one; under a burst, the
questions that arrive while a batch runs go together in the next. Nothing waits on a timer.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

Q = TypeVar("Q")

#: Askers answered (or, in a resume, sockets' frames made) before the event loop gets a
#: turn for other work such as live delivery.
SLICE = 32


class Batcher(Generic[Q]):
    """Answer questions in batches with ``answer_all`` (see the module docstring).

    ``answer_all(questions)`` returns one answer per question, in order; an answer that is an
    exception is raised to that question's asker alone.
    """

    def __init__(
        self,
        answer_all: Callable[[list[Q]], Awaitable[Sequence[Any]]],
        *,
        size: int,
        lanes: int,
    ) -> None:
        self._answer_all = answer_all
        self._size = size
        self._lanes = lanes
        self._waiting: deque[tuple[Q, asyncio.Future[Any]]] = deque()
        #: Runners not yet ended, counted as they end (a done callback would come too late).
        self._running = 0
        #: The runner tasks (kept: a task needs a reference).
        self._runners: set[asyncio.Task[None]] = set()

    async def ask(self, question: Q) -> Any:
        """The answer to ``question``, asked along with whatever else is waiting."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting.append((question, future))
        if self._running < self._lanes:
            self._running += 1
            runner = asyncio.get_running_loop().create_task(self._run())
            self._runners.add(runner)
            runner.add_done_callback(self._runners.discard)
        return await future

    async def _run(self) -> None:
        try:
            await self._answer_waiting()
        finally:
            self._running -= 1

    async def _answer_waiting(self) -> None:
        # Invariant: a runner only ends once no question is waiting, so none is left behind.
        while self._waiting:
            batch = [self._waiting.popleft() for _ in range(min(self._size, len(self._waiting)))]
            batch = [(question, future) for question, future in batch if not future.done()]
            if not batch:
                continue
            try:
                answers = await self._answer_all([question for question, _ in batch])
            except Exception as exc:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for count, ((_, future), answer) in enumerate(zip(batch, answers, strict=True), 1):
                if future.done():
                    continue
                if isinstance(answer, BaseException):
                    future.set_exception(answer)
                else:
                    future.set_result(answer)
                if count % SLICE == 0:
                    # The askers answered go on before the next are: other work on the event
                    # loop (live delivery) waits behind at most a slice of them.
                    await asyncio.sleep(0)
