"""One budget for the log lines that input from outside can repeat: at most
``LINES_PER_MINUTE`` a minute per process.

A hostile or broken client can make the same line happen once per frame; so can a failing
application receiver handed client data. Such lines go through ``limiter``: past the budget
they are counted, not written, and the first line written after says how many were held back.
A failure is written as one line naming the exception's class: its text may quote client
input (even a string no log stream can encode), and a traceback per frame would flood the log;
the traceback goes to DEBUG.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

#: Lines per minute, at most, across every logger that uses the limiter.
LINES_PER_MINUTE = 60


class LogLimiter:
    """Admit at most ``LINES_PER_MINUTE`` lines a minute; count the others."""

    __slots__ = ("_times", "suppressed")

    def __init__(self) -> None:
        self._times: deque[float] = deque()
        self.suppressed = 0

    def admit(self) -> bool:
        now = time.monotonic()
        times = self._times
        while times and now - times[0] > 60:
            times.popleft()
        if len(times) >= LINES_PER_MINUTE:
            self.suppressed += 1
            return False
        times.append(now)
        return True

    def log(self, logger: logging.Logger, level: int, message: str, *args: Any) -> None:
        if self.admit():
            self.admitted(logger, level, message, *args)

    def admitted(self, logger: logging.Logger, level: int, message: str, *args: Any) -> None:
        """Log a line ``admit`` let through, saying how many were held back before it."""
        if self.suppressed:
            message += " (%d similar lines held back)"
            args = (*args, self.suppressed)
            self.suppressed = 0
        logger.log(level, message, *args)


#: The process's one limiter.
limiter = LogLimiter()


def log_limited(logger: logging.Logger, level: int, message: str, *args: Any) -> None:
    """Log one line within the process's budget."""
    limiter.log(logger, level, message, *args)


def log_failure(logger: logging.Logger, message: str, error: BaseException, *args: Any) -> None:
    """Log one ERROR line about ``error`` within the budget: its class, no traceback (that
    goes to DEBUG)."""
    if limiter.admit():
        limiter.admitted(logger, logging.ERROR, f"{message}: %s", *args, type(error).__name__)
        logger.debug("realtime: the failure above", exc_info=error)
