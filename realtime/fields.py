"""Model fields giving ``firm_channel_messages`` its exact column types on every database.

The table is shared byte for byte with firm-channel processes, so Django's own choices for
``BigAutoField`` (identity on PostgreSQL), ``BinaryField`` (LONGBLOB on MySQL, unindexable) and
``DateTimeField`` (``timestamptz`` on PostgreSQL, aware values under ``USE_TZ``) do not fit.
"""

from __future__ import annotations

import datetime
from typing import Any

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper


def naive_utc_now() -> datetime.datetime:
    """Return the current time as a naive UTC datetime, the clock every process compares."""
    return datetime.datetime.now(datetime.UTC).replace(tzinfo=None)


def to_naive_utc(value: datetime.datetime) -> datetime.datetime:
    """Convert an aware datetime to naive UTC; leave a naive one as it is (taken as UTC)."""
    if value.tzinfo is not None:
        value = value.astimezone(datetime.UTC).replace(tzinfo=None)
    return value


class MessageIdField(models.BigAutoField):  # type: ignore[type-arg]
    """An auto-increment id that is never reused: the delivery cursor.

    SQLite gets ``INTEGER PRIMARY KEY AUTOINCREMENT`` (without it an emptied table hands out
    old ids again and the next message is never delivered), PostgreSQL ``BIGSERIAL``, MySQL
    ``BIGINT AUTO_INCREMENT``.
    """

    def db_type(self, connection: BaseDatabaseWrapper) -> str | None:
        if connection.vendor == "postgresql":
            return "bigserial"
        return super().db_type(connection)

    def db_type_suffix(self, connection: BaseDatabaseWrapper) -> str | None:
        if connection.vendor == "postgresql":
            return None
        return super().db_type_suffix(connection)


class ChannelField(models.BinaryField):  # type: ignore[type-arg]
    """The channel name as bytes; ``VARBINARY(1024)`` on MySQL so it can be indexed."""

    def db_type(self, connection: BaseDatabaseWrapper) -> str | None:
        if connection.vendor == "mysql":
            return "varbinary(1024)"
        return super().db_type(connection)


class NaiveUTCDateTimeField(models.DateTimeField):  # type: ignore[type-arg]
    """A datetime stored as naive UTC whatever ``USE_TZ`` says.

    firm-channel compares ``created_at`` with naive UTC times, so PostgreSQL gets ``timestamp
    without time zone`` and values are written and read without a time zone (and without the
    warning Django gives for naive values under ``USE_TZ``).
    """

    def db_type(self, connection: BaseDatabaseWrapper) -> str | None:
        if connection.vendor == "postgresql":
            return "timestamp without time zone"
        return super().db_type(connection)

    def get_prep_value(self, value: Any) -> Any:
        if isinstance(value, datetime.datetime):
            return to_naive_utc(value)
        return super().get_prep_value(value)

    def get_db_prep_value(
        self, value: Any, connection: BaseDatabaseWrapper, prepared: bool = False
    ) -> Any:
        if not prepared:
            value = self.get_prep_value(value)
        if isinstance(value, datetime.datetime):
            return str(value) if connection.vendor != "postgresql" else value
        return value

    def from_db_value(
        self, value: Any, expression: Any, connection: BaseDatabaseWrapper
    ) -> datetime.datetime | None:
        if isinstance(value, str):
            value = datetime.datetime.fromisoformat(value)
        if isinstance(value, datetime.datetime):
            return to_naive_utc(value)
        return None
