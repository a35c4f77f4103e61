"""Readers gained or lost without a write of the row: the links of a shared root.

A shared record's root gives its rows readers outside their scope: sharing a project with
another workspace gives its members the project's tasks, and writes no task. So realtime
watches, for each decorated model with ``shared_via``, the many-to-many fields of its root: the
root's readers outside each scope of its rows are asked before and after the change
(``RealtimeAuth.shared_readers``), and those gained hear ``<name>.created`` of each row, those
lost ``<name>.deleted`` with only the model and the id. A guarded row is told only to the
readers its guard admits: after the change for those gained, before it for those lost (a
reader it never admitted must not learn the row's id). (Account paths, whose links are
membership rows, are watched by ``realtime.writes.memberships``, which tells their accounts
the same way, through ``row_events``.)

The links change in every way their rows can. Those of an auto-created through table are
watched by its querysets, as an account path's membership rows are
(``realtime.writes.link_tables``: ``add``, ``remove``, ``clear``, ``set`` of the many-to-many
manager, and ``bulk_create``, ``update()``, ``bulk_update`` and ``delete()`` of the table, each
told once); those of a ``through`` model of the application's own by ``m2m_changed`` (its
rows written directly are not seen: ``realtime.W033``). Links Django deletes with a row they
link (deleting a workspace a project is shared with) are told from that row's
``pre_delete`` and ``post_delete`` (``link_tables.watch_deletes``), whatever their table.

Both frames carry ``"moved": true``. At most ``REALTIME_CASCADE_LIMIT`` rows are announced per
change; past it one truncated event with no data tells the accounts to read again. The reads
run in savepoints, on the database the links are written to (never a read replica a router
sends reads to: it may not have the write yet), and nothing here fails the write.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from django.db import models
from django.db.models.signals import m2m_changed

from realtime.audience import readers, readers_of_rows
from realtime.auth import account_ids, get_auth, member_ids
from realtime.chunks import chunked
from realtime.conf import conf
from realtime.encoding import id_order, normal_id, row_key, sorted_ids
from realtime.paths import path_target, source_key, target_key, to_lookup
from realtime.registry import ModelOptions, all_options
from realtime.writes import link_tables, on_commit, pending
from realtime.writes.events import Event, read_event
from realtime.writes.failsafe import failsafe, never_raises

UID = "realtime:access"
PENDING = "_realtime_access_before"
#: Roots read in one statement by the values of their key.
CHUNK = 500

#: through model -> (options, the root model, its many-to-many those rows are the links of)
_roots: dict[type[models.Model], list[tuple[ModelOptions, type[models.Model], Any]]] = {}


def connect() -> None:
    """Watch the links of every shared root. Called once models are ready (the managers of
    their auto-created tables are then extended: ``link_models()``)."""
    for through in _roots:
        m2m_changed.disconnect(sender=through, dispatch_uid=UID)
    _roots.clear()
    for options in all_options():
        if options.shared_via is not None:
            root = path_target(options.model, options.shared_via)
            if root is not None:
                for field in root._meta.local_many_to_many:
                    links = field.remote_field.through
                    if isinstance(links, type):
                        _roots.setdefault(links, []).append((options, root, field))
    for through in _roots:
        if not through._meta.auto_created:  # its own rows are no queryset of realtime's
            m2m_changed.connect(_on_links_changed, sender=through, dispatch_uid=UID)
    link_tables.watch_deletes(UID, [(through, side(through)) for through in _roots])


def link_models() -> list[type[models.Model]]:
    """The auto-created through tables of shared roots: watched by their querysets."""
    return [through for through in _roots if through._meta.auto_created]


def watched(model: type[models.Model]) -> bool:
    """Whether ``model`` is the auto-created through table of a shared root's links."""
    return bool(_roots) and bool(model._meta.auto_created) and model in _roots


@never_raises
def _on_links_changed(
    sender: type[models.Model],
    instance: models.Model,
    action: str,
    pk_set: set[Any] | None,
    using: str,
    **kwargs: Any,
) -> None:
    label = f"the readers {sender._meta.label} links give"
    if action in ("pre_add", "pre_remove", "pre_clear"):

        def readers_before() -> Asked:
            roots = _roots_changed(sender, instance, pk_set, using, action == "pre_clear")
            return _ask(sender, roots, using)

        pending.put(instance, PENDING, failsafe(label, using, True, readers_before))
        return
    if action not in ("post_add", "post_remove", "post_clear"):
        return
    taken = pending.take(instance, PENDING)

    def changes() -> list[Event]:
        if taken is None:  # not known before: who reads the rows now hears them enter
            roots, before, admitted = _roots_changed(sender, instance, pk_set, using), {}, {}
        else:
            roots, before, admitted = taken
        after = _readers_of_roots(roots, using)
        return _root_events(sender, before, after, admitted, using)

    on_commit.add_all(failsafe(label, using, True, changes) or [], using)


# Writes of an auto-created link table ---------------------------------------------------------


