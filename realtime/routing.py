"""``websocket_urlpatterns``: ``RealtimeConsumer`` served at ``api/ws``."""

from django.urls import path

from realtime.consumers import RealtimeConsumer

websocket_urlpatterns = [
    path("api/ws", RealtimeConsumer.as_asgi()),
]
