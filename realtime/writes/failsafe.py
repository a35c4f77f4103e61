"""Realtime's work inside a user's write must never fail that write.

Two rules, applied everywhere on the write side: every receiver catches whatever it raises at
its outermost point and logs it (``never_raises``), and every query realtime adds inside a
user's transaction runs in a savepoint (``failsafe``), because on PostgreSQL a failed
statement aborts the whole transaction even when the exception is caught.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from django.db import connections, transaction

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


def never_raises(receiver: Callable[P, None]) -> Callable[P, None]:
    """Wrap a signal receiver so that nothing it raises reaches the write (it is logged)."""

    @functools.wraps(receiver)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            receiver(*args, **kwargs)
        except Exception:
            logger.exception("realtime: %s failed; the write goes on", receiver.__qualname__)

    return guarded
