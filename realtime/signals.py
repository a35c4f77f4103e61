"""Signals an application may listen to. Each is sent robustly: a failing receiver is logged
in one line naming its exception, within the budget of ``realtime.logs`` (its traceback at
DEBUG).

``frame_received(sender=RealtimeConsumer, consumer, user, event_type, data)``
    A client frame of a type the protocol does not define (the application's own).
``event_delivered(sender=SocketManager, event_type, data, watchers)``
    An event carrying channels reached local sockets; ``watchers`` maps each account id to
    the channels of the event its sockets subscribed to. Sent only when someone listens,
    beside delivery, at most ``REALTIME_NOTIFY_QUEUE_SIZE`` at once: receivers slower than
    delivery miss the signals of further events (counted, see ``realtime.metrics.overflowed``).
``socket_disconnected(sender=RealtimeConsumer, consumer, user, code)``
    A socket ended, on every exit path; ``user`` is ``None`` before authentication.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

from realtime.compat.django import has_receivers
from realtime.logs import log_failure

logger = logging.getLogger(__name__)

frame_received = Signal()
event_delivered = Signal()
socket_disconnected = Signal()


async def send_robustly(signal: Signal, sender: Any, **kwargs: Any) -> None:
    """Send ``signal`` to every receiver (sync ones in a thread); log what a receiver raises."""
    if not has_receivers(signal, sender):
        return
    for receiver, result in await signal.asend_robust(sender, **kwargs):
        if isinstance(result, Exception):
            # Receivers are handed client data: one line within the budget, no traceback.
            log_failure(logger, "realtime: signal receiver %r failed", result, receiver)
