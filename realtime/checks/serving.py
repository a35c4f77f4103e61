"""System checks of how the project serves the socket (``realtime.W040`` to ``W043``).

Each is a mistake that works at first sight and fails only on a socket:

- ``W040``: ``daphne`` not in ``INSTALLED_APPS`` while ``DEBUG`` is on. ``runserver`` is then
  Django's WSGI server, and the socket answers 404. ``runserver`` is a development server, so
  a production settings file (``DEBUG`` off), which uvicorn or daphne's own command serves, is
  not told; in development under uvicorn it is a warning to silence. (daphne listed after
  ``django.contrib.staticfiles``, whose own ``runserver`` then wins, is daphne's own check,
  ``daphne.E001``.)
- ``W041``: realtime's consumer routed without ``SocketOriginValidator``: a handshake from any
  origin (``null`` included) is admitted.
- ``W042``: realtime's consumer routed inside Channels' ``OriginValidator`` (or
  ``AllowedHostsOriginValidator``): native clients, which send no ``Origin``, are refused.
- ``W043``: ``ASGI_APPLICATION`` serves no WebSocket at all: Django's own ASGI handler (the
  ``asgi.py`` ``startproject`` wrote, left as it was), or a ``ProtocolTypeRouter`` with no
  ``"websocket"`` route. Every socket is then answered with an error (500).

For the last three the check imports ``ASGI_APPLICATION`` as daphne does (in every command, as
Django's URL checks import ``ROOT_URLCONF``) and follows it down to realtime's consumer:
through Channels' routers and wrappers (``realtime.compat.channels`` knows where they keep what
they wrap), and ``SocketOriginValidator`` and the project's own middleware by their ``inner``,
``app`` or ``application`` attribute. Where the consumer is not found (no
``ASGI_APPLICATION``, an application that cannot be imported, a wrapper that keeps its
application elsewhere) they say nothing: no guess, no false alarm. ``W043`` speaks only of an
application that provably takes no socket.

The import leaves logging as the command configured it. The module's
``get_asgi_application()`` calls ``django.setup()``, which configures ``LOGGING`` again; where
``LOGGING`` leaves ``disable_existing_loggers`` at its default (``True``), that disables every
logger created since start-up, realtime's among them, for the rest of the command (a cron
command's failed announcement would then log nothing). ``LOGGING_CONFIG`` is ``None`` for the
time of the import, so ``django.setup()`` leaves logging alone, as Django documents for that
setting.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from channels.security.websocket import OriginValidator
from django.apps import apps
from django.conf import settings
from django.core import checks
from django.core.handlers.asgi import ASGIHandler
from django.utils.module_loading import import_string

from realtime.compat import channels
from realtime.consumers import RealtimeConsumer
from realtime.origins import SocketOriginValidator

#: Attributes a wrapper of the project's own is followed through, in this order.
INNER_ATTRIBUTES = ("inner", "app", "application")
#: Wrappers inside one another, at most, between the ASGI application and the consumer.
MAX_DEPTH = 32
SILENCE_HINT = (
    'Put "daphne" first in INSTALLED_APPS, so that runserver serves ASGI. If you serve with '
    'uvicorn or another ASGI server instead of runserver, add "realtime.W040" to '
    "SILENCED_SYSTEM_CHECKS."
)
VALIDATOR_HINT = (
    "Route the socket as "
    '"websocket": SocketOriginValidator(URLRouter(websocket_urlpatterns)), with '
    "SocketOriginValidator from realtime.origins, outermost: it admits the origins of "
    "ALLOWED_HOSTS and REALTIME_ALLOWED_ORIGINS, and clients that send no Origin."
)


@checks.register()
def check_serving(app_configs: Iterable[Any] | None = None, **kwargs: Any) -> list[Any]:
    """Check ``INSTALLED_APPS`` for daphne and the socket route's origin validator."""
    if not apps.is_installed("realtime"):
        return []  # realtime.E040 says so
    return [*_check_daphne(), *_check_socket_route()]


def _check_daphne() -> list[checks.CheckMessage]:
    if not settings.DEBUG or apps.is_installed("daphne"):
        return []
    return [
        checks.Warning(
            '"daphne" is not in INSTALLED_APPS: "manage.py runserver" is then Django\'s WSGI '
            "server, and realtime's socket answers 404.",
            hint=SILENCE_HINT,
            id="realtime.W040",
        )
    ]


