"""Django: whether a transaction is open, and whether discarded callbacks are released.

Two things realtime needs that Django does not document:

* **Is a transaction open on this connection, without opening one?** Django's public
  ``transaction.get_autocommit()`` answers, but connects to the database to do so; a model
  built by hand (no query at all) must not open a connection. ``in_transaction`` reads the
  connection's ``in_atomic_block`` flag, and falls back to ``get_autocommit()`` where that
  flag is gone.
* **Does Django release an ``on_commit`` callback it discards?** Django documents that a
  callback registered in a savepoint (or transaction) that rolls back is never called. realtime
  learns *that it was discarded* — during the transaction, not only at its end — by holding
  its callbacks weakly: Django keeps the only strong reference and drops it when it discards
  the callback. ``callbacks_released`` checks this once per process, the first time it is
  asked while no transaction is open on the connection (a transaction of its own, which
  writes nothing: a savepoint rolled back with a callback registered in it, which must be
  freed at once). Until then it answers yes, which every supported Django does. Where it is not
  so, one ERROR line says so and realtime falls back to what the documented behaviour allows
  (each announcement published by its own callback, without coalescing; an update that cannot
  be sure of what was committed counts the columns as changed).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Any

from django import get_version
from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

logger = logging.getLogger(__name__)

#: The checked behaviour: ``None`` until the check could run, then its answer.
_released: bool | None = None
#: Seconds before a check that could not run (the database away) is tried again.
RETRY_AFTER = 30.0
_next_try = 0.0
_lock = threading.Lock()


def in_transaction(connection: BaseDatabaseWrapper) -> bool:
    """Whether an atomic block is open on ``connection`` (this thread's, of its alias)."""
    flag = getattr(connection, "in_atomic_block", None)
    if isinstance(flag, bool):
        return flag
    return not transaction.get_autocommit(connection.alias)


def callbacks_released(connection: BaseDatabaseWrapper) -> bool:
    """Whether Django frees the ``on_commit`` callbacks it discards (see the module
    docstring); checked on ``connection`` when no transaction is open on it."""
    if _released is None and not in_transaction(connection):
        _check(connection)
    return _released is not False


class _Probe:
    __slots__ = ("__weakref__",)

    def __call__(self) -> None:
        """Never called: it is registered in a savepoint that rolls back."""


class _RollBackError(Exception):
    """Raised to roll the probe's savepoint (or transaction) back."""


def _check(connection: BaseDatabaseWrapper) -> None:
    global _released, _next_try
    with _lock:
        if _released is not None or time.monotonic() < _next_try:
            return
        _next_try = time.monotonic() + RETRY_AFTER
        try:
            _released = _probe(connection.alias)
        except Exception:
            logger.debug("realtime: the on_commit check could not run yet", exc_info=True)
            return
    if not _released:
        logger.error(
            "realtime: Django %s keeps the on_commit callbacks of rolled-back savepoints "
            "alive; announcements are published one by one, without coalescing, and updates "
            "that cannot tell what was committed list every column as changed",
            get_version(),
        )


def _probe(using: str) -> bool:
    """Register a callback in a savepoint that rolls back (a transaction, where the database
    has no savepoints), and tell whether it was freed at once. Nothing is written."""
    nested = connections[using].features.uses_savepoints
    discarded = _Probe()
    dropped: weakref.ref[Any] = weakref.ref(discarded)
    freed = False
    with transaction.atomic(using=using):
        try:
            with transaction.atomic(using=using):
                transaction.on_commit(discarded, using=using, robust=True)
                del discarded
                raise _RollBackError
        except _RollBackError:
            pass
        # Freed by reference counting when Django let go of it, not by a collection.
        freed = dropped() is None
    return freed if nested else dropped() is None
