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


def grouped_chunks(values: Sequence[T], size: int, group: Callable[[T], object]) -> list[list[T]]:
    """``values`` in slices of at most ``size`` items that never part the items of one group:
    a group lies whole in one slice (a group larger than ``size`` makes a slice of its own).
    Groups go in the order they first appear, each slice keeping its items in their order in
    ``values``; ``values`` that fit in one slice come back as they are.

    What a slice holds so depends only on the groups, not on where an item stands in
    ``values``: made again from fewer items, a group's items are again all in one slice."""
    if len(values) <= size:
        return [list(values)] if values else []
    members: dict[object, list[int]] = {}
    for index, value in enumerate(values):
        members.setdefault(group(value), []).append(index)
    slices: list[list[int]] = []
    for indexes in members.values():
        if slices and len(slices[-1]) + len(indexes) <= size:
            slices[-1] += indexes
        else:
            slices.append(list(indexes))
    return [[values[index] for index in sorted(indexes)] for indexes in slices]


def id_chunks(values: Sequence[T]) -> Iterator[Sequence[T]]:
    """``values`` in slices of at most ``MAX_IDS_PER_MESSAGE`` (ids in one statement), the
    limit read at each call so that a test can lower it."""
    return chunked(values, limits.MAX_IDS_PER_MESSAGE)
