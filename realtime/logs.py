"""Budgets of log lines, so that no one source of repeated lines can hide another.

Three kinds of line are limited, each on its own:

* Lines a client can cause — bad frames, refusals, a client not reading — go through
  ``client_budget``: at most ``CLIENT_LINES_PER_MINUTE`` a minute per process. A hostile
  client can make such a line happen once per frame, so past the budget they are counted, not
  written. A failure a client may have provoked is one line naming the exception's class
  (``log_failure``): its text may quote client input (even a string no log stream can
  encode), and a traceback per frame would flood the log; the traceback goes to DEBUG.
* Lines about realtime's own operation — a connection lost and back, an overflow counted, a
  follow or a listener that failed — go through ``operation_budget``
  (``OPERATION_LINES_PER_MINUTE`` a minute). No client can spend it: a flood of bad frames
  never holds back the line saying the database is gone.
* An exception raised by application code — an auth hook, a signal receiver, an audience
  hook — is a bug the application's developers need to see whole: it is logged at ERROR with
  its traceback (``log_hook_failure``), at most ``PLACE_LINES_PER_MINUTE`` a minute *per
  place* (the line's logger and message, or a place the caller names, a receiver say), so
  one hook failing on every frame never silences another.

Past a budget, lines are counted; the first line written after says how many were held back.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Hashable
from typing import Any

#: Lines a minute, at most, that clients can cause (bad input, refusals), all loggers together.
CLIENT_LINES_PER_MINUTE = 60
#: Lines a minute, at most, about realtime's own operation (failures, outages, overflows).
OPERATION_LINES_PER_MINUTE = 60
#: Tracebacks a minute, at most, of application code failing at one place.
PLACE_LINES_PER_MINUTE = 5
#: Places remembered at once; past it the place unused longest is forgotten.
MAX_PLACES = 256


class LogLimiter:
    """Admit at most ``per_minute`` lines a minute; count the others."""

    __slots__ = ("_times", "per_minute", "suppressed")

    def __init__(self, per_minute: int = CLIENT_LINES_PER_MINUTE) -> None:
        self.per_minute = per_minute
        self._times: deque[float] = deque()
        self.suppressed = 0

    def admit(self) -> bool:
        now = time.monotonic()
        times = self._times
        while times and now - times[0] > 60:
            times.popleft()
        if len(times) >= self.per_minute:
            self.suppressed += 1
            return False
        times.append(now)
        return True

    def log(
        self,
        logger: logging.Logger,
        level: int,
        message: str,
        *args: Any,
        exc_info: BaseException | None = None,
    ) -> None:
        if self.admit():
            self.admitted(logger, level, message, *args, exc_info=exc_info)

    def admitted(
        self,
        logger: logging.Logger,
        level: int,
        message: str,
        *args: Any,
        exc_info: BaseException | None = None,
    ) -> None:
        """Log a line ``admit`` let through, saying how many were held back before it."""
        if self.suppressed:
            message += " (%d similar lines held back)"
            args = (*args, self.suppressed)
            self.suppressed = 0
        logger.log(level, message, *args, exc_info=exc_info)


class PlaceLimiter:
    """One ``LogLimiter`` of ``PLACE_LINES_PER_MINUTE`` per place, for at most
    ``MAX_PLACES`` places (places are lines of code, so few; the cap only bounds memory)."""

    __slots__ = ("_places",)

    def __init__(self) -> None:
        self._places: dict[Hashable, LogLimiter] = {}

    def at(self, place: Hashable) -> LogLimiter:
        limiter = self._places.pop(place, None)  # put back last: the most recently used
        if limiter is None:
            limiter = LogLimiter(PLACE_LINES_PER_MINUTE)
            while len(self._places) >= MAX_PLACES:
                del self._places[next(iter(self._places))]
        self._places[place] = limiter
        return limiter


#: The process's budget of lines clients can cause.
client_budget = LogLimiter(CLIENT_LINES_PER_MINUTE)
#: The process's budget of lines about realtime's own operation.
operation_budget = LogLimiter(OPERATION_LINES_PER_MINUTE)
#: The process's budgets of application failures, one per place.
place_budgets = PlaceLimiter()


def describe(exc: BaseException) -> str:
    """The one-line description of an error: its class and its first line."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def log_limited(logger: logging.Logger, level: int, message: str, *args: Any) -> None:
    """Log one line a client can cause, within the clients' budget."""
    client_budget.log(logger, level, message, *args)


def log_failure(logger: logging.Logger, message: str, error: BaseException, *args: Any) -> None:
    """Log one ERROR line about a failure a client may have provoked, within the clients'
    budget: its class, no text, no traceback (that goes to DEBUG)."""
    if client_budget.admit():
        client_budget.admitted(logger, logging.ERROR, f"{message}: %s", *args, type(error).__name__)
        logger.debug("realtime: the failure above", exc_info=error)


def log_operation(
    logger: logging.Logger,
    level: int,
    message: str,
    *args: Any,
    exc_info: BaseException | None = None,
) -> None:
    """Log one line about realtime's own operation, within the operation budget."""
    operation_budget.log(logger, level, message, *args, exc_info=exc_info)


def log_operation_failure(
    logger: logging.Logger, message: str, error: BaseException, *args: Any
) -> None:
    """Log one ERROR line about a failure of realtime's own work, within the operation
    budget: the error's class and first line (its traceback at DEBUG)."""
    if operation_budget.admit():
        operation_budget.admitted(logger, logging.ERROR, f"{message}: %s", *args, describe(error))
        logger.debug("realtime: the failure above", exc_info=error)


def log_hook_failure(
    logger: logging.Logger,
    message: str,
    error: BaseException,
    *args: Any,
    place: Hashable = None,
) -> None:
    """Log what application code raised at ERROR with its traceback, within the budget of
    its place: ``place`` when given (a receiver, say), else the logger and the message."""
    key = (logger.name, message) if place is None else (logger.name, message, place)
    place_budgets.at(key).log(logger, logging.ERROR, message, *args, exc_info=error)
