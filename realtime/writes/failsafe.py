"""Realtime's work inside a user's write must never fail that write.

Two rules, applied everywhere on the write side: every receiver catches whatever it raises at
its outermost point and logs it (``never_raises``), and every query realtime adds inside a
user's transaction runs in a savepoint, because on PostgreSQL a failed statement aborts the
whole transaction even when the exception is caught. The savepoint is always Django's
``transaction.atomic``, so that it is released, or rolled back, exactly as Django does it:
around what realtime reads when it may query (``failsafe``), and around application code
that may query (a model's ``payload=``), entered before its first statement
(``savepoint_from_first_query``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any, ParamSpec, TypeVar

from django.db import DatabaseError, connections, transaction

from realtime.compat.django import in_transaction

logger = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")


def failsafe(what: str, using: str, queries: bool, build: Callable[[], T]) -> T | None:
    """Run ``build``, logging and swallowing any failure; in a savepoint when it may query
    inside a transaction, so that a failed query cannot poison the write's transaction."""
    try:
        if queries and in_transaction(connections[using]):
            with transaction.atomic(using=using):
                return build()
        return build()
    except Exception:
        logger.exception("realtime: preparing the announcement of %s failed; not announced", what)
        return None


@contextmanager
def savepoint_from_first_query(using: str) -> Iterator[None]:
    """Run the block, inside a transaction on ``using``, in ``transaction.atomic`` entered just
    before its first statement: a block that sends none costs no statement.

    The savepoint is rolled back when the block raises, and also when one of its statements
    failed though the block caught the error (application code may): on PostgreSQL that
    statement aborted the transaction, so releasing the savepoint would fail, and so would
    every statement of the write after it. Elsewhere the rollback undoes the same thing, so
    such a block ends alike on every database. Outside a transaction each statement commits by
    itself, and a failed one poisons nothing: no savepoint.
    """
    connection = connections[using]
    if not in_transaction(connection):
        yield
        return
    opener = _AtomicFromFirstQuery(using)
    try:
        with connection.execute_wrapper(opener):
            yield
    except BaseException as error:
        opener.close(error)
        raise
    opener.close(opener.failed)


class _AtomicFromFirstQuery:
    """An execute wrapper entering ``transaction.atomic`` before the first statement it sees,
    and noting a statement that fails."""

    def __init__(self, using: str) -> None:
        self.using = using
        self.block = ExitStack()
        self.entering = False
        self.failed: DatabaseError | None = None

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        if not self.entering:
            self.entering = True  # the SAVEPOINT statement passes through here too
            self.block.enter_context(transaction.atomic(using=self.using))
        try:
            return execute(sql, params, many, context)
        except DatabaseError as error:
            self.failed = error
            raise

    def close(self, error: BaseException | None) -> None:
        """Leave the atomic block (if entered) as the error, if any, would leave it."""
        if error is None:
            self.block.close()
        else:
            self.block.__exit__(type(error), error, error.__traceback__)


def never_raises(receiver: Callable[P, None]) -> Callable[P, None]:
    """Wrap a signal receiver so that nothing it raises reaches the write (it is logged)."""

    @functools.wraps(receiver)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            receiver(*args, **kwargs)
        except Exception:
            logger.exception("realtime: %s failed; the write goes on", receiver.__qualname__)

    return guarded
