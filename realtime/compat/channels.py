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

The system checks ``realtime.W041``/``W042`` follow the project's ASGI application down to
realtime's consumer, through Channels' routers and wrappers: Channels documents how to build
them, not where they keep what they wrap. ``inner_applications`` reads exactly that, for the
classes of ``WRAPPERS``; ``consumer_of`` reads the class ``as_asgi()`` records on the
application it returns; ``admits_every_origin`` reads an ``OriginValidator``'s allowed origins.
``routing_check`` is their self-test (once per process, one ERROR line when something is not
there): the checks then say nothing, rather than guess.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import sys
import types
from collections.abc import Mapping
from importlib import metadata

logger = logging.getLogger(__name__)

SESSIONS_MODULE = "channels.sessions"
TESTING_MODULE = "asgiref.testing"
#: Session middlewares nested in one another, at most, that ``unwrap`` looks through.
MAX_WRAPPERS = 4
#: Channels' routers and wrappers, by module and class, and the attribute their constructor
#: keeps what they wrap in (``BaseMiddleware``'s subclasses too: ``AuthMiddleware``, and the
#: project's own middleware built on it).
WRAPPERS = (
    ("channels.routing", "ProtocolTypeRouter", "application_mapping"),
    ("channels.routing", "ChannelNameRouter", "application_mapping"),
    ("channels.routing", "URLRouter", "routes"),
    ("channels.middleware", "BaseMiddleware", "inner"),
    ("channels.sessions", "CookieMiddleware", "inner"),
    ("channels.sessions", "SessionMiddleware", "inner"),
    ("channels.security.websocket", "OriginValidator", "application"),
)
#: Where ``OriginValidator`` keeps its allowed origins; ``"*"`` among them admits any.
ALLOWED_ORIGINS = "allowed_origins"
#: Where ``as_asgi()`` records the consumer class on the application it returns.
CONSUMER_CLASS = "consumer_class"


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


# The routing walk ------------------------------------------------------------------------


def inner_applications(application: object) -> list[object] | None:
    """What a Channels router or wrapper of ``WRAPPERS`` hands connections to (a router's every
    route, a wrapper's one application); ``None`` when ``application`` is none of them."""
    for module, name, attribute in WRAPPERS:
        wrapper_class = getattr(sys.modules.get(module), name, None)
        if not (isinstance(wrapper_class, type) and isinstance(application, wrapper_class)):
            continue
        value = vars(application).get(attribute)
        if isinstance(value, Mapping):
            return list(value.values())
        if attribute == "routes":
            return [getattr(route, "callback", None) for route in value or ()]
        return [value]
    return None


def protocols_of(application: object) -> list[str] | None:
    """The protocols (``"http"``, ``"websocket"``...) a ``ProtocolTypeRouter`` routes; ``None``
    when ``application`` is none."""
    router_class = getattr(sys.modules.get("channels.routing"), "ProtocolTypeRouter", None)
    if not (isinstance(router_class, type) and isinstance(application, router_class)):
        return None
    mapping = vars(application).get("application_mapping")
    return [str(key) for key in mapping] if isinstance(mapping, Mapping) else None


def consumer_of(application: object) -> type | None:
    """The consumer class of an application ``as_asgi()`` made; ``None`` for anything else."""
    if not isinstance(application, types.FunctionType):
        return None
    found = vars(application).get(CONSUMER_CLASS)
    return found if isinstance(found, type) else None


def admits_every_origin(validator: object) -> bool:
    """Whether a Channels ``OriginValidator`` admits any origin, and none (``"*"`` allowed)."""
    return "*" in (getattr(validator, "__dict__", {}).get(ALLOWED_ORIGINS) or ())


_routing_verdict: bool | None = None


def routing_check() -> bool:
    """Whether everything the routing walk reads is there, checked once per process; if not,
    one ERROR line says what is missing under which version."""
    global _routing_verdict
    if _routing_verdict is None:
        problems = routing_missing()
        _routing_verdict = not problems
        if problems:
            logger.error(
                "realtime: the system checks cannot follow the ASGI application to realtime's "
                "consumer under %s: %s. realtime.W041 and realtime.W042 are not reported: "
                "make sure the socket route is wrapped in realtime.origins."
                "SocketOriginValidator, and in no Channels OriginValidator.",
                versions(),
                "; ".join(problems),
            )
    return _routing_verdict


def routing_missing() -> list[str]:
    """What of Channels' routers, wrappers and ``as_asgi()`` the routing walk reads is not
    there. The modules are imported: the walk runs in ``manage.py check``, not on a socket."""
    problems = []
    keeps = [(module, name, "__init__", attribute) for module, name, attribute in WRAPPERS]
    keeps.append(("channels.security.websocket", "OriginValidator", "__init__", ALLOWED_ORIGINS))
    keeps.append(("channels.consumer", "AsyncConsumer", "as_asgi", CONSUMER_CLASS))
    for module, name, method, attribute in keeps:
        try:
            owner = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            problems.append(f"{module}.{name} is not there")
            continue
        names = getattr(getattr(getattr(owner, method, None), "__code__", None), "co_names", ())
        if attribute not in names:
            problems.append(f"{name}.{method} does not keep {attribute}")
    return problems
