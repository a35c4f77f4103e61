"""The limits a socket lives under, beyond the handshake's: addresses, frame rate, log volume.

A client address holds at most ``REALTIME_MAX_UNAUTHENTICATED_PER_ADDRESS`` sockets that
have not authenticated yet on this worker, when set (``AddressCap``); a handshake over it is
refused before the socket is accepted. A client sends at most ``REALTIME_FRAME_LIMIT`` frames
in a fixed window of ``realtime.limits.FRAME_WINDOW`` seconds, which starts at the first frame
after ``authenticate`` (one sent before ``auth_success`` came back included, see ``inbox``)
and starts again at the first frame after it ends; WebSocket pings are answered by the server
and never reach the application, so they count toward nothing. Bad input is logged in one
line, never with a token or a frame body, and within the process's budget of lines clients can
cause (``realtime.logs``), so a hostile client cannot flood the logs. Realtime's own failures
(a listener or a follow that failed) have a budget of their own, which no client spends; what
an application hook raises is logged with its traceback, limited per place.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from realtime import limits, logs
from realtime.conf import conf

logger = logging.getLogger(__name__)


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


def log_bad_input(message: str, *args: Any) -> None:
    """Log one line about bad input (never a token or a frame body), within the budget."""
    logs.log_limited(logger, logging.INFO, message, *args)


def log_warning(message: str, *args: Any) -> None:
    """Log one WARNING line a client may cause per socket, within the budget."""
    logs.log_limited(logger, logging.WARNING, message, *args)


def log_hook_failure(message: str, error: BaseException, *args: Any) -> None:
    """Log what an application hook raised, with its traceback, within its place's budget."""
    logs.log_hook_failure(logger, message, error, *args)


def log_trouble(message: str, *args: Any) -> None:
    """Log one WARNING line about realtime's own operation, within the operation budget."""
    logs.log_operation(logger, logging.WARNING, message, *args)


def log_own_failure(message: str, error: BaseException, *args: Any) -> None:
    """Log one ERROR line about a failure of realtime's own work, within the operation
    budget (the error's class and first line; its traceback at DEBUG)."""
    logs.log_operation_failure(logger, message, error, *args)


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
