"""JSON forms shared by every process: of values (dates, decimals, UUIDs) and of id lists.

Internal messages travel between processes and frames go to clients, so a value must have
one JSON form whoever writes it: compact, non-ASCII kept as is, dates in ISO 8601 with aware
values in UTC (``+00:00``, microseconds kept; not Django's encoder, which writes ``Z`` and cuts
to milliseconds), durations in ISO 8601 as Django writes them (``P1DT02H00M00S``), ``Decimal``
and ``UUID`` as strings, bytes as base64, a range (a PostgreSQL range field's) as its bounds.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import decimal
import json
import math
import uuid
from collections.abc import Iterable
from typing import Any, TypeGuard

from django.core.exceptions import ValidationError
from django.db.models import Model
from django.utils.duration import duration_iso_string
from django.utils.functional import Promise

#: Types JSON holds as they are; looked up by exact type first (ids are read in every batch).
_AS_IS = frozenset({str, int, float, bool, list, dict, type(None)})


def jsonable(value: Any) -> Any:
    """Return a value JSON can hold: ISO 8601 dates (UTC when aware), text for the rest."""
    if type(value) in _AS_IS or isinstance(value, str | int | float | bool | list | dict):
        return value
    if isinstance(value, datetime.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(datetime.UTC)
        return value.isoformat()
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return duration_iso_string(value)
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, tuple):  # a composite primary key: its values, in the key's order
        return [jsonable(part) for part in value]
    if is_range(value):
        return _range_form(value)
    return str(value)


def is_range(value: Any) -> bool:
    """Whether ``value`` is a range as psycopg and psycopg2 read PostgreSQL's (told by what
    both have, without importing either)."""
    return all(hasattr(value, name) for name in ("isempty", "lower", "upper", "lower_inc"))


def _range_form(value: Any) -> dict[str, Any]:
    """A range as Django's serializers write it, its bounds in their JSON forms: ``{"lower":
    1, "upper": 5, "bounds": "[)"}`` (``None``: unbounded), or ``{"empty": true}``. Its bounds
    as given: PostgreSQL keeps an integer or a date range as ``[)``, so the ``[1, 5]`` written
    is ``[1, 6)`` when read back, the same range."""
    if value.isempty:
        return {"empty": True}
    bounds = ("[" if value.lower_inc else "(") + ("]" if value.upper_inc else ")")
    return {"lower": jsonable(value.lower), "upper": jsonable(value.upper), "bounds": bounds}


def encoded(value: Any, encoder: type[json.JSONEncoder] | None) -> Any:
    """The value of a ``JSONField`` with an encoder or a decoder of its own, as the row holds
    it: written by the field's ``encoder`` (``None``: JSON's own), as Django writes it, and
    read back: a ``Point`` the encoder writes ``{"x": 1, "y": 2}`` is that, not its text, and
    a date is what the encoder makes of it. A value the encoder refuses, which no write could
    store, is ``jsonable``'s."""
    if value is None:
        return None
    try:
        return json.loads(json.dumps(value, cls=encoder))
    except Exception:  # the application's encoder may raise anything
        return jsonable(value)


def strict_jsonable(value: Any, where: str = "") -> Any:
    """``jsonable`` for a structure application code hands over (a model's ``payload=``):
    lists, tuples and dicts walked, each value in the form ``jsonable`` gives it; a value
    with no JSON form (an object, a set, a key that is not text, a float JSON cannot write)
    raises ``TypeError`` naming where it is, instead of being sent as its text."""
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TypeError(f"{where or 'the value'}: {value!r} has no JSON form")
        return value
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where or 'a dict'} has a key that is not text: {key!r}")
            out[key] = strict_jsonable(item, f"{where}.{key}" if where else key)
        return out
    if isinstance(value, list | tuple):
        return [strict_jsonable(item, f"{where}[{index}]") for index, item in enumerate(value)]
    if isinstance(value, _JSONABLE) or is_range(value):
        return jsonable(value)
    raise TypeError(f"{where or 'the value'}: a {type(value).__name__} has no JSON form")


