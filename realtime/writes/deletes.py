"""What a delete does to other rows: cascades, and rows it sets to ``NULL`` or their default.

**Cascades.** Django's own ``on_delete=CASCADE`` sends each child's delete signals, so each
child announces like any delete, but only ``REALTIME_CASCADE_LIMIT`` of them per (child
model, deletion): past it, the surplus folds into one ``<name>.deleted`` with no data, marked
truncated, per scope, on the model's channel, so clients reload the list instead of drowning
in events. Rows the *database* removes (``on_delete=DO_NOTHING`` plus an ``ON DELETE CASCADE``
constraint) send no signal at all: a child model declares ``cascade=["parent"]``; the
``pre_delete`` of the parent (or of a proxy of it) then reads its children, and theirs in turn
when they are parents of such children too, at most the limit of each child model one by one
per parent, and its ``post_delete`` hands their announcements to the outbox.

**Rows unlinked.** ``on_delete=SET_NULL``, ``SET_DEFAULT``, ``SET(...)`` and the database-side
``DB_SET_NULL``/``DB_SET_DEFAULT`` of Django 6.1 change children with one ``UPDATE`` (or in the
database), sending no signal, so a client would keep showing a link to a row that is gone. For
every decorated model with such a foreign key, the target's ``pre_delete`` reads the ids of the
children it links (at most ``REALTIME_CASCADE_LIMIT`` + 1 per foreign key, one query), and its
``post_delete`` reads those children again, as the delete left them, and announces each as
``<name>.updated`` with ``changed`` = that foreign key. Where that key decides who reads the
row (``audiences.moves_audience``), the ``pre_delete`` also takes who could read each, as an
``update()`` of the key would (``audiences.befores_of``): readers then enter, stay or leave
(``realtime.writes.views``). The event still reaches the channel of the deleted target, so a
client showing that target's list hears it. Past the limit, the surplus folds into one
truncated ``<name>.updated`` per scope. Django's own ``update()`` of those children, which a
``RealtimeQuerySet`` would otherwise announce, is left to this module (``unlinking``) in the
atomic block of the delete alone: a delete refused after its ``pre_delete`` leaves later
updates of those keys to the queryset.

**Rows going.** Every ``pre_delete`` of a deletion comes before its first ``post_delete``; the
rows of decorated models it names are noted per deletion (``going``), so that a receiver of a
``post_delete`` knows what else the deletion removes: the records a membership row going with
them would otherwise tell as leaving (``realtime.writes.memberships``).

Reads run in savepoints where needed; nothing here fails the delete.
"""

from __future__ import annotations

import contextvars
import weakref
from collections import Counter
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import Any

from django.db import connections, models
from django.db.models.signals import post_delete, pre_delete

from realtime.compat.django import atomic_block, in_transaction
from realtime.conf import conf
from realtime.encoding import id_order, normal_id, record_channel, row_key, sorted_ids
from realtime.readers import shared_readers_of
from realtime.registry import ModelOptions, all_options, options_for, wire_name
from realtime.writes import on_commit, pending
from realtime.writes.audiences import befores_of, delete_event, first_hop_attname, moves_audience
from realtime.writes.events import (
    Before,
    Event,
    column_of_path,
    folded_event,
    read_accounts,
    read_event,
)
from realtime.writes.failsafe import failsafe, never_raises
from realtime.writes.silence import silences

# Cascades --------------------------------------------------------------------------------------
PENDING_CASCADE = "_realtime_pending_cascade"


class _Deletion:
    """What one deletion (its ``origin``) announced so far of the rows it takes with it,
    shared by every parent it deletes: the cascade limit counts per child model and
    deletion, not per parent."""

    def __init__(self) -> None:
        # Django's cascade: children announced per model, the places folded (scopes, account
        # places, shared roots asked), and the folded events later children add to.
        self.cascaded: Counter[type[models.Model]] = Counter()
        self.folded: set[tuple[Any, Any]] = set()
        self.scope_folds: dict[tuple[Any, Any], Event] = {}
        self.account_folds: dict[type[models.Model], Event] = {}
        # Database cascades and rows unlinked: the parents and the rows announced, the rows
        # announced per child model (or foreign key), the places folded, and the truncated
        # update of each (model, scope) unlinked past the limit.
        self.seen: set[tuple[Any, Any]] = set()
        self.counts: Counter[Any] = Counter()
        self.below_folded: set[tuple[Any, Any]] = set()
        self.unlinked: dict[tuple[Any, Any], Event] = {}


