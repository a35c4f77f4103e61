"""The limits a socket lives under, beyond the handshake's: addresses, frame rate, log volume.

A client address holds at most ``REALTIME_MAX_UNAUTHENTICATED_PER_ADDRESS`` sockets that
have not authenticated yet on this worker, when set (``AddressCap``); a handshake over it is
refused before the socket is accepted. A client sends at most ``REALTIME_FRAME_LIMIT`` frames
in a fixed window of ``realtime.limits.FRAME_WINDOW`` seconds, which starts at the first frame
after ``authenticate`` (one sent before ``auth_success`` came back included, see ``inbox``)
and starts again at the first frame after it ends; WebSocket pings are answered by the server
and never reach the application, so they count toward nothing. Bad input is logged in one
line, never with a token or a frame body, and the socket side's lines share a budget of
``LOG_LINES_PER_MINUTE`` a minute per process, so a hostile client cannot flood the logs.
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


class AddressCap:
    """Count this worker's sockets that have not authenticated yet, by client address.

    Each one holds a file descriptor and a place in the handshake queue for up to
    ``REALTIME_AUTH_TIMEOUT`` seconds before it has proved anything; one address opening
    thousands of them would exhaust the worker. Off (``None``) by default: many clients may
    share one address (a NAT, or a proxy whose forwarded address the server does not read).
    """

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: dict[str, int] = {}

    def take(self, address: str | None) -> bool:
        """Hold a place for one more unauthenticated socket of ``address``; ``False`` when
        it holds the cap already (nothing is held then)."""
        if address is None:
            return True
        # Counted with the cap off too: ``give_back`` stays right if the setting changes.
        held = self._held.get(address, 0)
        cap = conf.MAX_UNAUTHENTICATED_PER_ADDRESS
        if cap is not None and held >= cap:
            return False
        self._held[address] = held + 1
        return True

    def give_back(self, address: str | None) -> None:
        """Give back a place held by ``take`` (the socket authenticated, or is gone)."""
        if address is None or address not in self._held:
            return
        left = self._held[address] - 1
        if left > 0:
            self._held[address] = left
        else:
            del self._held[address]


#: The one cap of this process (a worker serves its sockets on one event loop).
unauthenticated = AddressCap()