#: Values ``jsonable`` gives a JSON form of their own, and lazy text (all else it writes as
#: text, which ``strict_jsonable`` refuses).
_JSONABLE = (
    datetime.date,
    datetime.time,
    datetime.timedelta,
    decimal.Decimal,
    uuid.UUID,
    bytes,
    bytearray,
    memoryview,
    Promise,
)


def record_channel(name: str, pk: Any) -> str:
    """The channel of one record: ``contact:42``; for a composite key the values joined by
    commas, ``line:12,3`` — what ``String([12, 3])`` gives in JavaScript, so a client builds
    it from the ``id`` it was sent."""
    if isinstance(pk, tuple | list):
        return f"{name}:{','.join(_as_text(part) for part in pk)}"
    return f"{name}:{pk}"


def _as_text(part: Any) -> str:
    """One value of a composite key as JavaScript's ``String()`` writes it in an array."""
    value = jsonable(part)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


#: ``json.dumps`` with these options would build an encoder at every call.
_ENCODER = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, default=jsonable, allow_nan=False
)


def encode(message: Any) -> bytes:
    """Encode compactly, non-ASCII kept as UTF-8; floats JSON cannot hold as ``null``."""
    return dumps(message, _ENCODER).encode("utf-8")


def dumps(value: Any, encoder: json.JSONEncoder) -> str:
    """``encoder.encode(value)`` (an encoder made with ``allow_nan=False``), with every float
    JSON cannot hold (``NaN``, ``Infinity``: a float column, a ``JSONField`` may hold them)
    written ``null``, as JavaScript's ``JSON.stringify`` writes them. Python would write
    ``NaN``, which no client's JSON parser reads: the whole frame would be lost. The values
    are walked only when the first try finds such a float."""
    try:
        return encoder.encode(value)
    except ValueError:
        return encoder.encode(_finite(value))


def _finite(value: Any) -> Any:
    """``value`` with its non-finite floats as ``None``, lists, tuples and dicts walked."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def normal_id(value: Any) -> Any:
    """The one form an id takes wherever it is compared: its JSON form (``42``, ``"42"``,
    ``"6f1c…"`` for a UUID), so ids read from rows, from messages and from other processes
    compare equal. Ids application code gives go through ``key_of`` first."""
    return jsonable(value)


def key_of(model: type[Model], value: Any) -> Any:
    """``normal_id`` of ``value`` read as a primary key of ``model``: by its primary key
    field's ``to_python``, so an id application code gives as text (``"3"`` for an integer
    key, a UUID in capitals) compares equal to the same id read from a row. A value the field
    cannot read names no row of the model: it keeps its own form."""
    if value is None:
        return None
    with contextlib.suppress(ValidationError, TypeError, ValueError):
        value = model._meta.pk.to_python(value)
    return normal_id(value)


def sorted_ids(ids: Iterable[Any]) -> list[Any]:
    """Normalise, deduplicate and sort ids (integers by value; other ids by their text)."""
    return sorted({normal_id(value) for value in ids}, key=id_order)


def id_order(value: Any) -> tuple[int, Any]:
    """Sort key for ids: integers by value; text, UUIDs and composite keys by their text."""
    return (0, value) if isinstance(value, int) else (1, str(value))


def storable(value: Any) -> TypeGuard[str]:
    """Whether ``value`` is text every database can take as a parameter.

    JSON lets a client send a lone UTF-16 surrogate (``"\\ud800"``), which no UTF-8 driver
    can encode, and a NUL character, which PostgreSQL refuses in text: no slug, channel or
    token holds either, so such a string is read as naming nothing, before any hook or query
    sees it.
    """
    if not isinstance(value, str) or "\x00" in value:
        return False
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def row_key(pk: Any) -> Any:
    """A primary key as a dict key, whatever form it came in (a UUID or its text, a composite
    key as a tuple or as its JSON array)."""
    value = normal_id(pk)
    return tuple(value) if isinstance(value, list) else value
