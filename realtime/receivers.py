"""Model signal receivers: prepare each announcement in the transaction, publish on commit.

Every receiver is connected with ``sender=`` a decorated model (or its proxy or multi-table
child), never globally: a global receiver would turn off Django's fast delete for every model.
Preparation reads only what the write left on the instance, plus at most one bounded query
per to-many relation or multi-hop account path; inside a transaction such queries run in a
savepoint so that a failure cannot poison the write's transaction. Nothing raised while
preparing reaches the write: it is logged and the announcement is dropped.

Deletes are prepared in ``pre_delete``, while the row and its links exist (scope, accounts,
readers of a guarded row), and handed to the outbox from ``post_delete``, so they are
published after commit, once the row is gone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, TypeVar

from django.db import connections, models, transaction
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_delete

from realtime import cascades, outbox, snapshots
from realtime.auth import RealtimeAuth, get_auth, member_ids
from realtime.events import Event, read_event
from realtime.publishing import outside_recipients, recipients
from realtime.registry import ACTIONS, ModelOptions, options_for

logger = logging.getLogger(__name__)

PENDING_DELETE = "_realtime_pending_delete"

T = TypeVar("T")


def connect(model: type[models.Model]) -> None:
    """Connect the receivers of a decorated model (or of a subclass announcing like it)."""
    uid = f"realtime:{model._meta.label}"
    post_save.connect(on_post_save, sender=model, dispatch_uid=uid)
    pre_delete.connect(on_pre_delete, sender=model, dispatch_uid=uid)
    post_delete.connect(on_post_delete, sender=model, dispatch_uid=uid)
    for field in model._meta.local_many_to_many:
        through = field.remote_field.through
        m2m_changed.connect(on_m2m_changed, sender=through, dispatch_uid=f"{uid}:{field.name}")
    snapshots.track(model)


def disconnect(model: type[models.Model]) -> None:
    uid = f"realtime:{model._meta.label}"
    post_save.disconnect(sender=model, dispatch_uid=uid)
    pre_delete.disconnect(sender=model, dispatch_uid=uid)
    post_delete.disconnect(sender=model, dispatch_uid=uid)
    for field in model._meta.local_many_to_many:
        through = field.remote_field.through
        m2m_changed.disconnect(sender=through, dispatch_uid=f"{uid}:{field.name}")


def prepare(what: str, using: str, queries: bool, build: Callable[[], T]) -> T | None:
    """Run ``build``, logging and swallowing any failure; in a savepoint when it may query
    inside a transaction, so that a failed query cannot poison the write's transaction."""
    try:
        if queries and connections[using].in_atomic_block:
            with transaction.atomic(using=using):
                return build()
        return build()
    except Exception:
        logger.exception("realtime: preparing the announcement of %s failed; not announced", what)
        return None


def _delete_queries(options: ModelOptions) -> bool:
    """Whether preparing a delete may query: the model's own reads, or an auth hook the
    application overrode (the defaults of ``recipients``/``outside_recipients`` do not)."""
    auth = type(get_auth())
    overridden = any(
        getattr(auth, hook) is not getattr(RealtimeAuth, hook)
        for hook in ("recipients", "outside_recipients", "audience", "shared_readers")
    )
    return options.delete_queries or overridden


def on_post_save(
    sender: type[models.Model],
    instance: models.Model,
    created: bool,
    raw: bool,
    using: str,
    update_fields: Iterable[str] | None,
    **kwargs: Any,
) -> None:
    options = options_for(sender)
    if raw or options is None:
        return
    changed = None if created else snapshots.changed_fields(instance, update_fields)
    snapshots.take(instance, snapshots.written_attnames(instance, update_fields))
    action = "created" if created else "updated"
    if action not in options.actions or changed == []:
        return
    event = prepare(
        f"{options.name}:{instance.pk}",
        using,
        options.create_queries if created else options.write_queries,
        lambda: read_event(options, instance, action, changed),
    )
    if event is not None:
        outbox.add(event, using)


def on_pre_delete(
    sender: type[models.Model],
    instance: models.Model,
    using: str,
    origin: Any = None,
    **kwargs: Any,
) -> None:
    options = options_for(sender)
    if options is None or "deleted" not in options.actions:
        return
    if cascades.past_limit(sender, instance, origin):
        event = cascades.fold(options, instance, origin)
    else:
        event = prepare(
            f"{options.name}:{instance.pk}",
            using,
            _delete_queries(options),
            lambda: prepare_delete(options, instance),
        )
    if event is not None:
        instance.__dict__[PENDING_DELETE] = event


