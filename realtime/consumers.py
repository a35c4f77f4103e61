"""``RealtimeConsumer``: the ASGI application serving one realtime socket.

Route it yourself (``RealtimeConsumer.as_asgi()``) or use ``realtime.routing``. Implemented in
``realtime.sockets.consumer``.
"""

from realtime.sockets.consumer import RealtimeConsumer

__all__ = ["RealtimeConsumer"]