def _check_socket_route() -> list[checks.CheckMessage]:
    path = getattr(settings, "ASGI_APPLICATION", None)
    application = _asgi_application(path)
    if application is None or not channels.routing_check():
        return []
    if _serves_no_socket(application):
        why = (
            "Django's own ASGI handler takes HTTP only"
            if isinstance(application, ASGIHandler)
            else 'it routes no "websocket" protocol'
        )
        return [
            checks.Warning(
                f"ASGI_APPLICATION ({path}) serves no WebSocket: every socket is answered with "
                f"an error ({why}).",
                hint='Route the socket in asgi.py: application = ProtocolTypeRouter({"http": '
                'get_asgi_application(), "websocket": SocketOriginValidator(URLRouter('
                "websocket_urlpatterns))}), with websocket_urlpatterns from realtime.routing.",
                id="realtime.W043",
            )
        ]
    unguarded = refused = False
    for chain in consumer_chains(application):
        validators = [app for app in chain if isinstance(app, OriginValidator)]
        if any(not channels.admits_every_origin(app) for app in validators):
            refused = True
        elif not any(isinstance(app, SocketOriginValidator) for app in chain):
            unguarded = True
    messages: list[checks.CheckMessage] = []
    if unguarded:
        messages.append(
            checks.Warning(
                f"ASGI_APPLICATION ({path}) routes realtime's consumer "
                "without SocketOriginValidator: a socket handshake from any origin, "
                '"null" included, is admitted.',
                hint=VALIDATOR_HINT,
                id="realtime.W041",
            )
        )
    if refused:
        messages.append(
            checks.Warning(
                f"ASGI_APPLICATION ({path}) routes realtime's consumer "
                "inside Channels' OriginValidator (or AllowedHostsOriginValidator): native "
                "clients, which send no Origin header, are refused with 403.",
                hint="Replace Channels' validator with realtime.origins.SocketOriginValidator. "
                + VALIDATOR_HINT,
                id="realtime.W042",
            )
        )
    return messages


def _serves_no_socket(application: object) -> bool:
    """Whether ``application`` provably takes no WebSocket: Django's own ASGI handler, or
    Channels' ``ProtocolTypeRouter`` with no ``"websocket"`` route."""
    if isinstance(application, ASGIHandler):
        return True
    protocols = channels.protocols_of(application)
    return protocols is not None and "websocket" not in protocols


def _asgi_application(path: object) -> object | None:
    """The application ``path`` (``ASGI_APPLICATION``) names, imported as daphne imports it;
    ``None`` if unset or unimportable (daphne and ``runserver`` say why when they start)."""
    if not isinstance(path, str) or not path:
        return None
    try:
        with _logging_left_alone():
            application: object = import_string(path)
    except Exception:  # the project's module, whatever it raises: not this check's to report
        return None
    return application


@contextmanager
def _logging_left_alone() -> Iterator[None]:
    """``LOGGING_CONFIG`` off for the time of the ASGI module's import: its ``django.setup()``
    then configures no logging a second time (see the module docstring)."""
    configured = settings.LOGGING_CONFIG
    settings.LOGGING_CONFIG = None
    try:
        yield
    finally:
        settings.LOGGING_CONFIG = configured


def consumer_chains(application: object) -> Iterator[tuple[object, ...]]:
    """For each route from ``application`` to realtime's consumer, the applications on the way
    (``application`` first, the consumer's own left out)."""
    stack: list[tuple[object, tuple[object, ...]]] = [(application, ())]
    while stack:
        app, chain = stack.pop()
        found = channels.consumer_of(app)
        if found is not None:
            if issubclass(found, RealtimeConsumer):
                yield chain
            continue
        if len(chain) >= MAX_DEPTH or any(app is outer for outer in chain):
            continue
        inner = channels.inner_applications(app)
        if inner is None:
            inner = _own_inner(app)
        stack.extend((child, (*chain, app)) for child in reversed(inner) if callable(child))


def _own_inner(app: object) -> list[object]:
    """What a wrapper that is not Channels' wraps (``SocketOriginValidator``'s ``application``,
    the project's middleware's), by its instance attribute (never a property: nothing runs)."""
    attributes = getattr(app, "__dict__", {})
    for name in INNER_ATTRIBUTES:
        if name in attributes:
            return [attributes[name]]
    return []
