"""Realtime's part of a write never fails the write — and, in tests, never fails in silence.

Each place where a write enters realtime (a signal receiver, a bulk write, a link that changed)
runs its part through ``failsafe`` once: whatever it raises is caught there, logged with its
traceback, and costs the announcement, never the write. Inside a transaction, its statements
run in a savepoint where a failed statement would abort the transaction (PostgreSQL: every
statement after it would fail, the application's included); SQLite and MySQL go on after a
failed statement, so no savepoint is made there, and no statement is added to the write.

One failure is not realtime's to catch: an error after which the database has rolled back
the write's whole transaction (``ends_transaction``: on MySQL, a deadlock met by realtime's
lock read, which InnoDB resolves by rolling the transaction back). Caught, the application's
statement would run in a fresh transaction and its block commit without the writes made
before; raised, the write fails as Django's own statement would have, on the same locks.

A test suite wants the opposite: a failure that would be logged once per write in production
(a query the database refuses for one shape of queryset, say) must fail the test that met it.
``raise_failures()`` turns that on (``realtime.testing.raise_preparation_failures``); realtime's
own suite and its Django-suite harness run with it. What application code raises in its hooks
(``payload=``, ``recipients``...) is caught and logged where the hook is called, as documented,
and is not such a failure.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar

from django.db import DatabaseError, connections, transaction

from realtime.compat.django import in_transaction

logger = logging.getLogger(__name__)

T = TypeVar("T")
P = ParamSpec("P")

#: Databases on which a failed statement leaves the transaction usable (no savepoint needed).
FORGIVING = frozenset({"sqlite", "mysql"})

#: MySQL errors after which InnoDB may have rolled back the whole transaction, not the
#: statement alone: a deadlock (1213) always; a lock wait timeout (1205) under
#: ``innodb_rollback_on_timeout``. realtime's lock read locks the rows the write itself
#: changes, so either is one the write would have met on the same rows a statement later.
MYSQL_TRANSACTION_ENDING = frozenset({1205, 1213})

_raising = False

#: Django 6.1 names ``transaction.savepoint()`` ``savepoint_create()`` (and deprecates the old
#: name); both are documented.
_create_savepoint: Callable[..., str] = getattr(
    transaction, "savepoint_create", transaction.savepoint
)


def raise_failures(on: bool = True) -> None:
    """Raise, instead of logging, what realtime's part of a write raises (for tests)."""
    global _raising
    _raising = on


class WritesOwnError(Exception):
    """What realtime's part of a write met that the write itself meets too, as Django would
    raise it (a row lock the caller's ``select_for_update(nowait=True)`` refuses): ``failsafe``
    raises ``error`` to the caller, unlogged."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def failsafe(what: str, using: str, queries: bool, build: Callable[[], T]) -> T | None:
    """Run ``build`` (realtime's part of a write about ``what``), never failing the write:
    what it raises is logged (raised, with ``raise_failures``), and ``None`` returned; but
    a ``WritesOwnError``'s error is the write's own, raised. When it may query, in a savepoint
    from its first statement (``savepoint_from_first_query``)."""
    try:
        if queries:
            with savepoint_from_first_query(using):
                return build()
        return build()
    except WritesOwnError as own:
        raise own.error from None
    except Exception as error:
        if _raising or ends_transaction(error, using):
            raise
        logger.exception("realtime: preparing the announcement of %s failed; not announced", what)
        return None


@contextmanager
def savepoint_from_first_query(using: str) -> Iterator[None]:
    """Around code that may query inside a write (realtime's reads, a model's ``payload=``): a
    savepoint where one is needed (``needs_savepoint``), taken just before the block's first
    statement, so that a block that sends none costs no statement.

    The savepoint is rolled back when the block raises, and also when one of its statements
    failed though the block caught the error (application code may): that statement aborted
    the transaction, and releasing the savepoint would fail, and so would every statement of
    the write after it. It is taken with Django's documented ``transaction.savepoint_create``
    (``savepoint`` before Django 6.1) from a documented ``connection.execute_wrapper``."""
    if not needs_savepoint(using):
        yield
        return
    opener = _SavepointFromFirstQuery(using)
    openers = _openers(using)
    openers.append(opener)
    try:
        with connections[using].execute_wrapper(opener):
            yield
    except BaseException:
        opener.close(failed=True)
        raise
    finally:
        openers.remove(opener)
    opener.close(failed=opener.failed)


class _Local(threading.local):
    def __init__(self) -> None:
        #: The blocks in progress, innermost last, by alias.
        self.openers: dict[str, list[_SavepointFromFirstQuery]] = {}
        #: A savepoint is being taken: its statement is nobody's first.
        self.taking = False


_local = _Local()


def _openers(using: str) -> list[_SavepointFromFirstQuery]:
    return _local.openers.setdefault(using, [])


class _SavepointFromFirstQuery:
    """An execute wrapper taking a savepoint before the first statement it sees, and noting
    a statement that fails while it is the innermost such block (an inner one rolls back to
    its own savepoint, which leaves this one's whole).

    Blocks nest (a model's ``payload=`` inside realtime's reads): the ``SAVEPOINT`` statement
    one takes passes through the others' wrappers too, and is not their first statement."""

    def __init__(self, using: str) -> None:
        self.using = using
        self.sid: str | None = None
        self.failed = False

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        if self.sid is None and not _local.taking:
            _local.taking = True
            try:
                self.sid = _create_savepoint(using=self.using)
            finally:
                _local.taking = False
        try:
            return execute(sql, params, many, context)
        except DatabaseError:
            if _openers(self.using)[-1:] == [self]:
                self.failed = True
            raise

    def close(self, failed: bool) -> None:
        """Release the savepoint, or roll back to it when something failed."""
        if self.sid is None:
            return
        if failed:
            transaction.savepoint_rollback(self.sid, using=self.using)
        else:
            transaction.savepoint_commit(self.sid, using=self.using)


def needs_savepoint(using: str) -> bool:
    """Whether a statement realtime adds on ``using`` now runs in a savepoint: inside a
    transaction, on a database where a failed statement aborts it."""
    connection = connections[using]
    return connection.vendor not in FORGIVING and in_transaction(connection)


def ends_transaction(error: BaseException, using: str | None) -> bool:
    """Whether ``error``, raised by a statement realtime made on ``using`` inside a
    transaction, may have ended that transaction: the write must then fail with it. On
    PostgreSQL the statement ran in a savepoint, whose rollback leaves the transaction whole
    whatever failed (a deadlock included); SQLite takes no row locks, and ends a transaction
    on an error only when out of memory or disk, which a write's own statements meet too."""
    if using is None or not isinstance(error, DatabaseError):
        return False
    connection = connections[using]
    if connection.vendor != "mysql" or not in_transaction(connection):
        return False
    return bool(error.args) and error.args[0] in MYSQL_TRANSACTION_ENDING


def never_raises(receiver: Callable[P, None]) -> Callable[P, None]:
    """Wrap a signal receiver so that nothing it raises reaches the write (it is logged;
    raised, with ``raise_failures``), but what ended the write's transaction
    (``ends_transaction``)."""

    @functools.wraps(receiver)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            receiver(*args, **kwargs)
        except Exception as error:
            using = kwargs.get("using")  # Django's model signals all send it
            if _raising or ends_transaction(error, using if isinstance(using, str) else None):
                raise
            logger.exception("realtime: %s failed; the write goes on", receiver.__qualname__)

    return guarded
