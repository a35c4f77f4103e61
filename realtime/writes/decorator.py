"""``@realtime_model``: declare that the writes of a model are announced.

The decorator validates its options at decoration time (a typo fails at import, not in
production), records them in ``realtime.registry``, and connects the model's receivers with
``sender=`` that model only, so undecorated models keep Django's fast delete path. Proxy models
and multi-table children of a decorated model announce with their parent's options. Paths are
resolved lazily, on first use, because related models may not exist yet when it runs.
"""

from __future__ import annotations

import difflib
import re
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from django.apps import apps
from django.core import checks
from django.db import models
from django.db.models import Q
from django.db.models.signals import class_prepared

from realtime import registry
from realtime.conf import conf
from realtime.registry import ACTIONS, ModelOptions, default_name
from realtime.writes import querysets, receivers

ModelT = TypeVar("ModelT", bound=type[models.Model])


def realtime_model(
    *,
    create: bool = True,
    update: bool = True,
    delete: bool = True,
    fields: Sequence[str] | Mapping[str, str] | None = None,
    relations: Sequence[str] | None = None,
    scope_field: str | None = "workspace",
    user_field: str | None = None,
    guard: Callable[[Any], Q] | None = None,
    guard_fields: Sequence[str] | None = None,
    shared_via: str | None = None,
    cascade: Sequence[str] | None = None,
    name: str | None = None,
    payload: Callable[[Any], Mapping[str, Any]] | None = None,
    filters: Sequence[str] | None = None,
    **unknown: Any,
) -> Callable[[ModelT], ModelT]:
    """Declare that writes of the decorated model are announced; docs/models.md lists the options.

    Unknown options and values of the wrong shape raise ``ValueError`` here, at import time.
    """
    if unknown:
        raise ValueError(f"unknown @realtime_model option(s): {', '.join(sorted(unknown))}")
    if any(isinstance(names, str) for names in (fields, relations, cascade, guard_fields, filters)):
        raise ValueError(
            "fields, relations, cascade, guard_fields and filters take a list of names, "
            "not a string"
        )
    if guard_fields is not None and guard is None:
        raise ValueError("guard_fields names what a guard reads: give a guard too")
    if guard is not None and not callable(guard):
        raise ValueError("guard must be a callable taking a user and returning a Q")
    if payload is not None and not callable(payload):
        raise ValueError("payload must be a callable taking the instance and returning a dict")
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
        if model._meta.abstract:
            raise TypeError(_ABSTRACT.format(label=model._meta.label, name=model.__name__))
        options = registry.options_of(
            model,
            name=name or default_name(model),
            actions=actions,
            fields=field_map,
            relations=tuple(relations or ()),
            scope_field=scope_field,
            user_field=user_field,
            guard=guard,
            shared_via=shared_via,
            cascade=tuple(cascade or ()),
            guard_fields=None if guard_fields is None else tuple(guard_fields),
            payload=payload,
            filters=_own_fields(model, filters or ()),
            declared_filters=tuple(dict.fromkeys(filters or ())),
        )
        _validate_columns(options)
        register(options)
        return model

    return decorate


#: An abstract model has no table and no managers, and its concrete children would share its
#: one wire name: each child is decorated instead (with a ``name=`` of its own where needed).
_ABSTRACT = (
    "@realtime_model decorates concrete models: {label} is abstract. Decorate each concrete "
    "model that inherits from {name} instead."
)


def _own_fields(model: type[models.Model], names: Sequence[str]) -> tuple[str, ...]:
    """The names of ``filters=`` that name a field of the model itself, each once. The others
    (a relation path, a name the model lacks) are the system check's to report
    (``realtime.E050``), with a hint, rather than an error at import; live queries never
    see them."""
    own = {field.name for field in _forward_fields(model)}
    return tuple(name for name in dict.fromkeys(names) if name in own)


def _forward_fields(model: type[models.Model]) -> list[Any]:
    meta = model._meta
    return [*meta.fields, *meta.many_to_many, *meta.private_fields]


