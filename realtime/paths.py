"""Lookup paths through relations, written with ``.`` or ``__`` alike.

``REALTIME_SCOPE_MEMBERS``, ``REALTIME_RECHECK_MODELS``, ``user_field`` and ``shared_via`` all
name a walk from one model to another through foreign keys, many-to-many fields and reverse
relations. This module resolves such a walk once, at check time or first use.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeGuard

from django.core.exceptions import FieldDoesNotExist
from django.db import connections, models

from realtime.chunks import chunked
from realtime.collations import loose_key
from realtime.encoding import id_order, normal_id, sorted_ids
from realtime.primary import on_primary


def split_path(path: str) -> list[str]:
    """Split ``"a.b__c"`` into ``["a", "b", "c"]``."""
    return [part for part in path.replace("__", ".").split(".")]


def to_lookup(path: str) -> str:
    """Write a path the way the ORM's ``filter()`` expects it."""
    return "__".join(split_path(path))


def resolve_path(
    model: type[models.Model], path: str
) -> list[models.Field | models.ForeignObjectRel]:  # type: ignore[type-arg]
    """Return the relation fields a path walks through from ``model``.

    Raise ``ValueError`` naming the first part that is empty, unknown, or not a relation
    (only the last part of a path may be a plain column).
    """
    parts = split_path(path)
    fields: list[models.Field | models.ForeignObjectRel] = []  # type: ignore[type-arg]
    current: type[models.Model] | None = model
    for index, part in enumerate(parts):
        if not part:
            raise ValueError(f"{path!r} has an empty part")
        if current is None:
            raise ValueError(f"{parts[index - 1]!r} in {path!r} is not a relation")
        try:
            field = current._meta.get_field(part)
        except FieldDoesNotExist as exc:
            raise ValueError(f"{current._meta.label} has no field {part!r} ({path!r})") from exc
        fields.append(field)
        related = field.related_model
        current = related if isinstance(related, type) else None
    return fields


def path_target(model: type[models.Model], path: str) -> type[models.Model] | None:
    """Return the model a path ends on, or ``None`` when it ends on a plain column."""
    related = resolve_path(model, path)[-1].related_model
    return related if isinstance(related, type) else None


def is_foreign_key(field: Any) -> TypeGuard[models.ForeignKey[Any, Any]]:
    """Whether ``field`` is a key on the row naming one row of another model: a
    ``ForeignKey``, or a ``OneToOneField``, which Django derives from it but marks
    ``one_to_one`` rather than ``many_to_one``. Not the reverse side of either, nor a
    generic foreign key: they hold no column of the row."""
    return bool(field.concrete and (field.many_to_one or field.one_to_one))


def key_lookup(model: type[models.Model], path: str) -> str:
    """The lookup reading the primary keys of the rows ``path`` reaches from ``model``: with
    ``__pk`` where it ends on a model, since a key declared with ``to_field`` (in a foreign
    key or a through model) holds another column's values. Django leaves out the join to the
    last table where the key is the primary one."""
    lookup = to_lookup(path)
    return lookup if path_target(model, path) is None else f"{lookup}__pk"


def values_on_path(instance: models.Model, path: str, using: str | None = None) -> list[Any]:
    """The ids ``path`` reaches from ``instance``, sorted: a one-hop foreign key is read from
    the instance, a longer path costs one query (on ``using``, else where its writes go), and
    so does a one-hop key the instance was loaded without (``only()``, ``defer()``): a key
    not loaded is not a key that names nobody. An empty hop reaches nothing."""
    parts = split_path(path)
    first: Any = instance._meta.get_field(parts[0])
    direct = is_foreign_key(first)
    loaded = direct and first.attname in instance.__dict__
    if len(parts) == 1 and loaded and first.target_field.primary_key:
        value = instance.__dict__[first.attname]
        return [] if value is None else [value]
    lookup = key_lookup(type(instance), path)
    ids = (
        on_primary(type(instance), using, base=True)
        .filter(pk=instance.pk)
        .order_by()
        .values_list(lookup, flat=True)
    )
    return sorted_ids(value for value in ids if value is not None)


#: Values of a key read in one statement by ``pks_by_value``.
VALUES_PER_STATEMENT = 500


def holds_target_pk(field: Any) -> bool:
    """Whether the foreign key ``field`` holds its target's primary key, as a key does unless
    declared with ``to_field`` naming another column."""
    return bool(field.target_field.primary_key)


def target_pks(field: Any, values: Iterable[Any], using: str | None = None) -> dict[Any, Any]:
    """The primary key of the row each of ``values`` names, held in the foreign key ``field``,
    by ``normal_id`` of the value. Audiences and record channels name rows by primary key,
    and a key declared with ``to_field`` (``ForeignKey(User, to_field="username")``) holds
    another column's values: those are looked up (``pks_by_value``). A key holding the
    primary key (every key not declared so) is its own answer: no statement. ``None``, and a
    value naming no row (a key without a constraint), name nothing."""
    if holds_target_pk(field):
        return {normal_id(value): value for value in values if value is not None}
    return pks_by_value(field.related_model, field.target_field.attname, values, using)


