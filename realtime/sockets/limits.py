"""The limits a socket lives under, beyond the handshake's: frame rate, and log volume.

A client sends at most ``REALTIME_FRAME_LIMIT`` frames in a fixed window of
``realtime.limits.FRAME_WINDOW`` seconds, which starts at the first frame after
``authenticate`` (one sent before ``auth_success`` came back included, see ``inbox``) and
starts again at the first frame after it ends. Bad input is logged in one
line, never with a token or a frame body, and at most ``LOG_LINES_PER_MINUTE`` such lines a
minute per process, so a hostile client cannot flood the logs.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from realtime import limits
from realtime.conf import conf

logger = logging.getLogger(__name__)

#: Bad-input log lines per minute, at most.
LOG_LINES_PER_MINUTE = 60


class FrameWindow:
    """Count one socket's frames in a fixed window."""

    __slots__ = ("count", "start")

    def __init__(self) -> None:
        self.start = 0.0
        self.count = 0

    def admit(self) -> bool:
        """Count a frame; ``False`` once the window holds more than the limit."""
        now = time.monotonic()
        if self.count == 0 or now - self.start >= limits.FRAME_WINDOW:
            self.start, self.count = now, 0
        self.count += 1
        return self.count <= conf.FRAME_LIMIT


_log_times: list[float] = []


def log_bad_input(message: str, *args: Any) -> None:
    """Log one line about bad input (never a token or a frame body), rate-limited."""
    now = time.monotonic()
    while _log_times and now - _log_times[0] > 60:
        _log_times.pop(0)
    if len(_log_times) < LOG_LINES_PER_MINUTE:
        _log_times.append(now)
        logger.info(message, *args)
