"""``silent()``: bulk writes made inside announce nothing.

A module of its own, imported by both the querysets that run bulk writes and the signal
receivers that see a ``QuerySet.delete()`` row by row.
"""

from __future__ import annotations

import contextvars
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import models

_silenced: contextvars.ContextVar[bool] = contextvars.ContextVar("realtime_silent", default=False)
#: The row a fixture saved whose many-to-many links are being set now (``fixture_links``).
_fixture: contextvars.ContextVar[weakref.ref[Any] | None] = contextvars.ContextVar(
    "realtime_fixture_links", default=None
)


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


def fixture_links(instance: Any | None) -> None:
    """Keep quiet the link rows written from now until ``fixture_links(None)``: those of
    ``instance``'s many-to-many manager, setting the links of a row a fixture saved (Django's
    deserializer sets them right after its raw save); fixtures announce nothing. Held weakly:
    a manager's write that failed before its ``post_*`` signal quiets nothing once the
    instance is gone."""
    _fixture.set(None if instance is None else weakref.ref(instance))


def silenced() -> bool:
    """Whether bulk writes made here and now announce nothing."""
    fixture = _fixture.get()
    return _silenced.get() or (fixture is not None and fixture() is not None)


def silences(origin: Any) -> bool:
    """Whether a deletion that began at ``origin`` is one ``silent()`` keeps quiet: a
    ``QuerySet.delete()`` made inside it, cascades included (an instance's ``delete()``
    still announces, as its ``save()`` does)."""
    return silenced() and isinstance(origin, models.QuerySet)
