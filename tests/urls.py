"""Test-only HTTP endpoints of the daphne servers the end-to-end tests start."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.urls import path

from realtime.manager import get_manager


async def realtime_state(request: HttpRequest) -> JsonResponse:
    """What this worker's manager holds: each socket, and the scopes it follows."""
    manager = get_manager()
    sockets = [
        {
            "user_id": socket.user_id,
            "scopes": list(socket.scopes),
            "slugs": list(socket.scopes.values()),
            "channels": sorted(socket.channels),
        }
        for socket in manager.sockets
    ]
    return JsonResponse(
        {
            "sockets": sockets,
            "followed": sorted(manager._followed, key=str),
            "by_scope": {str(k): len(v) for k, v in manager.by_scope.items()},
            "by_scope_channel": len(manager.by_scope_channel),
            "by_user": {str(k): len(v) for k, v in manager.by_user.items()},
        }
    )


urlpatterns = [path("_realtime/state", realtime_state)]
