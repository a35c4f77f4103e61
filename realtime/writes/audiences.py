"""Who may read a row, decided in the write's transaction, while the database still holds it.

**Before an update.** ``plan_before`` decides, from the instance and what realtime knows it
held (``realtime.writes.tracking``) alone, whether the save about to run can change who may
read the row: the scope field, a column the guard reads (every column, when that cannot be
told), or the first hop of a ``user_field`` or ``shared_via`` path. When none can, the update
costs nothing more, not even a savepoint. ``take_before`` then reads the audience as it was,
in ``pre_save``: old values from what is known (no query) and, as needed, the guard's readers
(the same statements as a delete's readers), a multi-hop path (one query), the root's readers,
or a column not known; ``realtime.writes.views`` compares after commit.

**Before a delete.** Its scope or accounts, and for guarded, shared and outside readers, who
may read it, asked now because afterwards there is nothing left to ask about. A guarded row's
readers come from the guard, asked on the write's database in its transaction — or from the
application's own ``RealtimeAuth.audience``, when it has one.

Every statement goes to the database of the write, never a replica.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.db import models

from realtime.auth import RealtimeAuth, get_auth, readers_pool
from realtime.chunks import chunked
from realtime.conf import conf
from realtime.encoding import normal_id, record_channel, row_key, sorted_ids
from realtime.paths import (
    holds_target_pk,
    is_foreign_key,
    key_lookup,
    split_path,
    target_pk,
    target_pks,
    values_on_path,
)
from realtime.readers import shared_readers_of, shared_readers_once
from realtime.registry import ModelOptions, relation_target, wire_name
from realtime.writes import tracking
from realtime.writes.events import (
    Before,
    Event,
    copy_with,
    lacks_columns,
    read_columns,
    read_event,
    reads_rows_apart,
    to_many_of_rows,
)
from realtime.writes.failsafe import failsafe
from realtime.writes.views import (
    as_events,
    as_leaving,
    audience,
    outside_recipients,
    recipients,
    shared_readers,
)


class Past:
    """The row as stored before this save: from the snapshot when it knows, else read once
    (``stored``: the instance was read from the database just now, and holds it; ``row``:
    the row's columns, read already with those of other rows of a bulk write)."""

    def __init__(
        self,
        instance: models.Model,
        update_fields: Iterable[str] | None,
        stored: bool = False,
        using: str | None = None,
        known: dict[str, Any] | None = None,
        row: dict[str, Any] | None = None,
    ) -> None:
        self.instance = instance
        #: The database of the write (the row's own, if it was read from one).
        self.using = using or instance._state.db
        if stored:
            known = dict(instance.__dict__)
        elif known is None:
            known = tracking.known(instance, self.using)
        self.known = known
        meta = instance._meta
        self.written = (
            None
            if update_fields is None
            else {meta.get_field(name).attname for name in update_fields}  # type: ignore[union-attr]
        )
        self._stored: dict[str, Any] | None = row

    def may_change(self, attname: str) -> bool:
        """Whether this save may write a new value of ``attname`` (no query)."""
        if self.written is not None and attname not in self.written:
            return False
        if self.known is None or not _knows(self.known, attname):
            return True
        strict = attname in tracking.kept_as_given(type(self.instance))
        return tracking.differs(self.instance.__dict__, self.known, attname, strict)

    def knows(self, attnames: Iterable[str]) -> bool:
        """Whether the snapshot knows every one of ``attnames`` (reading them costs nothing)."""
        known, stored = self.known or {}, self._stored or {}
        return all(_knows(known, a) or a in stored for a in attnames)

    def value(self, attname: str) -> Any:
        """The stored value of ``attname`` (a query the first time the snapshot does not know)."""
        if self.known is not None and _knows(self.known, attname):
            return self.known[attname]
        if self._stored is None:
            instance = self.instance
            found = stored_columns(type(instance), [instance.pk], self.using)
            self._stored = found.get(row_key(instance.pk), {})
        return self._stored.get(attname)


def _knows(known: dict[str, Any], attname: str) -> bool:
    """Whether ``known`` (``tracking.known``) holds a value of ``attname`` still known."""
    return known.get(attname, tracking.UNKNOWN) is not tracking.UNKNOWN


class Plan:
    """What ``take_before`` is to read, decided without a query, and whether it will query
    (then it runs in a savepoint)."""

    def __init__(
        self, past: Past, *, queries: bool, accounts: bool = False, readers: bool = False
    ) -> None:
        self.past = past
        self.queries = queries
        self.accounts = accounts
        self.readers = readers


def plan_before(
    options: ModelOptions,
    instance: models.Model,
    update_fields: Iterable[str] | None,
    using: str | None = None,
    known: dict[str, Any] | None = None,
    row: dict[str, Any] | None = None,
) -> Plan | None:
    """What of the row's audience the save about to run may change; ``None`` when nothing
    can (then the update costs no query, not even a savepoint). ``known``: what the thread
    knows the row holds (``tracking.known``), when it was asked already; ``row``: its
    columns as stored, read already (``stored_rows``)."""
    if "updated" not in options.actions or instance.pk is None:
        return None
    if instance._state.adding and instance._meta.pk.has_default():
        return None  # an insert, as Django will make it
    past = Past(instance, update_fields, using=using, known=known, row=row)
    if options.user_field is not None:
        first = _first_hop(options.model, options.user_field)
        if first is None or not past.may_change(first.attname):
            return None
        # One hop holding the account's key, known: no query (``to_field``: one).
        free = len(split_path(options.user_field)) == 1 and holds_target_pk(first)
        return Plan(past, queries=not (free and past.knows([first.attname])), accounts=True)
    scope_moves = options.scope_attname is not None and past.may_change(options.scope_attname)
    guarded = guard_attnames(options)
    columns = guarded if guarded is not None else [f.attname for f in instance._meta.fields]
    guard_asks = options.guard is not None and (
        scope_moves or any(past.may_change(attname) for attname in columns)
    )
    root = _first_hop(options.model, options.shared_via)
    root_moves = root is not None and past.may_change(root.attname)
    if not (scope_moves or guard_asks or root_moves):
        return None
    read = [f.attname for f in _foreign_keys(options, instance)]
    if options.scope_attname is not None:
        read.append(options.scope_attname)
    if root is not None:
        read.append(root.attname)
    queries = guard_asks or options.shared_via is not None or not past.knows(read)
    queries = queries or bool(options.keyed_relations)
    return Plan(past, queries=queries, readers=guard_asks)


def stored_rows(
    options: ModelOptions,
    knowns: Sequence[tuple[models.Model, dict[str, Any] | None]],
    using: str,
) -> dict[Any, dict[str, Any]]:
    """The stored columns of the rows of a bulk write's instances whose snapshot lacks a
    column that decides who reads them (``planned_attnames``), by ``row_key``: one statement
    per 500 rows, so that planning each row reads none (objects built by hand, or from
    ``iterator()``, a cache, another thread)."""
    planned = _planned_of(options)
    lacking = {
        row_key(instance.pk): instance.pk
        for instance, known in knowns
        if instance.pk is not None
        and (known is None or not all(_knows(known, attname) for attname in planned))
    }
    if not lacking:
        return {}
    model = type(knowns[0][0])  # the instances' own, as ``Past.value`` reads one
    return stored_columns(model, list(lacking.values())[: conf.BULK_LIMIT], using)


def stored_columns(
    model: type[models.Model], pks: Sequence[Any], using: str | None
) -> dict[Any, dict[str, Any]]:
    """The rows of ``pks`` as stored on ``using``, every concrete column of ``model`` by
    attname, by ``row_key``: one unordered statement per 500 rows (a row gone: absent)."""
    concrete = [field.attname for field in model._meta.concrete_fields]
    stored = model._base_manager.db_manager(using).order_by()
    found: dict[Any, dict[str, Any]] = {}
    for chunk in chunked(list(pks), READ_CHUNK):
        for row in stored.filter(pk__in=chunk).values("pk", *concrete):
            found[row_key(row.pop("pk"))] = row
    return found


def planned_attnames(options: ModelOptions) -> tuple[str, ...]:
    """The columns ``plan_before`` looks at: the first hop of the account path and of
    ``shared_via``, the scope, the declared foreign keys, and what a guard may read."""
    model = options.model
    names = [options.scope_attname] if options.scope_attname is not None else []
    for path in (options.user_field, options.shared_via):
        hop = _first_hop(model, path)
        if hop is not None:
            names.append(hop.attname)
    if options.guard is not None:
        guarded = guard_attnames(options)
        names += guarded if guarded is not None else [f.attname for f in model._meta.fields]
    names += [field.attname for field in _foreign_keys(options, model)]
    return tuple(dict.fromkeys(names))


#: ``planned_attnames`` by the ``id()`` of the options they are of (kept with them).
_planned: dict[int, tuple[ModelOptions, tuple[str, ...]]] = {}


def audience_inputs(options: ModelOptions, instance: models.Model) -> tuple[Any, ...]:
    """The values of ``planned_attnames`` as ``instance`` holds them now."""
    values = instance.__dict__
    return tuple(values.get(attname) for attname in _planned_of(options))


def _planned_of(options: ModelOptions) -> tuple[str, ...]:
    """``planned_attnames(options)``, worked out once."""
    kept = _planned.get(id(options))
    if kept is None or kept[0] is not options:
        kept = _planned[id(options)] = (options, planned_attnames(options))
    return kept[1]


def unsure_attnames(
    options: ModelOptions, instances: Iterable[models.Model], written: Iterable[str]
) -> set[str]:
    """Of the columns that decide who reads a row (``planned_attnames``), those a partial
    write (``update_fields``, ``bulk_update``) left as stored that an instance holds: another
    process may have written the row since the instance was loaded (moved it to another
    scope, given it to another account), and the event is addressed by the row, not by a
    stale instance."""
    left = set(_planned_of(options)).difference(written)
    holding = [instance.__dict__ for instance in instances]
    return {attname for attname in left if any(attname in values for values in holding)}


def take_befores(options: ModelOptions, plans: dict[Any, Plan]) -> dict[Any, Before | None]:
    """``take_before`` of each of ``plans`` (of one bulk write), by the same keys: the accounts
    a one-hop key declared with ``to_field`` held are looked up for all of them at once (one
    statement per 500), not one statement per row."""
    targets = None
    hop = _first_hop(options.model, options.user_field)
    one_hop = hop is not None and len(split_path(options.user_field or "")) == 1
    if one_hop and plans and not holds_target_pk(hop):
        held = [plan.past.value(hop.attname) for plan in plans.values() if plan.accounts]
        targets = target_pks(hop, held, next(iter(plans.values())).past.using)
    return {key: take_before(options, plan, targets=targets) for key, plan in plans.items()}


def take_before(
    options: ModelOptions,
    plan: Plan,
    *,
    always: bool = False,
    targets: dict[Any, Any] | None = None,
) -> Before | None:
    """Who could read the row before the save about to run, as ``plan`` says; ``None`` when
    the stored row shows nothing can differ (``always``: taken even then, for a bulk write
    whose new values are not known yet). ``targets``: the accounts the values of a one-hop
    key declared with ``to_field`` name, looked up already (``take_befores``).

    Run in ``pre_save`` (the database still holds the row as it was), in a savepoint.
    """
    past, instance = plan.past, plan.past.instance
    if plan.accounts:
        path = options.user_field or ""
        if len(split_path(path)) == 1:
            # Accounts are named by primary key; a key declared with ``to_field`` holds
            # another column (a username): the account it names is looked up.
            first = _first_hop(options.model, path)
            held = past.value(first.attname)
            old = (
                target_pk(first, held, past.using)
                if targets is None or held is None
                else targets.get(normal_id(held))
            )
            return Before(accounts=[] if old is None else sorted_ids([old]))
        return Before(accounts=values_on_path(instance, path, past.using))
    scope_att = options.scope_attname or ""
    old_scope = past.value(scope_att) if scope_att else None
    root = _first_hop(options.model, options.shared_via)
    old_root = past.value(root.attname) if root is not None else None
    moved = not _same(old_scope, instance, scope_att)
    rerooted = root is not None and not _same(old_root, instance, root.attname)
    moved = moved or always
    if not (moved or rerooted or plan.readers):
        return None
    before = Before(scope_id=None if old_scope is None else normal_id(old_scope))
    before.channels = _old_channels(options, instance, past)
    if plan.readers and (old_scope is not None or options.is_global):
        pool = readers_pool(options, old_scope, past.using)
        (was,) = audience(options, old_scope, pool, [instance.pk], past.using, as_leaving(options))
        before.readers = sorted_ids(was)
    if moved or rerooted or plan.readers:
        # The readers of its root outside its scope pass its guard too (``shared_readers_of``):
        # a guard's change takes the row from them, or gives it, as from the scope's members.
        before.shared = shared_readers_of(
            options,
            instance.pk,
            old_scope,
            old_root,
            f"{options.name}:{instance.pk}",
            "nobody outside its scope hears it leave",
            past.using,
        )
    return before


def _same(old: Any, instance: models.Model, attname: str) -> bool:
    return bool(normal_id(old) == normal_id(instance.__dict__.get(attname)))


def _first_hop(model: type[models.Model], path: str | None) -> Any:
    """The first field of ``path`` when it is a foreign key on the row (a save can change
    it); ``None`` otherwise."""
    if not path:
        return None
    field = model._meta.get_field(split_path(path)[0])
    return field if is_foreign_key(field) else None


def first_hop_attname(options: ModelOptions) -> str | None:
    """The column of the row where its audience starts: the scope, or the first hop of the
    account path when it is a foreign key."""
    if options.user_field is None:
        return options.scope_attname
    first = _first_hop(options.model, options.user_field)
    return None if first is None else str(first.attname)


def guard_attnames(options: ModelOptions) -> frozenset[str] | None:
    """The columns of the row whose change may change a ``guard``'s answer: those named by
    ``guard_fields``; ``None`` when the model declares none (then every update of the row may
    change its readers, and they are taken before it)."""
    return options.guard_attnames


def _foreign_keys(options: ModelOptions, instance: models.Model | type[models.Model]) -> list[Any]:
    """The declared relations that are foreign keys on the row (their channels are columns)."""
    fields = []
    for name in options.relations:
        field = instance._meta.get_field(name)
        if is_foreign_key(field) and relation_target(options, name) is not None:
            fields.append(field)
    return fields


def _old_channels(options: ModelOptions, instance: models.Model, past: Past) -> list[str]:
    """The channels of the row as it was: its foreign-key relations read from the past (by
    their targets' primary keys: a query for a key declared with ``to_field``)."""
    channels = [options.name, record_channel(options.name, instance.pk)]
    for field in _foreign_keys(options, instance):
        pk = target_pk(field, past.value(field.attname), past.using)
        if pk is not None:
            channels.append(record_channel(wire_name(field.related_model), pk))
    return channels


def moves_audience(options: ModelOptions, written: Iterable[str]) -> bool:
    """Whether writing the columns ``written`` (attnames) may change who can read a row: the
    rule ``plan_before`` applies to one save, for a bulk write whose values are not known."""
    written = set(written)
    model = options.model
    if options.user_field is not None:
        first = _first_hop(model, options.user_field)
        return first is not None and first.attname in written
    root = _first_hop(model, options.shared_via)
    if options.scope_attname in written or (root is not None and root.attname in written):
        return True
    if options.guard is None:
        return False
    guarded = guard_attnames(options)
    return guarded is None or bool(guarded & written)


# Before a write of many rows -----------------------------------------------------------------

#: Rows read in one statement by primary key.
READ_CHUNK = 500


def accounts_of_rows(
    options: ModelOptions, stored: models.QuerySet[Any, Any], pks: list[Any]
) -> list[tuple[Any, Any]]:
    """(key, the accounts its path reaches) of each row, read by key (one statement per 500)."""
    lookup = key_lookup(options.model, options.user_field or "")
    merged: dict[Any, list[Any]] = {pk: [] for pk in pks}
    for chunk in chunked(pks, READ_CHUNK):
        for pk, account in stored.filter(pk__in=chunk).values_list("pk", lookup):
            if account is not None:
                merged.setdefault(pk, []).append(account)
    return list(merged.items())


def befores_of(
    options: ModelOptions, stored: models.QuerySet[Any, Any], pks: list[Any]
) -> dict[Any, Before]:
    """Who could read each of the rows ``pks`` before a write that may move them, as an
    ``update()`` of them takes it: the accounts of their path, or their scope and channels, a
    guard's readers and the readers of a shared root (see ``scoped_befores``)."""
    if options.user_field is not None:
        found = accounts_of_rows(options, stored, pks)
        return {pk: Before(accounts=sorted_ids(accounts or ())) for pk, accounts in found}
    return scoped_befores(options, stored, pks)


def scoped_befores(
    options: ModelOptions, stored: models.QuerySet[Any, Any], pks: list[Any]
) -> dict[Any, Before]:
    """Who could read each row before the update: its scope and channels (one statement per
    500 rows), a guard's readers (asked for all the rows of a scope together), the readers of
    a shared root (asked of the application's hook once per root and scope:
    ``shared_readers_once``)."""
    befores: dict[Any, Before] = {}
    with shared_readers_once():
        for chunk in chunked(pks, READ_CHUNK):
            for old in stored.filter(pk__in=chunk):
                plan = Plan(Past(old, None, stored=True, using=old._state.db), queries=True)
                before = take_before(options, plan, always=True)
                if before is not None:
                    befores[old.pk] = before
    if options.guard is not None:
        by_scope: dict[Any, list[Any]] = {}
        for pk, before in befores.items():
            if before.scope_id is not None or options.is_global:
                by_scope.setdefault(before.scope_id, []).append(pk)
        for scope, rows in by_scope.items():
            pool = readers_pool(options, scope, stored.db)
            found = audience(options, scope, pool, rows, stored.db, as_leaving(options))
            for pk, was in zip(rows, found, strict=True):
                befores[pk].readers = sorted_ids(was)
    return befores


# Before a delete ------------------------------------------------------------------------------

#: Hooks whose default answers a delete's preparation reads without a query.
DELETE_HOOKS = ("recipients", "outside_recipients", "audience", "shared_readers")


def prepare_delete(options: ModelOptions, instance: models.Model, using: str) -> Event | None:
    """The event of a delete and its audiences, read while the row still exists; never
    failing the delete."""
    return failsafe(
        f"{options.name}:{instance.pk}",
        using,
        delete_queries(options) or bool(lacks_columns(options, instance)),
        lambda: delete_event(options, instance, using),
    )


def delete_queries(options: ModelOptions) -> bool:
    """Whether preparing a delete may query: the model's own reads, or an auth hook the
    application overrode (the defaults of the hooks asked here do not query)."""
    auth = type(get_auth())
    overridden = any(
        getattr(auth, hook) is not getattr(RealtimeAuth, hook) for hook in DELETE_HOOKS
    )
    return options.delete_queries or overridden


def with_stored_audience(options: ModelOptions, instance: models.Model, using: str) -> models.Model:
    """``instance``, or a copy holding the columns that decide who reads its row
    (``planned_attnames``) as the row holds them: one ``SELECT`` on ``using``. The row may
    have been moved since the instance was loaded (by ``update()``, by a save of another
    instance of it, by another process), or nothing is known of it (an instance built by
    hand): a delete is told to whoever holds the row now. So are the columns its event
    carries that the instance holds an expression for (``F("n") + 1``, left by a save): the
    row holds what the database made of it. A row already gone leaves the instance as it is;
    a column it was loaded without is read with the event's (``events.with_columns``)."""
    unsure = unsure_attnames(options, [instance], ())
    unsure |= tracking.computed_attnames(instance, options.event_attnames)
    if not unsure:
        return instance
    found = read_columns([instance], sorted(unsure), using).get(id(instance))
    return instance if found is None else copy_with(instance, found)


def delete_event(
    options: ModelOptions, instance: models.Model, using: str | None = None
) -> Event | None:
    """Read a deletion's event and decide its audiences while the row still exists."""
    found = delete_events(options, [instance], using or instance._state.db or "default")
    return found[0] if found else None


def delete_events(
    options: ModelOptions, instances: Sequence[models.Model], using: str
) -> list[Event]:
    """``delete_event`` of the rows ``instances`` (a bulk delete's, on ``using``): what their
    events read of other rows (to-many targets, accounts along a path) is read for them
    together (``to_many_of_rows``), and a guarded model's readers are asked for the rows of
    each scope together (``views.audience``: one statement for their columns, as for one
    row), not row by row."""
    known: dict[Any, dict[str, list[Any]]] = {}
    if len(instances) > 1 and reads_rows_apart(options):
        pks = [instance.pk for instance in instances]
        known = to_many_of_rows(options, options.model, pks, using)
    events = [
        read_event(
            options, instance, "deleted", to_many=known.get(row_key(instance.pk)), using=using
        )
        for instance in instances
    ]
    told = [event for event in events if event is not None]
    if options.user_field is not None:
        for event in told:
            event.readers = recipients(event)
        return told
    if options.guard is not None:
        guarded_readers(options, told, using)
    for event in told:
        if options.shared_via is not None:
            event.shared = shared_readers(event, using)
        if not options.is_global:
            event.outside = outside_recipients(event)
    return told


def guarded_readers(options: ModelOptions, events: Sequence[Event], using: str) -> None:
    """Give each event of a guarded row the accounts who may read the row (its scope's
    members; every active account, for a global model), as delivery would decide them
    (``views.audience``), on ``using``, in the write's transaction: asked for the rows of
    each scope together."""
    by_scope: dict[Any, list[Event]] = {}
    for event in events:
        by_scope.setdefault(event.scope_id, []).append(event)
    for scope, group in by_scope.items():
        pool = readers_pool(options, scope, using)
        pks = [event.pk for event in group]
        found = audience(options, scope, pool, pks, using, as_events(group))
        for event, readers in zip(group, found, strict=True):
            event.readers = readers
