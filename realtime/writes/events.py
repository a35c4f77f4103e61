"""A write read into an ``Event``, inside the write's transaction.

Everything an announcement needs is read here, from the instance and the values written:
``data`` (declared fields, foreign keys as ids, nothing lazy-loaded; then the keys of the
model's ``payload=``, below), the channels (the model's own, one per relation), the scope or
the accounts, ``changed`` and ``origin``. What may cost a query — to-many relation channels, a
multi-hop account path — costs at most one each, on the write's database. Each column is read
as its field reads it (``as_written``), as Django wrote it: ``"7"`` assigned to an integer
field is told as the row's ``7``.

An instance loaded without some of the columns its event carries (``only()``, ``defer()``)
holds no value for them: a client must not be told they are null. Those columns are read in
one statement, on the write's database and in its transaction (``with_columns``), into a copy
of the instance: the application's instance stays as Django left it (what it defers, and so
what its next ``save()`` writes, does not change).

**``payload=``**: ``data`` keys of the application's own. The callable is given the instance
as its announcement reads it (after a save, the row as written; in ``pre_delete``, the row
about to go; after a bulk ``update()``, the row read again) and returns a dict whose keys
follow the declared fields. Its values take the JSON forms declared fields take
(``strict_jsonable``: ISO dates, ``Decimal`` and ``UUID`` as text). It is application code,
so whatever goes wrong with it — it raises, it returns something that is not a dict, a value
with no JSON form, or a key ``data`` already holds (``model``, ``id``, a declared field:
overwriting one would send a record that lies about itself) — costs that write's record, never
the write and never a removal: one ERROR line with the traceback, within the budget of the
model's place (``log_hook_failure``). A delete is still announced, with its declared fields
alone; an update that takes the row from readers still tells them (their frame carries its
identity alone); nobody else hears of that write. Its queries are its own cost, once per row
of a bulk write; on PostgreSQL, inside a transaction, the callable's first query opens a
savepoint (``failsafe.savepoint_from_first_query``), rolled back if the callable fails or one
of its statements did (a callable may catch its own database error: what it returns is then
announced). A callable that does not query costs no statement at all.
"""

from __future__ import annotations

import copy
import datetime
import decimal
import logging
import math
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import models, router
from django.utils import timezone

from realtime import limits
from realtime.audience import ROWS_PER_STATEMENT
from realtime.chunks import chunked
from realtime.encoding import (
    encoded,
    jsonable,
    record_channel,
    row_key,
    sorted_ids,
    strict_jsonable,
)
from realtime.logs import log_hook_failure
from realtime.messages import LINKS
from realtime.middleware import current_origin
from realtime.paths import (
    is_foreign_key,
    key_fields,
    key_lookup,
    split_path,
    target_pk,
    values_on_path,
)
from realtime.primary import primary
from realtime.registry import ModelOptions, generic_fk, wire_name
from realtime.writes.failsafe import savepoint_from_first_query

logger = logging.getLogger(__name__)


@dataclass
class Before:
    """Who could read a row before an update, taken in its transaction before the write.

    Each part is ``None`` when it was not taken (it could not have changed) or could not be
    decided (a hook failed: then nobody is told the row left); see ``realtime.writes.views``.
    """

    #: The scope the row was in (normalised id).
    scope_id: Any = None
    #: Guarded models: the members of that scope who could read it.
    readers: list[Any] | None = None
    #: ``user_field`` models: the accounts the path reached.
    accounts: list[Any] | None = None
    #: ``shared_via`` models: the readers of its root outside its scope.
    shared: list[Any] | None = None
    #: The channels it was on (its relation channels as they were).
    channels: list[str] | None = None


