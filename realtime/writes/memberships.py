"""Memberships of every shape: accounts gain or lose rows when the links that lead to them change.

A ``user_field`` path reaches its accounts through a *membership row*: the through row of a
many-to-many (auto-created or the application's own ``through`` model: ``participants``,
``thread.members``) or a row of the application's behind a reverse foreign key
(``chat.seats.user``). The hops before it, if any, are foreign keys; the row they lead to is the
*owner* (the record itself when there are none). Changing membership rows changes who reads
the records reached from their owner, and they change in every way a row can: through the
many-to-many manager (``add``, ``remove``, ``clear``, ``set``), by ``save()`` and ``delete()``,
and in bulk. So realtime watches the membership model itself, whichever way it is written:

* rows created (``save``, ``bulk_create``, the manager's ``add``): an (owner, account) pair
  that did not exist before the write *enters* — the account hears ``<name>.created`` of each
  record reached from the owner;
* rows deleted (``delete``, ``QuerySet.delete``, the manager's ``remove`` and ``clear``): a
  pair that no longer exists after the write *leaves* — ``<name>.deleted`` with the model and
  the id only (Django sends no signal for the rows of an auto-created through table: their
  ``QuerySet.delete()`` is watched instead). A record the same deletion removes (a chat's
  lines, going with the chat and its seats) is told by its own delete, not as leaving: one
  ``deleted`` each, as where the through rows going with their owner send no signal;
* rows updated (``save``, ``update()``, ``bulk_update``): the pairs before and after are
  compared, counting the rows the write did not touch.

Both frames carry ``"moved": true``. At most ``REALTIME_CASCADE_LIMIT`` records are announced
per owner and account batch; past it, one truncated event. Reads run in savepoints; nothing
here fails the write. A path realtime cannot follow this way is named by a system check
(``realtime.W032``), and so is one with more than one foreign key before its membership rows
(``spot.chat.members``): they are watched, but a change of a key past the record's own
(``spot.chat``) is a write of neither the record nor a membership row (``followed``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth import get_user_model
from django.db import models
from django.db.models import ForeignObjectRel
from django.db.models.signals import post_delete, post_save, pre_delete, pre_save

from realtime.chunks import chunked
from realtime.compat.django_orm import matching, write_alias
from realtime.conf import conf
from realtime.encoding import id_order, normal_id, row_key, sorted_ids
from realtime.paths import (
    is_foreign_key,
    pks_by_value,
    resolve_path,
    source_key,
    split_path,
    target_key,
    to_lookup,
)
from realtime.registry import ModelOptions, all_options
from realtime.writes import deletes, on_commit, pending
from realtime.writes.bulk import upsert_matches, upsert_unique_fields
from realtime.writes.events import Event, with_attnames
from realtime.writes.failsafe import failsafe, never_raises
from realtime.writes.shared_roots import row_events
from realtime.writes.silence import silences

logger = logging.getLogger(__name__)

UID = "realtime:memberships"
PENDING = "_realtime_membership_before"
#: Rows read in one statement by primary key (and pairs by owner and account).
CHUNK = 500

Pair = tuple[Any, Any]
#: The ids of the rows a deletion in progress removes, per concrete model (``deletes.gone_with``).
Going = Mapping[type[models.Model], AbstractSet[Any]]


@dataclass(frozen=True, eq=False)
class Watch:
    """One path through one membership model (compared and hashed by identity)."""

    options: ModelOptions
    membership: type[models.Model]
    #: Attnames, on the membership model, of the foreign keys to the owner and to the account.
    owner: str
    account: str
    #: From a record to its owner (``"thread"``); ``None``: the record itself.
    lookup: str | None
    #: The fields of the owner and of the account those foreign keys hold the values of: the
    #: primary keys, unless they name another (``to_field``).
    owner_target: str = "pk"
    account_target: str = "pk"


_watches: dict[type[models.Model], list[Watch]] = {}


def watch_of(options: ModelOptions) -> Watch | bool:
    """How the ``user_field`` path of ``options`` is watched: a ``Watch``; ``True`` when it
    needs none (no path, or a one-hop foreign key written on the record itself); ``False``
    when realtime cannot follow its links (``realtime.W032`` names it)."""
    path = options.user_field
    if path is None:
        return True
    try:
        fields: list[Any] = list(resolve_path(options.model, path))
    except ValueError:
        return True  # named by realtime.E031
    if all(is_foreign_key(f) for f in fields):
        return len(fields) == 1
    found = _membership(fields)
    if found is None:
        return False
    hops, membership, owner, account = found
    if not all(is_foreign_key(f) for f in hops):
        return False
    lookup = to_lookup(".".join(split_path(path)[: len(hops)])) if hops else None
    return Watch(
        options,
        membership,
        owner.attname,
        account.attname,
        lookup,
        _target(owner),
        _target(account),
    )


def followed(options: ModelOptions) -> bool:
    """Whether realtime follows every link of the ``user_field`` path of ``options``: the
    record's own foreign key (a write of the record) and the membership rows. A foreign key
    further on (``spot.chat`` in ``spot.chat.members``: a spot moved to another chat) changes
    who reads the records by a write of neither, and is not followed: ``realtime.W032``
    names such a path, as it names one ``watch_of`` cannot watch at all."""
    found = watch_of(options)
    if isinstance(found, Watch):
        return found.lookup is None or len(split_path(found.lookup)) == 1
    return found


def _target(key: Any) -> str:
    """The field a foreign key's values are values of: ``pk``, or the one ``to_field`` names."""
    target = key.target_field
    return "pk" if target.primary_key else str(target.name)


