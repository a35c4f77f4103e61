"""``@realtime_model``: which models announce, and how each one does.

The decorator validates its options at decoration time (a typo fails at import, not in
production), records them, and connects the model's receivers with ``sender=`` that model only,
so undecorated models keep Django's fast delete path. Proxy models and multi-table children of
a decorated model announce with their parent's options. Paths are resolved lazily, on first
use, because related models may not exist yet when the decorator runs.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeVar

from django.db import models
from django.db.models import Q
from django.db.models.signals import class_prepared

ModelT = TypeVar("ModelT", bound=type[models.Model])

ACTIONS = ("created", "updated", "deleted")


def default_name(model: type[models.Model]) -> str:
    """Return the snake_case wire name of a model class: ``RtRecord`` -> ``rt_record``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", model.__name__).lower()


@dataclass(frozen=True)
class ModelOptions:
    """What one decorated model announces, read by receivers, checks and the socket side."""

    model: type[models.Model]
    name: str
    actions: frozenset[str]
    fields: Mapping[str, str]  # wire name -> field name
    relations: tuple[str, ...]
    scope_field: str
    user_field: str | None
    guard: Callable[[Any], Q] | None
    shared_via: str | None
    cascade: tuple[str, ...]

    @cached_property
    def field_attnames(self) -> dict[str, str]:
        """Map each wire name to the attribute holding its value (``company`` -> ``company_id``)."""
        return {
            wire: self.model._meta.get_field(name).attname  # type: ignore[union-attr]
            for wire, name in self.fields.items()
        }

    @cached_property
    def scope_attname(self) -> str | None:
        """The attribute holding the scope id; ``None`` for account-addressed models."""
        if self.user_field is not None:
            return None
        if self.scope_field in ("id", "pk"):
            return self.model._meta.pk.attname
        return self.model._meta.get_field(self.scope_field).attname  # type: ignore[union-attr]

    @cached_property
    def write_queries(self) -> bool:
        """Whether reading a create or update may query: to-many or generic relations, or a
        multi-hop account path. Such reads run in a savepoint inside a transaction."""
        for relation in self.relations:
            if is_generic_fk(self.model, relation):
                return True
            field = self.model._meta.get_field(relation)
            if not (field.concrete and (field.many_to_one or field.one_to_one)):
                return True
        if self.user_field is not None:
            first = self.model._meta.get_field(self.user_field.replace("__", ".").split(".")[0])
            multi_hop = "." in self.user_field.replace("__", ".")
            return multi_hop or not (first.concrete and first.many_to_one)
        return False

    @cached_property
    def create_queries(self) -> bool:
        """Whether reading a create may query: a row just created has no to-many links yet,
        so only generic relations and account paths can."""
        if any(is_generic_fk(self.model, relation) for relation in self.relations):
            return True
        return self.user_field is not None and self.write_queries

    @cached_property
    def delete_queries(self) -> bool:
        """Whether preparing a delete may query: reads, readers of a guarded row, shared roots."""
        return bool(self.write_queries or self.guard or self.shared_via)


_by_model: dict[type[models.Model], ModelOptions] = {}
_by_name: dict[str, list[ModelOptions]] = {}


