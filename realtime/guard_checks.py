"""A guard's answer decided in process, for the guards whose SQL a few column values decide.

``realtime.audience`` asks which accounts a guard lets read a row. The database answers
with one ``Exists`` subquery per account, so a row of a workspace of 1,000 members costs
five statements that Django spends most of a second compiling. Most guards are a few
lookups on the model's own columns, ``Q(private=False) | Q(assignee=user)``: for those, the
rows' columns are read once and each account's ``Q`` is evaluated here, to the answer the
database gives for the SQL Django makes of it.

What is decided here, and nothing else (the rest goes to the database, as before):

* ``Q`` objects joined by ``AND`` or ``OR``, negated or not, down to ``(lookup, value)``
  pairs;
* a lookup of a concrete column of the model, by its name or its ``attname`` (``"pk"`` too),
  whose values are booleans, integers or UUIDs (a foreign key to such a key included): no
  text (collations), dates (time zones), decimals or floats;
* ``exact`` (``None``: ``isnull``), ``in`` and ``isnull``, with values of those types or
  model instances (a foreign key's related row, compared by the key it points at).

NULL as the database has it: no ``exact`` or ``in`` matches a NULL column. Django makes a
negated ``exact`` or ``in`` on a nullable column ``NOT (col = v AND col IS NOT NULL)``, which
keeps the NULL rows: so does ``not`` here. An empty ``in`` matches nothing (Django's
``EmptyResultSet``), and an empty ``Q`` everything. An ``in`` list holding ``None`` is left to
the database: Django dropped it from the list up to 6.0, and matches NULL with it from 6.1.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.db import models

from realtime.compat.django_orm import q_tree
from realtime.paths import column_values_field

#: Whether a row (its column values by ``attname``) passes.
Check = Callable[[Mapping[str, Any]], bool]

#: The column types whose equality Python and every database agree on.
_EXACT_TYPES = (models.BooleanField, models.IntegerField, models.UUIDField)
_SCALARS = (bool, int, uuid.UUID, str)


#: A check of a form's leaves filled in: built from their values (``None``: the database
#: must decide, for one of them).
Build = Callable[[Iterator[Any]], Check | None]

#: The forms of guards' answers compiled, by shape (``in_process``'s ``forms``).
Forms = dict[Any, tuple[Build, frozenset[str]] | None]


def in_process(
    model: type[models.Model], condition: Any, forms: Forms | None = None
) -> tuple[Check, frozenset[str]] | None:
    """``condition`` (a guard's answer for one account) as a check of a row's columns, and
    the ``attname`` of each column it reads; ``None`` when the database must decide.

    A guard's answers for many accounts differ in their values alone (``Q(assignee=user)``):
    each form (the tree of lookups, without the values) is compiled once into ``forms``, given
    by a caller that asks about many accounts of ``model``; each answer then costs the
    conversion of its values."""
    values: list[Any] = []
    shape = _shape(condition, values)
    if shape is None:
        return None
    if forms is None:
        forms = {}
    if shape not in forms:
        forms[shape] = _compile(model, shape)
    compiled = forms[shape]
    if compiled is None:
        return None
    build, columns = compiled
    check = build(iter(values))
    return None if check is None else (check, columns)


def _shape(condition: Any, values: list[Any]) -> Any:
    """``condition``'s form: its connectors, negations and lookups, in a hashable tree, its
    values appended to ``values`` in order; ``None`` for what is no tree of ``Q`` objects and
    ``(lookup, value)`` pairs."""
    tree = q_tree(condition)
    if tree is None:
        return None
    connector, negated, children = tree
    parts = []
    for child in children:
        if isinstance(child, tuple) and len(child) == 2:
            if not isinstance(child[0], str):
                return None
            parts.append(child[0])
            values.append(child[1])
            continue
        part = _shape(child, values)
        if part is None:
            return None
        parts.append(part)
    return connector, negated, tuple(parts)


def _compile(model: type[models.Model], shape: Any) -> tuple[Build, frozenset[str]] | None:
    """A form (``_shape``) as a builder of checks from its values, and the columns they
    read; ``None`` when the database must decide every answer of this form."""
    connector, negated, parts = shape
    if not parts:
        # Django filters nothing for an empty Q, negated or not.
        return (lambda values: _always), frozenset()
    if connector not in (models.Q.AND, models.Q.OR):
        return None
    compiled = []
    for part in parts:
        one = _leaf(model, part) if isinstance(part, str) else _compile(model, part)
        if one is None:
            return None
        compiled.append(one)
    builds = [build for build, _ in compiled]
    columns = frozenset().union(*(read for _, read in compiled))
    join = _all if connector == models.Q.AND else _any

    def build(values: Iterator[Any]) -> Check | None:
        checks = []
        for part in builds:
            check = part(values)
            if check is None:
                return None
            checks.append(check)
        joined = checks[0] if len(checks) == 1 else join(checks)
        return _not(joined) if negated else joined

    return build, columns


def _always(row: Mapping[str, Any]) -> bool:
    return True


def _all(checks: list[Check]) -> Check:
    return lambda row: all(check(row) for check in checks)


def _any(checks: list[Check]) -> Check:
    return lambda row: any(check(row) for check in checks)


def _not(check: Check) -> Check:
    return lambda row: not check(row)


def _leaf(model: type[models.Model], key: str) -> tuple[Build, frozenset[str]] | None:
    """The lookup ``key`` as a builder of its check from its value, and the column it reads;
    ``None`` for a lookup the database must decide."""
    name, _, lookup = key.partition("__")
    lookup = lookup or "exact"
    field = _column(model, name)
    if field is None or lookup not in ("exact", "in", "isnull"):
        return None
    column = field.attname

    def build(values: Iterator[Any]) -> Check | None:
        value = next(values)
        if lookup == "isnull" or (lookup == "exact" and value is None):
            wanted = True if lookup == "exact" else value
            if not isinstance(wanted, bool):
                return None
            return lambda row: (row[column] is None) is wanted
        if lookup == "exact":
            read = _value(field, value)
            if read is None:
                return None
            return lambda row: row[column] == read
        if not isinstance(value, list | tuple | set | frozenset) or None in value:
            return None  # None in a list: dropped by Django up to 6.0, matching NULL from 6.1
        items = [_value(field, item) for item in value]
        if any(item is None for item in items):
            return None
        allowed = frozenset(items)
        return lambda row: row[column] in allowed

    return build, frozenset([column])


def _column(model: type[models.Model], name: str) -> models.Field[Any, Any] | None:
    """The concrete column ``name`` names (a field's name or attname, or ``pk``), when its
    values are of the types compared here; ``None`` otherwise."""
    meta = model._meta
    try:
        field: Any = meta.pk if name == "pk" else meta.get_field(name)
    except FieldDoesNotExist:
        field = next((f for f in meta.concrete_fields if f.attname == name), None)
    if field is None or not getattr(field, "concrete", False) or field.many_to_many:
        return None
    if isinstance(column_values_field(field), _EXACT_TYPES):
        return field  # type: ignore[no-any-return]
    return None


def _value(field: models.Field[Any, Any], value: Any) -> Any:
    """``value`` as the column holds it (``None``: the database must compare it)."""
    target = column_values_field(field)
    if isinstance(value, models.Model):
        if not field.is_relation or not isinstance(value, field.related_model):  # type: ignore[arg-type]
            return None
        remote = getattr(field, "target_field", None)
        value = None if remote is None else getattr(value, remote.attname, None)
        if remote is None or value is None:
            return None  # an unsaved row: Django refuses it, and so will the database path
        return _value(remote, value)
    return _scalar(target, value)


def _scalar(target: models.Field[Any, Any] | None, value: Any) -> Any:
    if target is None or not isinstance(value, _SCALARS):
        return None
    if isinstance(target, models.BooleanField) and not isinstance(value, bool):
        return None  # Django would send what it was given, and the database decide
    try:
        return target.to_python(value)
    except (ValidationError, TypeError, ValueError):
        return None
