"""Errors raised by realtime.

::

    RealtimeError
     ├── ChannelTooLongError    (also a ValueError) a channel over 1,024 UTF-8 bytes
     └── TransportError         a transport could not do what it was asked
          └── PublishError      messages could not be stored or sent; nothing was published

Driver errors (``django.db.Error``, psycopg's) are translated at the transport boundary with
``raise ... from exc``, so callers handle one tree whatever the database. Nothing here ever
reaches a model write: receivers and ``on_commit`` callbacks catch and log at their edge.
"""

from __future__ import annotations


class RealtimeError(Exception):
    """Base class of every error realtime raises on purpose."""


class ChannelTooLongError(RealtimeError, ValueError):
    """A channel name does not fit the 1,024 bytes of ``firm_channel_messages.channel``."""


class TransportError(RealtimeError):
    """A transport failed to do what it was asked."""


class PublishError(TransportError):
    """Messages could not be published; none of the batch was."""
