"""Hold announcements until the write's transaction commits, then publish them in one call.

Each write's announcements (one, or a bulk write's many) register an ``on_commit`` callback
of their own (``robust=True``, on the alias of the write), exactly as Django documents: it
runs when the transaction commits, after the callbacks registered before it, and is
discarded, never to run, when the savepoint or transaction it was made in rolls back. So what
runs is exactly what committed. Publishing once per transaction — so that the events of one
row can be coalesced — needs one thing more: the
callback that runs must know whether another announcement's callback will still run after it,
and then leave the publishing to the last one. Realtime holds its callbacks weakly: Django
holds the only strong reference and drops it when it discards a callback (checked once per
process by ``realtime.compat``), so a callback of realtime's that is still alive and has not
run is one Django will run. The last to run publishes what ran before it, in order.

Three cases publish more than once, in the order of the writes: a callback of the application
registered with ``robust=False`` that raises stops the callbacks after it — the transaction
committed: once Django lets go of them, when the exception has been handled and no transaction
is open, what they announce is published with what ran before
(``realtime.compat.django.callbacks_committed``); a write made in autocommit by an
``on_commit`` callback of the application's first publishes what the committed transaction
announced; and a transaction opened and committed by another ``on_commit`` callback publishes
when it commits, after what the outer one announced. Where Django keeps
discarded callbacks alive, each announcement publishes itself. Outside a transaction the
announcements of one write (a ``save()``, a ``bulk_create`` of 200 rows) are published at once,
in one call; under manual transaction management (no atomic block, autocommit off) too, as
there is no commit to wait for.

When the transport is ``durable``, each announcement made inside an atomic block is also
written to realtime's outbox (``realtime_outbox``) on the write's own connection, in the
write's transaction, before its callback is registered: a savepoint that rolls back takes
the row with it, as it takes the callback. The rows of one transaction share a random key
(``txn``: a new one when no announcement is pending). After commit the writer
publishes as ever, handing the transport the key of the rows published, then deletes them;
when publishing fails, or the process dies before it could, the rows stay, and a worker's
sweeper relays them (``realtime.writes.relay``). Outside an atomic block (a plain ``save()``
in autocommit: Django committed before ``post_save``) there is no transaction to join: the
announcement is published at once, with no row but with a key; if that publish fails, it is
written to the outbox then, under that key, for a sweeper to relay. A crash in that one
statement's window loses it. ``ATOMIC_REQUESTS`` or an atomic block closes it.
"""

from __future__ import annotations

import contextvars
import itertools
import logging
import secrets
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.transaction import TransactionManagementError

from realtime.compat.django import callbacks_committed, callbacks_released, in_transaction
from realtime.logs import log_operation
from realtime.transports import get_transport
from realtime.writes import order, outbox, outbox_form
from realtime.writes.publish import publish
from realtime.writes.tracking import Fate

logger = logging.getLogger(__name__)


#: Entries kept before those known discarded are dropped (transactions that roll back
#: leave theirs behind, and a thread may never commit: a test suite inside ``TestCase``).
COMPACT_AFTER = 256
_sequence = itertools.count()
#: The place (registration order) of the work ``after_commit`` runs now, if any.
_placed_at: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "realtime_placed_at", default=None
)


class Row:
    """Where an announcement was written in the outbox."""

    __slots__ = ("id", "seq", "txn")

    def __init__(self, txn: str, seq: int, id_: int) -> None:
        self.txn = txn
        self.seq = seq
        self.id = id_


class _Entry:
    """The announcements of one ``add()`` call: what Django runs is their ``_Callback``.

    They were made in the same savepoint, so Django runs or discards their callback as one:
    a ``bulk_create`` of 1,000 rows registers one callback, not 1,000."""

    __slots__ = ("callback", "items", "ran", "rows", "seq")

    def __init__(self, items: list[Any], rows: list[Row | None]) -> None:
        self.items = items
        #: Their rows of the outbox (``None`` each where they have none).
        self.rows = rows
        #: Registration order, across every connection of the process.
        self.seq = next(_sequence)
        self.ran = False
        self.callback: weakref.ref[_Callback] | None = None

    def pending(self) -> bool:
        """Whether Django still holds its callback and has not run it."""
        return not self.ran and self.callback is not None and self.callback() is not None

    @property
    def txn(self) -> str | None:
        """The key of their outbox rows (one ``add()`` writes its rows with one key)."""
        row = self.rows[0] if self.rows else None
        return None if row is None else row.txn