def side(through: type[models.Model]) -> link_tables.Side:
    """What a write of the auto-created table ``through`` changes: the readers of the roots
    its links name (``realtime.writes.link_tables`` runs the write between the two asks)."""
    field = _roots[through][0][2]
    return link_tables.Side(
        key=source_key(field),
        other=target_key(field),
        before=functools.partial(_before_write, through),
        after=functools.partial(_after_write, through),
        label=_label(through),
    )


def _before_write(through: type[models.Model], keys: set[Any], using: str) -> Asked:
    return _ask(through, _roots_linked(through, keys, using), using)


def _after_write(
    through: type[models.Model], asked: Asked, later: set[Any], using: str
) -> list[Event]:
    """The events of the roots asked before a write, and of those its links name only after
    it (not known before: who reads their rows now hears them enter)."""
    roots, before, admitted = asked
    known = {(index, normal_id(root.pk)) for index, _, root in roots}
    found = roots + [
        root
        for root in _roots_linked(through, later, using)
        if (root[0], normal_id(root[2].pk)) not in known
    ]
    return _root_events(through, before, _readers_of_roots(found, using), admitted, using)


def _ask(through: type[models.Model], roots: list[Root], using: str) -> Asked:
    """``roots``, their readers outside each scope, and those each guarded row's guard admits:
    what ``_root_events`` compares with the readers after a change."""
    readers_by = _readers_of_roots(roots, using)
    return roots, readers_by, _admitted(through, readers_by, using)


def _label(through: type[models.Model]) -> str:
    return f"the readers {through._meta.label} links give"


# Who hears a row enter or leave --------------------------------------------------------------


def row_events(
    options: ModelOptions, rows: models.QuerySet[Any, Any], accounts: list[Any], entered: bool
) -> list[Event]:
    """Enter (or leave) events of ``rows`` for ``accounts``: at most the cascade limit, then
    one truncated event. What an event reads besides the rows is read where they are
    (``rows.db``: the caller binds them to the write's database)."""
    if not accounts:
        return []
    limit = conf.CASCADE_LIMIT
    found = list(rows.order_by("pk")[: limit + 1])
    action = "created" if entered else "deleted"
    events: list[Event] = []
    for row in found[:limit]:
        event = read_event(
            options, row, action, scopeless=True, using=rows.db, with_payload=entered
        )
        if event is None:
            continue
        if not entered:  # a leaver may no longer read the row: its identity alone
            event.data = {"model": options.name, "id": event.data["id"]}
        event.accounts = accounts
        events.append(event)
    if len(found) > limit:
        events.append(_truncated(options, action, accounts))
    return events


def _truncated(options: ModelOptions, action: str, accounts: list[Any]) -> Event:
    """The one event, naming no row, that tells ``accounts`` to read the model again."""
    return Event(options, action, None, {}, [options.name], folded=True, accounts=accounts)


# Shared roots ---------------------------------------------------------------------------------

#: A root whose links change: the index of its entry in ``_roots``, its options, its row.
Root = tuple[int, ModelOptions, models.Model]
#: (index of the entry, root, scope) -> the root's readers outside the scope.
Readers = dict[tuple[int, Any, Any], set[Any]]
#: For each key of ``Readers`` whose rows are guarded, by ``row_key`` of each row: the
#: readers outside the scope its guard admits.
Admitted = dict[tuple[int, Any, Any], dict[Any, set[Any]]]
#: Roots asked before their links change: them, their readers, and those their guards admit.
Asked = tuple[list[Root], Readers, Admitted]


def _roots_changed(
    through: type[models.Model],
    instance: models.Model,
    pk_set: set[Any] | None,
    using: str,
    clearing: bool = False,
) -> list[Root]:
    """The roots whose links change: ``instance``, or, from the other side, the rows named
    by ``pk_set`` (the values of the key the links hold) — for ``clear()``, which names none,
    those linked to ``instance`` now. Read on ``using``, where the links are written."""
    entries = _roots.get(through, ())
    if entries and isinstance(instance, entries[0][1]):
        return [(index, options, instance) for index, (options, _, _) in enumerate(entries)]
    if clearing:
        return _roots_of(through, instance, using)
    return _roots_linked(through, {normal_id(value) for value in pk_set or ()}, using)


def _roots_linked(through: type[models.Model], keys: Iterable[Any], using: str) -> list[Root]:
    """The roots whose key values (those their links hold: the primary key, unless the
    links' foreign key names another field) are ``keys``, read on ``using``."""
    keys = sorted(set(keys), key=id_order)
    found: list[Root] = []
    for index, (options, root_model, field) in enumerate(_roots.get(through, ())):
        target = source_key(field).target_field.name
        rows = root_model._base_manager.using(using)
        for chunk in chunked(keys, CHUNK):
            linked = rows.filter(**{f"{target}__in": chunk}).order_by("pk")
            found += [(index, options, root) for root in linked]
    return found


