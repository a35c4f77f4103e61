"""One connected, authenticated socket as the manager sees it, and how frames reach it.

Frames reach a socket in the order they were handed to it, and no socket ever holds another's
frame. Where the server's ``send`` only buffers and never waits (daphne), the frame is handed
over in place; where it may wait for the network (uvicorn, or a server realtime cannot see
behind), each socket has a writer task of its own that sends its queue in order, each send
bounded by ``REALTIME_SEND_TIMEOUT``.

A socket is not reading when a send does not complete within the timeout, fails, or when its
backlog (what its writer still holds plus what the server has taken but not written, see
``link``) stays above ``STALL_BYTES`` for ``REALTIME_SEND_TIMEOUT`` seconds. The backlog is
observed before each frame is added, never just after (a large frame the client is about to
read is no stall), and at every housekeeping tick; observations count as one run only while
they come at most ``STALL_GAP`` seconds apart, so a backlog the client read long ago never
joins a later one.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from realtime.encoding import normal_id
from realtime.sockets.link import Link, Send, find_link
from realtime.sockets.protocol import ScopeAsk

__all__ = ["STALL_BYTES", "STALL_GAP", "Send", "Socket"]

#: Bytes of backlog a socket may have before it counts as not reading.
STALL_BYTES = 256 * 1024
#: Seconds between two observations of a backlog beyond which they are not one run.
STALL_GAP = 2.5


class Socket:
    """An authenticated connection: who it is, what it reads, what it hears, how to reach it."""

    __slots__ = (
        "_over_since",
        "_queue",
        "_queued",
        "_seen_at",
        "_send",
        "_writer",
        "ask",
        "channels",
        "closed",
        "consumer",
        "link",
        "next_recheck",
        "on_failure",
        "scope_version",
        "scopes",
        "token",
        "user",
        "user_id",
        "watching",
    )

    def __init__(
        self,
        *,
        consumer: Any,
        send: Send,
        user: Any,
        token: str,
        ask: ScopeAsk,
        scopes: dict[Any, str],
        link: Link | None = None,
    ) -> None:
        self.consumer = consumer
        self._send = send
        self.link = link if link is not None else find_link(send)
        self._queue: deque[tuple[dict[str, Any], int]] = deque()
        self._queued = 0
        self._writer: asyncio.Task[None] | None = None
        self._over_since: float | None = None
        self._seen_at = 0.0
        self.user = user
        #: The account's id in its one normalised form (``realtime.encoding.normal_id``).
        self.user_id: Any = normal_id(user.pk)
        self.token = token
        self.ask = ask
        #: Scope id -> slug, in the order the client asked for them.
        self.scopes = scopes
        #: Channels subscribed to; they apply to every scope the socket reads.
        self.channels: set[str] = set()
        #: Bumped by each client ``watch``: an older recheck answer is then discarded.
        self.scope_version = 0
        #: A client ``watch`` is being resolved: the scopes above are about to change.
        self.watching = False
        self.next_recheck = 0.0
        #: Takes no more frames (closing, or closed).
        self.closed = False
        #: Told when a frame this socket's writer holds could not be sent in time.
        self.on_failure: Callable[[Socket], None] | None = None

    @property
    def buffered(self) -> bool:
        """Whether ``send`` only buffers (daphne) rather than waiting for the network."""
        return self.link.buffered

    def backlog(self) -> int:
        """Bytes (characters, for frames the writer still holds) not yet on the network."""
        return self._queued + self.link.pending()

    def stalled(self, timeout: float, now: float | None = None) -> bool:
        """Observe the backlog: whether it has stayed too large for ``timeout`` seconds
        (``now``: the ``time.monotonic()`` of the observation)."""
        if now is None:
            now = time.monotonic()
        if self.backlog() <= STALL_BYTES:
            self._over_since = None
        elif self._over_since is None or now - self._seen_at > STALL_GAP:
            self._over_since = now
        self._seen_at = now
        return self._over_since is not None and now - self._over_since >= timeout

    async def send_frame(self, message: dict[str, Any], timeout: float) -> bool:
        """Hand one ``websocket.send`` message on; ``False`` when the socket is not reading.

        Whatever the server's ``send`` raises means the same: this socket cannot take the
        frame, and it must not keep the others from theirs.
        """
        if self.closed:
            return True
        if self.stalled(timeout):
            return False
        if self.link.buffered:
            try:
                await self._send(message)
            except Exception:
                return False
            return True
        size = len(message["text"])
        self._queue.append((message, size))
        self._queued += size
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._write(timeout))
        return True

    async def _write(self, timeout: float) -> None:
        """Send the queue in order, each send bounded; on a failure tell ``on_failure``."""
        try:
            while self._queue:
                message, size = self._queue[0]
                async with asyncio.timeout(timeout):
                    await self._send(message)
                self._queue.popleft()
                self._queued -= size
        except Exception:
            self._queue.clear()
            self._queued = 0
            if not self.closed and self.on_failure is not None:
                self.on_failure(self)
        finally:
            self._writer = None

    def stop(self) -> bool:
        """Take no more frames and drop those held (idempotent); ``False`` if already so."""
        if self.closed:
            return False
        self.closed = True
        self._queue.clear()
        self._queued = 0
        if self._writer is not None:
            self._writer.cancel()
        return True

    async def close(self, code: int, answer_within: float = 5.0) -> None:
        """Stop and close the connection with ``code`` (once)."""
        if self.stop():
            await self.shut(code, answer_within)

    async def shut(self, code: int, answer_within: float) -> None:
        """Close the connection with ``code`` whether stopped or not (see ``Link.shut``)."""
        await self.link.shut(self._send, code, answer_within)
