"""What a row held when it was loaded, so that an update can say which columns it changed.

A snapshot is taken when Django builds an instance from the database (``from_db``), refreshed
by ``refresh_from_db`` for the columns it reloads, and by each save for the columns it wrote.
Only loaded columns are kept: deferred fields are never touched. An instance built by hand
has no snapshot; its saves count every concrete column as written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from django.db import models

SNAPSHOT = "_realtime_snapshot"
_MISSING = object()


def take(instance: models.Model, attnames: Iterable[str] | None = None) -> None:
    """Record the current values of ``attnames`` (default: every loaded concrete column)."""
    values = instance.__dict__
    if attnames is None:
        attnames = (f.attname for f in instance._meta.concrete_fields)
    snapshot = values.setdefault(SNAPSHOT, {})
    for attname in attnames:
        value = values.get(attname, _MISSING)
        if value is not _MISSING:
            snapshot[attname] = value


def changed_fields(instance: models.Model, update_fields: Iterable[str] | None) -> list[str]:
    """The sorted ``Field.name``s an update wrote (see the module docstring)."""
    meta = instance._meta
    if update_fields is not None:
        return sorted({meta.get_field(name).name for name in update_fields})
    snapshot = instance.__dict__.get(SNAPSHOT)
    concrete = [f for f in meta.concrete_fields if not f.primary_key]
    if snapshot is None:
        return sorted(f.name for f in concrete)
    values = instance.__dict__
    return sorted(
        f.name
        for f in concrete
        if f.attname in snapshot and values.get(f.attname, _MISSING) != snapshot[f.attname]
    )


def all_fields(instance: models.Model) -> list[str]:
    """The names of every concrete column but the primary key."""
    return [f.name for f in instance._meta.concrete_fields if not f.primary_key]


def written_attnames(instance: models.Model, update_fields: Iterable[str] | None) -> list[str]:
    meta = instance._meta
    if update_fields is None:
        return [f.attname for f in meta.concrete_fields]
    return [meta.get_field(name).attname for name in update_fields]  # type: ignore[union-attr]


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
        take(instance)
        return instance

    def refresh_from_db(self: models.Model, *args: Any, **kwargs: Any) -> None:
        original_refresh(self, *args, **kwargs)
        fields = kwargs.get("fields", args[1] if len(args) > 1 else None)
        take(self, None if fields is None else written_attnames(self, fields))

    from_db._realtime = True  # type: ignore[attr-defined]
    model.from_db = classmethod(from_db)  # type: ignore[method-assign,assignment]
    model.refresh_from_db = refresh_from_db  # type: ignore[method-assign]
