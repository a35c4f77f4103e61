"""One connected, authenticated socket as the manager sees it, and how frames reach it.

Daphne's ASGI ``send`` never waits for the network: it appends to the connection's output
buffer, so a timeout around it never fires while a client that stopped reading grows the
server's memory. For daphne the socket therefore watches the bytes still waiting in its
Twisted transport (reachable through the ``send`` partial daphne hands the application): above
``STALL_BYTES`` for longer than ``REALTIME_SEND_TIMEOUT``, the socket is not reading and is
dropped. Under servers whose ``send`` awaits the network (uvicorn), the send itself is bounded.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any

from realtime.encoding import normal_id
from realtime.sockets.protocol import ScopeAsk

Send = Callable[[dict[str, Any]], Awaitable[None]]

#: Bytes of output a daphne socket may have waiting before it counts as not reading.
STALL_BYTES = 256 * 1024


def _daphne_transport(send: Send) -> Any:
    """The Twisted transport behind daphne's ``send``, or ``None`` under another server."""
    if isinstance(send, functools.partial) and send.args:
        transport = getattr(send.args[0], "transport", None)
        if transport is not None and hasattr(transport, "dataBuffer"):
            return transport
    return None


def _daphne_protocol(send: Send) -> Any:
    if isinstance(send, functools.partial) and send.args:
        protocol = send.args[0]
        if hasattr(protocol, "sendCloseFrame") and hasattr(protocol, "STATE_OPEN"):
            return protocol
    return None


async def close_connection(send: Send, code: int, answer_within: float | None = None) -> None:
    """Close a WebSocket with ``code``.

    Daphne relays an ASGI ``websocket.close`` through autobahn's ``sendClose``, which only
    accepts 1000 and 3000-4999 (codes an application may pick), so the protocol's own codes
    (1008, 1009, 1011) go straight to autobahn's close frame; other servers get the message.
    ``answer_within`` gives a peer longer than autobahn's second to answer the close (one that
    stopped reading has its backlog to get through first); then the connection is cut.
    """
    protocol = _daphne_protocol(send)
    if protocol is None:
        await send({"type": "websocket.close", "code": int(code)})
    elif protocol.state == protocol.STATE_OPEN:
        current = getattr(protocol, "closeHandshakeTimeout", None)
        if answer_within is not None and current is not None:
            protocol.closeHandshakeTimeout = max(current, answer_within)
        protocol.sendCloseFrame(code=int(code), isReply=False)


def pending_bytes(transport: Any) -> int:
    """Bytes a Twisted TCP transport has accepted but not yet written to the network."""
    buffered = len(getattr(transport, "dataBuffer", b"")) - int(getattr(transport, "offset", 0))
    return buffered + int(getattr(transport, "_tempDataLen", 0))


class Socket:
    """An authenticated connection: who it is, what it reads, what it hears, how to reach it."""

    __slots__ = (
        "_send",
        "_stalled_since",
        "_transport",
        "ask",
        "channels",
        "closed",
        "consumer",
        "next_recheck",
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
    ) -> None:
        self.consumer = consumer
        self._send = send
        self._transport = _daphne_transport(send)
        self._stalled_since: float | None = None
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
        self.closed = False

    @property
    def buffered(self) -> bool:
        """Whether ``send`` only buffers (daphne) rather than waiting for the network."""
        return self._transport is not None

    def stalled(self, timeout: float) -> bool:
        """Whether a buffered socket has had too much output waiting for too long."""
        return self._transport is not None and self._stalled(timeout)

    async def send_frame(self, message: dict[str, Any], timeout: float) -> bool:
        """Send one ``websocket.send`` message; ``False`` when the socket is not reading.

        Whatever the server's ``send`` raises means the same: this socket cannot take the
        frame, and it must not keep the others from theirs.
        """
        if self.closed:
            return True
        try:
            if self._transport is not None:
                await self._send(message)
                return not self._stalled(timeout)
            await asyncio.wait_for(self._send(message), timeout)
        except Exception:
            return False
        return True

    def _stalled(self, timeout: float) -> bool:
        if pending_bytes(self._transport) <= STALL_BYTES:
            self._stalled_since = None
            return False
        now = time.monotonic()
        if self._stalled_since is None:
            self._stalled_since = now
        return now - self._stalled_since >= timeout

    async def close(self, code: int, timeout: float = 5.0) -> None:
        """Close the connection with ``code`` (once), waiting at most ``timeout`` seconds."""
        if self.closed:
            return
        self.closed = True
        try:
            await asyncio.wait_for(close_connection(self._send, code, timeout), timeout)
        except Exception:  # the connection is gone or stuck: nothing more to tell it
            return
