"""Resuming sockets: what a socket that opted in missed while away, read from the log.

A socket that opts in (``authenticate.resume``) is registered, subscribed and following its
scopes before this runs, its live frames held (``Socket.held``). Then, for a cursor that is
valid (signed for this account, within ``REALTIME_RESUME_WINDOW``) and still covered by the
log (nothing after it trimmed), the log is read from the cursor's position on the channels the
socket hears — its scopes' and the base channel — and each message is planned by the
``Dispatcher`` among the resuming sockets only: today's scopes, subscriptions, ``only`` lists
and audience checks decide, as if the message were published now. The missed frames go out
after ``auth_success``, then the held live frames the log read did not already cover.

Publishers serialize on the log, so every message up to the highest position read had
committed when it was read: a held frame at or below it was read too (if it was this
socket's), one above it was not. That is the seam: no frame twice, none skipped.

Sockets that resume together (a worker restart brings back many at once) are answered in one
batch: one read of the log bounds, one read of the log for the batch's channels, each message
planned once for all the sockets that missed it. They share reads, never a budget: each socket
is refused only for its own reasons — its cursor, the log no longer covering it, more than
``REALTIME_RESUME_MAX_FRAMES`` frames for it, or more than ``SCAN_PER_FRAME`` times that many
messages of its own scopes to scan. A socket refused drops out of the batch at once, its
channels with it, and the read moves on from the oldest cursor still resuming: an old cursor
or a busy scope costs the batch only the pages that socket needed.

Replay's frames are made on the event loop in slices (``SLICE`` sockets at a time), and the sockets
of a batch are answered in slices too: live delivery gets a turn of the loop between them,
so a storm of resumes after a deploy does not hold the worker's live frames back (the
manager sends each socket's missed frames behind live delivery as well, see ``go_live``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from realtime.blocking import run_blocking
from realtime.chunks import chunked
from realtime.conf import conf
from realtime.messages import base_channel, scope_channel
from realtime.sockets.batcher import SLICE
from realtime.sockets.connection import Socket
from realtime.sockets.cursors import cursor_for, position_of
from realtime.sockets.delivery import Dispatcher, read_message, with_cursor
from realtime.sockets.protocol import ResumeAsk
from realtime.transports.base import Transport

logger = logging.getLogger(__name__)

#: Messages read from the log per query.
PAGE: Final = 1000
#: Messages of its scopes a socket's resume reads, at most, per allowed frame: a log busier
#: than this on its scopes is not scanned to the end (that socket starts afresh instead).
SCAN_PER_FRAME: Final = 50


@dataclass
class Resumed:
    """How a socket starts: what ``auth_success`` says, the missed frames, and the position
    it has every frame up to once they are sent (``None``: unknown; see ``Socket.floor``)."""

    cursor: str
    #: ``None`` when no cursor was given (``resumed`` is then left out of ``auth_success``).
    resumed: bool | None
    frames: list[dict[str, Any]]
    floor: int | None


@dataclass(eq=False)
class _Request:
    socket: Socket
    ask: ResumeAsk
    future: asyncio.Future[Resumed]
    after: int | None = None
    frames: list[dict[str, Any]] = field(default_factory=list)
    refused: bool = False
    #: The transport channels it hears (its scopes' and the base channel).
    channels: frozenset[str] = frozenset()
    #: Messages of its channels it may still have read before it is refused.
    scan_left: int = 0


class Resumer:
    """Answers the resumes of one ``SocketManager``, in batches (see the module docstring)."""

    def __init__(self, dispatcher: Dispatcher, transport: Callable[[], Transport]) -> None:
        self.dispatcher = dispatcher
        self.transport = transport
        self._waiting: list[_Request] = []
        self._running: asyncio.Task[None] | None = None

    async def resume(self, socket: Socket, ask: ResumeAsk) -> Resumed:
        """How ``socket`` (registered, every scope it reads followed, its frames held)
        starts."""
        loop = asyncio.get_running_loop()
        request = _Request(socket, ask, loop.create_future())
        self._waiting.append(request)
        if self._running is None or self._running.done():
            self._running = loop.create_task(self._drain())
        return await request.future

    async def _drain(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, []
            try:
                await self._answer(batch)
            except Exception:
                logger.exception("realtime: resuming %d socket(s) failed", len(batch))
                for request in batch:
                    _settle(request, _afresh(request, None))

    async def _answer(self, batch: list[_Request]) -> None:
        transport = self.transport()
        try:
            bounds = await run_blocking(transport.log_bounds)
        except Exception:
            logger.warning("realtime: reading the log's bounds failed", exc_info=True)
            bounds = None
        if bounds is None:
            for request in batch:
                _settle(request, _afresh(request, None))
            return
        first, last = bounds
        resuming = []
        for request in batch:
            request.after = _position(request)
            after = request.after
            covered = after is not None and (
                after == last or (after < last and first is not None and first <= after + 1)
            )
            if covered:
                resuming.append(request)
            else:
                if request.ask.cursor is not None:
                    logger.debug(
                        "realtime: a socket of account %s starts afresh: the cursor is not "
                        "resumable",
                        request.socket.user_id,
                    )
                _settle(request, _afresh(request, last))
        if not resuming:
            return
        try:
            high = await self._replay(transport, resuming, last)
        except Exception:
            logger.warning("realtime: reading the log to resume sockets failed", exc_info=True)
            for request in resuming:
                _settle(request, _afresh(request, last))
            return
        for count, request in enumerate(resuming, 1):
            if request.refused:
                logger.debug(
                    "realtime: a socket of account %s starts afresh: it missed too much",
                    request.socket.user_id,
                )
                _settle(request, _afresh(request, last))
            else:
                _settle(request, Resumed(request.ask.cursor, True, request.frames, high))
            if count % SLICE == 0:
                await asyncio.sleep(0)  # the sockets answered go on before the next are

    async def _replay(self, transport: Transport, resuming: list[_Request], last: int) -> int:
        """Plan what the log holds after each request's position into its frames (refusing
        those that would get too many, or scan too much); return the highest position read."""
        base = base_channel()
        for request in resuming:
            request.channels = frozenset(
                [base, *(scope_channel(scope_id) for scope_id in request.socket.scopes)]
            )
            request.scan_left = conf.RESUME_MAX_FRAMES * SCAN_PER_FRAME
        high = last
        read: int | None = None  # how far the log is read, on the channels still needed
        active = list(resuming)
        while active:
            # From the oldest cursor still resuming: those refused no longer hold it back.
            oldest = min(request.after or 0 for request in active)
            start = oldest if read is None else max(read, oldest)
            channels = sorted(frozenset().union(*(request.channels for request in active)))
            entries = await run_blocking(transport.read_log, channels, start, PAGE)
            for channel, payload, position in entries:
                await self._plan_entry(channel, payload, position, active)
                active = [request for request in active if not request.refused]
            read = entries[-1][2] if entries else start
            high = max(high, read)
            if len(entries) < PAGE:
                break
        return high

    async def _plan_entry(
        self, channel: str, payload: bytes, position: int, active: list[_Request]
    ) -> None:
        """Add the frame one message of the log comes to for each request it is missed by;
        count a scope's message against the scan of each request reading that scope (the
        base channel is every account's: another account's events are not a socket's own
        reason to start afresh, its own count as frames)."""
        scoped = channel != base_channel()
        among = []
        for request in active:
            if request.after is None or request.after >= position:
                continue
            if channel not in request.channels:
                continue
            if scoped:
                request.scan_left -= 1
                if request.scan_left < 0:
                    _refuse(request)
                    continue
            among.append(request)
        message = read_message(payload) if among else None
        if message is None:
            return
        plan = await self.dispatcher.plan(message, [request.socket for request in among])
        if plan is None or plan.frame is None:
            return
        most = conf.RESUME_MAX_FRAMES
        for part in chunked(among, SLICE):
            for request in part:
                socket = request.socket
                if socket in plan.targets:
                    request.frames.append(with_cursor(plan.frame, socket.user_id, position))
                    if len(request.frames) > most:
                        _refuse(request)
            await asyncio.sleep(0)  # a slice: live delivery goes on between them


def _refuse(request: _Request) -> None:
    request.refused = True
    request.frames = []


def _position(request: _Request) -> int | None:
    """The position of the cursor the socket gave, if it is a valid one of its account."""
    cursor = request.ask.cursor
    return None if cursor is None else position_of(request.socket.user_id, cursor)


def _afresh(request: _Request, last: int | None) -> Resumed:
    """Start from now (``last``; ``None``: the log is unknown): nothing is replayed."""
    resumed = None if request.ask.cursor is None else False
    return Resumed(cursor_for(request.socket.user_id, last), resumed, [], last)


def _settle(request: _Request, answer: Resumed) -> None:
    if not request.future.done():
        request.future.set_result(answer)
