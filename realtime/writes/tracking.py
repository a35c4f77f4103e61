"""What this thread knows each row of a decorated model holds, so that an update knows what it
changed — at a cost a read barely notices.

Where it is learnt:

* **A load** through a ``RealtimeQuerySet`` (a decorated model's managers, its related
  managers): one ``Loaded`` per fetch keeps the rows' loaded columns column by column, and each
  instance's ``ModelState`` points at it (``realtime.compat.django.keep_on_state``). No object
  is made per row: a read of 20,000 rows makes a few lists, not 20,000 snapshots (an object
  per row doubles a read's cost in Python's garbage collector alone). Values that can change
  in place (a ``JSONField``'s dict) are copied; deferred columns are not there.
* **A write** — a save, an ``update()``, a ``bulk_update`` — is noted in this thread's log of
  writes with its fate (below): what a save wrote, or the columns a bulk write made unknown
  for the rows it wrote. An instance saved without having been loaded (a new row, a row built
  by hand) points at the moment of its save: it knows what it wrote from then on.

What an instance knows (``known``) is its snapshot, overlaid in order by the later writes of
its row in the log that still stand — its own saves, another instance's, a bulk write's. A
write whose savepoint or transaction rolled back is left out; values read while a write that
then rolled back was pending are unknown; a column nobody knows (not loaded, deferred, written
by a bulk write, garbled by a rollback) is ``UNKNOWN``, and counts as changed. So ``changed``
may over-report, never under-report what this thread knows the row held. What another process
or raw SQL wrote since is not known here: a save that overwrites it says what changed from
what this thread last read or wrote.

A **fate** is told by an ``on_commit`` callback of realtime's own, held by Django alone: it
has run (committed), is still held (stands so far) or was released unrun (rolled back) — known
at once, because Django drops a discarded callback when it discards it (checked once per
process: ``realtime.compat.django.callbacks_released``; where it does not hold, a pending fate
is undecided, and a column it wrote is unknown). Released unrun with no transaction open is no
rollback: a callback of the application's registered with ``robust=False`` raised before it,
after the commit (``realtime.compat.django.callbacks_committed``): it stands. A save's fate is
told by the callback of its announcement (one callback a save, not two); the rows of one bulk
write share one.

The log is bounded (``LOG_ROWS`` rows, ``LOG_BYTES`` of the text and binary values they wrote,
``LOG_BULK`` bulk writes per model): past it, it starts afresh, and whatever was loaded before
then is known no more (every column counts as changed). The bytes bound matters once the
instances are gone: the log would otherwise keep every large value its last rows wrote.
"""

from __future__ import annotations

import copy
import datetime
import decimal
import itertools
import threading
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from django.db import connections, models, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.transaction import TransactionManagementError

from realtime.compat.django import callbacks_committed, callbacks_released, in_transaction
from realtime.compat.django_orm import keep_on_state, kept_on_state
from realtime.paths import django_field_class, key_fields

#: Stands for a value nobody knows: compares unequal to anything.
UNKNOWN: Any = object()
#: Rows of the log of writes before it starts afresh.
LOG_ROWS = 10_000
#: Bytes of text and binary values the log's rows wrote before it starts afresh (what else a
#: row holds is small: a write of 10,000 rows of numbers and short text stays under it).
LOG_BYTES = 8 * 1024 * 1024
#: Bulk writes of one model kept in the log before it starts afresh.
LOG_BULK = 100
#: An instance's own writes kept one by one before those that are final are folded.
OWN_WRITES = 8
#: Pending writes of a model noted before the final ones are first dropped from the list.
PRUNE_AFTER = 64