def realtime_model(
    *,
    create: bool = True,
    update: bool = True,
    delete: bool = True,
    fields: Sequence[str] | Mapping[str, str] | None = None,
    relations: Sequence[str] | None = None,
    scope_field: str = "workspace",
    user_field: str | None = None,
    guard: Callable[[Any], Q] | None = None,
    shared_via: str | None = None,
    cascade: Sequence[str] | None = None,
    name: str | None = None,
    **unknown: Any,
) -> Callable[[ModelT], ModelT]:
    """Declare that writes of the decorated model are announced; see the announcements docs.

    Unknown options and values of the wrong shape raise ``ValueError`` here, at import time.
    """
    if unknown:
        raise ValueError(f"unknown @realtime_model option(s): {', '.join(sorted(unknown))}")
    if isinstance(fields, str) or isinstance(relations, str) or isinstance(cascade, str):
        raise ValueError("fields, relations and cascade take a list of names, not a string")
    if guard is not None and not callable(guard):
        raise ValueError("guard must be a callable taking a user and returning a Q")
    if name is not None and not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ValueError(f"name {name!r} must be lowercase letters, digits and underscores")
    if isinstance(fields, Mapping):
        field_map = dict(fields)
    else:
        field_map = {column: column for column in fields or ()}
    actions = frozenset(
        action for action, on in zip(ACTIONS, (create, update, delete), strict=True) if on
    )

    def decorate(model: ModelT) -> ModelT:
        if not (isinstance(model, type) and issubclass(model, models.Model)):
            raise TypeError("@realtime_model decorates Django model classes")
        options = ModelOptions(
            model=model,
            name=name or default_name(model),
            actions=actions,
            fields=field_map,
            relations=tuple(relations or ()),
            scope_field=scope_field,
            user_field=user_field,
            guard=guard,
            shared_via=shared_via,
            cascade=tuple(cascade or ()),
        )
        _validate_columns(options)
        register(options)
        return model

    return decorate


def _validate_columns(options: ModelOptions) -> None:
    """Check the names that live on the model itself.

    Only forward fields exist when a decorator runs; relations may also name reverse
    relations, which the system checks verify once every model is loaded.
    """
    meta = options.model._meta
    forward = [*meta.fields, *meta.many_to_many, *meta.private_fields]
    own = {f.name for f in forward} | {"id", "pk"}
    columns = {f.name for f in meta.concrete_fields} | {f.attname for f in meta.concrete_fields}
    columns |= {"id", "pk"}
    for column in options.fields.values():
        if column not in columns:
            raise ValueError(f"{meta.label} has no column {column!r} to announce")
    for fk_name in options.cascade:
        if fk_name not in own:
            raise ValueError(f"{meta.label} has no foreign key {fk_name!r} to cascade from")
    if options.user_field is None and options.scope_field not in own:
        raise ValueError(f"{meta.label} has no scope field {options.scope_field!r}")


def is_generic_fk(model: type[models.Model], name: str) -> bool:
    from django.contrib.contenttypes.fields import GenericForeignKey

    return isinstance(getattr(model, name, None), GenericForeignKey)


def register(options: ModelOptions) -> None:
    """Record ``options`` and connect its model's receivers."""
    from realtime import receivers

    global _subscribable
    _by_model[options.model] = options
    _by_name.setdefault(options.name, []).append(options)
    _subscribable = None
    receivers.connect(options.model)


def unregister(model: type[models.Model]) -> None:
    """Forget a decorated model and disconnect it (tests declare models of their own)."""
    from realtime import receivers

    global _subscribable
    options = _by_model.pop(model, None)
    _subscribable = None
    if options is not None:
        _by_name[options.name].remove(options)
        if not _by_name[options.name]:
            del _by_name[options.name]
        receivers.disconnect(model)


def options_for(model: type[models.Model]) -> ModelOptions | None:
    """Return the options a model announces with: its own, or a decorated ancestor's."""
    for klass in model.__mro__:
        found = _by_model.get(klass)
        if found is not None:
            return found
    return None


def options_named(name: str) -> ModelOptions | None:
    """Return the options of the model announcing as ``name``, if any."""
    found = _by_name.get(name)
    return found[0] if found else None


def all_options() -> list[ModelOptions]:
    return [options for group in _by_name.values() for options in group]


def duplicate_names() -> dict[str, list[ModelOptions]]:
    return {name: group for name, group in _by_name.items() if len(group) > 1}


_subscribable: frozenset[str] | None = None


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


def _connect_subclass(sender: type[models.Model], **kwargs: Any) -> None:
    # A proxy or multi-table child defined after its decorated parent announces like it.
    if sender not in _by_model and options_for(sender) is not None:
        from realtime import receivers

        receivers.connect(sender)


class_prepared.connect(_connect_subclass, dispatch_uid="realtime.registry.subclasses")
