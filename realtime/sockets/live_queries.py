"""Live queries: a socket's filtered, ordered, limited lists of a model, kept exact.

A client asks ``query`` with a ``where`` (an AND of lookups on the model's ``filters=``
fields), an ``order_by`` and a ``limit``. The worker reads the first rows the socket's account
may read (``read_rows``: the scopes it reads, or its account for an account model, narrowed by
the guard) and keeps them as the query's *window*: keys, sort values and rows. Every message
the socket may read about a row of the model is then matched in process, against the values
of the ``filters`` columns the message carries (``meta.filters``): no statement decides
which queries a write touches. A row that starts matching and sorts into the window enters
it (pushing the last one out when the window is full); one that stops matching, or that the
account may no longer read (a delete, or a leave frame of a row leaving its view), leaves it.
A window also holds a reserve of rows past the limit (``capacity``), which the client does not
see: a row that leaves the list is replaced by the first of them, without a statement. Only
when a row leaves a window holding fewer rows than the limit, and more rows may match (it was
full when read), are the rows after it unknown here: the query is read again (one
statement), and the client is told the difference.

Gap-free: a query registered on the event loop hears every message carried out from then on.
Those carried out while its first rows are read are kept and applied on top of what was read
(a message of a write the read already saw changes nothing a second time), and only then is
``query.rows`` handed to the socket, before any ``query.diff`` of the query.

Values are compared as the database compares them: each side read by the field's
``to_python`` (datetimes made aware, or naive, as ``USE_TZ`` has the columns hold them: a
message the matcher still cannot compare makes the query read its rows again, never fails
the others), ``NULL`` matching no comparison (``exact`` with ``null`` is ``isnull``), and
sorted where the database sorts nulls (``features.nulls_order_largest``). Text is compared
for equality only: ranges and ordering by text depend on collations, which Python does not
share, and are refused. Where the database compares text by a collation (MySQL, MariaDB), a
text that differs from the one asked but that a collation may take for it
(``realtime.collations``) makes the query read its rows again.
"""

from __future__ import annotations

import asyncio
import bisect
import datetime
import decimal
import functools
import itertools
import json
import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import connections, models
from django.utils import timezone

from realtime.audience import active, guard_condition
from realtime.blocking import run_blocking, run_for_delivery
from realtime.collations import loose_key
from realtime.conf import conf
from realtime.encoding import encoded, id_order, jsonable, row_key
from realtime.guard_checks import Forms, in_process
from realtime.paths import column_values_field, key_fields, key_lookup
from realtime.primary import on_primary, primary
from realtime.registry import ModelOptions, options_named
from realtime.sockets.index import discard
from realtime.sockets.limits import log_bad_input
from realtime.sockets.protocol import encode

logger = logging.getLogger(__name__)

QUERY: Final = "query"
UNQUERY: Final = "unquery"
ROWS: Final = "query.rows"
DIFF: Final = "query.diff"
ERROR: Final = "query.error"

LOOKUPS: Final = ("exact", "in", "lt", "lte", "gt", "gte", "range", "isnull")
#: Lookups that order values: refused on text (collations).
ORDERING: Final = frozenset({"lt", "lte", "gt", "gte", "range"})
MAX_TERMS: Final = 10
MAX_IN: Final = 100
MAX_ID: Final = 64
#: Most rows a window holds past its limit, unseen by the client: what replaces a row that
#: leaves the list, without a read. Rows leave lists by the dozen: a row made private leaves
#: every other account's list at once.
RESERVE: Final = 20


