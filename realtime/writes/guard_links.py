"""Links a guard reads: a row's readers gained or lost when its many-to-many links change.

A guard may read a many-to-many of the row (``guard=lambda user: Q(members=user)``, with
``guard_fields=["members"]``, or no ``guard_fields``): changing its links changes who reads
the row, and is told as an update of the row whose readers were taken before the change —
those gained hear it enter, those lost hear it leave, those kept hear its identity alone
(``links_only``: the links changed, not the row).

The links of an auto-created through table are watched by its querysets, as an account
path's membership rows are (``realtime.writes.link_tables``): ``add``, ``remove``,
``clear``, ``set`` of the many-to-many manager from either side, and ``bulk_create``,
``update()``, ``bulk_update`` and ``delete()`` of the table, each told once; so are those
Django deletes with a row at their other end (``link_tables.watch_deletes``). Those of a
``through`` model of the application's own, and the links of a decorated model no guard
reads, are told by ``m2m_changed`` (``realtime.writes.receivers``): rows of such a model
written directly are not seen (``realtime.W033``).
"""

from __future__ import annotations

import functools
from typing import Any

from django.db import models

from realtime.chunks import chunked
from realtime.conf import conf
from realtime.encoding import id_order, normal_id
from realtime.paths import source_key, split_path, target_key
from realtime.registry import ModelOptions, all_options
from realtime.writes import link_tables
from realtime.writes.audiences import Past, Plan, take_before
from realtime.writes.events import Before, Event, read_event

UID = "realtime:guard-links"
#: Rows read in one statement by the values of their key.
CHUNK = 500

#: through model (auto-created) -> (options, the many-to-many of its model those are links of)
_links: dict[type[models.Model], list[tuple[ModelOptions, Any]]] = {}

#: What is asked before links change: for each model they link, its rows and their readers.
Asked = list[tuple[ModelOptions, Any, list[models.Model], dict[Any, Before]]]


def connect() -> None:
    """Watch the auto-created tables of the links guards read. Called once models are ready
    (their managers are then extended: ``link_models()``)."""
    _links.clear()
    for options in all_options():
        if "updated" not in options.actions:
            continue
        for field in options.model._meta.local_many_to_many:
            through = field.remote_field.through
            if not (isinstance(through, type) and through._meta.auto_created):
                continue
            if guard_reads(options, field) and not _account_links(options, field):
                _links.setdefault(through, []).append((options, field))
    link_tables.watch_deletes(UID, [(through, side(through)) for through in _links])


def link_models() -> list[type[models.Model]]:
    """The auto-created tables of links guards read: watched by their querysets."""
    return list(_links)


def watched(model: type[models.Model]) -> bool:
    """Whether ``model`` is the auto-created table of links a guard reads."""
    return bool(_links) and model in _links


def handles(through: Any, options: ModelOptions) -> bool:
    """Whether the links of ``through`` are told here for the rows of ``options``' model
    (``m2m_changed`` then leaves them alone)."""
    return any(found is options for found, _ in _links.get(through, ()))


def side(through: type[models.Model]) -> link_tables.Side:
    """What a write of ``through`` changes: the readers of the rows its links name."""
    field = _links[through][0][1]
    return link_tables.Side(
        key=source_key(field),
        other=target_key(field),
        before=functools.partial(_before_write, through),
        after=functools.partial(_after_write, through),
        label=f"the readers {through._meta.label} links give",
    )


def guard_reads(options: ModelOptions, field: models.ManyToManyField[Any, Any]) -> bool:
    """Whether the model's guard may read the links of ``field`` (``guard_fields`` names it,
    or names nothing)."""
    guarded = options.guard_attnames
    return options.guard is not None and (guarded is None or field.name in guarded)


def readers_before(
    options: ModelOptions, owners: list[models.Model], using: str
) -> dict[Any, Before]:
    """Who could read each of ``owners`` before its links change (the first
    ``REALTIME_CASCADE_LIMIT``; the others are told as plain updates)."""
    befores = {}
    for owner in owners[: conf.CASCADE_LIMIT]:
        plan = Plan(Past(owner, None, using=using), queries=True, readers=True)
        before = take_before(options, plan, always=True)
        if before is not None:
            befores[owner.pk] = before
    return befores


def link_events(
    options: ModelOptions,
    field: models.ManyToManyField[Any, Any],
    owners: list[models.Model],
    befores: dict[Any, Before],
    using: str,
) -> list[Event]:
    """The update events of ``owners`` whose links of ``field`` changed: each carries who
    could read it before (``befores``), and its identity alone."""
    events = []
    for owner in owners:
        before = befores.get(owner.pk)
        event = read_event(
            options, owner, "updated", [field.name], scopeless=before is not None, using=using
        )
        if event is not None:
            event.before = before
            event.links_only, event.values = True, None  # see realtime.writes.order
            events.append(event)
    return events


def _account_links(options: ModelOptions, field: Any) -> bool:
    """Whether ``field`` is the first hop of the model's account path: its links are told
    by ``realtime.writes.memberships``."""
    return options.user_field is not None and split_path(options.user_field)[0] == field.name


def _before_write(through: type[models.Model], keys: set[Any], using: str) -> Asked:
    asked: Asked = []
    for options, field in _links.get(through, ()):
        owners = _owners_named(field, keys, using)
        asked.append((options, field, owners, readers_before(options, owners, using)))
    return asked


def _after_write(
    through: type[models.Model], asked: Asked, later: set[Any], using: str
) -> list[Event]:
    """The events of the rows asked before a write, and of those its links name only after
    it (their readers before it unknown: told as plain updates)."""
    events = []
    for options, field, owners, befores in asked:
        known = {normal_id(owner.pk) for owner in owners}
        found = owners + [
            owner
            for owner in _owners_named(field, later, using)
            if normal_id(owner.pk) not in known
        ]
        events += link_events(options, field, found, befores, using)
    return events


def _owners_named(field: Any, keys: set[Any], using: str) -> list[models.Model]:
    """The rows of ``field``'s model whose key values (those the links hold: the primary key,
    unless the links' foreign key names another field) are ``keys``."""
    target = source_key(field).target_field.name
    rows = field.model._base_manager.using(using)
    found: list[models.Model] = []
    for chunk in chunked(sorted(keys, key=id_order), CHUNK):
        found += rows.filter(**{f"{target}__in": chunk}).order_by("pk")
    return found
