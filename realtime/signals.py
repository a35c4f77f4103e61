"""Signals an application may listen to. Each is sent robustly: what a receiver raises is
logged at ERROR with its traceback, within a budget of that receiver's own (``realtime.logs``),
so one receiver failing on every frame silences no other.

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

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.dispatch import Signal

from realtime.compat.django import has_receivers, live_receivers
from realtime.logs import log_hook_failure

logger = logging.getLogger(__name__)

frame_received = Signal()
event_delivered = Signal()
socket_disconnected = Signal()


async def send_robustly(signal: Signal, sender: Any, **kwargs: Any) -> None:
    """Send ``signal`` to every receiver (sync ones in a thread); log what a receiver raises."""
    if not has_receivers(signal, sender):
        return
    found = live_receivers(signal, sender)
    if found is None:
        results = await signal.asend_robust(sender, **kwargs)
    else:
        results = await _send_each(signal, sender, *found, kwargs)
    for receiver, result in results:
        if isinstance(result, Exception):
            # Application code: its traceback, limited per receiver.
            log_hook_failure(
                logger, "realtime: signal receiver %r failed", result, receiver, place=receiver
            )


async def _send_each(
    signal: Signal,
    sender: Any,
    sync_receivers: list[Callable[..., Any]],
    async_receivers: list[Callable[..., Any]],
    kwargs: dict[str, Any],
) -> list[tuple[Callable[..., Any], Any]]:
    """Call every receiver as ``Signal.asend_robust`` would (the synchronous ones together in
    a thread, then the asynchronous ones concurrently), answering what each returned or
    raised, without the line per failure ``asend_robust`` logs: ``send_robustly`` limits."""

    def send_sync() -> list[tuple[Callable[..., Any], Any]]:
        answers: list[tuple[Callable[..., Any], Any]] = []
        for receiver in sync_receivers:
            try:
                answers.append((receiver, receiver(signal=signal, sender=sender, **kwargs)))
            except Exception as exc:
                answers.append((receiver, exc))
        return answers

    async def send_async(receiver: Callable[..., Any]) -> Any:
        try:
            return await receiver(signal=signal, sender=sender, **kwargs)
        except Exception as exc:
            return exc

    answers = await sync_to_async(send_sync)() if sync_receivers else []
    found = await asyncio.gather(*(send_async(receiver) for receiver in async_receivers))
    return answers + list(zip(async_receivers, found, strict=True))
