"""Collect announcements in the write's transaction; publish them once it commits.

Each announcement registers its own ``on_commit`` callback, so Django discards it exactly when
the savepoint it was made in rolls back. Publishing one by one would cost a round trip each,
so callbacks cooperate: a callback that knows a later one will run leaves the publishing to
it, and that one publishes everything confirmed so far, in write order, in one
``Transport.publish`` call.

Which later callbacks will run? When the first of ours runs, Django is working through the
list of callbacks it is committing; if that list is the one our outbox saw grow, it holds
exactly the callbacks still to come (a rollback would have replaced it), so each run of ours
up to a foreign callback that may raise (``robust=False``: it would stop the others) is
published once, by its last member. When that list cannot be seen (a rollback came after our
last callback, or a test helper runs the callbacks itself), a later callback certainly runs
if the savepoints it was made under are a subset of the current one's. Outside any
transaction an announcement is published at once.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from realtime.writes.publish import publish

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class _Entry:
    item: Any
    savepoints: frozenset[str]
    index: int
    callback: Any = None
    confirmed: bool = False
    done: bool = False


@dataclass(eq=False)
class _Outbox:
    hooks: list[Any]
    entries: list[_Entry] = field(default_factory=list)
    #: Index of the last entry made outside any savepoint: its callback always runs.
    last_unconditional: int = -1
    #: Indexes of the entries that publish, once known (``None``: not worked out yet).
    flush_points: set[int] | None = None
    planned: bool = False


_outboxes: weakref.WeakKeyDictionary[BaseDatabaseWrapper, _Outbox] = weakref.WeakKeyDictionary()


def add(item: Any, using: str) -> None:
    """Publish ``item`` after the current transaction on ``using`` commits (now, outside one)."""
    connection = connections[using]
    if not connection.in_atomic_block:
        publish([item])
        return
    outbox = _outboxes.get(connection)
    # Django replaces its list of callbacks when a transaction ends or a savepoint rolls
    # back; either way, start afresh (the entries left behind are published or dead).
    if outbox is None or outbox.hooks is not connection.run_on_commit:
        outbox = _outboxes[connection] = _Outbox(hooks=connection.run_on_commit)
    # ``None`` stands for an atomic block without a savepoint: it can never roll back alone.
    savepoints = frozenset(sid for sid in connection.savepoint_ids if sid is not None)
    entry = _Entry(item, savepoints, len(outbox.entries))
    entry.callback = partial(_committed, outbox, entry)
    outbox.entries.append(entry)
    if not entry.savepoints:
        outbox.last_unconditional = entry.index
    transaction.on_commit(entry.callback, using=using, robust=True)


def _committed(outbox: _Outbox, entry: _Entry) -> None:
    entry.confirmed = True
    if not outbox.planned:
        outbox.planned = True
        outbox.flush_points = _flush_points(outbox, entry)
    if outbox.flush_points is not None:
        if entry.index not in outbox.flush_points:
            return
    elif outbox.last_unconditional > entry.index or any(
        other.savepoints <= entry.savepoints for other in outbox.entries[entry.index + 1 :]
    ):
        return
    ready = [e for e in outbox.entries[: entry.index + 1] if e.confirmed and not e.done]
    for e in ready:
        e.done = True
    publish([e.item for e in ready])


def _flush_points(outbox: _Outbox, first: _Entry) -> set[int] | None:
    """Where to publish, read from the callbacks Django has yet to run; ``None`` if unseen."""
    remaining = outbox.hooks
    if any(callback is first.callback for _, callback, _ in remaining):
        return None  # not the list being run: it still holds the callback running now
    ours = {id(e.callback): e.index for e in outbox.entries}
    points: set[int] = set()
    last = first.index
    for _, callback, robust in remaining:
        index = ours.get(id(callback))
        if index is not None:
            last = index
        elif not robust:
            points.add(last)
    points.add(last)
    return points