#: Values of these types cannot change in place: kept as they are.
_IMMUTABLE = frozenset(
    {
        str,
        int,
        float,
        bool,
        bytes,
        type(None),
        decimal.Decimal,
        datetime.date,
        datetime.datetime,
        datetime.time,
        datetime.timedelta,
        uuid.UUID,
    }
)
#: Django's own fields whose values never change in place: these classes, and the subclasses
#: that leave their values to them (``django_field_class``). A subclass may read its column
#: otherwise, whatever ``get_internal_type()`` it reports: a ``CharField`` giving a list
#: (django-multiselectfield's), a ``TextField`` an object it keeps as JSON text. The values
#: of any other field are looked at, and copied when they could.
_PLAIN_FIELDS: frozenset[type[models.Field[Any, Any]]] = frozenset(
    {
        models.AutoField,
        models.BigAutoField,
        models.SmallAutoField,
        models.BigIntegerField,
        models.IntegerField,
        models.SmallIntegerField,
        models.PositiveBigIntegerField,
        models.PositiveIntegerField,
        models.PositiveSmallIntegerField,
        models.BooleanField,
        models.CharField,
        models.TextField,
        models.SlugField,
        models.EmailField,
        models.URLField,
        models.DateField,
        models.DateTimeField,
        models.TimeField,
        models.DurationField,
        models.DecimalField,
        models.FloatField,
        models.UUIDField,
        models.GenericIPAddressField,
        models.IPAddressField,
        models.ForeignKey,
        models.OneToOneField,
        models.FileField,
        models.ImageField,
        models.FilePathField,
        models.BinaryField,
    }
)

_sequence = itertools.count(1)


# Fates ------------------------------------------------------------------------------------------


class Fate:
    """Whether a write made in a transaction stands (see the module docstring)."""

    __slots__ = ("__weakref__", "_callback", "_connection", "ran", "using")

    def __init__(self, using: str, connection: BaseDatabaseWrapper) -> None:
        self.using = using
        self.ran = False
        #: The callback Django holds for it, weakly (``_unregistered`` until there is one).
        self._callback: Callable[[], object | None] = _unregistered
        #: The connection of the write, weakly: the one whose state tells a release apart.
        self._connection = weakref.ref(connection)

    def stands(self) -> bool | None:
        """``True``: committed or still held; ``False``: rolled back; ``None``: cannot tell."""
        if self.ran:
            return True
        if self._callback() is None:
            return False
        return True if callbacks_released(connections[self.using]) else None

    def settled(self) -> bool:
        """Whether its fate is final: run, or released unrun."""
        return self.ran or self._callback() is None

    def told_by(self, callback: Callable[[], None]) -> None:
        """``callback``, which marks this fate run when it runs, is about to be registered
        with ``on_commit`` (a save's announcement carries its fate: one callback, not two)."""
        self._callback = weakref.ref(callback, _released_by(self))

    def released(self) -> None:
        """Its callback was let go of unrun. With no transaction open on its connection that
        is no rollback: a callback of the application's (``robust=False``) raised before it
        in the run of a committed transaction's callbacks — which committed, and stands."""
        connection = self._connection()
        if not self.ran and connection is not None and callbacks_committed(connection):
            self.ran = True


def _released_by(made: Fate) -> Callable[[Any], None]:
    """What tells ``made`` that its callback was let go of (holding it weakly: a fate kept
    by nothing else may go first)."""
    fate_ref = weakref.ref(made)

    def released(_: Any) -> None:
        alive = fate_ref()
        if alive is not None:
            alive.released()

    return released


def _unregistered() -> object:
    """What a fate's callback is before it is registered: still held."""
    return _unregistered


class _Callback:
    """What Django holds: running it marks its fate committed."""

    __slots__ = ("__weakref__", "fate")

    def __init__(self, fate: Fate) -> None:
        self.fate = fate

    def __call__(self) -> None:
        self.fate.ran = True


def fate(using: str, register: bool = True) -> Fate:
    """The fate of a write made now on ``using`` (committed at once outside a transaction);
    ``register=False``: one to be told by an announcement's callback, or ``register``ed."""
    made = Fate(using, connections[using])
    if register:
        _register(made)
    return made


def register(made: Fate) -> None:
    """Register the callback of ``made``, unless an announcement's callback tells it."""
    if made._callback is _unregistered:
        _register(made)


def _register(made: Fate) -> None:
    connection = made._connection()
    if connection is not None and not in_transaction(connection):
        # Committed already (autocommit), or under manual transaction management, with no
        # commit to await: what ``on_commit`` would do at once, without a callback.
        made.ran = True
        return
    callback = _Callback(made)
    made._callback = weakref.ref(callback, _released_by(made))
    try:
        transaction.on_commit(callback, using=made.using, robust=True)
    except TransactionManagementError:  # manual transaction management: nothing to await
        made.ran = True


# Snapshots --------------------------------------------------------------------------------------