@dataclass(slots=True)
class Event:
    """One announcement of one row, as prepared in the transaction that wrote it."""

    options: ModelOptions
    action: str
    pk: Any
    data: dict[str, Any]
    channels: list[str]
    scope_id: Any = None
    user_ids: list[Any] | None = None
    changed: list[str] | None = None
    origin: str | None = None
    #: Decided before the row went (deletes): accounts reached, or ``None`` when undecided.
    readers: list[Any] | None = None
    shared: list[Any] | None = None
    outside: list[Any] | None = None
    folded: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    #: Updates whose audience may have changed: who could read the row before.
    before: Before | None = None
    #: The row entered or left the view of ``accounts`` without a write of its own (a path's
    #: or a shared root's links changed): an account event to them alone, never coalesced.
    accounts: list[Any] | None = None
    #: A create or update whose ``payload=`` failed: ``data`` lacks its keys, so it goes only
    #: to the readers an update takes the row from, whose frame carries its identity alone.
    leaves_only: bool = False
    #: Where this version of the row stands among the row's versions (``realtime.writes.order``):
    #: ``[source, number]``, or ``None`` when the write gave no such moment.
    order: list[Any] | None = None
    #: A queryable model's ``filters`` columns as the write left them (JSON forms), for live
    #: queries; a column the row did not hold is left out: unknown.
    values: dict[str, Any] | None = None
    #: The row's many-to-many links changed, not the row (``realtime.writes.order``): its
    #: readers who keep it are told its identity and the links it names; its order marks it.
    links_only: bool = False

    @property
    def event_type(self) -> str:
        return f"{self.options.name}.{self.action}"

    @property
    def key(self) -> tuple[str, Any]:
        return (self.options.name, self.pk)

    @property
    def kept(self) -> dict[str, Any]:
        """The data of a frame to readers who read the row before and still do: ``data``,
        or for ``links_only`` the identity and the links it names in ``changed``, as its
        transaction left them (the row's other fields, as its instance held them, may be
        older than a write of the row told before it)."""
        if self.links_only:
            links = {name: self.data[name] for name in self.changed or () if name in self.data}
            return {"model": self.options.name, "id": self.data["id"], **links}
        return self.data

    def meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = {}
        if self.origin is not None:
            meta["origin"] = self.origin
        if self.changed is not None and self.action == "updated":
            meta["changed"] = self.changed
        if self.folded:
            meta["truncated"] = True
        if self.accounts is not None and not self.folded:
            meta["moved"] = True
        if self.order is not None:
            meta["order"] = [*self.order, LINKS] if self.links_only else self.order
        if self.options.filters and not self.folded:
            # Also on a delete (null): it marks a model's event for live queries, which an
            # application's broadcast of the same name never is.
            meta["filters"] = self.values
        return meta


def read_event(
    options: ModelOptions,
    instance: models.Model,
    action: str,
    changed: list[str] | None = None,
    *,
    scopeless: bool = False,
    to_many: dict[str, list[Any]] | None = None,
    using: str | None = None,
    with_payload: bool = True,
) -> Event | None:
    """Prepare the event of one write; ``None`` when the row announces nothing (no scope,
    unless ``scopeless``: an update that took the row out of every scope still tells the
    readers it left). ``with_payload=False``: without the keys of ``payload=`` (a leave frame,
    which carries the identity alone).

    When ``payload=`` fails the write still removes what it removes: a delete is announced
    with its declared fields alone, and a create or update is ``leaves_only``, heard only by
    the readers it takes the row from. Nobody is sent a record without the payload's keys as
    if it were whole."""
    instance = as_written(options, with_columns(options, instance, using))
    values = instance.__dict__
    pk = instance.pk
    scope_id = None
    user_ids = None
    if options.user_field is None:
        scope_id = values.get(options.scope_attname or "")
        if scope_id is None and not (scopeless or options.is_global):
            return None
    else:
        user_ids = read_accounts(options, instance, using, to_many)
    data: dict[str, Any] = {"model": options.name, "id": jsonable(pk)}
    encoders = options.encoders
    for wire, attname in options.field_attnames.items():
        value = values.get(attname)
        data[wire] = encoded(value, encoders[attname]) if attname in encoders else jsonable(value)
    failed = with_payload and not add_payload(options, instance, action, data, using)
    event = Event(
        options=options,
        action=action,
        pk=pk,
        data=data,
        channels=[
            options.name,
            record_channel(options.name, pk),
            *relation_channels(
                options, instance, created=action == "created", known=to_many, using=using
            ),
        ],
        scope_id=scope_id,
        user_ids=user_ids,
        changed=changed,
        origin=current_origin(),
        leaves_only=failed and action != "deleted",
    )
    if options.shared_via is not None:
        event.extra["root_pk"] = column_of_path(instance, options.shared_via)
    if options.filters:
        # A float JSON cannot hold (an infinity, NaN) is left out: the queries read the row
        # again, rather than take it for the null the message would carry.
        event.values = {
            name: jsonable(values[attname])
            for name, attname in options.filter_attnames.items()
            if attname in values and not _non_finite(values[attname])
        }
    return event


