"""ASGI entry point: HTTP through Django, WebSockets at ``api/ws`` through realtime.

Serve it with ``daphne example_project.asgi:application`` (``manage.py runserver`` does so
too, since ``daphne`` is in ``INSTALLED_APPS``).
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
django_application = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from realtime.origins import SocketOriginValidator  # noqa: E402
from realtime.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_application,
        "websocket": SocketOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
