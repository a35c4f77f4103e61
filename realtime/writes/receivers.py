"""Where a model write enters realtime: the signal receivers of decorated models.

Each receiver reads as the path of one announcement inside the write's transaction: what
changed since the row was loaded (``snapshots``), the event read from the instance
(``preparing``), handed to the ``outbox``, which publishes it after the outermost commit
(``publish``). Every receiver is connected with ``sender=`` a decorated model (or its proxy or
multi-table child), never globally: a global receiver would turn off Django's fast delete for
every model.

Deletes are prepared in ``pre_delete``, while the row and its links exist (scope, accounts,
readers of a guarded row), and handed to the outbox from ``post_delete``, once the row is gone.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import models
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_delete, pre_save

from realtime.conf import conf
from realtime.paths import split_path
from realtime.registry import ModelOptions, options_for
from realtime.writes import cascades, outbox, snapshots
from realtime.writes.before import Past, Plan, plan_before, take_before
from realtime.writes.events import Before
from realtime.writes.failsafe import failsafe, never_raises
from realtime.writes.preparing import prepare_delete, prepare_write

PENDING_DELETE = "_realtime_pending_delete"
PENDING_BEFORE = "_realtime_audience_before"


def connect(model: type[models.Model]) -> None:
    """Connect the receivers of a decorated model (or of a subclass announcing like it)."""
    uid = f"realtime:{model._meta.label}"
    pre_save.connect(on_pre_save, sender=model, dispatch_uid=uid)
    post_save.connect(on_post_save, sender=model, dispatch_uid=uid)
    pre_delete.connect(on_pre_delete, sender=model, dispatch_uid=uid)
    post_delete.connect(on_post_delete, sender=model, dispatch_uid=uid)
    for field in model._meta.local_many_to_many:
        m2m_changed.connect(
            on_m2m_changed,
            sender=_through(model, field),
            dispatch_uid=f"{uid}:{field.name}",
            apps=model._meta.apps,
        )
    snapshots.track(model)


def disconnect(model: type[models.Model]) -> None:
    uid = f"realtime:{model._meta.label}"
    pre_save.disconnect(sender=model, dispatch_uid=uid)
    post_save.disconnect(sender=model, dispatch_uid=uid)
    pre_delete.disconnect(sender=model, dispatch_uid=uid)
    post_delete.disconnect(sender=model, dispatch_uid=uid)
    for field in model._meta.local_many_to_many:
        m2m_changed.disconnect(
            sender=_through(model, field),
            dispatch_uid=f"{uid}:{field.name}",
            apps=model._meta.apps,
        )
    snapshots.untrack(model)


def _through(model: type[models.Model], field: Any) -> type[models.Model] | str:
    """The through model of a many-to-many, or, while its class statement is still to come
    (``through="Seat"``), its ``"app_label.Model"`` name: Django's model signals connect to
    a model named so once it is registered."""
    through = field.remote_field.through
    if isinstance(through, str) and "." not in through:
        return f"{model._meta.app_label}.{through}"
    return through  # type: ignore[no-any-return]


@never_raises
def on_pre_save(
    sender: type[models.Model],
    instance: models.Model,
    raw: bool,
    using: str,
    update_fields: Iterable[str] | None,
    **kwargs: Any,
) -> None:
    # Who could read the row before this save: read now, while the database still holds it.
    options = options_for(sender)
    if raw or options is None:
        return
    snapshots.saving(instance)
    plan = plan_before(options, instance, update_fields)
    if plan is not None:
        label = f"the readers of {options.name}:{instance.pk}"
        before = failsafe(label, using, plan.queries, lambda: take_before(options, plan))
        if before is not None:
            instance.__dict__[PENDING_BEFORE] = before


@never_raises
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
    before = instance.__dict__.pop(PENDING_BEFORE, None)
    if raw or options is None:
        return
    changed = None if created else snapshots.changed_fields(instance, update_fields)
    snapshots.saved(instance, snapshots.written_attnames(instance, update_fields), using)
    action = "created" if created else "updated"
    if action not in options.actions or changed == []:
        return
    moving = before is not None and not created
    event = prepare_write(options, instance, action, changed, using, scopeless=moving)
    if event is not None:
        event.before = before if moving else None
        outbox.add(event, using)


@never_raises
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
        event = prepare_delete(options, instance, using)
    if event is not None:
        instance.__dict__[PENDING_DELETE] = event


@never_raises
def on_post_delete(
    sender: type[models.Model], instance: models.Model, using: str, **kwargs: Any
) -> None:
    event = instance.__dict__.pop(PENDING_DELETE, None)
    if event is not None:
        outbox.add(event, using)


@never_raises
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
    if action not in ("pre_add", "pre_remove", "pre_clear", *AFTER):
        return
    field = _m2m_field(sender, instance, model, reverse)
    if field is None:
        return
    owner_model: type[models.Model] = model if reverse else type(instance)
    options = options_for(owner_model)
    if options is None or "updated" not in options.actions:
        return
    if options.user_field is not None and split_path(options.user_field)[0] == field.name:
        return  # the accounts it adds or removes are told by realtime.writes.memberships
    pending = f"_realtime_m2m_{field.name}"
    links = f"{options.name} {field.name} links"
    if not action.startswith("post_"):
        # clear() sends no ids: read the links it is about to remove; a guard that may read
        # the links has its readers taken now, before they change.
        clearing, guarded = action == "pre_clear", _guard_reads(options, field)
        if not (clearing or guarded):
            return

        def read() -> tuple[list[models.Model], dict[Any, Before]]:
            owners = _owners(field, instance, reverse, pk_set, clearing)
            return owners, _readers_before(options, owners) if guarded else {}

        instance.__dict__[pending] = failsafe(links, using, True, read)
        return
    owners, befores = instance.__dict__.pop(pending, None) or ([], {})
    if action != "post_clear":
        owners = failsafe(links, using, True, lambda: _owners(field, instance, reverse, pk_set))
    for owner in owners or []:
        before = befores.get(owner.pk)
        event = prepare_write(
            options, owner, "updated", [field.name], using, scopeless=before is not None
        )
        if event is not None:
            event.before = before
            outbox.add(event, using)


AFTER = ("post_add", "post_remove", "post_clear")


def _owners(
    field: models.ManyToManyField[Any, Any],
    instance: models.Model,
    reverse: bool,
    pk_set: set[Any] | None,
    clearing: bool = False,
) -> list[models.Model]:
    """The rows of the decorated model whose links change: the instance itself, or (from the
    other side) the rows named by ``pk_set``; for ``clear()``, those linked now."""
    if clearing:
        return _linked_owners(field, instance, reverse)
    if not reverse:
        return [instance] if pk_set else []
    owner_model = field.model
    return list(owner_model._base_manager.filter(pk__in=pk_set or ()).order_by("pk"))


def _guard_reads(options: ModelOptions, field: models.ManyToManyField[Any, Any]) -> bool:
    """Whether the model's guard may read the links of ``field`` (``guard_fields`` names it,
    or names nothing)."""
    guarded = options.guard_attnames
    return options.guard is not None and (guarded is None or field.name in guarded)


def _readers_before(options: ModelOptions, owners: list[models.Model]) -> dict[Any, Before]:
    """Who could read each owner before its links change."""
    befores = {}
    for owner in owners[: conf.CASCADE_LIMIT]:
        plan = Plan(Past(owner, None), queries=True, readers=True)
        before = take_before(options, plan, always=True)
        if before is not None:
            befores[owner.pk] = before
    return befores


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