def _validate_columns(options: ModelOptions) -> None:
    """Check the names that live on the model itself.

    Only forward fields exist when a decorator runs; relations may also name reverse
    relations, which the system checks verify once every model is loaded.
    """
    meta = options.model._meta
    own = {f.name for f in _forward_fields(options.model)} | {"id", "pk"}
    columns = {f.name for f in meta.concrete_fields} | {f.attname for f in meta.concrete_fields}
    columns |= {"id", "pk"}
    for column in options.fields.values():
        if column not in columns:
            raise ValueError(_unknown(meta.label, "column", column, columns, " to announce"))
    keys = {"pk", "id", meta.pk.name, meta.pk.attname}  # ("id": the key, as read)
    for key, column in options.fields.items():
        if key == "model" or (key == "id" and column not in keys):
            raise ValueError(
                f"{meta.label}: fields may not announce {column!r} as {key!r}: every event's "
                f"data names its record with 'model' and 'id' (give the column another key)"
            )
    for name in options.guard_fields or ():
        if name not in own:
            raise ValueError(_unknown(meta.label, "field", name, own, " for guard_fields"))
    for fk_name in options.cascade:
        if fk_name not in own:
            raise ValueError(_unknown(meta.label, "foreign key", fk_name, own, " to cascade from"))
    scoped = options.user_field is None and options.scope_field is not None
    if scoped and options.scope_field not in own:
        raise ValueError(
            _unknown(meta.label, "scope field", options.scope_field, own, _scope_hint(meta.label))
        )


def _scope_hint(label: str) -> str:
    """What to declare instead of a scope field the model lacks. The scope model itself is
    scoped by its own key: told "global", a newcomer decorating it would announce every
    scope to every signed-in account."""
    scope_label = conf.SCOPE_MODEL
    if scope_label is not None and scope_label.lower() == label.lower():
        return ' (the scope model is scoped by its own key: scope_field="id")'
    return " (a model read by every signed-in account declares scope_field=None)"


def _unknown(label: str, kind: str, name: Any, choices: set[str], purpose: str) -> str:
    """The error of a name the model lacks, worded as Django's ``FieldError`` words one: the
    closest of the model's names when one is close, and the names to choose from."""
    names = sorted(choices - {"pk"})
    close = difflib.get_close_matches(str(name), names, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return f"{label} has no {kind} {name!r}{purpose}.{hint} Choices are: {', '.join(names)}."


#: The proxies and multi-table children defined after a decorated ancestor, which announce
#: like it: forgetting the ancestor disconnects them, recording it again connects them again.
_subclasses: weakref.WeakSet[type[models.Model]] = weakref.WeakSet()


def register(options: ModelOptions) -> None:
    """Record ``options`` and connect its model's receivers (and its subclasses')."""
    registry.record(options)
    receivers.connect(options.model)
    querysets.install(options.model)
    for subclass in list(_subclasses):
        if issubclass(subclass, options.model) and not registry.is_recorded(subclass):
            receivers.connect(subclass)  # connected once, however often it is asked


def unregister(model: type[models.Model]) -> None:
    """Forget a decorated model and disconnect it and the subclasses that announced like it
    (tests and benchmarks turn models off). A receiver left connected outlives its class: on
    Django 5.2 it then fires for a class later made at the same address as well."""
    if registry.forget(model) is None:
        return
    receivers.disconnect(model)
    for subclass in list(_subclasses):
        if issubclass(subclass, model) and registry.options_for(subclass) is None:
            receivers.disconnect(subclass)


def _connect_subclass(sender: type[models.Model], **kwargs: Any) -> None:
    # A proxy or multi-table child defined after its decorated parent announces like it.
    if not registry.is_recorded(sender) and registry.options_for(sender) is not None:
        _subclasses.add(sender)
        receivers.connect(sender)
        querysets.install(sender)


class_prepared.connect(_connect_subclass, dispatch_uid="realtime.registry.subclasses")


# realtime.E040: models decorated while realtime is not installed. Without "realtime" in
# INSTALLED_APPS realtime's app config never runs: none of its system checks is registered,
# its table is never migrated, and every announced write fails on the missing table (logged,
# the write itself stands). This module is what such a project imports (its models.py does),
# so the check is registered here, once; it reports only when realtime is not installed.


@checks.register()
def check_installed(app_configs: Iterable[Any] | None = None, **kwargs: Any) -> list[Any]:
    """Report decorated models when ``"realtime"`` is not in ``INSTALLED_APPS``."""
    if apps.is_installed("realtime"):
        return []
    installed = set(apps.get_models())
    labels = sorted({o.model._meta.label for o in registry.all_options() if o.model in installed})
    if not labels:
        return []
    return [
        checks.Error(
            f'"realtime" is not in INSTALLED_APPS, yet {", ".join(labels)} '
            f"{'is' if len(labels) == 1 else 'are'} decorated with @realtime_model: their "
            "writes are not announced, and each logs an error on realtime's missing table.",
            hint='Add "channels" and "realtime" to INSTALLED_APPS ("daphne" first, to serve '
            'the socket with runserver), then run "python manage.py migrate".',
            id="realtime.E040",
        )
    ]