class _Callback:
    """What Django holds; it holds its ``_Held`` weakly, which so dies with its connection.
    It also marks the fate of the write it announces, if given one (``tracking``)."""

    __slots__ = ("__weakref__", "entry", "fate", "held", "using")

    def __init__(self, held: _Held, entry: _Entry, fate: Fate | None) -> None:
        self.held = weakref.ref(held)
        self.entry = entry
        self.fate = fate
        self.using = held.using

    def __call__(self) -> None:
        if self.fate is not None:
            self.fate.ran = True
        if self.entry.ran:  # published already, before a write outside a transaction
            return
        held = self.held()
        if held is None:
            _publish([self.entry], self.using)
        else:
            held.ran(self.entry)


class _Held:
    """The announcements made on one connection of one thread, until they are published."""

    __slots__ = (
        "__weakref__",
        "_connection",
        "by_callback",
        "compact_at",
        "entries",
        "held",
        "held_last",
        "next_row",
        "txn",
        "using",
    )

    def __init__(self, using: str, connection: BaseDatabaseWrapper) -> None:
        self.using = using
        #: The connection it is kept for (weakly: it is the key it is kept under).
        self._connection = weakref.ref(connection)
        #: In registration order: announcements that may still be pending.
        self.entries: list[_Entry] = []
        #: Each announcement whose callback Django holds, by the ``id`` of the weak reference
        #: to that callback (``_released`` is handed the reference).
        self.by_callback: dict[int, _Entry] = {}
        #: Announcements whose callback ran, waiting for the last one to run.
        self.held: list[_Entry] = []
        #: The latest registered of them.
        self.held_last = -1
        self.compact_at = COMPACT_AFTER
        #: The key of the outbox rows of the transaction under way, and the next row's place.
        self.txn = ""
        self.next_row = 0

    def add(self, items: Sequence[Any], fate: Fate | None = None) -> None:
        """Hold ``items`` (announcements of the transaction under way, in write order);
        outside a transaction, publish them at once, in one call. Their callback tells
        ``fate`` too, when it registers one."""
        if not in_transaction(self.connection):
            if self._committed_pending():
                self._flush(committed=True, before=_placed_at.get())
            elif self.held:
                self._flush()
            _publish_committed(list(items), self.using)
            return
        if len(self.entries) >= self.compact_at:
            self.entries = [entry for entry in self.entries if entry.pending()]
            self.compact_at = max(COMPACT_AFTER, 2 * len(self.entries))
        rows = self._write(items)
        order.stamp(items, self.using, [None if row is None else row.id for row in rows])
        entry = _Entry(list(items), rows)
        callback = _Callback(self, entry, fate)
        entry.callback = weakref.ref(callback, self._released)
        self.by_callback[id(entry.callback)] = entry
        if fate is not None:
            fate.told_by(callback)
        self.entries.append(entry)
        try:
            transaction.on_commit(callback, using=self.using, robust=True)
        except TransactionManagementError:
            callback()

    def _write(self, items: Sequence[Any]) -> list[Row | None]:
        """Write ``items`` to the outbox in the open transaction, when the transport is
        durable (one statement); their rows (``None``: no transaction, or no outbox here,
        said once)."""
        connection = self.connection
        if not get_transport().durable or not in_transaction(connection):
            return [None] * len(items)
        if not outbox.holds_outbox(self.using):
            _warn_no_outbox(self.using)
            return [None] * len(items)
        order.pending(items)
        raws = [outbox_form.dump(item) for item in items]
        if not self.txn or not any(entry.pending() for entry in reversed(self.entries)):
            # A commit ran callbacks since the key was drawn, or nothing is pending (what was
            # rolled back or discarded): this is a transaction of its own.
            self.txn, self.next_row = secrets.token_hex(16), 0
        seqs = range(self.next_row, self.next_row + len(raws))
        self.next_row += len(raws)
        ids = outbox.insert(self.using, self.txn, list(zip(seqs, raws, strict=True)))
        return [Row(self.txn, seq, id_) for seq, id_ in zip(seqs, ids, strict=True)]

    @property
    def connection(self) -> BaseDatabaseWrapper:
        """The connection, as long as this thread keeps it (then the alias's current one)."""
        return self._connection() or connections[self.using]

    def ran(self, entry: _Entry) -> None:
        entry.ran = True
        self.txn = ""  # its transaction committed: a write from here on is in another
        self.held.append(entry)
        self.held_last = max(self.held_last, entry.seq)
        if self._pending_after(entry.seq) and callbacks_released(self.connection):
            return
        self._flush(committed=self._committed_pending())

    def _pending_after(self, seq: int) -> bool:
        """Whether an announcement registered after ``seq`` is still to run (the latest are
        looked at first: in a commit they are the ones still pending)."""
        for entry in reversed(self.entries):
            if entry.seq <= seq:
                return False
            if entry.pending():
                return True
        return False

    def _committed_pending(self) -> bool:
        """Whether announcements still to run belong to a committed transaction: with no
        transaction open, the callbacks Django still holds are those of a commit whose run of
        callbacks is under way (an application's callback is writing)."""
        connection = self._connection()
        return (
            connection is not None
            and any(entry.pending() for entry in reversed(self.entries))
            and callbacks_committed(connection)
        )

    def _released(self, reference: weakref.ref[_Callback]) -> None:
        """A callback Django let go of: if it never ran, what is held may wait for nothing.

        Called wherever the last reference was dropped: it publishes only when no
        transaction is open (the publish never runs inside the application's). Let go of
        unrun with none open, it is no rollback: its transaction committed, and a callback
        of the application's registered before it with ``robust=False`` raised, which stops
        Django's run of the rest: what they announce is published all the same."""
        try:
            entry = self.by_callback.pop(id(reference), None)
            connection = self._connection()
            unrun = entry is not None and not entry.ran
            if entry is not None and unrun and connection and callbacks_committed(connection):
                self.held.append(entry)
                self._flush(committed=True)
                return
            if not self.held or self._pending_after(self.held_last):
                return
            if not in_transaction(self.connection):
                self._flush()
        except Exception as exc:
            log_operation(
                logger,
                logging.ERROR,
                "realtime: publishing held announcements failed",
                exc_info=exc,
            )

    def _flush(self, committed: bool = False, before: int | None = None) -> None:
        """Publish what ran; ``committed``: and what is still to run, which committed (no
        transaction is open), so that it is published before what is written next —
        registered before ``before`` only, when given: work ``after_commit`` runs stands
        there among them."""
        if committed:
            self.held.extend(
                entry
                for entry in self.entries
                if entry.pending() and (before is None or entry.seq < before)
            )
        for entry in self.held:
            entry.ran = True
        held = sorted(self.held, key=lambda entry: entry.seq)
        self.held.clear()
        self.held_last = -1
        # What ran is published; what neither ran nor is held by Django never will run.
        self.entries = [entry for entry in self.entries if entry.pending()]
        _publish(held, self.using)


