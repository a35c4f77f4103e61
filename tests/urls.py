"""Test-only HTTP endpoints of the daphne servers the end-to-end tests start."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse
from django.urls import path

from realtime import views
from realtime.sockets.manager import get_manager
from realtime.transports import get_transport


async def realtime_state(request: HttpRequest) -> JsonResponse:
    """What this worker's manager holds: each socket, and the scopes it follows; with the
    pg_notify transport, also what its LISTEN connection listens to and that backend's pid."""
    manager = get_manager()
    sockets = [
        {
            "user_id": socket.user_id,
            "scopes": list(socket.scopes),
            "slugs": list(socket.scopes.values()),
            "channels": sorted(socket.channels),
            # By scope, the channels the may_subscribe hook allows there (None: not asked).
            "allowed": None
            if socket.allowed is None
            else {str(scope): sorted(there) for scope, there in socket.allowed.items()},
            # Frames held for it (None: it is live).
            "held": None if socket.held is None else len(socket.held),
        }
        for socket in manager.index.sockets
    ]
    state: dict[str, Any] = {
        "sockets": sockets,
        "followed": sorted(manager._followed, key=str),
        "by_scope": {str(k): len(v) for k, v in manager.index.by_scope.items()},
        "by_scope_channel": len(manager.index.by_scope_channel),
        "by_user": {str(k): len(v) for k, v in manager.index.by_user.items()},
        # Subscribes waiting for a free lane of may_subscribe's batches.
        "subscribes_waiting": len(manager.subscriptions._waiting),
    }
    state.update(_listener_state())
    return JsonResponse(state)


def _listener_state() -> dict[str, Any]:
    """The pg_notify listener's channels and backend pid; nothing for other transports."""
    try:
        from realtime.transports.pg_notify import PgNotifyTransport
    except ImportError:  # psycopg is not installed: the transport cannot be pg_notify
        return {}
    transport = get_transport()
    if not isinstance(transport, PgNotifyTransport):
        return {}
    listener = transport.listener
    return {
        "listening": sorted(listener.listening) if listener is not None else [],
        "listener_pid": listener.backend_pid if listener is not None else None,
    }


urlpatterns = [path("_realtime/state", realtime_state), path("metrics", views.metrics)]
