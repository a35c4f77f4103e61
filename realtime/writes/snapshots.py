"""What a row holds in the database, as far as this thread knows: so an update can say which
columns it changed.

What is known of a row is kept in a ``Row``, shared by every instance of that row this thread
holds: each instance built by Django adds what it was built with (``post_init``: a load, a
``refresh_from_db``, a deferred field fetched), and each save adds the columns it wrote. So a
row refreshed, or saved through another instance, is compared with what the database holds
now, not with what one instance once read — without replacing anything on the application's
model classes. An instance built by hand (``Model(...)``) adds what it was built with too, but
that counts only once Django says it came from the database (``_state.adding`` false); a
hand-built instance saved for the first time has no snapshot: all its columns count as
written.

Each piece of knowledge is tied to its transaction (``transactions.Fate``): a save whose
savepoint or transaction rolled back no longer counts (the row holds again what came before
it), a read counts only while the transaction it was made in stands, and a read made after a
pending save of the row stands and falls with that save. Values that can change in place (a
JSONField's dict, an ArrayField's list) are copied, so mutating the instance's value never
mutates the snapshot. Only loaded columns are kept: deferred fields are never touched. A
column an instance holds whose stored value is not known counts as changed.
"""

from __future__ import annotations

import copy
import datetime
import decimal
import logging
import threading
import uuid
import weakref
from collections.abc import Iterable
from functools import partial
from typing import Any

from django.db import models
from django.db.models.base import ModelState
from django.db.models.signals import post_init

from realtime.writes import transactions
from realtime.writes.transactions import Fate

logger = logging.getLogger(__name__)

ROW = "_realtime_row"
#: Set in ``pre_save`` on an instance Django is about to insert or that was built by hand.
NEW = "_realtime_new"
_MISSING = object()
#: Stands for a value nobody knows any more (its layer rolled back, or it could not be copied).
_UNKNOWN = object()
#: Values of these types (and their subclasses) cannot change in place: kept, not copied.
_IMMUTABLE = (
    str,
    int,
    float,
    bool,
    bytes,
    type(None),
    decimal.Decimal,
    datetime.date,
    datetime.time,
    datetime.timedelta,
    uuid.UUID,
)
#: The same, looked up by exact type first: a snapshot is taken of every row loaded.
_IMMUTABLE_TYPES = frozenset(_IMMUTABLE)
UID = "realtime:snapshot"


class Layer:
    """What one read or one save told of the row."""

    __slots__ = ("db", "fates", "state", "values")

    def __init__(
        self,
        values: dict[str, Any],
        fates: tuple[Fate, ...],
        state: ModelState | None = None,
        db: str | None = None,
    ) -> None:
        self.values = values
        self.fates = fates
        #: A read: the state of the instance that read it (its ``db`` and whether it came
        #: from the database are known only once Django has finished building it).
        self.state = state
        #: A save: the alias written.
        self.db = db

    def alias(self) -> str | None:
        """The database this layer is about; ``None`` for what no database told."""
        state = self.state
        if state is None:
            return self.db
        return None if state.adding else state.db

    def stands(self) -> bool | None:
        """Whether it still counts: all its fates stand (``None``: cannot tell)."""
        answer: bool | None = True
        for made in self.fates:
            stands = made.stands()
            if stands is False:
                return False
            if stands is None:
                answer = None
        return answer


