"""uvicorn: the asyncio transport behind the ASGI ``send`` it hands an application.

uvicorn's ``send`` is a bound method of the connection's WebSocket protocol object: ``send`` of
``WebSocketsSansIOProtocol`` (the default) or of ``WSProtocol`` (``--ws wsproto``), ``asgi_send``
of the legacy ``WebSocketProtocol`` (``--ws websockets``). That object keeps the connection's
asyncio transport as ``transport``. uvicorn documents neither (its protocol classes are not
public API, and ASGI offers no way to reach the transport), so ``connection_of`` recognizes
exactly those classes and methods, nothing else, and reads that one attribute. Everything
done with the transport then is asyncio's public API: ``get_write_buffer_size()``,
``get_extra_info("socket")``, ``is_closing()`` and ``abort()``, of a transport that is an
``asyncio.WriteTransport`` or one of uvloop's (which implement the same methods without
deriving from asyncio's classes).

The classes are taken from ``sys.modules``, never imported. ``check`` is the self-test: it runs
once per process and, where something above is not there, says so in one ERROR line naming
the versions; realtime then serves uvicorn's sockets through ASGI alone.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import sys
import types
from importlib import metadata
from typing import Any, Protocol

logger = logging.getLogger(__name__)

PACKAGE = "uvicorn.protocols.websockets."
#: uvicorn's WebSocket protocol classes: module, class, the method handed over as ``send``.
PROTOCOLS = (
    (PACKAGE + "websockets_sansio_impl", "WebSocketsSansIOProtocol", "send"),
    (PACKAGE + "wsproto_impl", "WSProtocol", "send"),
    (PACKAGE + "websockets_impl", "WebSocketProtocol", "asgi_send"),
)
UVLOOP_MODULE = "uvloop.loop"
#: uvloop's transports a uvicorn connection may have (TCP, Unix socket, TLS).
UVLOOP_TRANSPORTS = ("TCPTransport", "UnixTransport", "_SSLProtocolTransport")


class Transport(Protocol):
    """The part of asyncio's transport API realtime uses."""

    def get_write_buffer_size(self) -> int: ...

    def get_extra_info(self, name: str, default: Any = None) -> Any: ...

    def is_closing(self) -> bool: ...

    def abort(self) -> None: ...


def loaded() -> bool:
    """Whether one of uvicorn's WebSocket protocols is loaded (uvicorn loads the one it serves
    with after the application, before the first connection)."""
    return any(module in sys.modules for module, _, _ in PROTOCOLS)


def versions() -> str:
    """The versions of what this module reads, for the log."""
    found = [f"uvicorn {_version('uvicorn')}"]
    if UVLOOP_MODULE in sys.modules:
        found.append(f"uvloop {_version('uvloop')}")
    return ", ".join(found)


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "(version unknown)"


class Connection:
    """uvicorn's side of one socket: its transport, ``None`` when it is of a kind realtime
    does not know (reported once)."""

    __slots__ = ("transport",)

    def __init__(self, transport: Transport | None) -> None:
        self.transport = transport


def connection_of(send: object) -> Connection | None:
    """uvicorn's connection when ``send`` is exactly the method uvicorn hands an application;
    else ``None``."""
    if type(send) is not types.MethodType:
        return None
    owner = send.__self__
    for module_name, class_name, method_name in PROTOCOLS:
        module = sys.modules.get(module_name)
        protocol_class = getattr(module, class_name, None)
        if protocol_class is None or type(owner) is not protocol_class:
            continue
        if send.__func__ is not getattr(protocol_class, method_name, None):
            return None
        transport = _instance_attribute(owner, "transport")
        if not _known_transport(transport):
            _report_unknown_transport(transport)
            return Connection(None)
        return Connection(transport)
    return None


def _instance_attribute(owner: object, name: str) -> Any:
    try:
        return vars(owner).get(name)
    except TypeError:  # no __dict__
        return None


def _known_transport(transport: object) -> bool:
    if isinstance(transport, asyncio.WriteTransport):
        return True
    uvloop = sys.modules.get(UVLOOP_MODULE)
    return uvloop is not None and any(
        type(transport) is getattr(uvloop, name, None) for name in UVLOOP_TRANSPORTS
    )


_unknown_reported = False


def _report_unknown_transport(transport: object) -> None:
    global _unknown_reported
    if _unknown_reported:
        return
    _unknown_reported = True
    logger.error(
        "realtime: slow-socket protection is off for uvicorn's sockets over a transport of "
        "type %s (%s): realtime knows asyncio's and uvloop's transports only. A socket that "
        "stops reading is still closed once a send has waited REALTIME_SEND_TIMEOUT, but its "
        "connection cannot be cut if the close does not go out either.",
        type(transport).__qualname__,
        versions(),
    )


# The self-test ---------------------------------------------------------------------------

_verdict: bool | None = None


def check() -> bool:
    """Whether everything ``connection_of`` uses is there, checked once per process; if not,
    one ERROR line says what is missing under which versions."""
    global _verdict
    if _verdict is None:
        problems = missing()
        _verdict = not problems
        if problems:
            logger.error(
                "realtime: slow-socket protection is off under %s: %s. A socket that stops "
                "reading is still closed once a send has waited REALTIME_SEND_TIMEOUT, but "
                "what uvicorn holds for it is not counted and its connection cannot be cut if "
                "the close does not go out either.",
                versions(),
                "; ".join(problems),
            )
    return _verdict


def missing() -> list[str]:
    """What of uvicorn's internals this module needs is not there, for each of its WebSocket
    protocols that is loaded."""
    problems = []
    for module_name, class_name, method_name in PROTOCOLS:
        module = sys.modules.get(module_name)
        if module is None:
            continue
        where = f"{module_name}.{class_name}"
        protocol_class = getattr(module, class_name, None)
        if not isinstance(protocol_class, type):
            problems.append(f"{where} is not there")
            continue
        if not inspect.iscoroutinefunction(getattr(protocol_class, method_name, None)):
            problems.append(f"{where}.{method_name} is not a coroutine function")
        # The transport is an instance attribute, set when the connection is made.
        made = getattr(protocol_class, "connection_made", None)
        names = getattr(getattr(made, "__code__", None), "co_names", ())
        if "transport" not in names:
            problems.append(f"{where}.connection_made keeps no transport")
    return problems
