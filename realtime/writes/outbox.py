"""Hold announcements until the write's transaction commits, then publish them in one call.

Each announcement registers an ``on_commit`` callback of its own (``robust=True``, on the
alias of the write), exactly as Django documents: it runs when the transaction commits, after
the callbacks registered before it, and is discarded, never to run, when the savepoint or
transaction it was made in rolls back. So what runs is exactly what committed. Publishing once
per transaction — so that the events of one row can be coalesced — needs one thing more: the
callback that runs must know whether another announcement's callback will still run after it,
and then leave the publishing to the last one. The outbox holds its callbacks weakly: Django
holds the only strong reference and drops it when it discards a callback (checked once per
process by ``realtime.compat``), so a callback of the outbox that is still alive and has not
run is one Django will run. The last to run publishes what ran before it, in order.

Two cases publish more than once: a callback of the application registered with
``robust=False`` that raises stops the callbacks after it (what ran before it is published
once Django lets go of the rest, when the exception has been handled), and a transaction opened
and committed by another ``on_commit`` callback publishes when it commits. Where Django keeps
discarded callbacks alive, each announcement publishes itself. Outside a transaction an
announcement is published at once; under manual transaction management (no atomic block,
autocommit off) too, as there is no commit to wait for.
"""

from __future__ import annotations

import itertools
import logging
import weakref
from typing import Any

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.transaction import TransactionManagementError

from realtime.compat.django import callbacks_released, in_transaction
from realtime.writes.publish import publish

logger = logging.getLogger(__name__)


#: Entries kept before the outbox drops those known discarded (transactions that roll back
#: leave theirs behind, and a thread may never commit: a test suite inside ``TestCase``).
COMPACT_AFTER = 256
_sequence = itertools.count()


class _Entry:
    """One announcement: what Django runs is its ``_Callback``."""

    __slots__ = ("callback", "item", "ran", "seq")

    def __init__(self, item: Any) -> None:
        self.item = item
        #: Registration order, across every outbox of the process.
        self.seq = next(_sequence)
        self.ran = False
        self.callback: weakref.ref[_Callback] | None = None

    def pending(self) -> bool:
        """Whether Django still holds its callback and has not run it."""
        return not self.ran and self.callback is not None and self.callback() is not None


class _Callback:
    """What Django holds; it holds the outbox weakly, so that the outbox dies with its
    connection."""

    __slots__ = ("__weakref__", "entry", "outbox", "using")

    def __init__(self, outbox: _Outbox, entry: _Entry) -> None:
        self.outbox = weakref.ref(outbox)
        self.entry = entry
        self.using = outbox.using

    def __call__(self) -> None:
        outbox = self.outbox()
        if outbox is None:
            publish([self.entry.item], self.using)
        else:
            outbox.ran(self.entry)


class _Outbox:
    """The announcements made on one connection of one thread, until they are published."""

    __slots__ = ("__weakref__", "compact_at", "entries", "held", "using")

    def __init__(self, using: str) -> None:
        self.using = using
        #: In registration order: announcements that may still be pending.
        self.entries: list[_Entry] = []
        #: Announcements whose callback ran, waiting for the last one to run.
        self.held: list[_Entry] = []
        self.compact_at = COMPACT_AFTER

    def add(self, item: Any) -> None:
        if len(self.entries) >= self.compact_at:
            self.entries = [entry for entry in self.entries if entry.pending()]
            self.compact_at = max(COMPACT_AFTER, 2 * len(self.entries))
        entry = _Entry(item)
        callback = _Callback(self, entry)
        entry.callback = weakref.ref(callback, self._released)
        self.entries.append(entry)
        try:
            transaction.on_commit(callback, using=self.using, robust=True)
        except TransactionManagementError:
            callback()

    def ran(self, entry: _Entry) -> None:
        entry.ran = True
        self.held.append(entry)
        if self._pending_after(entry.seq) and callbacks_released(connections[self.using]):
            return
        self._flush()

    def _pending_after(self, seq: int) -> bool:
        """Whether an announcement registered after ``seq`` is still to run (the latest are
        looked at first: in a commit they are the ones still pending)."""
        for entry in reversed(self.entries):
            if entry.seq <= seq:
                return False
            if entry.pending():
                return True
        return False

    def _released(self, reference: weakref.ref[_Callback]) -> None:
        """A callback Django let go of: if it never ran, what is held may wait for nothing.

        Called wherever the last reference was dropped: it publishes only when no
        transaction is open (the publish never runs inside the application's)."""
        try:
            if not self.held or self._pending_after(max(entry.seq for entry in self.held)):
                return
            if not in_transaction(connections[self.using]):
                self._flush()
        except Exception:
            logger.exception("realtime: publishing held announcements failed")

    def _flush(self) -> None:
        held = sorted(self.held, key=lambda entry: entry.seq)
        self.held.clear()
        # What ran is published; what neither ran nor is held by Django never will run.
        self.entries = [entry for entry in self.entries if entry.pending()]
        publish([entry.item for entry in held], self.using)


_outboxes: weakref.WeakKeyDictionary[BaseDatabaseWrapper, _Outbox] = weakref.WeakKeyDictionary()


def add(item: Any, using: str) -> None:
    """Publish ``item`` after the current transaction on ``using`` commits (now, outside one)."""
    connection = connections[using]
    outbox = _outboxes.get(connection)
    if outbox is None:
        outbox = _outboxes[connection] = _Outbox(using)
    outbox.add(item)
