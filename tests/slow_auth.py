"""An auth service whose bearer check takes a while, for servers that test the handshake.

Frames a client sends right after ``authenticate`` then reliably arrive while the handshake is
being resolved.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from realtime.auth import RealtimeAuth

#: Seconds each bearer check takes.
DELAY = 1.5


class SlowAuth(RealtimeAuth):
    """The default auth service, slowed down."""

    def user_of_token(self, token: str) -> Any | None:
        time.sleep(DELAY)
        return super().user_of_token(token)


class SlowAudience(RealtimeAuth):
    """The default auth service, whose audience check of an event carrying ``{"slow": true}``
    takes ``DELAY`` seconds: a socket's resume that plans such an event is still under way
    while others come back."""

    def audience(
        self,
        scope_id: Any,
        event_type: str,
        data: Any,
        user_ids: Iterable[Any],
        about: dict[str, Any] | None,
    ) -> Iterable[Any]:
        if isinstance(data, dict) and data.get("slow"):
            time.sleep(DELAY)
        return super().audience(scope_id, event_type, data, user_ids, about)
