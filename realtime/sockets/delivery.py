"""Delivering internal messages to local sockets, in the order they were published.

Messages wait in one bounded queue (``REALTIME_NOTIFY_QUEUE_SIZE``). Transports ask its
``room`` and hand over no more (the table poller stops reading; pg_notify catches up from its
log or reports a loss); a message that comes anyway to a full queue is dropped, counted (one
line per interval) and reported to the manager as missed, whose sockets then read again.

The planner and the sender are watched: one that dies (cancelled, or raising what nothing
catches) is restarted by the manager's housekeeping, and what it held — queued, being planned,
being sent — is gone with it. The dispatcher knows the channel of every message not yet
settled, so it reports those channels as missed (one ERROR): their sockets are closed 1012
and read again rather than miss frames silently. The ``event_delivered`` signal is sent
beside delivery, in tasks of their own: at most ``REALTIME_NOTIFY_QUEUE_SIZE`` at once; an
event delivered while that many are still running is not signalled, and is counted.

Each message is *planned* — parsed, its targets looked up in the manager's indexes, narrowed
by ``exclude``/``only``/``skip_scope`` and, where an audience is to be asked, by
``auth.audience`` off the event loop — by up to ``REALTIME_CONSUMER_POOL_SIZE`` planners at
once, while one sender hands the frames out strictly in arrival order: an update waiting for
its audience check is never overtaken by the delete that followed it.

A frame is encoded once per event and handed to every target's ``Socket.send_frame``, which
never waits for the network (see ``connection``): the sender goes on to the next message while
slow sockets' writers catch up. A socket that is not reading is dropped at once and closed
1011 beside delivery, by the manager; the others hear the event now. A socket that opted in to
resume gets the frame with its cursor (one per account, scopes read and event on a global
log; per account, event and place in the other streams it hears otherwise, see
``cursor_vector``); one
still finishing its handshake has its frames held, with their positions, until it goes live.

``plan`` also serves resuming sockets (``resume``): planned ``among`` a few sockets only, a
message from the log comes to the frames those would have heard, under today's permissions:
today's scopes and audience for a scope event; for an account event about a row, only the
accounts it reached that may still read the row (``realtime.readers``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from realtime import messages, metrics, signals
from realtime.auth import RealtimeAuth, account_ids, get_auth
from realtime.blocking import run_blocking, run_for_delivery
from realtime.compat.django import has_receivers
from realtime.conf import conf
from realtime.encoding import id_order
from realtime.logs import describe
from realtime.messages import (
    Publication,
    addressed_to,
    asks_recheck,
    base_channel,
    publication_of,
    scope_channel,
)
from realtime.positions import GLOBAL, StreamPos, Vector
from realtime.readers import readers_now, replayed_data, row_of
from realtime.registry import options_named
from realtime.sockets import protocol
from realtime.sockets.connection import Held, Socket
from realtime.sockets.cursors import cursor_for
from realtime.sockets.index import SocketIndex
from realtime.sockets.limits import log_hook_failure
from realtime.sockets.live_queries import UNREAD, Queries
from realtime.sockets.publications import Publications
from realtime.sockets.record_order import RecordOrder
from realtime.transports.base import Transport
from realtime.transports.tally import Tally

logger = logging.getLogger(__name__)

#: Sockets handed a frame before the loop gets a turn to write to the network.
YIELD_EVERY = 100
#: Messages carried, at most, before the live queries' clients are told what they changed,
#: however many more are in hand (a publication is never cut: its end is waited for).
FLUSH_EVERY = 100

#: A message waiting to be planned: its channel, its payload, its position.
Queued = tuple[str, bytes, "StreamPos | None"]
#: A message being planned: its channel, its position, its plan to come and its place in its
#: publication.
Planned = tuple[str, "StreamPos | None", "asyncio.Future[Plan | None]", "Publication | None"]


@dataclass
class Plan:
    """What one message comes to: a frame for some sockets, or an action."""

    targets: set[Socket]
    frame: str | None = None
    event_type: Any = None
    data: Any = None
    channels: list[str] | None = None
    action: Callable[[], None] | None = None
    #: The message's position (``None``: the transport keeps no history).
    position: StreamPos | None = None
    #: The message's ``mid``, which says when it was published (``messages.published_at``).
    mid: Any = None
    #: The scope a scope event is addressed to (``None``: an account event).
    scope_id: Any = None
    #: Sockets with a live query the event may change that may read what it says, and what
    #: it does to the queries of its model here (``Queries.change``; ``None``: there are
    #: none, or it is no model's event).
    queried: set[Socket] | None = None
    query_change: Any = None
    #: The sockets whose queries were matched against the event when it was planned (before
    #: its permissions narrowed them); ``None``: it is addressed to accounts, whatever their
    #: queries hold.
    query_asked: set[Socket] | frozenset[Socket] | None = None
    #: The live message planned: a frame of it held for a resuming socket passes the
    #: replay's memory of each row's versions as it goes out (``Socket.replayed``).
    message: dict[str, Any] | None = None


class Host(Protocol):
    """What the dispatcher asks of the manager it delivers for."""

    def drop_soon(self, socket: Socket) -> None: ...

    def request_recheck(
        self, user_ids: Iterable[Any], ended_sessions: Collection[str] = ()
    ) -> None: ...

    def on_missed(self, channels: frozenset[str]) -> None: ...

    def restart(self, socket: Socket) -> None: ...

    def transport(self) -> Transport: ...


class Dispatcher:
    """The ordered delivery pipeline of one ``SocketManager``.

    ``sender`` is the ``sender`` of the ``event_delivered`` signal (the manager's class).
    """

    def __init__(self, index: SocketIndex, host: Host, sender: type) -> None:
        self.index = index
        self.host = host
        self.sender = sender
        #: Each row's versions in commit order: a version superseded before it came is dropped.
        self.order = RecordOrder()
        #: In each stream, the highest position of a message planned (checked against
        #: ``order``), or where the transport started the stream: a resume's replay joins
        #: ``order`` once this has passed what it read (see ``replayed``).
        self.planned = Vector()
        #: Resumes' replays that read the history further than live delivery had planned.
        self._replays: list[_Replay] = []
        #: Sockets whose replay joined ``order``: their own copy of it (``Socket.replayed``)
        #: is let go once every plan made before is carried out (delivery is quiet).
        self._joined: list[Socket] = []
        #: The live queries of this worker's sockets, kept exact by what is carried out.
        self.live = Queries(self.send_query_frame, host.restart)
        self._queue: asyncio.Queue[Queued] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        #: The ``event_delivered`` signals being sent (at most ``REALTIME_NOTIFY_QUEUE_SIZE``).
        self._spawned: set[asyncio.Task[Any]] = set()
        #: Messages dropped on a full queue (by a transport that ignored ``room``).
        self.overflows = Tally(
            "realtime: the delivery queue was full: %d message(s) dropped since the last "
            "report (%d in all); their sockets are made to read again"
        )
        #: ``event_delivered`` signals not sent: as many were still being sent.
        self.unsignalled = Tally(
            "realtime: %d event_delivered signal(s) not sent since the last report (%d in "
            "all): as many as REALTIME_NOTIFY_QUEUE_SIZE were still being sent (slow receivers)"
        )
        #: Sockets closed 1012 because their held frames reached the bound.
        self.held_overflows = Tally(
            "realtime: %d socket(s) closed 1012 since the last report (%d in all): their "
            "handshake, resume or recheck held as many frames as they may (held_bound)"
        )
        #: The channel of each message queued, being planned or being sent, with its count:
        #: what a delivery task that dies takes with it.
        self._owed: Counter[str] = Counter()
        #: Messages queued, being planned or being sent; ``_quiet`` is set when none is, and
        #: ``_idle`` too (for threads: a recheck batch waits on it between its steps).
        self._pending = 0
        self._quiet: asyncio.Event | None = None
        self._idle = threading.Event()
        self._idle.set()
        #: In each stream, the highest position of a message carried out, or where the
        #: transport started the stream when this worker followed it: frames of messages at or
        #: below it have been handed to every target (see ``refresh``).
        self.carried = Vector()
        #: A message is being carried out: some of its targets may have its frame already.
        self.carrying = False
        #: Whether ``carried`` still means what it says: ``False`` for good once a message
        #: was lost on the way (a delivery that failed, a queue that died with its tasks).
        self.trusted = True

    def room(self) -> int:
        """How many more messages the queue takes now (plenty before it exists)."""
        queue = self._queue
        if queue is None:
            return conf.NOTIFY_QUEUE_SIZE
        return max(0, queue.maxsize - queue.qsize())

    def put(self, channel: str, payload: bytes, position: StreamPos | None = None) -> None:
        if self._queue is None:
            return
        try:
            self._queue.put_nowait((channel, payload, position))
        except asyncio.QueueFull:
            metrics.dropped("queue_full")
            self.overflows.add()
            self.host.on_missed(frozenset([channel]))
            return
        self._owed[channel] += 1
        self._pending += 1
        if self._pending == 1:
            self._idle.clear()

    async def quiet(self) -> None:
        """Return once no message is queued, being planned or being sent (background work,
        such as a recheck round, goes in the gaps between deliveries)."""
        while self._pending:
            if self._quiet is None:
                self._quiet = asyncio.Event()
            self._quiet.clear()
            await self._quiet.wait()

    def wait_idle(self, timeout: float) -> bool:
        """From another thread: wait (at most ``timeout`` seconds) until no message is queued,
        being planned or being sent; whether none is."""
        return self._idle.wait(timeout)

    def _settled(self, count: int = 1, channel: str | None = None) -> None:
        if channel is not None:
            self._owed[channel] -= 1
            if self._owed[channel] <= 0:
                del self._owed[channel]
        self._pending = max(0, self._pending - count)
        if not self._pending:
            self._idle.set()
            if self._quiet is not None:
                self._quiet.set()
            if self._joined:
                self._let_go_of_replays()

    def depth(self) -> int:
        """Messages waiting to be planned."""
        return 0 if self._queue is None else self._queue.qsize()

    def ensure_running(self) -> None:
        """Start the planner and sender tasks, or restart one that died.

        What the dead pipeline held is lost: its channels are reported missed to the host,
        which closes their sockets 1012, so that none of them stays silently stale.
        """
        dead = [task for task in self._tasks if task.done()]
        if self._tasks and not dead:
            return
        for task in self._tasks:
            task.cancel()
        lost, self._owed = self._owed, Counter()
        if dead:
            errors = [task.exception() for task in dead if not task.cancelled()]
            logger.error(
                "realtime: a delivery task stopped (%s); restarted: %d message(s) it held are "
                "lost, the sockets of their channels (%d) are closed 1012",
                describe(errors[0]) if errors and errors[0] else "cancelled",
                lost.total(),
                len(lost),
                exc_info=errors[0] if errors else None,
            )
            if lost:
                metrics.dropped("delivery_task_stopped", lost.total())
        if self._pending:
            self.trusted = False  # what the old queue held is gone with it
        self._settled(self._pending)
        queue: asyncio.Queue[Queued] = asyncio.Queue(maxsize=conf.NOTIFY_QUEUE_SIZE)
        # Bounds how many messages are planned ahead of the one being sent.
        plans: asyncio.Queue[Planned] = asyncio.Queue(maxsize=max(1, conf.CONSUMER_POOL_SIZE))
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._plan_in_order(queue, plans)),
            loop.create_task(self._send_in_order(plans)),
        ]
        self._queue = queue
        if dead and lost:
            self.host.on_missed(frozenset(lost))

    async def _plan_in_order(
        self,
        queue: asyncio.Queue[Queued],
        plans: asyncio.Queue[Planned],
    ) -> None:
        while True:
            channel, payload, position = await queue.get()
            planned = asyncio.ensure_future(self._plan(payload, position))
            await plans.put((channel, position, planned, publication_of(payload)))

    async def _send_in_order(self, plans: asyncio.Queue[Planned]) -> None:
        publications = Publications()
        while True:
            taken = await self._next(plans, publications)
            if taken is None:
                publications.give_up()
                await self.flush_queries()
                continue
            channel, position, future, publication = taken
            continuing = publications.take(publication)
            if self.live.due and not continuing and (publication or not future.done()):
                # What earlier publications changed goes first: before a publication of
                # several messages (a later one's frame to a socket owed a diff would pass
                # it), and when the next message is still being planned. A message alone may
                # join them (``carry_out`` sends them first to the sockets it reaches).
                await self.flush_queries()
            try:
                plan = await future
                if plan is not None:
                    self.carrying = True
                    await self.carry_out(plan, continuing)
            except Exception:
                self.trusted = False  # some of its targets may not have its frame
                logger.exception("realtime: delivering a message failed")
            finally:
                self.carrying = False
            publications.carried(channel, publication)
            ready = plans.empty() or self.live.carried >= FLUSH_EVERY
            if self.live.due and publications.whole and ready:
                await self.flush_queries()
            # Not in a ``finally``: a sender cancelled mid-message leaves it owed, and the
            # restart reports its channel missed (and stops trusting ``carried``).
            if position is not None:
                self.carried = self.carried.advanced(position)
            self._settled(channel=channel)

    async def _next(
        self, plans: asyncio.Queue[Planned], publications: Publications
    ) -> Planned | None:
        """The next message planned; ``None`` when the rest of a publication whose changes
        the live queries' clients are owed did not come in time (``Publications.wait``)."""
        if not self.live.due or publications.whole or not plans.empty():
            return await plans.get()
        try:
            async with asyncio.timeout(publications.wait()):
                return await plans.get()
        except TimeoutError:
            return None

    async def flush_queries(self) -> None:
        """Tell the live queries' clients what the messages carried since the last time
        changed: once a publication was carried whole (``Publications``: one diff per query
        per publication), when no next message is planned and ready to carry, or after
        ``FLUSH_EVERY`` messages of whole publications; and before a frame of a later
        publication goes to one of their sockets."""
        try:
            await self.live.flush()
        except Exception:
            logger.exception("realtime: telling live queries what changed failed")

    def started(self, position: StreamPos) -> None:
        """The transport started following a stream after ``position``: nothing of it up to
        there is this worker's to carry."""
        self.carried = self.carried.advanced(position)
        self._planning(position)

    def replayed(self, read: Vector, order: RecordOrder, sockets: list[Socket]) -> None:
        """A resume's replay read the history up to ``read`` and let through, for
        ``sockets``, the versions ``order`` remembers: they join this worker's memory once
        live delivery has planned every message up to ``read``, now if it has.

        A version let through is one that committed, so an older one published late is
        superseded for every socket here. But the replay reads the log directly, and is
        often ahead of live delivery: joined at once, a newer version it read would drop the
        older ones live delivery has not planned yet, for every other socket here (they
        would hear a row updated that they never heard created). Until then ``sockets``
        keep their own copy (``Socket.replayed``): their frames pass it as they go out."""
        self._replays.append(_Replay(read, order, sockets))
        self._join_replays()

    def _planning(self, position: StreamPos) -> None:
        """Live delivery plans the message at ``position`` (or starts a stream after it)."""
        self.planned = self.planned.advanced(position)
        if self._replays:
            self._join_replays()

    def _join_replays(self) -> None:
        """Merge into ``order`` the replays live delivery has caught up with; forget those
        whose sockets are all gone (nobody here heard them)."""
        waiting = []
        for replay in self._replays:
            if _passed(self.planned, replay.read):
                self.order.merge(replay.order)
                self._joined.extend(replay.sockets)
            elif any(not socket.closed for socket in replay.sockets):
                waiting.append(replay)
        self._replays = waiting
        if self._joined and not self._pending:
            self._let_go_of_replays()

    def _let_go_of_replays(self) -> None:
        """Nothing is planned or being carried out: every plan made before a replay joined
        ``order`` went out, so its sockets no longer need their own copy of it, but those
        whose frames are still held (they pass it as they go out, see ``go_live``)."""
        held = []
        for socket in self._joined:
            if socket.held is not None and not socket.closed:
                held.append(socket)
            else:
                socket.replayed = None
        self._joined = held

    async def _plan(self, payload: bytes, position: StreamPos | None) -> Plan | None:
        if position is not None:
            self._planning(position)  # first: what it is checked against is now known
        named = addressed_to(payload)
        if (
            named is not None
            and not any(user_id in self.index.by_user for user_id in named)
            and not asks_recheck(payload)
        ):
            # Another worker's accounts: not decoded (every worker hears them). A recheck is:
            # a socket of its accounts may be in its handshake here (``asks_recheck``).
            return None
        message = read_message(payload)
        if message is None:
            return None
        plan = await self.plan(message)
        if plan is not None:
            plan.position, plan.mid, plan.message = position, message.get("mid"), message
        return plan

    async def plan(
        self,
        message: dict[str, Any],
        among: Iterable[Socket] | None = None,
        readers: Collection[Any] | None = None,
        order: RecordOrder | None = None,
    ) -> Plan | None:
        """Work out who hears ``message`` and what they get: of every socket here, or only
        of those ``among`` (a resume's; they are not asked to recheck). ``readers``: a
        resume's answer of ``readers_now`` for this message, asked for a page at once;
        ``order``: the versions its replay let through so far (a live message: this worker's,
        which a replay must not use: it knows versions the replay has not reached yet)."""
        memory = self.order if among is None else order
        if memory is not None and memory.superseded(message):
            return None
        target = message.get("target")
        if target == messages.SCOPE:
            return await self._plan_scope(message, among)
        if target == messages.GLOBAL:
            return await self._plan_global(message, among)
        if target == messages.USERS:
            return await self._plan_users(message, among, readers)
        if target == messages.RECHECK and among is None:
            ids = list(message.get("user_ids") or ())
            ended = frozenset(message.get("ended_sessions") or ())
            return Plan(set(), action=lambda: self.host.request_recheck(ids, ended))
        return None

    async def _plan_scope(
        self, message: dict[str, Any], among: Iterable[Socket] | None
    ) -> Plan | None:
        index = self.index
        scope_id = message.get("scope_id")
        channels = message.get("channels")
        queried: set[Socket] = set()
        change = None
        if among is not None:
            targets = {s for s in among if scope_id in s.scopes}
            if channels is not None:
                targets = {s for s in targets if s.hears(scope_id, channels)}
        elif not (members := index.by_scope.get(scope_id)):
            return None
        else:
            change, queried = self._queried(message)
            queried &= members
            if channels is None:
                targets = set(members)
            else:
                targets = set()
                for channel in channels:
                    targets |= index.by_scope_channel.get((scope_id, channel), set())
        return await self._narrowed(message, targets, scope_id, queried, change)

    def _queried(self, message: dict[str, Any]) -> tuple[Any, set[Socket]]:
        """What a live message does to this worker's live queries (``Queries.change``), and
        the sockets holding one it may change."""
        action = _query_action(message)
        if action is None:
            return None, set()
        name = _model_of(message.get("event_type"))
        change = self.live.change(name, message.get("data"), message.get("meta"), action)
        return change, self.live.sockets_touched(name, change)

    async def _plan_global(
        self, message: dict[str, Any], among: Iterable[Socket] | None
    ) -> Plan | None:
        """An event of a global model: every socket holding one of its channels, whatever
        scopes it reads (``Socket.hears`` with no scope: the channels it holds)."""
        channels = list(message.get("channels") or ())
        queried: set[Socket] = set()
        change = None
        if among is not None:
            targets = {s for s in among if s.hears(None, channels)}
        else:
            change, queried = self._queried(message)
            targets = set()
            for channel in channels:
                targets |= self.index.by_channel.get(channel, set())
        if not targets and change is None:
            return None
        return await self._narrowed(message, targets, None, queried, change)

    async def _narrowed(
        self,
        message: dict[str, Any],
        targets: set[Socket],
        scope_id: Any,
        queried: frozenset[Socket] | set[Socket] = frozenset(),
        change: Any = None,
    ) -> Plan:
        """The plan of an event to ``targets``, narrowed by the message's ``exclude`` and
        ``only`` and, where an audience is to be asked, by ``auth.audience``; ``queried``
        (sockets with a live query it may change, whatever channels they hold: ``change``)
        narrowed the same way."""
        listed = targets
        targets = targets | queried
        if message.get("exclude"):
            excluded = set(message["exclude"])
            targets = {s for s in targets if s.user_id not in excluded}
        if message.get("only") is not None:
            only = set(message["only"])
            targets = {s for s in targets if s.user_id in only}
        event_type, data = message.get("event_type"), message.get("data")
        auth = get_auth()
        #: The sockets whose queries hear it, where not those of ``targets``.
        reread: set[Socket] | None = None
        if targets and (message.get("about") is not None or _overrides_audience(auth)):
            asked = sorted({s.user_id for s in targets}, key=id_order)
            answer = await run_for_delivery(
                _audience, auth, scope_id, event_type, data, asked, message.get("about")
            )
            if answer is None and change is not None:
                # Who may read the row is not known: nobody hears the event, and the live
                # queries it may change read their rows again, with their own permissions.
                reread, change = targets & queried, UNREAD
            allowed = set(answer or ())
            targets = {s for s in targets if s.user_id in allowed}
        frame = protocol.event_frame(event_type, data, message.get("meta"), scope_id)
        channels = message.get("channels")
        plan = Plan(targets & listed, frame, event_type, data, channels, scope_id=scope_id)
        if change is not None:
            plan.queried = targets & queried if reread is None else reread
            plan.query_change = change
            plan.query_asked = queried
        return plan

    async def _plan_users(
        self,
        message: dict[str, Any],
        among: Iterable[Socket] | None,
        readers: Collection[Any] | None = None,
    ) -> Plan:
        user_ids = message.get("user_ids") or ()
        event_type, data = message.get("event_type"), message.get("data")
        targets: set[Socket] = set()
        if among is not None:
            wanted = set(user_ids)
            targets = {s for s in among if s.user_id in wanted}
            data = replayed_data(message)
            about = row_of(message)
            if targets and about is not None:
                # Replayed: only to the accounts that may still read the row now.
                if readers is None:
                    asked = sorted({s.user_id for s in targets}, key=id_order)
                    readers = await run_blocking(readers_now, about, event_type, data, asked)
                still = set(readers)
                targets = {s for s in targets if s.user_id in still}
        else:
            by_user = self.index.by_user
            for user_id in user_ids:
                targets |= by_user.get(user_id, set())
        skip = message.get("skip_scope")
        if skip is not None:
            targets = {s for s in targets if skip not in s.scopes}
        frame = protocol.event_frame(event_type, data, message.get("meta"))
        plan = Plan(targets, frame, event_type, data, message.get("channels"))
        if among is None and message.get("row") and self._queried_by_account(message):
            change, queried = self._queried(message)
            plan.queried, plan.query_change = targets & queried, change
        return plan

    def _queried_by_account(self, message: dict[str, Any]) -> bool:
        """Whether an account event about a row may change its readers' live queries: any,
        for a model addressed to accounts; for a scope's model (an event to readers outside
        the row's scope), only a leave: its queries list the rows of the scopes the socket
        reads."""
        name = _model_of(message.get("event_type"))
        options = options_named(name) if name else None
        if options is None or not options.filters:
            return False
        return options.user_field is not None or _query_action(message) == "leave"

    async def carry_out(self, plan: Plan, continuing: bool = False) -> None:
        """Hand ``plan``'s frame to its targets and its change to the live queries;
        ``continuing``: its message continues the publication of the messages before it."""
        if plan.action is not None:
            plan.action()
        if plan.frame is not None and plan.targets:
            if not continuing and self.live.due_to(plan.targets):
                await self.flush_queries()  # their diffs of earlier writes come first
            await self.send_all(
                plan.targets, plan.frame, plan.position, plan.scope_id, plan.channels, plan.message
            )
            metrics.delivered(plan.mid, len(plan.targets))
            self._delivered(plan)
        if plan.query_change is not None:
            name = _model_of(plan.event_type)
            # A socket whose scope a recheck took since the planning has its queries read
            # again already: the change is no longer its to see.
            queried = {s for s in plan.queried or () if s.reads_event(plan.scope_id, None)}
            try:
                self.live.carry(name, queried, plan.query_change, plan.query_asked)
            except Exception:
                # The event's frames went out: a live query's failure is its own.
                logger.exception("realtime: a live query could not follow a %s", plan.event_type)

    async def send_query_frame(self, socket: Socket, frame: str) -> None:
        """Hand ``socket`` a frame of its live queries, after every frame handed to it
        before (held with them while its frames are held)."""
        message = {"type": "websocket.send", "text": frame}
        if socket.closed:
            return
        if socket.held is not None:
            if len(socket.held) < held_bound():
                socket.held.append(Held(None, message))
            else:
                self._held_too_long(socket)
        elif not await socket.send_frame(message, conf.SEND_TIMEOUT):
            metrics.dropped("not_reading")
            self.host.drop_soon(socket)

    async def send_all(
        self,
        targets: Iterable[Socket],
        frame: str,
        position: StreamPos | None = None,
        scope_id: Any = None,
        channels: Sequence[str] | None = None,
        about: dict[str, Any] | None = None,
    ) -> None:
        """Hand one encoded frame to every target; drop those not reading. ``scope_id`` and
        ``channels``: how its event was addressed, and ``about`` its message, kept with it
        where it is held."""
        message = {"type": "websocket.send", "text": frame}
        timeout = conf.SEND_TIMEOUT
        #: The frame with each cursor of the sockets that opted in to resume (a cursor names
        #: the scopes its socket reads).
        cursored: dict[tuple[Any, Vector | None, frozenset[Any]], dict[str, Any]] = {}
        alone = None if position is None else Vector.of([position])
        streamed = position is not None and position.stream != GLOBAL
        for count, socket in enumerate(targets, 1):
            if socket.closed or not socket.reads_event(scope_id, channels):
                continue  # dropped, or its scope or channels taken, since this was planned
            out = message
            if socket.resumable:
                if socket.has_heard(position):
                    continue  # replayed when it came back
                if superseded_by_replay(socket, about):
                    continue  # older than a version replayed to it (``replayed``)
                where = alone
                if streamed and position is not None:
                    where = self.cursor_vector(socket, position)
                key = (socket.user_id, where, frozenset(socket.scopes_named(where)))
                out = cursored.get(key) or cursored.setdefault(
                    key, with_cursor(frame, socket, where)
                )
                socket.handed = where
            if socket.held is not None:
                if len(socket.held) < held_bound():
                    socket.held.append(
                        Held(position, out, scope_id, channels, frame, where, about)
                        if streamed and socket.resumable
                        else Held(position, out, scope_id, channels, about=about)
                    )
                else:
                    self._held_too_long(socket)
            # No send_frame waits for the network: going through the targets in turn costs
            # no socket any time, so none holds the others back.
            elif not await socket.send_frame(out, timeout):
                metrics.dropped("not_reading")
                self.host.drop_soon(socket)
            if count % YIELD_EVERY == 0:
                # Let the event loop write what is buffered so far: the first sockets need
                # not wait until the frame is queued for the last one.
                await asyncio.sleep(0)

    def cursor_vector(self, socket: Socket, position: StreamPos) -> Vector:
        """Where ``socket`` is once it has the frame of the message at ``position``, in every
        stream it hears (on a global log: ``position`` alone).

        The sender carries messages out one at a time in arrival order, and a transport hands
        each stream's over in order: every message of another stream up to ``carried`` was
        carried out before this one (``floor``: or was not the socket's)."""
        return self.known(socket).advanced(position)

    def known(self, socket: Socket) -> Vector:
        """Where ``socket`` is known to have every frame up to, in each stream it hears: its
        ``floor``, ``carried`` while that is trusted, and the last cursor it was handed (a
        cursor never goes back, whatever was lost since). Where epochs differ the newer
        wins: what was carried of a stream before it lost its history names the old epoch
        until the stream's next message, the floor names the epoch of the handshake."""
        where = socket.floor or Vector()
        if self.trusted:
            where = self.carried.merged(where)
        if socket.handed is not None:
            where = where.merged(socket.handed)
        return where.only(streams_heard(socket, self.host.transport()))

    def _held_too_long(self, socket: Socket) -> None:
        """A socket whose frames are held (its handshake, resume or a recheck not answered
        yet) holds ``held_bound()`` already: it misses this one and is closed 1012 (its
        client reconnects, resuming if it opted in) rather than hold more."""
        metrics.overflowed("held_frames")
        self.held_overflows.add()
        self.host.restart(socket)

    def _delivered(self, plan: Plan) -> None:
        if plan.channels is None or not has_receivers(signals.event_delivered, self.sender):
            return
        event_channels = set(plan.channels)
        watchers: dict[Any, set[str]] = {}
        for socket in plan.targets:
            heard = socket.hears(plan.scope_id, event_channels)
            if heard:
                watchers.setdefault(socket.user_id, set()).update(heard)
        if not watchers:
            return
        if len(self._spawned) >= conf.NOTIFY_QUEUE_SIZE:
            # Receivers slower than delivery: tasks would pile up without end.
            metrics.overflowed("event_delivered_signals")
            self.unsignalled.add()
            return
        task = asyncio.get_running_loop().create_task(
            signals.send_robustly(
                signals.event_delivered,
                self.sender,
                event_type=plan.event_type,
                data=plan.data,
                watchers={user_id: sorted(heard) for user_id, heard in watchers.items()},
            )
        )
        self._spawned.add(task)
        task.add_done_callback(self._spawned.discard)


@dataclass
class _Replay:
    """A resume's replay waiting for live delivery to pass what it read (``replayed``)."""

    read: Vector
    order: RecordOrder
    sockets: list[Socket]


def _passed(planned: Vector, read: Vector) -> bool:
    """Whether live delivery has planned every message up to ``read``: in each of its
    streams, up to its offset or in another epoch (that stream's history was made anew)."""
    return all(planned.reached(StreamPos(stream, *entry)) for stream, entry in read.items())


def superseded_by_replay(socket: Socket, about: dict[str, Any] | None) -> bool:
    """Whether the live message ``about`` tells a version of a row older than one the
    resume of ``socket`` replayed to it (``Socket.replayed``)."""
    replayed = socket.replayed
    return replayed is not None and about is not None and replayed.superseded(about, remember=False)


def held_bound() -> int:
    """Frames one socket may have held: as many as the worker's delivery queue takes, and at
    least room for a resume's missed frames with as many live ones behind them."""
    return max(conf.NOTIFY_QUEUE_SIZE, 2 * conf.RESUME_MAX_FRAMES)


def read_message(payload: bytes) -> dict[str, Any] | None:
    """The internal message in ``payload``; ``None`` (logged) when it is not one."""
    try:
        message = json.loads(payload)
    except ValueError:
        logger.warning("realtime: dropped an unreadable message")
        metrics.dropped("unreadable")
        return None
    return message if isinstance(message, dict) else None


def with_cursor(frame: str, socket: Socket, where: Vector | None) -> dict[str, Any]:
    """The ``websocket.send`` message of ``frame`` with ``socket``'s cursor of ``where``."""
    return {"type": "websocket.send", "text": protocol.with_cursor(frame, cursor_of(socket, where))}


def cursor_of(socket: Socket, where: Vector | None, now: float | None = None) -> str:
    """``socket``'s cursor of ``where``: signed for its account, naming the scopes it hears
    now (see ``realtime.sockets.cursors``), but those it gained and started hearing after
    ``where`` (``Socket.scopes_named``): on a global log their channels are left out, on a
    stream per channel their streams."""
    named = socket.scopes_named(where)
    if where is not None and len(named) < len(socket.scopes):
        kept = set(named)
        unnamed = {socket.gained[scope_id][0] for scope_id in socket.scopes if scope_id not in kept}
        where = where.only(stream for stream in where if stream == GLOBAL or stream not in unnamed)
    channels = [scope_channel(scope_id) for scope_id in named]
    return cursor_for(socket.user_id, where, now, heard=channels)


def scope_channels(socket: Socket) -> list[str]:
    """The transport channels of the scopes ``socket`` reads."""
    return [scope_channel(scope_id) for scope_id in socket.scopes]


def streams_heard(socket: Socket, transport: Transport) -> frozenset[str]:
    """The streams of the channels ``socket`` hears: its scopes' and the base channel."""
    channels = [base_channel(), *(scope_channel(scope_id) for scope_id in socket.scopes)]
    return frozenset(transport.stream_of(channel) for channel in channels)


def _model_of(event_type: Any) -> str:
    """The name of the model an event is about: ``ticket`` of ``ticket.updated``."""
    return event_type.rpartition(".")[0] if isinstance(event_type, str) else ""


def _query_action(message: dict[str, Any]) -> str | None:
    """What an event does to the live queries that hear it (see ``Plan.query_action``);
    ``None`` for a message that is no model's event about a row (an application's
    broadcast, whatever its name): a queryable model's events carry ``meta.filters``."""
    meta = message.get("meta")
    if not isinstance(meta, dict):
        return None
    if meta.get("truncated") and message.get("data") is None:
        return "fold"
    if "filters" not in meta:
        return None
    event_type = message.get("event_type")
    if isinstance(event_type, str) and event_type.endswith(".deleted"):
        return "leave"
    return "row"


def _overrides_audience(auth: RealtimeAuth) -> bool:
    return type(auth).audience is not RealtimeAuth.audience


def _audience(
    auth: RealtimeAuth, scope_id: Any, event_type: Any, data: Any, user_ids: list[Any], about: Any
) -> list[Any] | None:
    """``auth.audience``'s answer, normalised (``account_ids``); ``None`` when the hook fails
    (nobody hears the event; logged with its traceback, limited per place: it may fail on
    every event)."""
    try:
        return account_ids(auth.audience(scope_id, event_type, data, user_ids, about))
    except Exception as exc:
        log_hook_failure("realtime: audience() failed for %s; nobody hears it", exc, event_type)
        return None