class QueryRefusedError(Exception):
    """A query refused: ``reason`` goes to the client, ``cause`` to the log."""

    def __init__(self, reason: str, cause: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.cause = cause or reason


def refusal_id(data: dict[str, Any]) -> Any:
    """The ``id`` a ``query.error`` names: the one asked, when it is text."""
    found = data.get("id")
    return found if isinstance(found, str) else None


# Asking ---------------------------------------------------------------------------------------


#: The ``Term.keys`` of a term compared as Python compares: one set, shared (an empty
#: frozenset is an object of its own each time, which the garbage collector tracks).
NO_KEYS: Final[frozenset[str | None]] = frozenset()


@dataclass(frozen=True, slots=True)
class Term:
    """One lookup of ``where``: ``name`` (a ``filters`` field), ``lookup``, its value read by
    the field (a tuple for ``in``, a pair for ``range``, a bool for ``isnull``)."""

    name: str
    lookup: str
    value: Any
    #: The ``loose_key`` of each text asked (``None``: any text may be taken for it), where
    #: the database compares text by a collation (MySQL, MariaDB); empty elsewhere.
    keys: frozenset[str | None] = NO_KEYS

    def matches(self, value: Any) -> bool:
        """Whether a row's value matches; ``CollationSaysError`` when only the database's
        collation can say (a text that differs from the one asked but shares its key, or
        either has none)."""
        lookup = self.lookup
        if lookup == "isnull":
            return (value is None) is self.value
        if value is None:
            return False
        if lookup == "exact" or lookup == "in":
            if value == self.value if lookup == "exact" else value in self.value:
                return True
            keys = self.keys
            if keys and ((key := loose_key(value)) is None or key in keys or None in keys):
                raise CollationSaysError(self.name)
            return False
        if lookup == "range":
            low, high = self.value
            return bool(low <= value <= high)
        if lookup == "lt":
            return bool(value < self.value)
        if lookup == "lte":
            return bool(value <= self.value)
        if lookup == "gt":
            return bool(value > self.value)
        return bool(value >= self.value)

    def lookup_kwargs(self, attname: str) -> dict[str, Any]:
        return {f"{attname}__{self.lookup}": self.value}


@dataclass(frozen=True, slots=True)
class Shape:
    """What a query asks: the same shape is the same list for the same account."""

    options: ModelOptions
    terms: tuple[Term, ...]
    #: ``(filters name or "pk", descending)``, the primary key last.
    order: tuple[tuple[str, bool], ...]
    limit: int


def capacity(shape: Shape) -> int:
    """The rows a window of ``shape`` holds: its limit, and a reserve past it of as many rows
    again, up to ``RESERVE``. No reserve where the keys are text: which rows follow the
    limit may then be the collation's to say (``Sorting.only_keys_part``), and such rows
    are read again."""
    if has_text_key(shape.options.model):
        return shape.limit
    return shape.limit + min(shape.limit, RESERVE)


def read_query(data: dict[str, Any]) -> tuple[str, Shape]:
    """The id and shape of a ``query`` frame's data; ``QueryRefusedError`` names the reason."""
    query_id = data.get("id")
    if not isinstance(query_id, str) or not 1 <= len(query_id) <= MAX_ID:
        raise QueryRefusedError("Invalid query", "the id is not text of 1 to 64 characters")
    name = data.get("model")
    options = options_named(name) if isinstance(name, str) else None
    if options is None:
        raise QueryRefusedError("Unknown model", f"no model announces as {name!r}")
    if not options.filters:
        raise QueryRefusedError("Model is not queryable", f"{options.name} declares no filters=")
    where = data.get("where", {})
    if where is None:
        where = {}
    if not isinstance(where, dict) or len(where) > MAX_TERMS:
        raise QueryRefusedError("Invalid query", "where is not an object of at most 10 lookups")
    terms = tuple(_term(options, key, value) for key, value in where.items())
    order = _order(options, data.get("order_by", ["pk"]))
    limit = data.get("limit", conf.QUERY_MAX_ROWS)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise QueryRefusedError("Invalid query", "limit is not a positive integer")
    return query_id, Shape(options, terms, order, min(limit, conf.QUERY_MAX_ROWS))


def _field(options: ModelOptions, name: str) -> models.Field[Any, Any]:
    if name not in options.filters:
        raise QueryRefusedError(f"Field is not filterable: {name}")
    return options.model._meta.get_field(name)  # type: ignore[return-value]


def _is_text(field: models.Field[Any, Any]) -> bool:
    """Whether the database orders ``field``'s values its own way, not as Python does: text
    (by its collation), and UUIDs on MariaDB, whose ``uuid`` type sorts by the last group
    first (MySQL keeps them as text: taken so too)."""
    target = column_values_field(field)
    if isinstance(target, models.UUIDField):
        return database_vendor(primary(field.model)) == "mysql"
    return isinstance(target, models.CharField | models.TextField)


def read_value(field: models.Field[Any, Any], value: Any) -> Any:
    """``value`` (a JSON form) as the field reads it; ``None`` stays ``None``."""
    if value is None:
        return None
    if isinstance(value, dict | list):
        raise ValidationError("not a single value")
    read = (column_values_field(field) or field).to_python(value)
    if isinstance(read, datetime.datetime):
        return _as_compared(read)
    if isinstance(read, float) and math.isnan(read):
        return NOT_A_NUMBER
    return read


@functools.total_ordering
class _NotANumber:
    """NaN as PostgreSQL compares it (the one database that stores it in a float column):
    equal to itself, greater than every number. Python's NaN is neither: no order holds."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _NotANumber)

    def __lt__(self, other: object) -> bool:
        return False

    def __hash__(self) -> int:
        return hash(_NotANumber)

    def __repr__(self) -> str:
        return "NaN"


NOT_A_NUMBER: Final = _NotANumber()


def _as_compared(value: datetime.datetime) -> datetime.datetime:
    """A datetime as the database compares it with the column's values: all aware, or all
    naive, never both (Python refuses to order them, and one write's values would fail
    every query's matching). Under ``USE_TZ`` a naive value is read in the current time
    zone, as the ORM reads one given to a filter. Without it the columns hold naive wall-clock
    times of ``TIME_ZONE``: an aware value (``"...Z"``, as JavaScript's ``toISOString()``
    writes it; or saved so by the application, which PostgreSQL stores) is that zone's wall
    clock then, as PostgreSQL reads it in its session's time zone (SQLite and MySQL refuse
    one in a filter)."""
    if settings.USE_TZ:
        return timezone.make_aware(value) if timezone.is_naive(value) else value
    if timezone.is_aware(value):
        return timezone.make_naive(value, timezone.get_default_timezone())
    return value


def _term(options: ModelOptions, key: Any, value: Any) -> Term:
    if not isinstance(key, str) or not key:
        raise QueryRefusedError("Invalid query", "a lookup is not text")
    name, _, lookup = key.partition("__")
    field = _field(options, name)
    lookup = lookup or "exact"
    if lookup not in LOOKUPS or (lookup in ORDERING and _is_text(field)):
        raise QueryRefusedError(f"Unsupported lookup: {key}")
    invalid = QueryRefusedError(f"Invalid value for {key}")
    try:
        if lookup == "isnull":
            if not isinstance(value, bool):
                raise invalid
            return Term(name, lookup, value)
        if lookup == "in":
            if not isinstance(value, list) or len(value) > MAX_IN:
                raise invalid
            read = tuple(item for item in (_compared(field, v) for v in value) if item is not None)
            return Term(name, lookup, read, _keys(options, name, read))
        if lookup == "range":
            if not isinstance(value, list) or len(value) != 2 or None in value:
                raise invalid
            return Term(name, lookup, (_compared(field, value[0]), _compared(field, value[1])))
        if value is None:
            if lookup != "exact":
                raise invalid
            return Term(name, "isnull", True)
        read = _compared(field, _rounded(field, lookup, value))
        return Term(name, lookup, read, _keys(options, name, (read,)))
    except (ValidationError, TypeError, ValueError, ArithmeticError) as exc:
        raise invalid from exc


class CollationSaysError(Exception):
    """Whether a row matches is the database's collation to say: the query reads its rows
    again (``realtime.collations``)."""


def loose_names(options: ModelOptions) -> frozenset[str]:
    """The ``filters`` fields of ``options`` holding text its database compares by a
    collation (MySQL, MariaDB): their equality is told by ``loose_key`` first."""
    if database_vendor(primary(options.model)) != "mysql":
        return frozenset()
    return frozenset(
        name
        for name, field in options.filter_fields.items()
        if isinstance(column_values_field(field), models.CharField | models.TextField)
    )


def _keys(options: ModelOptions, name: str, values: tuple[Any, ...]) -> frozenset[str | None]:
    """The ``Term.keys`` of ``values`` asked of the field ``name``."""
    if name not in loose_names(options):
        return NO_KEYS
    return frozenset(loose_key(value) for value in values)


#: The range of a 64-bit integer column, SQLite's and every database's widest.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


#: The significant digits of a decimal SQLite keeps: it stores one as a floating-point number
#: (``REAL``), and compares it so. ``realtime.E050`` refuses in ``filters=`` a decimal field of
#: more ``max_digits`` there.
SQLITE_DECIMAL_DIGITS: Final = 15


def _compared(field: models.Field[Any, Any], value: Any) -> Any:
    """A lookup's ``value`` read by ``field`` (``read_value``); an integer outside 64 bits
    raises ``ValueError``. No integer column of any database holds one, and SQLite cannot even
    be sent it (``OverflowError`` at the read). Within 64 bits a comparison keeps its meaning
    past the column's own range (``size__gte: -1`` on a positive column matches every row):
    every database compares it, and so does the window in Python. A decimal of more
    significant digits than SQLite keeps raises ``ValueError`` there: SQLite would compare
    it rounded, the window exactly."""
    read = read_value(field, value)
    if isinstance(read, int) and not INT64_MIN <= read <= INT64_MAX:
        raise ValueError(f"{read} does not fit in 64 bits")
    if isinstance(read, decimal.Decimal) and _rounded_by_database(field, read):
        raise ValueError(f"{read} has more digits than SQLite keeps")
    return read


def _rounded_by_database(field: models.Field[Any, Any], value: decimal.Decimal) -> bool:
    """Whether ``field``'s database compares ``value`` rounded: SQLite, past
    ``SQLITE_DECIMAL_DIGITS`` significant digits (trailing zeros aside: ``1.500`` has 2)."""
    digits = len("".join(map(str, value.as_tuple().digits)).rstrip("0"))
    return digits > SQLITE_DECIMAL_DIGITS and database_vendor(primary(field.model)) == "sqlite"


def _rounded(field: models.Field[Any, Any], lookup: str, value: Any) -> Any:
    """A float compared with an integer column as Django compares it: ``gte`` and ``lt``
    round it up (``priority__gte: 1.5`` is ``>= 2``), every other lookup truncates it, as
    ``to_python`` does."""
    if (
        isinstance(value, float)
        and lookup in {"gte", "lt"}
        and isinstance(field, models.IntegerField)
    ):
        return math.ceil(value) if math.isfinite(value) else value
    return value


def _order(options: ModelOptions, order_by: Any) -> tuple[tuple[str, bool], ...]:
    if not isinstance(order_by, list) or not all(isinstance(item, str) for item in order_by):
        raise QueryRefusedError("Invalid query", "order_by is not a list of field names")
    pk_names = {"pk", options.model._meta.pk.name}
    order: list[tuple[str, bool]] = []
    for item in order_by:
        descending = item.startswith("-")
        name = item[1:] if descending else item
        if name in pk_names:
            order.append(("pk", descending))
            break  # the key orders every row: nothing after it matters
        if _is_text(_field(options, name)):
            raise QueryRefusedError(
                "Invalid query", f"order_by names text ({name}): collations differ"
            )
        order.append((name, descending))
    else:
        order.append(("pk", False))
    return tuple(order)


# Rows -----------------------------------------------------------------------------------------


def row_of(options: ModelOptions, data: Any, values: Any) -> dict[str, Any] | None:
    """A query's row from a message: the model, the id, the declared fields, the filters;
    ``None`` when the message does not carry them all (the row must be read)."""
    if not isinstance(data, dict) or "id" not in data or not isinstance(values, dict):
        return None
    if any(name not in values for name in options.filters):
        return None
    row = {"model": options.name, "id": data["id"]}
    for wire in options.fields:
        if wire not in data:
            return None
        row[wire] = data[wire]
    for name in options.filters:
        row.setdefault(name, values[name])
    return row


def row_of_instance(options: ModelOptions, instance: models.Model) -> dict[str, Any]:
    """A query's row from an instance, in the forms announcements use."""
    return row_of_values(options, instance.pk, instance.__dict__)


def row_of_values(options: ModelOptions, pk: Any, values: dict[str, Any]) -> dict[str, Any]:
    """A query's row from its key and its columns' values by ``attname``, in the forms
    announcements use."""
    row: dict[str, Any] = {"model": options.name, "id": jsonable(pk)}
    encoders = options.encoders
    for wire, attname in options.field_attnames.items():
        value = values.get(attname)
        row[wire] = encoded(value, encoders[attname]) if attname in encoders else jsonable(value)
    for name, attname in options.filter_attnames.items():
        row.setdefault(name, jsonable(values.get(attname)))
    return row


def _key_order(key: Any) -> Any:
    """A primary key's sort value: a composite key part by part, as the database sorts it."""
    if isinstance(key, tuple):
        return tuple(id_order(part) for part in key)
    return id_order(key)


@functools.cache
def nulls_sort_largest(alias: str) -> bool:
    """Whether the database of ``alias`` sorts nulls after every value. Asked once per alias:
    on the event loop, ``connections[alias]`` makes a connection object for each task's
    context (asgiref's ``Local``), one per socket that asks a query."""
    return bool(connections[alias].features.nulls_order_largest)


@functools.cache
def database_vendor(alias: str) -> str:
    """The vendor of ``alias``'s database, asked once per alias (see ``nulls_sort_largest``)."""
    return str(connections[alias].vendor)


def has_text_key(model: type[models.Model]) -> bool:
    """Whether ``model``'s primary key (a part of it, for a composite key) is text: the
    database sorts it by its collation, which Python does not share."""
    return any(_is_text(part) for part in key_fields(model))


class Sorting:
    """Matches a row's filters values against a shape and compares rows in its order."""

    __slots__ = ("nulls_largest", "shape", "text_key")

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self.nulls_largest = nulls_sort_largest(primary(shape.options.model))
        #: Rows whose order only their keys decide are ordered by the database's collation.
        self.text_key = has_text_key(shape.options.model)

    def matches(self, typed: dict[str, Any]) -> bool:
        return all(term.matches(typed[term.name]) for term in self.shape.terms)

    def compare(self, a: Sortable, b: Sortable) -> int:
        for name, descending in self.shape.order:
            if name == "pk":
                left, right = _key_order(a[KEY]), _key_order(b[KEY])
            else:
                left, right = a[TYPED][name], b[TYPED][name]
            found = self._compare_values(left, right)
            if found:
                return -found if descending else found
        return 0

    def only_keys_part(self, a: Sortable, b: Sortable) -> bool:
        """Whether only the keys order ``a`` and ``b`` here, and they are text: where one
        goes against the other is the database's collation to say, not Python's."""
        if not self.text_key:
            return False
        for name, _ in self.shape.order:
            if name == "pk":
                return True
            if self._compare_values(a[TYPED][name], b[TYPED][name]):
                return False
        return True

    def _compare_values(self, left: Any, right: Any) -> int:
        if left is None or right is None:
            if left is None and right is None:
                return 0
            # A null sorts after every value where the database takes nulls as largest.
            return (1 if self.nulls_largest else -1) * (1 if left is None else -1)
        if left < right:
            return -1
        return 1 if right < left else 0


#: A row as a message or a read gives it: its key (``row_key``), its filters values read
#: (``typed``), the row as the client gets it; read with ``KEY``, ``TYPED`` and ``ROW``.
#: ``Sorting`` compares any ``(key, typed, ...)``.
Entry = tuple[Any, dict[str, Any], dict[str, Any]]
KEY, TYPED, ROW = 0, 1, 2
#: What ``Sorting`` compares: an ``Entry``, or a held row's ``(key, typed)``.
Sortable = tuple[Any, ...]


# A query --------------------------------------------------------------------------------------


@dataclass
class Diff:
    enter: list[dict[str, Any]] = field(default_factory=list)
    leave: list[Any] = field(default_factory=list)
    update: list[dict[str, Any]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.enter or self.leave or self.update)


class Holders(Protocol):
    """Told which rows each query's window holds (``Queries`` indexes them)."""

    def hold(self, query: LiveQuery, key: Any) -> None: ...

    def release(self, query: LiveQuery, key: Any) -> None: ...


_serials = itertools.count()


class LiveQuery:
    """One socket's live query: its shape and its window (see the module docstring).

    What the client has is the window as it was when its last frame was handed over: the
    rows a change touches record, on their first change since then, what the client had of
    them (``shown``), and ``changes`` tells the client the difference once for every
    message carried together."""

    __slots__ = (
        "_order",
        "_sort_key",
        "afresh",
        "again",
        "capacity",
        "capped",
        "failed",
        "held",
        "holders",
        "id",
        "listed",
        "loading",
        "pending",
        "serial",
        "shape",
        "shown",
        "socket",
        "sorting",
        "stale",
        "stopped",
        "typed",
        "window",
    )

    def __init__(
        self, query_id: str, shape: Shape, socket: Any, holders: Holders | None = None
    ) -> None:
        self.id = query_id
        #: Names it in its model's index of the rows held (``ModelQueries.holding``).
        self.serial = next(_serials)
        self.shape = shape
        self.socket = socket
        self.holders = holders
        self.sorting = Sorting(shape)
        self.capacity = capacity(shape)
        self._order = functools.cmp_to_key(self.sorting.compare)
        #: A held row's place in the window, by its key: the key's own sort value where only
        #: the key orders the rows (ascending: as ``Sorting.compare`` orders them then), else
        #: as ``compare`` says.
        self._sort_key: Callable[[Any], Any] = (
            _key_order if shape.order == (("pk", False),) else self._compared
        )
        #: The keys of the rows it holds, in order (the client sees the first ``limit``), and
        #: each row and its values read, by key.
        #: No object per row: a full collection of the garbage collector walks every object
        #: it tracks while the worker waits, and a worker's windows hold some 100,000 rows
        #: at 1,000 queries. A row and its values (dicts of numbers and text) are not tracked.
        self.window: list[Any] = []
        self.held: dict[Any, dict[str, Any]] = {}
        self.typed: dict[Any, dict[str, Any]] = {}
        #: Of the rows changed since the client's last frame, what the client has (``None``:
        #: not in its list).
        self.shown: dict[Any, dict[str, Any] | None] = {}
        #: Whether rows past the window may match (the window was full when read).
        self.capped = False
        #: Its rows must be read again (a row left a full window, a message said too
        #: little); ``afresh``: the client gets them whole (``query.rows``).
        self.stale = False
        self.afresh = False
        #: The client was handed its list whole (``query.rows``) at least once: a read
        #: again tells it the difference (``query.diff``).
        self.listed = False
        #: Messages carried out while the first rows are read (``change_of``).
        self.pending: list[Any] | None = []
        self.stopped = False
        #: Its rows are being read (``Queries._load``); another read was asked meanwhile.
        self.loading = False
        self.again = False
        #: Matching a message against it failed (logged then, once): such messages make
        #: it read its rows again instead.
        self.failed = False

    @property
    def options(self) -> ModelOptions:
        return self.shape.options

    def rows(self) -> list[dict[str, Any]]:
        """The client's list: the first ``limit`` rows held."""
        return [self.held[key] for key in self.window[: self.shape.limit]]

    def holds(self, key: Any) -> bool:
        return key in self.held

    def _at(self, key: Any) -> tuple[Any, dict[str, Any]]:
        """A held row as ``Sorting`` compares it."""
        return key, self.typed[key]

    def _compared(self, key: Any) -> Any:
        return self._order(self._at(key))

    def _listed(self, key: Any) -> dict[str, Any] | None:
        """The row of ``key`` in the client's list as the window stands: held, and among the
        first ``limit``."""
        row = self.held.get(key)
        limit = self.shape.limit
        if row is None or len(self.window) <= limit:
            return row
        at = bisect.bisect_left(self.window, self._sort_key(key), key=self._sort_key)
        return row if at < limit else None

    def _note(self, key: Any) -> None:
        """Before a row's first change since the client's last frame: what the client has."""
        if key not in self.shown:
            self.shown[key] = self._listed(key)

    def _put(self, entry: Entry) -> None:
        if self.stopped:
            return  # forgotten: it holds no row (``Queries._forget`` cleared it)
        key = entry[KEY]
        self._note(key)
        limit = self.shape.limit
        if len(self.window) >= limit:
            self._note(self.window[limit - 1])  # pushed out of the list if it goes before
        self.typed[key], self.held[key] = entry[TYPED], entry[ROW]
        bisect.insort(self.window, key, key=self._sort_key)
        if self.holders is not None:
            self.holders.hold(self, key)

    def _drop(self, key: Any) -> None:
        self._note(key)
        limit = self.shape.limit
        if len(self.window) > limit:
            self._note(self.window[limit])  # enters the list if this row was in it
        self.window.remove(key)
        del self.held[key], self.typed[key]
        if self.holders is not None:
            self.holders.release(self, key)

    def clear(self) -> None:
        if self.holders is not None:
            for key in self.held:
                self.holders.release(self, key)
        self.window, self.held, self.typed = [], {}, {}

    def load(self, rows: Sequence[dict[str, Any]]) -> None:
        """Take the rows read (up to ``capacity + 1``: one more says the window is capped)."""
        entries = [entry_of(self.options, row) for row in rows[: self.capacity]]
        self.take([entry for entry in entries if entry is not None], len(rows) > self.capacity)

    def take(self, entries: Sequence[Entry], capped: bool) -> None:
        """Hold ``entries`` (read in the query's order), and no other row."""
        for at, key in enumerate(self.window):
            if key not in self.shown:
                self.shown[key] = self.held[key] if at < self.shape.limit else None
        self.clear()
        if self.stopped:
            return
        for key, typed, row in entries:
            self._note(key)
            self.window.append(key)
            self.held[key], self.typed[key] = row, typed
            if self.holders is not None:
                self.holders.hold(self, key)
        self.capped = capped
        self.stale = False

    def shown_whole(self) -> None:
        """The client was handed the whole window (``query.rows``)."""
        self.shown = {}
        self.afresh = False
        self.listed = True

    def may_change(self, entry: Entry | None, key: Any) -> bool:
        """Whether a row's message (``apply``'s arguments) may change the list: it holds the
        row, or the row matches (or the first rows are being read: every message is kept
        for them). Asked when the message is planned, maybe before earlier messages are
        carried out: nothing here depends on where the window ends."""
        if self.pending is not None or key in self.held:
            return True
        return entry is not None and self.sorting.matches(entry[TYPED])

    def apply(self, entry: Entry | None, key: Any) -> bool:
        """Apply one row's message (``entry`` ``None``: the row left the account's view or
        is gone); ``False`` when the rows past the window must be read (``stale``).

        The window holds the first rows of the query's answer in its order; when ``capped``,
        every row it does not hold sorts after its last one."""
        sorting = self.sorting
        if entry is None or not sorting.matches(entry[TYPED]):
            if key not in self.held:
                return True
            self._drop(key)
            return self._enough()
        if key in self.held:
            held: Entry = (key, self.typed[key], self.held[key])
            self._drop(key)
            self._put(entry)
            if not self.capped:
                return True
            later = sorting.compare(entry, held) > 0
            moved = later or sorting.compare(held, entry) > 0
            last = self.window[-1]
            if later and last == key:
                # It sorts past every row held now: where among the rows not held is not
                # known here, so it is held no more.
                self._drop(key)
                if self.window and sorting.only_keys_part(entry, self._at(self.window[-1])):
                    self._put(held)
                    return False  # whether it goes before that row: the collation says
                return self._enough()
            if moved and sorting.only_keys_part(entry, self._at(last)):
                self._drop(key)
                self._put(held)
                return False
            return True
        end = self._at(self.window[-1]) if self.window else None
        full = self.capped or len(self.window) >= self.capacity
        if full and end is not None and sorting.only_keys_part(entry, end):
            return False  # which of the two the window ends with: the database says
        if self.capped and end is not None and sorting.compare(entry, end) > 0:
            return True  # sorts after the window: not held
        self._put(entry)
        if len(self.window) > self.capacity:
            self._drop(self.window[-1])
            self.capped = True
        return True

    def _enough(self) -> bool:
        """Whether the window still holds the client's whole list: all the rows that
        match, or at least ``limit`` of them."""
        return not self.capped or len(self.window) >= self.shape.limit

    def changes(self) -> Diff:
        """What the client must be told since its last frame: then it has the list (the
        window's first ``limit`` rows)."""
        diff = Diff()
        entered: list[Any] = []
        for key, had in self.shown.items():
            now = self._listed(key)
            if now is None:
                if had is not None:
                    diff.leave.append(had["id"])
            elif had is None:
                entered.append(key)
            elif had is not now and had != now:
                diff.update.append(now)
        entered.sort(key=self._sort_key)
        diff.enter = [self.held[key] for key in entered]
        self.shown = {}
        return diff


def entry_of(options: ModelOptions, row: dict[str, Any]) -> Entry | None:
    """A row as windows hold it: its key, its filters values as the fields read them
    (``None``: one is unreadable), the row."""
    try:
        fields = options.filter_fields
        typed = {name: read_value(field, row[name]) for name, field in fields.items()}
    except (ValidationError, TypeError, ValueError, ArithmeticError, KeyError):
        return None
    return (row_key(row["id"]), typed, row)


# Reading from the database --------------------------------------------------------------------


def queryset(
    shape: Shape, user: Any, scope_ids: Iterable[Any], *, guarded: bool = True
) -> models.QuerySet[Any, Any]:
    """The rows of ``shape`` the account ``user`` may read in ``scope_ids``, in order: the
    ORM's answer a live query's list equals (``guarded=False``: whatever the guard says)."""
    options = shape.options
    model = options.model
    rows = on_primary(model).all()
    for term in shape.terms:
        attname = options.filter_attnames[term.name]
        rows = rows.filter(**term.lookup_kwargs(attname))
    if options.user_field is not None:
        path = key_lookup(model, options.user_field)
        reached = on_primary(model, base=True).filter(**{path: user.pk}).values("pk")
        rows = rows.filter(pk__in=reached)
    elif options.scope_attname is not None:
        rows = rows.filter(**{f"{options.scope_attname}__in": list(scope_ids)})
    if options.guard is not None and guarded:
        account = _account_now(user)
        condition = None if account is None else guard_condition(options, account)
        rows = rows.none() if condition is None else rows.filter(condition)
    ordering = []
    for name, descending in shape.order:
        attname = "pk" if name == "pk" else options.filter_attnames[name]
        ordering.append(f"-{attname}" if descending else attname)
    return rows.order_by(*ordering)


def _account_now(user: Any) -> Any:
    """The account as it is now, for a guard (which may read its attributes: a team, a
    flag), as delivery decides guarded rows: ``None`` when it is gone or inactive. The
    socket's own object is as it was at its handshake."""
    return active(on_primary(get_user_model()).filter(pk=user.pk)).first()


def read_rows(shape: Shape, user: Any, scope_ids: Iterable[Any]) -> list[dict[str, Any]]:
    """The first ``capacity + 1`` rows of the query (blocking: the ORM): one more than a
    window holds says whether more rows match."""
    # Values, not instances: the rows of 1,000 sockets' queries read again after a deploy are
    # made in Python while live frames wait.
    found = queryset(shape, user, scope_ids).values(*_columns(shape.options))
    return _rows(shape.options, found[: capacity(shape) + 1])


def read_shared_rows(
    shape: Shape, users: Sequence[Any], scope_ids: Iterable[Any]
) -> dict[Any, list[dict[str, Any]]]:
    """``read_rows`` of a guarded shape for each of ``users`` (by key), in two statements
    however many they are, where the guard is one ``realtime.guard_checks`` decides: the
    accounts as they are now, then the shape's rows whatever the guard says
    (``SHARED_READ`` windows' worth), each account's guard checked here on them. An account
    whose window they do not fill, or whose guard needs the database, is read alone."""
    options, scope_ids = shape.options, list(scope_ids)
    ids = [user.pk for user in users]
    accounts = {a.pk: a for a in active(on_primary(get_user_model()).filter(pk__in=ids))}
    found: dict[Any, list[dict[str, Any]]] = {}
    checks: dict[Any, Any] = {}
    forms: Forms = {}
    for user in users:
        account = accounts.get(user.pk)
        if account is None:
            found[user.pk] = []  # gone or inactive: no guarded row
            continue
        condition = guard_condition(options, account)
        if condition is None:
            found[user.pk] = []  # its guard failed (logged): no guarded row
            continue
        decided = in_process(options.model, condition, forms)
        if decided is not None:
            checks[user.pk] = decided
    if checks:
        read = [*_columns(options), *(name for _, names in checks.values() for name in names)]
        wanted = capacity(shape) + 1
        most = wanted * SHARED_READ
        rows = queryset(shape, None, scope_ids, guarded=False).values(*dict.fromkeys(read))
        candidates = list(rows[:most])
        for pk, (check, _) in checks.items():
            passed = [values for values in candidates if check(values)][:wanted]
            if len(passed) == wanted or len(candidates) < most:
                found[pk] = _rows(options, passed)
    for user in users:
        if user.pk not in found:
            found[user.pk] = read_rows(shape, user, scope_ids)
    return found


def _columns(options: ModelOptions) -> list[str]:
    """The columns a query's row is made of: the key's, the declared fields, the filters."""
    key = [str(field.attname) for field in key_fields(options.model)]
    declared = [*options.field_attnames.values(), *options.filter_attnames.values()]
    return list(dict.fromkeys([*key, *declared]))


def _rows(options: ModelOptions, found: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Query rows of ``values()`` rows (a composite key put together from its parts)."""
    key = [str(field.attname) for field in key_fields(options.model)]
    if len(key) == 1:
        return [row_of_values(options, values[key[0]], values) for values in found]
    return [row_of_values(options, tuple(values[part] for part in key), values) for values in found]


# The worker's queries --------------------------------------------------------------------------

#: Hands one encoded frame to a socket, in order with its other frames.
Deliver = Callable[[Any, str], Awaitable[None]]
#: Queries followed before the event loop gets a turn to write what they sent.
YIELD_EVERY = 100
#: Times a query's first rows are read again when writes it heard meanwhile cannot be applied.
LOAD_TRIES = 3
#: Windows' worth of rows read once for the accounts sharing a guarded shape
#: (``read_shared_rows``).
SHARED_READ = 4
#: Stands for a message that does not say enough: the query is read again.
UNREAD: Any = object()
#: Stands for a bulk write past ``REALTIME_BULK_LIMIT``: the query's rows are sent afresh.
FOLDED: Any = object()


class ModelQueries:
    """The queries of one model, indexed so that a write looks only at those it may touch:
    by their ``exact`` terms together (a write of ``company=42, status="open"`` looks at the
    queries asking for company 42 and status open, not those asking for another company);
    without one, by the bounds an ordering term sets (a write of ``priority=7`` looks at the
    queries whose ``priority`` range holds 7); the rest always; and by the rows each window
    holds (a row that leaves)."""

    def __init__(self) -> None:
        self.all: set[LiveQuery] = set()
        #: The fields whose values the index keeps by their ``loose_key`` (``loose_names``).
        self.loose: frozenset[str] = frozenset()
        #: By the names of a query's exact terms, then by their values.
        self.by_terms: dict[tuple[str, ...], dict[tuple[Any, ...], set[LiveQuery]]] = {}
        self.unindexed: set[LiveQuery] = set()
        #: Queries without an indexed ``exact`` term but with an ordering term, by its field:
        #: the bounds it sets there (``None``: unbounded on that side).
        self.bounded: dict[str, dict[LiveQuery, tuple[Any, Any]]] = {}
        #: By the key of each row a window holds, the serial numbers of the queries holding
        #: it: tuples of numbers, which the garbage collector stops tracking (see
        #: ``LiveQuery.window``).
        self.holding: dict[Any, tuple[int, ...]] = {}
        self.by_serial: dict[int, LiveQuery] = {}
        #: Queries whose rows are being read: they hear every message (``Queries._load``).
        self.loading: set[LiveQuery] = set()

    def add(self, query: LiveQuery) -> None:
        self.all.add(query)
        self.loose = loose_names(query.options)
        names, values = _exact_terms(query.shape)
        if names and ANY_TEXT not in values:
            self.by_terms.setdefault(names, {}).setdefault(values, set()).add(query)
        elif (bounds := _bounds(query.shape)) is not None:
            name, low_high = bounds
            self.bounded.setdefault(name, {})[query] = low_high
        else:
            self.unindexed.add(query)

    def remove(self, query: LiveQuery) -> None:
        self.all.discard(query)
        self.unindexed.discard(query)
        self.loading.discard(query)
        names, values = _exact_terms(query.shape)
        if names and ANY_TEXT not in values:
            by_values = self.by_terms.get(names, {})
            discard(by_values, values, query)
            if not by_values:
                self.by_terms.pop(names, None)
        elif (bounds := _bounds(query.shape)) is not None:
            by_query = self.bounded.get(bounds[0], {})
            by_query.pop(query, None)
            if not by_query:
                self.bounded.pop(bounds[0], None)
        query.clear()
        self.by_serial.pop(query.serial, None)

    def hold(self, query: LiveQuery, key: Any) -> None:
        serial = query.serial
        self.by_serial[serial] = query
        held = self.holding.get(key, ())
        if serial not in held:
            self.holding[key] = (*held, serial)

    def release(self, query: LiveQuery, key: Any) -> None:
        held = self.holding.get(key, ())
        rest = tuple(serial for serial in held if serial != query.serial)
        if rest:
            self.holding[key] = rest
        else:
            self.holding.pop(key, None)

    def touched(self, entry: Entry | None, key: Any) -> list[LiveQuery]:
        """The queries a message about the row ``key`` (``entry``: as it is now) may change
        (a query may be named twice)."""
        found = [*self.loading, *(self.by_serial[n] for n in self.holding.get(key, ()))]
        if entry is not None:
            found += self.unindexed
            typed = entry[TYPED]
            loose = self.loose
            for names, by_values in self.by_terms.items():
                values = tuple(_indexed(typed[name], name in loose) for name in names)
                if ANY_TEXT in values:  # a text any other may be taken for: every value's
                    found += itertools.chain.from_iterable(by_values.values())
                else:
                    found += by_values.get(values, ())
            for name, by_query in self.bounded.items():
                found += _within(by_query, typed[name])
        return found


def _exact_terms(shape: Shape) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    """The names and values of a shape's ``exact`` terms, in name order (its index key): a
    text compared by a collation by its ``loose_key`` (``ANY_TEXT`` when it has none: such a
    query is not indexed)."""
    terms = sorted(
        (term.name, _indexed(term.value, bool(term.keys)))
        for term in shape.terms
        if term.lookup == "exact"
    )
    return tuple(name for name, _ in terms), tuple(value for _, value in terms)


def _bounds(shape: Shape) -> tuple[str, tuple[Any, Any]] | None:
    """The field and bounds (``None``: unbounded on that side) of one of a shape's ordering
    terms, a ``range`` first (bounded on both sides); ``None`` when it has none. Ordering
    terms are never on text (refused): their bounds compare as Python compares."""
    for term in sorted(shape.terms, key=lambda term: (term.lookup != "range", term.name)):
        if term.lookup == "range":
            return term.name, term.value
        if term.lookup in ("gt", "gte"):
            return term.name, (term.value, None)
        if term.lookup in ("lt", "lte"):
            return term.name, (None, term.value)
    return None


def _within(by_query: dict[LiveQuery, tuple[Any, Any]], value: Any) -> list[LiveQuery]:
    """The queries whose bounds hold ``value``, ends included (a superset of those whose
    ordering term it matches): none for a null, which no ordering term matches; all of them
    where the value does not compare with a bound (their own matching says)."""
    if value is None:
        return []
    try:
        return [
            query
            for query, (low, high) in by_query.items()
            if (low is None or low <= value) and (high is None or value <= high)
        ]
    except Exception:
        return list(by_query)


#: Stands, in the index of exact terms, for a text that has no ``loose_key``.
ANY_TEXT: Final = object()


def _indexed(value: Any, loose: bool) -> Any:
    """``value`` as the index of exact terms keeps it."""
    if not loose or value is None:
        return value
    key = loose_key(value)
    return ANY_TEXT if key is None else key


class Queries:
    """Every live query of the worker's sockets, by model name, and what keeps them exact."""

    def __init__(self, deliver: Deliver, restart: Callable[[Any], None]) -> None:
        self.deliver = deliver
        #: Closes a socket 1012 (it reconnects and asks again): what a read that failed left
        #: in its lists may no longer be exact.
        self.restart = restart
        self.by_model: dict[str, ModelQueries] = {}
        #: The queries messages changed since the last ``flush`` (a dict: in order).
        self._due: dict[LiveQuery, None] = {}
        #: Their sockets: a frame of a later message goes to none of them before ``flush``.
        self._due_sockets: set[Any] = set()
        #: Messages carried since the last ``flush``.
        self.carried = 0
        #: While frames are sent: the diffs of the same rows encoded once for every query
        #: that sends them, by the rows' identities (the rows kept, so none is reused).
        self._bodies: dict[tuple[Any, ...], tuple[Diff, str]] = {}

    def change(self, name: str, data: Any, meta: Any, action: str) -> Any:
        """What a message about a row of ``name`` does to the queries here (``change_of``);
        ``None`` when no query here is of that model. ``action``: ``"row"``, ``"leave"`` or
        ``"fold"`` (a bulk write past the limit: every query is read again)."""
        if name not in self.by_model:
            return None
        options = options_named(name)
        return UNREAD if options is None else change_of(options, data, meta, action)

    def sockets_touched(self, name: str, change: Any) -> set[Any]:
        """The sockets holding a query that ``change`` may change: matched in process, so
        that permissions are asked only for them (no statement decides this)."""
        group = self.by_model.get(name)
        if group is None or change is None:
            return set()
        if change in (UNREAD, FOLDED):
            return {query.socket for query in group.all}
        return {query.socket for query in group.touched(*change) if _may_change(query, change)}

    async def start(self, socket: Any, data: dict[str, Any]) -> None:
        """Answer a ``query`` frame: ``query.rows``, or ``query.error`` with its reason."""
        try:
            query_id, shape = read_query(data)
            if query_id not in socket.queries and len(socket.queries) >= conf.MAX_QUERIES:
                raise QueryRefusedError(
                    "Too many queries", f"the socket holds {len(socket.queries)}"
                )
        except QueryRefusedError as refused:
            await self._refuse(socket, refusal_id(data), refused)
            return
        self.stop(socket, query_id)
        group = self.by_model.setdefault(shape.options.name, ModelQueries())
        query = LiveQuery(query_id, shape, socket, group)
        socket.queries[query_id] = query
        group.add(query)
        await self._load(query)

    async def _refuse(self, socket: Any, query_id: Any, refused: QueryRefusedError) -> None:
        log_bad_input("realtime: refused a live query: %s", refused.cause[:200])
        frame = {"type": ERROR, "data": {"id": query_id, "message": refused.reason}}
        await self.deliver(socket, encode(frame))

    def stop(self, socket: Any, query_id: Any) -> None:
        """Forget a query (``unquery``, or replaced by one of the same id)."""
        query = socket.queries.pop(query_id, None) if isinstance(query_id, str) else None
        if query is not None:
            self._forget(query)

    def drop(self, socket: Any) -> None:
        """Forget every query of a socket that is gone."""
        for query in socket.queries.values():
            self._forget(query)
        socket.queries.clear()

    def _forget(self, query: LiveQuery) -> None:
        query.stopped = True
        name = query.options.name
        group = self.by_model.get(name)
        if group is not None:
            group.remove(query)
            if not group.all:
                del self.by_model[name]

    async def _load(self, query: LiveQuery) -> None:
        """Read the query's first rows, apply what it heard meanwhile, send ``query.rows``.

        One load at a time per query: a load asked while one runs (the socket's scopes
        changed) makes the running one read again once it is done."""
        group = self.by_model.get(query.options.name)
        if group is None:
            return
        if query.loading:
            query.again = True
            return
        query.loading = True
        group.loading.add(query)
        try:
            query.again = True
            while query.again and not query.stopped:
                query.again = False
                await self._read_first(query)
        finally:
            query.loading = False
            group.loading.discard(query)

    async def _read_first(self, query: LiveQuery) -> None:
        settled = False
        for _ in range(LOAD_TRIES):
            query.pending = []
            try:
                rows = await self._read(query)
            except Exception:
                if query.listed:  # read again (a scope changed): its list may be wrong now
                    logger.exception(
                        "realtime: reading the rows of a live query again failed; its socket "
                        "is closed 1012 to reconnect and ask again"
                    )
                    self.restart(query.socket)
                else:
                    logger.exception("realtime: reading the rows of a live query failed")
                    await self._refuse(query.socket, query.id, QueryRefusedError("Invalid query"))
                self.stop(query.socket, query.id)
                return
            if query.stopped:
                return
            if rows is None:
                query.again = True  # read again, in the scopes it reads now: nothing is sent
                return
            query.load(rows)
            heard, query.pending = query.pending, None
            settled = all(
                change not in (UNREAD, FOLDED) and _applied(query, change) for change in heard
            )
            if settled:
                break
        if query.listed and not query.afresh:
            await self._send_changes(query)  # read again: rows it may no longer read leave
        else:
            await self._send_rows(query)
        if not settled:
            # What it heard while reading could not be applied: read once more.
            await self._refill([query])
            await self._send_changes(query)

    async def reload(self, socket: Any) -> None:
        """Read every query of ``socket`` again (the scopes it reads changed): the client is
        told the difference (a row of a scope lost leaves, in ``query.diff``). Their frames
        still held for it (a recheck holds them until it answers) may show rows of a scope
        it just lost: they are dropped, and those queries' rows sent whole (``query.rows``)."""
        held = socket.held
        dropped: set[Any] = set()
        if held:
            kept = [entry for entry in held if not _is_list_frame(entry.message)]
            dropped = {_query_id(entry.message) for entry in held if entry not in kept}
            held.clear()
            held.extend(kept)
        for query in list(socket.queries.values()):
            if query.id in dropped:
                query.afresh = True
            await self._load(query)

    async def _read(self, query: LiveQuery, refill: bool = False) -> list[dict[str, Any]] | None:
        """The query's rows: its first read on realtime's pool, a refill on the threads of
        the delivery path (frames of later writes wait for it). ``None`` when a recheck took
        one of the scopes it read from its socket meanwhile: rows of that scope are not to
        be shown."""
        socket = query.socket
        run = run_for_delivery if refill else run_blocking
        scopes = list(socket.scopes)
        rows = await run(read_rows, query.shape, socket.user, scopes)
        if any(scope_id not in socket.scopes for scope_id in scopes):
            return None
        return rows

    async def _send_rows(self, query: LiveQuery) -> None:
        query.shown_whole()
        frame = {"type": ROWS, "data": {"id": query.id, "rows": query.rows()}}
        await self.deliver(query.socket, encode(frame))

    def carry(
        self,
        name: str,
        readers: set[Any],
        change: Any,
        asked: set[Any] | frozenset[Any] | None = None,
    ) -> None:
        """Apply one message about a row of ``name`` (``change``: ``Queries.change``) to
        the queries of ``readers`` (the sockets that may read it). Their clients are told
        at the next ``flush``: once for every message carried together. ``asked``: the
        sockets matched when the message was planned (``sockets_touched``), ``None`` for a
        message addressed to accounts."""
        group = self.by_model.get(name)
        if group is None or change is None:
            return
        self.carried += 1
        done: set[LiveQuery] = set()
        for query in _touched(group, change):
            if query in done or query.stopped:
                continue
            done.add(query)
            if query.socket in readers:
                self._carry_one(query, change)
            elif (
                asked is not None
                and query.socket not in asked
                and query.pending is None
                and change not in (UNREAD, FOLDED)
                and query.holds(change[1])
            ):
                # It holds the row, but came to hold it after the message was planned: its
                # socket was not asked about it. Its rows are read again, with its account's
                # rights.
                query.stale = True
            else:
                continue
            if query.shown or query.stale:
                self._due[query] = None
                self._due_sockets.add(query.socket)

    def _carry_one(self, query: LiveQuery, change: Any) -> None:
        if query.pending is not None:
            query.pending.append(change)  # applied once the first rows are read
            return
        if change is FOLDED:  # past the bulk limit: ``query.rows``, even if already stale
            query.stale = query.afresh = True
            return
        if query.stale:
            return  # its rows are read again at the flush: they will show this write
        if change is UNREAD or not _applied(query, change):
            query.stale = True

    @property
    def due(self) -> bool:
        """Whether a ``flush`` has something to tell."""
        return bool(self._due)

    def due_to(self, sockets: set[Any]) -> bool:
        """Whether a ``flush`` has something to tell one of ``sockets``: it must come before
        any frame of a later message goes to them."""
        return not self._due_sockets.isdisjoint(sockets)

    async def flush(self) -> None:
        """Tell the clients what the messages carried since the last flush changed: the
        windows that must be read again are read, one statement per query shape and
        reader (a shape's rows for one account in one set of scopes), however many
        sockets hold it; then one ``query.diff`` (or ``query.rows`` after a bulk write)
        per query."""
        due, self._due, self.carried = list(self._due), {}, 0
        self._due_sockets = set()
        await self._refill([query for query in due if query.stale])
        self._bodies = {}
        for count, query in enumerate(due, 1):
            if not query.stopped and query.pending is None:
                if query.afresh:
                    await self._send_rows(query)
                else:
                    await self._send_changes(query)
            if count % YIELD_EVERY == 0:
                # Let the event loop write what is handed over so far: the first sockets
                # need not wait until every query has been told.
                await asyncio.sleep(0)
        self._bodies = {}

    async def _refill(self, stale: Sequence[LiveQuery]) -> None:
        """Read the rows of the ``stale`` queries again: once for each shape and reader."""
        for _ in range(LOAD_TRIES):
            stale = await self._refill_once(stale)
            if not stale:
                return

    async def _refill_once(self, stale: Sequence[LiveQuery]) -> list[LiveQuery]:
        """``_refill``; the queries whose read a recheck cut short by taking a scope from the
        socket read for (each then reads by what it reads now)."""
        by_reader: dict[tuple[Any, ...], list[LiveQuery]] = {}
        for query in stale:
            by_reader.setdefault(_reader(query), []).append(query)
        cut: list[LiveQuery] = []
        for queries in by_reader.values():
            try:
                read = await self._read_again(queries)
            except Exception:
                logger.exception(
                    "realtime: reading the rows of %d live query(ies) again failed; their "
                    "sockets are closed 1012 to reconnect and ask again",
                    len(queries),
                )
                for socket in {query.socket: None for query in queries}:
                    self.restart(socket)
                continue
            made: dict[int, list[Entry]] = {}  # accounts sharing a shape may share rows
            for query, rows in zip(queries, read, strict=True):
                if rows is None:
                    cut.append(query)
                    continue
                kept = made.get(id(rows))
                if kept is None:
                    entries = [entry_of(query.options, row) for row in rows[: query.capacity]]
                    kept = made[id(rows)] = [entry for entry in entries if entry is not None]
                if not query.stopped:
                    query.take(kept, len(rows) > query.capacity)
        return cut

    async def _read_again(self, queries: Sequence[LiveQuery]) -> list[list[dict[str, Any]] | None]:
        """The rows of ``queries`` (one shape, one reader: ``_reader``), each query's, read
        on the delivery path's threads: once for them all, and for a guarded shape once for
        all their accounts (``read_shared_rows``). ``None`` for a query whose socket a
        recheck took a scope read from meanwhile."""
        first = queries[0]
        users = {query.socket.user.pk: query.socket.user for query in queries}
        if first.options.guard is None or len(users) == 1:
            return [await self._read(first, refill=True)] * len(queries)
        scopes = list(first.socket.scopes)
        shared = await run_for_delivery(read_shared_rows, first.shape, list(users.values()), scopes)
        return [
            None
            if any(scope_id not in query.socket.scopes for scope_id in scopes)
            else shared[query.socket.user.pk]
            for query in queries
        ]

    async def _send_changes(self, query: LiveQuery) -> None:
        diff = query.changes()
        if diff:
            await self._send_diff(query, diff)

    async def _send_diff(self, query: LiveQuery, diff: Diff) -> None:
        # The rows of one message are the same objects in every query's diff: their
        # encoding is made once, and each frame is its query's id before it.
        shape = (
            tuple(id(row) for row in diff.enter),
            tuple(map(str, diff.leave)),
            tuple(id(row) for row in diff.update),
        )
        found = self._bodies.get(shape)
        if found is None:
            changes = {"enter": diff.enter, "leave": diff.leave, "update": diff.update}
            found = self._bodies[shape] = (diff, encode(changes)[1:])
        query_id = json.dumps(query.id, ensure_ascii=False)
        frame = f'{{"type":"{DIFF}","data":{{"id":{query_id},{found[1]}}}'
        await self.deliver(query.socket, frame)


def _reader(query: LiveQuery) -> tuple[Any, ...]:
    """What a query's rows depend on besides its shape, that one read serves: the account of
    an account model, the scopes its socket reads for a scope's model (a guarded shape's
    accounts share a read, ``read_shared_rows``)."""
    options, shape, socket = query.options, query.shape, query.socket
    scopes = None if options.user_field is not None else frozenset(socket.scopes)
    account = socket.user.pk if options.user_field is not None else None
    return (options.name, shape.terms, shape.order, shape.limit, account, scopes)


def _may_change(query: LiveQuery, change: Any) -> bool:
    """``query.may_change(*change)``; ``True`` when matching fails, so that the query is
    read again once the message is carried (``_applied``): a query the message cannot be
    matched against never keeps it from the others' sockets."""
    try:
        return query.may_change(*change)
    except CollationSaysError:
        return True
    except Exception as failure:
        _failed(query, failure)
        return True


def _applied(query: LiveQuery, change: Any) -> bool:
    """``query.apply(*change)``; ``False`` (its rows are read again) when it fails."""
    try:
        return query.apply(*change)
    except CollationSaysError:
        return False
    except Exception as failure:
        _failed(query, failure)
        return False


def _failed(query: LiveQuery, failure: Exception) -> None:
    """Log, once per query, that matching a message against it failed: its rows are read
    again for such messages, so its list stays the database's answer, at one statement per
    write."""
    if not query.failed:
        query.failed = True
        logger.error(
            "realtime: live query %r could not match a write; its rows are read again instead",
            query.id,
            exc_info=failure,
        )


def _touched(group: ModelQueries, change: Any) -> list[LiveQuery]:
    """The queries of ``group`` that ``change`` may touch: all of them when the rows must
    be read again. A list: queries come and go while the event loop awaits."""
    return list(group.all) if change in (UNREAD, FOLDED) else group.touched(*change)


def _query_id(message: dict[str, Any]) -> Any:
    """The query a ``query.rows`` or ``query.diff`` frame is about."""
    return json.loads(message["text"])["data"]["id"]


def _is_list_frame(message: dict[str, Any]) -> bool:
    """Whether a ``websocket.send`` message is a live query's ``query.rows`` or ``query.diff``."""
    text = message.get("text")
    return isinstance(text, str) and text.startswith((f'{{"type":"{ROWS}"', f'{{"type":"{DIFF}"'))


def change_of(options: ModelOptions, data: Any, meta: Any, action: str) -> Any:
    """What a message does to the queries that hear it: ``(entry, key)`` (``entry``
    ``None``: the row leaves), or ``UNREAD``: the rows must be read again (a bulk write past
    the limit, a message without every value the queries need)."""
    if action == "fold":
        return FOLDED
    key = row_key(data["id"]) if isinstance(data, dict) and "id" in data else None
    if key is None:
        return UNREAD
    if action == "leave":
        return (None, key)
    row = row_of(options, data, meta.get("filters") if isinstance(meta, dict) else None)
    entry = None if row is None else entry_of(options, row)
    return UNREAD if entry is None else (entry, key)