def _non_finite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


#: What ``to_python`` of Django's fields (exactly these classes: a subclass may read values
#: otherwise) gives, and gives back unchanged: a value of that type is read as it is.
READS_AS: dict[type[Any], type[Any]] = {
    **dict.fromkeys(
        [
            models.AutoField,
            models.BigAutoField,
            models.SmallAutoField,
            models.IntegerField,
            models.BigIntegerField,
            models.SmallIntegerField,
            models.PositiveIntegerField,
            models.PositiveBigIntegerField,
            models.PositiveSmallIntegerField,
        ],
        int,
    ),
    **dict.fromkeys(
        [
            models.CharField,
            models.TextField,
            models.SlugField,
            models.EmailField,
            models.URLField,
        ],
        str,
    ),
    models.BooleanField: bool,
    models.FloatField: float,
    models.DateField: datetime.date,
    models.DateTimeField: datetime.datetime,
    models.TimeField: datetime.time,
    models.UUIDField: uuid.UUID,
}

#: Stands for a value its field cannot read (``read_by``).
UNREADABLE: Any = object()


def read_by(field: Any, value: Any) -> Any:
    """``value`` as ``field`` reads it and the row then holds it (``to_python``, where
    Django's writing of it starts, then what Django's own preparing of it does to what the
    database stores): ``"7"`` given to an integer field is the row's ``7``, ``"2026-1-5"``
    given to a date field its ``2026-01-05``, a naive datetime given to a ``DateTimeField``
    under ``USE_TZ`` that instant in the default time zone (as Django saves it, warning), a
    decimal rounded to the field's ``decimal_places``. ``UNREADABLE`` for an expression (the
    database computes it) and for a value ``to_python`` refuses (the write itself fails, or
    stores what the database made of it)."""
    if hasattr(value, "resolve_expression"):
        return UNREADABLE
    try:
        read = field.to_python(value)
        if isinstance(field, models.DateTimeField) and _naive(read):
            return timezone.make_aware(read, timezone.get_default_timezone())
        if (
            isinstance(field, models.DecimalField)
            and isinstance(read, decimal.Decimal)
            and field.decimal_places is not None
            and read.is_finite()
        ):
            return read.quantize(decimal.Decimal(1).scaleb(-field.decimal_places))
        return read
    except Exception:
        return UNREADABLE


def _naive(value: Any) -> bool:
    """Whether ``value`` is a naive datetime a ``DateTimeField`` stores otherwise (``USE_TZ``)."""
    return isinstance(value, datetime.datetime) and value.tzinfo is None and bool(settings.USE_TZ)


def as_written(options: ModelOptions, instance: models.Model) -> models.Model:
    """``instance``, or when it holds a column its event reads in another form than its field
    reads it (application code may assign text to an integer or a date field), a copy holding
    each such column as ``read_by`` reads it: the event carries what the row holds, not what
    was assigned. A value its field cannot read stays as it is. The instance itself is left as
    it is."""
    values = instance.__dict__
    read: dict[str, Any] = {}
    for attname, reader in options.event_fields.items():
        value = values.get(attname)
        if value is None or (type(value) is READS_AS.get(type(reader)) and not _naive(value)):
            continue
        stored = read_by(reader, value)
        if stored is UNREADABLE or stored is value:
            continue
        if type(stored) is not type(value) or stored != value or _places_differ(stored, value):
            read[attname] = stored
    return copy_with(instance, read)


def _places_differ(stored: Any, value: Any) -> bool:
    """Whether two equal decimals are written apart (``1.50`` and ``1.5``): the event carries
    the text of the one the row holds."""
    return isinstance(stored, decimal.Decimal) and str(stored) != str(value)