#: Each deletion's ``_Deletion``, by its origin.
_deletions: weakref.WeakKeyDictionary[Any, _Deletion] = weakref.WeakKeyDictionary()


def _deletion(origin: Any) -> _Deletion | None:
    """The state of the deletion ``origin``; ``None`` where it cannot be kept (no origin, or
    one that cannot be weakly referenced or hashed)."""
    if origin is None:
        return None
    try:
        return _deletions.setdefault(origin, _Deletion())
    except TypeError:
        return None


def _origin_model(origin: Any) -> type[models.Model] | None:
    if isinstance(origin, models.Model):
        return type(origin)
    model = getattr(origin, "model", None)
    return model if isinstance(model, type) else None


def past_limit(sender: type[models.Model], instance: models.Model, origin: Any) -> bool:
    """Count a cascaded child of this deletion; whether it is past the cascade limit."""
    if origin is None or _origin_model(origin) is sender:
        return False
    deletion = _deletion(origin)
    if deletion is None:  # an origin that cannot be weakly referenced or hashed: no limit
        return False
    deletion.cascaded[sender] += 1
    return deletion.cascaded[sender] > conf.CASCADE_LIMIT


def fold(
    options: ModelOptions, instance: models.Model, origin: Any, using: str | None = None
) -> Event | None:
    """The one truncated event standing for the surplus children of a scope, once per scope,
    told also to the readers outside it of their shared roots (``outside_of_root``); of an
    account model, once per deletion (``_fold_accounts``)."""
    if options.user_field is not None:
        return _fold_accounts(options, instance, origin)
    scope_id = instance.__dict__.get(options.scope_attname or "")
    if scope_id is None and not options.is_global:
        return None
    deletion = _deletion(origin) or _Deletion()
    folds = deletion.scope_folds
    event = folds.get((options.model, scope_id))
    first = event is None
    if event is None:
        event = folds[(options.model, scope_id)] = folded_event(options, scope_id)
    outside = outside_of_root(options, instance, scope_id, deletion.folded, using)
    if outside:
        event.shared = sorted_ids([*(event.shared or ()), *outside])
    return event if first else None


def outside_of_root(
    options: ModelOptions,
    instance: models.Model,
    scope_id: Any,
    seen: set[tuple[Any, Any]],
    using: str | None,
) -> list[Any]:
    """The readers outside ``scope_id`` of the shared root of ``instance`` (a surplus row,
    read while it is there), asked once per root (``seen``) and not guard-checked: a
    truncated event names no row, it tells them to read the list again."""
    if options.shared_via is None:
        return []
    root_pk = column_of_path(instance, options.shared_via)
    # A root a path of several hops leads to is read from the row: asked once per row.
    root = ("root", normal_id(root_pk)) if root_pk is not None else ("row", row_key(instance.pk))
    place = (options.model, ("outside", root, normal_id(scope_id)))
    if place in seen:
        return []
    seen.add(place)
    found = shared_readers_of(
        options,
        instance.pk,
        scope_id,
        root_pk,
        f"{options.name} rows past the cascade limit",
        "they are not told to read again",
        using,
        guarded=False,
    )
    return found or []


def _fold_accounts(options: ModelOptions, instance: models.Model, origin: Any) -> Event | None:
    """The one truncated account event standing for the surplus children of an account
    model in a deletion, to the accounts of them all: the first one's, which later ones add
    theirs to (every ``pre_delete`` of a deletion comes before its first ``post_delete``,
    which hands it to the outbox). Their accounts are read while they are there, once per
    row their path's first step leads to (a thread's messages: once), else once per child."""
    hop = first_hop_attname(options)
    place = ("accounts", instance.pk if hop is None else instance.__dict__.get(hop))
    deletion = _deletion(origin) or _Deletion()
    if (options.model, place) in deletion.folded:
        return None
    deletion.folded.add((options.model, place))
    accounts = read_accounts(options, instance)
    folds = deletion.account_folds
    event = folds.get(options.model)
    if event is not None:
        event.accounts = sorted_ids([*(event.accounts or ()), *accounts])
        return None
    if not accounts:
        return None
    event = folds[options.model] = folded_event(options, None, accounts=accounts)
    return event


