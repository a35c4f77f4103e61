"""The server connection behind a socket's ASGI ``send``: its backlog and its close.

ASGI gives an application one ``send`` per connection, and servers differ behind it:

* daphne's appends to the Twisted transport's output buffer and never waits, so only the size
  of the output waiting tells a client that stopped reading; and it relays ``websocket.close``
  through autobahn's ``sendClose``, which refuses the protocol's own codes (1008, 1009, 1011,
  1012).
* uvicorn's waits while the transport's write buffer is above its high-water mark: the send
  itself is bounded, and the buffer's size is the backlog.

Under both, the backlog (``Link.pending``) is the server's buffer *plus the kernel's send
queue* of the connection (``realtime.compat.kernel``): the kernel takes what the server writes
until its send buffer, autotuned to megabytes, is full, and a client sent small frames can stop
reading with all of them there. Measured in the server alone, thousands of such frames leave
its buffer empty: daphne's socket never looks stalled, and uvicorn's send never waits.

The kernel's share costs a system call (3.5 µs), which observed before every frame was a
tenth of a fanning-out worker's time. So it is read only when it could matter: the backlog
cannot have grown by more than what was handed to the server since it was last read, and
while that sum (``most``) is small, no reading could find the socket over the stall bound,
and none is made.

Neither server documents a way to reach its connection, so that is done by the seams of
``realtime.compat``, one per library, each recognizing exactly one known shape of ``send`` and
checking once per process (its self-test) that the internals it reads are there. ``find_link``
asks them about the ``send`` the consumer was given, looking through Channels' session
middleware (``AuthMiddlewareStack``), and about the server's own ``send`` when
``SocketOriginValidator`` wrapped the route outermost and recorded it in the scope
(``SERVER_SEND``). Anything else is never guessed at: one ERROR line per process names the
``send`` and the cure, a metric counts each socket served so, and the socket is served through
ASGI alone (``Link``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import types
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from realtime import metrics
from realtime.compat import channels, daphne, kernel, uvicorn

logger = logging.getLogger(__name__)

Send = Callable[[dict[str, Any]], Awaitable[None]]

#: The scope key under which ``SocketOriginValidator`` records the ``send`` it was given.
SERVER_SEND = "realtime.server_send"
#: Why a socket is served without slow-socket protection (a label of the metric): a ``send``
#: no seam knows, or the seam of that server is off (its self-test failed, or this connection
#: is of a kind it cannot measure).
UNKNOWN_SEND = "unknown_send"


class Link:
    """A connection known only through ``send``: there is no backlog to read, nor a
    connection to cut.

    ``codes``: whether the server closes with any code it is given (daphne, unseen, only
    closes with 1000 or 3000-4999 and fails on the protocol's codes). ``buffered``: whether
    ``send`` only appends to a server buffer and never waits for the network.
    """

    __slots__ = ("_handed", "_read", "buffered", "codes")

    def __init__(self, codes: bool = True, buffered: bool = False) -> None:
        self.codes = codes
        self.buffered = buffered
        #: ``pending()`` at its last call, and the bytes handed to the server since: the
        #: backlog cannot have grown by more than those and what the server wrote of its own
        #: accord (what leaves the server's buffer goes on to the kernel's queue, and from
        #: there to the network).
        self._read = 0
        self._handed = 0

    def pending(self) -> int:
        """Bytes the server has taken but not yet sent on the network: its buffer and the
        kernel's send queue, read now."""
        self._read = self.buffer() + kernel.unsent(self.handle())
        self._handed = 0
        return self._read

    def most(self) -> int:
        """At least ``pending()``, without reading the kernel's queue: the last reading,
        plus everything handed to the server since, plus its buffer now (which may hold
        what it wrote of its own accord since; and what it wrote and sent on meanwhile,
        pongs and pings, is a few bytes)."""
        return self.buffer() + self._read + self._handed

    def handed(self, size: int) -> None:
        """``size`` bytes were handed to the server (on their way to the kernel's queue)."""
        self._handed += size

    def buffer(self) -> int:
        """Bytes the server has taken and not yet written to the kernel."""
        return 0

    def handle(self) -> kernel.Handle | None:
        """The connection's socket, whose kernel send queue is read (``None``: unknown)."""
        return None

    def open(self) -> bool:
        """Whether the connection may still take frames (``False``: the client is leaving)."""
        return True

    async def close(self, send: Send, code: int, answer_within: float | None) -> None:
        """Send the close frame with ``code``; ``answer_within`` is how long the peer has."""
        message: dict[str, Any] = {"type": "websocket.close"}
        if self.codes:
            message["code"] = int(code)
        await send(message)

    def abort(self) -> None:
        """Cut the connection (the peer did not answer the close in time)."""

    def let_go(self, within: float) -> None:
        """The application is done with the connection: cut it if the server still holds
        bytes for it ``within`` seconds from now (see ``AsyncioLink.let_go``)."""

    async def shut(self, send: Send, code: int, answer_within: float) -> None:
        """Close with ``code``, giving the peer ``answer_within`` seconds; then cut it.

        Never raises: a connection already gone has nothing more to be told.
        """
        try:
            await asyncio.wait_for(self.close(send, code, answer_within), answer_within)
        except TimeoutError:
            self.abort()
        except Exception:
            logger.debug("realtime: closing a socket that is already gone")


class DaphneLink(Link):
    """daphne's connection (``realtime.compat.daphne``): its buffer, the kernel's queue under
    it, autobahn's close."""

    __slots__ = ("connection",)

    def __init__(self, connection: daphne.Connection, buffered: bool) -> None:
        super().__init__(buffered=buffered)
        self.connection = connection

    def buffer(self) -> int:
        return self.connection.pending()

    def handle(self) -> kernel.Handle | None:
        return self.connection.socket  # type: ignore[no-any-return]

    def open(self) -> bool:
        return self.connection.open()

    async def close(self, send: Send, code: int, answer_within: float | None) -> None:
        """Send autobahn's close frame, giving the peer ``answer_within`` seconds to answer
        (one that stopped reading has its backlog to get through first), then autobahn cuts
        the connection."""
        self.connection.close(code, answer_within)


class AsyncioLink(Link):
    """A connection over an asyncio transport (uvicorn): its write buffer is the backlog."""

    __slots__ = ("socket", "transport")

    def __init__(self, transport: uvicorn.Transport) -> None:
        super().__init__()
        self.transport = transport
        #: asyncio's public ``get_extra_info("socket")``: the kernel's queue is read through it.
        self.socket: kernel.Handle | None = transport.get_extra_info("socket")

    def buffer(self) -> int:
        return int(self.transport.get_write_buffer_size())

    def handle(self) -> kernel.Handle | None:
        return self.socket

    def open(self) -> bool:
        return not self.transport.is_closing()

    def abort(self) -> None:
        self.transport.abort()

    def let_go(self, within: float) -> None:
        """Cut the connection ``within`` seconds from now if its buffer still holds bytes.

        asyncio closes a transport only once its buffer is sent, and a client that stopped
        reading never takes it: the connection, and the buffer, would stay for as long as the
        client keeps it open, and a stopping uvicorn, which closes its sockets 1012 and ends
        their applications with ``websocket.disconnect``, waits for it without end. The
        close frame is at the end of that buffer: a client reading its backlog gets it in
        time, as a send is given ``REALTIME_SEND_TIMEOUT`` before its socket is dropped.
        """
        if self.buffer():
            asyncio.get_running_loop().call_later(within, self._cut_if_held)

    def _cut_if_held(self) -> None:
        if self.buffer():
            self.abort()


def record_server_send(scope: MutableMapping[str, Any], send: Any) -> dict[str, Any]:
    """A copy of ``scope`` recording ``send`` as the server's, unless a wrapper further out
    recorded one already (the outermost is nearest the server)."""
    if SERVER_SEND in scope:
        return dict(scope)
    return {**scope, SERVER_SEND: send}


def find_link(send: Send, scope: MutableMapping[str, Any] | None = None) -> Link:
    """The server connection behind ``send`` (or behind the server's ``send`` recorded in
    ``scope``); a plain ``Link``, reported, when no seam knows either."""
    check_loaded()
    found = _link_of(send, in_place=True)
    if found is not None:
        return found
    recorded = scope.get(SERVER_SEND) if scope is not None else None
    if recorded is not None:
        # The consumer's own send passes through middleware that may wait: frames go out
        # through a writer task of their own, even under daphne.
        found = _link_of(recorded, in_place=False)
        if found is not None:
            return found
    nearest = _peeled(send if recorded is None else recorded)
    if channels.in_test_communicator(nearest):
        return Link()  # a test's socket in its own process: no server behind it
    return _unknown(send if recorded is None else recorded, recorded is not None)


def _peeled(send: object) -> object:
    """``send``, or the one behind Channels' session middleware when it is that."""
    if channels.loaded() and _checked("channels", channels.check):
        return channels.unwrap(send)
    return send


def _link_of(send: object, in_place: bool) -> Link | None:
    """The link of a ``send`` a seam knows (``in_place``: frames may be handed to it directly
    where the server's send never waits); ``None`` when none does."""
    send = _peeled(send)
    if daphne.loaded():
        connection = daphne.connection_of(send)
        if connection is not None:
            if not _checked("daphne", daphne.check):
                return _unprotected("daphne", Link(codes=False))
            if connection.transport is None:
                metrics.unprotected_socket("daphne")
            return DaphneLink(connection, buffered=in_place)
    if uvicorn.loaded():
        found = uvicorn.connection_of(send)
        if found is not None:
            if not _checked("uvicorn", uvicorn.check) or found.transport is None:
                return _unprotected("uvicorn", Link())
            return AsyncioLink(found.transport)
    return None


def _unprotected(reason: str, link: Link) -> Link:
    metrics.unprotected_socket(reason)
    return link


# Self-tests --------------------------------------------------------------------------------

#: The seams whose self-test ran in this process, and its verdict.
_verdicts: dict[str, bool] = {}


def _checked(name: str, check: Callable[[], bool]) -> bool:
    """The verdict of a seam's self-test, run (and recorded in the metric) on first use."""
    verdict = _verdicts.get(name)
    if verdict is None:
        verdict = _verdicts[name] = check()
        metrics.slow_socket_protection(name, verdict)
    return verdict


def _always() -> bool:
    return True


#: Each seam: its name (the metric's label), whether its library is loaded, its self-test.
SEAMS: tuple[tuple[str, Callable[[], bool], Callable[[], bool]], ...] = (
    ("daphne", daphne.loaded, daphne.check),
    ("uvicorn", uvicorn.loaded, uvicorn.check),
    ("channels", channels.loaded, channels.check),
    ("kernel", _always, kernel.check),
)


def check_loaded() -> None:
    """Run the self-test of each seam whose library is loaded, once per process."""
    for name, loaded, check in SEAMS:
        if name not in _verdicts and loaded():
            _checked(name, check)


def check_starting_server() -> None:
    """Run daphne's self-test if daphne's command is starting this process (daphne runs no
    lifespan events: this is called when Django's apps are ready). uvicorn loads its
    WebSocket protocol after the application: its self-test runs at the first socket."""
    if daphne.starting():
        _checked("daphne", daphne.check)


# Sends no seam knows -----------------------------------------------------------------------

_unknown_reported = False


def _unknown(send: object, from_server: bool) -> Link:
    """Serve a socket through ASGI alone; say so once per process. ``from_server``: ``send``
    is the one ``SocketOriginValidator`` was given, outermost (the server's own)."""
    global _unknown_reported
    under_daphne = daphne.serving()
    metrics.unprotected_socket(UNKNOWN_SEND)
    if not _unknown_reported:
        _unknown_reported = True
        kind = _name(send)
        if under_daphne:
            lost = (
                "sockets that stop reading go unnoticed until daphne's ping timeout, and "
                "refusals and limits close with 1000 instead of the protocol's codes (1008, "
                "1009, 1011, 1012)"
            )
        else:
            lost = (
                "what the server holds for them is not counted and their connection cannot be "
                "cut, though a send that waits REALTIME_SEND_TIMEOUT still closes them"
            )
        if from_server:
            logger.error(
                "realtime: slow-socket protection is off: the server's own ASGI send (%s, as "
                "SocketOriginValidator received it) is neither daphne's nor uvicorn's; %s.",
                kind,
                lost,
            )
        else:
            logger.error(
                "realtime: slow-socket protection %s off for sockets behind an ASGI send "
                "of type %s, which realtime does not look inside: %s. Wrap the socket route "
                "in realtime.origins.SocketOriginValidator, outermost, to hand realtime the "
                "server's own send.",
                "and the protocol's close codes are" if under_daphne else "is",
                kind,
                lost,
            )
    return Link(codes=not under_daphne)


def _name(send: object) -> str:
    """The type of ``send`` and, for a function, a method or a partial, what it calls; read
    without calling anything of it."""
    kind = type(send)
    function: object = None
    if isinstance(send, types.MethodType):
        function = send.__func__
    elif isinstance(send, functools.partial):
        function = send.func
        if isinstance(function, types.MethodType):
            function = function.__func__
    elif isinstance(send, types.FunctionType):
        function = send
    if isinstance(function, types.FunctionType):
        return f"{kind.__qualname__} {function.__module__}.{function.__qualname__}"
    return f"{kind.__module__}.{kind.__qualname__}"