def _membership(fields: list[Any]) -> tuple[list[Any], type[models.Model], Any, Any] | None:
    """The hops before the membership row, its model, and its foreign keys to the owner and
    to the account; ``None`` for a path that ends some other way."""
    user_model = get_user_model()
    last = fields[-1]
    if last.many_to_many and last.related_model is user_model:
        if isinstance(last, ForeignObjectRel):  # the many-to-many is declared on the account
            m2m: Any = last.field
            owner, account = target_key(m2m), source_key(m2m)
        else:
            m2m = last
            owner, account = source_key(m2m), target_key(m2m)
        through = m2m.remote_field.through
        if not (isinstance(through, type) and issubclass(through, models.Model)):
            return None
        return fields[:-1], through, owner, account
    before_last = fields[-2] if len(fields) >= 2 else None
    if (
        is_foreign_key(last)
        and last.related_model is user_model
        and isinstance(before_last, ForeignObjectRel)
        and before_last.one_to_many
    ):
        rows = before_last.related_model
        if not isinstance(rows, type):
            return None
        return fields[:-2], rows, before_last.field, last
    return None


def connect() -> None:
    """Watch the membership model of every account path. Called once models are ready (its
    managers are then extended: ``memberships()``)."""
    for membership in _watches:
        for signal in (pre_save, post_save, pre_delete, post_delete):
            signal.disconnect(sender=membership, dispatch_uid=UID)
    _watches.clear()
    for options in all_options():
        found = watch_of(options)
        if isinstance(found, Watch):
            _watches.setdefault(found.membership, []).append(found)
    for membership in _watches:
        pre_save.connect(_on_pre_save, sender=membership, dispatch_uid=UID)
        post_save.connect(_on_post_save, sender=membership, dispatch_uid=UID)
        pre_delete.connect(_on_pre_delete, sender=membership, dispatch_uid=UID)
        post_delete.connect(_on_post_delete, sender=membership, dispatch_uid=UID)


def membership_models() -> list[type[models.Model]]:
    """The models holding the membership rows realtime watches."""
    return list(_watches)


def watched(model: type[models.Model]) -> bool:
    """Whether ``model`` holds membership rows of some account path."""
    return bool(_watches) and model._meta.concrete_model in _watches


def _watches_of(model: type[models.Model]) -> list[Watch]:
    return _watches.get(model._meta.concrete_model, [])  # type: ignore[arg-type]


# Single rows ---------------------------------------------------------------------------------


