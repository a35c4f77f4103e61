"""How a connection realtime holds open reports its outages: one line per change of state.

An operator reading the logs of a long database outage wants to know when a connection was
lost, whether it got worse, and when it came back — not one traceback per retry. So the
first failure is one WARNING (with the error's one-line description), every later attempt is
a DEBUG line, an escalation is one ERROR, and the recovery is one WARNING saying how long it
lasted. An error that is not about the database or the network is a bug: its traceback is
logged once, at its first occurrence. These lines are realtime's own, within the operation
budget of ``realtime.logs``: no flood of client-caused lines can hold them back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from django.db import DatabaseError

from realtime.logs import describe, log_operation

logger = logging.getLogger(__name__)


def expected(exc: BaseException) -> bool:
    """Whether ``exc`` is what a lost database, Redis server or network gives (no traceback
    needed)."""
    if isinstance(exc, DatabaseError | OSError | TimeoutError):
        return True
    try:
        import psycopg
    except ImportError:  # pragma: no cover - psycopg is optional
        pass
    else:
        if isinstance(exc, psycopg.Error):
            return True
    try:
        import redis
    except ImportError:  # pragma: no cover - redis-py is optional
        return False
    return isinstance(exc, redis.ConnectionError | redis.TimeoutError)


class Outage:
    """The state of one held connection: ``what`` names it in the logs, ``failing`` and
    ``back`` say what happened to it ("is lost", "is back")."""

    def __init__(self, what: str, failing: str = "is lost", back: str = "is back") -> None:
        self.what = what
        self.failing = failing
        self.back = back
        #: ``time.monotonic()`` of the first failure of the current outage; ``None``: up.
        self.since: float | None = None
        #: Failed attempts in the current outage.
        self.attempts = 0
        self.escalated = False

    @property
    def down(self) -> bool:
        return self.since is not None

    def failed(self, exc: BaseException, retry_in: float) -> None:
        """An attempt failed: one WARNING for the first, DEBUG for the others."""
        self.attempts += 1
        bug = None if expected(exc) else exc
        if self.since is None:
            self.since = time.monotonic()
            log_operation(
                logger,
                logging.WARNING,
                "realtime: %s %s (attempt %d, retrying in %.2f s): %s",
                self.what,
                self.failing,
                self.attempts,
                retry_in,
                describe(exc),
                exc_info=bug,
            )
            return
        logger.debug(
            "realtime: %s: attempt %d failed too (retrying in %.2f s): %s",
            self.what,
            self.attempts,
            retry_in,
            describe(exc),
        )

    def escalate(self, why: str, exc: BaseException | None = None) -> None:
        """The outage is worse than a blip: one ERROR per outage."""
        if self.escalated or self.since is None:
            return
        self.escalated = True
        detail = f": {describe(exc)}" if exc is not None else ""
        log_operation(
            logger,
            logging.ERROR,
            "realtime: %s %s (attempt %d, down %.1f s)%s",
            self.what,
            why,
            self.attempts,
            self.duration(),
            detail,
        )

    def duration(self) -> float:
        """Seconds since the outage began (0 when up)."""
        return 0.0 if self.since is None else time.monotonic() - self.since

    def recovered(self) -> None:
        """The connection works again: one WARNING if it had been lost."""
        if self.since is None:
            return
        log_operation(
            logger,
            logging.WARNING,
            "realtime: %s %s after %.1f s (attempt %d)",
            self.what,
            self.back,
            self.duration(),
            self.attempts + 1,
        )
        self.since, self.attempts, self.escalated = None, 0, False


class WatchedReads:
    """Reads of a history (the pg_notify log, the Redis streams) retried until they work.

    Each failure goes to an ``Outage`` (its log lines). Reads failing for longer than
    ``bound`` seconds leave sockets staler than a lost connection would: one ERROR, and the
    channels still owed are reported to ``missed`` (their sockets are closed 1012), again
    after each further ``bound`` while the reads still fail. ``bound`` ``None``: never.
    """

    def __init__(
        self, what: str, bound: float | None, missed: Callable[[frozenset[str]], None]
    ) -> None:
        self.outage = Outage(what, "failed", "works again")
        self.bound = bound
        self.missed = missed
        self._reported_at: float | None = None

    def failed(
        self, exc: BaseException, retry_in: float, owed: Callable[[], frozenset[str]]
    ) -> None:
        """A read failed; ``owed()`` names the channels that wait for it."""
        self.outage.failed(exc, retry_in)
        bound, since = self.bound, self.outage.since
        now = time.monotonic()
        if bound is None or since is None or now - since < bound:
            return
        self.outage.escalate(
            f"keeps failing for over {bound:.1f} s: the sockets it owes messages are closed 1012",
            exc,
        )
        if self._reported_at is None or now - self._reported_at >= bound:
            self._reported_at = now
            channels = owed()
            if channels:
                self.missed(channels)

    def worked(self) -> None:
        self.outage.recovered()
        self._reported_at = None


class Backoff:
    """The waits between a held connection's attempts: exponential from ``start`` to
    ``most``, and cut short once the server answers again after a look found it away — the
    backoff spares a server that is down, not one that is back."""

    def __init__(self, start: float, most: float, answers: Callable[[], Awaitable[bool]]) -> None:
        self.start = start
        self.most = most
        #: Whether the server answers now (a cheap look: a TCP connect, a PING).
        self.answers = answers
        #: The last look found the server away.
        self.away = False
        #: Attempts made at once because the server came back within a backoff.
        self.prompt_retries = 0

    def delay(self, attempt: int) -> float:
        """Seconds before attempt ``attempt + 1`` (the first failed attempt is 1)."""
        return float(min(self.start * 2 ** (attempt - 1), self.most))

    async def wait(
        self, delay: float, step: float, each_turn: Callable[[], None] | None = None
    ) -> None:
        """Wait ``delay`` seconds, looking every ``step`` seconds whether the server is back
        (and calling ``each_turn`` before each look); return at once when it is."""
        deadline = time.monotonic() + delay
        while (left := deadline - time.monotonic()) > 0:
            if each_turn is not None:
                each_turn()
            await asyncio.sleep(min(left, step))
            if time.monotonic() >= deadline:
                return
            if not await self.answers():
                self.away = True
            elif self.away:
                self.away = False
                self.prompt_retries += 1
                return
