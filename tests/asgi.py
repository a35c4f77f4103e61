"""The ASGI applications the end-to-end tests serve with daphne or uvicorn.

``application`` routes the socket bare; ``wrapped`` routes it inside Channels'
``AuthMiddlewareStack``, as most Channels projects do: its session middleware hands the
consumer a ``send`` of its own, a bound method of a wrapper object. ``opaque`` routes it
behind a middleware whose ``send`` only queues messages for a task of its own to send, so
nothing reachable from it leads to the server's connection.
"""

import asyncio
import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
http = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from realtime.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter({"http": http, "websocket": URLRouter(websocket_urlpatterns)})
wrapped = ProtocolTypeRouter(
    {"http": http, "websocket": AuthMiddlewareStack(URLRouter(websocket_urlpatterns))}
)


class QueuedSend:
    """Hand the application a ``send`` that queues; a task of its own drains the queue."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        queue: asyncio.Queue[Any] = asyncio.Queue()

        async def drain() -> None:
            while True:
                message = await queue.get()
                try:
                    await send(message)
                finally:
                    queue.task_done()

        drainer = asyncio.ensure_future(drain())
        try:
            await self.inner(scope, receive, queue.put)
            await queue.join()
        finally:
            drainer.cancel()


opaque = ProtocolTypeRouter(
    {"http": http, "websocket": QueuedSend(URLRouter(websocket_urlpatterns))}
)