class Loaded:
    """The columns of the rows one fetch loaded, column by column (see the module docstring)."""

    __slots__ = ("attnames", "columns", "db", "depends", "index", "key", "seq")

    def __init__(
        self,
        db: str,
        attnames: list[str],
        columns: list[list[Any]],
        index: dict[int, int],
        key: tuple[int, ...],
        depends: Iterable[Write],
    ) -> None:
        self.db = db
        self.seq = next(_sequence)
        self.attnames = attnames
        self.columns = columns
        #: Row by ``id()`` of its instance's state, checked against the row's key.
        self.index = index
        #: Where the key's columns are (several: a composite key; none: not loaded).
        self.key = key
        #: Writes of the model still pending when it was read: what they wrote is unknown
        #: if they roll back.
        self.depends = depends

    def row_of(self, state: Any, pk: Any) -> int | None:
        """The row ``state``'s instance was loaded as, if its key is still ``pk``."""
        row = self.index.get(id(state))
        if row is None or not self.key or self.key_at(row) != pk:
            return None
        return row

    def key_at(self, row: int) -> Any:
        if len(self.key) == 1:
            return self.columns[self.key[0]][row]
        return tuple(self.columns[position][row] for position in self.key)

    def values_at(self, row: int) -> dict[str, Any]:
        columns = zip(self.attnames, self.columns, strict=True)
        return {attname: column[row] for attname, column in columns}

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        # A pickled instance (a cache) comes back knowing nothing: its transactions are gone.
        return (_forgotten, ())

    def __deepcopy__(self, memo: dict[int, Any]) -> None:
        return None


class Own:
    """What one instance knows of its row beyond a fetch it shares: the values it was loaded
    with (``loaded``, its row of that fetch) or, for a row it wrote without loading it or
    read again, values of its own as of ``seq``; then its own writes since, in order. Its
    writes are its own, whichever thread made them; a fetch's instances share nothing else."""

    __slots__ = ("db", "depends", "loaded", "seq", "values", "writes")

    def __init__(
        self,
        db: str,
        seq: int,
        loaded: Loaded | None = None,
        values: dict[str, Any] | None = None,
        depends: Iterable[Write] = (),
    ) -> None:
        self.db = db
        self.seq = seq
        self.loaded = loaded
        self.values = values or {}
        self.depends = depends
        self.writes: list[Write] = []

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return (_forgotten, ())

    def __deepcopy__(self, memo: dict[int, Any]) -> None:
        return None


def _forgotten() -> None:
    return None


class Write:
    """One write of the log: what a save wrote (``values``), or the columns a bulk write made
    unknown (``values`` of ``UNKNOWN``), and the keys of the rows it wrote (``None``: not
    known, any row of the model)."""

    __slots__ = ("fate", "pks", "seq", "values")

    def __init__(self, values: dict[str, Any], made: Fate, pks: frozenset[Any] | None) -> None:
        self.seq = next(_sequence)
        self.values = values
        self.fate = made
        self.pks = pks

    def weight(self) -> int:
        """Bytes of the text and binary values it holds, those nested in JSON values too."""
        total = 0
        for value in self.values.values():
            kind = type(value)
            if kind is str:
                total += len(value)
            elif kind is not int and value is not None:
                total += _weight(value)
        return total


def _weight(value: Any) -> int:
    """Bytes ``value``'s text and binary parts take (a number, a date: none counted)."""
    kind = type(value)
    if kind is str or kind is bytes:
        return len(value)
    if kind is dict:
        return sum(_weight(key) + _weight(item) for key, item in value.items())
    if kind is list or kind is tuple:
        return sum(_weight(item) for item in value)
    if isinstance(value, str | bytes | bytearray | memoryview):
        return len(value)
    return 0


class Pending:
    """The writes of a model pending when a fetch read it: the first ``count`` of a list the
    log only appends to (it replaces it, never changes it), so that the fetch copies none."""

    __slots__ = ("count", "writes")

    def __init__(self, writes: list[Write], count: int) -> None:
        self.writes = writes
        self.count = count

    def __iter__(self) -> Iterator[Write]:
        return itertools.islice(self.writes, self.count)


NO_PENDING = Pending([], 0)