def _publish(entries: Sequence[_Entry], using: str) -> None:
    """Publish what these announcements announce, one transaction's rows at a time (each
    with their key); then delete those rows of the outbox."""
    for _, run in itertools.groupby(entries, lambda entry: entry.txn):
        _publish_rows(list(run), using)


def _publish_rows(entries: Sequence[_Entry], using: str) -> None:
    items = [item for entry in entries for item in entry.items]
    rows = [row for entry in entries for row in entry.rows if row is not None]
    if not rows:  # no outbox here (each add() writes a row for every item it holds, or none)
        publish(items, using)
        return

    def relayed() -> None:
        try:
            outbox.delete(using, [row.id for row in rows])
        except Exception as exc:
            log_operation(
                logger,
                logging.ERROR,
                "realtime: deleting %d relayed row(s) of the outbox failed; a worker will "
                "relay them again",
                len(rows),
                exc_info=exc,
            )

    seqs = [row.seq for row in rows]
    publish(items, using, txn=relay_key(rows[0].txn, seqs), seqs=seqs, relayed=relayed)


def _publish_committed(items: list[Any], using: str) -> None:
    """Publish the announcements of a write that committed by itself (autocommit: there was
    no transaction to write an outbox row in). On a durable transport they carry a key, and
    if the publish fails they are written to the outbox then, under that key: a sweeper
    relays them, and drops a relay of what had reached the transport after all."""
    if not get_transport().durable or not outbox.holds_outbox(using):
        publish(items, using)
        return
    txn = secrets.token_hex(16)
    seqs = list(range(len(items)))
    publish(
        items,
        using,
        txn=relay_key(txn, seqs),
        seqs=seqs,
        unsent=lambda: _keep_unsent(using, txn, list(zip(seqs, items, strict=True))),
    )


