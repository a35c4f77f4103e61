"""Know, later in a transaction, whether something done earlier in it still stands.

Django tells nobody when a savepoint rolls back; it only discards the ``on_commit`` callbacks
registered inside it, by replacing its list of callbacks with the survivors. A ``Mark`` is
such a callback: it stands while the savepoints and transaction it was made in stand, falls
with them, and stands for good once the transaction commits (its callback ran). One mark is
shared by everything done in the same savepoint of the same transaction, so loading a
thousand rows costs one callback, not a thousand.

``held_callbacks`` reads which callbacks Django still holds, once per list it replaced; the
outbox uses it too. Both read ``connection.run_on_commit`` and ``savepoint_ids``, which Django
5.2 to 6.1 keep alike.
"""

from __future__ import annotations

import weakref
from typing import Any

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper


class Mark:
    """Something done in one savepoint of one transaction; see the module docstring."""

    __slots__ = ("__weakref__", "committed", "connection", "dead", "hooks")

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        self.connection = weakref.ref(connection)
        self.committed = False
        self.dead = False
        #: Django's list of callbacks this mark's callback went into.
        self.hooks: list[Any] = []

    def __call__(self) -> None:
        self.committed = True


_current: weakref.WeakKeyDictionary[BaseDatabaseWrapper, tuple[list[Any], tuple[Any, ...], Mark]]
_current = weakref.WeakKeyDictionary()
_held: weakref.WeakKeyDictionary[BaseDatabaseWrapper, tuple[list[Any], int, frozenset[int]]]
_held = weakref.WeakKeyDictionary()


def mark(using: str) -> Mark | None:
    """The mark of the current savepoint of the transaction on ``using``; ``None`` outside a
    transaction, where whatever is done stands at once."""
    connection = connections[using]
    if not connection.in_atomic_block:
        return None
    hooks = connection.run_on_commit
    savepoints = tuple(connection.savepoint_ids)
    current = _current.get(connection)
    if current is not None and current[0] is hooks and current[1] == savepoints:
        return current[2]
    made = Mark(connection)
    transaction.on_commit(made, using=using, robust=True)
    made.hooks = connection.run_on_commit
    _current[connection] = (made.hooks, savepoints, made)
    return made


def stands(made: Mark | None) -> bool:
    """Whether what was done under ``made`` still stands (or committed)."""
    if made is None or made.committed:
        return True
    if made.dead:
        return False
    connection = made.connection()
    if connection is None:
        made.dead = True
        return False
    hooks = connection.run_on_commit
    if hooks is made.hooks:
        return True
    if id(made) in held_callbacks(connection):
        made.hooks = hooks
        return True
    made.dead = True
    return False


def held_callbacks(connection: BaseDatabaseWrapper) -> frozenset[int]:
    """The ids of the callbacks Django holds now for ``connection``'s transaction."""
    hooks: list[Any] = connection.run_on_commit
    cached = _held.get(connection)
    if cached is not None and cached[0] is hooks and cached[1] == len(hooks):
        return cached[2]
    held = frozenset(id(hook[1]) for hook in hooks)
    _held[connection] = (hooks, len(hooks), held)
    return held
