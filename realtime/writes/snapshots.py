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
#: Stands for a value written without an instance (a bulk ``update()``): unknown from then on,
#: erasing what earlier layers knew, if that write stands.
_WRITTEN = object()
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

    __slots__ = ("db", "fates", "state", "values", "wrote")

    def __init__(
        self,
        values: dict[str, Any],
        fates: tuple[Fate, ...],
        state: ModelState | None = None,
        db: str | None = None,
        wrote: bool = False,
    ) -> None:
        self.values = values
        self.fates = fates
        #: A read: the state of the instance that read it (its ``db`` and whether it came
        #: from the database are known only once Django has finished building it).
        self.state = state
        #: Otherwise, the alias it is about.
        self.db = db
        #: A save: reads made after it stand and fall with it.
        self.wrote = wrote

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

    def settled(self) -> bool:
        return all(made.settled() for made in self.fates)


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
            if layer.wrote
            for made in layer.fates
            if not made.settled()
        )

    def settle(self) -> None:
        """Keep a few layers however long the row lives and however often it is read: a layer
        whose fate is final becomes a plain one, and neighbours about the same database that
        stand or fall together become one. What instances built by hand were built with is
        dropped (it was never read)."""
        kept: list[Layer] = []
        for layer in self.layers:
            alias = layer.alias()
            if alias is None:
                continue
            if layer.fates and layer.settled():
                layer = Layer(_final(layer), (), db=alias)
            last = kept[-1] if kept else None
            if last is not None and last.alias() == alias:
                if not last.fates and not layer.fates:
                    kept[-1] = Layer(_over(last.values, layer.values), (), db=alias)
                    continue
                if last.fates == layer.fates and not (last.wrote or layer.wrote):
                    kept[-1] = Layer(_over(last.values, layer.values), layer.fates, db=alias)
                    continue
            kept.append(layer)
        self.layers = kept

    def forget_reads_of(self, state: ModelState) -> None:
        """Drop what an instance was built with (it was built by hand, not read)."""
        self.layers = [layer for layer in self.layers if layer.state is not state]


def _final(layer: Layer) -> dict[str, Any]:
    """What a layer whose fate is final says: its values, or nothing known if it fell."""
    if layer.stands():
        return layer.values
    return dict.fromkeys(layer.values, _UNKNOWN)


def _over(known: dict[str, Any], then: dict[str, Any]) -> dict[str, Any]:
    """``known`` told again by a later layer: what the later one lost does not erase it."""
    merged = dict(known)
    for attname, value in then.items():
        if value is not _UNKNOWN or attname not in merged:
            merged[attname] = value
    return merged


class _Rows(threading.local):
    """This thread's rows by (concrete model, primary key), while an instance holds them."""

    def __init__(self) -> None:
        self.by_key: dict[tuple[Any, Any], weakref.ref[Row]] = {}

    def get(self, key: tuple[Any, Any]) -> Row:
        by_key = self.by_key
        ref = by_key.get(key)
        row = None if ref is None else ref()
        if row is None:
            row = Row()
            by_key[key] = weakref.ref(row, partial(_forget, by_key, key))
        return row


def _forget(
    by_key: dict[tuple[Any, Any], weakref.ref[Row]], key: tuple[Any, Any], ref: weakref.ref[Row]
) -> None:
    if by_key.get(key) is ref:
        del by_key[key]


_rows = _Rows()


def _row_of(instance: models.Model, pk: Any) -> Row:
    try:
        return _rows.get((_shape(type(instance)).concrete, pk))
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
        pk = _shape(sender).pk_of(instance.__dict__)
        if pk is None:
            return  # a new row: its first save starts what is known of it
        row = _row_of(instance, pk)
        instance.__dict__[ROW] = row
        fates = transactions.reads()
        if row.layers:
            row.settle()
            fates += row.pending_saves()
        row.layers.append(Layer(_taken(instance, None), fates, instance._state))
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
        made = (transactions.fate(using),)
        row.layers.append(Layer(_taken(instance, attnames), made, db=using, wrote=True))
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
            known = _over(known, layer.values)
        else:
            lost.update(layer.values)
    if not counted:
        return None
    for attname in lost:
        known.setdefault(attname, _UNKNOWN)
    for attname, value in known.items():
        if value is _WRITTEN:
            known[attname] = _UNKNOWN
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


class _Shape:
    """What every snapshot of a model reads, looked up once per model."""

    __slots__ = ("columns", "concrete", "parts", "pk")

    def __init__(self, model: type[models.Model]) -> None:
        meta = model._meta
        self.concrete = meta.concrete_model
        self.pk = meta.pk.attname if meta.pk is not None else ""
        #: A composite primary key's columns (its value is theirs, as a tuple).
        self.parts = tuple(f.attname for f in getattr(meta.pk, "fields", ()))
        self.columns = tuple(f.attname for f in meta.concrete_fields)

    def pk_of(self, values: dict[str, Any]) -> Any:
        """The primary key held in an instance's ``values``; ``None`` while unset."""
        if not self.parts:
            return values.get(self.pk)
        key = tuple(values.get(attname) for attname in self.parts)
        return None if None in key else key


_shapes: dict[type[models.Model], _Shape] = {}


def _shape(model: type[models.Model]) -> _Shape:
    try:
        return _shapes[model]
    except KeyError:
        shape = _shapes[model] = _Shape(model)
        return shape


def _columns(model: type[models.Model]) -> tuple[str, ...]:
    return _shape(model).columns


def _frozen(value: Any) -> Any:
    """``value``, or a deep copy of it when it could change in place."""
    if isinstance(value, _IMMUTABLE):
        return value
    try:
        return copy.deepcopy(value)
    except Exception:
        return _UNKNOWN


def overwritten(
    model: type[models.Model], pks: Iterable[Any], attnames: Iterable[str], using: str
) -> None:
    """Rows whose ``attnames`` were written without their instances (a bulk ``update()``):
    if that write commits, what this thread knew of those columns no longer holds (a row read
    again afterwards is known again)."""
    concrete = _shape(model).concrete
    by_key = _rows.by_key
    values = dict.fromkeys(attnames, _WRITTEN)
    made = (transactions.fate(using),)
    for pk in pks:
        ref = by_key.get((concrete, pk))
        row = None if ref is None else ref()
        if row is not None:
            row.settle()
            row.layers.append(Layer(dict(values), made, db=using, wrote=True))
