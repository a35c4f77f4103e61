"""Counting what should not happen often, and saying so at most once per interval.

A burst of overflows must not turn into a burst of log lines: a ``Tally`` counts them and
logs one WARNING with the count (and the total since start) when the first comes, then at
most once per ``interval`` seconds while they go on. The line is realtime's own, within the
operation budget of ``realtime.logs``.
"""

from __future__ import annotations

import logging
import time
from typing import Final

from realtime.logs import log_operation

logger = logging.getLogger(__name__)

#: Seconds between two lines of one tally.
INTERVAL: Final = 10.0


class Tally:
    """Count occurrences of one thing; log ``message % (count, total)`` once per interval."""

    def __init__(self, message: str, interval: float = INTERVAL) -> None:
        self.message = message
        self.interval = interval
        #: Occurrences since the process started (a metrics exporter can read it).
        self.total = 0
        self._pending = 0
        self._logged_at: float | None = None

    def add(self, count: int = 1) -> None:
        """Count ``count`` more; log if the last line is an interval old (or there is none)."""
        self.total += count
        self._pending += count
        now = time.monotonic()
        if self._logged_at is None or now - self._logged_at >= self.interval:
            self._logged_at = now
            pending, self._pending = self._pending, 0
            log_operation(logger, logging.WARNING, self.message, pending, self.total)