class _Log(threading.local):
    """This thread's writes of decorated rows (see the module docstring)."""

    def __init__(self) -> None:
        #: Saves, by (alias, concrete model, primary key), oldest first.
        self.rows: dict[tuple[str, Any, Any], list[Write]] = {}
        #: Bulk writes, by (alias, concrete model), oldest first.
        self.bulk: dict[tuple[str, Any], list[Write]] = {}
        #: Writes whose fate was not final when last looked at, by concrete model: appended
        #: to, and replaced by a list of those still pending once it has doubled.
        self.pending: dict[Any, list[Write]] = {}
        self.prune_at: dict[Any, int] = {}
        #: What was loaded before this (a sequence number) is known no more.
        self.horizon = 0
        self.size = 0
        #: Bytes of text and binary values its writes hold (``weight``).
        self.bytes = 0

    def note(self, key: Any, model: Any, write: Write, bulk: bool) -> None:
        held = write.weight()
        full = self.size >= LOG_ROWS or self.bytes + held > LOG_BYTES
        if full or len(self.bulk.get(key, ())) >= LOG_BULK:
            self.restart()
        table = self.bulk if bulk else self.rows
        table.setdefault(key, []).append(write)
        self.size += 1
        self.bytes += held
        if write.fate.ran:  # made outside a transaction: final already
            return
        pending = self.pending.setdefault(model, [])
        pending.append(write)
        if len(pending) >= self.prune_at.get(model, PRUNE_AFTER):
            left = self.pending[model] = [w for w in pending if not w.fate.settled()]
            self.prune_at[model] = max(PRUNE_AFTER, 2 * len(left))

    def restart(self) -> None:
        self.rows.clear()
        self.bulk.clear()
        self.pending.clear()
        self.prune_at.clear()
        self.size = 0
        self.bytes = 0
        self.horizon = next(_sequence)

    def pending_for(self, model: Any) -> Pending:
        """The model's writes pending now."""
        pending = self.pending.get(model)
        if not pending:
            return NO_PENDING
        left = self.pending[model] = [w for w in pending if not w.fate.settled()]
        self.prune_at[model] = max(PRUNE_AFTER, 2 * len(left))
        return Pending(left, len(left))

    def any_pending(self, model: Any) -> bool:
        """Whether a write of the model is not final yet."""
        return any(not w.fate.settled() for w in self.pending.get(model, ()))


_log = _Log()


class _Shape:
    """What the snapshots of one model read, looked up once per model."""

    __slots__ = ("columns", "concrete", "key", "looked_at")

    def __init__(self, model: type[models.Model]) -> None:
        meta = model._meta
        #: The concrete model, as the log names it: by label and ``id()`` (the log holds no
        #: class, which may be a short-lived one). A multi-table row is one row whichever of
        #: its models writes it: named by the model whose key its key is (followed through
        #: the parent links the key is), an instance of the parent and one of the child see
        #: each other's writes. A child keyed apart from its parents stays a model of its own.
        root: Any = meta.concrete_model or model
        while (up := getattr(root._meta.pk, "remote_field", None)) is not None and up.parent_link:
            root = up.model
        self.concrete = (root._meta.label_lower, id(root))
        #: The key's columns (several: a composite key).
        self.key = tuple(f.attname for f in key_fields(model))
        self.columns = tuple(f.attname for f in meta.concrete_fields)
        #: Columns whose values may change in place: looked at one by one, copied if so.
        self.looked_at = frozenset(
            f.attname for f in meta.concrete_fields if django_field_class(f) not in _PLAIN_FIELDS
        )


_shapes: weakref.WeakKeyDictionary[type[models.Model], _Shape] = weakref.WeakKeyDictionary()


def _shape(model: type[models.Model]) -> _Shape:
    shape = _shapes.get(model)
    if shape is None:
        shape = _shapes[model] = _Shape(model)
    return shape


def loaded(
    db: str, instances: Sequence[models.Model], refreshing: models.Model | None = None
) -> None:
    """Keep what ``instances`` (one fetch of a ``RealtimeQuerySet`` on ``db``) were loaded
    with. ``refreshing``: the instance the fetch is for (``refresh_from_db``), which then
    knows what it read besides what it knew.

    The instances of a fetch are of one class, each loaded with the same columns, unless the
    queryset's iterable makes them otherwise (django-model-utils' ``select_subclasses()``,
    django-polymorphic: a child's row as the child, of more columns): then each class, and
    each set of columns, has a snapshot of its own. What is no model instance is not kept."""
    if not instances:
        return
    classes = set(map(type, instances))
    if len(classes) > 1:
        for kind in classes:
            if issubclass(kind, models.Model):
                alike = [instance for instance in instances if type(instance) is kind]
                _loaded_alike(db, alike, refreshing)
    elif issubclass(classes.pop(), models.Model):
        _loaded_alike(db, instances, refreshing)


