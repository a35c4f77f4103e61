"""The ASGI applications the end-to-end tests serve with daphne or uvicorn.

``application`` routes the socket bare; ``wrapped`` routes it inside Channels'
``AuthMiddlewareStack``, as most Channels projects do: its session middleware hands the
consumer a ``send`` of its own, a bound method of a wrapper object. ``opaque`` routes it behind
a middleware of the test's own whose ``send`` is a closure around the server's, as tracing and
logging middleware's are: realtime does not look inside it. ``guarded`` puts that same
middleware inside ``SocketOriginValidator``, outermost, as the docs say to: the validator hands
realtime the server's own ``send``.
"""

import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
http = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from realtime.origins import SocketOriginValidator  # noqa: E402
from realtime.routing import websocket_urlpatterns  # noqa: E402


class PassThrough:
    """Hand the application a ``send`` of its own: a closure that calls the server's."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def send_through(message: Any) -> None:
            await send(message)

        await self.inner(scope, receive, send_through)


application = ProtocolTypeRouter({"http": http, "websocket": URLRouter(websocket_urlpatterns)})
wrapped = ProtocolTypeRouter(
    {"http": http, "websocket": AuthMiddlewareStack(URLRouter(websocket_urlpatterns))}
)
opaque = ProtocolTypeRouter(
    {"http": http, "websocket": PassThrough(URLRouter(websocket_urlpatterns))}
)
guarded = ProtocolTypeRouter(
    {
        "http": http,
        "websocket": SocketOriginValidator(PassThrough(URLRouter(websocket_urlpatterns))),
    }
)
