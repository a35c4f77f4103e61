"""The declarations: which models announce, and with what options.

``@realtime_model`` (``realtime.writes.decorator``) records a ``ModelOptions`` here; the write
side reads it to prepare announcements, the socket side to know which channels exist, the
auth service to find a guard, the system checks to validate it. This module only records and
looks up: it connects no receiver and imports nothing of the parts above it.
"""

from __future__ import annotations

import json
import re
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from django.core.exceptions import FieldDoesNotExist
from django.db import models
from django.db.models import Q

from realtime.compat.django_orm import saves_read_generated_back
from realtime.paths import holds_target_pk, is_foreign_key

ACTIONS = ("created", "updated", "deleted")


def default_name(model: type[models.Model]) -> str:
    """Return the snake_case wire name of a model class: ``RtRecord`` -> ``rt_record``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", model.__name__).lower()


@dataclass(frozen=True)
class ModelOptions:
    """What one decorated model announces, read by receivers, checks and the socket side.

    It holds its model weakly: a model defined for a while (in a test) is released with its
    class, and its options are forgotten then."""

    model_ref: Callable[[], type[models.Model] | None]
    name: str
    actions: frozenset[str]
    fields: Mapping[str, str]  # wire name -> field name
    relations: tuple[str, ...]
    #: The foreign key to the scope; ``None`` with no ``user_field``: a global model.
    scope_field: str | None
    user_field: str | None
    guard: Callable[[Any], Q] | None
    shared_via: str | None
    cascade: tuple[str, ...]
    #: The fields whose change may change the guard's answer; ``None``: not declared.
    guard_fields: tuple[str, ...] | None = None
    #: ``payload=``: called with the instance, its dict's keys added to ``data``
    #: (``realtime.writes.events``).
    payload: Callable[[Any], Mapping[str, Any]] | None = None
    #: ``filters=``: the fields live queries may filter and order by (``realtime.sockets.
    #: live_queries``); empty: the model is not queryable. Only names of the model's own
    #: fields: the others are left to the system check (``declared_filters``).
    filters: tuple[str, ...] = ()
    #: ``filters=`` as written, names the model lacks included: what ``realtime.E050``
    #: checks.
    declared_filters: tuple[str, ...] = ()

    @property
    def model(self) -> type[models.Model]:
        model = self.model_ref()
        if model is None:
            raise LookupError(f"the model announced as {self.name!r} is gone")
        return model

    @cached_property
    def field_attnames(self) -> dict[str, str]:
        """Map each wire name to the attribute holding its value (``company`` -> ``company_id``;
        ``pk``, and ``id`` where no field has that name: the primary key's)."""
        meta = self.model._meta
        return {wire: _column_attname(meta, name) for wire, name in self.fields.items()}

    @cached_property
    def encoders(self) -> dict[str, type[json.JSONEncoder] | None]:
        """The encoder of each declared field (by attname) that is a ``JSONField`` with an
        encoder or a decoder of its own (``None``: JSON's own encoder): its value is sent as
        that encoder writes it (``realtime.encoding.encoded``)."""
        by_attname = {str(f.attname): f for f in self.model._meta.concrete_fields}
        found = (by_attname.get(attname) for attname in self.field_attnames.values())
        return {
            str(f.attname): f.encoder
            for f in found
            if isinstance(f, models.JSONField) and (f.encoder or f.decoder)
        }

    @cached_property
    def filter_attnames(self) -> dict[str, str]:
        """Map each ``filters`` name to the attribute holding its value (``company`` ->
        ``company_id``): what every publication of a queryable model carries."""
        meta = self.model._meta
        return {name: str(meta.get_field(name).attname) for name in self.filters}  # type: ignore[union-attr]

    @cached_property
    def filter_fields(self) -> dict[str, Any]:
        """The ``filters`` fields by name."""
        meta = self.model._meta
        return {name: meta.get_field(name) for name in self.filters}

    @cached_property
    def guard_attnames(self) -> frozenset[str] | None:
        """The columns named by ``guard_fields`` (a many-to-many by its name: it has none)."""
        if self.guard_fields is None:
            return None
        meta = self.model._meta
        return frozenset(
            str(getattr(meta.get_field(name), "attname", None) or name)
            for name in self.guard_fields
        )

    @cached_property
    def event_attnames(self) -> frozenset[str]:
        """The columns an event reads from its row: the declared fields, the ``filters``, the
        scope, the keys of foreign-key and generic relations and the first hop of an account
        path or a shared root. An instance loaded without some of them (``only()``,
        ``defer()``) has them read before its event is (``realtime.writes.events``)."""
        meta = self.model._meta
        found = {*self.field_attnames.values(), *self.filter_attnames.values()}
        if self.scope_attname is not None:
            found.add(self.scope_attname)
        paths = [path for path in (self.user_field, self.shared_via) if path]
        hops = [path.replace("__", ".").split(".")[0] for path in paths]
        for name in [*self.relations, *hops]:
            generic = generic_fk(self.model, name)
            parts = [generic.ct_field, generic.fk_field] if generic is not None else [name]
            for part in parts:
                field = meta.get_field(part)
                if field.concrete and not field.many_to_many:
                    found.add(str(field.attname))
        return frozenset(found)

    @cached_property
    def event_fields(self) -> dict[str, Any]:
        """The field reading each column an event reads (``event_attnames``), by its attname:
        how a value assigned to it is read as the row holds it (``realtime.writes.events``);
        a foreign key's column is read by the field it points at, as Django reads it."""
        by_attname = {str(f.attname): f for f in self.model._meta.concrete_fields}
        found = {name: by_attname[name] for name in self.event_attnames if name in by_attname}
        return {
            name: f.target_field if isinstance(f, models.ForeignKey) else f
            for name, f in found.items()
        }

    @cached_property
    def stale_after_update(self) -> frozenset[str]:
        """The columns an event reads (``event_attnames``) that an update by ``save()`` may
        leave stale on its instance: those the database computes (``GeneratedField``), where
        Django does not read them back (``saves_read_generated_back``). The event reads them
        from the row (``realtime.writes.receivers``); none, and no statement, for a model
        whose events carry no such column."""
        if saves_read_generated_back():
            return frozenset()
        return frozenset(str(field.attname) for field in self.generated_fields)

    @cached_property
    def generated_fields(self) -> tuple[Any, ...]:
        """The columns an event reads (``event_attnames``) that the database computes
        (``GeneratedField``)."""
        return tuple(
            field
            for field in self.model._meta.concrete_fields
            if isinstance(field, models.GeneratedField) and field.attname in self.event_attnames
        )

    @cached_property
    def is_global(self) -> bool:
        """Whether the model is announced to every signed-in socket subscribed to its
        channels (``scope_field=None``, no ``user_field``), narrowed by its guard."""
        return self.user_field is None and self.scope_field is None

    @cached_property
    def scope_attname(self) -> str | None:
        """The attribute holding the scope id; ``None`` for account-addressed and global
        models."""
        if self.user_field is not None or self.scope_field is None:
            return None
        if self.scope_field in ("id", "pk"):
            return self.model._meta.pk.attname
        return self.model._meta.get_field(self.scope_field).attname  # type: ignore[union-attr]

    @cached_property
    def write_queries(self) -> bool:
        """Whether reading a create or update may query: to-many or generic relations, or a
        multi-hop account path. Such reads run in a savepoint inside a transaction."""
        return bool(self.to_many or self.keyed_relations) or self.queries_besides_to_many

    @cached_property
    def to_many(self) -> tuple[str, ...]:
        """The declared relations that are to-many (their channels are read with a query)."""
        found = []
        for relation in self.relations:
            if is_generic_fk(self.model, relation):
                continue
            field = self.model._meta.get_field(relation)
            if not is_foreign_key(field):
                found.append(relation)
        return tuple(found)

    @cached_property
    def keyed_relations(self) -> tuple[str, ...]:
        """The declared relations that are foreign keys declared with ``to_field``: they hold
        another column than their target's primary key, which their record channels name, so
        reading those costs a query (``paths.target_pks``), as a to-many relation's does."""
        meta = self.model._meta
        return tuple(
            relation
            for relation in self.relations
            if not is_generic_fk(self.model, relation)
            and is_foreign_key(field := meta.get_field(relation))
            and not holds_target_pk(field)
        )

    @cached_property
    def queries_besides_to_many(self) -> bool:
        """Whether reading a write may query for anything but to-many channels: a generic
        relation's content type, a multi-hop account path, or one through a key declared
        with ``to_field``."""
        if any(is_generic_fk(self.model, relation) for relation in self.relations):
            return True
        if self.user_field is not None:
            first = self.model._meta.get_field(self.user_field.replace("__", ".").split(".")[0])
            multi_hop = "." in self.user_field.replace("__", ".")
            return multi_hop or not is_foreign_key(first) or not holds_target_pk(first)
        return False

    @cached_property
    def create_queries(self) -> bool:
        """Whether reading a create may query: a row just created has no to-many links yet,
        so only generic relations, account paths and keys declared with ``to_field`` can."""
        return self.queries_besides_to_many or bool(self.keyed_relations)

    @cached_property
    def delete_queries(self) -> bool:
        """Whether preparing a delete may query: reads, readers of a guarded row, shared roots."""
        return bool(self.write_queries or self.guard or self.shared_via)


def generic_fk(model: type[models.Model], name: str) -> Any:
    """The ``GenericForeignKey`` named ``name`` on ``model``, or ``None``.

    Looked up through ``_meta``: from Django 6.1 the class attribute is a descriptor, not the
    field itself.
    """
    from django.contrib.contenttypes.fields import GenericForeignKey

    try:
        field = model._meta.get_field(name)
    except FieldDoesNotExist:
        return None
    return field if isinstance(field, GenericForeignKey) else None


def is_generic_fk(model: type[models.Model], name: str) -> bool:
    return generic_fk(model, name) is not None


#: By the ``id()`` of the decorated class (which it holds weakly: see ``ModelOptions``).
_by_model: dict[int, ModelOptions] = {}
_by_name: dict[str, list[ModelOptions]] = {}
_subscribable: frozenset[str] | None = None


def options_of(model: type[models.Model], **given: Any) -> ModelOptions:
    """The options of ``model`` (``given``: the others), forgotten when the class goes."""
    key = id(model)

    def gone(ref: Any) -> None:
        options = _by_model.get(key)
        if options is not None and options.model_ref is ref:
            _drop(key, options)

    return ModelOptions(model_ref=weakref.ref(model, gone), **given)


def record(options: ModelOptions) -> None:
    """Record the options of a decorated model."""
    global _subscribable
    _by_model[id(options.model)] = options
    _by_name.setdefault(options.name, []).append(options)
    _subscribable = None


def forget(model: type[models.Model]) -> ModelOptions | None:
    """Forget a decorated model; return the options it had, if any."""
    options = _by_model.get(id(model))
    if options is None or options.model_ref() is not model:
        return None
    _drop(id(model), options)
    return options


def _drop(key: int, options: ModelOptions) -> None:
    global _subscribable
    _by_model.pop(key, None)
    _subscribable = None
    group = _by_name.get(options.name, [])
    if options in group:
        group.remove(options)
    if not group:
        _by_name.pop(options.name, None)


def is_recorded(model: type[models.Model]) -> bool:
    """Whether ``model`` itself (not an ancestor) was decorated."""
    found = _by_model.get(id(model))
    return found is not None and found.model_ref() is model


def options_for(model: type[models.Model]) -> ModelOptions | None:
    """Return the options a model announces with: its own, or a decorated ancestor's."""
    for klass in model.__mro__:
        found = _by_model.get(id(klass))
        if found is not None and found.model_ref() is klass:
            return found
    return None


def options_named(name: str) -> ModelOptions | None:
    """Return the options of the model announcing as ``name``, if any."""
    for options in _by_name.get(name, ()):
        if options.model_ref() is not None:
            return options
    return None


class Live(list[ModelOptions]):
    """Options whose models were alive when the list was made, holding those models: a
    short-lived model is not released, and its ``model`` does not vanish, while the list is
    gone through (a garbage collection may run at any allocation)."""

    def __init__(self, options: Iterable[ModelOptions]) -> None:
        pairs = [(o, o.model_ref()) for o in options]
        super().__init__(o for o, model in pairs if model is not None)
        self.models = [model for _, model in pairs if model is not None]


def all_options() -> Live:
    """The options of every decorated model (alive: see ``Live``)."""
    return Live(options for group in _by_name.values() for options in group)


def duplicate_names() -> dict[str, Live]:
    """The names more than one decorated model announces as, with their options."""
    groups = {name: Live(group) for name, group in _by_name.items() if len(group) > 1}
    return {name: group for name, group in groups.items() if len(group) > 1}


def subscribable_names() -> frozenset[str]:
    """The channel model names clients may subscribe to: decorated models, relation targets."""
    global _subscribable
    if _subscribable is None:
        names = set(_by_name)
        for options in all_options():
            for relation in options.relations:
                target = relation_target(options, relation)
                if target is not None:
                    names.add(wire_name(target))
        _subscribable = frozenset(names)
    return _subscribable


def relation_target(options: ModelOptions, relation: str) -> type[models.Model] | None:
    """The model a relation points at; ``None`` for a generic foreign key (any model)."""
    if is_generic_fk(options.model, relation):
        return None
    related = options.model._meta.get_field(relation).related_model
    return related if isinstance(related, type) else None


def wire_name(model: type[models.Model]) -> str:
    """The name a model travels under: its declared name, else its default name."""
    options = options_for(model)
    return options.name if options is not None else default_name(model)


def _column_attname(meta: Any, name: str) -> str:
    """The attribute holding the column ``fields=`` names (the decorator accepts ``pk`` and
    ``id`` for any model: the primary key's where no field is named so)."""
    if name == "pk":
        return str(meta.pk.attname)
    try:
        return str(meta.get_field(name).attname)
    except FieldDoesNotExist:
        if name == "id":
            return str(meta.pk.attname)
        raise
