"""Values in slices: the one way realtime splits a list that one statement cannot take whole.

Databases cap a statement's parameters and its select list, PostgreSQL a notification's size:
ids read in one statement, rows inserted in one, channels LISTENed in one round trip all go
in slices made here, on both sides and in the transports.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

from realtime import limits

T = TypeVar("T")


def chunked(values: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """Yield consecutive slices of ``values`` holding at most ``size`` items, in order."""
    for start in range(0, len(values), size):
        yield values[start : start + size]


def id_chunks(values: Sequence[T]) -> Iterator[Sequence[T]]:
    """``values`` in slices of at most ``MAX_IDS_PER_MESSAGE`` (ids in one statement), the
    limit read at each call so that a test can lower it."""
    return chunked(values, limits.MAX_IDS_PER_MESSAGE)
