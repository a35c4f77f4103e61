"""Bulk writes take part: every manager and queryset of a decorated model announces them.

``QuerySet.update()``, ``bulk_create`` and ``bulk_update`` send no model signals. Rather than
asking applications to change their managers, realtime gives each manager of a decorated
model (declared, inherited, default, base — and so the related managers Django derives from
the default one) a class of its own: a subclass of the manager's class, same name and module
(migrations see no change), whose ``get_queryset`` hands back the queryset as an announcing
subclass of its own class. The queryset's three bulk writes go through ``realtime.writes.bulk``;
everything else is the application's, unchanged. The async forms (``aupdate``,
``abulk_create``, ``abulk_update``) run the sync ones in a thread, so they announce too.

A manager whose queryset does not come back announcing (a ``get_queryset`` that builds
something that is not a ``QuerySet``) is named by a system check (``realtime.W020``).
``silent()`` turns bulk announcements off where code announces by itself or wants none.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from django.core.exceptions import FieldDoesNotExist
from django.db import connections, models

from realtime.compat.django import in_transaction, managers_of
from realtime.registry import options_for
from realtime.writes import bulk, memberships

_silenced: contextvars.ContextVar[bool] = contextvars.ContextVar("realtime_silent", default=False)
#: The models whose ``bulk_update`` is running here: the ``update()`` calls Django makes inside
#: it are announced by the ``bulk_update`` itself.
_updating: contextvars.ContextVar[frozenset[type[models.Model]]] = contextvars.ContextVar(
    "realtime_bulk_updating", default=frozenset()
)


@contextmanager
def silent() -> Iterator[None]:
    """Announce no bulk write (``update``, ``bulk_create``, ``bulk_update``) made inside.

    For code that announces by itself (``realtime.announce``) or wants no announcement (a
    data migration). Writes that send model signals (``save``, ``delete``) still announce.
    """
    token = _silenced.set(True)
    try:
        yield
    finally:
        _silenced.reset(token)


def _active(queryset: models.QuerySet[Any, Any]) -> bool:
    """Whether bulk writes of ``queryset`` are announced here and now (not ``silent()``, and
    not the ``update()`` calls Django makes inside a ``bulk_update`` announced by itself)."""
    return not _silenced.get() and queryset.model not in _updating.get()


def _announcing(queryset: models.QuerySet[Any, Any]) -> bool:
    """Whether a bulk write of ``queryset`` announces its rows (its model is decorated)."""
    return _active(queryset) and options_for(queryset.model) is not None


#: (model, foreign key) pairs a delete in progress is unlinking (``on_delete=SET_NULL`` and
#: the like): Django's ``update()`` of those children is announced by
#: ``realtime.writes.unlinked``, which knows the row they were linked to.
_unlinking: contextvars.ContextVar[frozenset[tuple[Any, str]]] = contextvars.ContextVar(
    "realtime_unlinking", default=frozenset()
)


def unlinking(pairs: Iterable[tuple[Any, str]], on: bool) -> None:
    """Note (``on``) or forget that a delete is unlinking the children of ``pairs``."""
    now = _unlinking.get()
    _unlinking.set(now | frozenset(pairs) if on else now - frozenset(pairs))


def _left_to_unlinked(queryset: models.QuerySet[Any, Any], values: dict[str, Any]) -> bool:
    """Whether this ``update()`` is the one Django makes for a delete unlinking children (one
    foreign key written, in the delete's transaction)."""
    pairs = _unlinking.get()
    if not pairs or len(values) != 1:
        return False
    (name,) = values
    model = queryset.model._meta.concrete_model
    return (model, name) in pairs and in_transaction(connections[queryset.db])


_BULK_CREATE = inspect.signature(models.QuerySet.bulk_create)


class AnnouncingQuerySet(models.QuerySet[Any, Any]):
    """Mixed in before a decorated model's queryset class: its bulk writes announce."""

    def update(self, **kwargs: Any) -> int:
        run = super().update
        if _active(self) and memberships.watched(self.model):
            written = _attnames(self.model, kwargs)
            plain = run

            def run(**values: Any) -> int:
                return memberships.around_update(self, lambda: plain(**values), written)

        if not _announcing(self) or _left_to_unlinked(self, kwargs):
            return run(**kwargs)
        return bulk.update(self, kwargs, run)

    def delete(self) -> tuple[int, dict[str, int]]:
        meta = self.model._meta
        if meta.auto_created and _active(self) and memberships.watched(self.model):
            return memberships.around_delete(self, super().delete)
        return super().delete()

    delete.alters_data = True  # type: ignore[attr-defined]
    delete.queryset_only = True  # type: ignore[attr-defined]

    def bulk_create(
        self, objs: Iterable[models.Model], *args: Any, **kwargs: Any
    ) -> list[models.Model]:
        links = _active(self) and memberships.watched(self.model)
        if not (links or _announcing(self)):
            return super().bulk_create(objs, *args, **kwargs)
        objs = list(objs)
        existing = memberships.existing_pairs(self.model, objs, self.db) if links else {}
        created = super().bulk_create(objs, *args, **kwargs)
        if links:
            memberships.created_in_bulk(self.model, created, self.db, existing)
        if _announcing(self):
            given = _BULK_CREATE.bind(self, objs, *args, **kwargs).arguments
            bulk.created(self, created, given)
        return created

    def bulk_update(
        self, objs: Iterable[Any], fields: Iterable[str], *args: Any, **kwargs: Any
    ) -> int:
        links = _active(self) and memberships.watched(self.model)
        if not (links or _announcing(self)):
            return super().bulk_update(objs, fields, *args, **kwargs)
        objs, fields = list(objs), list(fields)

        def run() -> int:
            token = _updating.set(_updating.get() | {self.model})
            try:
                return super(AnnouncingQuerySet, self).bulk_update(objs, fields, *args, **kwargs)
            finally:
                _updating.reset(token)

        if links:
            rows = self.model._base_manager.using(self.db).filter(pk__in=[o.pk for o in objs])
            written = _attnames(self.model, dict.fromkeys(fields))
            plain = run

            def run() -> int:
                return memberships.around_update(rows, plain, written)

        if not _announcing(self):
            return run()
        return bulk.updated(self, objs, fields, run)

    # Like Django's own: never called from a template.
    update.alters_data = True  # type: ignore[attr-defined]
    bulk_create.alters_data = True  # type: ignore[attr-defined]
    bulk_update.alters_data = True  # type: ignore[attr-defined]


def _attnames(model: type[models.Model], values: dict[str, Any]) -> set[str]:
    """The columns ``values`` (field names) write; names that are no field are left out (the
    write raises its own error)."""
    found = set()
    for name in values:
        try:
            field = model._meta.get_field(name)
        except FieldDoesNotExist:
            continue
        found.add(str(getattr(field, "attname", name)))
    return found


class AnnouncingManager:
    """Mixed in before a decorated model's manager class: its querysets announce."""

    def get_queryset(self) -> models.QuerySet[Any, Any]:
        queryset: models.QuerySet[Any, Any] = super().get_queryset()  # type: ignore[misc]
        if not isinstance(queryset, models.QuerySet):
            return queryset  # left alone, and named by a system check (W031)
        queryset.__class__ = _announcing_class(type(queryset))
        if not isinstance(queryset.model._base_manager, AnnouncingManager):
            # Django makes the base manager anew whenever its app registry changes.
            extend(queryset.model)
        return queryset


_classes: dict[tuple[type, type], type] = {}


def _subclass(mixin: type, base: type) -> type:
    """``base`` with ``mixin`` before it, under ``base``'s name and module (made once): a
    manager's migrations and repr stay the application's."""
    if issubclass(base, mixin):
        return base
    made = _classes.get((mixin, base))
    if made is None:
        namespace = {"__module__": base.__module__, "__qualname__": base.__qualname__}
        made = _classes[mixin, base] = type(base.__name__, (mixin, base), namespace)
    return made


def _announcing_class(queryset_class: type) -> type:
    return _subclass(AnnouncingQuerySet, queryset_class)


def extend(model: type[models.Model]) -> None:
    """Give every manager of ``model`` its announcing class (again, where Django rebuilt one)."""
    for manager in managers_of(model):
        if not isinstance(manager, AnnouncingManager):
            manager.__class__ = _subclass(AnnouncingManager, type(manager))


def unextended(model: type[models.Model]) -> list[str]:
    """The names of ``model``'s managers whose querysets do not announce bulk writes."""
    missing = []
    for manager in managers_of(model):
        try:
            announcing = isinstance(manager.get_queryset(), AnnouncingQuerySet)
        except Exception:
            announcing = False
        name = manager.name or type(manager).__name__
        if not announcing and name not in missing:
            missing.append(name)
    return missing
