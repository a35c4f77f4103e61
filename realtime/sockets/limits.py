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
from collections import deque
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


class LogLimiter:
    """Admit at most ``LOG_LINES_PER_MINUTE`` lines a minute; count the others.

    The first line admitted after some were held back says how many, so an operator knows
    the log was thinned and by how much.
    """

    __slots__ = ("_times", "suppressed")

    def __init__(self) -> None:
        self._times: deque[float] = deque()
        self.suppressed = 0

    def admit(self) -> bool:
        now = time.monotonic()
        times = self._times
        while times and now - times[0] > 60:
            times.popleft()
        if len(times) >= LOG_LINES_PER_MINUTE:
            self.suppressed += 1
            return False
        times.append(now)
        return True

    def log(self, level: int, message: str, *args: Any) -> None:
        if self.admit():
            self.admitted(level, message, *args)

    def admitted(self, level: int, message: str, *args: Any) -> None:
        """Log a line ``admit`` let through, saying how many were held back before it."""
        if self.suppressed:
            message += " (%d similar lines held back)"
            args = (*args, self.suppressed)
            self.suppressed = 0
        logger.log(level, message, *args)


#: The one limiter of this process's socket-side lines.
limiter = LogLimiter()


def log_bad_input(message: str, *args: Any) -> None:
    """Log one line about bad input (never a token or a frame body), rate-limited."""
    limiter.log(logging.INFO, message, *args)


def log_failure(message: str, error: BaseException, *args: Any) -> None:
    """Log one ERROR line about a failure a client may have provoked, rate-limited: the
    error's class only (its text may quote client input, even a string no log stream can
    encode) and no traceback, so no frame can flood the log; the traceback goes to DEBUG."""
    if limiter.admit():
        limiter.admitted(logging.ERROR, f"{message}: %s", *args, type(error).__name__)
        logger.debug("realtime: the failure above", exc_info=error)
