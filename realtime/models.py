"""Realtime's tables: ``firm_channel_messages`` (the table transport's) and ``realtime_outbox``.

The schema of ``firm_channel_messages`` is firm-channel's, so processes of either library on
one database read what the other writes. Its three indexes carry names longer than Django
allows in ``Meta``; the migration creates them. Access in the hot paths goes through
``realtime.transports.table_store``; the outbox's through ``realtime.writes.outbox``.
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


class OutboxItem(models.Model):
    """One announcement written in the transaction of its write, until it is relayed.

    Used when the transport is ``durable``: it lives in the database of the write (several
    aliases may each hold one), so that it commits, or rolls back, with the write.
    """

    id = models.BigAutoField(primary_key=True)
    #: The key of the writer's transaction (random), shared by every row it wrote.
    txn = models.CharField(max_length=32)
    #: The row's place among those of its transaction.
    seq = models.IntegerField()
    #: The database's time of the INSERT, naive UTC.
    created_at = NaiveUTCDateTimeField(default=naive_utc_now)
    #: Until when a sweeper relaying the row holds it (``None``: nobody does).
    claimed_until = NaiveUTCDateTimeField(null=True)
    #: The announcement, as ``realtime.writes.outbox_form.dump`` wrote it.
    item = models.BinaryField()

    class Meta:
        db_table = "realtime_outbox"
        verbose_name = "outbox item"
        indexes = [
            models.Index(fields=["txn"], name="realtime_outbox_txn"),
            models.Index(fields=["created_at"], name="realtime_outbox_created"),
        ]

    def __str__(self) -> str:
        return f"{self.txn}.{self.seq}"
