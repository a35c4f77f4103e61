"""A socket's incoming ASGI messages as the consumer reads them, within the frame limits.

The consumer reads one message at a time. While it resolves the handshake (the bearer, its
scopes, the listener) it keeps watching the client: a disconnect abandons the handshake, and
frames that arrive meanwhile are held, in order, until ``auth_success`` has gone out.

The limits apply from the first frame after ``authenticate``, held or not: each frame is
counted in the frame-rate window when it is read from the server (the window starts with the
first of them, see ``limits.FrameWindow``), then checked against ``REALTIME_MAX_FRAME_SIZE``.
A frame over either limit ends the socket at once — during the handshake too, when no
``auth_success`` or ``auth_error`` is sent — so at most ``REALTIME_FRAME_LIMIT`` frames, each
within the size, are ever held.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from realtime import limits
from realtime.conf import conf
from realtime.sockets.limits import FrameWindow, log_bad_input
from realtime.sockets.protocol import CloseCode

Message = dict[str, Any]


class ClientGoneError(Exception):
    """The client disconnected."""


class OverLimitError(Exception):
    """A frame broke a limit; the socket closes with ``code``."""

    def __init__(self, code: CloseCode) -> None:
        super().__init__(code)
        self.code = code


class Inbox:
    """The messages of one socket: see the module docstring."""

    __slots__ = ("_held", "_pending", "_receive", "_window", "code")

    def __init__(self, receive: Callable[[], Awaitable[Message]]) -> None:
        self._receive = receive
        #: Frames read while the handshake was resolved: already counted and checked (made
        #: on first use).
        self._held: deque[Message] | None = None
        self._pending: asyncio.Future[Message] | None = None
        self._window = FrameWindow()
        #: The close code of the client's disconnect, once it left.
        self.code: int | None = None

    async def next(self) -> Message:
        """The next message, not counted (the handshake's first frame); raise when the
        client left."""
        if self._held:
            return self._held.popleft()
        if self._pending is not None:
            pending, self._pending = self._pending, None
            return self._arrived(await pending)
        return self._arrived(await self._receive())

    async def next_frame(self) -> Message:
        """The next message, a frame counted and checked against the limits unless it was
        already, when held; raise ``OverLimitError`` for one over a limit."""
        if self._held:
            return self._held.popleft()
        message = await self.next()
        self._check(message)
        return message

    async def watching(self, work: Awaitable[Any]) -> Any:
        """Await ``work`` while reading the client: frames it sends meanwhile are checked and
        held; if it leaves or breaks a limit, ``work`` is abandoned and the error raised."""
        task = asyncio.ensure_future(work)
        try:
            while True:
                if self._pending is None:
                    self._pending = asyncio.ensure_future(self._receive())
                done, _ = await asyncio.wait(
                    {task, self._pending}, return_when=asyncio.FIRST_COMPLETED
                )
                if self._pending in done:
                    message = self._arrived(self._pending.result())
                    self._pending = None
                    self._check(message)
                    if self._held is None:
                        self._held = deque()
                    self._held.append(message)
                    continue
                return task.result()
        finally:
            if not task.done():
                task.cancel()

    def close(self) -> None:
        """Stop reading (the socket is done)."""
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None

    def _arrived(self, message: Message) -> Message:
        if message.get("type") == "websocket.disconnect":
            self.code = message.get("code")
            raise ClientGoneError
        return message

    def _check(self, message: Message) -> None:
        if message.get("type") != "websocket.receive":
            return
        if not self._window.admit():
            log_bad_input(
                "realtime: closed a socket sending more than %d frames in %ss",
                conf.FRAME_LIMIT,
                limits.FRAME_WINDOW,
            )
            raise OverLimitError(CloseCode.POLICY_VIOLATION)
        text = message.get("text")
        if isinstance(text, str) and len(text) > conf.MAX_FRAME_SIZE:
            log_bad_input("realtime: closed a socket sending a frame of %d characters", len(text))
            raise OverLimitError(CloseCode.MESSAGE_TOO_BIG)
