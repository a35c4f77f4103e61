"""The Redis transport's order: each stream's messages handed over once, by offset, no gap.

Every stream (one per transport channel) has its own epoch and dense offsets, so order, gaps
and duplicates are judged per stream. For a live message ``(epoch, n)`` of a stream whose
last message handed over is ``last``:

* ``n <= last``: had already (a gap fill read it, or it predates the follow): dropped;
* ``n == last + 1``, with its payload: handed over;
* ``n > last + 1`` (a message went missing), or no payload (too large to travel live): the
  stream falls *behind* and reads what it owes from the stream itself;
* another epoch: the stream lost history (its server restarted or failed over, or it was
  flushed or expired): its channel is reported ``missed`` (its sockets are closed 1012 and
  read again), and the stream starts over in the new epoch. A late message of an epoch
  already left is dropped.

Behind, a stream keeps no live message, only the highest offset heard, and a catch-up task
reads it (``XRANGE`` through the ``READ`` script) after ``last``, as many entries as the
listeners have room for, until a read reaches the top after every offset heard; then it
follows the live messages again. The same path serves a listener with no room (a full
delivery queue: nothing is dropped, the queue is never overrun) and every (re)subscription
(a gap fill: what was sent while the connection was down). A read whose first entry is not
``last + 1`` (the stream was trimmed past it) is a loss, as another epoch is.

Reads are watched as ``pg_log``'s are: a failure is retried, the first one WARNING
(``outage``); past ``stall_bound`` seconds of failures, one ERROR, and the channels behind
are reported missed (again after each further bound while the reads still fail).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from realtime import metrics
from realtime.logs import describe
from realtime.positions import StreamPos
from realtime.transports.outage import WatchedReads
from realtime.transports.redis_keys import Live
from realtime.transports.tally import Tally

logger = logging.getLogger(__name__)

#: Entries read from a stream at most per read.
PAGE: Final = 1000
#: Seconds between two looks at the listeners' room while it is full, and between two
#: attempts of a read that failed.
ROOM_WAIT: Final = 0.02
RETRY_WAIT: Final = 0.5
#: Epochs a stream remembers having left (their late messages are dropped).
RETIRED: Final = 8
#: Live messages kept while a follow reads its anchor; past it they are read afterwards.
MAX_EARLY: Final = 1000


class Entry(NamedTuple):
    """One entry of a stream: its offset (``seq``), the milliseconds of its id, its payload,
    and its place in the order of publishes (microseconds, index in its publish)."""

    seq: int
    ms: int
    payload: bytes
    order: tuple[int, int]


class StreamRead(NamedTuple):
    """What one read of a stream found: its epoch, top offset, first offset held (``None``:
    none) and the entries after the offset asked, in order."""

    epoch: str
    top: int
    first: int | None
    entries: list[Entry]


Dispatch = Callable[[str, bytes, StreamPos], None]
#: ``read(channel, after, count)``.
Read = Callable[[str, int, int], Awaitable[StreamRead]]


@dataclass(eq=False)
class _Stream:
    #: ``None`` until the follow read where the stream stood (the anchor).
    epoch: str | None = None
    #: The last offset handed over.
    last: int = 0
    behind: bool = False
    #: The highest offset heard while behind.
    heard: int = 0
    #: Live messages heard before the anchor was known.
    early: list[Live] = field(default_factory=list)
    #: Subscribed (once) while the anchor is being read.
    confirmed: bool = False
    #: Subscribed again while the anchor was being read (a reconnect): read after it once
    #: known. Also when too much was heard before it.
    refill: bool = False
    retired: deque[str] = field(default_factory=lambda: deque(maxlen=RETIRED))


class StreamSequencer:
    """Hand each stream's messages over in offset order, once each; see the module
    docstring."""

    def __init__(
        self,
        dispatch: Dispatch,
        read: Read,
        room: Callable[[], int | None],
        *,
        stall_bound: float | None,
        missed: Callable[[frozenset[str]], None],
    ) -> None:
        self.dispatch = dispatch
        self.read = read
        self.room = room
        self.missed = missed
        self._streams: dict[str, _Stream] = {}
        self._catching: asyncio.Task[None] | None = None
        #: Past ``stall_bound`` seconds of failed reads, the channels behind are reported
        #: ``missed`` (``None``: never).
        self.reads = WatchedReads("reading the Redis streams", stall_bound, missed)
        #: Times the listeners had no room and a stream fell behind.
        self.overflows = Tally(
            "realtime: redis: the delivery queue was full %d time(s) since the last report "
            "(%d in all); caught up from the streams"
        )
        self.losses = Tally(
            "realtime: redis: %d stream(s) lost history since the last report (%d in all: "
            "a new epoch after a server restart, failover, flush or expiry, or entries "
            "trimmed); their sockets are closed 1012 to read again"
        )
        #: Messages handed over from the streams by catch-ups and gap fills.
        self.caught = 0

    def __contains__(self, channel: str) -> bool:
        return channel in self._streams

    def position(self, channel: str) -> StreamPos | None:
        """Where ``channel``'s stream stands here: its epoch and the last offset handed over."""
        stream = self._streams.get(channel)
        if stream is None or stream.epoch is None:
            return None
        return StreamPos(channel, stream.epoch, stream.last)

    def channels(self) -> frozenset[str]:
        return frozenset(self._streams)

    def expect(self, channel: str) -> None:
        """``channel`` is being followed: keep what is heard until its anchor is known."""
        self._streams.setdefault(channel, _Stream())

    def anchored(self, channel: str, epoch: str, top: int) -> None:
        """The follow of ``channel`` read its stream at ``(epoch, top)``: what comes after is
        handed over, nothing before."""
        stream = self._streams.get(channel)
        if stream is None or stream.epoch is not None:
            return
        stream.epoch, stream.last = epoch, top
        early, stream.early = stream.early, []
        for live in early:
            self.received(channel, live)
        if stream.refill:
            stream.refill = False
            self.fall_behind([channel])

    def forget(self, channel: str) -> None:
        self._streams.pop(channel, None)

    def received(self, channel: str, live: Live) -> None:
        """A live message of ``channel``'s stream arrived (in publish order)."""
        stream = self._streams.get(channel)
        if stream is None:
            return
        if stream.epoch is None:
            if len(stream.early) < MAX_EARLY:
                stream.early.append(live)
            else:
                stream.early.clear()  # read from the stream once the anchor is known
                stream.refill = True
            return
        if live.epoch != stream.epoch:
            if live.epoch in stream.retired:
                return  # sent before the epoch this stream already moved to
            self._lost(channel, stream)
            self._restart(stream, live.epoch, live.seq - 1)
        if live.seq <= stream.last:
            return
        if stream.behind:
            stream.heard = max(stream.heard, live.seq)
            return
        if live.seq == stream.last + 1 and live.payload is not None:
            room = self.room()
            if room is None or room > 0:
                stream.last = live.seq
                self.dispatch(channel, live.payload, StreamPos(channel, live.epoch, live.seq))
                return
            self.overflows.add()
        stream.heard = max(stream.heard, live.seq)
        self._behind(stream)

    def resubscribed(self, channel: str) -> None:
        """``channel`` was (re)subscribed: read what may have been sent while it was not."""
        stream = self._streams.get(channel)
        if stream is None:
            return
        if stream.epoch is None:
            # The first subscription is the follow's own: its anchor is read after it.
            stream.refill = stream.refill or stream.confirmed
            stream.confirmed = True
        else:
            self.fall_behind([channel])

    def fall_behind(self, channels: Iterable[str]) -> None:
        """Read ``channels``' streams after their last offset handed over, up to their top."""
        for channel in channels:
            stream = self._streams.get(channel)
            if stream is not None and stream.epoch is not None:
                self._behind(stream)

    def behind(self) -> frozenset[str]:
        """The channels whose streams are being read."""
        return frozenset(c for c, s in self._streams.items() if s.behind)

    def stop(self) -> None:
        """Cancel the catch-up under way (the transport stops)."""
        task, self._catching = self._catching, None
        if task is not None:
            task.cancel()

    def _behind(self, stream: _Stream) -> None:
        stream.behind = True
        if self._catching is None or self._catching.done():
            self._catching = asyncio.get_running_loop().create_task(self._catch_up())
            self._catching.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        """A catch-up that stops while streams are still behind is an ERROR and a restart:
        no stream must wait for a read that nobody makes."""
        if task is not self._catching or not self.behind():
            return
        error = None if task.cancelled() else task.exception()
        logger.error(
            "realtime: redis: catching up from the streams stopped (%s); started again",
            "cancelled" if error is None else describe(error),
            exc_info=error,
        )
        self._catching = asyncio.get_running_loop().create_task(self._catch_up())
        self._catching.add_done_callback(self._ended)

    def _restart(self, stream: _Stream, epoch: str, last: int) -> None:
        if stream.epoch is not None:
            stream.retired.append(stream.epoch)
        stream.epoch, stream.last = epoch, last
        stream.behind, stream.heard = False, 0

    def _lost(self, channel: str, stream: _Stream) -> None:
        self.losses.add()
        metrics.stream_lost()
        self.missed(frozenset([channel]))

    async def _catch_up(self) -> None:
        while True:
            owed = [(c, s) for c, s in self._streams.items() if s.behind and s.epoch is not None]
            if not owed:
                return
            for channel, stream in owed:
                room = self.room()
                while room is not None and room <= 0:
                    await asyncio.sleep(ROOM_WAIT)
                    room = self.room()
                if self._streams.get(channel) is not stream or not stream.behind:
                    continue
                epoch, count = stream.epoch, min(room or PAGE, PAGE)
                try:
                    read = await self.read(channel, stream.last, count)
                except Exception as exc:
                    self.reads.failed(exc, RETRY_WAIT, self.behind)
                    await asyncio.sleep(RETRY_WAIT)
                    break
                self.reads.worked()
                if self._streams.get(channel) is stream and stream.epoch == epoch:
                    self._apply(channel, stream, read)

    def _apply(self, channel: str, stream: _Stream, read: StreamRead) -> None:
        if read.epoch != stream.epoch:
            if read.epoch not in stream.retired:
                self._lost(channel, stream)
                self._restart(stream, read.epoch, read.top)
            return
        entries = [entry for entry in read.entries if entry.seq > stream.last]
        if entries and entries[0].seq != stream.last + 1:
            self._lost(channel, stream)  # trimmed past what this worker had
        elif not entries and read.top > stream.last:
            self._lost(channel, stream)  # expired or trimmed whole
            stream.last = read.top
        assert stream.epoch is not None
        for offset, _, payload, _ in entries:
            stream.last = offset
            self.caught += 1
            metrics.caught_up()
            self.dispatch(channel, payload, StreamPos(channel, stream.epoch, offset))
        if stream.last >= read.top and stream.heard <= stream.last:
            stream.behind, stream.heard = False, 0