# Rows going ------------------------------------------------------------------------------------
#: The ids of the decorated rows each deletion (keyed by its origin) sent ``pre_delete`` for,
#: per concrete model: every one comes before the deletion's first ``post_delete``, so a
#: receiver there knows all the deletion removes.
_going: weakref.WeakKeyDictionary[Any, dict[type[models.Model], set[Any]]] = (
    weakref.WeakKeyDictionary()
)


@never_raises
def going(origin: Any, instance: models.Model) -> None:
    """Note that the deletion begun at ``origin`` removes the row of ``instance``."""
    if origin is None:
        return
    try:
        rows = _going.setdefault(origin, {})
    except TypeError:  # an origin that cannot be weakly referenced or hashed: nothing noted
        return
    model = instance._meta.concrete_model or type(instance)
    rows.setdefault(model, set()).add(row_key(instance.pk))


def gone_with(origin: Any) -> Mapping[type[models.Model], AbstractSet[Any]]:
    """The ids of the decorated rows, per concrete model, that the deletion begun at
    ``origin`` removes, as far as its ``pre_delete`` signals were sent: all of them, from its
    first ``post_delete`` on."""
    if origin is None:
        return {}
    try:
        return _going.get(origin, {})
    except TypeError:
        return {}


def parent_kept(
    options: ModelOptions, sender: type[models.Model], instance: models.Model, origin: Any
) -> bool:
    """Whether the deletion begun at ``origin`` removed the row of ``instance``, a multi-table
    child announcing as its ancestor ``options.model``, but kept the ancestor's row
    (``delete(keep_parents=True)``): Django then sends no ``pre_delete`` for the ancestor."""
    ancestor = options.model._meta.concrete_model
    if origin is None or ancestor is sender._meta.concrete_model:
        return False
    return row_key(instance.pk) not in gone_with(origin).get(ancestor, ())  # type: ignore[arg-type]


def connect_database_cascades() -> None:
    """Connect the parents of every ``cascade=[...]`` child, and their proxies (a proxy's
    delete sends its signals as the proxy). Called once models are ready."""
    for options in all_options():
        for fk_name in options.cascade:
            parent = options.model._meta.get_field(fk_name).related_model
            if isinstance(parent, type):
                for sender in _with_proxies(parent):
                    uid = f"realtime:cascade:{sender._meta.label}"
                    pre_delete.connect(_on_parent_pre_delete, sender=sender, dispatch_uid=uid)
                    post_delete.connect(_on_parent_post_delete, sender=sender, dispatch_uid=uid)


def _with_proxies(model: type[models.Model]) -> list[type[models.Model]]:
    """The installed models that store their rows in ``model``'s table: it and its proxies."""
    concrete = model._meta.concrete_model
    return [m for m in model._meta.apps.get_models() if m._meta.concrete_model is concrete]


def _on_parent_pre_delete(
    sender: type[models.Model],
    instance: models.Model,
    using: str,
    origin: Any = None,
    **kwargs: Any,
) -> None:
    if silences(origin):
        return
    events = failsafe(
        f"the database cascade of {sender._meta.label}:{instance.pk}",
        using,
        True,
        lambda: _children_events(sender, instance, using, _deletion(origin) or _Deletion()),
    )
    if events:
        pending.put(instance, PENDING_CASCADE, events)


def _on_parent_post_delete(
    sender: type[models.Model], instance: models.Model, using: str, **kwargs: Any
) -> None:
    on_commit.add_all(pending.take(instance, PENDING_CASCADE, []), using)


def _children_events(
    parent: type[models.Model], instance: models.Model, using: str, state: _Deletion
) -> list[Event]:
    """The deletes of the rows the database removes with ``instance``: the rows of every
    ``cascade=[...]`` model that link it, then the rows that link those, level by level, all
    read now while they still exist. A level is read only when the one above it found rows,
    and a model met again below itself (a tree of rows) only while it still announces rows one
    by one, so a cycle of keys ends."""
    state.seen.add((parent._meta.concrete_model, instance.pk))
    reading = _CascadeReading(using, state)
    level: list[tuple[type[models.Model], Any, frozenset[Any]]] = [
        (parent, instance, frozenset({parent._meta.concrete_model}))
    ]
    while level:
        below = []
        for model, rows, path in level:
            for options, fk_name in _cascading_to(model):
                # The first level by the instance (a key with a ``to_field`` holds that field's
                # value, not the pk); the others by the rows of the level above.
                lookup = fk_name if isinstance(rows, models.Model) else f"{fk_name}__in"
                children = options.model._base_manager.using(using).filter(**{lookup: rows})
                found, announced = reading.read(options, children)
                concrete = options.model._meta.concrete_model
                if found and (announced or concrete not in path):
                    # The rows read when they are all of them: no subquery in the next read.
                    whole = len(found) <= reading.limit
                    below.append((options.model, found if whole else children, path | {concrete}))
        level = below
    return reading.events


