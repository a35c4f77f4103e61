"""ASGI applications that route realtime's consumer rightly and wrongly, for the system checks
``realtime.W041`` to ``W043`` (``tests/test_checks_serving.py``); never served.

``tests.asgi`` holds more: ``application`` (bare) and ``wrapped`` (inside
``AuthMiddlewareStack``) route it without any origin validator, ``guarded`` inside
``SocketOriginValidator`` around a middleware of the test's own.
"""

import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
http = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.consumer import AsyncConsumer  # noqa: E402
from channels.generic.websocket import AsyncWebsocketConsumer  # noqa: E402
from channels.routing import ChannelNameRouter, ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import (  # noqa: E402
    AllowedHostsOriginValidator,
    OriginValidator,
)
from django.urls import path  # noqa: E402

from realtime.origins import SocketOriginValidator  # noqa: E402
from realtime.routing import websocket_urlpatterns  # noqa: E402


class Tracing:
    """A middleware of the project's own, keeping its application as ``app``."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


class Hiding:
    """A middleware that keeps its application where no check looks."""

    def __init__(self, app: Any) -> None:
        self._wrapped = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self._wrapped(scope, receive, send)


class Echo(AsyncWebsocketConsumer):  # type: ignore[misc]
    """A consumer of the project's own, not realtime's."""


class Worker(AsyncConsumer):  # type: ignore[misc]
    """A background worker of the project's own, on a channel of the channel layer."""


async def plain(scope: Any, receive: Any, send: Any) -> None:
    """An ASGI application that is a plain function (no router, no consumer)."""


def sockets(websocket: Any) -> ProtocolTypeRouter:
    return ProtocolTypeRouter({"http": http, "websocket": websocket})


# Channels' validators: native clients (no Origin) refused (W042) ...
allowed_hosts = sockets(
    AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))
)
inside_ours = sockets(
    SocketOriginValidator(
        OriginValidator(URLRouter(websocket_urlpatterns), ["https://app.example.com"])
    )
)
# ... unless they admit any origin: then nothing is checked (W041).
any_origin = sockets(OriginValidator(URLRouter(websocket_urlpatterns), ["*"]))
# Found under nested routers and the project's own middleware: unguarded (W041) ...
nested = sockets(
    Tracing(
        URLRouter(
            [
                path("echo/", Echo.as_asgi()),
                path("realtime/", AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
            ]
        )
    )
)
# ... and guarded (nothing to say).
nested_guarded = sockets(
    SocketOriginValidator(
        Tracing(
            URLRouter([path("realtime/", AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))])
        )
    )
)
# Beside a ChannelNameRouter of the project's workers: guarded (nothing to say) ...
with_workers = ProtocolTypeRouter(
    {
        "http": http,
        "websocket": SocketOriginValidator(URLRouter(websocket_urlpatterns)),
        "channel": ChannelNameRouter({"thumbnails": Worker.as_asgi()}),
    }
)
# ... and unguarded (W041).
with_workers_unguarded = ProtocolTypeRouter(
    {
        "http": http,
        "websocket": URLRouter(websocket_urlpatterns),
        "channel": ChannelNameRouter({"thumbnails": Worker.as_asgi()}),
    }
)
# Not found: nothing to say.
hidden = sockets(Hiding(URLRouter(websocket_urlpatterns)))
elsewhere = sockets(URLRouter([path("echo/", Echo.as_asgi())]))
plain_socket = sockets(plain)
# No socket served at all (W043): the asgi.py startproject writes, and a router without one.
startproject = http
http_only = ProtocolTypeRouter({"http": http})