def on_post_delete(
    sender: type[models.Model], instance: models.Model, using: str, **kwargs: Any
) -> None:
    event = instance.__dict__.pop(PENDING_DELETE, None)
    if event is not None:
        outbox.add(event, using)


def prepare_delete(options: ModelOptions, instance: models.Model) -> Event | None:
    """Read a deletion's event and decide its audiences while the row still exists."""
    event = read_event(options, instance, "deleted")
    if event is None:
        return None
    if options.user_field is not None:
        event.readers = recipients(event)
        return event
    auth = get_auth()
    if options.guard is not None:
        about = {"model": options.name, "id": event.data["id"]}
        event.readers = list(
            auth.audience(
                event.scope_id, event.event_type, event.data, member_ids(event.scope_id), about
            )
        )
    if options.shared_via is not None:
        from realtime.publishing import shared_readers

        event.shared = shared_readers(event)
    event.outside = outside_recipients(event)
    return event


def on_m2m_changed(
    sender: type[models.Model],
    instance: models.Model,
    action: str,
    reverse: bool,
    model: type[models.Model],
    pk_set: set[Any] | None,
    using: str,
    **kwargs: Any,
) -> None:
    if action not in ("pre_clear", "post_add", "post_remove", "post_clear"):
        return
    field = _m2m_field(sender, instance, model, reverse)
    if field is None:
        return
    owner_model: type[models.Model] = model if reverse else type(instance)
    options = options_for(owner_model)
    if options is None or "updated" not in options.actions:
        return
    clearing = f"_realtime_clearing_{field.name}"
    if action == "pre_clear":
        # clear() sends no ids: read the links it is about to remove.
        instance.__dict__[clearing] = prepare(
            f"{options.name} {field.name} links",
            using,
            True,
            lambda: _linked_owners(field, instance, reverse),
        )
        return
    if action == "post_clear":
        owners = instance.__dict__.pop(clearing, None) or []
    elif reverse:
        owners = (
            prepare(
                f"{options.name} {field.name} links",
                using,
                True,
                lambda: list(owner_model._base_manager.filter(pk__in=pk_set or ()).order_by("pk")),
            )
            or []
        )
    else:
        owners = [instance] if pk_set else []
    for owner in owners:
        event = prepare(
            f"{options.name}:{owner.pk}",
            using,
            options.write_queries,
            partial(read_event, options, owner, "updated", [field.name]),
        )
        if event is not None:
            outbox.add(event, using)


def _m2m_field(
    through: type[models.Model], instance: models.Model, model: type[models.Model], reverse: bool
) -> models.ManyToManyField[Any, Any] | None:
    owner = model if reverse else type(instance)
    for klass in owner.__mro__:
        meta = getattr(klass, "_meta", None)
        for field in getattr(meta, "local_many_to_many", ()):
            if field.remote_field.through is through:
                return field  # type: ignore[no-any-return]
    return None


def _linked_owners(
    field: models.ManyToManyField[Any, Any], instance: models.Model, reverse: bool
) -> list[models.Model]:
    if not reverse:
        has_links = getattr(instance, field.name).exists()
        return [instance] if has_links else []
    owner_model = field.model
    return list(owner_model._base_manager.filter(**{field.name: instance.pk}).order_by("pk"))


def announce(
    instances: models.Model | Iterable[models.Model],
    action: str,
    *,
    changed: Iterable[str] | None = None,
) -> None:
    """Announce writes no signal saw (``update()``, ``bulk_create``, raw SQL) as signals would.

    Published after the current transaction commits (at once outside one). ``changed`` names
    the fields an ``"updated"`` wrote (default: every concrete field).
    """
    if action not in ACTIONS:
        raise ValueError(f"action must be one of {', '.join(ACTIONS)}, not {action!r}")
    if isinstance(instances, models.Model):
        instances = [instances]
    for instance in instances:
        options = options_for(type(instance))
        if options is None:
            raise TypeError(f"{type(instance).__name__} is not a @realtime_model")
        if action not in options.actions:
            continue
        using = instance._state.db or "default"
        fields = None
        if action == "updated":
            names = changed if changed is not None else snapshots.all_fields(instance)
            fields = snapshots.changed_fields(instance, names)
        if action == "deleted":
            event = prepare(
                f"{options.name}:{instance.pk}",
                using,
                _delete_queries(options),
                partial(prepare_delete, options, instance),
            )
        else:
            event = prepare(
                f"{options.name}:{instance.pk}",
                using,
                options.write_queries,
                partial(read_event, options, instance, action, fields),
            )
        if event is not None:
            outbox.add(event, using)
