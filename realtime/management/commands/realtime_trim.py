"""``manage.py realtime_trim``: delete expired ``firm_channel_messages`` rows until none is left.

Trims take turns, batch by batch (``MessageStore.trim_batch``): a run beside another (cron
starting one while a long one runs, or the workers' own trims) waits for the other's batch
to end and goes on, on every database, as it does on PostgreSQL (on MySQL, ``TURN_WAIT`` at
most); so a run from cron ends with its count, not with an error because another trim was
under way.
"""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from realtime import limits
from realtime.conf import conf
from realtime.exceptions import TransportError
from realtime.transports.table_store import MessageStore
from realtime.transports.trimming import Trimmer

#: Seconds a batch waits for its turn on MySQL, while another trim's batch holds it: a day,
#: longer than any batch takes. Past it something is stuck, and the command says so.
TURN_WAIT = 24 * 3600


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more seconds")
    if value > limits.MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is more than {limits.MAX_SECONDS} seconds (100 years)"
        )
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


class Command(BaseCommand):
    help = "Delete expired realtime messages from firm_channel_messages, batch by batch."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--retention",
            type=_non_negative_float,
            help="Delete rows older than this many seconds (default: REALTIME_MESSAGE_RETENTION).",
        )
        parser.add_argument(
            "--batch-size",
            type=_positive_int,
            help="Rows deleted per transaction (default: REALTIME_TRIM_BATCH_SIZE).",
        )

    def handle(
        self, *args: Any, retention: float | None, batch_size: int | None, **options: Any
    ) -> None:
        trimmer = Trimmer(
            MessageStore(),
            conf.MESSAGE_RETENTION if retention is None else retention,
            conf.TRIM_BATCH_SIZE if batch_size is None else batch_size,
            auto=False,
            owner="realtime_trim",
        )
        total = 0
        while True:
            try:
                deleted = trimmer.trim(turn_wait=TURN_WAIT)
            except TransportError as exc:
                raise CommandError(
                    f"Another trim held the turn too long, or the database refused it ({exc}); "
                    f"deleted {total} expired messages so far."
                ) from exc
            total += deleted
            if deleted:
                self.stdout.write(f"Deleted {deleted} rows ({total} so far)")
            if deleted < trimmer.batch_size:
                break
        self.stdout.write(self.style.SUCCESS(f"Deleted {total} expired messages."))