def _loaded_alike(
    db: str, instances: Sequence[models.Model], refreshing: models.Model | None
) -> None:
    """``loaded`` for ``instances`` of one class."""
    shape = _shape(type(instances[0]))
    dicts = [instance.__dict__ for instance in instances]
    first = dicts[0]
    attnames = [attname for attname in shape.columns if attname in first]
    try:
        columns = [[values[attname] for values in dicts] for attname in attnames]
    except KeyError:  # loaded with different columns
        for alike in _by_columns(shape, instances):
            _loaded_alike(db, alike, refreshing)
        return
    for position, attname in enumerate(attnames):
        if attname in shape.looked_at and not _IMMUTABLE.issuperset(map(type, columns[position])):
            # Told apart by their types at once: a column of text (a field class of the
            # application's own, most often) costs a read no call per row.
            columns[position] = [_frozen(value) for value in columns[position]]
    key = tuple(attnames.index(part) for part in shape.key if part in attnames)
    if len(key) != len(shape.key):
        key = ()
    states = [values["_state"] for values in dicts]
    index = {id(state): row for row, state in enumerate(states)}
    snapshot = Loaded(db, attnames, columns, index, key, _log.pending_for(shape.concrete))
    keep_on_state(states, snapshot)
    if refreshing is not None and _shape(type(refreshing)).concrete == shape.concrete:
        _refreshed(refreshing, snapshot, db)


def _by_columns(shape: _Shape, instances: Sequence[models.Model]) -> list[list[models.Model]]:
    """``instances`` (of one class) grouped by the columns each was loaded with."""
    groups: dict[tuple[str, ...], list[models.Model]] = {}
    for instance in instances:
        values = instance.__dict__
        columns = tuple(attname for attname in shape.columns if attname in values)
        groups.setdefault(columns, []).append(instance)
    return list(groups.values())


def inserted(instances: Sequence[models.Model], using: str) -> None:
    """``instances`` were just inserted together (``bulk_create``) on ``using``: each knows
    its row holds what it wrote, as a fetch would have told it (one snapshot for them all).
    No other instance can know their rows yet, so the log notes nothing."""
    instances = [i for i in instances if not i._state.adding and i._state.db == using]
    if len({type(instance) for instance in instances}) == 1:
        loaded(using, instances)
    else:
        made = fate(using)
        for instance in instances:
            saved(instance, written_attnames(instance, None), using, made)


def _refreshed(instance: models.Model, snapshot: Loaded, db: str) -> None:
    """``instance`` read again the columns of its row in ``snapshot`` (``refresh_from_db``)."""
    pk = instance.pk
    if not snapshot.key:
        return
    rows = [row for row in range(len(snapshot.index)) if snapshot.key_at(row) == pk]
    if len(rows) != 1:
        return
    values = known(instance) or {}
    values.update(snapshot.values_at(rows[0]))
    keep_on_state([instance._state], Own(db, snapshot.seq, values=values, depends=snapshot.depends))


def known(instance: models.Model, using: str | None = None) -> dict[str, Any] | None:
    """What this thread knows the row of ``instance`` on ``using`` (``None``: the database it
    was read from or last saved to) holds, by attname (``UNKNOWN`` for a column not known);
    ``None`` when it knows nothing of it. What was learnt on another database is nothing known
    of this row: ``save(using="other")`` of an instance read from ``default`` writes over a
    row of ``other`` that may hold anything (Django moves ``_state.db`` once the save is
    done)."""
    state = instance._state
    if state.adding:
        return None
    snapshot = kept_on_state(state)
    if snapshot is None or snapshot.db != (using or state.db):
        return None
    pk = instance.pk
    own: tuple[Write, ...] = ()
    holder: Loaded | Own = snapshot
    if isinstance(snapshot, Own):
        own = tuple(snapshot.writes)
        base = snapshot.loaded
        values = dict(snapshot.values)
    else:
        base, values = snapshot, {}
    if base is not None:
        row = base.row_of(state, pk)
        if row is None:
            return None
        values = base.values_at(row)
        holder = base
    depends = _undecided(holder)
    if snapshot.seq < _log.horizon:
        # The log started afresh since: what other instances wrote meanwhile is not known,
        # only what this one wrote.
        if not own:
            return None
        values, depends = {}, []
    for write in depends:
        if write.fate.stands() is not True and (write.pks is None or pk in write.pks):
            for attname in write.values:
                values[attname] = UNKNOWN
    _overlay(values, snapshot.seq, own, snapshot.db, _shape(type(instance)).concrete, pk)
    return values


