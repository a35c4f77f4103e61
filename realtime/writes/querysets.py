"""``RealtimeQuerySet`` and ``RealtimeManager``: where a decorated model's bulk writes and loads
enter realtime.

``QuerySet.update()``, ``bulk_create``, ``bulk_update`` and a ``QuerySet.delete()`` that Django
makes in one statement send no model signals, so they are announced by the queryset itself:
``RealtimeQuerySet`` hands each to ``realtime.writes.bulk``, and is otherwise Django's own. Its
fetches also keep what the rows were loaded with (``realtime.writes.tracking``), so that a save
knows what it changed. The async forms (``aupdate``, ``abulk_create``...) run these in a thread.

They are real, importable classes: querysets and managers pickle, ``type()`` names them, and
migrations see nothing (``RealtimeManager`` is never ``use_in_migrations``). The decorator puts a
``RealtimeManager`` in place of each manager of the model whose class is exactly Django's
``Manager`` (``objects`` included); the related managers Django derives from the default one
follow. A queryset or manager class of the application's own takes them in one line —
``class ContactQuerySet(RealtimeQuerySet)`` (or as a mixin, after the queryset classes it
extends: ``class SoftQuerySet(SoftDeletableQuerySet, RealtimeQuerySet)``), or
``class ContactManager(RealtimeManager)`` — and ``realtime.W031`` names each manager of a
decorated model whose queryset is not one, until it is. The models of the membership rows of
account paths take them the same way (``apps.ready`` installs them; ``realtime.W031`` names
theirs too), and so do the auto-created tables of links that decide who reads other rows: a
shared root's and those a guard reads (``realtime.writes.link_tables``). Nothing is patched at
run time.

The application's own methods stay what they are, wherever realtime's stands among the bases.
After it, they run first and hand Django's arguments on to realtime's. Before it, realtime's
run first and leave to theirs what Django's would not take: a ``delete()`` of theirs decides
what a delete is (a soft delete's ``update()`` is announced as an update; Django's delete, if
it comes to it, row by row by its signals; realtime's one-statement delete is for Django's
``delete()`` alone), and keywords ``update()`` and ``bulk_create`` are given that Django's do
not name are theirs (a ``bulk_create`` whose arguments do not bind to Django's at all is
written and not announced, with an ERROR naming it). After is what ``realtime.W031`` asks.

``silent()`` turns bulk announcements off where code announces by itself or wants none.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import weakref
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from django.core.exceptions import FieldDoesNotExist
from django.db import models

from realtime.compat.django_orm import (
    FetchingQuerySet,
    instance_hint,
    replace_base_manager,
    replace_managers,
    through_rows,
    write_alias,
)
from realtime.registry import options_for
from realtime.writes import (
    bulk,
    deletes,
    guard_links,
    link_tables,
    memberships,
    shared_roots,
    tracking,
)
from realtime.writes.silence import silenced
from realtime.writes.silence import silent as silent  # ``realtime.silent``

#: The models whose ``bulk_update`` is running here: the ``update()`` calls Django makes inside
#: it are announced by the ``bulk_update`` itself.
_updating: contextvars.ContextVar[frozenset[type[models.Model]]] = contextvars.ContextVar(
    "realtime_bulk_updating", default=frozenset()
)


_BULK_CREATE = inspect.signature(models.QuerySet.bulk_create)


_Model = TypeVar("_Model", bound=models.Model, covariant=True)
_Row = TypeVar("_Row", covariant=True)


class RealtimeQuerySet(FetchingQuerySet[_Model, _Row]):
    """A decorated model's queryset: Django's own, its bulk writes announced.

    Also a mixin, after the classes it extends:
    ``class MyQuerySet(SomeoneElsesQuerySet, RealtimeQuerySet)`` (before them works too: the
    module's docstring says how).
    """

    def fetched(self, instances: list[Any]) -> None:
        # The database the rows came from is each instance's ``_state.db``, as Django set it:
        # asking ``self.db`` would ask the routers a second time.
        if instances and self._tracked():
            db = instances[0]._state.db
            tracking.loaded(db, instances, refreshing=instance_hint(self))

    def _tracked(self) -> bool:
        options = options_for(self.model)
        return options is not None and "updated" in options.actions

    def update(self, **kwargs: Any) -> int:
        run = super().update
        theirs = _theirs(self, kwargs)
        if theirs:  # arguments of the application's own update(), after realtime's
            kwargs = {name: value for name, value in kwargs.items() if name not in theirs}
            run = functools.partial(run, **theirs)
        if _active(self) and memberships.watched(self.model):
            written = _attnames(self.model, kwargs)
            plain = run

            def run(**values: Any) -> int:
                return memberships.around_update(self, lambda: plain(**values), written)

        for side in _link_sides(self):
            run = _updating_links(side, self, run)

        if not _announcing(self) or deletes.left_to_unlinked(self, kwargs):
            return run(**kwargs)
        return bulk.update(self, kwargs, run)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs or not _reaches_djangos(type(self), "delete"):
            # The application's own delete() (after realtime's among the bases) decides what
            # a delete is, a soft one an update(): its writes are announced as they are made
            # (Django's delete, then, row by row by its signals). Django's refuses arguments.
            return super().delete(*args, **kwargs)
        meta = self.model._meta
        if meta.auto_created and _active(self) and _links_watched(self):
            run = super().delete
            if memberships.watched(self.model):
                run = functools.partial(memberships.around_delete, self, run)
            for side in _link_sides(self):
                run = functools.partial(link_tables.around_delete, side, self, run)
            return run()
        if _announcing(self):
            return bulk.deleted(self, super().delete)
        if options_for(self.model) is not None and silenced(self.model):
            return bulk.deleted_quietly(self, super().delete)
        return super().delete()

    delete.alters_data = True  # type: ignore[attr-defined]
    delete.queryset_only = True  # type: ignore[attr-defined]

    def bulk_create(self, objs: Iterable[Any], *args: Any, **kwargs: Any) -> list[Any]:
        links = _active(self) and memberships.watched(self.model)
        sides = _link_sides(self)
        if not (links or sides or _announcing(self)):
            return super().bulk_create(objs, *args, **kwargs)
        objs = list(objs)
        db = write_alias(self)  # never a replica: the pairs there may be behind
        try:
            given: dict[str, Any] | None = _bulk_create_arguments(self, objs, args, kwargs)
        except TypeError:
            if _reaches_djangos(type(self), "bulk_create"):  # Django refuses them, as it says
                return super().bulk_create(objs, *args, **kwargs)
            given = None  # the application's own bulk_create takes them: not told apart
        linked = memberships.links_before_bulk(self.model, objs, db, given or {}) if links else None
        upsert = bulk.before_upsert(self, objs, given) if given and _announcing(self) else None
        create = functools.partial(super().bulk_create, objs, *args, **kwargs)
        for side in sides:
            create = functools.partial(link_tables.around_create, side, objs, db, create)
        created = create()
        if linked is not None:
            memberships.created_in_bulk(self.model, created, db, linked)
        if _announcing(self):
            if given is None:
                bulk.not_announced(self, "bulk_create")
            else:
                bulk.created(self, created, given, upsert or bulk.Upsert())
        return created

    def bulk_update(
        self, objs: Iterable[Any], fields: Iterable[str], *args: Any, **kwargs: Any
    ) -> int:
        links = _active(self) and memberships.watched(self.model)
        sides = _link_sides(self)
        if not (links or sides or _announcing(self)):
            return super().bulk_update(objs, fields, *args, **kwargs)
        objs, fields = list(objs), list(fields)

        def run() -> int:
            token = _updating.set(_updating.get() | {self.model})
            try:
                return super(RealtimeQuerySet, self).bulk_update(objs, fields, *args, **kwargs)
            finally:
                _updating.reset(token)

        if links:
            rows = self.model._base_manager.using(write_alias(self))
            rows = rows.filter(pk__in=[o.pk for o in objs])
            written = _attnames(self.model, dict.fromkeys(fields))
            plain = run

            def run() -> int:
                return memberships.around_update(rows, plain, written)

        if sides:
            rows = self.model._base_manager.using(write_alias(self))
            rows = rows.filter(pk__in=[o.pk for o in objs])
            for side in sides:
                run = functools.partial(link_tables.around_bulk_update, side, rows, objs, run)

        if not _announcing(self):
            return run()
        return bulk.updated(self, objs, fields, run)

    # Like Django's own: never called from a template.
    update.alters_data = True  # type: ignore[attr-defined]
    bulk_create.alters_data = True  # type: ignore[attr-defined]
    bulk_update.alters_data = True  # type: ignore[attr-defined]


class RealtimeManager(models.Manager[_Model]):
    """Django's ``Manager`` whose querysets are ``RealtimeQuerySet``s.

    ``count()`` and ``exists()`` of a many-to-many's related manager derived from this class
    itself go through its table alone, as Django's do when the target's default manager is
    ``Manager`` itself (which this one stands for). Derived from a subclass (the
    application's own, which may filter its rows in ``get_queryset()``), they count what
    ``all()`` holds, as Django's do for a subclass of ``Manager``.
    """

    _queryset_class = RealtimeQuerySet

    def __eq__(self, other: object) -> bool:
        # Equal to a Django Manager built with the same arguments, as one Manager is to
        # another: the one it stands for (a migration's state holds such a Manager). A
        # subclass of the application's own is its own class, as with Django's.
        if type(self) is RealtimeManager and type(other) is models.Manager:
            return bool(self._constructor_args == other._constructor_args)  # type: ignore[attr-defined]
        return super().__eq__(other)

    def __hash__(self) -> int:
        return id(self)

    def count(self) -> int:
        rows = self._links_alone()
        return rows.count() if rows is not None else super().count()

    def exists(self) -> bool:
        rows = self._links_alone()
        return rows.exists() if rows is not None else super().exists()

    def _links_alone(self) -> models.QuerySet[Any, Any] | None:
        """The many-to-many's links to count on, where Django would count on them alone: a
        related manager Django derived from ``RealtimeManager`` itself, as it takes that
        shortcut only for ``Manager`` itself (``superclass is Manager``). A subclass adds
        what it adds (a filter in ``get_queryset()``): then the rows ``all()`` holds count."""
        if RealtimeManager not in type(self).__bases__:
            return None
        return through_rows(self)


def install(model: type[models.Model]) -> None:
    """Put a ``RealtimeManager`` in place of each manager ``model`` declares whose class is
    exactly Django's ``Manager`` (the ``objects`` Django adds included), and of the base
    manager Django makes for it (where neither it nor a parent names one)."""
    replace_managers(model, RealtimeManager)
    replace_base_manager(model, RealtimeManager)


def unextended(model: type[models.Model]) -> list[tuple[str, Any]]:
    """The managers of ``model`` (name, manager) whose querysets are no ``RealtimeQuerySet``:
    bulk writes through them are not announced. An abstract model has none to report:
    Django gives it no default manager, and its children managers of their own."""
    if model._meta.abstract:
        return []
    missing = []
    seen: set[str] = set()
    for manager in [*model._meta.managers, model._default_manager, model._base_manager]:
        name = manager.name or type(manager).__name__
        if name in seen:
            continue
        seen.add(name)
        try:
            queryset = manager.get_queryset()
        except Exception:
            queryset = None
        if not isinstance(queryset, RealtimeQuerySet):
            missing.append((name, manager))
    return missing


#: Per queryset class, whether ``super().<name>`` from ``RealtimeQuerySet`` is Django's own
#: method (``_reaches_djangos``).
_reaching: weakref.WeakKeyDictionary[type, dict[str, bool]] = weakref.WeakKeyDictionary()


def _reaches_djangos(queryset_class: type[models.QuerySet[Any, Any]], name: str) -> bool:
    """Whether the method ``name`` that ``RealtimeQuerySet``'s own calls as ``super()`` in
    ``queryset_class`` is Django's: no class of the application's stands after realtime's
    among its bases with one of its own (decided once per class)."""
    known = _reaching.get(queryset_class)
    if known is None:
        known = _reaching[queryset_class] = {}
    if name not in known:
        mro = queryset_class.__mro__
        after = mro[mro.index(RealtimeQuerySet) + 1 :]
        method = next((vars(cls)[name] for cls in after if name in vars(cls)), None)
        known[name] = method is vars(models.QuerySet)[name]
    return known[name]


def _theirs(queryset: RealtimeQuerySet[Any, Any], values: dict[str, Any]) -> dict[str, Any]:
    """The arguments of an ``update()`` that are no field of the model, where an
    ``update()`` of the application's own comes after realtime's to take them (Django's
    refuses them, as it says)."""
    if not values or _reaches_djangos(type(queryset), "update"):
        return {}
    meta = queryset.model._meta
    theirs = {}
    for name, value in values.items():
        try:
            meta.get_field(name)
        except FieldDoesNotExist:
            theirs[name] = value
    return theirs


def _bulk_create_arguments(
    queryset: RealtimeQuerySet[Any, Any], objs: list[Any], args: Any, kwargs: dict[str, Any]
) -> dict[str, Any]:
    """What a ``bulk_create`` was given, by the names of Django's arguments. Where a
    ``bulk_create`` of the application's own comes after realtime's, the keywords Django's
    does not name are that one's, and left out; raises ``TypeError`` where the arguments do
    not bind to Django's."""
    if not _reaches_djangos(type(queryset), "bulk_create"):
        kwargs = {name: value for name, value in kwargs.items() if name in _BULK_CREATE.parameters}
    return _BULK_CREATE.bind(queryset, objs, *args, **kwargs).arguments


def _active(queryset: models.QuerySet[Any, Any]) -> bool:
    """Whether bulk writes of ``queryset`` are announced here and now (not ``silent()``, and
    not the ``update()`` calls Django makes inside a ``bulk_update`` announced by itself)."""
    return not silenced(queryset.model) and queryset.model not in _updating.get()


def _links_watched(queryset: models.QuerySet[Any, Any]) -> bool:
    """Whether writes of the queryset's rows change who reads other rows: they are membership
    rows of an account path, or links of an auto-created table (``_link_sides``)."""
    return memberships.watched(queryset.model) or bool(_link_sides(queryset))


def _updating_links(
    side: link_tables.Side, queryset: models.QuerySet[Any, Any], run: Callable[..., int]
) -> Callable[..., int]:
    """``run`` (an ``update()``), telling what it changes of ``side``'s rows' readers."""

    def update(**values: Any) -> int:
        return link_tables.around_update(side, queryset, lambda: run(**values), values)

    return update


def _link_sides(queryset: models.QuerySet[Any, Any]) -> list[link_tables.Side]:
    """The rows whose readers writes of the queryset's rows change, where they are links of an
    auto-created table: a shared root's, a guard's (none when not ``_active``)."""
    model = queryset.model
    if not (model._meta.auto_created and _active(queryset)):
        return []
    return [found.side(model) for found in (shared_roots, guard_links) if found.watched(model)]


def _announcing(queryset: models.QuerySet[Any, Any]) -> bool:
    """Whether a bulk write of ``queryset`` announces its rows (its model is decorated)."""
    return _active(queryset) and options_for(queryset.model) is not None


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
