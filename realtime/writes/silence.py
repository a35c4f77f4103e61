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
#: The link tables a related manager (``add()``, ``remove()``, ``clear()``, ``set()``) is
#: writing now, inside ``silent()``: it sends ``m2m_changed``, so its writes announce.
_managed: contextvars.ContextVar[tuple[type[models.Model], ...]] = contextvars.ContextVar(
    "realtime_managed_links", default=()
)
#: The row a fixture saved whose many-to-many links are being set now (``fixture_links``).
_fixture: contextvars.ContextVar[weakref.ref[Any] | None] = contextvars.ContextVar(
    "realtime_fixture_links", default=None
)


@contextmanager
def silent() -> Iterator[None]:
    """Announce no bulk write (``update``, ``bulk_create``, ``bulk_update``, ``QuerySet.delete``)
    made inside.

    For code that announces by itself (``realtime.announce``) or wants no announcement (a
    data migration). Writes that send model signals (``save``, ``delete()`` of an instance,
    a decorated model's many-to-many manager: ``m2m_changed``) still announce.
    """
    token = _silenced.set(True)
    managed = _managed.set(())  # a manager's write that failed leaves nothing past the block
    try:
        yield
    finally:
        _managed.reset(managed)
        _silenced.reset(token)


def fixture_links(instance: Any | None) -> None:
    """Keep quiet the link rows written from now until ``fixture_links(None)``: those of
    ``instance``'s many-to-many manager, setting the links of a row a fixture saved (Django's
    deserializer sets them right after its raw save); fixtures announce nothing. Held weakly:
    a manager's write that failed before its ``post_*`` signal quiets nothing once the
    instance is gone."""
    _fixture.set(None if instance is None else weakref.ref(instance))


def silenced(model: type[models.Model] | None = None) -> bool:
    """Whether bulk writes made here and now (of ``model``'s rows) announce nothing: inside
    ``silent()``, but for the writes of a related manager (``managing``), or while a
    fixture's links are set."""
    fixture = _fixture.get()
    if fixture is not None and fixture() is not None:
        return True
    return _silenced.get() and model not in _managed.get()


def managing(through: type[models.Model], starting: bool) -> None:
    """A related manager starts (its ``pre_*`` signal) or has ended (``post_*``) writing the
    links of ``through``: a write that sends ``m2m_changed``, which ``silent()`` leaves
    announced as it leaves ``save()``."""
    managed = _managed.get()
    if starting:
        _managed.set((*managed, through))
    elif through in managed:
        last = len(managed) - 1 - managed[::-1].index(through)
        _managed.set(managed[:last] + managed[last + 1 :])


def silences(origin: Any) -> bool:
    """Whether a deletion that began at ``origin`` is one ``silent()`` keeps quiet: a
    ``QuerySet.delete()`` made inside it, cascades included (an instance's ``delete()``
    still announces, as its ``save()`` does)."""
    return isinstance(origin, models.QuerySet) and silenced(origin.model)
