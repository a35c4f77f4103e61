"""An auth service whose bearer check takes a while, for servers that test the handshake.

Frames a client sends right after ``authenticate`` then reliably arrive while the handshake is
being resolved.
"""

from __future__ import annotations

import time
from typing import Any

from realtime.auth import RealtimeAuth

#: Seconds each bearer check takes.
DELAY = 1.5


class SlowAuth(RealtimeAuth):
    """The default auth service, slowed down."""

    def user_of_token(self, token: str) -> Any | None:
        time.sleep(DELAY)
        return super().user_of_token(token)