class Row:
    """Everything this thread knows of one row, shared by its instances."""

    __slots__ = ("__weakref__", "layers")

    def __init__(self) -> None:
        self.layers: list[Layer] = []

    def __reduce__(self) -> tuple[type[Row], tuple[()]]:
        # A pickled instance (a cache) comes back knowing nothing: its transactions are gone.
        return (Row, ())

    def __deepcopy__(self, memo: dict[int, Any]) -> Row:
        return Row()

    def pending_saves(self) -> tuple[Fate, ...]:
        """The fates of saves of the row whose transaction is still open."""
        return tuple(
            made
            for layer in self.layers
            if layer.state is None
            for made in layer.fates
            if not made.settled()
        )

    def settle(self) -> None:
        """Fold the leading layers whose fate is final into one, so that a long-lived row
        keeps a few layers; drop the reads of instances that never came from the database."""
        folded: dict[str, Any] = {}
        alias: str | None = None
        taken = 0
        for layer in self.layers:
            if layer.state is not None and layer.state.adding:
                taken += 1
                continue
            if not all(made.settled() for made in layer.fates):
                break
            if alias is not None and layer.alias() != alias:
                break
            alias = layer.alias()
            if layer.stands():
                folded.update(layer.values)
            else:
                for attname in layer.values:
                    folded.setdefault(attname, _UNKNOWN)
            taken += 1
        if taken > 1 or (taken and alias is None):
            self.layers[:taken] = [] if alias is None else [Layer(folded, (), db=alias)]

    def forget_reads_of(self, state: ModelState) -> None:
        """Drop what an instance was built with (it was built by hand, not read)."""
        self.layers = [layer for layer in self.layers if layer.state is not state]


class _Rows(threading.local):
    """This thread's rows by (concrete model, primary key), while an instance holds them."""

    def __init__(self) -> None:
        self.by_key: dict[tuple[Any, Any], weakref.KeyedRef[Any, Row]] = {}
        self.forget = partial(_forget, self.by_key)

    def get(self, key: tuple[Any, Any]) -> Row:
        by_key = self.by_key
        ref = by_key.get(key)
        row = None if ref is None else ref()
        if row is None:
            row = Row()
            by_key[key] = weakref.KeyedRef(row, self.forget, key)
        return row


def _forget(
    by_key: dict[tuple[Any, Any], weakref.KeyedRef[Any, Row]], ref: weakref.KeyedRef[Any, Row]
) -> None:
    if by_key.get(ref.key) is ref:
        del by_key[ref.key]


_rows = _Rows()


def _row_of(instance: models.Model, pk: Any) -> Row:
    try:
        return _rows.get((instance._meta.concrete_model, pk))
    except TypeError:  # a primary key that cannot be hashed: known to this instance only
        return Row()


def track(model: type[models.Model]) -> None:
    """Keep what instances of ``model`` are built with (connected per model, never for every
    model: a global receiver would cost every model's instances). Idempotent."""
    post_init.connect(loaded, sender=model, dispatch_uid=UID)


def untrack(model: type[models.Model]) -> None:
    post_init.disconnect(sender=model, dispatch_uid=UID)


def loaded(sender: type[models.Model], instance: models.Model, **kwargs: Any) -> None:
    """``post_init``: note what the instance was built with, to count once Django says it
    came from the database."""
    try:
        pk = instance.pk
        if pk is None:
            return  # a new row: its first save starts what is known of it
        row = _row_of(instance, pk)
        instance.__dict__[ROW] = row
        fates = transactions.reads()
        layers = row.layers
        if layers:
            row.settle()
            fates += row.pending_saves()
        layers.append(Layer(_taken(instance, None), fates, instance._state))
    except Exception:
        logger.exception("realtime: reading a loaded %s failed", type(instance).__name__)
        instance.__dict__.pop(ROW, None)


def saving(instance: models.Model) -> None:
    """``pre_save``: an instance Django is about to insert, or built by hand, has no snapshot
    for this save (what it was built with was never read from the database)."""
    if instance._state.adding:
        instance.__dict__[NEW] = True
        row: Row | None = instance.__dict__.get(ROW)
        if row is not None:
            row.forget_reads_of(instance._state)


