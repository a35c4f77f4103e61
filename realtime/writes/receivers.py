"""Where a model write enters realtime: the signal receivers of decorated models.

Each receiver reads as the path of one announcement inside the write's transaction, run once
through ``failsafe``: who could read the row before, when the save may change it
(``audiences``), what changed since the row was loaded (``tracking``), the event read from the
instance (``events``), handed to ``on_commit``, which publishes it after the outermost commit
(``publish``). Every receiver is connected with ``sender=`` a decorated model (or its proxy or
multi-table child), never globally: a global receiver would turn off Django's fast delete for
every model.

Deletes are prepared in ``pre_delete``, while the row and its links exist (scope, accounts,
readers of a guarded row), and handed to ``on_commit`` from ``post_delete``, once the row is
gone.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import models
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_delete, pre_save

from realtime.paths import source_key
from realtime.registry import ModelOptions, all_options, options_for
from realtime.writes import deletes, guard_links, on_commit, pending, tracking
from realtime.writes.audiences import (
    audience_inputs,
    delete_event,
    plan_before,
    take_before,
    unsure_attnames,
    with_stored_audience,
)
from realtime.writes.events import Before, as_stored, lacks_columns, read_event
from realtime.writes.failsafe import failsafe
from realtime.writes.silence import fixture_links, managing, silences

PENDING_DELETE = "_realtime_pending_delete"
#: Per save: who could read the row before it, what the thread knew the row held and what
#: decided its readers, asked once before the save for both receivers.
PENDING_SAVE = "_realtime_save"
#: A row saved raw (by a fixture): the links its many-to-many managers set next are the
#: fixture's too, and announce nothing.
SAVED_RAW = "_realtime_saved_raw"


#: One key for every sender (a model, a many-to-many's through model): Django keys a
#: connection by it and the sender's ``id()``, so a connection left for a class that is gone
#: (Django 5.2 keeps it) is taken over, not doubled, by a class later made at its address.
#: The receivers tell what they are about from what Django sends them.
UID = "realtime:announce"


def connect(model: type[models.Model]) -> None:
    """Connect the receivers of a decorated model (or of a subclass announcing like it)."""
    pre_save.connect(on_pre_save, sender=model, dispatch_uid=UID)
    post_save.connect(on_post_save, sender=model, dispatch_uid=UID)
    pre_delete.connect(on_pre_delete, sender=model, dispatch_uid=UID)
    post_delete.connect(on_post_delete, sender=model, dispatch_uid=UID)
    for field in model._meta.local_many_to_many:
        m2m_changed.connect(
            on_m2m_changed,
            sender=_through(model, field),
            dispatch_uid=UID,
            apps=model._meta.apps,
        )


def disconnect(model: type[models.Model]) -> None:
    pre_save.disconnect(sender=model, dispatch_uid=UID)
    post_save.disconnect(sender=model, dispatch_uid=UID)
    pre_delete.disconnect(sender=model, dispatch_uid=UID)
    post_delete.disconnect(sender=model, dispatch_uid=UID)
    for field in model._meta.local_many_to_many:
        through = _through(model, field)
        if not _through_watched_elsewhere(model, through):
            m2m_changed.disconnect(sender=through, dispatch_uid=UID, apps=model._meta.apps)


def _through_watched_elsewhere(model: type[models.Model], through: Any) -> bool:
    """Whether another decorated model has a many-to-many through ``through`` (one
    connection serves them all)."""
    return any(
        _through(options.model, field) == through
        for options in all_options()
        if options.model is not model
        for field in options.model._meta.local_many_to_many
    )


def _through(model: type[models.Model], field: Any) -> type[models.Model] | str:
    """The through model of a many-to-many, or, while its class statement is still to come
    (``through="Seat"``), its ``"app_label.Model"`` name: Django's model signals connect to
    a model named so once it is registered."""
    through = field.remote_field.through
    if isinstance(through, str) and "." not in through:
        return f"{model._meta.app_label}.{through}"
    return through  # type: ignore[no-any-return]


def on_pre_save(
    sender: type[models.Model],
    instance: models.Model,
    raw: bool,
    using: str,
    update_fields: Iterable[str] | None,
    **kwargs: Any,
) -> None:
    """Who could read the row before this save, when the save may change it: read now,
    while the database still holds the row. Kept for this save alone (``pending.push``): a
    save of the same instance nested in this one (an application's ``post_save`` receiver run
    before realtime's) keeps its own, and one that failed after this leaves one no later
    save takes."""
    options = options_for(sender)
    if not raw:
        pending.drop(instance, SAVED_RAW)
    if raw or options is None:
        pending.push(instance, PENDING_SAVE, None)
        return
    label = _label(options, instance)
    known = failsafe(label, using, False, lambda: tracking.known(instance, using))
    inputs = failsafe(label, using, False, lambda: audience_inputs(options, instance))
    plan = failsafe(
        label, using, False, lambda: plan_before(options, instance, update_fields, using, known)
    )
    before = None
    if plan is not None:
        before = failsafe(label, using, plan.queries, lambda: take_before(options, plan))
    pending.push(instance, PENDING_SAVE, (before, known, inputs))


def on_post_save(
    sender: type[models.Model],
    instance: models.Model,
    created: bool,
    raw: bool,
    using: str,
    update_fields: Iterable[str] | None,
    **kwargs: Any,
) -> None:
    """What the save changed, read into an event in its transaction, for the outbox."""
    options = options_for(sender)
    before, known, inputs = pending.pop(instance, PENDING_SAVE) or (None, None, None)
    if raw:
        pending.put(instance, SAVED_RAW, True)
    if raw or options is None:
        return
    label = _label(options, instance)
    queries = failsafe(label, using, False, lambda: _queries(options, instance, created))
    queries = queries is not False or update_fields is not None  # (columns it did not write)
    written = tracking.written_attnames(instance, update_fields)
    # Read back: what the write computed, and an expression an earlier save left on the
    # instance (Django 5.2 leaves ``F("n") + 1`` there) in a column its event carries.
    computed = tracking.computed_attnames(instance, {*written, *_carried(options)})
    if not created:  # and the columns the database computes, the instance's stale
        computed |= options.stale_after_update
    failsafe(
        label,
        using,
        queries or bool(computed),
        lambda: _saved(
            options,
            instance,
            created,
            using,
            update_fields,
            before,
            known,
            inputs,
            written=written,
            computed=computed,
        ),
    )


def _carried(options: ModelOptions) -> frozenset[str]:
    """The columns the model's events carry; none where the declaration names what the model
    lacks (asked outside realtime's guard of the write: the event reports it, where it is
    read)."""
    try:
        return options.event_attnames
    except Exception:
        return frozenset()


def _queries(options: ModelOptions, instance: models.Model, created: bool) -> bool:
    """Whether preparing the event of a save may query: the model's own reads, or columns
    the instance was loaded without, read before its event. (A declaration naming what the
    model lacks raises here, as it would in the preparation: it is logged, and the
    preparation, taken as querying, fails again and costs its announcement alone.)"""
    queries = options.create_queries if created else options.write_queries
    return queries or bool(lacks_columns(options, instance))


def _saved(
    options: ModelOptions,
    instance: models.Model,
    created: bool,
    using: str,
    update_fields: Iterable[str] | None,
    before: Before | None,
    known: dict[str, Any] | None,
    inputs: tuple[Any, ...] | None,
    *,
    written: list[str],
    computed: set[str],
) -> None:
    """Note the save of ``instance`` (it wrote the columns ``written``; those ``computed``,
    the database computed: expressions written, generated columns) and hand its event to the
    outbox."""
    if before is None and not created and inputs not in (None, audience_inputs(options, instance)):
        # Its own failure (reported) leaves the readers the row has now their announcement.
        before = failsafe(
            f"the readers {_label(options, instance)} left",
            using,
            False,
            lambda: _taken_late(options, instance, update_fields, using, known),
        )
    changed = None if created else tracking.changed_fields(instance, update_fields, known, using)
    # Told by the announcement's callback; by one of its own where none is registered.
    made = tracking.fate(using, register=False)
    try:
        tracking.saved(instance, written, using, made)
        action = "created" if created else "updated"
        if action not in options.actions or changed == []:
            return
        moving = before is not None and not created
        row = instance
        if computed or update_fields is not None:  # else the instance holds the row
            # What the database computed of the row; after a partial write, what the instance
            # may hold otherwise than the row, and the columns it did not write.
            read = computed | unsure_attnames(options, [instance], written)
            (row,) = as_stored(options, [instance], written, using, read)
        if changed is not None and options.generated_fields:
            changed = _with_generated(options, instance, row, known, changed)
        event = read_event(options, row, action, changed, scopeless=moving, using=using)
        if event is not None:
            event.before = before if moving else None
            on_commit.add(event, using, made)
    finally:
        tracking.register(made)


def _with_generated(
    options: ModelOptions,
    instance: models.Model,
    row: models.Model,
    known: dict[str, Any] | None,
    changed: list[str],
) -> list[str]:
    """``changed`` and the columns of the event the database computes whose value the save
    changed, which ``update_fields`` never name: as read back from the row (Django 5.2, whose
    instance keeps the old value) or as Django left it on the instance (Django 6), against
    what was known; one Django deferred after the save (Django 6 on MySQL and MariaDB) is
    unknown, so told."""
    names = set(changed)
    strict = tracking.kept_as_given(type(instance))
    for field in options.generated_fields:
        attname = field.attname
        now = row.__dict__ if attname in row.__dict__ else instance.__dict__
        if attname not in now or tracking.differs(now, known or {}, attname, attname in strict):
            names.add(field.name)
    return sorted(names)


def _taken_late(
    options: ModelOptions,
    instance: models.Model,
    update_fields: Iterable[str] | None,
    using: str,
    known: dict[str, Any] | None,
) -> Before | None:
    """Who could read the row before a save whose ``pre_save`` receivers of the application,
    run after realtime's, changed what decides it (its scope, a guarded column): from what the
    row held, as realtime knew it; raises where that would need the row as stored, gone now."""
    plan = plan_before(options, instance, update_fields, using, known)
    if plan is None:
        return None
    if plan.queries:
        raise RuntimeError(
            f"a pre_save receiver run after realtime's changed what decides who reads "
            f"{options.model._meta.label}:{instance.pk}, and who could read it before is no "
            "longer stored; the readers it leaves are not told. Set those fields before "
            "save() (or in the model's own save())"
        )
    return take_before(options, plan)


def on_pre_delete(
    sender: type[models.Model],
    instance: models.Model,
    using: str,
    origin: Any = None,
    **kwargs: Any,
) -> None:
    """The event of a delete and who may read the row, decided while it still exists."""
    options = options_for(sender)
    pending.drop(instance, PENDING_DELETE)  # a delete that failed after its pre_delete left it
    if options is None:
        return
    deletes.going(origin, instance)  # told by its own delete, not as leaving (memberships)
    if "deleted" not in options.actions or silences(origin):
        return

    def prepare() -> None:
        if deletes.past_limit(sender, instance, origin):
            event = deletes.fold(options, instance, origin, using)
        else:
            # The instance the application deleted (and its parents' rows, of a multi-table
            # child) may be stale; the rows Django's collector read to delete with it, or for
            # a queryset, were read just now.
            deleted_itself = isinstance(origin, type(instance)) and origin.pk == instance.pk
            row = with_stored_audience(options, instance, using) if deleted_itself else instance
            event = delete_event(options, row, using)
        if event is not None:
            pending.put(instance, PENDING_DELETE, event)

    failsafe(_label(options, instance), using, True, prepare)


def on_post_delete(
    sender: type[models.Model],
    instance: models.Model,
    using: str,
    origin: Any = None,
    **kwargs: Any,
) -> None:
    """The row is gone: its event to the outbox. A multi-table child deleted with
    ``keep_parents=True`` leaves the row of the ancestor it announces as: that row's update."""
    event = pending.take(instance, PENDING_DELETE)
    if event is None:
        return
    label = f"a deleted {sender._meta.label}"
    if deletes.parent_kept(event.options, sender, instance, origin):
        failsafe(label, using, True, lambda: _parent_kept(event.options, sender, instance, using))
        return
    failsafe(label, using, False, lambda: on_commit.add(event, using))


def _parent_kept(
    options: ModelOptions, child: type[models.Model], instance: models.Model, using: str
) -> None:
    """Announce the row a multi-table child's delete left in its ancestor's table as it is
    now: ``<name>.updated``, ``changed`` naming the child's own columns that went, as a save
    of them would (nothing, when the child has none or the model announces no updates)."""
    own = child._meta.concrete_model._meta.local_concrete_fields  # type: ignore[union-attr]
    changed = sorted(field.name for field in own if not field.primary_key)
    if "updated" not in options.actions or not changed:
        return
    row = options.model._base_manager.using(using).filter(pk=instance.pk).first()
    if row is None:  # removed meanwhile: its own delete tells it
        return
    event = read_event(options, row, "updated", changed, using=using)
    if event is not None:
        on_commit.add(event, using)


def _label(options: ModelOptions, instance: models.Model) -> str:
    return f"{options.name}:{instance.pk}"


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
    if not reverse and pending.held(instance, SAVED_RAW):
        # A fixture's row, its links set by the deserializer: their rows' writes keep quiet.
        fixture_links(None if action in AFTER else instance)
        return
    managing(sender, starting=not action.startswith("post_"))
    field = _m2m_field(sender, instance, model, reverse)
    if field is None:
        return
    owner_model: type[models.Model] = model if reverse else type(instance)
    options = options_for(owner_model)
    if options is None or "updated" not in options.actions:
        return
    # The accounts a path's first hop adds or removes are told by realtime.writes.memberships
    # (created, deleted); its readers who stay hear the update of the links, below.
    if guard_links.handles(sender, options):
        return  # its table's writes, the manager's included, are told there
    key = f"_realtime_m2m_{field.name}"
    links = f"{options.name} {field.name} links"
    if not action.startswith("post_"):
        # clear() sends no ids: read the links it is about to remove; a guard that may read
        # the links has its readers taken now, before they change.
        clearing, guarded = action == "pre_clear", guard_links.guard_reads(options, field)
        if not (clearing or guarded):
            return

        def read() -> tuple[list[models.Model], dict[Any, Before]]:
            owners = _owners(field, instance, reverse, pk_set, using, clearing)
            return owners, guard_links.readers_before(options, owners, using) if guarded else {}

        pending.put(instance, key, failsafe(links, using, True, read))
        return
    owners, befores = pending.take(instance, key) or ([], {})

    def announce() -> None:
        found: list[models.Model] = owners
        if action != "post_clear":
            found = _owners(field, instance, reverse, pk_set, using)
        on_commit.add_all(guard_links.link_events(options, field, found, befores, using), using)

    failsafe(links, using, True, announce)


AFTER = ("post_add", "post_remove", "post_clear")


def _owners(
    field: models.ManyToManyField[Any, Any],
    instance: models.Model,
    reverse: bool,
    pk_set: set[Any] | None,
    using: str,
    clearing: bool = False,
) -> list[models.Model]:
    """The rows of the decorated model whose links change: the instance itself, or (from the
    other side) the rows named by ``pk_set`` — the values of the key the links hold, which is
    the primary key unless the through model's foreign key names another (``to_field``); for
    ``clear()``, those linked now."""
    if clearing:
        return _linked_owners(field, instance, reverse, using)
    if not reverse:
        return [instance] if pk_set else []
    key = source_key(field).target_field.name
    rows = field.model._base_manager.using(using).filter(**{f"{key}__in": pk_set or ()})
    return list(rows.order_by("pk"))


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
    field: models.ManyToManyField[Any, Any], instance: models.Model, reverse: bool, using: str
) -> list[models.Model]:
    if not reverse:
        has_links = getattr(instance, field.name).using(using).exists()
        return [instance] if has_links else []
    rows = field.model._base_manager.using(using).filter(**{field.name: instance})
    return list(rows.order_by("pk"))