@never_raises
def _on_pre_save(
    sender: type[models.Model], instance: models.Model, raw: bool, using: str, **kwargs: Any
) -> None:
    if raw:
        return

    def old() -> dict[Watch, set[Pair]]:
        if instance.pk is None or (instance._state.adding and _inserted(instance)):
            return {watch: set() for watch in _watches_of(sender)}
        # A row built with the key of one that exists is saved over it (Django tries an
        # UPDATE first): the pair it held is read too.
        stored = sender._base_manager.using(using).filter(pk=instance.pk)
        return {watch: _pairs_of(stored, watch) for watch in _watches_of(sender)}

    pending.put(instance, PENDING, failsafe(_label(sender), using, True, old))


def _inserted(instance: models.Model) -> bool:
    """Whether Django saves a new ``instance`` with a key by an ``INSERT`` alone: its key has
    a default (Django then skips the ``UPDATE`` it tries first for a key given by hand)."""
    key = instance._meta.pk
    return key is not None and (key.has_default() or key.has_db_default())


@never_raises
def _on_post_save(
    sender: type[models.Model], instance: models.Model, raw: bool, using: str, **kwargs: Any
) -> None:
    before = pending.take(instance, PENDING)
    if raw or before is None:
        return
    whole = failsafe(_label(sender), using, True, lambda: _with_keys(instance, using))
    if whole is None:
        return
    for watch in _watches_of(sender):
        new = _pair(whole, watch)
        now = {new} if None not in new else set()
        _changed(watch, using, before.get(watch, set()), now, [instance.pk])


@never_raises
def _on_pre_delete(
    sender: type[models.Model],
    instance: models.Model,
    using: str,
    origin: Any = None,
    **kwargs: Any,
) -> None:
    if silences(origin):
        return

    def pairs() -> dict[Watch, set[Pair]]:
        whole = _with_keys(instance, using)
        return {watch: {_pair(whole, watch)} for watch in _watches_of(sender)}

    pending.put(instance, PENDING, failsafe(_label(sender), using, True, pairs))


@never_raises
def _on_post_delete(
    sender: type[models.Model],
    instance: models.Model,
    using: str,
    origin: Any = None,
    **kwargs: Any,
) -> None:
    before = pending.take(instance, PENDING) or {}
    going = deletes.gone_with(origin)  # told by their own delete (see the module docstring)
    for watch, pairs in before.items():
        was = {p for p in pairs if None not in p}
        _changed(watch, using, was, set(), [instance.pk], going)


# Bulk writes -----------------------------------------------------------------------------------


def around_update(
    queryset: models.QuerySet[Any, Any], run: Callable[[], int], written: Iterable[str]
) -> int:
    """Run an ``update()`` (or ``bulk_update``) of membership rows, and tell the accounts whose
    rows it changed: the rows' pairs read before it, and again after it by primary key."""
    model, db = queryset.model, write_alias(queryset)  # never a replica
    watches = [w for w in _watches_of(model) if {w.owner, w.account} & set(written)]
    if not watches:
        return run()

    def before() -> tuple[list[Any], dict[Watch, set[Pair]]]:
        rows = list(matching(queryset, db).values_list("pk", flat=True))
        stored = model._base_manager.using(db)
        return rows, {w: _pairs_in(stored, rows, w) for w in watches}

    found = failsafe(_label(model), db, True, before)
    count = run()
    if found is not None:
        pks, pairs = found
        stored = model._base_manager.using(db)
        for watch in watches:

            def tell(watch: Watch = watch) -> None:
                _changed(watch, db, pairs[watch], _pairs_in(stored, pks, watch), pks)

            failsafe(_label(model), db, True, tell)
    return count


def around_delete(
    queryset: models.QuerySet[Any, Any], run: Callable[[], tuple[int, dict[str, int]]]
) -> tuple[int, dict[str, int]]:
    """Run a ``QuerySet.delete()`` of the rows of an auto-created through table (the
    many-to-many manager's ``remove()`` and ``clear()``, or the application's own), for which
    Django sends no delete signal, and tell the accounts whose links went."""
    model, db = queryset.model, write_alias(queryset)  # never a replica

    def doomed() -> dict[Watch, tuple[set[Pair], list[Any]]]:
        found = {}
        for watch in _watches_of(model):
            rows = matching(queryset, db).values_list("pk", watch.owner, watch.account)
            listed = list(rows)
            pairs = {(normal_id(o), normal_id(a)) for _, o, a in listed}
            found[watch] = (pairs, [pk for pk, _, _ in listed])
        return found

    before = failsafe(_label(model), db, True, doomed)
    result = run()
    for watch, (pairs, pks) in (before or {}).items():
        tell = functools.partial(_changed, watch, db, pairs, set(), pks)
        failsafe(_label(model), db, True, tell)
    return result