def as_stored(
    options: ModelOptions,
    instances: Sequence[models.Model],
    written: Sequence[str],
    using: str | None = None,
    unsure: Iterable[str] = (),
) -> list[models.Model]:
    """``instances`` after a write of the columns ``written``, each holding as the row holds
    them: the columns ``unsure`` (what decides who reads the row, where an instance holds a
    value the row may not: it is addressed by the row; a column written as an expression,
    which the database computed), and, after a write of only some columns (a save with
    ``update_fields``, a ``bulk_update``) of a queryable model, the other columns its event
    reads (the instance's may be stale: another request wrote them, and live queries place
    the row by them). One ``SELECT`` of just those columns per 500 rows, in the write's
    transaction; the instances themselves unchanged."""
    if not instances:
        return list(instances)
    wanted = set(unsure)
    if options.filters:
        wanted |= options.event_attnames.difference(written)
    if not wanted:
        return list(instances)
    stored = read_columns(instances, sorted(wanted), using)
    return [copy_with(instance, stored.get(id(instance))) for instance in instances]


def lacks_columns(options: ModelOptions, instance: models.Model) -> list[str]:
    """The columns the event of ``instance`` reads that it was loaded without (``only()``,
    ``defer()``); none for a row not saved yet."""
    # Django's ``get_deferred_fields()``, narrowed to these columns: an attribute not in
    # the instance's dict (a new instance holds every column: nothing is missing). Asked
    # outside realtime's guard of the write (``failsafe``), it never raises: what the columns'
    # names may raise is the event's to report, where it is read.
    try:
        missing = options.event_attnames.difference(instance.__dict__)
    except Exception:
        return []
    return sorted(missing) if missing else []


def with_columns(
    options: ModelOptions, instance: models.Model, using: str | None = None
) -> models.Model:
    """``instance``, or when it lacks columns its event reads, a copy holding them as the row
    does: one ``SELECT`` of just those columns on ``using`` (else where the model's writes
    go, never a read replica that may not have the write). The instance itself is left as
    it is: what it defers stays deferred, as Django left it."""
    return with_attnames(instance, lacks_columns(options, instance), using)


def with_attnames(
    instance: models.Model, attnames: Iterable[str], using: str | None = None
) -> models.Model:
    """``instance``, or when it was loaded without some of the columns ``attnames``
    (``only()``, ``defer()``), a copy holding them as its row does: one ``SELECT`` of just
    those columns by primary key (on ``using``, else where the model's writes go), the
    instance itself left as it is. An event's columns are read this way (``with_columns``),
    and so are a membership row's owner and account: a key not loaded is not a key that names
    nobody. A row already gone leaves them missing."""
    missing = sorted(set(attnames).difference(instance.__dict__))
    if not missing:
        return instance
    stored = read_columns([instance], missing, using)
    return copy_with(instance, stored.get(id(instance)))


def with_columns_of(
    options: ModelOptions, instances: Sequence[models.Model], using: str | None = None
) -> list[models.Model]:
    """``with_columns`` of many instances (a bulk write's), one ``SELECT`` per 500 of those
    that lack columns, whatever each lacks."""
    lacking = [instance for instance in instances if lacks_columns(options, instance)]
    if not lacking:
        return list(instances)
    stored = read_columns(lacking, _missing(options, lacking), using)
    return [copy_with(instance, stored.get(id(instance))) for instance in instances]


def _missing(options: ModelOptions, instances: Sequence[models.Model]) -> list[str]:
    return sorted({name for instance in instances for name in lacks_columns(options, instance)})


def read_columns(
    instances: Sequence[models.Model], columns: list[str], using: str | None
) -> dict[int, dict[str, Any] | None]:
    """``columns`` of the rows of ``instances`` as stored, by the ``id()`` of each instance
    (``None``: its row is gone): one ``SELECT`` per 500 rows on ``using`` (else where the
    model's writes go); row by row, by its parts, for a composite key."""
    model = type(instances[0])
    alias = using or primary(model)
    if len(key_fields(model)) > 1:
        return {id(i): _stored(model, i.pk, columns, alias) for i in instances}
    by_pk: dict[Any, dict[str, Any]] = {}
    for chunk in chunked([instance.pk for instance in instances], 500):
        rows = model._base_manager.using(alias).filter(pk__in=chunk).values("pk", *columns)
        by_pk.update((row.pop("pk"), row) for row in rows)
    return {id(instance): by_pk.get(instance.pk) for instance in instances}


def _stored(
    model: type[models.Model], pk: Any, columns: list[str], using: str | None
) -> dict[str, Any] | None:
    rows = model._base_manager.using(using or primary(model)).filter(pk=pk).values(*columns)
    return rows.first()