def _undecided(holder: Loaded | Own) -> list[Write]:
    """The writes ``holder`` depends on that did not commit (yet): those that did are dropped
    from it for good, so each is looked at once, however often its rows are asked about."""
    left = [write for write in holder.depends if not write.fate.ran]
    holder.depends = left
    return left


def _overlay(
    values: dict[str, Any],
    since: int,
    own: tuple[Write, ...],
    db: str,
    concrete: Any,
    pk: Any,
) -> None:
    """Apply to ``values``, in order, the writes of the row made after ``since``: the
    instance's ``own``, and those this thread noted (another instance's, a bulk write's).
    An own write of another row is left out: ``copy.copy()`` of an instance shares its
    snapshot with the copy, which may be saved as a new row."""
    found = {id(write): write for write in own if write.pks is None or pk in write.pks}
    if since >= _log.horizon:
        try:
            noted = _log.rows.get((db, concrete, pk), ())
        except TypeError:  # a key that cannot be hashed: nothing noted about it
            noted = ()
        for write in (*noted, *_log.bulk.get((db, concrete), ())):
            if write.seq > since and (write.pks is None or pk in write.pks):
                found[id(write)] = write
    for write in sorted(found.values(), key=lambda w: w.seq):
        stands = write.fate.stands()
        if stands is False:
            continue
        for attname, value in write.values.items():
            values[attname] = value if stands else UNKNOWN


def saved(
    instance: models.Model, attnames: Iterable[str], using: str, made: Fate | None = None
) -> None:
    """A save wrote ``attnames`` of ``instance``'s row on ``using``: the instance knows it
    from now on, and this thread's log notes it for the row's other instances. ``made``: the
    write's fate, where the caller has one (the rows of one ``bulk_update`` share theirs)."""
    state = instance._state
    pk = instance.pk
    shape = _shape(type(instance))
    values = instance.__dict__
    written = {attname: _frozen(values[attname]) for attname in attnames if attname in values}
    try:
        write = Write(written, fate(using) if made is None else made, frozenset([pk]))
        _log.note((using, shape.concrete, pk), shape.concrete, write, bulk=False)
    except TypeError:  # a key that cannot be hashed: the instance knows nothing
        keep_on_state([state], None)
        return
    snapshot = kept_on_state(state)
    if isinstance(snapshot, Own) and snapshot.db == using:
        if len(snapshot.writes) >= OWN_WRITES:
            snapshot = _compacted(instance, snapshot)
    elif isinstance(snapshot, Loaded) and snapshot.db == using:
        snapshot = Own(using, snapshot.seq, loaded=snapshot)
    else:
        snapshot = Own(using, write.seq - 1)
    snapshot.writes.append(write)
    keep_on_state([state], snapshot)


def _compacted(instance: models.Model, snapshot: Own) -> Own:
    """``snapshot`` with what its writes told folded into its values, once they and every
    write of the row this thread noted are final (an instance saved again and again keeps
    a few); as it was, while one is not."""
    concrete = _shape(type(instance)).concrete
    if _log.any_pending(concrete) or not all(w.fate.settled() for w in snapshot.writes):
        return snapshot
    values = known(instance)
    if values is None:
        return Own(snapshot.db, next(_sequence))
    return Own(snapshot.db, next(_sequence), values=values)


def bulk_written(
    model: type[models.Model], pks: Iterable[Any] | None, attnames: Iterable[str], using: str
) -> None:
    """A bulk write wrote ``attnames`` of the rows ``pks`` (``None``: rows not known) without
    their instances: what this thread knew of those columns no longer holds, if it stands."""
    concrete = _shape(model).concrete
    unknown = dict.fromkeys(attnames, UNKNOWN)
    if not unknown:
        return
    try:
        rows = None if pks is None else frozenset(pks)
    except TypeError:
        rows = None
    _log.note((using, concrete), concrete, Write(unknown, fate(using), rows), bulk=True)


