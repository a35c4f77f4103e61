"""Writes of an auto-created many-to-many table whose links decide who reads other rows.

The links of a shared root (``realtime.writes.shared_roots``) and those a guard reads
(``realtime.writes.guard_links``) are rows of a table Django makes, and change in every way
its rows can: through the many-to-many manager, which writes through the table's default
manager (``add`` is a ``bulk_create``, ``remove`` and ``clear`` a ``QuerySet.delete()``), and
through the table's own querysets (``bulk_create``, ``update()``, ``bulk_update``,
``delete()``). Django sends no signal for its rows, so they are watched where all of these
pass, as the membership rows of an account path are: ``apps.ready`` gives the table a
``RealtimeManager``, whose queryset hands each write here. Each is told once.

A ``Side`` says what a write of the links changes: the rows on one side of them (a root, a
guarded row), named by the values of the links' foreign key to that side. Their readers are
asked before the write (``before``) and again after it (``after``), which returns the events
of what changed. The reads run in savepoints, on the database the write goes to, and nothing
here fails the write.

Links Django deletes with a row they link (deleting a workspace a project is shared with)
go in its cascade, which is no ``QuerySet.delete()``: ``watch_deletes`` asks, in the
``pre_delete`` and ``post_delete`` of the rows at their other end, the readers of the rows
they name — for a ``through`` model of the application's own too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db import models
from django.db.models.signals import post_delete, pre_delete

from realtime.chunks import chunked
from realtime.compat.django_orm import matching, write_alias
from realtime.encoding import id_order, normal_id
from realtime.writes import on_commit, pending
from realtime.writes.events import Event
from realtime.writes.failsafe import failsafe, never_raises

T = TypeVar("T")
PENDING = "_realtime_links_deleting"
#: Links read in one statement by the values of their key.
CHUNK = 500


@dataclass(frozen=True)
class Side:
    """The rows whose readers a table's links decide, and how to ask them."""

    #: The links' foreign key to those rows, and to the rows at their other end.
    key: Any
    other: Any
    #: The readers of the rows the key values name, before a write: what ``after`` needs.
    before: Callable[[set[Any], str], Any]
    #: The events of what changed, given what ``before`` returned and the key values named
    #: only after the write (an ``update()`` writing an expression).
    after: Callable[[Any, set[Any], str], list[Event]]
    #: What the log names when realtime's part fails.
    label: str


def around_delete(
    side: Side,
    queryset: models.QuerySet[Any, Any],
    run: Callable[[], tuple[int, dict[str, int]]],
) -> tuple[int, dict[str, int]]:
    """Run a ``QuerySet.delete()`` of links (the many-to-many manager's ``remove()`` and
    ``clear()``, or the application's own), and tell what it changed."""
    db = write_alias(queryset)  # never a replica
    return _around(side, db, lambda: _keys_in(side, matching(queryset, db)), run)


def around_create(side: Side, objs: Sequence[models.Model], db: str, run: Callable[[], T]) -> T:
    """Run a ``bulk_create`` of links (the many-to-many manager's ``add()``, or the
    application's own). Links that existed already (``ignore_conflicts``) change nothing."""
    return _around(side, db, lambda: _new_keys(side, objs, db), run)


def around_update(
    side: Side, queryset: models.QuerySet[Any, Any], run: Callable[[], int], values: dict[str, Any]
) -> int:
    """Run an ``update()`` of links writing ``values``: the rows the links named before and
    the one they are given change (the rows an expression's values name are known only once
    written, and handed to ``Side.after`` alone, not asked before)."""
    db, key = write_alias(queryset), side.key  # never a replica
    pks: list[Any] = []

    def before() -> set[Any]:
        listed = list(matching(queryset, db).values_list("pk", key.attname))
        pks.extend(pk for pk, _ in listed)
        return {normal_id(value) for _, value in listed if value is not None} | (
            _given(key, values) or set()
        )

    def after() -> set[Any]:
        if {key.name, key.attname}.isdisjoint(values) or _given(key, values) is not None:
            return set()
        return _keys_in(side, queryset.model._base_manager.using(db).filter(pk__in=pks))

    return _around(side, db, before, run, after)


def around_bulk_update(
    side: Side,
    rows: models.QuerySet[Any, Any],
    objs: Sequence[models.Model],
    run: Callable[[], int],
) -> int:
    """Run a ``bulk_update`` of links (``rows``: those of ``objs``, on the write's database):
    the rows they named before and name after change."""
    return _around(side, rows.db, lambda: _keys_in(side, rows) | _keys_of(side, objs), run)


