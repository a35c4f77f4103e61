"""Know, later in a transaction, whether something done earlier in it still stands.

Django documents what happens to an ``on_commit`` callback: it runs when the transaction
commits, and is discarded, never to run, when the savepoint or transaction it was registered
in rolls back. A ``Fate`` is such a callback of realtime's own, registered when something is
done (a row read, a row saved) and held by Django alone; realtime keeps a weak reference to
it. So a fate has run (what it stands for committed), is still held (it stands so far), or was
released unrun (its savepoint or transaction rolled back) — known at once, during the
transaction, because Django drops a discarded callback when it discards it. That last point is
checked once per process (``realtime.compat``); where it does not hold, a fate not yet run is
*unknown*, and whoever asks assumes the worst.

Reads share one fate per transaction (``reads``): a thousand rows loaded cost one callback.
A read inside a savepoint opened after that fate was made is tied to it, and so outlives the
savepoint's rollback: what such a read saw is undone only if the savepoint wrote the row, and
the row's own writes, which realtime sees, carry fates of their own (see ``snapshots``).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from django.conf import settings
from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.transaction import TransactionManagementError

from realtime.compat.django import callbacks_released, in_transaction


class Fate:
    """Whether something done in a transaction stands: see the module docstring."""

    __slots__ = ("_callback", "ran", "using")

    def __init__(self, using: str) -> None:
        self.using = using
        self.ran = False
        self._callback: weakref.ref[_Callback] | None = None

    def stands(self) -> bool | None:
        """``True``: committed or still held; ``False``: rolled back; ``None``: cannot tell
        (Django keeps discarded callbacks alive, see the module docstring)."""
        if self.ran:
            return True
        callback = self._callback
        if callback is None or callback() is None:
            return False
        return True if callbacks_released(connections[self.using]) else None

    def settled(self) -> bool:
        """Whether its fate is final: run, or released unrun."""
        callback = self._callback
        return self.ran or callback is None or callback() is None


class _Callback:
    """What Django holds: running it marks its fate committed."""

    __slots__ = ("__weakref__", "fate")

    def __init__(self, fate: Fate) -> None:
        self.fate = fate

    def __call__(self) -> None:
        self.fate.ran = True


def fate(using: str) -> Fate:
    """A new fate for something done now on ``using``: committed at once outside a
    transaction (and under manual transaction management, where no commit can be awaited)."""
    made = Fate(using)
    callback = _Callback(made)
    made._callback = weakref.ref(callback)
    try:
        transaction.on_commit(callback, using=using, robust=True)
    except TransactionManagementError:
        made.ran = True
    return made


_shared: weakref.WeakKeyDictionary[BaseDatabaseWrapper, Fate] = weakref.WeakKeyDictionary()


def reads() -> tuple[Fate, ...]:
    """The fates of a read made now: one per alias with a transaction open in this thread
    (a read does not know its own alias until its row is built), made at the transaction's
    first read; none outside transactions, where what is read is what is stored."""
    found: tuple[Fate, ...] = ()
    for connection in _here():
        if not in_transaction(connection):
            continue
        current = _shared.get(connection)
        if current is None or current.settled():
            current = _shared[connection] = fate(connection.alias)
        found += (current,)
    return found


class _Here(threading.local):
    """This thread's connection of every alias, looked up once: a read is made for every row
    loaded, and ``connections[alias]`` costs more than the rest of it. (The ORM runs in
    synchronous code, where Django keeps one connection per alias and thread.)"""

    databases: dict[str, Any] | None = None
    connections: tuple[BaseDatabaseWrapper, ...] = ()


_here_cache = _Here()


def _here() -> tuple[BaseDatabaseWrapper, ...]:
    cache = _here_cache
    databases = settings.DATABASES
    if cache.databases is not databases:  # DATABASES changed (tests): look them up again
        cache.connections = tuple(connections[alias] for alias in databases)
        cache.databases = databases
    return cache.connections
