"""Bulk writes announced: ``update()``, ``bulk_create``, ``bulk_update`` and ``QuerySet.delete()``
of decorated models.

Each is announced as the saves or deletes it stands for would be — same events, audiences,
coalescing, origin and views — in a bounded number of statements, never one per row, on the
database the write goes to (``realtime.compat.django_orm.write_alias``), never a replica:

* ``update(**values)``: on PostgreSQL and SQLite, when the values written cannot change who
  reads a row and the model's columns live in its own table, the ``UPDATE`` itself returns the
  rows it changed (``RETURNING``, ``realtime.compat.django_orm.Returning``): no statement is
  added, and exactly the rows written are announced, with the values they hold after it, an
  ``F()`` expression's result included. Otherwise the keys of the rows the queryset matches are
  read first, through the caller's own query (one statement); when the values written may
  change who reads a row (its scope, a guard's column, the first hop of an account or shared
  path), the rows are locked and their audience read by primary key through the base manager —
  never through the caller's joins, which may hide readers, and never locking a joined table's
  rows (outside a transaction, in one of realtime's; for a queryset asking
  ``select_for_update()``, whose ``update()`` Django may refuse outside one, in none,
  unlocked). The caller's ``select_for_update()`` and ``select_related()`` are left out of
  realtime's reads (``realtime.compat.django_orm.matching``). After the write the rows are read
  again by key (one statement per 500) unless their events carry only columns written as plain
  values; ``changed`` is the names given. Django's own ``update()`` runs as it would without
  realtime: a failing one fails, and leaves the transaction, exactly as without realtime.
* ``bulk_create``: each row inserted is ``<model>.created``; rows an ``update_conflicts``
  insert found already there are ``<model>.updated``; where the database does not say which
  rows it inserted (``ignore_conflicts``, or no primary keys returned), one truncated event per
  scope.
* ``bulk_update``: each object whose listed fields differ from what its row held
  (``realtime.writes.tracking``) is ``<model>.updated``, ``changed`` those fields.
* ``QuerySet.delete()``, when Django would delete the rows in one statement were it not for
  realtime's own receivers (nothing cascades, nothing else listens): that statement returns
  the rows it deletes (PostgreSQL and SQLite, for a model whose events need nothing but the
  row: no to-many or generic relation, account path, guard, shared root or ``payload=``); the
  rows are read first (one statement for the first ``REALTIME_BULK_LIMIT``, one for the
  scopes of the rest) and deleted in one statement. Where Django would collect, it deletes
  them row by row, and each row's signals announce it.

Past ``REALTIME_BULK_LIMIT`` rows, the rest fold into one truncated event per distinct scope
(per batch of accounts for account models; one for a global model), with ``data`` null:
clients read again. Any failure while reading what to announce costs the announcements,
never the write (``realtime.writes.failsafe``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, NotSupportedError, connections, models, transaction
from django.db.models import Q

from realtime.chunks import chunked
from realtime.compat.django import in_transaction
from realtime.compat.django_orm import (
    Returning,
    can_return_rows,
    fast_delete,
    lock_options,
    matching,
    selects_for_update,
    write_alias,
)
from realtime.conf import conf
from realtime.encoding import id_order, row_key, sorted_ids
from realtime.paths import is_foreign_key, key_fields, key_lookup, split_path, target_pk
from realtime.registry import ModelOptions, is_generic_fk, options_for
from realtime.writes import on_commit, tracking
from realtime.writes.audiences import (
    READ_CHUNK,
    Plan,
    accounts_of_rows,
    delete_events,
    first_hop_attname,
    moves_audience,
    plan_before,
    planned_attnames,
    scoped_befores,
    stored_rows,
    take_before,
    take_befores,
    unsure_attnames,
)
from realtime.writes.events import (
    READS_AS,
    UNREADABLE,
    Before,
    Event,
    as_stored,
    folded_event,
    read_by,
    read_event,
    reads_rows_apart,
    to_many_of_rows,
    with_columns_of,
)
from realtime.writes.failsafe import WritesOwnError, failsafe

logger = logging.getLogger(__name__)


def update(
    queryset: models.QuerySet[Any, Any], values: dict[str, Any], run: Callable[..., int]
) -> int:
    """Run ``run(**values)`` (the queryset's own ``update``) and announce the rows it changed."""
    options = _options(queryset)
    if "updated" not in options.actions or _refused(queryset):
        return run(**values)
    meta = queryset.model._meta
    try:
        fields = [meta.get_field(name) for name in values]
    except Exception:
        return run(**values)  # the update raises its own error
    written = {getattr(field, "attname", field.name) for field in fields}
    if any(field in key_fields(queryset.model) for field in fields):
        return _rekeyed(queryset, options, values, run, written)
    db = write_alias(queryset)
    changed = sorted({field.name for field in fields})
    moving = moves_audience(options, written)
    what = f"a bulk update of {options.name}"
    returning = (
        None
        if moving
        else failsafe(what, db, False, lambda: _returning(queryset.model, options, db))
    )
    if returning is not None:
        with connections[db].execute_wrapper(returning):
            count = run(**values)
        _announce_returned(options, queryset.model, db, returning, changed, written, count)
        return count
    with _locking(queryset, db, moving):
        matched = failsafe(what, db, True, lambda: _matched(queryset, options, db, moving))
        count = run(**values)
        pks = None if matched is None else [pk for pk, _ in matched.rows]
        tracking.bulk_written(queryset.model, pks, written, db)
        if matched is not None:
            if count != len(matched.rows):
                logger.warning(
                    "realtime: an update() of %s changed %d rows where %d matched a moment "
                    "before (another transaction wrote rows it matches); those are not announced",
                    options.name,
                    count,
                    len(matched.rows),
                )
            exact = count == len(matched.rows)
            failsafe(what, db, True, lambda: matched.announce(changed, values, moving, exact))
    return count


def _refused(queryset: models.QuerySet[Any, Any]) -> bool:
    """Whether Django refuses to write through ``queryset`` (sliced, or a union): it raises
    its own error, and there is nothing to announce."""
    return bool(queryset.query.is_sliced or queryset.query.combinator)


def _upserted(
    options: ModelOptions,
    exact: list[models.Model],
    objs: Sequence[models.Model],
    kwargs: dict[str, Any],
    upsert: Upsert,
    db: str,
) -> None:
    """Announce an upsert's rows as they are now: a row that was there (``upsert``) is
    ``updated``, and kept the columns ``update_fields`` leave out (its scope among them,
    unless listed), whatever the object holds; one it inserted is ``created``; where which
    is which is not known, every row is ``updated``. What the objects know of their rows:
    the columns every row got from them."""
    befores = upsert.befores
    model = options.model
    meta = model._meta
    unique = [field.attname for field in _unique_fields(model, kwargs)]
    written = [*(_attname(model, name) for name in kwargs["update_fields"]), *unique]
    made = tracking.fate(db)
    for obj in exact:
        tracking.saved(obj, written, db, made)
    changed = sorted({meta.get_field(name).name for name in kwargs["update_fields"]})
    announced = exact[: conf.BULK_LIMIT]
    rows = _stored_rows(model, {obj.pk for obj in announced}, db)
    to_many = to_many_of_rows(options, model, list(rows), db)

    def event(obj: models.Model) -> Event | None:
        row = rows[obj.pk]
        if upsert.existing is not None and row_key(obj.pk) not in upsert.existing:
            if "created" not in options.actions:
                return None
            known = to_many[row_key(obj.pk)]
            return read_event(options, row, "created", None, to_many=known, using=db)
        if "updated" not in options.actions:
            return None
        return _updated_event(options, row, changed, befores.get(obj.pk), to_many, db)

    _add_all((event(obj) for obj in announced if obj.pk in rows), db)
    if "updated" not in options.actions:
        return
    surplus = [obj.pk for obj in exact[conf.BULK_LIMIT :]]
    past_limit = set(surplus)
    audiences = [_past_audience(options, b) for pk, b in befores.items() if pk in past_limit]
    stored = model._base_manager.using(db)
    for chunk in chunked(surplus, READ_CHUNK):
        audiences += _audiences_of(options, stored.filter(pk__in=chunk))
    told = {id(obj) for obj in exact}
    audiences += [_audience_of(options, obj) for obj in objs if id(obj) not in told]
    _fold(options, "updated", audiences, db)


@dataclass
class Upsert:
    """What the rows a ``bulk_create(update_conflicts=True)`` may update were before it: the
    keys (``row_key``) of those already there, ``None`` where that is not known (the rows
    cannot be matched: MySQL names no ``unique_fields``), and who could read those its
    ``update_fields`` may move."""

    existing: set[Any] | None = None
    befores: dict[Any, Before] = field(default_factory=dict)


def before_upsert(
    queryset: models.QuerySet[Any, Any], objs: Sequence[models.Model], kwargs: dict[str, Any]
) -> Upsert:
    """What the rows an upsert matches were before it (``Upsert``): the rows its
    ``unique_fields`` match, read before the write (one statement per 100 objects), and
    their readers where its ``update_fields`` may move rows (a column that decides who reads
    them). Empty for any other ``bulk_create``, and where the rows cannot be matched so."""
    options = _options(queryset)
    model, db = queryset.model, write_alias(queryset)
    unique = upsert_unique_fields(model, kwargs)
    try:
        written = {_attname(model, name) for name in kwargs.get("update_fields") or ()}
    except Exception:
        return Upsert()  # bulk_create raises its own error
    if unique is None or not {"created", "updated"} & set(options.actions):
        return Upsert()
    moving = "updated" in options.actions and bool(written & set(planned_attnames(options)))

    def read() -> Upsert:
        pks = upsert_matches(model, objs, unique, db)
        stored = model._base_manager.using(db)
        befores = scoped_befores(options, stored, pks) if moving else {}
        return Upsert({row_key(pk) for pk in pks}, befores)

    return failsafe(f"a bulk create of {options.name}", db, True, read) or Upsert()


def upsert_matches(
    model: type[models.Model], objs: Sequence[models.Model], unique: Sequence[Any], db: str
) -> list[Any]:
    """The keys of the stored rows that ``objs`` match by the ``unique`` fields (an upsert's
    ``unique_fields``): the rows it would update. One statement per 100 objects."""
    stored = model._base_manager.using(db)
    pks: list[Any] = []
    for chunk in chunked(list(objs), 100):
        matched = Q()
        for obj in chunk:
            matched |= Q(**{field.attname: getattr(obj, field.attname) for field in unique})
        pks += stored.filter(matched).values_list("pk", flat=True)
    return pks


def upsert_unique_fields(model: type[models.Model], kwargs: dict[str, Any]) -> list[Any] | None:
    """The fields an upsert (``update_conflicts`` with ``unique_fields``) matches its rows
    by; ``None`` for any other ``bulk_create``, and where they cannot be read or matched by
    (``bulk_create`` raises its own error)."""
    if not kwargs.get("update_conflicts") or not kwargs.get("unique_fields"):
        return None
    try:
        unique = _unique_fields(model, kwargs)
    except Exception:
        return None
    return unique if all(field.concrete for field in unique) else None


def _unique_fields(model: type[models.Model], kwargs: dict[str, Any]) -> list[Any]:
    """The fields an upsert's ``unique_fields`` name (``"pk"``: the primary key)."""
    meta = model._meta
    names = kwargs.get("unique_fields") or ()
    return [meta.pk if name == "pk" else meta.get_field(name) for name in names]


def created(
    queryset: models.QuerySet[Any, Any],
    objs: Sequence[models.Model],
    kwargs: dict[str, Any],
    upsert: Upsert,
) -> None:
    """Announce the rows ``bulk_create`` wrote (``kwargs``: the options it was given;
    ``upsert``: what the rows an upsert matched were before it, ``before_upsert``)."""
    options = _options(queryset)
    model, db = queryset.model, write_alias(queryset)

    def announce() -> None:
        # ignore_conflicts: which rows went in is not known. update_conflicts: the rows its
        # unique_fields matched before it were there (updated), the others went in.
        if kwargs.get("update_conflicts"):
            _upserted(options, [o for o in objs if o.pk is not None], objs, kwargs, upsert, db)
            return
        exact = [] if kwargs.get("ignore_conflicts") else [o for o in objs if o.pk is not None]
        tracking.inserted(exact, db)
        if "created" not in options.actions:
            return
        announced = exact[: conf.BULK_LIMIT]
        keyed: dict[Any, dict[str, list[Any]]] = {}
        if reads_rows_apart(options, created=True):  # to_field keys, accounts: all at once
            keyed = to_many_of_rows(options, model, [o.pk for o in announced], db, created=True)
        _add_all(
            (
                read_event(
                    options, obj, "created", None, to_many=keyed.get(row_key(obj.pk)), using=db
                )
                for obj in announced
            ),
            db,
        )
        told = {id(obj) for obj in exact}
        rest = [*exact[conf.BULK_LIMIT :], *(obj for obj in objs if id(obj) not in told)]
        _fold(options, "created", [_audience_of(options, obj) for obj in rest], db)

    failsafe(f"a bulk create of {options.name}", db, True, announce)


def updated(
    queryset: models.QuerySet[Any, Any],
    objs: Sequence[models.Model],
    fields: Sequence[str],
    run: Callable[[], int],
) -> int:
    """Run ``run()`` (the queryset's own ``bulk_update``) and announce the objects it changed."""
    options = _options(queryset)
    if "updated" not in options.actions:
        return run()
    try:
        named = [queryset.model._meta.get_field(name) for name in fields]
    except Exception:
        return run()  # bulk_update raises its own error
    if any(not f.concrete or f.many_to_many or f.primary_key for f in named):
        return run()  # and so for fields it cannot write
    db = write_alias(queryset)
    what = f"a bulk update of {options.name}"
    changes = failsafe(what, db, True, lambda: _changes(options, objs, fields, db))
    count = run()
    if changes is not None:
        failsafe(what, db, True, lambda: _announce_changes(options, changes, objs, fields, db))
    return count


def not_announced(queryset: models.QuerySet[Any, Any], method: str) -> None:
    """Say that a ``method`` of ``queryset`` ran unannounced: its arguments, which its own
    class (after realtime's among its bases) takes, do not tell realtime what Django was
    asked to write. An ERROR (raised under ``raise_failures``), never a silent miss."""
    label = queryset.model._meta.label
    cls = type(queryset)

    def refuse() -> None:
        raise TypeError(
            f"the arguments of {cls.__module__}.{cls.__qualname__}.{method}() do not bind to "
            f"Django's QuerySet.{method}(): the rows of {label} it wrote are not "
            f"announced. Put RealtimeQuerySet after the classes it extends among the bases "
            f"(class {cls.__name__}(..., RealtimeQuerySet)), so that theirs run first and "
            f"hand Django's arguments on, or announce the rows with realtime.announce()"
        )

    failsafe(f"a {method} of {label}", write_alias(queryset), False, refuse)


def deleted(
    queryset: models.QuerySet[Any, Any], run: Callable[[], tuple[int, dict[str, int]]]
) -> tuple[int, dict[str, int]]:
    """Run a ``QuerySet.delete()``: in one statement, its rows read and announced here, when
    Django would delete them so but for realtime's own receivers; else ``run()`` (Django's,
    whose signals announce each row)."""
    options = _options(queryset)
    if "deleted" not in options.actions:
        return run()
    from realtime.writes.receivers import on_post_delete, on_pre_delete

    db = write_alias(queryset)
    receivers = (on_pre_delete, on_post_delete)
    returning = failsafe(
        f"a bulk delete of {options.name}",
        db,
        False,
        lambda: _returning_delete(queryset.model, options, db),
    )
    if returning is not None:
        with connections[db].execute_wrapper(returning):
            count = fast_delete(queryset, receivers, db)
        if count is None:
            return run()
        _announce_deleted(options, queryset.model, db, returning, count)
        return _deleted(queryset, count)
    events: list[Event] = []
    keys: list[Any] = []

    def read(doomed: models.QuerySet[Any, Any]) -> models.QuerySet[Any, Any] | None:
        announced, narrowed, told = _doomed_events(options, doomed, db)
        events.extend(announced)
        keys.extend(told)
        return narrowed

    count = fast_delete(queryset, receivers, db, before=read)
    if count is None:
        return run()
    if count < len(keys) or any(event.folded for event in events):
        # Rows read that another transaction changed before the delete could reach them
        # (they no longer match): they stay, and are not told deleted.
        found = failsafe(
            f"a bulk delete of {options.name}",
            db,
            True,
            lambda: _still_there(queryset.model, keys, db),
        )
        events = [e for e in events if e.folded or row_key(e.pk) not in (found or ())]
    _add_all(events, db)
    return _deleted(queryset, count)


def _still_there(model: type[models.Model], keys: list[Any], db: str) -> set[Any]:
    """Of the rows ``keys``, those still there (by ``row_key``): one statement per 500 (row
    by row for a composite key)."""
    stored = model._base_manager.using(db).order_by()
    if len(key_fields(model)) > 1:
        return {row_key(pk) for pk in keys if stored.filter(pk=pk).exists()}
    found: set[Any] = set()
    for chunk in chunked(keys, READ_CHUNK):
        found.update(row_key(pk) for pk in stored.filter(pk__in=chunk).values_list("pk", flat=True))
    return found


def deleted_quietly(
    queryset: models.QuerySet[Any, Any], run: Callable[[], tuple[int, dict[str, int]]]
) -> tuple[int, dict[str, int]]:
    """Run a ``QuerySet.delete()`` of a decorated model that announces nothing
    (``silent()``): in one statement where Django would make it one but for realtime's own
    receivers, which would hear nothing; else ``run()`` (Django's)."""
    from realtime.writes.receivers import on_post_delete, on_pre_delete

    count = fast_delete(queryset, (on_pre_delete, on_post_delete), write_alias(queryset))
    return run() if count is None else _deleted(queryset, count)


def _deleted(queryset: models.QuerySet[Any, Any], count: int) -> tuple[int, dict[str, int]]:
    """What ``QuerySet.delete()`` answers for ``count`` rows deleted in one statement."""
    return count, ({queryset.model._meta.label: count} if count else {})


def _returning_delete(
    model: type[models.Model], options: ModelOptions, db: str
) -> Returning | None:
    """What reads the rows a one-statement delete removes from the statement itself, when
    their events need nothing but the rows (no to-many or generic relation, account path,
    guard, shared root or ``payload=`` to read while the row is there) and the database
    returns rows; else ``None``."""
    if options.delete_queries or options.payload is not None or options.user_field is not None:
        return None  # (the rows past the limit fold to their accounts, read before they go)
    if not can_return_rows(db):
        return None
    return _returning_columns(model, options, db, "DELETE")


def _announce_deleted(
    options: ModelOptions, model: type[models.Model], db: str, returning: Returning, count: int
) -> None:
    """Announce the rows a delete removed as its statement returned them: the first
    ``REALTIME_BULK_LIMIT`` one by one, the rest folded by scope."""

    def announce() -> None:
        rows, rest = _returned(model, db, returning, count)
        _add_all(delete_events(options, rows, db), db)
        _fold(options, "deleted", [values[0] if values else None for values in rest], db)

    failsafe(f"a bulk delete of {options.name}", db, True, announce)


def _returned(
    model: type[models.Model], db: str, returning: Returning, count: int
) -> tuple[list[models.Model], list[tuple[Any, ...]]]:
    """The rows ``returning`` kept, as instances in key order, and what it kept of the rest;
    raises when a write that changed ``count`` rows went by without the statement it reads."""
    if count and returning.lost:
        raise RuntimeError(
            f"{count} rows of {model._meta.label} were written by a statement that returned "
            "nothing where realtime asked it to return them; they are not announced. An "
            "execute wrapper that rewrites statements may add comments, not other text; "
            "realtime.announce() announces such writes"
        )
    if count and not returning.seen:
        raise RuntimeError(
            f"{count} rows of {model._meta.label} were written by a statement realtime did not "
            f"recognise as Django's UPDATE or DELETE of the table ({returning.other!r}); they "
            "are not announced. An execute wrapper that rewrites statements may put comments "
            "before them, not other text; realtime.announce() announces such writes"
        )
    rows, rest = returning.converted()
    attnames = [field.attname for field in model._meta.concrete_fields]
    built = [model.from_db(db, attnames, list(row)) for row in rows]
    return sorted(built, key=lambda row: id_order(row.pk)), rest


def _whole(doomed: models.QuerySet[Any, Any]) -> models.QuerySet[Any, Any]:
    """The rows a delete is about to remove, read with every column whatever the caller's
    ``only()`` or ``defer()`` left out (the events carry them: no statement per row to read
    what they lack); as they are where Django refuses to defer."""
    try:
        return doomed.defer(None)
    except (TypeError, NotSupportedError):
        return doomed


def _doomed_events(
    options: ModelOptions, doomed: models.QuerySet[Any, Any], db: str
) -> tuple[list[Event], models.QuerySet[Any, Any] | None, list[Any]]:
    """The events of the rows a delete is about to remove: the first ``REALTIME_BULK_LIMIT``
    one by one (one statement), the rest folded by scope (one more). A filter across a
    to-many relation matches a row once per related row: each is counted once. And the rows
    to delete narrowed to those announced (``_as_read``; ``None``: all of ``doomed``), and
    the keys of those told one by one."""
    limit = conf.BULK_LIMIT
    events: list[Event] = []
    narrowed: list[models.QuerySet[Any, Any] | None] = [None]
    keys: list[Any] = []

    def read() -> None:
        whole = _whole(doomed).order_by("pk")
        rows = list(whole[: limit + 1])
        if len({row.pk for row in rows}) < len(rows):  # read once per related row
            rows = list(whole.distinct()[: limit + 1])
        events.extend(delete_events(options, rows[:limit], db))
        keys.extend(row.pk for row in rows[:limit])
        rest = None
        if len(rows) > limit:
            rest = (rows[limit].pk, _audiences_of(options, doomed.filter(pk__gte=rows[limit].pk)))
            events.extend(_folded(options, "deleted", rest[1]))
        narrowed[0] = _as_read(options, doomed, [row.pk for row in rows[:limit]], rest)

    failsafe(f"a bulk delete of {options.name}", db, True, read)
    return events, narrowed[0], keys


def _as_read(
    options: ModelOptions,
    doomed: models.QuerySet[Any, Any],
    keys: list[Any],
    rest: tuple[Any, list[Any]] | None,
) -> models.QuerySet[Any, Any] | None:
    """``doomed`` narrowed to the rows its read announced, so that a row another transaction
    commits between the read and the delete (PostgreSQL and MySQL read each statement afresh)
    is not deleted unannounced: those read by key, and from the first past the limit on
    (``rest``: its key and the scopes read of them), the rows of those scopes, whose truncated
    events tell their readers to read again (every row of a global model: its one event tells
    everyone). The delete then ran before such a row came, as it might have. ``None`` (delete
    what matches) for a composite key, and past the limit for an account model."""
    if len(key_fields(doomed.model)) > 1:
        return None
    read = Q(pk__in=keys)
    if rest is not None:
        first, scopes = rest
        if options.is_global:
            read |= Q(pk__gte=first)
        elif options.user_field is None and options.scope_attname is not None:
            attname = options.scope_attname
            found = [scope for scope in scopes if scope is not None]
            scoped = Q(**{f"{attname}__in": found}) | Q(**{f"{attname}__isnull": True})
            read |= Q(pk__gte=first) & scoped
        else:
            return None
    return doomed.filter(read)


def _audiences_of(options: ModelOptions, rows: models.QuerySet[Any, Any]) -> list[Any]:
    """Where the rows of ``rows`` (some rows) are heard: their distinct scopes, or their
    accounts; everywhere, for a global model (no statement)."""
    if options.is_global:
        return [None]
    column = _audience_column(options)
    if column is None:
        return []
    found = list(rows.order_by().values_list(column, flat=True).distinct())
    return [[value] for value in found] if options.user_field is not None else found


def _options(queryset: models.QuerySet[Any, Any]) -> ModelOptions:
    options = options_for(queryset.model)
    assert options is not None
    return options


@contextmanager
def _locking(queryset: models.QuerySet[Any, Any], db: str, moving: bool) -> Iterator[None]:
    """Around an ``update()`` that may move rows, outside a transaction: a transaction of
    realtime's, so that the rows locked before it stay so until it is made. On SQLite it takes
    the write lock before the first read (SQLite refuses a transaction that read, then writes
    after another connection wrote: "database is locked"), with a write that changes no row.
    Inside the application's transaction, or for an update that cannot move rows: nothing.
    Nothing either for a queryset that asks ``select_for_update()``, on a database that
    locks so: outside a transaction Django refuses its ``update()`` where the ``UPDATE``
    reads the rows with a ``SELECT`` (a filter through a join, a multi-table child), and
    realtime's transaction would make it succeed (the rows are then read unlocked)."""
    connection = connections[db]
    if not moving or in_transaction(connection):
        yield
        return
    if connection.features.has_select_for_update and selects_for_update(queryset):
        yield
        return
    with transaction.atomic(using=db):
        if connection.vendor == "sqlite":
            table, column = _own_column(queryset.model)
            table, column = connection.ops.quote_name(table), connection.ops.quote_name(column)
            with connection.cursor() as cursor:
                cursor.execute(f"UPDATE {table} SET {column} = {column} WHERE 0")
        yield


def _own_column(model: type[models.Model]) -> tuple[str, str]:
    """A column of ``model``'s own table, with the table: the first of the columns the table
    holds, not of the model's (a multi-table child's first is its parent's key, in the parent's
    table)."""
    concrete = model._meta.concrete_model or model
    field = concrete._meta.local_concrete_fields[0]
    return concrete._meta.db_table, str(field.column)


# update() ------------------------------------------------------------------------------------


def _returning(model: type[models.Model], options: ModelOptions, db: str) -> Returning | None:
    """What reads the rows an ``update()`` changes from its own statement,
    when that tells all its events need: the model's columns all in its own table (no parent
    of multi-table inheritance), the audience the scope column (not an account path) and
    the database one that returns rows; else ``None``."""
    if options.user_field is not None or not can_return_rows(db):
        return None
    return _returning_columns(model, options, db, "UPDATE")


def _returning_columns(
    model: type[models.Model], options: ModelOptions, db: str, verb: str
) -> Returning | None:
    """A ``Returning`` of every column of ``model`` (the scope's kept past the bulk limit),
    when they all live in its own table; else ``None``."""
    concrete = model._meta.concrete_model
    if concrete is None:
        return None
    columns = model._meta.concrete_fields
    # Every column is the table's own (no parent of multi-table inheritance): so are the
    # columns written, which are columns of the model.
    if len(concrete._meta.local_concrete_fields) != len(columns):
        return None
    scope = [at for at, field in enumerate(columns) if field.attname == options.scope_attname]
    return Returning(concrete, db, verb, columns, conf.BULK_LIMIT, rest=scope)


def _announce_returned(
    options: ModelOptions,
    model: type[models.Model],
    db: str,
    returning: Returning,
    changed: list[str],
    written: set[str],
    count: int,
) -> None:
    """Announce the rows an ``update()`` changed as its statement returned them: each of the
    first ``REALTIME_BULK_LIMIT`` by its event, the rest folded by scope."""
    what = f"a bulk update of {options.name}"
    found = failsafe(what, db, False, lambda: _returned(model, db, returning, count))
    if found is None:
        tracking.bulk_written(model, None, written, db)
        return
    rows, rest = found
    whole = returning.count == len(rows)
    tracking.bulk_written(model, [row.pk for row in rows] if whole else None, written, db)

    def announce() -> None:
        for chunk in chunked(rows, READ_CHUNK):
            _add_all(_updated_events(options, model, chunk, changed, {}, db), db)
        _fold(options, "updated", [values[0] if values else None for values in rest], db)

    failsafe(what, db, True, announce)


class _Matched:
    """The rows an ``update()`` is about to change, as they are before it."""

    def __init__(
        self,
        options: ModelOptions,
        model: type[models.Model],
        db: str,
        rows: list[tuple[Any, Any]],
        befores: dict[Any, Before],
    ) -> None:
        self.options = options
        self.model = model
        self.db = db
        #: (primary key, audience before) of every row, by primary key.
        self.rows = rows
        self.befores = befores
        #: The scope of each row, as read before the write (scoped models).
        self.scopes = dict(rows) if options.scope_attname is not None else {}

    def announce(
        self, changed: list[str], values: dict[str, Any], moving: bool, exact: bool = True
    ) -> None:
        """Announce the rows, each as the write left it. ``exact=False``: the write changed
        another number of rows than were read before it (another transaction changed some
        meanwhile): each row is read again and told as it is, whether this write or the
        other left it so, never with values it may not hold."""
        options, db = self.options, self.db
        pks = [pk for pk, _ in self.rows]
        known = None if moving or not exact else _known_after(options, self.model, values)
        for chunk in chunked(pks[: conf.BULK_LIMIT], READ_CHUNK):
            if known is not None:  # what the events carry is known already: no statement
                rows: Any = [self._bare(pk, known) for pk in chunk]
            else:
                rows = self.model._base_manager.using(db).filter(pk__in=chunk).order_by("pk")
            _add_all(_updated_events(options, self.model, rows, changed, self.befores, db), db)
        rest = self.rows[conf.BULK_LIMIT :]
        audiences = [audience for _, audience in rest]
        if rest and moving:
            audiences += self._after([pk for pk, _ in rest], values)
        _fold(options, "updated", audiences, db)

    def _bare(self, pk: Any, written: dict[str, Any]) -> models.Model:
        """The row ``pk`` as its event needs it: its key, its scope as read before, and the
        columns ``written``."""
        names = [f.attname for f in key_fields(self.model)]
        row = dict(zip(names, list(pk) if len(names) > 1 else [pk], strict=True))
        scope = self.options.scope_attname
        if scope is not None:
            row[scope] = self.scopes[pk]
        row.update(written)
        # from_db() takes the values in the order of the model's columns.
        ordered = [f.attname for f in self.model._meta.concrete_fields if f.attname in row]
        return self.model.from_db(self.db, ordered, [row[name] for name in ordered])

    def _after(self, pks: list[Any], values: dict[str, Any]) -> list[Any]:
        """Where the surplus rows are heard after the write: the scope or account written,
        when it was a value on the row itself, else read again."""
        options = self.options
        column = _audience_column(options)
        if column is None or first_hop_attname(options) is None:
            return []
        told = self._written_audience(values)
        if told is not None:
            return told
        found: list[Any] = []
        for chunk in chunked(pks, READ_CHUNK):
            rows = self.model._base_manager.using(self.db).filter(pk__in=chunk).order_by()
            found += [[value] for value in rows.values_list(column, flat=True).distinct()]
        return found if options.user_field is not None else [value for [value] in found]

    def _written_audience(self, values: dict[str, Any]) -> list[Any] | None:
        """Where the rows are heard once ``values`` are written, when that says it: the first
        step of their audience (a scope, an account of a one-step path) written as a plain
        value; else ``None``."""
        options = self.options
        hop = first_hop_attname(options)
        one_hop = options.user_field is None or len(split_path(options.user_field)) == 1
        for name, written in values.items():
            plain = not hasattr(written, "resolve_expression")
            if one_hop and plain and _attname(self.model, name) == hop:
                field = self.model._meta.get_field(name)
                value = written.pk if isinstance(written, models.Model) else written
                if is_foreign_key(field):  # ``to_field``: the pk of the row it names
                    value = target_pk(field, value, self.db)
                return [[value]] if options.user_field is not None else [value]
        return None

    def rekeyed(self, values: dict[str, Any], written: set[str]) -> None:
        """Tell each place the rows were heard in before an update that changed their keys,
        and each they are heard in after it, to read them again; raises, having told the
        first, when the second cannot be told (the rows cannot be read again by the keys
        they had)."""
        audiences = [audience for _, audience in self.rows]
        moved = first_hop_attname(self.options) in written
        after = self._written_audience(values) if moved else []
        _fold(self.options, "updated", [*audiences, *(after or [])], self.db)
        if after is None:
            raise RuntimeError(
                f"an update() of {self.model._meta.label} changed the keys of its rows and "
                "where they are heard, not as a plain value; where they are heard now is not "
                "told. Write the keys and their scope or account in two updates"
            )


def _rekeyed(
    queryset: models.QuerySet[Any, Any],
    options: ModelOptions,
    values: dict[str, Any],
    run: Callable[..., int],
    written: set[str],
) -> int:
    """Run an ``update()`` that writes the rows' primary keys. No event can name a row both
    before and after: each scope (or account) its rows were heard in, or are heard in after,
    is told to read them again (one truncated event, as past ``REALTIME_BULK_LIMIT``)."""
    db = write_alias(queryset)
    what = f"a bulk update of {options.name}"
    matched = failsafe(what, db, True, lambda: _matched(queryset, options, db, False))
    count = run(**values)
    tracking.bulk_written(queryset.model, None, written, db)
    if matched is not None:
        failsafe(what, db, True, lambda: matched.rekeyed(values, written))
    return count


def _updated_events(
    options: ModelOptions,
    model: type[models.Model],
    rows: Iterable[models.Model],
    changed: list[str],
    befores: dict[Any, Before],
    db: str,
) -> list[Event | None]:
    """The ``updated`` events of ``rows`` (as they are after the write; at most ``READ_CHUNK``
    of them: their to-many targets are read in one statement), each with who could read its
    row before, where ``befores`` says (then it tells those readers even if it left every
    scope)."""
    rows = list(rows)
    to_many = to_many_of_rows(options, model, [row.pk for row in rows], db)
    return [_updated_event(options, row, changed, befores.get(row.pk), to_many, db) for row in rows]


def _updated_event(
    options: ModelOptions,
    row: models.Model,
    changed: list[str],
    before: Before | None,
    to_many: dict[Any, dict[str, list[Any]]],
    db: str,
) -> Event | None:
    """The ``updated`` event of ``row`` as it is after a bulk write, with who could read it
    before where that was taken (then it tells those readers even if it left every scope)."""
    event = read_event(
        options,
        row,
        "updated",
        changed,
        scopeless=before is not None,
        to_many=to_many[row_key(row.pk)],
        using=db,
    )
    if event is not None:
        event.before = before
    return event


def _matched(
    queryset: models.QuerySet[Any, Any], options: ModelOptions, db: str, moving: bool
) -> _Matched:
    """Read the rows ``queryset`` matches, before its update: their keys through the caller's
    query (with the scope, a column of the row itself: one statement), the accounts of an
    account path by key (the caller's joins would narrow them); when the update may move
    rows, the rows locked by key (in a transaction: ``_locking``) and who could read the
    first ``REALTIME_BULK_LIMIT``."""
    model = queryset.model
    scope = options.scope_attname
    caller = matching(queryset, db)
    if scope is not None:
        listed: list[tuple[Any, Any]] = list(caller.values_list("pk", scope))
    else:
        listed = [(pk, None) for pk in caller.values_list("pk", flat=True)]
    rows = sorted(dict(listed).items(), key=lambda row: id_order(row[0]))
    # Unordered: a ``Meta.ordering`` through a relation would join its table to each read,
    # and to the lock below (locking its rows; PostgreSQL refuses FOR UPDATE on the nullable
    # side of an outer join).
    stored = model._base_manager.using(db).order_by()
    connection = connections[db]
    asked = lock_options(queryset)
    if asked is not None and not connection.features.has_select_for_no_key_update:
        asked["no_key"] = False  # FOR UPDATE, as Django's own statement takes it there
    if (
        (moving or asked is not None)
        and connection.features.has_select_for_update
        and in_transaction(connection)
    ):
        # Locked by key, the model's own rows only: they cannot change before the update. As
        # the caller asked (``nowait``, ``skip_locked``): a row another transaction holds
        # fails the write, or is left out of it and of its announcement, as in Django's own.
        locked: list[Any] = []
        for chunk in chunked([pk for pk, _ in rows], READ_CHUNK):
            held = stored.filter(pk__in=chunk).select_for_update(**(asked or {}))
            try:
                locked += held.values_list("pk", scope or "pk")
            except DatabaseError as error:
                if asked is not None and asked["nowait"]:
                    raise WritesOwnError(error) from error  # the caller's update fails so
                raise
        kept = locked if scope is not None else [(pk, None) for pk, _ in locked]
        rows = sorted(kept, key=lambda row: id_order(row[0]))
    if options.user_field is not None:
        rows = accounts_of_rows(options, stored, [pk for pk, _ in rows])
    befores: dict[Any, Before] = {}
    if moving and options.user_field is not None:
        first = rows[: conf.BULK_LIMIT]
        befores = {pk: Before(accounts=sorted_ids(found or ())) for pk, found in first}
    elif moving:
        befores = scoped_befores(options, stored, [pk for pk, _ in rows[: conf.BULK_LIMIT]])
    return _Matched(options, model, db, rows, befores)


def _known_after(
    options: ModelOptions, model: type[models.Model], values: dict[str, Any]
) -> dict[str, Any] | None:
    """What the events of an update writing ``values`` read of its rows, when that is known
    without reading them again: the columns it writes, as the database will hold them, plus
    the key and the scope (read before); ``None`` when an event reads anything else (a
    column not written, a value the database computes or converts, a generic relation, a
    ``payload=``, an account path). ``model`` is the model written: a proxy or child of the
    decorated one writes fields of its own too."""
    if options.payload is not None or options.user_field is not None:
        return None
    written = {
        str(getattr(field, "attname", name)): _as_stored(field, value)
        for name, value in values.items()
        for field in [model._meta.get_field(name)]
    }
    meta = options.model._meta
    needed = {*options.field_attnames.values(), *options.filter_attnames.values()}
    for relation in options.relations:
        field = meta.get_field(relation)
        if is_generic_fk(options.model, relation):
            return None
        if is_foreign_key(field):
            needed.add(str(field.attname))
    if options.shared_via is not None:
        needed.add(_attname(options.model, split_path(options.shared_via)[0]))
    scope = options.scope_attname
    if scope is not None and scope in written:
        needed.add(scope)
    known = {*(part.attname for part in key_fields(model)), scope} - set(written)
    for attname in needed - known:
        if written.get(attname, _UNSURE) is _UNSURE:
            return None
    return {attname: value for attname, value in written.items() if attname in needed}


#: Stands for a value written whose stored form is not known without reading it.
_UNSURE: Any = object()

#: Django's fields whose value reads back as ``to_python`` makes it (no rounding, no time
#: zone, no conversion of the database's): exactly these classes, not subclasses, which may
#: convert; those of ``READS_AS`` whose values are whole numbers, text, truth or UUIDs.
_AS_GIVEN = frozenset(
    kind for kind, value in READS_AS.items() if value in (int, str, bool, uuid.UUID)
)


def _as_stored(field: Any, value: Any) -> Any:
    """``value`` as ``field`` reads back once written; ``_UNSURE`` where the database may
    compute or convert it (an expression, a date, a decimal, JSON, a field of a class of
    one's own, ...)."""
    if type(field) in (models.ForeignKey, models.OneToOneField):
        if isinstance(value, models.Model):
            value = getattr(value, field.target_field.attname)
        field = field.target_field
    if type(field) not in _AS_GIVEN:
        return _UNSURE
    read = read_by(field, value)
    return _UNSURE if read is UNREADABLE else read


def _audience_column(options: ModelOptions) -> str | None:
    """The lookup naming a row's audience: its scope, or the accounts of its path."""
    if options.user_field is not None:
        return key_lookup(options.model, options.user_field)
    return options.scope_attname


def _attname(model: type[models.Model], name: str) -> str:
    field = model._meta.get_field(name)
    return str(getattr(field, "attname", name))


# bulk_update() -------------------------------------------------------------------------------


@dataclass
class _Changes:
    """What a ``bulk_update`` is about to change, read before it runs."""

    #: For each row whose listed fields an object changes: its object (the first, when
    #: several objects name the row), the fields, and who could read it before when that may
    #: change (for the first ``REALTIME_BULK_LIMIT`` rows).
    rows: list[tuple[models.Model, list[str], Before | None]]
    #: The unwritten columns deciding who reads a row that an object holds other values of
    #: than the row may (``unsure_attnames``): read from the rows after the write.
    unsure: set[str]
    #: Where the rows past the limit were heard, when the write may move them (``_folded``).
    left: list[Any]
    #: The columns the write writes (the same of every object).
    written: list[str]


def _changes(
    options: ModelOptions, objs: Sequence[models.Model], fields: Sequence[str], db: str
) -> _Changes:
    """What the write of ``fields`` of ``objs`` changes, and who could read it (``_Changes``)."""
    changes: dict[Any, tuple[models.Model, list[str], Before | None]] = {}
    accounts: dict[Any, Plan] = {}  # the accounts rows held: read together (take_befores)
    knowns = [(obj, tracking.known(obj, db)) for obj in objs]
    written = tracking.written_attnames(objs[0], fields) if objs else []
    rows: dict[Any, dict[str, Any]] = {}
    if not set(planned_attnames(options)).isdisjoint(written):
        rows = stored_rows(options, knowns, db)  # what no snapshot holds: read together
    for obj, known in knowns:
        changed = tracking.changed_fields(obj, None, known, db)
        names = sorted({obj._meta.get_field(name).name for name in fields} & set(changed))
        if not names:
            continue
        first, given, before = changes.get(obj.pk, (obj, [], None))
        if before is None and obj.pk not in accounts and len(changes) < conf.BULK_LIMIT:
            row = rows.get(row_key(obj.pk))
            plan = plan_before(options, obj, names, db, known, row)
            if plan is not None and plan.accounts:
                accounts[obj.pk] = plan
            elif plan is not None:
                before = take_before(options, plan)
        changes[obj.pk] = (first, sorted({*given, *names}), before)
    for pk, before in take_befores(options, accounts).items():
        changes[pk] = (*changes[pk][:2], before)
    changing = list(changes.values())
    left = []
    surplus = [obj.pk for obj, _, _ in changing[conf.BULK_LIMIT :]]
    if surplus and first_hop_attname(options) in written:  # they may leave their audience
        stored = options.model._base_manager.using(db)
        for chunk in chunked(surplus, READ_CHUNK):
            left += _audiences_of(options, stored.filter(pk__in=chunk))
    return _Changes(changing, unsure_attnames(options, objs, written), left, written)


def _announce_changes(
    options: ModelOptions,
    found: _Changes,
    objs: Sequence[models.Model],
    fields: Sequence[str],
    db: str,
) -> None:
    changes = found.rows
    if not changes:
        return
    audiences = list(found.left)
    written = found.written
    # Rows whose objects disagree on what the write stored, or that it stored the value of an
    # expression in: read back as the write left them.
    read_back = _duplicated_keys(objs) | {
        obj.pk for obj, _, _ in changes if tracking.computed_attnames(obj, written)
    }
    announced = [obj.pk for obj, _, _ in changes[: conf.BULK_LIMIT]]
    to_many = to_many_of_rows(options, options.model, announced, db)
    # Objects loaded with only() or defer(): what their events carry is read in one go; the
    # columns the write left that decide who hears the rows, and of a queryable model those
    # its events carry, as the rows hold them.
    whole = with_columns_of(options, [obj for obj, _, _ in changes[: conf.BULK_LIMIT]], db)
    whole = as_stored(options, whole, written, db, found.unsure)
    surplus = [obj for obj, _, _ in changes[conf.BULK_LIMIT :]]
    surplus = as_stored(options, surplus, written, db, found.unsure) if found.unsure else surplus
    stored = _stored_rows(options.model, read_back, db)
    events = []
    made = tracking.fate(db)  # the rows of one statement share their fate
    for index, (obj, names, before) in enumerate(changes):
        if obj.pk in read_back:
            row = stored.get(obj.pk)
        else:
            tracking.saved(obj, written, db, made)
            row = whole[index] if index < conf.BULK_LIMIT else surplus[index - conf.BULK_LIMIT]
        if row is None:
            continue
        if index >= conf.BULK_LIMIT:
            audiences.append(_audience_of(options, row))
            continue
        events.append(_updated_event(options, row, names, before, to_many, db))
    if read_back:
        tracking.bulk_written(options.model, read_back, written, db)
    _add_all(events, db)
    _fold(options, "updated", audiences, db)


def _duplicated_keys(objs: Sequence[models.Model]) -> set[Any]:
    """The keys several of ``objs`` share: ``bulk_update`` stores one of them per row (the
    first of its batch, which depends on the batch size the database allows)."""
    seen: set[Any] = set()
    duplicated: set[Any] = set()
    for obj in objs:
        (duplicated if obj.pk in seen else seen).add(obj.pk)
    return duplicated


def _stored_rows(model: type[models.Model], keys: set[Any], db: str) -> dict[Any, models.Model]:
    """The rows of ``keys`` as the write left them, by key (those whose objects disagree on
    what it wrote)."""
    rows: dict[Any, models.Model] = {}
    for chunk in chunked(list(keys), 500):
        rows.update((row.pk, row) for row in model._base_manager.using(db).filter(pk__in=chunk))
    return rows


# Shared ----------------------------------------------------------------------------------------


def _audience_of(options: ModelOptions, obj: models.Model) -> Any:
    """Where an object's row is heard: its scope, or the accounts of its path."""
    if options.user_field is not None:
        from realtime.writes.events import read_accounts

        return read_accounts(options, obj)
    return obj.__dict__.get(options.scope_attname or "")


def _past_audience(options: ModelOptions, before: Before) -> Any:
    """Where a row was heard before a write, as ``_audience_of`` says where it is heard."""
    return before.accounts or [] if options.user_field is not None else before.scope_id


def _fold(options: ModelOptions, action: str, audiences: Iterable[Any], db: str) -> None:
    """Hand the outbox the events folding rows heard in ``audiences`` (``_folded``)."""
    _add_all(_folded(options, action, audiences), db)


def _folded(options: ModelOptions, action: str, audiences: Iterable[Any]) -> list[Event]:
    """One truncated event per distinct scope of ``audiences`` (one account event to all the
    accounts, for account models; one, for a global model)."""
    if options.user_field is not None:
        accounts: set[Any] = set()
        for found in audiences:
            accounts.update(found if isinstance(found, list) else [found])
        accounts.discard(None)
        return [folded_event(options, None, action, accounts)] if accounts else []
    if options.is_global:
        return [folded_event(options, None, action)] if any(True for _ in audiences) else []
    scopes = sorted_ids(scope for scope in audiences if scope is not None)
    return [folded_event(options, scope, action) for scope in scopes]


def _add_all(events: Iterable[Event | None], db: str) -> None:
    """Hand the events to the outbox together (durable: one statement), in order."""
    on_commit.add_all([event for event in events if event is not None], db)
