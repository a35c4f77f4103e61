"""Positions: where a message sits in the history a transport keeps, and where a socket is.

A transport that keeps a history hands each message over with its position, a
``StreamPos``: the *stream* it belongs to, the stream's *epoch* and the message's *offset* in
it. Within one stream (and one epoch) offsets grow in the order messages are handed over, with
no gap: a stream is what one worker reads in order. Positions of different streams are not
comparable.

The table and pg_notify transports keep one log for every channel, ordered by the publish
lock: one stream, ``GLOBAL``, whose offsets are log ids (sparse for a worker that follows some
channels only: every message in between was of channels it does not follow). The log has no
epoch, and its ids start over when it is emptied with them (``manage.py flush``, ``TRUNCATE
... RESTART IDENTITY``, a backup restored): in its place, a global position carries the
*mark* of the message at it (``mark_of``, a checksum of its payload; ``""``: unknown), so
that a cursor names the message it was made at, and a resume can tell that the log holds
another one there now. Marks are not compared between positions: a global position covers
another by its offset alone. A transport whose order is per channel (Redis: one stream per
transport channel, offsets dense, an epoch that changes when the stream lost history) names
each stream after its channel.

Where a socket is, is a ``Vector``: for each stream, the epoch and the offset up to which it
has every frame. A position of another epoch than the vector's entry is not covered by it:
history was lost or recreated there, and nothing after it can be assumed sent (on the global
log, where the entry's epoch is a mark, the resume checks the message instead).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator, Mapping
from typing import NamedTuple

#: The one stream of a transport whose log orders every channel together.
GLOBAL = "*"


class StreamPos(NamedTuple):
    """A message's place: its stream, the stream's epoch (on the global log: the message's
    mark), and its sequence number there (its *offset*)."""

    stream: str
    epoch: str
    seq: int


def global_position(offset: int, mark: str = "") -> StreamPos:
    """The position of log id ``offset`` in a transport with one global log; ``mark``: that of
    the message at it (see ``mark_of``)."""
    return StreamPos(GLOBAL, mark, offset)


def mark_of(payload: bytes) -> str:
    """The mark of the global log's message of ``payload``: its CRC-32, in hexadecimal.
    Every message of realtime's carries a unique ``mid``, so a message the log holds at a
    position after its ids started over has another mark (but for one chance in 2**32)."""
    return f"{zlib.crc32(payload):x}"


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
        """Whether every frame up to ``position`` was had: same epoch (on the global log, any
        mark), offset not past."""
        entry = self._entries.get(position.stream)
        if entry is None or position.seq > entry[1]:
            return False
        return position.stream == GLOBAL or entry[0] == position.epoch

    def reached(self, position: StreamPos) -> bool:
        """Whether this vector is at ``position`` or past it, or in another epoch of its
        stream (that stream's history was made anew since); on the global log, whose epoch
        is a message's mark, by offset alone."""
        entry = self._entries.get(position.stream)
        if entry is None:
            return False
        if position.stream == GLOBAL:
            return entry[1] >= position.seq
        return entry[0] != position.epoch or entry[1] >= position.seq

    def advanced(self, position: StreamPos) -> Vector:
        """This vector moved on to ``position`` in its stream (never back within an epoch;
        another epoch replaces the entry). On the global log the entry moves by offset
        alone, taking the mark of the position it moves to (at the same offset, the mark the
        entry lacked)."""
        entry = self._entries.get(position.stream)
        if entry is not None and entry[1] >= position.seq:
            if position.stream != GLOBAL:
                if entry[0] == position.epoch:
                    return self
            elif entry[1] > position.seq or entry[0] or not position.epoch:
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
