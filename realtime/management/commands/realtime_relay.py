"""``manage.py realtime_relay``: relay what writers left in ``realtime_outbox``.

Workers sweep the outbox themselves; this is for a deployment with no worker up (run it from
cron) or to drain a backlog now. A run first sees the rows left, waits
``REALTIME_COMMIT_GRACE`` (their writers may be relaying them right then), then sweeps while
sweeps relay something; rows first seen by a later sweep wait for the next run, and a
failure ends it with its error (a nonzero exit for cron). ``--loop`` goes on sweeping every
``--interval`` seconds; there a failure (the transport or a database away) is logged as the
workers log theirs, once when sweeps start failing and once when they work again, and the
loop goes on: relaying what was left once they are back is what it is for.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from realtime import limits
from realtime.writes import relay


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0 seconds")
    if value > limits.MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is more than {limits.MAX_SECONDS} seconds (100 years)"
        )
    return value


class Command(BaseCommand):
    help = "Relay the announcements their writers left in realtime_outbox (durable transports)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--loop", action="store_true", help="Keep sweeping until interrupted.")
        parser.add_argument(
            "--interval",
            type=_positive_float,
            help="Seconds between sweeps with --loop (default: half REALTIME_COMMIT_GRACE).",
        )

    def handle(self, *args: Any, loop: bool, interval: float | None, **options: Any) -> None:
        sweeper = relay.Sweeper(measured=False)  # the outbox gauges are the workers'
        pause = relay.interval() if interval is None else interval
        total = 0
        sweep = sweeper.sweep_logged if loop else sweeper.sweep
        sweep()  # sees the rows left; relays those seen long enough, next time
        time.sleep(sweeper.grace)
        while True:
            relayed = self._drain(sweep)
            total += relayed
            if not loop:
                break
            time.sleep(pause)
        self.stdout.write(self.style.SUCCESS(f"Relayed {total} announcement(s)."))

    def _drain(self, sweep: Callable[[], int]) -> int:
        """Sweep until a sweep relays nothing (nothing more is ready, or it failed)."""
        total = 0
        while True:
            relayed = sweep()
            total += relayed
            if relayed:
                self.stdout.write(f"Relayed {relayed} rows ({total} so far)")
            if not relayed:
                return total
