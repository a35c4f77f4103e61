"""Hold announcements until the write's transaction commits, then publish them in one call.

Each announcement registers an ``on_commit`` callback of its own: Django discards it exactly
when the savepoint it was made in rolls back, and runs the survivors in order at the commit.
Publishing once per transaction, so that the events of one row can be coalesced, needs one
thing more: the callback that runs must know whether a later announcement's callback will run
too, and if so leave the publishing to it. The outbox knows it:

* A rollback *between* two announcements shows at the second as Django having replaced its
  list of callbacks; the outbox then looks once at which of its callbacks the new list still
  holds: the others are dead, whatever else the rolled-back savepoint did.
* A rollback *after* the last announcement can only have discarded announcements made in a
  savepoint still open at that moment. A later callback is certain to run when the savepoints
  it shares with that moment are savepoints of the running callback too (those did not roll
  back: the running callback runs). An announcement that is not certain publishes itself if
  it does run.

A foreign callback registered with ``robust=False`` stops the ones after it when it raises, so
what is held is published before such a callback. Outside a transaction an announcement is
published at once. This reads ``connection.run_on_commit`` and ``savepoint_ids``, which Django
5.2 to 6.1 keep alike; the tests of this module run every case on each.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from realtime.writes.publish import publish
from realtime.writes.transactions import held_callbacks


@dataclass(eq=False)
class _Entry:
    item: Any
    #: Savepoints open when the announcement was made.
    savepoints: frozenset[str]
    callback: Any = None
    dead: bool = False
    confirmed: bool = False
    published: bool = False


@dataclass(eq=False)
class _Outbox:
    """The announcements of one transaction on one connection."""

    connection: weakref.ref[BaseDatabaseWrapper]
    #: Django's list of callbacks as of the last announcement.
    hooks: list[Any]
    entries: list[_Entry] = field(default_factory=list)
    #: Savepoints open at the last announcement.
    open_at_last: frozenset[str] = frozenset()
    #: What runs from the first callback on, worked out when it runs: (entry or None, robust).
    order: list[tuple[_Entry | None, bool]] | None = None
    #: Where each of our entries sits in ``order``.
    positions: dict[int, int] = field(default_factory=dict)
    #: Whether a rollback may have come after the last announcement.
    stale: bool = False


_outboxes: weakref.WeakKeyDictionary[BaseDatabaseWrapper, _Outbox] = weakref.WeakKeyDictionary()


def add(item: Any, using: str) -> None:
    """Publish ``item`` after the current transaction on ``using`` commits (now, outside one)."""
    connection = connections[using]
    if not connection.in_atomic_block:
        publish([item])
        return
    outbox = _outbox_of(connection)
    # ``None`` stands for an atomic block without a savepoint: it can never roll back alone.
    entry = _Entry(item, frozenset(sid for sid in connection.savepoint_ids if sid is not None))
    entry.callback = partial(_committed, outbox, entry)
    outbox.entries.append(entry)
    outbox.open_at_last = entry.savepoints
    outbox.order = None
    transaction.on_commit(entry.callback, using=using, robust=True)
    outbox.hooks = connection.run_on_commit


def _outbox_of(connection: BaseDatabaseWrapper) -> _Outbox:
    """The outbox of the connection's current transaction, made when there is none."""
    hooks: list[Any] = connection.run_on_commit
    outbox = _outboxes.get(connection)
    if outbox is not None and outbox.hooks is not hooks:
        # Django replaced its list: a savepoint rolled back, or the transaction ended.
        held = held_callbacks(connection)
        if any(id(entry.callback) in held for entry in outbox.entries):
            for entry in outbox.entries:
                entry.dead = entry.dead or id(entry.callback) not in held
            outbox.hooks = hooks
        else:
            outbox = None
    if outbox is None:
        outbox = _outboxes[connection] = _Outbox(weakref.ref(connection), hooks)
    return outbox


def _committed(outbox: _Outbox, entry: _Entry) -> None:
    entry.confirmed = True
    if outbox.order is None:
        _plan(outbox, entry)
    if _later_certain(outbox, entry):
        return
    ready = [e for e in outbox.entries if e.confirmed and not e.published]
    for e in ready:
        e.published = True
    publish([e.item for e in ready])


def _plan(outbox: _Outbox, first: _Entry) -> None:
    """Work out what runs after the first callback, from the list it came from."""
    hooks = outbox.hooks
    ours = {id(entry.callback): entry for entry in outbox.entries}
    position = next((i for i, (_, cb, _) in enumerate(hooks) if cb is first.callback), None)
    if position is None:
        # Django took the callback running now off this list: it holds exactly what is left.
        rest = hooks
    else:
        rest = hooks[position + 1 :]
        # Still in the list: a test helper runs the callbacks inside the transaction (no
        # rollback since), or the list was replaced by a rollback after the last announcement.
        connection = outbox.connection()
        outbox.stale = connection is None or connection.run_on_commit is not hooks
    outbox.order = [(first, True)] + [(ours.get(id(cb)), robust) for _, cb, robust in rest]
    outbox.positions = {id(e): i for i, (e, _) in enumerate(outbox.order) if e is not None}


def _later_certain(outbox: _Outbox, running: _Entry) -> bool:
    """Whether one of ours certainly runs after ``running`` and before any foreign callback
    that may stop the ones after it."""
    order = outbox.order
    assert order is not None
    shared = running.savepoints & outbox.open_at_last
    for index in range(outbox.positions.get(id(running), len(order)) + 1, len(order)):
        entry, robust = order[index]
        if entry is None:
            if not robust:
                return False
        elif not entry.dead and (
            not outbox.stale or entry.savepoints & outbox.open_at_last <= shared
        ):
            return True
    return False