def _around(
    side: Side,
    db: str,
    keys: Callable[[], set[Any]],
    run: Callable[[], T],
    keys_after: Callable[[], set[Any]] | None = None,
) -> T:
    """Run a write of links, asking the readers of the rows whose key values they hold
    (``keys``, read before the write; ``keys_after``, after it) before and after it."""
    taken = failsafe(side.label, db, True, lambda: side.before(keys(), db))
    result = run()
    if taken is not None:

        def changes() -> list[Event]:
            later = keys_after() if keys_after is not None else set()
            return side.after(taken, later, db)

        on_commit.add_all(failsafe(side.label, db, True, changes) or [], db)
    return result


def _keys_in(side: Side, rows: models.QuerySet[Any, Any]) -> set[Any]:
    """The values of ``side``'s key that ``rows`` (links) hold."""
    values = rows.values_list(side.key.attname, flat=True).distinct()
    return {normal_id(value) for value in values if value is not None}


def _keys_of(side: Side, objs: Sequence[models.Model]) -> set[Any]:
    """The values of ``side``'s key that ``objs`` (links, as the application built them) hold."""
    values = (obj.__dict__.get(side.key.attname) for obj in objs)
    return {normal_id(value) for value in values if value is not None}


def _new_keys(side: Side, objs: Sequence[models.Model], db: str) -> set[Any]:
    """The values of ``side``'s key that ``objs`` hold in a link not stored yet (one statement
    per 500 of them)."""
    key, other = side.key, side.other
    pairs = {
        (normal_id(obj.__dict__.get(key.attname)), normal_id(obj.__dict__.get(other.attname)))
        for obj in objs
    }
    pairs = {pair for pair in pairs if None not in pair}
    stored = key.model._base_manager.using(db)
    others = sorted({value for _, value in pairs}, key=id_order)
    for chunk in chunked(sorted({value for value, _ in pairs}, key=id_order), CHUNK):
        rows = stored.filter(**{f"{key.attname}__in": chunk, f"{other.attname}__in": others})
        pairs -= {
            (normal_id(k), normal_id(o)) for k, o in rows.values_list(key.attname, other.attname)
        }
    return {value for value, _ in pairs}


def _given(key: Any, values: dict[str, Any]) -> set[Any] | None:
    """The value of ``key`` an ``update()`` writes (a row or its key); ``None`` when it writes
    an expression, whose value is known only once written."""
    for name in (key.name, key.attname):
        if name in values:
            value = values[name]
            if isinstance(value, models.Model):
                value = getattr(value, key.target_field.attname)
            if hasattr(value, "resolve_expression"):
                return None
            return set() if value is None else {normal_id(value)}
    return set()


# Links deleted with a row they link ------------------------------------------------------------

#: dispatch uid -> a model at the other end of links -> (their table, its side)
_deleting: dict[str, dict[type[models.Model], list[tuple[type[models.Model], Side]]]] = {}


def watch_deletes(uid: str, tables: Sequence[tuple[type[models.Model], Side]]) -> None:
    """Tell what the links of ``tables`` change when Django deletes them with a row at their
    other end (``uid``: one watcher's connections, replaced by its next call)."""
    for other in _deleting.pop(uid, {}):
        pre_delete.disconnect(sender=other, dispatch_uid=uid)
        post_delete.disconnect(sender=other, dispatch_uid=uid)
    found: dict[type[models.Model], list[tuple[type[models.Model], Side]]] = {}
    for through, side in tables:
        other = side.other.related_model
        if isinstance(other, type):
            found.setdefault(other, []).append((through, side))
    _deleting[uid] = found
    for other in found:
        deleting = functools.partial(_on_deleting, uid)
        deleted = functools.partial(_on_deleted, uid)
        pre_delete.connect(deleting, sender=other, dispatch_uid=uid, weak=False)
        post_delete.connect(deleted, sender=other, dispatch_uid=uid, weak=False)


@never_raises
def _on_deleting(
    uid: str, sender: type[models.Model], instance: models.Model, using: str, **kwargs: Any
) -> None:
    """A row at the other end of links is deleted, and its links with it: the readers of the
    rows they name, asked now, while the links exist."""
    name = f"{PENDING}:{uid}"
    pending.drop(instance, name)  # a delete that failed after its pre_delete left it

    def ask() -> list[tuple[Side, Any]]:
        asked = []
        for through, side in _deleting.get(uid, {}).get(sender, ()):
            links = through._base_manager.using(using).filter(**{side.other.name: instance})
            asked.append((side, side.before(_keys_in(side, links), using)))
        return asked

    label = f"the readers the links of {sender._meta.label}:{instance.pk} give"
    pending.put(instance, name, failsafe(label, using, True, ask))


@never_raises
def _on_deleted(
    uid: str, sender: type[models.Model], instance: models.Model, using: str, **kwargs: Any
) -> None:
    """The row and its links are gone: what they changed, told."""
    for side, asked in pending.take(instance, f"{PENDING}:{uid}") or []:
        changes = functools.partial(side.after, asked, set(), using)
        on_commit.add_all(failsafe(side.label, using, True, changes) or [], using)