def _roots_of(through: type[models.Model], other: models.Model, using: str) -> list[Root]:
    """The roots linked, by the links of ``through``, to ``other``, a row of the other side."""
    found: list[Root] = []
    for index, (options, root_model, field) in enumerate(_roots.get(through, ())):
        rows = root_model._base_manager.using(using).filter(**{field.name: other})
        found += [(index, options, root) for root in rows.order_by("pk")]
    return found


def _readers_of_roots(roots: list[Root], using: str) -> Readers:
    """For each of ``roots`` and each scope of its rows: its readers outside it. The rows and
    the scopes' members are read on ``using``, the database of the write."""
    readers_by: Readers = {}
    auth = get_auth()
    for index, options, root in roots:
        rows = _rows_of(options, root, using)
        scopes = rows.values_list(options.scope_attname or "", flat=True).distinct()
        for scope in scopes[: conf.CASCADE_LIMIT]:
            if scope is not None:
                outside = set(sorted_ids(account_ids(auth.shared_readers(root, scope))))
                outside -= set(sorted_ids(member_ids(scope, using)))
                readers_by[(index, normal_id(root.pk), normal_id(scope))] = outside
    return readers_by


def _rows_of(
    options: ModelOptions, root: Any, using: str, scope: Any = None
) -> models.QuerySet[Any, Any]:
    """The rows ``root`` (a row or its primary key) shares, read on ``using``; those of
    ``scope`` alone when one is given."""
    rows = options.model._base_manager.using(using).filter(
        **{to_lookup(options.shared_via or ""): root}
    )
    return rows if scope is None else rows.filter(**{options.scope_attname or "": scope})


def _admitted(through: type[models.Model], readers_by: Readers, using: str) -> Admitted:
    """Of the readers outside each scope, those the guard of each row admits, asked before
    the links change: a guard may read the links too, and once they are gone it may no
    longer admit a reader it did. One it never admitted could never read the row, and must
    not learn its id when the row leaves him (at most ``REALTIME_CASCADE_LIMIT`` rows per
    root and scope, as its enter events)."""
    options_of = [options for options, _, _ in _roots.get(through, ())]
    admitted: Admitted = {}
    for key, accounts in readers_by.items():
        options = options_of[key[0]]
        if options.guard is None or not accounts:
            continue
        rows = _rows_of(options, key[1], using, key[2]).order_by("pk")
        pks = list(rows.values_list("pk", flat=True)[: conf.CASCADE_LIMIT])
        found = readers_of_rows(options, pks, sorted_ids(accounts), using=using)
        admitted[key] = {row: set(sorted_ids(ids)) for row, ids in found.items()}
    return admitted


def _root_events(
    through: type[models.Model],
    before: Readers,
    after: Readers,
    admitted: Admitted,
    using: str,
) -> list[Event]:
    """The enter and leave events of the rows of each root whose readers changed, read on
    ``using``, the database of the write; a guarded row leaves only the readers its guard
    admitted before the change (``admitted``)."""
    roots = {(index, root) for index, root, _ in {*before, *after}}
    options_of = [options for options, _, _ in _roots.get(through, ())]
    events: list[Event] = []
    for index, root in sorted(roots, key=str):
        options = options_of[index]
        for key in sorted({k for k in {*before, *after} if k[:2] == (index, root)}, key=str):
            was, now = before.get(key, set()), after.get(key, set())
            rows = _rows_of(options, root, using, key[2])
            if options.guard is None:
                events += row_events(options, rows, sorted_ids(was - now), False)
                events += row_events(options, rows, sorted_ids(now - was), True)
            else:
                events += _guarded_leaves(options, rows, was - now, admitted.get(key, {}))
                events += _guarded_entries(options, rows, now - was)
    return events


def _guarded_leaves(
    options: ModelOptions,
    rows: models.QuerySet[Any, Any],
    accounts: set[Any],
    admitted: dict[Any, set[Any]],
) -> list[Event]:
    """Leave events of guarded rows, each only to those of ``accounts`` its guard admitted
    before the change (``admitted``, by ``row_key``); past the cascade limit, as for rows
    with no guard, one truncated event to them all (it names no row)."""
    limit = conf.CASCADE_LIMIT
    found = list(rows.order_by("pk")[: limit + 1])
    events: list[Event] = []
    for row in found[:limit]:
        told = sorted_ids(accounts & admitted.get(row_key(row.pk), set()))
        events += row_events(options, rows.filter(pk=row.pk), told, False)
    if len(found) > limit and accounts:
        events.append(_truncated(options, "deleted", sorted_ids(accounts)))
    return events


def _guarded_entries(
    options: ModelOptions, rows: models.QuerySet[Any, Any], accounts: set[Any]
) -> list[Event]:
    """Enter events of guarded rows, each only to the accounts its guard admits (asked
    where ``rows`` are read)."""
    events: list[Event] = []
    for row in rows.order_by("pk")[: conf.CASCADE_LIMIT]:
        admitted = sorted_ids(readers(options, row.pk, accounts, using=rows.db)) if accounts else []
        events += row_events(options, rows.filter(pk=row.pk), admitted, True)
    return events