def copy_with(instance: models.Model, stored: dict[str, Any] | None) -> models.Model:
    """A copy of ``instance`` holding ``stored`` too (``None``: the row is gone, nothing to
    read: the instance itself). Made by hand rather than by ``copy.copy``, which goes through
    pickling's path and so through the global registry of models."""
    if not stored:
        return instance
    model = type(instance)
    whole = model.__new__(model)
    whole.__dict__.update(instance.__dict__)
    whole._state = copy.copy(instance._state)
    whole.__dict__.update(stored)
    return whole


def column_of_path(instance: models.Model, path: str) -> Any:
    """The value of a one-hop foreign key path, read from the instance (no query)."""
    parts = split_path(path)
    if len(parts) != 1:
        return None
    field = instance._meta.get_field(parts[0])
    if not is_foreign_key(field):
        return None
    return instance.__dict__.get(field.attname)


def relation_channels(
    options: ModelOptions,
    instance: models.Model,
    *,
    created: bool = False,
    known: dict[str, list[Any]] | None = None,
    using: str | None = None,
) -> list[str]:
    """``<target>:<pk>`` for each declared relation; none at all past 50 of them.

    A row just created has no to-many links yet (nothing could point at it before it
    existed), so those are not queried for; nor are those ``known`` (the targets of each
    to-many relation and key declared with ``to_field``, read for many rows at once:
    ``to_many_of_rows``).
    """
    channels: list[str] = []
    for name in options.relations:
        if known is not None and name in known:
            target = options.model._meta.get_field(name).related_model
            channels += [record_channel(wire_name(target), pk) for pk in known[name]]  # type: ignore[arg-type]
        else:
            channels += _channels_of(instance, name, created, using)
        if len(channels) > limits.MAX_RELATION_CHANNELS:
            return []
    return channels


def _channels_of(
    instance: models.Model, name: str, created: bool, using: str | None = None
) -> list[str]:
    """The channels of one relation of ``instance``; what it reads, on ``using``, else where
    the model's writes go (never where a router sends the application's reads)."""
    using = using or primary(type(instance))
    generic = generic_fk(type(instance), name)
    values = instance.__dict__
    if generic is not None:
        type_id = values.get(generic.ct_field + "_id")
        object_id = values.get(generic.fk_field)
        if type_id is None or object_id is None:
            return []
        from django.contrib.contenttypes.models import ContentType

        model = ContentType.objects.db_manager(using).get_for_id(type_id).model_class()
        return [record_channel(wire_name(model), object_id)] if model is not None else []
    relation = instance._meta.get_field(name)
    target = relation.related_model
    if not isinstance(target, type):
        return []
    if is_foreign_key(relation):
        # A key declared with ``to_field`` holds another column: its channel names the pk.
        pk = target_pk(relation, values.get(relation.attname), using)
        return [] if pk is None else [record_channel(wire_name(target), pk)]
    if instance.pk is None or created:
        return []
    # To-many: one query, bounded so that a huge relation costs no more than 51 rows.
    accessor = name
    if isinstance(relation, models.ForeignObjectRel):
        accessor = relation.get_accessor_name() or name
    manager = getattr(instance, accessor)
    related = manager.using(using)
    pks = related.order_by().values_list("pk", flat=True)[: limits.MAX_RELATION_CHANNELS + 1]
    return [record_channel(wire_name(target), pk) for pk in pks]


def to_many_of_rows(
    options: ModelOptions,
    model: type[models.Model],
    pks: Sequence[Any],
    using: str,
    *,
    created: bool = False,
) -> dict[Any, dict[str, list[Any]]]:
    """The targets of each to-many relation of the rows ``pks``, and of each foreign key
    declared with ``to_field`` (by their primary keys), by ``row_key``: one statement per
    relation and 500 rows (each row's list cut past 50, as one row's read is). ``created``:
    rows just inserted, which have no to-many targets yet (their keys alone are read). And,
    under ``ACCOUNTS``, the accounts a ``user_field`` path of more than one hop reaches from
    each (one more statement per 500 rows, where ``read_accounts`` would cost one per row)."""
    found: dict[Any, dict[str, list[Any]]] = {row_key(pk): {} for pk in pks}
    lookups = [(name, f"{name}__pk") for name in options.keyed_relations]
    if not created:
        lookups += [(name, name) for name in options.to_many]
    path = options.user_field
    if path is not None and len(split_path(path)) > 1:
        lookups.append((ACCOUNTS, key_lookup(model, path)))
    for name, lookup in lookups:
        most = None if name == ACCOUNTS else limits.MAX_RELATION_CHANNELS
        for chunk in chunked(list(pks), ROWS_PER_STATEMENT):
            rows = model._base_manager.using(using).filter(pk__in=chunk).order_by()
            for pk, target in rows.values_list("pk", lookup):
                targets = found[row_key(pk)].setdefault(name, [])
                if target is not None and (most is None or len(targets) <= most):
                    targets.append(target)
    return found


