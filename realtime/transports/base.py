"""The transport contract: how internal messages travel from publishers to listening workers.

A transport carries ``(channel, payload)`` pairs from any process that publishes (a request, a
task, the shell) to every worker process that follows the channel. Every implementation
guarantees, and the shared contract suite (``tests/transport_contract.py``) checks:

* ``publish`` is synchronous and runs after the announcing write committed, in a transaction
  of its own; the messages of one call are published together and heard in their order.
  It raises ``PublishError`` (never a driver error) when nothing could be published, and
  ``ChannelTooLongError`` before publishing anything when a channel exceeds 1,024 bytes.
  Its ``txn`` names the rows of realtime's outbox the messages were built from: the same
  rows relayed again (a writer that died after publishing, before deleting them) come with
  the same ``txn``, so a transport that remembers it can drop the re-relay; others ignore it.
* A ``durable`` transport has every announcement made inside a transaction written to
  realtime's outbox in that transaction, and relayed from there by any worker when its
  writer did not relay it (``realtime.writes.relay``): nothing committed is lost.
* ``follow(channel)`` returns once the channel is really heard: a message published after it
  returns is delivered; nothing published before it is (no replay). ``unfollow`` stops it.
* ``start``/``stop`` are idempotent; ``stop`` interrupts any wait and returns promptly. The
  listener starts with the first ``follow``; a process that only publishes never starts one.
* Listeners added with ``add_listener`` are called on the event loop that started the
  listener, in delivery order, each failure isolated and logged. A listener error or a lost
  database connection never stops the listener: it logs and goes on.
* A listener added with a ``room`` (how many more messages it can take now) is never handed
  more than that: a transport stops reading (the table transport leaves rows in the table)
  or, when it cannot stop what arrives, treats the surplus as missed. A listener added with
  ``missed`` is told the channels on which messages may have been lost (an outage or an
  overflow that no log could make good), so that it can make its clients read again.
  ``watch`` is called on the event loop every housekeeping tick: a transport checks there
  that its connections still make progress. A transport that ignores all three still works.
* ``max_message_bytes`` is the budget one message must fit (``None``: no cap); publishers
  shrink what does not fit (see ``realtime.writes.packing``) before calling ``publish``.

A transport may also keep a *history*, and resumable delivery rests on it. Each message is then
handed to the listeners with its position (``realtime.positions``), in order within its
stream: a message is handed over only after every earlier one of its stream on the channels
followed (a refreshed cursor rests on it, see ``realtime.sockets.refresh``). Two shapes:

* one global *log* (the table and pg_notify transports): every message a row of
  ``firm_channel_messages`` whose id is its position, ids growing in the order messages commit
  (publishers serialize on the log). Such a transport answers ``log_bounds`` (the first
  position the log still holds, and the last one settled: every message at or below it has
  committed or never will) and ``read_log(channels, after)`` (the messages of those channels
  after a position, in order), and may hand positions over as plain ids. It is trimmed
  only from its start: every message after the first position it holds is still there.
  Its ids may start over (the table emptied with its sequence, a backup restored): a global
  position carries the *mark* of its message (``realtime.positions.mark_of``), and such a
  transport answers ``log_marks`` (the marks of the messages it holds at some positions) and
  ``marked_log_bounds`` (``log_bounds`` and the mark of the last message, read together).
  One that does not has every cursor the log still holds the position of refused;
* a stream per channel (Redis): it answers ``stream_of``, ``stream_bounds`` and
  ``read_streams`` (which default to the global log's answers), and its ``follow`` tells
  where in the stream it starts.

A transport without a history (the default here) answers ``None`` and ``[]``: every resume
then answers ``resumed: false``.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable, Collection, Sequence
from typing import NamedTuple, TypeVar

from realtime.positions import GLOBAL, StreamPos, Vector, global_position, mark_of

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: ``callback(channel, payload, position)``; ``position`` is ``None`` without a log.
Listener = Callable[[str, bytes, "StreamPos | None"], None]
#: How many more messages a listener can take now.
Room = Callable[[], int]
#: ``missed(channels)``: messages on these channels may have been lost.
Missed = Callable[[frozenset[str]], None]
#: One message read from the log: its channel, its payload and its position.
LogEntry = tuple[str, bytes, int]
#: One message read from a stream: its channel, its payload and its position.
StreamEntry = tuple[str, bytes, StreamPos]


class StreamBounds(NamedTuple):
    """What a stream holds: its epoch (the global log's: the mark of its message at ``last``),
    the first offset it still holds (``None``: none) and the last one settled (every message
    at or below it is in the stream or never will be)."""

    epoch: str
    first: int | None
    last: int


def or_setting(value: T | None, setting: T) -> T:
    """``value``, or ``setting`` where it is ``None``: a transport's arguments left ``None``
    come from settings."""
    return setting if value is None else value


#: Called with the transport each time a listener is added (a worker starts hearing it): what
#: must run in every process that listens, beside the listener (the outbox's sweeper).
_listening_hooks: list[Callable[[Transport], None]] = []


def on_listening(hook: Callable[[Transport], None]) -> None:
    """Call ``hook(transport)`` whenever a listener is added to a transport (once per hook)."""
    if hook not in _listening_hooks:
        _listening_hooks.append(hook)


class Transport(abc.ABC):
    """Base class of transports; see the module docstring for the guarantees."""

    #: Bytes one serialized message may take; ``None`` when the transport has no cap.
    max_message_bytes: int | None = None
    #: The database alias ``publish`` writes on, if any: while a transaction of the
    #: application is open there, realtime publishes from a thread of its own (with its own
    #: connection) rather than inside that transaction.
    publishes_on: str | None = None
    #: Whether announcements go through realtime's outbox (``realtime_outbox``): written in
    #: the write's transaction, relayed after commit by the writer, and by any worker's
    #: sweeper when the writer did not (see ``realtime.writes.relay``).
    durable: bool = False

    def __init__(self) -> None:
        self._listeners: list[Listener] = []
        self._rooms: dict[Listener, Room] = {}
        self._missed: dict[Listener, Missed] = {}

    @abc.abstractmethod
    def publish(self, messages: Sequence[tuple[str, bytes]], *, txn: str | None = None) -> None:
        """Publish ``(channel, payload)`` pairs, in order, in one transaction of their own;
        ``txn``: the key of the outbox rows they were built from (see the module docstring)."""

    @abc.abstractmethod
    async def follow(self, channel: str) -> StreamPos | None:
        """Start hearing ``channel`` in this process; return once it is heard.

        A transport with a stream per channel returns the position it starts after (every
        message of the stream up to it was published before, and none is handed over): the
        worker then counts the stream carried up to there. ``None`` otherwise.
        """

    @abc.abstractmethod
    async def unfollow(self, channel: str) -> None:
        """Stop hearing ``channel`` in this process."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Start the listener (idempotent)."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stop the listener and interrupt its waits (idempotent)."""

    def close(self) -> None:  # noqa: B027 - optional: transports without resources skip it
        """Release what the transport holds for publishing (threads, connections); sync.

        Called when the transport is replaced (a settings change). Listening is ended by
        ``stop()``; a transport whose listener still runs is asked to stop without waiting.
        """

    def log_bounds(self) -> tuple[int | None, int] | None:
        """The first position the log still holds (``None``: it holds nothing) and the last
        one settled; ``None`` without a log.

        Sync (it queries): call it off the event loop.
        """
        return None

    def last_position(self) -> int | None:
        """The last settled position of the log (see ``log_bounds``); ``None`` without one."""
        bounds = self.log_bounds()
        return None if bounds is None else bounds[1]

    def marked_log_bounds(self) -> tuple[int | None, int, str] | None:
        """``log_bounds`` and the mark of the message at the last position (``""``: none, or
        unknown), read together; ``None`` without a log.

        Sync (it queries): call it off the event loop.
        """
        bounds = self.log_bounds()
        return None if bounds is None else (*bounds, "")

    def log_marks(self, positions: Collection[int]) -> dict[int, str]:
        """The mark of the message at each of ``positions`` that the log holds (a position
        it holds no message at is left out).

        Sync (it queries): call it off the event loop. The default knows none.
        """
        return {}

    def read_log(self, channels: Sequence[str], after: int, limit: int) -> list[LogEntry]:
        """At most ``limit`` messages of ``channels`` after position ``after``, in order.

        Sync (it queries): call it off the event loop. Without a log: nothing.
        """
        return []

    def stream_of(self, channel: str) -> str:
        """The stream the messages of transport channel ``channel`` are ordered in
        (``GLOBAL``: one log orders every channel, as the table and pg_notify transports')."""
        return GLOBAL

    def stream_bounds(self, streams: Collection[str]) -> dict[str, StreamBounds] | None:
        """The bounds of each of ``streams`` (a stream that holds nothing yet may be left out,
        or answered with ``first`` ``None``); ``None`` without a history.

        Sync (it queries): call it off the event loop. The default answers the global log's
        ``marked_log_bounds``, the mark of its last message as its epoch (see
        ``realtime.positions``).
        """
        bounds = self.marked_log_bounds()
        if bounds is None:
            return None
        first, last, mark = bounds
        return {GLOBAL: StreamBounds(mark, first, last)}

    def read_streams(self, channels: Sequence[str], after: Vector, limit: int) -> list[StreamEntry]:
        """At most ``limit`` messages of ``channels`` after ``after``: in each stream, those
        after its entry of ``after`` (a stream ``after`` does not name is not read), in order
        and without a gap; all of them when fewer than ``limit`` come back.

        Sync (it queries): call it off the event loop. The default reads the global log.
        """
        start = after.position(GLOBAL)
        if start is None:
            return []
        return [
            (channel, payload, global_position(position, mark_of(payload)))
            for channel, payload, position in self.read_log(channels, start.seq, limit)
        ]

    def add_listener(
        self, callback: Listener, *, room: Room | None = None, missed: Missed | None = None
    ) -> None:
        """Call ``callback(channel, payload, position)`` on the event loop for every message
        heard; never hand it more than ``room()`` messages; tell ``missed`` of losses."""
        self._listeners.append(callback)
        for hook in tuple(_listening_hooks):
            try:
                hook(self)
            except Exception:
                logger.exception("realtime: a hook on a transport's first listener failed")
        if room is not None:
            self._rooms[callback] = room
        if missed is not None:
            self._missed[callback] = missed

    def listening(self) -> bool:
        """Whether a listener is added (this process is a worker hearing the transport)."""
        return bool(self._listeners)

    def remove_listener(self, callback: Listener) -> None:
        """Stop calling ``callback``; unknown callbacks are ignored."""
        if callback in self._listeners:
            self._listeners.remove(callback)
        self._rooms.pop(callback, None)
        self._missed.pop(callback, None)

    def room(self) -> int | None:
        """How many more messages every listener can take now (``None``: no limit)."""
        rooms = [room() for room in tuple(self._rooms.values())]
        return min(rooms) if rooms else None

    def report_missed(self, channels: frozenset[str]) -> None:
        """Tell the listeners that messages on ``channels`` may have been lost."""
        for missed in tuple(self._missed.values()):
            try:
                missed(channels)
            except Exception:
                logger.exception("realtime: a listener failed on a report of missed messages")

    def watch(self) -> None:  # noqa: B027 - optional: transports without connections skip it
        """Check, on the event loop, that the listener still makes progress (every tick)."""

    def dispatch(
        self, channel: str, payload: bytes, position: StreamPos | int | None = None
    ) -> None:
        """Hand one message to every listener; a listener that raises is logged and skipped.

        A transport with one global log may give its position as the log id (an ``int``).
        """
        if isinstance(position, int):
            position = global_position(position, mark_of(payload))
        for callback in tuple(self._listeners):
            try:
                callback(channel, payload, position)
            except Exception:
                logger.exception("realtime listener %r failed on channel %r", callback, channel)