@dataclass(frozen=True)
class LinksBefore:
    """What a ``bulk_create``'s rows linked before it (``links_before_bulk``)."""

    #: Of the pairs its objects would link, those that existed already.
    existing: dict[Watch, set[Pair]]
    #: For an upsert whose ``update_fields`` write a watched key: the rows it may re-point
    #: (those its ``unique_fields`` match), and the pairs they held.
    upserted: Sequence[Any] = ()
    held: dict[Watch, set[Pair]] = field(default_factory=dict)


def links_before_bulk(
    model: type[models.Model], objs: Sequence[models.Model], db: str, kwargs: dict[str, Any]
) -> LinksBefore:
    """What the rows ``bulk_create(objs, **kwargs)`` may link or re-point were before it."""

    def read() -> LinksBefore:
        stored = model._base_manager.using(db)
        existing: dict[Watch, set[Pair]] = {}
        for watch in _watches_of(model):
            wanted = {_pair(obj, watch) for obj in objs}
            existing[watch] = _existing(stored, watch, wanted, ())
        repointing = _repointing(model, kwargs)
        unique = upsert_unique_fields(model, kwargs) if repointing else None
        if unique is None:
            return LinksBefore(existing)
        pks = upsert_matches(model, objs, unique, db)
        held = {watch: _pairs_in(stored, pks, watch) for watch in repointing}
        return LinksBefore(existing, pks, held)

    return failsafe(_label(model), db, True, read) or LinksBefore({})


def _repointing(model: type[models.Model], kwargs: dict[str, Any]) -> list[Watch]:
    """The watches whose keys an upsert's ``update_fields`` write."""
    if not kwargs.get("update_conflicts"):
        return []
    try:
        fields = [model._meta.get_field(name) for name in kwargs.get("update_fields") or ()]
    except Exception:
        return []  # bulk_create raises its own error
    written = {getattr(named, "attname", None) for named in fields}
    return [w for w in _watches_of(model) if written & {w.owner, w.account}]


def created_in_bulk(
    model: type[models.Model], objs: Sequence[models.Model], db: str, before: LinksBefore
) -> None:
    """Tell the accounts ``bulk_create`` linked, and those an upsert's re-pointed rows
    unlinked (``before``: ``links_before_bulk``)."""
    for watch in _watches_of(model):
        made = {_pair(obj, watch) for obj in objs}
        made = {pair for pair in made if None not in pair} - before.existing.get(watch, set())
        tell = functools.partial(_after_bulk, watch, db, made, before)
        failsafe(_label(model), db, True, tell)


def _after_bulk(watch: Watch, db: str, made: set[Pair], before: LinksBefore) -> None:
    lost: set[Pair] = set()
    if watch in before.held:
        stored = watch.membership._base_manager.using(db)
        gone = before.held[watch] - _pairs_in(stored, before.upserted, watch)
        lost = gone - _existing(stored, watch, gone, before.upserted)
    _announce(watch, db, made, lost)


# What changed, and who hears it -----------------------------------------------------------------


def _changed(
    watch: Watch,
    db: str,
    was: set[Pair],
    now: set[Pair],
    touched: Sequence[Any],
    going: Going | None = None,
) -> None:
    """Announce what a write that changed the rows ``touched`` did to the pairs it held:
    ``was`` before, ``now`` after; pairs other rows still hold (or held) change nothing.
    ``going``: records the deletion of ``touched`` removes too, which leave no one."""
    gained, lost = now - was, was - now
    if not (gained or lost):
        return
    stored = watch.membership._base_manager.using(db)
    others = _existing(stored, watch, gained | lost, touched)
    _announce(watch, db, gained - others, lost - others, going)