def saved(instance: models.Model, attnames: Iterable[str], using: str) -> None:
    """``post_save``: the columns written are what the row holds, if this save commits."""
    try:
        instance.__dict__.pop(NEW, None)
        pk = instance.pk
        row = instance.__dict__.get(ROW)
        if row is None:
            if pk is None:
                return
            row = instance.__dict__[ROW] = _row_of(instance, pk)
        row.settle()
        row.layers.append(Layer(_taken(instance, attnames), (transactions.fate(using),), db=using))
    except Exception:
        logger.exception("realtime: taking a snapshot of %s failed", type(instance).__name__)
        instance.__dict__.pop(ROW, None)


def before(instance: models.Model) -> dict[str, Any] | None:
    """What the row holds as far as this thread knows, by attname; ``None`` without a
    snapshot.

    A layer that rolled back is ignored (its writes were undone, the row holds what the layers
    before it say); a column only such layers knew is unknown, and compares unequal to
    anything.
    """
    values = instance.__dict__
    row: Row | None = values.get(ROW)
    if row is None or NEW in values or instance._state.adding:
        return None
    db = instance._state.db
    known: dict[str, Any] = {}
    lost: set[str] = set()
    counted = False
    for layer in row.layers:
        if layer.alias() != db:
            continue
        counted = True
        if layer.stands():
            known.update(layer.values)
        else:
            lost.update(layer.values)
    if not counted:
        return None
    for attname in lost:
        known.setdefault(attname, _UNKNOWN)
    return known


def changed_fields(instance: models.Model, update_fields: Iterable[str] | None) -> list[str]:
    """The sorted ``Field.name``s an update wrote (see the module docstring)."""
    meta = instance._meta
    if update_fields is not None:
        return sorted({meta.get_field(name).name for name in update_fields})
    known = before(instance)
    concrete = [f for f in meta.concrete_fields if not f.primary_key]
    if known is None:
        return sorted(f.name for f in concrete)
    values = instance.__dict__
    return sorted(
        f.name
        for f in concrete
        if f.attname in values and (f.attname not in known or differs(values, known, f.attname))
    )


def knows(known: dict[str, Any], attname: str) -> bool:
    """Whether ``known`` (from ``before``) holds a value of ``attname`` that is still known."""
    return attname in known and known[attname] is not _UNKNOWN


def differs(values: dict[str, Any], known: dict[str, Any], attname: str) -> bool:
    """Whether the instance's value of ``attname`` differs from the one known."""
    was = known[attname]
    if was is _UNKNOWN:
        return True
    try:
        return bool(values.get(attname, _MISSING) != was)
    except Exception:  # a value whose comparison fails is taken as changed
        return True


def all_fields(instance: models.Model) -> list[str]:
    """The names of every concrete column but the primary key."""
    return [f.name for f in instance._meta.concrete_fields if not f.primary_key]


def written_attnames(instance: models.Model, update_fields: Iterable[str] | None) -> list[str]:
    meta = instance._meta
    if update_fields is None:
        return [f.attname for f in meta.concrete_fields]
    return [meta.get_field(name).attname for name in update_fields]  # type: ignore[union-attr]


def _taken(instance: models.Model, attnames: Iterable[str] | None) -> dict[str, Any]:
    """The current values of ``attnames`` (default: every loaded concrete column)."""
    values = instance.__dict__
    if attnames is None:
        attnames = _columns(type(instance))
    taken = {attname: values[attname] for attname in attnames if attname in values}
    for attname, value in taken.items():
        if type(value) not in _IMMUTABLE_TYPES:
            taken[attname] = _frozen(value)
    return taken


_attnames: dict[type[models.Model], tuple[str, ...]] = {}


def _columns(model: type[models.Model]) -> tuple[str, ...]:
    """The attnames of ``model``'s concrete fields (looked up once per model)."""
    try:
        return _attnames[model]
    except KeyError:
        found = _attnames[model] = tuple(f.attname for f in model._meta.concrete_fields)
        return found


def _frozen(value: Any) -> Any:
    """``value``, or a deep copy of it when it could change in place."""
    if isinstance(value, _IMMUTABLE):
        return value
    try:
        return copy.deepcopy(value)
    except Exception:
        return _UNKNOWN
