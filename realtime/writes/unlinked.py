"""Rows a delete changes without their signals: ``on_delete=SET_NULL``, ``SET_DEFAULT``,
``SET(...)``, and the database-side ``DB_SET_NULL``/``DB_SET_DEFAULT`` of Django 6.1.

Django updates such children with one ``UPDATE`` (or the database does), sending no signal,
so a client would keep showing a link to a row that is gone. For every decorated model with
such a foreign key, the target's ``pre_delete`` reads the ids of the children it links (at
most ``REALTIME_CASCADE_LIMIT`` + 1 per foreign key, one query), and its ``post_delete`` reads
those children again, as the delete left them, and announces each as ``<name>.updated`` with
``changed`` = that foreign key. The event still reaches the channel of the deleted target, so
a client showing that target's list hears it. Past the limit, the surplus folds into one
truncated ``<name>.updated`` per scope. Reads run in savepoints; nothing here fails the delete.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models.signals import post_delete, pre_delete

from realtime.conf import conf
from realtime.encoding import id_order, record_channel
from realtime.registry import ModelOptions, all_options, wire_name
from realtime.writes import outbox, querysets
from realtime.writes.cascades import folded_event
from realtime.writes.events import Event, read_event
from realtime.writes.failsafe import failsafe, never_raises

PENDING = "_realtime_pending_unlinked"
UID = "realtime:unlinked"


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


def connect() -> None:
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
    sender: type[models.Model], instance: models.Model, using: str, **kwargs: Any
) -> None:
    def read() -> list[tuple[ModelOptions, models.ForeignKey[Any, Any], list[Any], list[Any]]]:
        found = []
        limit = conf.CASCADE_LIMIT
        for options, field in _links.get(sender, ()):
            children = options.model._base_manager.using(using).filter(**{field.name: instance})
            ids = list(children.order_by("pk").values_list("pk", flat=True)[: limit + 1])
            surplus: list[Any] = []
            if len(ids) > limit and options.is_global:
                surplus = [None]
            elif len(ids) > limit and options.scope_attname is not None:
                scopes = children.order_by("pk").values_list(options.scope_attname, flat=True)
                surplus = sorted({s for s in scopes[limit:] if s is not None}, key=id_order)
            found.append((options, field, ids[:limit], surplus))
        return found

    label = f"the rows {sender._meta.label}:{instance.pk} unlinks"
    pending = instance.__dict__[PENDING] = failsafe(label, using, True, read) or []
    querysets.unlinking(_pairs(pending), True)


def _pairs(pending: list[Any]) -> list[tuple[Any, str]]:
    return [(options.model._meta.concrete_model, field.name) for options, field, *_ in pending]


@never_raises
def _on_target_deleted(
    sender: type[models.Model], instance: models.Model, using: str, **kwargs: Any
) -> None:
    pending = instance.__dict__.pop(PENDING, [])
    if not pending:
        return
    querysets.unlinking(_pairs(pending), False)
    target_channel = record_channel(wire_name(sender), instance.pk)

    def read() -> list[Event]:
        events: list[Event] = []
        for options, field, ids, surplus in pending:
            # Read as the delete left them: the new value of the key, whatever set it.
            stored = options.model._base_manager.using(using)
            for child in stored.filter(pk__in=ids).order_by("pk"):
                event = read_event(options, child, "updated", [field.name], using=using)
                if event is None:
                    continue
                if field.name in options.relations and target_channel not in event.channels:
                    event.channels.append(target_channel)
                events.append(event)
            events += [folded_event(options, scope, "updated") for scope in surplus]
        return events

    label = f"the rows {sender._meta.label}:{instance.pk} unlinked"
    outbox.add_all(failsafe(label, using, True, read) or [], using)
