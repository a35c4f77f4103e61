"""Cascaded deletes: the limit on announcing them one by one, and deletes the database does.

Django's own ``on_delete=CASCADE`` sends each child's delete signals, so each child announces
like any delete, but only ``REALTIME_CASCADE_LIMIT`` of them per (child model, deletion): past
it, the surplus folds into one ``<name>.deleted`` with no data, marked truncated, per scope, on
the model's channel, so clients reload the list instead of drowning in events.

Rows the *database* removes (``on_delete=DO_NOTHING`` plus an ``ON DELETE CASCADE`` constraint)
send no signal at all. A child model declares ``cascade=["parent"]``; the parent's
``pre_delete`` then reads at most the limit of such children per parent (one query) and the
parent's ``post_delete`` hands their announcements to the outbox. Children a delete sets to
NULL or to their default are announced by ``realtime.writes.unlinked``.
"""

from __future__ import annotations

import weakref
from collections import Counter
from typing import Any

from django.db import models
from django.db.models.signals import post_delete, pre_delete

from realtime.conf import conf
from realtime.encoding import id_order
from realtime.registry import ModelOptions, all_options, options_for
from realtime.writes import outbox
from realtime.writes.events import Event
from realtime.writes.failsafe import failsafe
from realtime.writes.preparing import delete_event

PENDING_CASCADE = "_realtime_pending_cascade"

# Children announced so far per deletion (keyed by the deletion's origin) and child model.
_counts: weakref.WeakKeyDictionary[Any, Counter[type[models.Model]]] = weakref.WeakKeyDictionary()
# Scopes that already received their folded event, per deletion and child model.
_folded: weakref.WeakKeyDictionary[Any, set[tuple[type[models.Model], Any]]] = (
    weakref.WeakKeyDictionary()
)


def _origin_model(origin: Any) -> type[models.Model] | None:
    if isinstance(origin, models.Model):
        return type(origin)
    model = getattr(origin, "model", None)
    return model if isinstance(model, type) else None


def past_limit(sender: type[models.Model], instance: models.Model, origin: Any) -> bool:
    """Count a cascaded child of this deletion; whether it is past the cascade limit."""
    if origin is None or _origin_model(origin) is sender:
        return False
    try:
        counts = _counts.setdefault(origin, Counter())
    except TypeError:  # an origin that cannot be weakly referenced or hashed: no limit
        return False
    counts[sender] += 1
    return counts[sender] > conf.CASCADE_LIMIT


def fold(options: ModelOptions, instance: models.Model, origin: Any) -> Event | None:
    """The one truncated event standing for the surplus children of a scope, once per scope."""
    if options.user_field is not None:
        return None
    scope_id = instance.__dict__.get(options.scope_attname or "")
    if scope_id is None and not options.is_global:
        return None
    seen = _folded.setdefault(origin, set())
    if (options.model, scope_id) in seen:
        return None
    seen.add((options.model, scope_id))
    return folded_event(options, scope_id)


def folded_event(options: ModelOptions, scope_id: Any, action: str = "deleted") -> Event:
    """One truncated event with no data on the model's channel: the clients of ``scope_id``
    reload the list."""
    return Event(
        options=options,
        action=action,
        pk=None,
        data={},
        channels=[options.name],
        scope_id=scope_id,
        folded=True,
    )


def connect_database_cascades() -> None:
    """Connect the parents of every ``cascade=[...]`` child. Called once models are ready."""
    for options in all_options():
        for fk_name in options.cascade:
            parent = options.model._meta.get_field(fk_name).related_model
            if isinstance(parent, type):
                uid = f"realtime:cascade:{parent._meta.label}"
                pre_delete.connect(_on_parent_pre_delete, sender=parent, dispatch_uid=uid)
                post_delete.connect(_on_parent_post_delete, sender=parent, dispatch_uid=uid)


def _on_parent_pre_delete(
    sender: type[models.Model], instance: models.Model, using: str, **kwargs: Any
) -> None:
    events = failsafe(
        f"the database cascade of {sender._meta.label}:{instance.pk}",
        using,
        True,
        lambda: _children_events(sender, instance, using),
    )
    if events:
        instance.__dict__[PENDING_CASCADE] = events


def _on_parent_post_delete(
    sender: type[models.Model], instance: models.Model, using: str, **kwargs: Any
) -> None:
    outbox.add_all(instance.__dict__.pop(PENDING_CASCADE, []), using)


def _children_events(parent: type[models.Model], instance: models.Model, using: str) -> list[Event]:
    limit = conf.CASCADE_LIMIT
    events: list[Event] = []
    for options in all_options():
        if "deleted" not in options.actions:
            continue
        for fk_name in options.cascade:
            field = options.model._meta.get_field(fk_name)
            if field.related_model is not parent:
                continue
            stored = options.model._base_manager.using(using)
            children = stored.filter(**{fk_name: instance.pk}).order_by("pk")
            rows = list(children[: limit + 1])
            for child in rows[:limit]:
                event = delete_event(options_for(type(child)) or options, child, using)
                if event is not None:
                    events.append(event)
            if len(rows) > limit and options.is_global:
                events.append(folded_event(options, None))
            elif len(rows) > limit and options.scope_attname is not None:
                surplus = children.values_list(options.scope_attname, flat=True)[limit:]
                for scope_id in sorted({s for s in surplus if s is not None}, key=id_order):
                    events.append(folded_event(options, scope_id))
    return events