def pks_by_value(
    model: type[models.Model], column: str, values: Iterable[Any], using: str | None = None
) -> dict[Any, Any]:
    """The primary key of the row of ``model`` whose unique ``column`` holds each of
    ``values``, by ``normal_id`` of the value given: read on ``using`` (else where the
    model's writes go), one statement per 500 values. The database matches by its own
    equality, and on MySQL and MariaDB a text column's collation takes ``"ANN"`` or
    ``"ann "`` for the ``"ann"`` the row holds and answers ``"ann"``: for a value the answer
    does not hold as given, when a row of the answer may be the one it names
    (``loose_key``), the database is asked for that value alone. Elsewhere a value names the
    row holding it exactly; ``None`` names nothing."""
    wanted = {normal_id(value): value for value in values if value is not None}
    rows = on_primary(model, using, base=True).order_by()
    stored: dict[Any, Any] = {}
    for chunk in chunked(sorted(wanted.values(), key=id_order), VALUES_PER_STATEMENT):
        pairs = rows.filter(**{f"{column}__in": chunk}).values_list(column, "pk")
        stored.update((normal_id(value), pk) for value, pk in pairs)
    found = {key: stored[key] for key in wanted if key in stored}
    if len(found) == len(wanted) or not collates_text(model, column, rows.db):
        return found
    for key, value in wanted.items():
        if key not in found and (pk := _taken_for(rows, column, value, stored)) is not None:
            found[key] = pk
    return found


def collates_text(model: type[models.Model], column: str, using: str) -> bool:
    """Whether the database of ``using`` compares ``model``'s ``column`` by a collation that
    may take one text for another (MySQL, MariaDB: case- and accent-insensitive, blind to
    trailing spaces), where PostgreSQL and SQLite compare text as Python does."""
    field = model._meta.get_field(column)
    held = column_values_field(field) if isinstance(field, models.Field) else None
    is_text = isinstance(held, models.CharField | models.TextField)
    return is_text and connections[using].vendor == "mysql"


def _taken_for(
    rows: models.QuerySet[Any, Any], column: str, value: Any, stored: dict[Any, Any]
) -> Any:
    """The primary key of the row the database matches the text ``value`` to, asked of it
    for ``value`` alone, when a row it answered (``stored``: primary keys by the text their
    ``column`` holds) may be that row: its text shares ``value``'s ``loose_key``, or either
    has none. ``None`` for none."""
    if not isinstance(value, str):
        return None
    key = loose_key(value)
    if not any(
        isinstance(held, str) and (key is None or loose_key(held) in (key, None)) for held in stored
    ):
        return None
    return rows.filter(**{column: value}).values_list("pk", flat=True).first()


def target_pk(field: Any, value: Any, using: str | None = None) -> Any:
    """The primary key of the row ``value``, held in the foreign key ``field``, names
    (``target_pks``); ``None`` when it names none."""
    return None if value is None else target_pks(field, [value], using).get(normal_id(value))


def key_fields(model: type[models.Model]) -> list[Any]:
    """The fields of ``model``'s primary key: several for a composite key."""
    pk = model._meta.pk
    return list(getattr(pk, "fields", None) or [pk])


def column_values_field(field: models.Field[Any, Any]) -> models.Field[Any, Any] | None:
    """The field whose values a column holds: a foreign key's target field, followed to the
    end (a key to a key). ``None`` when a relation names no target field yet."""
    while field.is_relation:
        target = getattr(field, "target_field", None)
        if target is None:
            return None
        field = target
    return field


def source_key(field: Any) -> Any:
    """The foreign key of a many-to-many's through model that points at the model declaring
    the many-to-many (``through_fields`` names it; else the first to that model)."""
    return _through_key(field, 0, field.model)


def target_key(field: Any) -> Any:
    """The foreign key of a many-to-many's through model that points at its target model."""
    return _through_key(field, 1, field.related_model)


def _through_key(field: Any, side: int, model: Any) -> Any:
    through = field.remote_field.through
    names = field.remote_field.through_fields
    if names:
        return through._meta.get_field(names[side])
    keys = [
        f for f in through._meta.concrete_fields if is_foreign_key(f) and f.related_model == model
    ]
    # A many-to-many to its own model has two keys to it: the source first, the target next.
    return keys[side if len(keys) > 1 and field.model == field.related_model else 0]


#: What a field class overrides to hold, read, write or store its values otherwise than the
#: Django field class it derives from: the instance's attribute (``descriptor_class``), what
#: a read gives (``from_db_value``, ``get_db_converters``), what a value given is taken as
#: (``to_python``), what is written (``get_prep_value`` and the two after it), the
#: column (``db_type``: ``citext`` compares case-insensitively), and what the field puts on
#: its model (``contribute_to_class``: older fields install their own descriptor there).
VALUE_HOOKS = (
    "contribute_to_class",
    "descriptor_class",
    "from_db_value",
    "get_db_converters",
    "to_python",
    "get_prep_value",
    "get_db_prep_value",
    "get_db_prep_save",
    "db_type",
)


def value_hooks(field: models.Field[Any, Any]) -> tuple[str, ...]:
    """The ``VALUE_HOOKS`` ``field``'s class overrides: none for a class of Django's, nor for a
    subclass of the application's that changes something else only (``formfield``,
    ``deconstruct``, a default ``max_length``); some for one whose values are not what its
    ``get_internal_type()`` says (a ``CharField`` holding a list, as django-multiselectfield's
    does, a ``TextField`` an object it keeps as JSON text)."""
    kind, django = type(field), _django_class(type(field))
    return tuple(
        hook for hook in VALUE_HOOKS if getattr(kind, hook, None) is not getattr(django, hook, None)
    )


def django_field_class(field: models.Field[Any, Any]) -> type[models.Field[Any, Any]] | None:
    """The class of Django's whose values ``field`` holds, read and writes: its own, or the
    one it derives from when its class overrides no ``value_hooks``; ``None`` otherwise."""
    return None if value_hooks(field) else _django_class(type(field))


def _django_class(kind: type[Any]) -> type[models.Field[Any, Any]]:
    """The first field class of Django's among ``kind``'s bases (``kind`` itself, if it is)."""
    return next(
        base
        for base in kind.__mro__
        if issubclass(base, models.Field) and base.__module__.split(".")[0] == "django"
    )
