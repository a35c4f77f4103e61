"""Positions: where a message sits in the history a transport keeps, and where a socket is.

A transport that keeps a history hands each message over with its position, a
``StreamPos``: the *stream* it belongs to, the stream's *epoch* and the message's *offset* in
it. Within one stream (and one epoch) offsets grow in the order messages are handed over, with
no gap: a stream is what one worker reads in order. Positions of different streams are not
comparable.

The table and pg_notify transports keep one log for every channel, ordered by the publish
lock: one stream, ``GLOBAL``, whose epoch is ``""`` and whose offsets are log ids (sparse for a
worker that follows some channels only: every message in between was of channels it does not
follow). A transport whose order is per channel (Redis: one stream per transport channel,
offsets dense, an epoch that changes when the stream lost history) names each stream after
its channel.

Where a socket is, is a ``Vector``: for each stream, the epoch and the offset up to which it
has every frame. A position of another epoch than the vector's entry is not covered by it:
history was lost or recreated there, and nothing after it can be assumed sent.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import NamedTuple

#: The one stream of a transport whose log orders every channel together.
GLOBAL = "*"


class StreamPos(NamedTuple):
    """A message's place: its stream, the stream's epoch, and its sequence number there
    (its *offset*)."""

    stream: str
    epoch: str
    seq: int


def global_position(offset: int) -> StreamPos:
    """The position of log id ``offset`` in a transport with one global log."""
    return StreamPos(GLOBAL, "", offset)


class Vector(Mapping[str, tuple[str, int]]):
    """Immutable: per stream, ``(epoch, offset)`` up to which every frame was had."""

    __slots__ = ("_entries", "_hash")

    def __init__(self, entries: Mapping[str, tuple[str, int]] | None = None) -> None:
        self._entries: dict[str, tuple[str, int]] = dict(entries or {})
        self._hash: int | None = None

    @classmethod
    def of(cls, positions: Iterable[StreamPos]) -> Vector:
        """The vector of ``positions`` (the highest of a stream's epoch wins; a later epoch
        of the same stream replaces an earlier one)."""
        vector = cls()
        for position in positions:
            vector = vector.advanced(position)
        return vector

    def __getitem__(self, stream: str) -> tuple[str, int]:
        return self._entries[stream]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Vector):
            return self._entries == other._entries
        return NotImplemented

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(frozenset(self._entries.items()))
        return self._hash

    def __repr__(self) -> str:
        return f"Vector({self._entries!r})"

    def covers(self, position: StreamPos) -> bool:
        """Whether every frame up to ``position`` was had: same epoch, offset not past."""
        entry = self._entries.get(position.stream)
        return entry is not None and entry[0] == position.epoch and position.seq <= entry[1]

    def reached(self, position: StreamPos) -> bool:
        """Whether this vector is at ``position`` or past it, or in another epoch of its
        stream (that stream's history was made anew since)."""
        entry = self._entries.get(position.stream)
        return entry is not None and (entry[0] != position.epoch or entry[1] >= position.seq)

    def advanced(self, position: StreamPos) -> Vector:
        """This vector moved on to ``position`` in its stream (never back within an epoch;
        another epoch replaces the entry)."""
        entry = self._entries.get(position.stream)
        if entry is not None and entry[0] == position.epoch and entry[1] >= position.seq:
            return self
        entries = dict(self._entries)
        entries[position.stream] = (position.epoch, position.seq)
        return Vector(entries)

    def merged(self, other: Mapping[str, tuple[str, int]]) -> Vector:
        """The furthest of both in each stream (``other``'s entry where epochs differ)."""
        vector = self
        for stream, (epoch, offset) in other.items():
            vector = vector.advanced(StreamPos(stream, epoch, offset))
        return vector

    def only(self, streams: Iterable[str]) -> Vector:
        """The entries of ``streams`` only."""
        return Vector({s: self._entries[s] for s in streams if s in self._entries})

    def position(self, stream: str) -> StreamPos | None:
        """This vector's entry for ``stream`` as a position; ``None`` when it has none."""
        entry = self._entries.get(stream)
        return None if entry is None else StreamPos(stream, *entry)