#: The key of ``to_many_of_rows``' answer under which a row's accounts are (no field's name).
ACCOUNTS = "accounts of user_field"


def reads_rows_apart(options: ModelOptions, created: bool = False) -> bool:
    """Whether ``to_many_of_rows`` reads anything for rows of ``options`` (``created``: rows
    just inserted): what a bulk write reads for its rows together."""
    path = options.user_field
    return bool(
        options.keyed_relations
        or (options.to_many and not created)
        or (path is not None and len(split_path(path)) > 1)
    )


def read_accounts(
    options: ModelOptions,
    instance: models.Model,
    using: str | None = None,
    known: dict[str, list[Any]] | None = None,
) -> list[Any]:
    """The account ids a ``user_field`` path reaches from ``instance`` (an empty hop: none);
    ``known``: what ``to_many_of_rows`` read of its row, its accounts among it."""
    if known is not None and ACCOUNTS in known:
        return sorted_ids(known[ACCOUNTS])
    return values_on_path(instance, options.user_field or "", using)


def folded_event(
    options: ModelOptions,
    scope_id: Any,
    action: str = "deleted",
    accounts: Iterable[Any] | None = None,
) -> Event:
    """One truncated event with no data on the model's channel: the clients of ``scope_id``
    (of ``accounts``, for an account model) reload the list."""
    return Event(
        options=options,
        action=action,
        pk=None,
        data={},
        channels=[options.name],
        scope_id=scope_id,
        folded=True,
        accounts=None if accounts is None else sorted_ids(accounts),
    )


def write_queries(options: ModelOptions, action: str, to_many: bool = False) -> bool:
    """Whether reading the event of a create or an update may query (``to_many``: its
    to-many targets are read already)."""
    if action == "created":
        return options.create_queries
    return options.queries_besides_to_many if to_many else options.write_queries


# payload= ------------------------------------------------------------------------------------

#: What a failure costs the announcement of each action (``events.read_event`` acts on it).
_COSTS = {
    "deleted": "the delete of %s:%s is announced without its keys",
    "created": "%s:%s is not announced",
}
_UPDATE_COST = "%s:%s is not announced, but to the readers it leaves"


def add_payload(
    options: ModelOptions,
    instance: models.Model,
    action: str,
    data: dict[str, Any],
    using: str | None,
) -> bool:
    """Add the keys ``options.payload`` gives for ``instance`` to ``data``; ``False`` when it
    failed (logged, with what the failure costs the announcement of ``action``)."""
    hook = options.payload
    if hook is None:
        return True
    try:
        found = _call(hook, instance, using or _alias(instance))
        if not isinstance(found, Mapping):
            raise TypeError(f"payload= returned a {type(found).__name__}, not a dict")
        extra = strict_jsonable(dict(found))
        clash = sorted(set(extra) & set(data))
        if clash:
            raise ValueError(f"payload= returned keys data already holds: {', '.join(clash)}")
    except Exception as error:
        log_hook_failure(
            logger,
            "realtime: payload= of %s failed; "
            + _COSTS.get(action, _UPDATE_COST)
            + " (the write stands)",
            error,
            options.name,
            options.name,
            jsonable(instance.pk),
            place=options.name,
        )
        return False
    data.update(extra)
    return True


def _alias(instance: models.Model) -> str:
    return instance._state.db or router.db_for_write(type(instance), instance=instance)


def _call(hook: Callable[[Any], Any], instance: models.Model, using: str) -> Any:
    """Call ``hook``; its queries in a savepoint opened by the first, where one is needed."""
    with savepoint_from_first_query(using):
        return hook(instance)
