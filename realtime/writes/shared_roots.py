"""Readers gained or lost without a write of the row: the links of a shared root.

A shared record's root gives its rows readers outside their scope: sharing a project with
another workspace gives its members the project's tasks, and writes no task. So realtime
watches, for each decorated model with ``shared_via``, the many-to-many fields of its root: the
root's readers outside each scope of its rows are asked before and after the change
(``RealtimeAuth.shared_readers``), and those gained hear ``<name>.created`` of each row, those
lost ``<name>.deleted`` with only the model and the id. (Account paths, whose links are
membership rows, are watched by ``realtime.writes.memberships``, which tells their accounts
the same way, through ``row_events``.)

Both frames carry ``"moved": true``. At most ``REALTIME_CASCADE_LIMIT`` rows are announced per
change; past it one truncated event with no data tells the accounts to read again. The reads
run in savepoints, on the database the links are written to (never a read replica a router
sends reads to: it may not have the write yet), and nothing here fails the write.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models.signals import m2m_changed

from realtime.audience import readers
from realtime.auth import account_ids, get_auth, member_ids
from realtime.conf import conf
from realtime.encoding import normal_id, sorted_ids
from realtime.paths import path_target, to_lookup
from realtime.registry import ModelOptions, all_options
from realtime.writes import on_commit, pending
from realtime.writes.events import Event, read_event
from realtime.writes.failsafe import failsafe, never_raises

UID = "realtime:access"
PENDING = "_realtime_access_before"

#: through model -> (options, the root model)
_roots: dict[type[models.Model], list[tuple[ModelOptions, type[models.Model]]]] = {}


def connect() -> None:
    """Watch the links of every path and shared root. Called once models are ready."""
    for watched in _roots:
        m2m_changed.disconnect(sender=watched, dispatch_uid=UID)
    _roots.clear()
    for options in all_options():
        if options.shared_via is not None:
            root = path_target(options.model, options.shared_via)
            if root is not None:
                for field in root._meta.local_many_to_many:
                    links = field.remote_field.through
                    if isinstance(links, type):
                        _roots.setdefault(links, []).append((options, root))
    for watched in _roots:
        m2m_changed.connect(_on_links_changed, sender=watched, dispatch_uid=UID)


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
        before = failsafe(
            label, using, True, lambda: _readers_of_roots(sender, instance, pk_set, using)
        )
        pending.put(instance, PENDING, before or {})
        return
    if action not in ("post_add", "post_remove", "post_clear"):
        return
    before = pending.take(instance, PENDING, {})

    def changes() -> list[Event]:
        after = _readers_of_roots(sender, instance, pk_set, using)
        return _root_events(sender, before, after, using)

    on_commit.add_all(failsafe(label, using, True, changes) or [], using)


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
        events.append(
            Event(options, action, None, {}, [options.name], folded=True, accounts=accounts)
        )
    return events


# Shared roots ---------------------------------------------------------------------------------

Readers = dict[tuple[int, Any, Any], set[Any]]


def _roots_changed(
    through: type[models.Model], instance: models.Model, pk_set: set[Any] | None, using: str
) -> list[tuple[ModelOptions, models.Model]]:
    """The roots whose links changed: ``instance``, or the rows of ``pk_set`` it was linked
    to or from (read on ``using``, where the links are written)."""
    found = []
    for options, root_model in _roots.get(through, ()):
        if isinstance(instance, root_model):
            found.append((options, instance))
        else:
            found += [
                (options, root)
                for root in root_model._base_manager.using(using).filter(pk__in=pk_set or ())
            ]
    return found


def _readers_of_roots(
    through: type[models.Model], instance: models.Model, pk_set: set[Any] | None, using: str
) -> Readers:
    """For each root the change touches and each scope of its rows: its readers outside it.
    The rows and the scopes' members are read on ``using``, the database of the write."""
    readers_by: Readers = {}
    auth = get_auth()
    for index, (options, root) in enumerate(_roots_changed(through, instance, pk_set, using)):
        rows = options.model._base_manager.using(using).filter(
            **{to_lookup(options.shared_via or ""): root}
        )
        scopes = rows.values_list(options.scope_attname or "", flat=True).distinct()
        for scope in scopes[: conf.CASCADE_LIMIT]:
            if scope is not None:
                outside = set(sorted_ids(account_ids(auth.shared_readers(root, scope))))
                outside -= set(sorted_ids(member_ids(scope, using)))
                readers_by[(index, normal_id(root.pk), normal_id(scope))] = outside
    return readers_by


def _root_events(
    through: type[models.Model], before: Readers, after: Readers, using: str
) -> list[Event]:
    """The enter and leave events of the rows of each root whose readers changed, read on
    ``using``, the database of the write."""
    roots = {(index, root) for index, root, _ in {*before, *after}}
    options_of = [options for options, _ in _roots.get(through, ())]
    events: list[Event] = []
    for index, root in sorted(roots, key=str):
        options = options_of[index]
        lookup = to_lookup(options.shared_via or "")
        for key in sorted({k for k in {*before, *after} if k[:2] == (index, root)}, key=str):
            was, now = before.get(key, set()), after.get(key, set())
            rows = options.model._base_manager.using(using).filter(
                **{lookup: root, options.scope_attname or "": key[2]}
            )
            for accounts, entered in ((was - now, False), (now - was, True)):
                if options.guard is not None and entered:
                    events += _guarded_entries(options, rows, accounts)
                else:
                    events += row_events(options, rows, sorted_ids(accounts), entered)
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