def _announce(
    watch: Watch, db: str, entered: set[Pair], left: set[Pair], going: Going | None = None
) -> None:
    events: list[Event] = []
    accounts = _account_ids(watch, db, {account for _, account in entered | left})
    for pairs, entering in ((left, False), (entered, True)):
        by_owner: dict[Any, set[Any]] = {}
        for owner, account in pairs:
            if account in accounts:
                by_owner.setdefault(owner, set()).add(accounts[account])
        for owner in sorted(by_owner, key=id_order):
            rows = _records_of(watch, owner, db)
            if not entering:
                rows = _staying(watch, rows, going)
            events += row_events(watch.options, rows, sorted_ids(by_owner[owner]), entering)
    on_commit.add_all(events, db)


def _staying(
    watch: Watch, rows: models.QuerySet[Any, Any], going: Going | None
) -> models.QuerySet[Any, Any]:
    """Of ``rows``, those ``going`` does not name (their ids read only when it names some of
    their model: a deletion in progress)."""
    gone = (going or {}).get(watch.options.model._meta.concrete_model)  # type: ignore[arg-type]
    if not gone:
        return rows
    staying = [pk for pk in rows.values_list("pk", flat=True) if row_key(pk) not in gone]
    return rows.filter(pk__in=staying[: conf.CASCADE_LIMIT + 1])


def _account_ids(watch: Watch, db: str, values: set[Any]) -> dict[Any, Any]:
    """The primary key of each account named by ``values`` (what the membership rows hold:
    the keys themselves, unless their foreign key names another field)."""
    if watch.account_target == "pk":
        return {value: value for value in values}
    found = pks_by_value(get_user_model(), watch.account_target, values, db)
    return {value: normal_id(pk) for value, pk in found.items()}


def _records_of(watch: Watch, owner: Any, db: str) -> models.QuerySet[Any, Any]:
    manager = watch.options.model._base_manager.using(db)
    if watch.lookup is None:
        return manager.filter(**{watch.owner_target: owner})
    return manager.filter(**{f"{watch.lookup}__{watch.owner_target}": owner})


def _with_keys(instance: models.Model, using: str) -> models.Model:
    """``instance``, holding the owner and account keys of every path through its model even
    where it was loaded without them (``only()``, ``defer()``): read by primary key."""
    keys = {key for watch in _watches_of(type(instance)) for key in (watch.owner, watch.account)}
    return with_attnames(instance, keys, using)


def _pair(obj: models.Model, watch: Watch) -> Pair:
    values = obj.__dict__
    return (normal_id(values.get(watch.owner)), normal_id(values.get(watch.account)))


def _pairs_of(rows: models.QuerySet[Any, Any], watch: Watch) -> set[Pair]:
    return {
        (normal_id(owner), normal_id(account))
        for owner, account in rows.values_list(watch.owner, watch.account)
        if owner is not None and account is not None
    }


def _pairs_in(stored: models.QuerySet[Any, Any], pks: Sequence[Any], watch: Watch) -> set[Pair]:
    found: set[Pair] = set()
    for chunk in chunked(pks, CHUNK):
        found |= _pairs_of(stored.filter(pk__in=chunk), watch)
    return found


def _existing(
    stored: models.QuerySet[Any, Any], watch: Watch, pairs: set[Pair], touched: Sequence[Any]
) -> set[Pair]:
    """Of ``pairs``, those a row other than ``touched`` holds (one statement per 500 owners)."""
    pairs = {pair for pair in pairs if None not in pair}
    if not pairs:
        return set()
    skip = {normal_id(pk) for pk in touched}
    owners = sorted({owner for owner, _ in pairs}, key=id_order)
    accounts = sorted({account for _, account in pairs}, key=id_order)
    found: set[Pair] = set()
    for chunk in chunked(owners, CHUNK):
        rows = stored.filter(**{f"{watch.owner}__in": chunk, f"{watch.account}__in": accounts})
        for pk, owner, account in rows.values_list("pk", watch.owner, watch.account):
            if normal_id(pk) not in skip:
                found.add((normal_id(owner), normal_id(account)))
    return found & pairs


def _label(model: type[models.Model]) -> str:
    return f"the readers {model._meta.label} links give"