def changed_fields(
    instance: models.Model,
    update_fields: Iterable[str] | None,
    stored: dict[str, Any] | None = None,
    using: str | None = None,
) -> list[str]:
    """The sorted ``Field.name``s a save of ``instance`` on ``using`` (``None``: its own
    database) changed: those of ``update_fields`` when given, else every concrete column but
    the key whose value differs from what is known of the row there (every one, when nothing
    is). ``stored``: what is known (``known``), when asked already."""
    meta = instance._meta
    if update_fields is not None and not _given_by_django(instance, update_fields):
        return sorted({meta.get_field(name).name for name in update_fields})
    values = instance.__dict__
    concrete = [f for f in meta.concrete_fields if not f.primary_key and f.attname in values]
    if stored is None:
        stored = known(instance, using)
    if stored is None:
        return sorted(f.name for f in concrete)
    strict = _shape(type(instance)).looked_at
    return sorted(
        f.name for f in concrete if differs(values, stored, f.attname, f.attname in strict)
    )


def _given_by_django(instance: models.Model, update_fields: Iterable[str]) -> bool:
    """Whether ``update_fields`` are those Django itself gives the save of an instance loaded
    with ``only()`` or ``defer()`` (every column it holds but the key, by ``attname``), not the
    caller's: what such a save changed is then what differs from the snapshot, as for an
    instance loaded whole."""
    values = instance.__dict__
    meta = instance._meta
    keys = set(getattr(meta, "pk_fields", [meta.pk]))
    columns = [f for f in meta.concrete_fields if f not in keys]
    if all(f.attname in values for f in columns):
        return False  # nothing deferred: Django gives none of its own
    loaded = {f.attname for f in columns if f.attname in values or getattr(f, "generated", False)}
    return set(update_fields) == loaded


def kept_as_given(model: type[models.Model]) -> frozenset[str]:
    """The columns of ``model`` whose values are kept as the application gave them (a
    ``JSONField``'s, a field's of the application's own): compared ``strict``ly."""
    return _shape(model).looked_at


def differs(
    values: dict[str, Any], stored: dict[str, Any], attname: str, strict: bool = False
) -> bool:
    """Whether the instance's value of ``attname`` differs from the one known. ``strict``:
    for a column whose values are kept as given (``kept_as_given``), where ``True`` and
    ``1`` are two values JSON writes apart: equal values differ too where one holds a
    boolean and the other a number (``_alike``)."""
    was = stored.get(attname, UNKNOWN)
    if was is UNKNOWN:
        return True
    now = values.get(attname, UNKNOWN)
    try:
        return bool(now != was) or (strict and not _alike(now, was))
    except Exception:  # a value whose comparison fails is taken as changed
        return True


def _alike(now: Any, was: Any) -> bool:
    """Whether ``now`` and ``was``, equal in Python, hold booleans in the same places, dicts
    and lists walked: Python's ``True == 1``, but JSON's ``true`` is not its ``1``. Numbers
    of one value are alike (``1`` and ``1.0``: one number to JSON, and to a client)."""
    if isinstance(now, dict):
        return all(_alike(item, was[key]) for key, item in now.items())
    if isinstance(now, list | tuple):
        return all(_alike(item, other) for item, other in zip(now, was, strict=True))
    return isinstance(now, bool) is isinstance(was, bool)


def written_attnames(instance: models.Model, update_fields: Iterable[str] | None) -> list[str]:
    """The columns a save with ``update_fields`` writes."""
    meta = instance._meta
    if update_fields is None:
        return [f.attname for f in meta.concrete_fields]
    return [meta.get_field(name).attname for name in update_fields]  # type: ignore[union-attr]


def all_fields(instance: models.Model) -> list[str]:
    """The names of every concrete column but the primary key."""
    return [f.name for f in instance._meta.concrete_fields if not f.primary_key]


def computed_attnames(instance: models.Model, attnames: Iterable[str]) -> set[str]:
    """Of the columns ``attnames`` a write of ``instance`` writes, those it holds an
    expression for (``F("points") + 1``, ``Case(...)``): what they hold is the database's
    answer, which the instance does not know (Django 5.2 leaves the expression on it; Django
    6 reads the value back after the save, and then none is left)."""
    values = instance.__dict__
    return {name for name in attnames if hasattr(values.get(name), "resolve_expression")}


def _frozen(value: Any) -> Any:
    """``value``, or a deep copy of it when it could change in place (``UNKNOWN`` when it
    cannot be copied, or is an expression: the row holds what the database computed)."""
    if type(value) in _IMMUTABLE:
        return value
    if hasattr(value, "resolve_expression"):
        return UNKNOWN
    try:
        return copy.deepcopy(value)
    except Exception:
        return UNKNOWN
