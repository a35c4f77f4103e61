"""``SocketManager``: this process's sockets, the scopes it follows, and their housekeeping.

The manager follows on the transport exactly the scopes it holds a socket of (the first socket
of a scope follows it, the last one leaving unfollows it), plus the base channel for account
events and recheck requests. A message for a worker holding no socket is dropped before it is
parsed, but a recheck request (remembered for the sockets in their handshake, ``register``);
the others go to the ``Dispatcher``, which hands one encoded frame straight to each
target's ASGI ``send`` — never through a channel layer or a consumer's dispatch. Housekeeping
runs every ``TICK``: due rechecks (in batches, off the event loop) and scopes whose follow
failed earlier; a watch of its own, on the same tick and never waiting for the database,
drops sockets that stopped reading and lets the transport check its connections
(``Transport.watch``: the table poller's watchdog).

When the transport reports that messages may have been lost on some channels (an outage or
an overflow its log could not make good), the sockets that could have heard them are closed
1012 (service restart): their clients reconnect and read again rather than stay silently
stale.

Rechecks are spread and kept behind delivery: each socket's first recheck falls at a random
point of the interval's second half, later ones a little before each interval ends, so the
sockets of a burst do not come due together; due sockets wait (a tenth of the interval at
most) until they fill a batch, and a round goes in batches of ``MAX_IDS_PER_MESSAGE``
sockets on a thread of its own, each batch started only once no message is waiting to be
delivered, and pausing between its steps (each bulk hook) while one is; after
``BEHIND_DELIVERY`` seconds of such waits it goes on anyway. A batch that holds frames (a
requested recheck) does not pause: delivery to its sockets waits for it. Handshakes that
arrive together share their statements through a ``Batcher``.

A dropped socket leaves the indexes at once, so no later frame goes to it; closing it (bounded
by ``REALTIME_SEND_TIMEOUT``: it may not be reading) and unfollowing its scopes happen in a
task of their own, never on the ordered sender's path.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Coroutine, Iterable
from typing import Any

from realtime import limits, metrics
from realtime.auth import RealtimeAuth, Scope, get_auth
from realtime.blocking import cut_stuck_statements, run_blocking, run_in_background
from realtime.chunks import chunked
from realtime.conf import conf, validate_once
from realtime.encoding import normal_id
from realtime.messages import asks_recheck, base_channel, scope_channel
from realtime.positions import StreamPos
from realtime.sockets import access, subscriptions
from realtime.sockets.batcher import Batcher
from realtime.sockets.connection import Held, Socket
from realtime.sockets.delivery import Dispatcher, superseded_by_replay, with_cursor
from realtime.sockets.index import SocketIndex
from realtime.sockets.limits import log_hook_failure, log_own_failure, log_trouble, log_warning
from realtime.sockets.protocol import CloseCode, Refusal, ScopeAsk
from realtime.sockets.refresh import cursor_answer
from realtime.sockets.resume import Resumer
from realtime.tokens import session_claim
from realtime.transports import get_transport
from realtime.transports.base import Transport

logger = logging.getLogger(__name__)

#: Seconds between housekeeping rounds (due rechecks, stalled sockets).
TICK = 1.0
#: Seconds a recheck asked for an account is remembered for its sockets still in their
#: handshake (which takes far less).
ASKED_MEMORY = 60.0
#: Ticks between two observations of every socket by the stall watch; in between, it
#: observes only those handed a frame since they were last seen with nothing on the way
#: (watching 5,000 idle sockets every tick cost a third of the idle worker's CPU).
SWEEP_TICKS = 10
#: Seconds a handshake waits for the listener, and a scope's follow may take, before the
#: sockets concerned are closed 1012.
LISTEN_WAIT = 5.0
#: How late, as a share of the interval, a periodic recheck may come to fill a batch.
RECHECK_GATHER = 0.1
#: Seconds a recheck batch waits for a gap in delivery before it goes anyway.
BEHIND_DELIVERY = 2.0
#: Held frames a socket going live sends before live delivery gets a turn.
RELEASE_CHUNK = 20
#: Handshake batches resolved at once (the others of realtime's threads stay free for
#: delivery's audience checks).
HANDSHAKE_LANES = 2


class SocketManager:
    """The sockets of this process; see the module docstring."""

    def __init__(self) -> None:
        self.index = SocketIndex()
        self._followed: set[Any] = set()
        self._reserved: dict[Any, int] = {}
        self._scope_locks: dict[Any, asyncio.Lock] = {}
        self._transport: Transport | None = None
        self._listening: asyncio.Task[None] | None = None
        self._housekeeper: asyncio.Task[None] | None = None
        self._stall_watch: asyncio.Task[None] | None = None
        #: The sockets the stall watch observes every tick (see ``Socket.watch``).
        self._unsettled: set[Socket] = set()
        self._ticks = 0
        self._wake: asyncio.Event | None = None
        #: Closes of dropped or refused sockets under way (kept: a task needs a reference).
        self._beside_tasks: set[asyncio.Task[None]] = set()
        #: Taken by the socket whose backlog of held frames is going out (one at a time).
        self._releasing = asyncio.Lock()
        #: The sockets of the recheck batch under way: its answers may have been read before
        #: a recheck asked for them meanwhile.
        self._in_batch: set[Socket] = set()
        #: Opted-in sockets whose scopes a recheck changed, owed a fresh cursor that names
        #: them (see ``_hand_cursor``): none was sound to hand yet.
        self._cursor_owed: set[Socket] = set()
        #: When a recheck was last asked for each account, for ``ASKED_MEMORY`` seconds: a
        #: socket whose handshake read its account before then is owed one.
        self._asked: OrderedDict[Any, float] = OrderedDict()
        #: The sessions signed out of, and when, for ``REALTIME_TOKEN_MAX_AGE`` (no token
        #: naming one lasts longer): a socket registered since with a token naming one (its
        #: handshake under way then, or a client that kept its token) is refused at the
        #: recheck it is owed.
        self._ended: OrderedDict[str, float] = OrderedDict()
        self.dispatcher = Dispatcher(self.index, self, SocketManager)
        self.resumer = Resumer(self.dispatcher, self.transport)
        #: One bound method for every socket's ``on_failure`` (not one per socket).
        self._on_failure = self.drop_soon
        self.handshakes: Batcher[tuple[str, ScopeAsk]] = Batcher(
            _authenticate_all, size=limits.MAX_IDS_PER_MESSAGE, lanes=HANDSHAKE_LANES
        )
        #: Subscribes asked of the ``may_subscribe`` hook together (see ``subscriptions``).
        self.subscriptions: Batcher[subscriptions.Ask] = Batcher(
            _decide_all, size=limits.MAX_IDS_PER_MESSAGE, lanes=HANDSHAKE_LANES
        )

    # Listening ------------------------------------------------------------------------

    async def ensure_listening(self) -> None:
        """Start the transport's listener and follow the base channel (once, shared)."""
        if self._listening is None or (self._listening.done() and self._listening.exception()):
            self._listening = asyncio.get_running_loop().create_task(self._listen())
        self.dispatcher.ensure_running()
        await asyncio.shield(self._listening)
        loop = asyncio.get_running_loop()
        if self._housekeeper is None or self._housekeeper.done():
            self._wake = asyncio.Event()
            self._housekeeper = loop.create_task(self._housekeep())
        if self._stall_watch is None or self._stall_watch.done():
            self._stall_watch = loop.create_task(self._watch_stalls())

    def serving(self) -> bool:
        """Whether the listener is up and housekeeping runs: a handshake waits for nothing
        (``ensure_listening`` is then not needed)."""
        return (
            self._listening_done()
            and self._housekeeper is not None
            and not self._housekeeper.done()
            and self._stall_watch is not None
            and not self._stall_watch.done()
        )

    def detach(self) -> None:
        """Stop hearing the transport (the manager's event loop is gone)."""
        if self._transport is not None:
            self._transport.remove_listener(self.on_message)
            self._transport = None

    def transport(self) -> Transport:
        """The transport this manager hears (the configured one, before it listens)."""
        return self._transport or get_transport()

    async def _listen(self) -> None:
        transport = get_transport()
        if transport is not self._transport:
            transport.add_listener(
                self.on_message, room=self.dispatcher.room, missed=self.on_missed
            )
            self._transport = transport
        await transport.start()
        self._started(await transport.follow(base_channel()))

    # Sockets --------------------------------------------------------------------------

    def reserve(self, user_id: Any) -> bool:
        """Hold a place for one more socket of an account, within its per-worker limit."""
        key = normal_id(user_id)
        held = self.index.held_by(key) + self._reserved.get(key, 0)
        if held >= conf.MAX_SOCKETS_PER_USER:
            return False
        self._reserved[key] = self._reserved.get(key, 0) + 1
        return True

    def release(self, user_id: Any) -> None:
        """Give back a place taken by ``reserve`` (the socket registered, or never will)."""
        key = normal_id(user_id)
        left = self._reserved.get(key, 0) - 1
        if left > 0:
            self._reserved[key] = left
        else:
            self._reserved.pop(key, None)

    async def register(
        self,
        socket: Socket,
        channels: Iterable[str] = (),
        allowed: dict[Any, set[str]] | None = None,
        *,
        reserved: bool = False,
    ) -> bool:
        """Index a socket that just authenticated, subscribed to ``channels`` as ``decide``
        answered (with ``allowed``), and follow the scopes it reads; ``True`` when every one
        of them is followed. ``reserved``: the place ``reserve`` held for it becomes its own
        as it is indexed (never counted twice, however long its resume takes).

        From here on the socket is handed every frame it should hear; until ``go_live`` they
        are held (its handshake is not over, see ``Socket.held``).
        """
        socket.next_recheck = time.monotonic() + conf.RECHECK_INTERVAL * random.uniform(0.5, 1.0)
        asked = self._asked.get(socket.user_id)
        if (asked is not None and asked >= socket.read_from) or self.signed_out(socket.token):
            # Asked while its handshake was reading (or its session was signed out of): its
            # frames, held for the handshake, stay held until that recheck answers
            # (``go_live``), which refuses a socket of a session signed out of.
            socket.recheck_asked = True
            socket.next_recheck = 0.0
        socket.on_failure = self._on_failure
        socket.watch = self._unsettled
        self.index.add(socket)
        if reserved:
            self.release(socket.user_id)
        metrics.sockets_open(len(self.index.sockets))
        self.index.subscribe(socket, channels, allowed)
        await self._sync_follows(socket.scopes)
        return self._listening_done() and all(s in self._followed for s in socket.scopes)

    def _listening_done(self) -> bool:
        """Whether the base channel is followed (account events reach this process)."""
        listening = self._listening
        return listening is not None and listening.done() and listening.exception() is None

    async def go_live(self, socket: Socket) -> None:
        """Send ``socket`` the frames held for it (but those it has heard, see
        ``Socket.floor``, and, after a recheck, those of scopes it lost), in order, then hand
        it its frames as they come."""
        if socket.recheck_asked:
            self._hold_for_recheck(socket)
            return
        held = socket.held
        rechecked, socket.rechecking = socket.rechecking, False
        if held is not None and len(held) > RELEASE_CHUNK:
            # A backlog (a resume's missed frames, most often) goes out behind live delivery,
            # one socket's at a time: a storm of resumes does not hold live frames back.
            async with self._releasing:
                await self._release(socket, held, rechecked, behind_delivery=True)
        elif held:
            await self._release(socket, held, rechecked, behind_delivery=False)
        if socket.recheck_asked:
            # Asked while they went out (a resume's backlog takes a while): those left, from
            # the request on, wait for its answer.
            self._hold_for_recheck(socket)
            return
        # No await since the queue was last seen empty: no frame falls between.
        socket.held = None

    def _hold_for_recheck(self, socket: Socket) -> None:
        """Keep ``socket``'s frames held until the recheck asked while they were held (its
        handshake, its resume, their release) answers: a frame of a scope the socket has
        just lost never goes out."""
        socket.recheck_asked, socket.rechecking = False, True
        socket.next_recheck = 0.0  # a batch under way set it an interval ahead
        self._wake_up()

    async def _release(
        self,
        socket: Socket,
        held: deque[Held],
        rechecked: bool,
        *,
        behind_delivery: bool,
    ) -> None:
        """Send the frames in ``held`` until it is empty (frames that come meanwhile join
        it) or a recheck is asked (the frames from the request on wait for its answer); with
        ``behind_delivery``, let the live messages under way go first after every
        ``RELEASE_CHUNK`` frames."""
        timeout = conf.SEND_TIMEOUT
        sent = 0
        while held and not socket.recheck_asked:
            entry = held.popleft()
            if socket.has_heard(entry.position) or (rechecked and not socket.reads(entry)):
                continue
            if superseded_by_replay(socket, entry.about):
                continue
            if not await socket.send_frame(restamped(socket, entry), timeout):
                self.drop_soon(socket)
                held.clear()
                return
            sent += 1
            if behind_delivery and sent % RELEASE_CHUNK == 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.dispatcher.quiet(), BEHIND_DELIVERY)
                await asyncio.sleep(0)

    async def unregister(self, socket: Socket) -> None:
        """Forget a socket (idempotent) and unfollow the scopes nobody here reads any more."""
        removed = self.index.remove(socket)
        self.dispatcher.live.drop(socket)
        self._cursor_owed.discard(socket)
        metrics.sockets_open(len(self.index.sockets))
        if removed:
            await self._sync_follows(socket.scopes)

    async def set_scopes(self, socket: Socket, scopes: list[Scope], *, keep_channels: bool) -> None:
        """Make ``socket`` read exactly ``scopes``; a client watch that changes the set drops
        its subscriptions, a recheck only the entries of the scopes it lost."""
        new = {normal_id(scope.id): scope.slug for scope in scopes}
        gone = [scope_id for scope_id in socket.scopes if scope_id not in new]
        added = [scope_id for scope_id in new if scope_id not in socket.scopes]
        if not keep_channels and (gone or added):
            self.index.clear_channels(socket)
        socket.scopes = new
        # Most rechecks change nothing: nothing to index or follow anew.
        if (gone or added) and socket in self.index.sockets:
            self._gaining(socket, gone, added)
            self.index.leave(socket, gone)
            await self._sync_follows(gone)
            self.index.enter(socket, added)
            await self._sync_follows(added)
            await self._heard_from(socket, added)
            # Its live queries list rows of the scopes it reads: read them again.
            await self.dispatcher.live.reload(socket)

    def _gaining(self, socket: Socket, gone: list[Any], added: list[Any]) -> None:
        """Note the scopes an opted-in socket gains (named by no cursor of it until
        ``_heard_from`` knows where it starts hearing them), and forget those it lost."""
        for scope_id in gone:
            socket.gained.pop(scope_id, None)
        if socket.resumable:
            transport = self.transport()
            for scope_id in added:
                socket.gained[scope_id] = (transport.stream_of(scope_channel(scope_id)), None)

    async def _heard_from(self, socket: Socket, added: list[Any]) -> None:
        """Where an opted-in socket, indexed in the scopes ``added`` and those followed,
        starts hearing them: the last position of each one's stream now. A message of one at
        or below it was published before the socket heard the scope (the follow started
        above it) or reaches it live; one above it reaches it live. A cursor of the socket
        names such a scope only from there (``Socket.scopes_named``): on a quiet worker the
        position it is known to have everything up to is older, and a resume from it would
        replay what the scope said before the account joined it."""
        streams = {socket.gained[s][0] for s in added if s in socket.gained}
        if not streams:
            return
        try:
            bounds = await run_blocking(self.transport().stream_bounds, sorted(streams))
        except Exception as exc:
            log_own_failure(
                "realtime: reading where a socket starts hearing the scopes it gained failed; "
                "its cursors do not name them (a resume from one starts afresh)",
                exc,
            )
            return
        for scope_id in added:
            gained = socket.gained.get(scope_id)
            if gained is None or bounds is None:
                continue
            stream, start = gained
            held = bounds.get(stream)
            if held is None:
                del socket.gained[scope_id]  # its stream holds nothing: nothing said before
                continue
            now = StreamPos(stream, held.epoch, held.last)
            if start is not None and start.epoch == now.epoch and start.seq > now.seq:
                now = start  # lost and gained again meanwhile: the later of the two reads
            socket.gained[scope_id] = (stream, now)

    async def decide(
        self, socket: Socket, channels: Iterable[str]
    ) -> tuple[list[str], dict[Any, set[str]] | None]:
        """The channels of a client's frame ``socket`` may subscribe to, and the channels
        each scope it reads allows (``None``: all, the hook is not asked).

        When the socket's hook is asked (``Socket.allowed``), ``may_subscribe`` answers off
        the event loop, with the other sockets subscribing at the same moment. Should a
        recheck change the scopes the socket reads meanwhile, the channels accepted are asked
        about again in the scopes not asked about yet; those no scope it then reads allows
        are dropped. A hook that raises refuses them all.
        """
        candidates = self.index.candidates(socket, channels)
        if socket.allowed is None or not candidates:
            return candidates, None
        asking, room = candidates, self.index.room(socket)
        if not room:
            return [], {}
        asked: list[str] | None = None
        allowed: dict[Any, set[str]] = {}
        while asking and (missing := [s for s in _reads(socket) if s not in allowed]):
            ask = subscriptions.Ask(socket.user, missing, asking, room)
            try:
                decided: subscriptions.Decided = await self.subscriptions.ask(ask)
            except Exception as exc:
                log_hook_failure(
                    "realtime: may_subscribe failed; the subscribe's channels are refused", exc
                )
                return [], {}
            if asked is None:  # the first answer: what was asked about at all, and accepted
                asked = [*decided.channels, *decided.refused]
                asking, room = decided.channels, len(decided.channels)
            allowed.update(decided.allowed)
        reads = _reads(socket)
        accepted = [c for c in asking if any(c in allowed.get(s, ()) for s in reads)]
        kept = set(accepted)
        for channel in asked or ():
            if channel not in kept:
                subscriptions.log_refused(channel)
        return accepted, allowed

    async def subscribe(self, socket: Socket, channels: Iterable[str]) -> None:
        """Subscribe ``socket`` to the channels a client's ``subscribe`` names, as
        ``decide`` answers."""
        accepted, allowed = await self.decide(socket, channels)
        if accepted and not socket.closed:
            self.index.subscribe(socket, accepted, allowed)

    def unsubscribe(self, socket: Socket, channels: Iterable[str]) -> None:
        self.index.unsubscribe(socket, channels)

    async def _sync_follows(self, scope_ids: Iterable[Any]) -> None:
        for scope_id in list(scope_ids):
            await self._sync_follow(scope_id)

    async def _sync_follow(self, scope_id: Any) -> None:
        """Follow a scope while someone here reads it, unfollow it once nobody does.

        A follow is bounded (``LISTEN_WAIT``): past it, or when it fails, the scope's sockets
        are closed 1012, as after an outage without a log: they would otherwise read a scope
        this worker does not hear. Their clients reconnect, by when it usually does.
        """
        lock = self._scope_locks.setdefault(scope_id, asyncio.Lock())
        async with lock:
            wanted = scope_id in self.index.by_scope
            transport = self.transport()
            channel = scope_channel(scope_id)
            try:
                if wanted and scope_id not in self._followed:
                    self._started(await asyncio.wait_for(transport.follow(channel), LISTEN_WAIT))
                    self._followed.add(scope_id)
                elif not wanted and scope_id in self._followed:
                    self._followed.discard(scope_id)
                    await transport.unfollow(channel)
            except Exception as exc:
                if wanted and scope_id not in self._followed:
                    await self._not_followed(scope_id, channel, exc)
                else:
                    logger.exception("realtime: unfollowing scope %s failed", scope_id)
        if not lock.locked() and scope_id not in self.index.by_scope:
            self._scope_locks.pop(scope_id, None)

    def _started(self, position: StreamPos | None) -> None:
        """A follow returned where the transport started the stream (see ``Transport.follow``)."""
        if position is not None:
            self.dispatcher.started(position)

    async def _not_followed(self, scope_id: Any, channel: str, exc: Exception) -> None:
        """Close 1012 the sockets of a scope whose follow timed out or failed, and take the
        follow back (a LISTEN still under way would otherwise stay for nobody)."""
        targets = list(self.index.by_scope.get(scope_id, ()))
        if isinstance(exc, TimeoutError):
            # A burst of handshakes ahead of the LISTEN, or the database away (the transport
            # says which): one line, within the operation budget; no traceback.
            log_trouble(
                "realtime: following scope %s took over %.1f s; closed its %d socket(s) 1012 "
                "to make them reconnect",
                scope_id,
                LISTEN_WAIT,
                len(targets),
            )
        else:
            log_own_failure(
                "realtime: following scope %s failed; closed its %d socket(s) 1012 to make "
                "them reconnect",
                exc,
                scope_id,
                len(targets),
            )
        self._restart(targets)
        with contextlib.suppress(Exception):
            await self.transport().unfollow(channel)

    # Delivery -------------------------------------------------------------------------

    def on_message(self, channel: str, payload: bytes, position: StreamPos | None = None) -> None:
        """Transport listener: queue a message for delivery (drop it if nobody is here, but a
        recheck's: it is remembered for the sockets in their handshake, and the sessions it
        names for those still to come, ``signed_out``)."""
        if self.index.sockets or asks_recheck(payload):
            self.dispatcher.put(channel, payload, position)

    def on_missed(self, channels: frozenset[str]) -> None:
        """Close 1012 every socket that may have missed a message on ``channels``: all of
        them for the base channel (account events, recheck requests), else the sockets of
        the scopes named."""
        if base_channel() in channels:
            targets = list(self.index.sockets)
        else:
            scopes = [s for s in self.index.by_scope if scope_channel(s) in channels]
            targets = list({socket for s in scopes for socket in self.index.by_scope[s]})
        if not targets:
            return
        logger.warning(
            "realtime: %d socket(s) may have missed messages; closed 1012 to make them "
            "reconnect and read again",
            len(targets),
        )
        self._restart(targets)

    def restart(self, socket: Socket) -> None:
        """Deliver nothing more to one socket that missed a frame; close it 1012."""
        self._restart([socket])

    def _restart(self, sockets: Iterable[Socket]) -> None:
        """Deliver nothing more to ``sockets`` and close them 1012 beside delivery."""
        for socket in sockets:
            if self.index.remove(socket):
                shut = socket.stop()  # False: the consumer is closing it already
                self._beside(self._close_dropped(socket, shut, CloseCode.SERVICE_RESTART))

    def drop_soon(self, socket: Socket) -> None:
        """Deliver nothing more to a socket that is not reading; close it 1011 beside
        delivery (a tracked task), giving it ``REALTIME_SEND_TIMEOUT`` to answer."""
        if not self.index.remove(socket):
            return
        shut = socket.stop()  # False: the consumer is closing it already
        if shut and socket.link.open():
            log_warning("realtime: a socket of account %s is not reading; closed", socket.user_id)
        elif shut:
            logger.debug("realtime: a socket of account %s left mid-delivery", socket.user_id)
        self._beside(self._close_dropped(socket, shut))

    async def _close_dropped(
        self, socket: Socket, shut: bool, code: CloseCode = CloseCode.INTERNAL_ERROR
    ) -> None:
        if shut:
            await socket.shut(code, conf.SEND_TIMEOUT)
        await self._sync_follows(socket.scopes)

    async def _refuse(self, socket: Socket) -> None:
        await socket.consumer.refuse_later(Refusal.TOKEN)
        await self._sync_follows(socket.scopes)

    def _beside(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` in a task of its own, kept until it ends; log what it raises."""

        async def logged() -> None:
            try:
                await work
            except Exception:
                logger.exception("realtime: closing a socket failed")

        task = asyncio.get_running_loop().create_task(logged())
        self._beside_tasks.add(task)
        task.add_done_callback(self._beside_tasks.discard)

    # Rechecks and housekeeping ------------------------------------------------------------

    def request_recheck(
        self, user_ids: Iterable[Any], ended_sessions: Collection[str] = ()
    ) -> None:
        """Recheck the sockets of these accounts at the next round (now), holding their
        frames until it answers; refuse at once those whose token names one of
        ``ended_sessions`` (signed out of: ``realtime.writes.rechecks``).

        Called in delivery order: every message published after the write that asked for
        the recheck (an account deactivated, a membership removed, a sign-out) is sent after
        this, so holding here means none of them reaches a socket the recheck is about to
        refuse.
        """
        now = time.monotonic()
        asked = self._asked
        for user_id in user_ids:
            asked[user_id] = now
            asked.move_to_end(user_id)
            for socket in list(self.index.by_user.get(user_id, ())):
                if _names_one_of(socket.token, ended_sessions):
                    # Beside delivery: the client may not be reading its auth_error.
                    self.index.remove(socket)
                    self._beside(self._refuse(socket))
                    continue
                socket.next_recheck = 0.0
                if socket.held is None:
                    socket.held = deque()
                    socket.rechecking = True
                    # A batch under way may have read its memberships before the write that
                    # asks: its answer does not end the hold.
                    socket.recheck_asked = socket in self._in_batch
                else:  # held for its handshake, or for a recheck that may have asked already
                    socket.recheck_asked = True
        for session in ended_sessions:
            self._ended[session] = now
            self._ended.move_to_end(session)
        for memory, kept in ((asked, ASKED_MEMORY), (self._ended, conf.TOKEN_MAX_AGE)):
            while memory and next(iter(memory.values())) < now - kept:
                memory.popitem(last=False)
        self._wake_up()

    def signed_out(self, token: str) -> bool:
        """Whether ``token`` names a session this worker heard signed out of (within
        ``REALTIME_TOKEN_MAX_AGE``): it stands no more, though it still stands for its
        account (a client that kept it is refused)."""
        return _names_one_of(token, self._ended)

    def _wake_up(self) -> None:
        """Run a housekeeping round now (a recheck is due)."""
        if self._wake is not None:
            self._wake.set()

    async def _housekeep(self) -> None:
        assert self._wake is not None
        while True:
            try:
                self.dispatcher.ensure_running()
                metrics.queue_depth(self.dispatcher.depth())
                await self.recheck_due()
                await self._hand_owed_cursors()
                await self._reconcile()
            except Exception:
                logger.exception("realtime: a housekeeping round failed; retrying")
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), TICK)

    async def recheck_due(self) -> None:
        """Recheck the sockets whose turn has come, in batches behind delivery."""
        now = time.monotonic()
        # A socket whose watch is being resolved is rechecked after it: its scopes are stale;
        # one whose handshake is not over, once it is.
        due = [
            s
            for s in self.index.sockets
            if s.next_recheck <= now and not s.watching and (s.held is None or s.rechecking)
        ]
        due.sort(key=_due_at)  # those asked for (due at 0) first
        # A batch costs a few statements and a wake of the round's thread whatever its size:
        # periodic rechecks wait to fill one, but none longer than a tenth of the interval.
        gather = conf.RECHECK_INTERVAL * RECHECK_GATHER
        size = limits.MAX_IDS_PER_MESSAGE  # sockets in one bulk ask of the auth hooks
        if due and len(due) < size and due[0].next_recheck > now - gather:
            return
        for socket in due:
            socket.next_recheck = now + conf.RECHECK_INTERVAL * random.uniform(0.9, 1.0)
        for chunk in chunked(due, size):
            # The batch waits for gaps in delivery, before it starts and between its steps,
            # for BEHIND_DELIVERY seconds in all.
            deadline = time.monotonic() + BEHIND_DELIVERY
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.dispatcher.quiet(), BEHIND_DELIVERY)
            batch = [s for s in chunk if s in self.index.sockets]
            for socket in batch:
                if socket.watching:
                    # A watch begun while the batch waited: its ask already asks for what
                    # the watch resolves, its scopes are still the ones it leaves, and its
                    # version is the watch's. Rechecked after it, not beside it.
                    socket.next_recheck = 0.0
            batch = [s for s in batch if not s.watching]
            if batch:
                await self._recheck(batch, deadline)

    async def _recheck(self, due: list[Socket], deadline: float) -> None:
        """Recheck one batch of sockets in one bulk ask, and act on the answers."""
        versions = [socket.scope_version for socket in due]
        questions = [(s.user_id, s.token, s.ask, list(s.scopes)) for s in due]
        # A batch that holds frames (a requested recheck) is what delivery waits for.
        if any(socket.rechecking for socket in due):
            deadline = 0.0
        between = functools.partial(self._behind_delivery, deadline)
        auth = get_auth()
        # Its sockets are in ``_in_batch`` until it has acted on every answer.
        self._in_batch.update(due)
        try:
            answers = await run_in_background(access.recheck, auth, questions, between)
            channels = await self._recheck_channels(auth, due, answers, between)
            for socket, version, answer in zip(due, versions, answers, strict=True):
                if socket.closed or socket not in self.index.sockets:
                    continue
                if answer is None or self.signed_out(socket.token):
                    # Beside the round: the client may not be reading its auth_error.
                    self.index.remove(socket)
                    self._beside(self._refuse(socket))
                    continue
                applied = answer is not access.FAILED and socket.scope_version == version
                asked = channels.get(socket)
                if asked is not None and (
                    applied or set(_reads(socket)) == set(asked[0].scope_ids)
                ):
                    # Before the scopes change: a scope given back enters with what it allows.
                    self.index.reallow(socket, asked[0].channels, asked[1].allowed)
                read = set(socket.scopes)
                if applied:
                    gained = any(normal_id(scope.id) not in socket.scopes for scope in answer)
                    await self.set_scopes(socket, answer, keep_channels=True)
                    unasked = socket.channels.difference(asked[0].channels if asked else ())
                    if gained and unasked and socket.allowed is not None:
                        # Subscribed while this recheck asked: not heard in the scopes it gave
                        # until the hook is asked there, by the next recheck, due now.
                        socket.next_recheck = 0.0
                        self._wake_up()
                if socket.rechecking:
                    if answer is access.FAILED:
                        # Could not tell: a recheck was asked for (a membership removed, say), so
                        # its frames stay held, and it is asked again at the next round (a
                        # failure that lasts fills the hold: the socket is then closed 1012).
                        socket.next_recheck = 0.0
                        continue
                    await self.go_live(socket)
                if set(socket.scopes) != read:
                    await self._hand_cursor(socket)
        finally:
            self._in_batch.difference_update(due)

    async def _hand_cursor(self, socket: Socket) -> None:
        """Hand an opted-in socket whose scopes a recheck changed a fresh ``cursor`` frame
        (decision 38's refresh, unasked), naming the scopes it reads now.

        The cursor a client keeps is the last one it was handed. Had it named a scope the
        recheck took away, a client dropping before its next frame would resume from it,
        and, its account back in that scope by then, be replayed what the scope said while
        the account was out of it. No sound cursor while the socket's frames are held or a
        message is being carried out (``refresh``): it is owed, and housekeeping hands it
        as soon as one is. A scope gained is named only once the cursor's position reaches
        where the socket started hearing it (``Socket.scopes_named``)."""
        if not socket.resumable or socket.closed or socket not in self.index.sockets:
            self._cursor_owed.discard(socket)
            return
        answer = cursor_answer(socket, self.dispatcher)
        if answer is None:
            self._cursor_owed.add(socket)
            return
        self._cursor_owed.discard(socket)
        sent = await socket.send_frame(
            {"type": "websocket.send", "text": answer}, conf.SEND_TIMEOUT
        )
        if not sent:
            self.drop_soon(socket)

    async def _hand_owed_cursors(self) -> None:
        for socket in list(self._cursor_owed):
            await self._hand_cursor(socket)

    async def _recheck_channels(
        self,
        auth: RealtimeAuth,
        due: list[Socket],
        answers: list[Any],
        between: Callable[[], None],
    ) -> dict[Socket, tuple[subscriptions.Ask, subscriptions.Decided]]:
        """Ask ``may_subscribe`` again about the channels of each socket whose recheck kept
        it, in the scopes it is about to read: by socket, the question and its answer (a
        socket whose hook raised is left out, logged: it keeps what it had)."""
        if not subscriptions.hooked(auth):
            return {}
        asks = {
            socket: subscriptions.Ask(
                socket.user,
                subscriptions.scopes_asked(normal_id(scope.id) for scope in answer),
                sorted(socket.channels),
                len(socket.channels),
            )
            for socket, answer in zip(due, answers, strict=True)
            if socket.allowed is not None and socket.channels and isinstance(answer, list)
        }
        if not asks:
            return {}
        decided = await run_in_background(
            subscriptions.decide_all, auth, list(asks.values()), between
        )
        answered: dict[Socket, tuple[subscriptions.Ask, subscriptions.Decided]] = {}
        for (socket, ask), answer in zip(asks.items(), decided, strict=True):
            if isinstance(answer, Exception):
                log_hook_failure(
                    "realtime: may_subscribe failed at a recheck; channels kept as they were",
                    answer,
                )
            else:
                answered[socket] = (ask, answer)
        return answered

    def _behind_delivery(self, deadline: float) -> None:
        """Between the steps of a recheck batch, on its thread: wait while a message is being
        delivered (until ``deadline``), so that the batch's Python does not take turns with
        delivery's for the interpreter lock."""
        self.dispatcher.wait_idle(max(0.0, deadline - time.monotonic()))

    async def _watch_stalls(self) -> None:
        """Observe the sockets' backlogs each ``TICK``, whatever else housekeeping waits for.
        A tick that comes late (delivery or a loaded machine holding the event loop) only
        delays a verdict: observations over the bound make one run however far apart they
        are (``connection``), so no stall escapes a slow watch. The same tick cuts a stuck
        statement of realtime's threads or of the transport."""
        while True:
            await asyncio.sleep(TICK)
            try:
                self.drop_stalled()
                cut_stuck_statements()
                if self._transport is not None:
                    self._transport.watch()
            except Exception:
                logger.exception("realtime: watching sockets and the transport failed")

    def drop_stalled(self) -> None:
        """Drop the sockets whose send under way or too large backlog has lasted too long.

        Observes those handed frames lately, and every ``SWEEP_TICKS`` all of them, reading
        each one's kernel queue: bytes the server sends of its own accord (pongs) reach a
        backlog without a frame of ours, and without being counted (see ``connection``).
        """
        timeout, now = conf.SEND_TIMEOUT, time.monotonic()
        self._ticks += 1
        indexed, unsettled = self.index.sockets, self._unsettled
        sweep = self._ticks % SWEEP_TICKS == 0
        observed = indexed if sweep else unsettled
        for socket in list(observed):
            try:
                if socket not in indexed:
                    unsettled.discard(socket)
                elif socket.stalled(timeout, now, exact=sweep):
                    unsettled.discard(socket)
                    self.drop_soon(socket)
                elif socket.settled():
                    unsettled.discard(socket)
                else:
                    unsettled.add(socket)
            except Exception as exc:
                # One socket that cannot be observed must not hide those after it, every
                # tick; it stays watched.
                unsettled.add(socket)
                log_own_failure("realtime: observing a socket's backlog failed", exc)

    async def _reconcile(self) -> None:
        """Follow what is held but not followed (a follow that failed earlier)."""
        for scope_id in [s for s in self.index.by_scope if s not in self._followed]:
            await self._sync_follow(scope_id)


def restamped(socket: Socket, entry: Held) -> dict[str, Any]:
    """The message of a held frame, its cursor made again where the socket's floor is now
    further in its other streams (a resume read them after the frame was held): a cursor
    behind what was replayed would have the next resume replay it twice."""
    where, floor = entry.where, socket.floor
    if where is None or entry.frame is None or floor is None:
        return entry.message
    now = where.merged(floor.only(where))
    if now == where:
        return entry.message
    socket.handed = now if socket.handed is None else socket.handed.merged(now)
    return with_cursor(entry.frame, socket, now)


def _reads(socket: Socket) -> list[Any]:
    """The scopes the hook is asked about for ``socket`` (``None`` alone: it reads none)."""
    return subscriptions.scopes_asked(socket.scopes)


def _due_at(socket: Socket) -> float:
    return socket.next_recheck


async def _authenticate_all(asks: list[tuple[str, ScopeAsk]]) -> list[Any]:
    return await run_blocking(access.authenticate_many, get_auth(), asks)


async def _decide_all(asks: list[subscriptions.Ask]) -> list[subscriptions.Decided | Exception]:
    # An exception is raised to that socket's asker alone (``Batcher``).
    return await run_blocking(subscriptions.decide_all, get_auth(), asks)


_managers: dict[asyncio.AbstractEventLoop, SocketManager] = {}


def get_manager() -> SocketManager:
    """The manager of the running event loop: one per process in production.

    Tests that run each test on a fresh loop get a fresh manager each time; managers of
    loops that are gone are detached from the transport.
    """
    loop = asyncio.get_running_loop()
    manager = _managers.get(loop)
    if manager is None:
        for old_loop in [old for old in _managers if old.is_closed()]:
            _managers.pop(old_loop).detach()
        validate_once()  # a server runs no system checks: the settings are checked here
        manager = _managers[loop] = SocketManager()
    return manager


def _names_one_of(token: str, sessions: Collection[str]) -> bool:
    """Whether ``token`` names one of these sessions (signed out of)."""
    if not sessions:
        return False
    session = session_claim(token)
    return session is not None and session in sessions
