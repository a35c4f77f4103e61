"""Bulk writes announced: ``update()``, ``bulk_create`` and ``bulk_update`` of decorated models.

Each is announced as the saves it stands for would be — same events, audiences, coalescing,
origin and views — in a bounded number of statements, never one per row:

* ``update(**values)``: the matching rows' ids and audience columns are read before the write,
  in the same transaction (one statement); the rows are read again after it (one statement per
  500), so ``data`` holds the values written, an ``F()`` expression's result included. Each
  row is ``<model>.updated`` with ``changed`` the names given. When the values written may
  change who reads a row (its scope, a guard's column, the first hop of an account or shared
  path), who could read each row before is taken too, and the row leaves and enters views.
* ``bulk_create``: each row inserted is ``<model>.created``; rows an ``update_conflicts``
  insert found already there are ``<model>.updated``; where the database does not say which
  rows it inserted (``ignore_conflicts``, or no primary keys returned), one truncated event per
  scope.
* ``bulk_update``: each object whose listed fields differ from what its row held (its
  snapshot) is ``<model>.updated``, ``changed`` those fields.

Past ``REALTIME_BULK_LIMIT`` rows, the rest fold into one truncated event per distinct scope
(per batch of accounts for account models), with ``data`` null: clients read again. Any
failure while reading what to announce is logged and costs the announcements, never the write.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from django.db import connections, models, transaction

from realtime.audience import readers_of_rows
from realtime.auth import readers_pool
from realtime.chunks import chunked
from realtime.compat.django import in_transaction
from realtime.conf import conf
from realtime.encoding import id_order, row_key, sorted_ids
from realtime.paths import split_path, to_lookup
from realtime.registry import ModelOptions, options_for
from realtime.writes import outbox, snapshots
from realtime.writes.before import Past, Plan, moves_audience, plan_before, take_before
from realtime.writes.cascades import folded_event
from realtime.writes.events import Before, Event, to_many_of_rows
from realtime.writes.failsafe import failsafe
from realtime.writes.preparing import prepare_write

logger = logging.getLogger(__name__)

#: Rows read in one statement by primary key.
READ_CHUNK = 500


def update(
    queryset: models.QuerySet[Any, Any], values: dict[str, Any], run: Callable[..., int]
) -> int:
    """Run ``run(**values)`` (the queryset's own ``update``) and announce the rows it changed."""
    options = _options(queryset)
    if "updated" not in options.actions:
        return run(**values)
    db = queryset.db
    meta = queryset.model._meta
    try:
        fields = [meta.get_field(name) for name in values]
    except Exception:
        return run(**values)  # the update raises its own error
    changed = sorted({field.name for field in fields})
    written = {getattr(field, "attname", field.name) for field in fields}
    moving = moves_audience(options, written)
    with _transaction(db, queryset.model):
        what = f"a bulk update of {options.name}"
        matched = failsafe(what, db, True, lambda: _matched(queryset, options, moving))
        count = run(**values)
        if matched is not None:
            if count != len(matched.rows):
                logger.warning(
                    "realtime: an update() of %s changed %d rows where %d matched a moment "
                    "before (another transaction wrote rows it matches); those are not announced",
                    options.name,
                    count,
                    len(matched.rows),
                )
            failsafe(what, db, True, lambda: matched.announce(changed, written, values, moving))
    return count


def created(
    queryset: models.QuerySet[Any, Any], objs: Sequence[models.Model], kwargs: dict[str, Any]
) -> None:
    """Announce the rows ``bulk_create`` wrote (``kwargs``: the options it was given)."""
    options = _options(queryset)
    db = queryset.db

    def announce() -> None:
        # ignore_conflicts: which rows went in is not known. update_conflicts: whether a row
        # went in or was there is not told apart; all are updated.
        action = "updated" if kwargs.get("update_conflicts") else "created"
        exact = [] if kwargs.get("ignore_conflicts") else [o for o in objs if o.pk is not None]
        for obj in exact:
            snapshots.saved(obj, snapshots.written_attnames(obj, None), db)
        if action not in options.actions:
            return
        changed = None
        if action == "updated":
            meta = queryset.model._meta
            changed = sorted({meta.get_field(name).name for name in kwargs["update_fields"]})
        _add_all(
            (prepare_write(options, obj, action, changed, db) for obj in exact[: conf.BULK_LIMIT]),
            db,
        )
        told = {id(obj) for obj in exact}
        rest = [*exact[conf.BULK_LIMIT :], *(obj for obj in objs if id(obj) not in told)]
        _fold(options, action, [_audience_of(options, obj) for obj in rest], db)

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
    db = queryset.db
    try:
        for name in fields:
            queryset.model._meta.get_field(name)
    except Exception:
        return run()  # bulk_update raises its own error
    what = f"a bulk update of {options.name}"
    with _transaction(db, queryset.model):
        changes = failsafe(what, db, True, lambda: _changes(options, objs, fields, db))
        count = run()
        if changes is not None:
            failsafe(what, db, True, lambda: _announce_changes(options, changes, fields, db))
    return count


def _options(queryset: models.QuerySet[Any, Any]) -> ModelOptions:
    options = options_for(queryset.model)
    assert options is not None
    return options


def _transaction(db: str, model: type[models.Model]) -> AbstractContextManager[Any]:
    """The write and the reads around it in one transaction: the application's, or one that
    realtime opens around them (the write alone would have been one by itself)."""
    if in_transaction(connections[db]):
        return transaction.atomic(using=db, savepoint=False)
    return _writing(db, model)


@contextmanager
def _writing(db: str, model: type[models.Model]) -> Iterator[None]:
    """A transaction of realtime's around a bulk write: on SQLite it takes the write lock
    before the first read (SQLite refuses a transaction that read, then writes after another
    connection wrote: "database is locked"), with a write that changes no row."""
    with transaction.atomic(using=db):
        connection = connections[db]
        if connection.vendor == "sqlite":
            table = connection.ops.quote_name(model._meta.db_table)
            column = connection.ops.quote_name(str(model._meta.concrete_fields[0].column))
            with connection.cursor() as cursor:
                cursor.execute(f"UPDATE {table} SET {column} = {column} WHERE 0")
        yield


# update() ------------------------------------------------------------------------------------


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

    def announce(
        self, changed: list[str], written: set[str], values: dict[str, Any], moving: bool
    ) -> None:
        options, db = self.options, self.db
        pks = [pk for pk, _ in self.rows]
        snapshots.overwritten(self.model, pks, written, db)
        for chunk in chunked(pks[: conf.BULK_LIMIT], READ_CHUNK):
            rows = self.model._base_manager.using(db).filter(pk__in=chunk).order_by("pk")
            to_many = to_many_of_rows(options, self.model, chunk, db)
            events = []
            for instance in rows:
                before = self.befores.get(instance.pk)
                event = prepare_write(
                    options,
                    instance,
                    "updated",
                    changed,
                    db,
                    scopeless=before is not None,
                    to_many=to_many[row_key(instance.pk)],
                )
                if event is not None:
                    event.before = before
                events.append(event)
            _add_all(events, db)
        rest = self.rows[conf.BULK_LIMIT :]
        audiences = [audience for _, audience in rest]
        if rest and moving:
            audiences += self._after([pk for pk, _ in rest], values)
        _fold(options, "updated", audiences, db)

    def _after(self, pks: list[Any], values: dict[str, Any]) -> list[Any]:
        """Where the surplus rows are heard after the write: the scope or account written,
        when it was a value on the row itself, else read again."""
        options = self.options
        column = _audience_column(options)
        hop = _first_hop_attname(options)
        if column is None or hop is None:
            return []
        one_hop = options.user_field is None or len(split_path(options.user_field)) == 1
        for name, written in values.items():
            plain = not hasattr(written, "resolve_expression")
            if one_hop and plain and _attname(self.model, name) == hop:
                value = written.pk if isinstance(written, models.Model) else written
                return [[value]] if options.user_field is not None else [value]
        found: list[Any] = []
        for chunk in chunked(pks, READ_CHUNK):
            rows = self.model._base_manager.using(self.db).filter(pk__in=chunk).order_by()
            found += [[value] for value in rows.values_list(column, flat=True).distinct()]
        return found if options.user_field is not None else [value for [value] in found]


def _matched(queryset: models.QuerySet[Any, Any], options: ModelOptions, moving: bool) -> _Matched:
    """Read the rows ``queryset`` matches, before its update: ids and audience (one
    statement), and who could read the first ``REALTIME_BULK_LIMIT`` when that may change."""
    model = queryset.model
    column = _audience_column(options)
    read = queryset.order_by()
    if connections[queryset.db].features.has_select_for_update:
        read = read.select_for_update()  # the rows cannot change before the update
    rows = (
        list(read.values_list("pk", column))
        if column is not None
        else [(pk, None) for pk in read.values_list("pk", flat=True)]
    )
    rows.sort(key=lambda row: id_order(row[0]))
    if options.user_field is not None and column is not None:
        rows = _by_row(rows)
    befores: dict[Any, Before] = {}
    if moving and options.user_field is not None:
        # The accounts each row reached were read with its id.
        first = rows[: conf.BULK_LIMIT]
        befores = {pk: Before(accounts=sorted_ids(found or ())) for pk, found in first}
    elif moving:
        befores = _scoped_befores(options, queryset, [pk for pk, _ in rows[: conf.BULK_LIMIT]])
    return _Matched(options, model, queryset.db, rows, befores)


def _scoped_befores(
    options: ModelOptions, queryset: models.QuerySet[Any, Any], pks: list[Any]
) -> dict[Any, Before]:
    """Who could read each row before the update: its scope and channels (one statement per
    500 rows), a guard's readers (asked for all the rows of a scope together), the readers of
    a shared root (asked of the application's hook, row by row)."""
    befores: dict[Any, Before] = {}
    stored = queryset.model._base_manager.using(queryset.db)
    for chunk in chunked(pks, READ_CHUNK):
        for old in stored.filter(pk__in=chunk):
            plan = Plan(Past(old, None), queries=True)
            before = take_before(options, plan, always=True)
            if before is not None:
                befores[old.pk] = before
    if options.guard is not None:
        by_scope: dict[Any, list[Any]] = {}
        for pk, before in befores.items():
            if before.scope_id is not None or options.is_global:
                by_scope.setdefault(before.scope_id, []).append(pk)
        for scope, rows in by_scope.items():
            found = readers_of_rows(options, rows, readers_pool(options, scope))
            for pk in rows:
                befores[pk].readers = sorted_ids(found[row_key(pk)])
    return befores


def _by_row(rows: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """An account path read as one (row, account) pair per account: one pair per row, holding
    the list of its accounts."""
    merged: dict[Any, list[Any]] = {}
    for pk, account in rows:
        accounts = merged.setdefault(pk, [])
        if account is not None:
            accounts.append(account)
    return [(pk, accounts) for pk, accounts in merged.items()]


def _audience_column(options: ModelOptions) -> str | None:
    """The lookup naming a row's audience: its scope, or the accounts of its path."""
    if options.user_field is not None:
        return to_lookup(options.user_field)
    return options.scope_attname


def _first_hop_attname(options: ModelOptions) -> str | None:
    """The column of the row where its audience starts: the scope, or the first hop of the
    account path when it is a foreign key."""
    if options.user_field is None:
        return options.scope_attname
    field = options.model._meta.get_field(split_path(options.user_field)[0])
    return str(field.attname) if field.concrete and field.many_to_one else None


def _attname(model: type[models.Model], name: str) -> str:
    field = model._meta.get_field(name)
    return str(getattr(field, "attname", name))


# bulk_update() -------------------------------------------------------------------------------


def _changes(
    options: ModelOptions, objs: Sequence[models.Model], fields: Sequence[str], db: str
) -> list[tuple[models.Model, list[str], Before | None]]:
    """For each object whose listed fields differ from what its row holds: the fields, and
    who could read it before when that may change (taken now, before the write)."""
    changes = []
    for index, obj in enumerate(objs):
        changed = snapshots.changed_fields(obj, None)
        names = sorted({obj._meta.get_field(name).name for name in fields} & set(changed))
        if not names:
            continue
        before = None
        if index < conf.BULK_LIMIT:
            plan = plan_before(options, obj, names)
            before = None if plan is None else take_before(options, plan)
        changes.append((obj, names, before))
    return changes


def _announce_changes(
    options: ModelOptions,
    changes: list[tuple[models.Model, list[str], Before | None]],
    fields: Sequence[str],
    db: str,
) -> None:
    audiences = []
    announced = [obj.pk for obj, _, _ in changes[: conf.BULK_LIMIT]]
    to_many = to_many_of_rows(options, options.model, announced, db)
    events = []
    for index, (obj, names, before) in enumerate(changes):
        snapshots.saved(obj, snapshots.written_attnames(obj, fields), db)
        if index >= conf.BULK_LIMIT:
            audiences.append(_audience_of(options, obj))
            continue
        event = prepare_write(
            options,
            obj,
            "updated",
            names,
            db,
            scopeless=before is not None,
            to_many=to_many[row_key(obj.pk)],
        )
        if event is not None:
            event.before = before
        events.append(event)
    _add_all(events, db)
    _fold(options, "updated", audiences, db)


# Shared ----------------------------------------------------------------------------------------


def _audience_of(options: ModelOptions, obj: models.Model) -> Any:
    """Where an object's row is heard: its scope, or the accounts of its path."""
    if options.user_field is not None:
        from realtime.writes.events import read_accounts

        return read_accounts(options, obj)
    return obj.__dict__.get(options.scope_attname or "")


def _fold(options: ModelOptions, action: str, audiences: Iterable[Any], db: str) -> None:
    """One truncated event per distinct scope of ``audiences`` (one account event to all the
    accounts, for account models)."""
    if options.user_field is not None:
        accounts: set[Any] = set()
        for found in audiences:
            accounts.update(found if isinstance(found, list) else [found])
        accounts.discard(None)
        if accounts:
            event = Event(
                options=options,
                action=action,
                pk=None,
                data={},
                channels=[options.name],
                folded=True,
                accounts=sorted_ids(accounts),
            )
            outbox.add(event, db)
        return
    if options.is_global:
        if any(True for _ in audiences):
            _add_all([folded_event(options, None, action)], db)
        return
    scopes = sorted_ids(scope for scope in audiences if scope is not None)
    _add_all((folded_event(options, scope, action) for scope in scopes), db)


def _add_all(events: Iterable[Event | None], db: str) -> None:
    """Hand the events to the outbox together (durable: one statement), in order."""
    outbox.add_all([event for event in events if event is not None], db)
