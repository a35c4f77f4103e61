"""daphne: the connection behind the ASGI ``send`` it hands an application, its backlog, its
close, and the moment it stops.

daphne hands each connection ``functools.partial(server.handle_reply, protocol)``, where
``protocol`` is a ``daphne.ws_protocol.WebSocketProtocol``: an autobahn WebSocket protocol over
a Twisted TCP transport. ``connection_of`` recognizes exactly that shape and nothing else. Two
things realtime needs have no public interface in daphne, autobahn or Twisted:

* **The backlog.** daphne's ``send`` never waits: it writes to the Twisted transport, which
  buffers without bound. Twisted's ``ITransport`` cannot say how much is waiting, and its
  producer interface (``IPushProducer`` through ``registerProducer``) only says that the buffer
  went past 64 KiB at some write and, later, that it was wholly written: neither a size nor a
  steady reader's backlog below the bound. So ``Connection.pending`` reads the buffer of
  Twisted's ``FileDescriptor`` (the base of its TCP and Unix transports): ``dataBuffer`` from
  ``offset``, plus ``_tempDataLen``.
* **The close.** daphne relays ``websocket.close`` through autobahn's ``sendClose``, which
  accepts only 1000 and 3000-4999: the protocol's 1008, 1009, 1011 and 1012 would fail there.
  ``Connection.close`` calls autobahn's ``sendCloseFrame`` instead, and first raises the
  protocol's ``closeHandshakeTimeout`` (an autobahn option, copied to each protocol) so that a
  peer with a backlog to read has time to answer before autobahn cuts the connection.

The classes are taken from ``sys.modules``, never imported: importing ``daphne.server``
installs Twisted's reactor, which a process daphne does not serve must not get. ``check`` is
the self-test: it runs once per process and, where something above is not there, says so in
one ERROR line naming the versions, and realtime then serves daphne's sockets through ASGI
alone.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import sys
import types
from collections.abc import Awaitable, Callable
from functools import partial
from importlib import metadata
from typing import Any

logger = logging.getLogger(__name__)

SERVER_MODULE = "daphne.server"
PROTOCOL_MODULE = "daphne.ws_protocol"
#: The module of daphne's command line, loaded when the ``daphne`` command starts a server.
COMMAND_MODULE = "daphne.cli"
FILE_DESCRIPTOR_MODULE = "twisted.internet.abstract"
REACTOR_MODULE = "twisted.internet.reactor"
DEFER_MODULE = "twisted.internet.defer"
#: The distributions whose internals are read, named in the log.
DISTRIBUTIONS = ("daphne", "Twisted", "autobahn")


def loaded() -> bool:
    """Whether daphne is loaded in this process (it may serve, or only be installed)."""
    return SERVER_MODULE in sys.modules


def starting() -> bool:
    """Whether the ``daphne`` command is starting a server in this process."""
    return COMMAND_MODULE in sys.modules


def serving() -> bool:
    """Whether Twisted's reactor runs in this process, as it does under daphne: its
    ``running`` flag is public (``IReactorCore``)."""
    reactor = sys.modules.get(REACTOR_MODULE)
    return bool(getattr(reactor, "running", False))


def before_stop(callback: Callable[[], Awaitable[None]]) -> bool:
    """Have Twisted's reactor await ``callback()`` before it shuts down (daphne stopping on
    SIGTERM or SIGINT), while the connections are still open: Twisted's public
    ``addSystemEventTrigger``, the coroutine handed over as a ``Deferred`` (``fromFuture``),
    which the shutdown waits for. ``False`` where no reactor runs."""
    reactor = sys.modules.get(REACTOR_MODULE)
    defer = sys.modules.get(DEFER_MODULE)
    add_trigger = getattr(reactor, "addSystemEventTrigger", None)
    deferred_class = getattr(defer, "Deferred", None)
    if not serving() or not callable(add_trigger) or deferred_class is None:
        return False

    def trigger() -> Any:
        return deferred_class.fromFuture(asyncio.ensure_future(callback()))

    add_trigger("before", "shutdown", trigger)
    return True


def versions() -> str:
    """The versions of the distributions this module reads, for the log."""
    return ", ".join(f"{name} {_version(name)}" for name in DISTRIBUTIONS)


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "(version unknown)"


class Connection:
    """daphne's side of one socket: autobahn's protocol, and the Twisted transport under it.

    ``transport`` is ``None`` when it is not a Twisted ``FileDescriptor`` (daphne serving TLS
    itself, say): its backlog cannot be read, and ``pending`` is 0. ``socket`` is the
    transport's socket, from Twisted's public ``ISystemHandle.getHandle()`` (TCP and Unix
    transports have it): the kernel's queue under the transport's buffer is read through it.
    """

    __slots__ = ("protocol", "socket", "transport")

    def __init__(self, protocol: Any, transport: Any) -> None:
        self.protocol = protocol
        self.transport = transport
        get_handle = getattr(transport, "getHandle", None)
        self.socket: Any = get_handle() if callable(get_handle) else None

    def pending(self) -> int:
        """Bytes the transport has taken but not written to the kernel."""
        transport = self.transport
        if transport is None:
            return 0
        # Written data waits in dataBuffer (from offset), then in _tempDataBuffer, whose
        # length is _tempDataLen.
        return len(transport.dataBuffer) - transport.offset + transport._tempDataLen  # type: ignore[no-any-return]

    def open(self) -> bool:
        """Whether autobahn still counts the connection as open."""
        protocol = self.protocol
        return bool(getattr(protocol, "state", None) == protocol.STATE_OPEN)

    def close(self, code: int, answer_within: float | None) -> None:
        """Send the close frame with ``code``; the peer has ``answer_within`` seconds (at least
        autobahn's own timeout) to answer before autobahn cuts the connection."""
        protocol = self.protocol
        if getattr(protocol, "state", None) != protocol.STATE_OPEN:
            return
        current = getattr(protocol, "closeHandshakeTimeout", None)
        if answer_within is not None and current is not None:
            protocol.closeHandshakeTimeout = max(current, answer_within)
        protocol.sendCloseFrame(code=int(code), isReply=False)


def connection_of(send: object) -> Connection | None:
    """daphne's connection when ``send`` is exactly what daphne hands an application; else
    ``None``. A connection whose transport cannot be measured is reported once."""
    if type(send) is not partial or send.keywords or len(send.args) != 1:
        return None
    server_module = sys.modules.get(SERVER_MODULE)
    protocol_module = sys.modules.get(PROTOCOL_MODULE)
    if server_module is None or protocol_module is None:
        return None
    server_class = getattr(server_module, "Server", None)
    method = send.func
    if (
        type(method) is not types.MethodType
        or server_class is None
        or method.__func__ is not getattr(server_class, "handle_reply", None)
        or not isinstance(method.__self__, server_class)
    ):
        return None
    protocol = send.args[0]
    if type(protocol) is not getattr(protocol_module, "WebSocketProtocol", None):
        return None
    transport = getattr(protocol, "transport", None)
    if not isinstance(transport, _file_descriptor_class()):
        _report_unmeasured(transport)
        transport = None
    return Connection(protocol, transport)


def _file_descriptor_class() -> type:
    module = sys.modules.get(FILE_DESCRIPTOR_MODULE)
    found = getattr(module, "FileDescriptor", None)
    return found if isinstance(found, type) else _Nothing


class _Nothing:
    """A class nothing is an instance of."""


_unmeasured_reported = False


def _report_unmeasured(transport: object) -> None:
    global _unmeasured_reported
    if _unmeasured_reported:
        return
    _unmeasured_reported = True
    logger.error(
        "realtime: slow-socket protection is off for daphne's sockets over a transport of "
        "type %s (%s): only Twisted's TCP and Unix transports can be measured. Terminate TLS "
        "at the proxy in front of daphne.",
        type(transport).__qualname__,
        versions(),
    )


# The self-test ---------------------------------------------------------------------------

_verdict: bool | None = None


def check() -> bool:
    """Whether everything ``connection_of`` and ``Connection`` use is there, checked once per
    process; if not, one ERROR line says what is missing under which versions."""
    global _verdict
    if _verdict is None:
        problems = missing()
        _verdict = not problems
        if problems:
            logger.error(
                "realtime: slow-socket protection is off under %s: %s. Sockets that stop "
                "reading go unnoticed until daphne's ping timeout, and refusals and limits "
                "close with 1000 instead of the protocol's codes (1008, 1009, 1011, 1012).",
                versions(),
                "; ".join(problems),
            )
    return _verdict


def missing() -> list[str]:
    """What of daphne's, autobahn's and Twisted's internals this module needs is not there."""
    problems: list[str] = []
    server_class = getattr(sys.modules.get(SERVER_MODULE), "Server", None)
    handle_reply = getattr(server_class, "handle_reply", None)
    if not inspect.iscoroutinefunction(handle_reply):
        problems.append("daphne.server.Server.handle_reply is not a coroutine function")
    protocol_class = getattr(sys.modules.get(PROTOCOL_MODULE), "WebSocketProtocol", None)
    if not isinstance(protocol_class, type):
        problems.append("daphne.ws_protocol.WebSocketProtocol is not there")
    else:
        problems += _autobahn_missing(protocol_class)
    problems += _twisted_missing()
    return problems


def _autobahn_missing(protocol_class: type) -> list[str]:
    problems = []
    close = getattr(protocol_class, "sendCloseFrame", None)
    try:
        parameters = inspect.signature(close).parameters if callable(close) else {}
    except (TypeError, ValueError):
        parameters = {}
    if not {"code", "isReply"} <= set(parameters):
        problems.append("autobahn's sendCloseFrame(code=..., isReply=...) is not there")
    if not isinstance(getattr(protocol_class, "STATE_OPEN", None), int):
        problems.append("autobahn's WebSocketProtocol.STATE_OPEN is not there")
    if "closeHandshakeTimeout" not in getattr(protocol_class, "CONFIG_ATTRS", ()):
        problems.append("autobahn's closeHandshakeTimeout option is not there")
    return problems


class _ProbeReactor:
    """The two calls a ``FileDescriptor`` makes of its reactor when written to."""

    def addWriter(self, writer: object) -> None:  # noqa: N802 - Twisted's name
        return None

    def removeWriter(self, writer: object) -> None:  # noqa: N802 - Twisted's name
        return None


def _twisted_missing() -> list[str]:
    """Write to a real ``FileDescriptor`` (never run): ``pending`` must count what it holds."""
    file_descriptor = _file_descriptor_class()
    if file_descriptor is _Nothing:
        return ["twisted.internet.abstract.FileDescriptor is not there"]
    try:
        probe: Any = file_descriptor(reactor=_ProbeReactor())
        probe.connected = 1
        probe.write(b"realtime")
        probe.write(b"!")
        held = Connection(None, probe).pending()
    except Exception as exc:  # whatever breaks, the buffer cannot be read
        return [f"Twisted's FileDescriptor buffer cannot be read ({type(exc).__name__}: {exc})"]
    if held != len(b"realtime!"):
        return [f"Twisted's FileDescriptor buffer reads {held} bytes where 9 were written"]
    return []
