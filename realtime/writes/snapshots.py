"""What a row holds in the database, as far as an instance knows: so an update can say which
columns it changed.

A snapshot is taken when Django builds an instance from the database (``from_db``), refreshed
by ``refresh_from_db`` for the columns it reloads, and by each save for the columns it wrote.
Each of these is a layer tied to the savepoint it was taken in (``transactions.Mark``): a
layer whose savepoint or transaction rolled back no longer counts (the row holds again what
the layers before it say), so a save retried after a rollback compares with what was
committed, and a column known only from inside a rolled-back transaction counts as changed at
the next save. Values that can change in
place (a JSONField's dict, an ArrayField's list) are copied, so mutating the instance's value
never mutates its snapshot. Only loaded columns are kept: deferred fields are never touched. An
instance built by hand has no snapshot; its saves count every concrete column as written.
"""

from __future__ import annotations

import copy
import datetime
import decimal
import logging
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from django.db import models

from realtime.writes import transactions
from realtime.writes.transactions import Mark

logger = logging.getLogger(__name__)

SNAPSHOT = "_realtime_snapshot"
_MISSING = object()
#: Stands for a value nobody knows any more (its layer rolled back, or it could not be copied).
_UNKNOWN = object()
#: Values of these types (and their subclasses) cannot change in place: kept, not copied.
_IMMUTABLE = (
    str,
    int,
    float,
    bool,
    bytes,
    type(None),
    decimal.Decimal,
    datetime.date,
    datetime.time,
    datetime.timedelta,
    uuid.UUID,
)

#: The same, looked up by exact type first: a snapshot is taken of every row loaded.
_IMMUTABLE_TYPES = frozenset(_IMMUTABLE)

Layer = tuple[Mark | None, dict[str, Any]]


def take(
    instance: models.Model, attnames: Iterable[str] | None = None, using: str | None = None
) -> None:
    """Record the current values of ``attnames`` (default: every loaded concrete column) as
    what the row holds, in the current savepoint of ``using``'s transaction."""
    try:
        values = instance.__dict__
        if attnames is None:
            attnames = [f.attname for f in instance._meta.concrete_fields]
        taken = {}
        for attname in attnames:
            value = values.get(attname, _MISSING)
            if value is not _MISSING:
                taken[attname] = value if type(value) in _IMMUTABLE_TYPES else _frozen(value)
        made = transactions.mark(using or instance._state.db or "default")
        layers: list[Layer] = values.setdefault(SNAPSHOT, [])
        if layers and layers[-1][0] is made:
            layers[-1][1].update(taken)
        else:
            layers.append((made, taken))
            _settle(layers)
    except Exception:
        logger.exception("realtime: taking a snapshot of %s failed", type(instance).__name__)
        instance.__dict__.pop(SNAPSHOT, None)


def before(instance: models.Model) -> dict[str, Any] | None:
    """What the row holds as far as ``instance`` knows, by attname; ``None`` without a snapshot.

    A layer that rolled back is ignored (its writes were undone, the row holds what the layers
    before it say); a column only such layers knew is unknown, and compares unequal to
    anything.
    """
    layers: list[Layer] | None = instance.__dict__.get(SNAPSHOT)
    if layers is None:
        return None
    known: dict[str, Any] = {}
    lost: set[str] = set()
    for made, values in layers:
        if transactions.stands(made):
            known.update(values)
        else:
            lost.update(values)
    for attname in lost:
        known.setdefault(attname, _UNKNOWN)
    return known


def changed_fields(instance: models.Model, update_fields: Iterable[str] | None) -> list[str]:
    """The sorted ``Field.name``s an update wrote (see the module docstring)."""
    meta = instance._meta
    if update_fields is not None:
        return sorted({meta.get_field(name).name for name in update_fields})
    known = before(instance)
    concrete = [f for f in meta.concrete_fields if not f.primary_key]
    if known is None:
        return sorted(f.name for f in concrete)
    values = instance.__dict__
    return sorted(
        f.name for f in concrete if f.attname in known and differs(values, known, f.attname)
    )


def knows(known: dict[str, Any], attname: str) -> bool:
    """Whether ``known`` (from ``before``) holds a value of ``attname`` that is still known."""
    return attname in known and known[attname] is not _UNKNOWN


def differs(values: dict[str, Any], known: dict[str, Any], attname: str) -> bool:
    """Whether the instance's value of ``attname`` differs from the one known."""
    was = known[attname]
    if was is _UNKNOWN:
        return True
    try:
        return bool(values.get(attname, _MISSING) != was)
    except Exception:  # a value whose comparison fails is taken as changed
        return True


def all_fields(instance: models.Model) -> list[str]:
    """The names of every concrete column but the primary key."""
    return [f.name for f in instance._meta.concrete_fields if not f.primary_key]


def written_attnames(instance: models.Model, update_fields: Iterable[str] | None) -> list[str]:
    meta = instance._meta
    if update_fields is None:
        return [f.attname for f in meta.concrete_fields]
    return [meta.get_field(name).attname for name in update_fields]  # type: ignore[union-attr]


def _frozen(value: Any) -> Any:
    """``value``, or a deep copy of it when it could change in place."""
    if isinstance(value, _IMMUTABLE):
        return value
    try:
        return copy.deepcopy(value)
    except Exception:
        return _UNKNOWN


def _settle(layers: list[Layer]) -> None:
    """Fold the leading layers whose fate is known (committed, outside a transaction, or
    rolled back) into the first one, so that a long-lived instance keeps a few layers."""
    settled: dict[str, Any] = {}
    count = 0
    for made, values in layers:
        if made is None or made.committed:
            settled.update(values)
        elif not transactions.stands(made):
            for attname in values:
                settled.setdefault(attname, _UNKNOWN)
        else:
            break
        count += 1
    if count > 1:
        layers[:count] = [(None, settled)]


def track(model: type[models.Model]) -> None:
    """Make ``model`` (and its subclasses) snapshot what they load. Idempotent."""
    if getattr(model.from_db, "_realtime", False):
        return
    original_from_db: Callable[..., models.Model] = model.from_db.__func__  # type: ignore[attr-defined]
    original_refresh: Callable[..., None] = model.refresh_from_db

    # Keywords go through as given: Django 6.1 passes fetch_mode, and warns about (and loses
    # the fetch mode of) a from_db that does not take it.
    def from_db(
        cls: type[models.Model], /, db: str | None, field_names: Any, values: Any, **kwargs: Any
    ) -> Any:
        instance = original_from_db(cls, db, field_names, values, **kwargs)
        take(instance, using=db)
        return instance

    def refresh_from_db(self: models.Model, *args: Any, **kwargs: Any) -> None:
        original_refresh(self, *args, **kwargs)
        fields = kwargs.get("fields", args[1] if len(args) > 1 else None)
        take(self, None if fields is None else written_attnames(self, fields))

    from_db._realtime = True  # type: ignore[attr-defined]
    from_db._realtime_original = original_from_db  # type: ignore[attr-defined]
    model.from_db = classmethod(from_db)  # type: ignore[method-assign,assignment]
    model.refresh_from_db = refresh_from_db  # type: ignore[method-assign]
