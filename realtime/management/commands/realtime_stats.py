"""``manage.py realtime_stats``: what ``firm_channel_messages`` holds right now, and the
workers' metrics when they keep them where this command can read them
(``PROMETHEUS_MULTIPROC_DIR``, see ``realtime.metrics``)."""

from __future__ import annotations

import os
from typing import Any

from django.core.management.base import BaseCommand

from realtime import metrics
from realtime.fields import naive_utc_now
from realtime.transports.table_store import MessageStore


class Command(BaseCommand):
    help = (
        "Show the rows, channels, oldest row and payload bytes buffered in firm_channel_messages, "
        "and the workers' metrics when PROMETHEUS_MULTIPROC_DIR is set."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        stats = MessageStore().stats()
        if stats.oldest is None:
            age = "-"
        else:
            age = f"{(naive_utc_now() - stats.oldest).total_seconds():.1f} s"
        self.stdout.write(f"rows:          {stats.rows}")
        self.stdout.write(f"channels:      {stats.channels}")
        self.stdout.write(f"oldest row:    {age}")
        self.stdout.write(f"payload bytes: {stats.payload_bytes}")
        self.write_metrics()

    def write_metrics(self) -> None:
        found = metrics.samples()
        if found is None:
            self.stdout.write("metrics:       prometheus_client is not installed")
        elif not os.environ.get(metrics.MULTIPROC_ENV):
            self.stdout.write(
                f"metrics:       set {metrics.MULTIPROC_ENV} for the workers and this command "
                "to read theirs"
            )
        else:
            self.stdout.write("metrics:")
            for name, labels, value in found:
                shown = ",".join(f'{key}="{label}"' for key, label in sorted(labels.items()))
                braced = f"{{{shown}}}" if shown else ""
                self.stdout.write(f"  {name}{braced} {value:g}")
