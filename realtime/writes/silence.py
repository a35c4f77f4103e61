"""``silent()``: bulk writes made inside announce nothing.

A module of its own, imported by both the querysets that run bulk writes and the signal
receivers that see a ``QuerySet.delete()`` row by row.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import models

_silenced: contextvars.ContextVar[bool] = contextvars.ContextVar("realtime_silent", default=False)


@contextmanager
def silent() -> Iterator[None]:
    """Announce no bulk write (``update``, ``bulk_create``, ``bulk_update``, ``QuerySet.delete``)
    made inside.

    For code that announces by itself (``realtime.announce``) or wants no announcement (a
    data migration). Writes that send model signals (``save``, ``delete()`` of an instance)
    still announce.
    """
    token = _silenced.set(True)
    try:
        yield
    finally:
        _silenced.reset(token)


def silenced() -> bool:
    """Whether bulk writes made here and now announce nothing."""
    return _silenced.get()


def silences(origin: Any) -> bool:
    """Whether a deletion that began at ``origin`` is one ``silent()`` keeps quiet: a
    ``QuerySet.delete()`` made inside it, cascades included (an instance's ``delete()``
    still announces, as its ``save()`` does)."""
    return _silenced.get() and isinstance(origin, models.QuerySet)
