"""The ``firm_channel_messages`` table of the table transport.

The schema is firm-channel's, so processes of either library on one database read what the
other writes. Its three indexes carry names longer than Django allows in ``Meta``; the
migration creates them. Access in the hot paths goes through ``realtime.transports.table_store``.
"""

from __future__ import annotations

from django.db import models

from realtime.fields import (
    ChannelField,
    MessageIdField,
    NaiveUTCDateTimeField,
    naive_utc_now,
)


class ChannelMessage(models.Model):
    """One message buffered for the listeners of ``channel``; trimmed after the retention."""

    id = MessageIdField(primary_key=True)
    channel = ChannelField()
    payload = models.BinaryField()
    channel_hash = models.BigIntegerField()
    created_at = NaiveUTCDateTimeField(default=naive_utc_now)

    class Meta:
        db_table = "firm_channel_messages"
        verbose_name = "channel message"

    def __str__(self) -> str:
        return f"{bytes(self.channel).decode('utf-8', 'replace')} #{self.id}"