def _cascading_to(model: type[models.Model]) -> list[tuple[ModelOptions, str]]:
    """The ``cascade=[...]`` foreign keys to ``model``'s rows, with their model's options."""
    concrete = model._meta.concrete_model
    return [
        (options, fk_name)
        for options in all_options()
        for fk_name in options.cascade
        if _target_concrete(options, fk_name) is concrete
    ]


def _target_concrete(options: ModelOptions, fk_name: str) -> Any:
    target = options.model._meta.get_field(fk_name).related_model
    return target._meta.concrete_model if isinstance(target, type) else None


class _CascadeReading:
    """The events of one parent's database cascade, at most ``REALTIME_CASCADE_LIMIT`` rows
    of each child model one by one in its deletion (``state``), the rest folded into one
    truncated event per scope."""

    def __init__(self, using: str, state: _Deletion) -> None:
        self.using = using
        self.limit = conf.CASCADE_LIMIT
        self.events: list[Event] = []
        self.seen = state.seen
        self.counts = state.counts
        self.folded = state.below_folded

    def read(
        self, options: ModelOptions, children: models.QuerySet[Any, Any]
    ) -> tuple[list[Any], bool]:
        """Announce the rows of ``children`` not announced yet; the first rows read (one more
        than the limit), and whether any was announced one by one."""
        model = options.model._meta.concrete_model
        rows = list(children.order_by("pk")[: self.limit + 1])
        if "deleted" not in options.actions:
            return rows, False
        announced, surplus = False, len(rows) > self.limit
        for child in rows[: self.limit]:
            if (model, child.pk) in self.seen:
                continue
            if self.counts[model] >= self.limit:
                surplus = True
                continue
            self.seen.add((model, child.pk))
            self.counts[model] += 1
            announced = True
            event = delete_event(options_for(type(child)) or options, child, self.using)
            if event is not None:
                self.events.append(event)
        if surplus:
            self._fold(options, children, rows)
        return rows, announced

    def _fold(
        self, options: ModelOptions, children: models.QuerySet[Any, Any], rows: list[Any]
    ) -> None:
        """The truncated events of the scopes of the rows not announced one by one."""
        model = options.model._meta.concrete_model
        if options.is_global:
            scopes: set[Any] = {None}
        elif options.scope_attname is not None:
            attname = options.scope_attname
            scopes = {getattr(r, attname) for r in rows if (model, r.pk) not in self.seen}
            if len(rows) > self.limit:
                past = children.order_by("pk").values_list(attname, flat=True)[self.limit :]
                scopes.update(past)
            scopes.discard(None)
        else:  # an account model: its first rows only (docs/limits.md)
            return
        for scope_id in sorted(scopes - {s for m, s in self.folded if m is model}, key=id_order):
            self.folded.add((model, scope_id))
            self.events.append(folded_event(options, scope_id))


# Rows unlinked ---------------------------------------------------------------------------------
PENDING_UNLINKED = "_realtime_pending_unlinked"
UID = "realtime:unlinked"

#: What a target's ``pre_delete`` reads of the rows one of its foreign keys links to it: the
#: model and key, the ids of the first ``REALTIME_CASCADE_LIMIT`` rows, the scopes of the rest,
#: and who could read each of the first, where the key decides it (``audiences.moves_audience``).
Unlinked = tuple[
    ModelOptions, "models.ForeignKey[Any, Any]", list[Any], list[Any], dict[Any, Before]
]


