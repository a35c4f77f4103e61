"""``manage.py realtime_stats``: what ``firm_channel_messages`` holds right now."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from realtime.fields import naive_utc_now
from realtime.transports.table_store import MessageStore


class Command(BaseCommand):
    help = (
        "Show the rows, channels, oldest row and payload bytes buffered in firm_channel_messages."
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
