"""Values in slices: the one way realtime splits a list that one statement cannot take whole.

Databases cap a statement's parameters and its select list, PostgreSQL a notification's size:
ids read in one statement, rows inserted in one, channels LISTENed in one round trip all go
in slices made here, on both sides and in the transports.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from realtime import limits

T = TypeVar("T")


def chunked(values: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """Yield consecutive slices of ``values`` holding at most ``size`` items, in order."""
    for start in range(0, len(values), size):
        yield values[start : start + size]


def weighed_chunks(
    values: Sequence[T], size: int, most: int, weight: Callable[[T], int]
) -> Iterator[Sequence[T]]:
    """Consecutive slices of ``values``, in order, of at most ``size`` items that weigh at
    most ``most`` together (a single heavier item makes a slice of its own)."""
    start = 0
    while start < len(values):
        end, total = start, 0
        while end < len(values) and end - start < size:
            total += weight(values[end])
            if total > most and end > start:
                break
            end += 1
        yield values[start:end]
        start = end


def id_chunks(values: Sequence[T]) -> Iterator[Sequence[T]]:
    """``values`` in slices of at most ``MAX_IDS_PER_MESSAGE`` (ids in one statement), the
    limit read at each call so that a test can lower it."""
    return chunked(values, limits.MAX_IDS_PER_MESSAGE)