def _unlinks(on_delete: Any) -> bool:
    """Whether ``on_delete`` changes the children's foreign key rather than deleting them."""
    if on_delete in (models.SET_NULL, models.SET_DEFAULT):
        return True
    if getattr(on_delete, "__name__", "") in ("DB_SET_NULL", "DB_SET_DEFAULT"):
        return True
    deconstruct = getattr(on_delete, "deconstruct", None)
    return callable(deconstruct) and deconstruct()[0] == "django.db.models.SET"


def unlinking_fields(
    options: ModelOptions,
) -> list[models.ForeignKey[Any, Any]]:
    """The foreign keys of a decorated model that a delete of their target rewrites."""
    return [
        field
        for field in options.model._meta.concrete_fields
        if isinstance(field, models.ForeignKey) and _unlinks(field.remote_field.on_delete)
    ]


_links: dict[type[models.Model], list[tuple[ModelOptions, models.ForeignKey[Any, Any]]]] = {}


def connect_unlinked() -> None:
    """Connect the targets of every unlinking foreign key. Called once models are ready."""
    for target in _links:
        pre_delete.disconnect(sender=target, dispatch_uid=UID)
        post_delete.disconnect(sender=target, dispatch_uid=UID)
    _links.clear()
    for options in all_options():
        if "updated" not in options.actions:
            continue
        for field in unlinking_fields(options):
            target = field.related_model
            if isinstance(target, type):
                _links.setdefault(target, []).append((options, field))
    for target in _links:
        pre_delete.connect(_on_target_deleting, sender=target, dispatch_uid=UID)
        post_delete.connect(_on_target_deleted, sender=target, dispatch_uid=UID)


@never_raises
def _on_target_deleting(
    sender: type[models.Model],
    instance: models.Model,
    using: str,
    origin: Any = None,
    **kwargs: Any,
) -> None:
    if silences(origin):
        return

    def read() -> list[Unlinked]:
        found = []
        state = _deletion(origin) or _Deletion()
        for options, field in _links.get(sender, ()):
            stored = options.model._base_manager.using(using)
            children = stored.filter(**{field.name: instance})
            # The limit counts the rows of each foreign key per deletion, not per target.
            left = max(0, conf.CASCADE_LIMIT - state.counts[(options.model, field.name)])
            ids = list(children.order_by("pk").values_list("pk", flat=True)[: left + 1])
            folds: list[Event] = []
            if len(ids) > left:
                surplus = children.order_by("pk")[left:]
                folds = _unlinked_folds(options, surplus, using, state)
            ids = ids[:left]
            state.counts[(options.model, field.name)] += len(ids)
            befores = {}
            if ids and moves_audience(options, [field.attname]):
                befores = befores_of(options, stored, ids)
            found.append((options, field, ids, folds, befores))
        return found

    label = f"the rows {sender._meta.label}:{instance.pk} unlinks"
    unlinked = failsafe(label, using, True, read) or []
    pending.put(instance, PENDING_UNLINKED, unlinked)
    unlinking(_pairs(unlinked), True, using)


def _unlinked_folds(
    options: ModelOptions,
    surplus: models.QuerySet[Any, Any],
    using: str,
    state: _Deletion,
) -> list[Event]:
    """The truncated ``<name>.updated`` events standing for the rows a delete unlinks past
    the limit (``surplus``, read while they are linked), new ones only (each place is told
    once per deletion, ``state``): one per scope, told also to the readers outside it of
    their shared roots; one for a global model; for an account model, one to the accounts
    their paths reach (read once per row their first step leads to)."""
    model, seen = options.model, state.below_folded

    def first(place: Any) -> bool:
        key = (model, ("unlinked", place))
        if key in seen:
            return False
        seen.add(key)
        return True

    if options.is_global:
        return [folded_event(options, None, "updated")] if first(None) else []
    if options.user_field is not None:
        hop = first_hop_attname(options)
        accounts: list[Any] = []
        for row in surplus.iterator():
            place = row_key(row.pk) if hop is None else normal_id(row.__dict__.get(hop))
            if first(("accounts", place)):
                accounts += read_accounts(options, row, using)
        return [folded_event(options, None, "updated", accounts=accounts)] if accounts else []
    if options.scope_attname is None:
        return []
    made: list[Event] = []

    def fold_of(scope_id: Any) -> Event:
        event = state.unlinked.get((model, normal_id(scope_id)))
        if event is None:
            event = folded_event(options, scope_id, "updated")
            state.unlinked[(model, normal_id(scope_id))] = event
            made.append(event)
        return event

    if options.shared_via is None:
        for scope_id in {*surplus.values_list(options.scope_attname, flat=True)} - {None}:
            fold_of(scope_id)
    for row in surplus.iterator() if options.shared_via is not None else ():
        scope_id = row.__dict__.get(options.scope_attname)
        if scope_id is None:
            continue
        event = fold_of(scope_id)
        outside = outside_of_root(options, row, scope_id, seen, using)
        if outside:  # an event made for an earlier target is published after this read
            event.shared = sorted_ids([*(event.shared or ()), *outside])
    return sorted(made, key=lambda event: id_order(event.scope_id))


