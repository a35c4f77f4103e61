"""The server connection behind a socket's ASGI ``send``: its output backlog and its close.

ASGI gives an application one ``send`` per connection, and servers differ behind it:

* daphne's appends to the Twisted transport's output buffer and never waits, so only the
  size of that buffer tells a client that stopped reading; and it relays ``websocket.close``
  through autobahn's ``sendClose``, which refuses the protocol's own codes (1008, 1009, 1011).
  The close frame goes straight to autobahn instead.
* uvicorn's (and other asyncio servers') waits while the transport's write buffer is above its
  high-water mark: the send itself is bounded, and the buffer's size is the backlog.

Middleware hands the application a ``send`` of its own that calls the server's: Channels'
``AuthMiddlewareStack`` a bound method of a wrapper object keeping the real one as an
attribute, others a closure, a ``functools.partial`` or a ``functools.wraps`` wrapper.
``find_link`` looks through such wrappers, a bounded number of steps and without calling
anything, for the server's connection. Where it finds none under daphne (Twisted drives the
event loop), it says so once in a warning: slow sockets then go unnoticed and close codes
other than 1000 cannot be sent.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import sys
import types
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

logger = logging.getLogger(__name__)

Send = Callable[[dict[str, Any]], Awaitable[None]]

#: Objects looked at, at most, to find the server's connection behind a ``send``.
SEARCH_STEPS = 64

#: Values that are never a wrapper of ``send``: data, classes, modules.
_SKIPPED = (
    str, bytes, bytearray, int, float, bool, type(None), dict, list, tuple, set, frozenset,
    type, types.ModuleType,
)  # fmt: skip


class Link:
    """A connection known only through ``send``: the send may wait, there is no backlog.

    ``codes``: whether the server closes with any code it is given (daphne, unseen, only
    closes with 1000 or 3000-4999 and fails on the protocol's codes).
    """

    __slots__ = ("codes",)

    #: ``send`` only appends to a server buffer and never waits for the network.
    buffered = False

    def __init__(self, codes: bool = True) -> None:
        self.codes = codes

    def pending(self) -> int:
        """Bytes the server has taken but not yet written to the network."""
        return 0

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


class TwistedLink(Link):
    """Daphne's connection: an autobahn protocol over a Twisted TCP transport."""

    __slots__ = ("protocol",)

    buffered = True

    def __init__(self, protocol: Any) -> None:
        super().__init__()
        self.protocol = protocol

    def pending(self) -> int:
        transport = self.protocol.transport
        if transport is None:  # the connection is gone
            return 0
        # A Twisted FileDescriptor: written data waits in dataBuffer (from offset), then in
        # _tempDataBuffer (_tempDataLen bytes).
        return len(transport.dataBuffer) - transport.offset + transport._tempDataLen  # type: ignore[no-any-return]

    def open(self) -> bool:
        return bool(self.protocol.state == self.protocol.STATE_OPEN)

    async def close(self, send: Send, code: int, answer_within: float | None) -> None:
        """Send autobahn's close frame, giving the peer ``answer_within`` seconds to answer
        (one that stopped reading has its backlog to get through first), then autobahn cuts
        the connection."""
        protocol = self.protocol
        if protocol.state != protocol.STATE_OPEN:
            return
        current = getattr(protocol, "closeHandshakeTimeout", None)
        if answer_within is not None and current is not None:
            protocol.closeHandshakeTimeout = max(current, answer_within)
        protocol.sendCloseFrame(code=int(code), isReply=False)


class AsyncioLink(Link):
    """A connection over an asyncio transport (uvicorn): its write buffer is the backlog."""

    __slots__ = ("transport",)

    def __init__(self, transport: Any) -> None:
        super().__init__()
        self.transport = transport

    def pending(self) -> int:
        return int(self.transport.get_write_buffer_size())

    def open(self) -> bool:
        return not self.transport.is_closing()

    def abort(self) -> None:
        self.transport.abort()


def find_link(send: Send) -> Link:
    """The server connection behind ``send``, looking through middleware's wrappers."""
    seen: set[int] = set()
    queue: deque[Any] = deque([send])
    while queue and len(seen) < SEARCH_STEPS:
        node = queue.popleft()
        if id(node) in seen or isinstance(node, _SKIPPED):
            continue
        seen.add(id(node))
        link = _link_of(node)
        if link is not None:
            return link
        queue.extend(_inner(node))
    if _twisted_drives_the_loop():
        # Daphne behind a send this module cannot see through: a close with the protocol's
        # codes would fail in autobahn, so it closes with 1000.
        _warn_once(send)
        return Link(codes=False)
    return Link()


def _link_of(node: Any) -> Link | None:
    transport = _attribute(node, "transport")
    if transport is None:
        return None
    pair = (type(node), type(transport))
    try:
        kind = _kinds[pair]
    except KeyError:
        kind = _kinds[pair] = _kind_of(node, transport)
    if kind is TwistedLink:
        return TwistedLink(node)
    if kind is AsyncioLink:
        return AsyncioLink(transport)
    return None


#: The kind of connection of a node's class with a transport's class, decided on first sight:
#: looking attributes up statically through autobahn's classes costs more than the rest of
#: the search.
_kinds: dict[tuple[type, type], type[Link] | None] = {}


def _kind_of(node: Any, transport: Any) -> type[Link] | None:
    if _has(node, "sendCloseFrame") and _has(node, "STATE_OPEN") and _has(transport, "dataBuffer"):
        return TwistedLink
    if _has(transport, "get_write_buffer_size") and _has(transport, "abort"):
        return AsyncioLink
    return None


def _inner(node: Any) -> Iterator[Any]:
    """What a wrapper may call: a partial's function and arguments, a method's object, a
    function's closure and ``__wrapped__``, an object's callable attributes."""
    if isinstance(node, functools.partial):
        yield from node.args
        yield from node.keywords.values()
        yield node.func
    elif isinstance(node, types.MethodType):
        yield node.__self__
    elif isinstance(node, types.FunctionType):
        wrapped = node.__dict__.get("__wrapped__")
        if wrapped is not None:
            yield wrapped
        for cell in node.__closure__ or ():
            try:
                yield cell.cell_contents
            except ValueError:  # an empty cell
                continue
    else:
        for value in _attributes(node):
            if callable(value) or _attribute(value, "transport") is not None:
                yield value


def _attributes(node: Any) -> Iterator[Any]:
    try:
        namespace = object.__getattribute__(node, "__dict__")
    except AttributeError:  # no __dict__
        namespace = None
    if isinstance(namespace, dict):
        yield from list(namespace.values())
    for klass in type(node).__mro__:
        for name in klass.__dict__.get("__slots__", ()):
            value = _attribute(node, name)
            if value is not None:
                yield value


def _attribute(node: Any, name: str) -> Any:
    """An attribute read without running a property or ``__getattr__`` (lazy objects stay
    lazy)."""
    try:
        value = inspect.getattr_static(node, name)
    except AttributeError:
        return None
    # A slot's descriptor is read for real: it runs no code of the object's.
    if isinstance(value, types.MemberDescriptorType):
        try:
            return value.__get__(node, type(node))
        except AttributeError:
            return None
    if isinstance(value, property | types.GetSetDescriptorType):
        return None
    return value


def _has(node: Any, name: str) -> bool:
    try:
        inspect.getattr_static(node, name)
    except AttributeError:
        return False
    return True


def _twisted_drives_the_loop() -> bool:
    """Whether this event loop is run by Twisted's asyncio reactor (daphne)."""
    reactor = sys.modules.get("twisted.internet.reactor")
    if reactor is None:
        return False
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return False
    return getattr(reactor, "_asyncioEventloop", None) is loop


_warned = False


def _warn_once(send: Send) -> None:
    global _warned
    if _warned:
        return
    _warned = True
    logger.warning(
        "realtime: daphne's connection could not be found behind the ASGI send this "
        "application was given (%s): sockets that stop reading are not noticed, and refusals "
        "close with 1000 instead of 1008. Let the middleware keep the send it wraps as an "
        "attribute, a closure or a functools.partial.",
        type(send).__qualname__,
    )
