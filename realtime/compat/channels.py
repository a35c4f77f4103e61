"""Channels: the server's ``send`` behind the one its session middleware hands on.

Channels' ``SessionMiddleware`` (inside ``AuthMiddlewareStack``, which most Channels projects
wrap their routes in) hands the inner application ``InstanceSessionWrapper.send``, a bound
method of an object that keeps the ``send`` it was given as ``real_send``. Channels documents
neither, so ``unwrap`` recognizes exactly that class and method, nothing else, and reads that
one attribute: the server's ``send`` behind it is then recognized as if the route were bare.

Channels' test communicator (``WebsocketCommunicator``, on asgiref's
``ApplicationCommunicator``) runs an application in the test's own process and hands it its
output queue's ``put``: ``in_test_communicator`` recognizes that (an ``asyncio.Queue.put``,
while asgiref's testing module is loaded), so that a test's socket, which has no server
behind it, is not reported as a send realtime cannot see through.

The classes are taken from ``sys.modules``, never imported. ``check`` is the self-test: it runs
once per process and, where something above is not there, says so in one ERROR line naming
the version; the session middleware's ``send`` is then a send realtime does not know.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import sys
import types
from importlib import metadata

logger = logging.getLogger(__name__)

SESSIONS_MODULE = "channels.sessions"
TESTING_MODULE = "asgiref.testing"
#: Session middlewares nested in one another, at most, that ``unwrap`` looks through.
MAX_WRAPPERS = 4


def loaded() -> bool:
    """Whether Channels' session middleware is loaded in this process."""
    return SESSIONS_MODULE in sys.modules


def versions() -> str:
    """The version of Channels, for the log."""
    try:
        return f"channels {metadata.version('channels')}"
    except metadata.PackageNotFoundError:
        return "channels (version unknown)"


def unwrap(send: object) -> object:
    """The ``send`` behind Channels' session middleware when ``send`` is exactly its wrapper's
    (looked through up to ``MAX_WRAPPERS`` deep); else ``send`` itself."""
    wrapper_class = getattr(sys.modules.get(SESSIONS_MODULE), "InstanceSessionWrapper", None)
    if wrapper_class is None:
        return send
    method = getattr(wrapper_class, "send", None)
    for _ in range(MAX_WRAPPERS):
        if (
            type(send) is not types.MethodType
            or send.__func__ is not method
            or type(send.__self__) is not wrapper_class
        ):
            return send
        inner = vars(send.__self__).get("real_send")
        if inner is None:
            return send
        send = inner
    return send


def in_test_communicator(send: object) -> bool:
    """Whether ``send`` is the output queue's ``put`` of a test communicator (asgiref's
    ``ApplicationCommunicator``, which Channels' ``WebsocketCommunicator`` is)."""
    return (
        type(send) is types.MethodType
        and send.__func__ is asyncio.Queue.put
        and TESTING_MODULE in sys.modules
    )


# The self-test ---------------------------------------------------------------------------

_verdict: bool | None = None


def check() -> bool:
    """Whether everything ``unwrap`` uses is there, checked once per process; if not, one ERROR
    line says what is missing under which version."""
    global _verdict
    if _verdict is None:
        problems = missing()
        _verdict = not problems
        if problems:
            logger.error(
                "realtime: slow-socket protection is off for sockets routed inside Channels' "
                "AuthMiddlewareStack (or SessionMiddleware) under %s: %s. Wrap the socket "
                "route in realtime.origins.SocketOriginValidator, outermost, to keep it.",
                versions(),
                "; ".join(problems),
            )
    return _verdict


def missing() -> list[str]:
    """What of Channels' session middleware ``unwrap`` needs is not there."""
    wrapper_class = getattr(sys.modules.get(SESSIONS_MODULE), "InstanceSessionWrapper", None)
    if not isinstance(wrapper_class, type):
        return ["channels.sessions.InstanceSessionWrapper is not there"]
    problems = []
    send = getattr(wrapper_class, "send", None)
    if not inspect.iscoroutinefunction(send):
        problems.append("InstanceSessionWrapper.send is not a coroutine function")
    for function in (getattr(wrapper_class, "__init__", None), send):
        names = getattr(getattr(function, "__code__", None), "co_names", ())
        if "real_send" not in names:
            name = getattr(function, "__name__", "?")
            problems.append(f"InstanceSessionWrapper.{name} does not use real_send")
    return problems