def _keep_unsent(using: str, txn: str, items: list[tuple[int, Any]]) -> None:
    """Write announcements whose publish failed to the outbox, in a transaction of their
    own; never raise."""
    try:
        rows = [(seq, outbox_form.dump(item)) for seq, item in items]
        with transaction.atomic(using=using):
            outbox.insert(using, txn, rows)
    except Exception as exc:
        log_operation(
            logger,
            logging.ERROR,
            "realtime: %d announcement(s) of a committed write could not be kept in "
            "realtime_outbox after their publish failed: they are lost",
            len(items),
            exc_info=exc,
        )
        return
    log_operation(
        logger,
        logging.WARNING,
        "realtime: %d announcement(s) of a committed write were kept in realtime_outbox "
        "after their publish failed: a worker relays them",
        len(items),
    )


def relay_key(txn: str, seqs: Sequence[int]) -> str:
    """The key a relay of the rows ``seqs`` of transaction ``txn`` hands the transport: the
    same for every relay of the same rows (a writer's, then a sweeper's after the writer
    died before deleting them), another for any other rows of the transaction."""
    return f"{txn}.{min(seqs)}.{len(seqs)}"


_warned: set[str] = set()


def _warn_no_outbox(using: str) -> None:
    if using not in _warned:
        _warned.add(using)
        logger.error(
            "realtime: the transport is durable but database %r holds no realtime_outbox "
            "(migrate realtime there, and let the routers allow it): its writes are "
            "announced after commit without it, and one lost if the process dies first",
            using,
        )


_held_by_connection: weakref.WeakKeyDictionary[BaseDatabaseWrapper, _Held] = (
    weakref.WeakKeyDictionary()
)


def after_commit(work: Callable[[], None], connection: BaseDatabaseWrapper) -> None:
    """Run ``work``, which announces (``add``), once the transaction open on ``connection``
    (this thread's) commits, never if it (or the savepoint it is made in) rolls back: a
    callback of Django's, ``robust`` (a failure is logged, never raised into the commit).
    What it announces is published in the place of this call among the transaction's
    announcements: after those made before it, before those made after.

    For work that cannot run now although the transaction is this thread's: async code on an
    event loop run in it (``asyncio.run`` inside ``atomic()``), where no statement may run."""
    place = next(_sequence)

    def run() -> None:
        placed = _placed_at.set(place)
        try:
            work()
        finally:
            _placed_at.reset(placed)

    connection.on_commit(run, robust=True)


def add(item: Any, using: str, fate: Fate | None = None) -> None:
    """Publish ``item`` after the current transaction on ``using`` commits (now, outside one).
    ``fate``: the write's, told by the same callback (one ``on_commit`` callback a save);
    left unregistered when no callback is (the caller registers it)."""
    add_all([item], using, fate)


def add_all(items: Iterable[Any], using: str, fate: Fate | None = None) -> None:
    """``add`` each of ``items``, in order: durable, their rows cost one statement."""
    items = list(items)
    if not items:
        return
    connection = connections[using]
    held = _held_by_connection.get(connection)
    if held is None:
        held = _held_by_connection[connection] = _Held(using, connection)
    held.add(items, fate)
