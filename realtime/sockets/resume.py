"""Resuming sockets: what a socket that opted in missed while away, read from the history.

A socket that opts in (``authenticate.resume``) is registered, subscribed and following its
scopes before this runs, its live frames held (``Socket.held``). Then, for a cursor that is
valid (signed for this account, within ``REALTIME_RESUME_WINDOW``) and still covered by the
history, the history is read after the cursor on the channels the socket hears — its scopes'
and the base channel — and each message is planned by the ``Dispatcher`` among the resuming
sockets only: today's scopes, subscriptions, ``only`` lists and audience checks decide, as if
the message were published now. The missed frames go out after ``auth_success``, then the
held live frames the read did not already cover.

The history is one global log (table, pg_notify) or a stream per channel (Redis); either way
a cursor says where the socket was in each stream it heard (``realtime.positions``), and on a
global log which scopes it heard there (``realtime.sockets.cursors``). It is covered when, in
every stream it names that the socket still hears, the epoch is the same and nothing after
its offset was trimmed; a global log has no epoch, and the message it holds at the cursor's
position must be the one the cursor names (``_on_the_same_log``: its ids may have started
over). That is asked twice: before the history is read (a cursor not covered
is not read for), and again once it is read, for a trim may commit between the two and take
what the read was about to start with — the read would then begin at the next message still
held, and skip the others. A trim cuts only the start of a stream (the log's lowest ids, a
Redis stream's first entries), so a cursor still covered after the read was covered all
through it. A socket that hears now a stream, or on a global log a scope, that its
cursor does not name (a scope gained while away, or asked for now) is not resumed
(``resumed: false``): what that scope said before the socket came back was not the socket's
to hear — the account may have joined it only while away — and where the socket was in it is
unknown.

Today's guard lets a replayed event of a guarded row through when the row is readable now,
which it may not have been when the event was published. Where the replay holds the frame
that brought the row into the account's view (an enter frame, carrying the whole row), the
earlier frames of that row since it was last out of that view are dropped (``_Request.add``).

Within a stream, every message up to the highest position read was there when it was read
(publishers serialize on the log; a Redis stream appends dense offsets atomically): a held
frame at or below it was read too (if it was this socket's), one above it was not. That is
the seam: no frame twice, none skipped.

Each row's versions pass the seam in commit order too. The replay drops a version
superseded earlier in the history (``RecordOrder``, as a live worker does), and a version
older than one it let through, published late, is dropped when it comes live: the resumed
sockets keep what the replay let through (``Socket.replayed``), and their frames, held
meanwhile or live, pass it as they go out. It joins the worker's live memory (for every
socket here: a version let through is one that committed, an older one is superseded in the
database) only once live delivery has planned every message up to where the replay read
(``Dispatcher.replayed``): the replay reads the log directly and is often ahead of live
delivery, and a newer version it read would otherwise drop, for the sockets that stayed
connected, the older ones live delivery had not carried yet.

Sockets that resume together (a worker restart brings back many at once) are answered in one
batch: one read of the log bounds (and one more once read), one read of the log for the
batch's channels, each message planned once for all the sockets that missed it. They share
reads, never a budget: each socket is refused only for its own reasons — its cursor, the log
no longer covering it, more than ``REALTIME_RESUME_MAX_FRAMES`` frames for it, or more than
``RESUME_SCAN_PER_FRAME`` (in ``realtime.limits``) times that many messages of its own
scopes to scan — or account events of the deployment: every account's events share the base
channel, so a cursor behind a busy deployment's account traffic would cost a read of all of
it. Each message is planned for the requests that missed it, found through an index (by
scope channel; by account for an account event), and the rows of a page's replayed account
events are asked about at once (``readers_now_many``). A socket refused drops out of the
batch at once, its channels with it, and the read moves on from the oldest cursor still
resuming: an old cursor or a busy scope costs the batch only the pages that socket needed.

Replay's frames are made on the event loop in slices (``SLICE`` sockets at a time), and the sockets
of a batch are answered in slices too: live delivery gets a turn of the loop between them,
so a storm of resumes after a deploy does not hold the worker's live frames back (the
manager sends each socket's missed frames behind live delivery as well, see ``go_live``).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from realtime import limits
from realtime.blocking import run_blocking
from realtime.chunks import chunked
from realtime.conf import conf
from realtime.encoding import normal_id, row_key, sorted_ids
from realtime.messages import USERS, addressed_to, base_channel, scope_channel
from realtime.positions import GLOBAL, StreamPos, Vector
from realtime.readers import Ask, readers_now_many, row_of
from realtime.sockets.batcher import SLICE
from realtime.sockets.connection import Held, Socket
from realtime.sockets.cursors import read_cursor, same_epoch, stamp_of
from realtime.sockets.delivery import (
    Dispatcher,
    cursor_of,
    read_message,
    scope_channels,
    streams_heard,
    with_cursor,
)
from realtime.sockets.limits import log_own_failure
from realtime.sockets.protocol import ResumeAsk
from realtime.sockets.record_order import RecordOrder
from realtime.transports.base import StreamBounds, Transport

logger = logging.getLogger(__name__)

#: Messages read from the log per query.
PAGE: Final = 1000


@dataclass
class Resumed:
    """How a socket starts: what ``auth_success`` says, the missed frames, and where it has
    every frame up to once they are sent (``None``: unknown; see ``Socket.floor``)."""

    cursor: str
    #: ``None`` when no cursor was given (``resumed`` is then left out of ``auth_success``).
    resumed: bool | None
    frames: list[Held]
    floor: Vector | None
    #: The history could not be read to resume the cursor given (the database or Redis
    #: away): the socket is closed 1012 and comes back with it, rather than told to reload.
    unreadable: bool = False


@dataclass(eq=False)
class _Request:
    socket: Socket
    ask: ResumeAsk
    future: asyncio.Future[Resumed]
    #: Where its cursor says it was, in each stream it names that the socket still hears
    #: (``None``: not resumable).
    after: Vector | None = None
    #: Where the frames replayed so far take it (the cursor of its next replayed frame).
    at: Vector = field(default_factory=Vector)
    frames: list[Held] = field(default_factory=list)
    #: Indexes in ``frames`` of the frames a later enter frame of their row dropped, and, per
    #: row, those a later one would drop (see ``add``).
    dropped: set[int] = field(default_factory=set)
    since_left: dict[Any, list[int]] = field(default_factory=dict)
    refused: bool = False
    #: The transport channels it hears (its scopes' and the base channel), and their streams.
    channels: frozenset[str] = frozenset()
    streams: frozenset[str] = frozenset()
    #: Messages of its scopes it may still have read before it is refused (the account
    #: events of the deployment are counted a page at a time: see ``_replay``).
    scan_left: int = 0

    def add(self, frame: Held, row: Any, view: str | None) -> None:
        """Add a replayed frame about ``row`` (``None``: no row's); ``view``: ``"enter"``
        for an enter frame (``<model>.created`` with ``moved``: the row entered the
        account's view), ``"leave"`` for a frame that took the row out of it (any
        ``<model>.deleted``).

        An enter frame says the account could not read the row just before, and carries
        the whole row: the frames of that row replayed since the last that took it out of
        the account's view (since the cursor, when none did) are dropped. Live, the account
        heard none of them; replayed, they passed because the row is readable now, and
        would tell versions it never could read. Frames before a leave were heard live and
        stay. Nothing is sent before the whole history is read, so an enter on a later page
        drops frames of earlier ones."""
        index = len(self.frames)
        self.frames.append(frame)
        if row is None:
            return
        since = self.since_left.setdefault(row, [])
        if view == "enter":
            self.dropped.update(since)
            since.clear()
        if view == "leave":
            since.clear()
        else:
            since.append(index)

    def count(self) -> int:
        """The frames to replay."""
        return len(self.frames) - len(self.dropped)

    def replayed(self) -> list[Held]:
        """The frames to replay, in order."""
        return [frame for index, frame in enumerate(self.frames) if index not in self.dropped]


class Resumer:
    """Answers the resumes of one ``SocketManager``, in batches (see the module docstring)."""

    def __init__(self, dispatcher: Dispatcher, transport: Callable[[], Transport]) -> None:
        self.dispatcher = dispatcher
        self.transport = transport
        self._waiting: list[_Request] = []
        self._running: asyncio.Task[None] | None = None

    async def resume(self, socket: Socket, ask: ResumeAsk) -> Resumed:
        """How ``socket`` (registered, every scope it reads followed, its frames held)
        starts."""
        loop = asyncio.get_running_loop()
        request = _Request(socket, ask, loop.create_future())
        self._waiting.append(request)
        if self._running is None or self._running.done():
            self._running = loop.create_task(self._drain())
        return await request.future

    async def _drain(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, []
            try:
                await self._answer(batch)
            except Exception:
                logger.exception("realtime: resuming %d socket(s) failed", len(batch))
                for request in batch:
                    _settle(request, _afresh(request, None))

    async def _answer(self, batch: list[_Request]) -> None:
        transport = self.transport()
        base = base_channel()
        for request in batch:
            scopes = request.socket.scopes
            request.channels = frozenset([base, *(scope_channel(s) for s in scopes)])
            request.streams = streams_heard(request.socket, transport)
        try:
            streams = sorted(frozenset().union(*(request.streams for request in batch)))
            bounds = await run_blocking(transport.stream_bounds, streams)
        except Exception as exc:
            _unreadable(batch, None, exc)
            return
        if bounds is None:  # no history kept (pg_notify without its log)
            for request in batch:
                _settle(request, _afresh(request, None))
            return
        top = Vector({stream: (b.epoch, b.last) for stream, b in bounds.items()})
        resuming = []
        for request in batch:
            request.after = _covered(request, bounds, transport.stream_of(base))
            if request.after is not None:
                resuming.append(request)
            else:
                if request.ask.cursor is not None:
                    logger.debug(
                        "realtime: a socket of account %s starts afresh: the cursor is not "
                        "resumable",
                        request.socket.user_id,
                    )
                _settle(request, _afresh(request, top))
        try:
            resuming = await _on_the_same_log(transport, resuming, bounds, top)
        except Exception as exc:
            _unreadable(resuming, top, exc)
            return
        if not resuming:
            return
        try:
            read, order = await self._replay(transport, resuming)
            held = await run_blocking(transport.stream_bounds, streams)
        except Exception as exc:
            _unreadable(resuming, top, exc)
            return
        replayed_to: list[Socket] = []
        for count, request in enumerate(resuming, 1):
            if not request.refused and not _still_covered(request, held):
                logger.debug(
                    "realtime: a socket of account %s starts afresh: the history was trimmed "
                    "past its cursor while it was read",
                    request.socket.user_id,
                )
                _settle(request, _afresh(request, top))
            elif request.refused:
                logger.debug(
                    "realtime: a socket of account %s starts afresh: it missed too much",
                    request.socket.user_id,
                )
                _settle(request, _afresh(request, top))
            else:
                assert request.after is not None
                assert request.ask.cursor is not None
                floor = top.merged(read).only(request.after)
                # The cursor given, made again for the scopes the socket reads now (the same
                # string when they are those it names): one naming a scope lost while away
                # would have a later resume replay that scope from before the loss.
                cursor = cursor_of(request.socket, request.after, stamp_of(request.ask.cursor))
                request.socket.replayed = order
                replayed_to.append(request.socket)
                _settle(request, Resumed(cursor, True, request.replayed(), floor))
            if count % SLICE == 0:
                await asyncio.sleep(0)  # the sockets answered go on before the next are
        if replayed_to:
            streams_read = frozenset().union(*(streams_heard(s, transport) for s in replayed_to))
            self.dispatcher.replayed(read.only(streams_read), order, replayed_to)

    async def _replay(
        self, transport: Transport, resuming: list[_Request]
    ) -> tuple[Vector, RecordOrder]:
        """Plan what the history holds after each request's cursor into its frames (refusing
        those that would get too many, or scan too much); return how far it was read, and
        the versions it let through (see the module docstring)."""
        for request in resuming:
            request.scan_left = conf.RESUME_MAX_FRAMES * limits.RESUME_SCAN_PER_FRAME
            request.at = request.after or Vector()
        base_stream = transport.stream_of(base_channel())
        #: Offsets of the account events read, in order: each request's count of them is
        #: those after its cursor (every request hears the base channel).
        account_events: list[int] = []
        #: Each row's versions in the order the history holds them (a version superseded
        #: earlier in it is dropped, as a live worker drops it).
        order = RecordOrder()
        read = Vector()  # how far each stream is read, on the channels still needed
        active = list(resuming)
        while active:
            # From the oldest cursor still resuming: those refused no longer hold it back.
            oldest: dict[str, tuple[str, int]] = {}
            for request in active:
                for stream, (epoch, offset) in (request.after or Vector()).items():
                    held = oldest.get(stream)
                    oldest[stream] = (epoch, offset if held is None else min(held[1], offset))
            start = Vector(oldest).merged(read.only(oldest))
            channels = sorted(frozenset().union(*(request.channels for request in active)))
            entries = await run_blocking(transport.read_streams, channels, start, PAGE)
            page = _Page(active, base_channel())
            for channel, payload, position in entries:
                page.add(channel, payload, position)
                if page.base(channel):
                    account_events.append(position.seq)
            readers = await _readers_of_page(page)
            for index, (channel, _, position) in enumerate(entries):
                message, among = page.messages[index], page.missed_by[index]
                await self._plan_entry(channel, position, among, message, readers.get(index), order)
            budget = conf.RESUME_MAX_FRAMES * limits.RESUME_SCAN_PER_FRAME
            for request in active:
                cursor = (request.after or Vector()).get(base_stream)
                if cursor is None:
                    continue  # not resuming: every cursor resumed names the base stream
                seen = len(account_events) - bisect.bisect_right(account_events, cursor[1])
                if seen > budget:
                    _refuse(request)
            active = [request for request in active if not request.refused]
            read = start.merged(Vector.of(position for _, _, position in entries))
            if len(entries) < PAGE:
                break
        return read, order

    async def _plan_entry(
        self,
        channel: str,
        position: StreamPos,
        among: list[_Request],
        message: dict[str, Any] | None,
        readers: list[Any] | None,
        order: RecordOrder,
    ) -> None:
        """Add the frame one message of the history comes to for each request it is missed
        by (``among``), counting a scope's message against the scan of each request reading
        that scope; the account events (the base channel, every account's) are counted
        against a budget of their own, a page at a time (``_replay``), so that neither a
        busy scope nor the deployment's account traffic makes a resume read without end."""
        scoped = channel != base_channel()
        planned = []
        for request in among:
            if request.refused:
                continue
            if scoped:
                request.scan_left -= 1
                if request.scan_left < 0:
                    _refuse(request)
                    continue
            planned.append(request)
        if not planned or message is None:
            return
        sockets = [request.socket for request in planned]
        plan = await self.dispatcher.plan(message, sockets, readers, order)
        if plan is None or plan.frame is None:
            return
        most = conf.RESUME_MAX_FRAMES
        row, view = _view_change(message, plan.event_type, plan.data)
        for part in chunked(planned, SLICE):
            for request in part:
                socket = request.socket
                if socket in plan.targets:
                    request.at = request.at.advanced(position)
                    frame = with_cursor(plan.frame, socket, request.at)
                    request.add(Held(None, frame, plan.scope_id, plan.channels), row, view)
                    if request.count() > most:
                        _refuse(request)
            await asyncio.sleep(0)  # a slice: live delivery goes on between them


class _Page:
    """One page of the history and, for each message, the requests that missed it: found
    through an index (the requests of each scope channel, and of each account) rather than
    by asking every request of the batch about every message."""

    def __init__(self, active: list[_Request], base: str) -> None:
        self.base_channel = base
        self.active = active
        self.by_channel: dict[str, list[_Request]] = {}
        self.by_user: dict[Any, list[_Request]] = {}
        for request in active:
            for channel in request.channels:
                self.by_channel.setdefault(channel, []).append(request)
            self.by_user.setdefault(normal_id(request.socket.user_id), []).append(request)
        self.messages: list[dict[str, Any] | None] = []
        self.missed_by: list[list[_Request]] = []

    def base(self, channel: str) -> bool:
        return channel == self.base_channel

    def add(self, channel: str, payload: bytes, position: StreamPos) -> None:
        if not self.base(channel):
            candidates = self.by_channel.get(channel, [])
        elif (named := addressed_to(payload)) is not None:
            # An account event: only the requests of the accounts it names (read without
            # decoding the message: most name other accounts).
            candidates = [
                request
                for user_id in {normal_id(u) for u in named}
                for request in self.by_user.get(user_id, ())
            ]
        else:
            candidates = self.active
        among = [request for request in candidates if _missed(request, position)]
        self.messages.append(read_message(payload) if among else None)
        self.missed_by.append(among)


def _missed(request: _Request, position: StreamPos) -> bool:
    """Whether the message at ``position`` comes after ``request``'s cursor."""
    after = request.after
    return after is not None and position.stream in after and not after.covers(position)


async def _readers_of_page(page: _Page) -> dict[int, list[Any]]:
    """Who may still read the row of each account event of a page that re-decides it
    (``readers_now``): asked for the whole page in one thread hop, one query per model."""
    asks: dict[int, Ask] = {}
    for index, message in enumerate(page.messages):
        if message is None or message.get("target") != USERS:
            continue
        about = row_of(message)
        if about is None:
            continue
        asked = sorted_ids(request.socket.user_id for request in page.missed_by[index])
        if asked:
            asks[index] = (about, message.get("event_type"), message.get("data"), asked)
    if not asks:
        return {}
    answers = await run_blocking(readers_now_many, list(asks.values()))
    return dict(zip(asks.keys(), answers, strict=True))


def _view_change(message: dict[str, Any], event_type: Any, data: Any) -> tuple[Any, str | None]:
    """The row a replayed frame tells of (``None``: none, for a frame that is no model's
    event about a row), and what it does to the row's place in the view of those who get it
    (see ``_Request.add``)."""
    if not isinstance(event_type, str) or not isinstance(data, dict) or "id" not in data:
        return None, None
    name, _, action = event_type.rpartition(".")
    try:
        row = (name, row_key(data["id"]))
        hash(row)
    except (TypeError, ValueError):
        return None, None
    meta = message.get("meta")
    if action == "created" and isinstance(meta, dict) and meta.get("moved"):
        return row, "enter"
    return row, "leave" if action == "deleted" else None


def _refuse(request: _Request) -> None:
    request.refused = True
    request.frames, request.dropped, request.since_left = [], set(), {}


def _covered(request: _Request, bounds: dict[str, StreamBounds], base_stream: str) -> Vector | None:
    """Where the cursor the socket gave says it was, in the streams it names that the socket
    still hears, when the history still covers it there; ``None`` otherwise (no cursor, not
    a valid one of its account, another epoch, or something after it trimmed).

    Every cursor handed out names the stream of the base channel, which every socket hears:
    one that does not was made for another shape of history (a cursor of the Redis transport
    brought to the table transport, or the other way round). And it must name every stream
    the socket hears now: where it was in a stream it does not name (a scope gained since,
    or asked for now) is unknown, and starting that stream anywhere could skip frames. On a
    global log the one position is a place in every channel, but the cursor must name every
    scope the socket reads now all the same: what a scope it did not hear then said since
    was not the socket's (its account may have joined it only while away)."""
    cursor = request.ask.cursor
    if cursor is None:
        return None
    socket = request.socket
    said = read_cursor(socket.user_id, cursor, request.streams, heard=scope_channels(socket))
    if said is None or base_stream not in said or not request.streams <= said.keys():
        return None
    after = {}
    for stream, (kept, offset) in said.items():
        held = bounds.get(stream)
        if held is None or not _holds(stream, held, kept, offset):
            return None
        # A global log's "epoch" is the mark of the message at the cursor (checked by
        # ``_on_the_same_log``); a stream's is its own, which the cursor keeps the start of.
        after[stream] = (kept if stream == GLOBAL else held.epoch, offset)
    return Vector(after)


def _still_covered(request: _Request, bounds: dict[str, StreamBounds] | None) -> bool:
    """Whether the history, as it is once read, still covers where ``request`` resumes
    from: a trim that committed after ``_covered`` looked may have cut messages after the
    cursor before the read reached them."""
    after = request.after
    if after is None or bounds is None:
        return False
    return all(
        (held := bounds.get(stream)) is not None and _holds(stream, held, epoch, offset)
        for stream, (epoch, offset) in after.items()
    )


def _holds(stream: str, held: StreamBounds, epoch: str, offset: int) -> bool:
    """Whether ``stream``, of bounds ``held``, holds every message after ``offset`` of
    ``epoch``: the same epoch, and either nothing after the offset or the first message it
    still holds right after it at the latest (a trim cuts only the start of a stream).

    The global log has no epoch: whether it still holds the message a cursor names is
    ``_on_the_same_log``'s to check."""
    if stream != GLOBAL and not same_epoch(held.epoch, epoch):
        return False
    first, last = held.first, held.last
    return offset == last or (offset < last and first is not None and first <= offset + 1)


async def _on_the_same_log(
    transport: Transport,
    requests: list[_Request],
    bounds: dict[str, StreamBounds],
    top: Vector,
) -> list[_Request]:
    """``requests`` but those whose cursor names a message of a global log that the log no
    longer holds at its position, which start afresh (``top``).

    Such a log has no epoch, and its ids start over when it is emptied with them
    (``manage.py flush``, ``TRUNCATE ... RESTART IDENTITY``, a backup restored): once the new
    log grows past a cursor's position, its offset alone would pass for covered, and the
    resume would replay only what came after it, skipping the new log's messages below. So
    where the log holds the position (its first position at or below it), the message
    there must be the one whose mark the cursor carries: one statement for the batch. A
    cursor without a mark (made before marks were) is then refused as well; one whose
    position the log no longer holds needs no check (nothing of it is read)."""
    held = bounds.get(GLOBAL)
    if held is None or held.first is None:
        return requests
    named = {}
    for request in requests:
        entry = None if request.after is None else request.after.get(GLOBAL)
        if entry is not None and held.first <= entry[1] <= held.last:
            named[request] = entry
    if not named:
        return requests
    marks = await run_blocking(transport.log_marks, sorted({o for _, o in named.values()}))
    kept = []
    for request in requests:
        entry = named.get(request)
        if entry is not None and (not entry[0] or marks.get(entry[1]) != entry[0]):
            logger.debug(
                "realtime: a socket of account %s starts afresh: its cursor does not name "
                "the message the log holds at its position (the log's ids started over "
                "since, or the cursor names none)",
                request.socket.user_id,
            )
            _settle(request, _afresh(request, top))
        else:
            kept.append(request)
    return kept


def _afresh(request: _Request, top: Vector | None) -> Resumed:
    """Start from now (``top``; ``None``: the history is unknown): nothing is replayed."""
    resumed = None if request.ask.cursor is None else False
    floor = None if top is None else top.only(request.streams)
    return Resumed(cursor_of(request.socket, floor), resumed, [], floor)


def _unreadable(requests: list[_Request], top: Vector | None, error: BaseException) -> None:
    """The history could not be read for ``requests``: those that gave a cursor are closed
    1012 to come back with it (a transient outage must not cost them a reload); the others
    start from now (``top``), as they asked."""
    log_own_failure(
        "realtime: reading the history to resume %d socket(s) failed; those with a cursor "
        "are closed 1012 to resume later",
        error,
        len(requests),
    )
    for request in requests:
        if request.ask.cursor is None:
            _settle(request, _afresh(request, top))
        else:
            _settle(request, Resumed("", False, [], None, unreadable=True))  # closed, not said


def _settle(request: _Request, answer: Resumed) -> None:
    if not request.future.done():
        request.future.set_result(answer)