def _pairs(unlinked: list[Any]) -> list[tuple[Any, str]]:
    return [(options.model._meta.concrete_model, field.name) for options, field, *_ in unlinked]


@never_raises
def _on_target_deleted(
    sender: type[models.Model], instance: models.Model, using: str, **kwargs: Any
) -> None:
    unlinked = pending.take(instance, PENDING_UNLINKED, [])
    if not unlinked:
        return
    unlinking(_pairs(unlinked), False, using)
    target_channel = record_channel(wire_name(sender), instance.pk)

    def read() -> list[Event]:
        events: list[Event] = []
        for options, field, ids, folds, befores in unlinked:
            # Read as the delete left them: the new value of the key, whatever set it.
            stored = options.model._base_manager.using(using)
            for child in stored.filter(pk__in=ids).order_by("pk"):
                before = befores.get(child.pk)
                event = read_event(
                    options,
                    child,
                    "updated",
                    [field.name],
                    scopeless=before is not None,
                    using=using,
                )
                if event is None:
                    continue
                event.before = before  # its readers then enter, stay or leave
                if field.name in options.relations and target_channel not in event.channels:
                    event.channels.append(target_channel)
                events.append(event)
            events += folds
        return events

    label = f"the rows {sender._meta.label}:{instance.pk} unlinked"
    on_commit.add_all(failsafe(label, using, True, read) or [], using)


#: Where a delete in progress noted it: its database, and the atomic block it runs in.
Scope = tuple[str, weakref.ref[object] | None]

#: (model, foreign key) pairs a delete in progress is unlinking, by where it noted them:
#: Django's ``update()`` of those children is announced here, which knows the row they were
#: linked to.
_unlinking: contextvars.ContextVar[dict[Scope, frozenset[tuple[Any, str]]] | None] = (
    contextvars.ContextVar("realtime_unlinking", default=None)
)


def _scope(using: str) -> Scope:
    """The database ``using`` and the atomic block open innermost on it, held weakly."""
    block = atomic_block(connections[using])
    return using, None if block is None else weakref.ref(block)


def _open(scope: Scope) -> bool:
    """Whether the block of ``scope`` may still be open (a block closed and freed is not)."""
    block = scope[1]
    return block is None or block() is not None


def unlinking(pairs: Iterable[tuple[Any, str]], on: bool, using: str) -> None:
    """Note (``on``) or forget that a delete on ``using`` is unlinking the children of ``pairs``.

    Noted for the atomic block Django's delete opens for its ``pre_delete`` signals, the
    ``update()`` unlinking the children and its ``post_delete`` signals, and holding in that
    block alone: a delete that fails between the two signals (a ``pre_delete`` receiver of
    the application's refusing it) never forgets, and its block, closed, no longer counts.
    """
    scope = _scope(using)
    held = {place: noted for place, noted in (_unlinking.get() or {}).items() if _open(place)}
    noted = held.pop(scope, frozenset())
    noted = noted | frozenset(pairs) if on else noted - frozenset(pairs)
    if noted:
        held[scope] = noted
    _unlinking.set(held or None)


def left_to_unlinked(queryset: models.QuerySet[Any, Any], values: dict[str, Any]) -> bool:
    """Whether an ``update()`` is the one Django makes for a delete unlinking children (one
    foreign key written, in the delete's own atomic block): announced here, not by the
    queryset."""
    held = _unlinking.get()
    if not held or len(values) != 1:
        return False
    (name,) = values
    model = queryset.model._meta.concrete_model
    pairs = held.get(_scope(queryset.db), frozenset())
    return (model, name) in pairs and in_transaction(connections[queryset.db])
