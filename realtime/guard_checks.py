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
from collections.abc import Callable, Mapping
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


def in_process(model: type[models.Model], condition: Any) -> tuple[Check, frozenset[str]] | None:
    """``condition`` (a guard's answer for one account) as a check of a row's columns, and
    the ``attname`` of each column it reads; ``None`` when the database must decide."""
    tree = q_tree(condition)
    if tree is None:
        return None
    connector, negated, children = tree
    if not children:
        return _always, frozenset()  # Django filters nothing for an empty Q, negated or not
    if connector not in (models.Q.AND, models.Q.OR):
        return None
    parts = []
    for child in children:
        part = (
            _lookup(model, child)
            if isinstance(child, tuple) and len(child) == 2
            else in_process(model, child)
        )
        if part is None:
            return None
        parts.append(part)
    checks = [check for check, _ in parts]
    columns = frozenset().union(*(read for _, read in parts))
    joined = _all(checks) if connector == models.Q.AND else _any(checks)
    return (_not(joined) if negated else joined), columns


def _always(row: Mapping[str, Any]) -> bool:
    return True


def _all(checks: list[Check]) -> Check:
    return lambda row: all(check(row) for check in checks)


def _any(checks: list[Check]) -> Check:
    return lambda row: any(check(row) for check in checks)


def _not(check: Check) -> Check:
    return lambda row: not check(row)


def _lookup(
    model: type[models.Model], pair: tuple[Any, Any]
) -> tuple[Check, frozenset[str]] | None:
    key, value = pair
    if not isinstance(key, str):
        return None
    name, _, lookup = key.partition("__")
    lookup = lookup or "exact"
    field = _column(model, name)
    if field is None or lookup not in ("exact", "in", "isnull"):
        return None
    column = field.attname
    if lookup == "isnull" or (lookup == "exact" and value is None):
        wanted = True if lookup == "exact" else value
        if not isinstance(wanted, bool):
            return None
        return (lambda row: (row[column] is None) is wanted), frozenset([column])
    if lookup == "exact":
        read = _value(field, value)
        if read is None:
            return None
        return (lambda row: row[column] == read), frozenset([column])
    if not isinstance(value, list | tuple | set | frozenset) or None in value:
        return None  # None in a list: dropped by Django up to 6.0, matching NULL from 6.1
    values = [_value(field, item) for item in value]
    if any(item is None for item in values):
        return None
    allowed = frozenset(values)
    return (lambda row: row[column] in allowed), frozenset([column])


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
