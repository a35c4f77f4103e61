"""One connected, authenticated socket as the manager sees it, and how frames reach it.

Frames reach a socket in the order they were handed to it, and no socket ever holds another's
frame. Where the socket's ``send`` is the server's and only buffers, never waiting (daphne's,
bare or behind Channels' session middleware), the frame is handed over in place; where it may
wait (uvicorn's, or any middleware's realtime does not know), each socket has a writer task of
its own that sends its queue in order.

A socket is not reading when a send fails, when one has not completed after
``REALTIME_SEND_TIMEOUT`` seconds, or when its backlog stays above ``STALL_BYTES`` for as
long. The backlog is everything not yet sent on the network: what its writer still holds, what
the server has taken, and what the kernel's send queue holds (see ``link``). Without the
kernel's share a client sent small frames could stop reading unseen: the kernel's send buffer
grows to megabytes and takes thousands of them while the server's own buffer stays empty.

Both are observed before each frame is added, never just after (a large frame the client is
about to read is no stall), and by the manager's stall watch (no timer per send: they cost more
than the send): every housekeeping tick for the sockets in ``watch`` (each joins it when handed
a frame, and leaves once seen with nothing on the way), every few ticks for all.

Two observations over the bound make one run however far apart they are, so a watch that
comes late (a busy event loop, a loaded machine) delays a verdict but never loses one. This
holds because the backlog counts everything up to the network: between two observations it
can only shrink (the client reads) unless something is added, and realtime adds frames only
through ``send_frame``, which observes first. So a backlog over the bound at an observation
was over it ever since the one before: had the client read it down in between, the frame that
brought it back up would have been observed under the bound, and the run would have ended
there. What the server writes of its own accord (pongs, pings) or the consumer sends itself
(handshake answers, a cursor, a refusal) is a few bytes a frame, bounded by the frame limit.

Reading the kernel's queue is a system call, so an observation makes it only when it could
matter (``link``): counting what it hands over, realtime knows the most the backlog can be,
and finding that under half the bound is as good as a reading (the other half is room for
what is not counted). During a run every observation reads it (the reading that started the
run was over the bound, and until the next one the sum is never less), and so does the stall
watch's sweep of all sockets (``manager.SWEEP_TICKS``): what is not counted (a client's pings
answered, say) is seen there, and a run it starts is followed exactly.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, NamedTuple

from realtime.encoding import normal_id
from realtime.positions import StreamPos, Vector
from realtime.sockets.link import Link, Send
from realtime.sockets.protocol import ScopeAsk
from realtime.sockets.record_order import RecordOrder

__all__ = ["STALL_BYTES", "Held", "Send", "Socket"]

#: Bytes of backlog a socket may have before it counts as not reading.
STALL_BYTES = 256 * 1024
#: A backlog known to be at most this far is not observed more closely before a frame: the
#: other half of the bound leaves room for what is not counted (what the server sends of its
#: own accord, what the consumer sends itself, see the module docstring).
SURELY_UNDER = STALL_BYTES // 2
#: The most a WebSocket frame's header adds to it (a server's frames are not masked).
FRAME_HEADER = 10


class Held(NamedTuple):
    """A frame held for a socket (see ``Socket.held``), with how it was addressed: so that,
    after a recheck, one the socket should no longer hear is left out without reading it."""

    #: The position of its message (``None``: unknown, or a replayed frame).
    position: StreamPos | None
    #: The ``websocket.send`` message.
    message: dict[str, Any]
    #: The scope it was addressed to (``None``: to the account).
    scope_id: Any = None
    #: The channels of its event (``None``: every socket of the scope hears it).
    channels: Sequence[str] | None = None
    #: For a frame of a stream-per-channel history that carries a cursor: the frame without
    #: it, and where the cursor says the socket is, so that the cursor can be made again
    #: when the frame goes out after a resume read further in the socket's other streams.
    frame: str | None = None
    where: Vector | None = None
    #: The live message of the frame (``None``: a replayed frame, or no message's): checked
    #: against a resume's replay as it goes out (``Socket.replayed``).
    about: dict[str, Any] | None = None


class Socket:
    """An authenticated connection: who it is, what it reads, what it hears, how to reach it."""

    __slots__ = (
        "_over_since",
        "_queue",
        "_queued",
        "_send",
        "_sending_since",
        "_writer",
        "allowed",
        "ask",
        "channels",
        "closed",
        "consumer",
        "floor",
        "gained",
        "handed",
        "held",
        "link",
        "next_recheck",
        "on_failure",
        "queries",
        "read_from",
        "recheck_asked",
        "rechecking",
        "replayed",
        "resumable",
        "scope_version",
        "scopes",
        "token",
        "user",
        "user_id",
        "watch",
        "watching",
    )

    def __init__(
        self,
        *,
        consumer: Any,
        send: Send,
        user: Any,
        token: str,
        ask: ScopeAsk,
        scopes: dict[Any, str],
        link: Link | None = None,
        resumable: bool = False,
        read_from: float | None = None,
    ) -> None:
        self.consumer = consumer
        #: When its handshake began reading the account and its memberships (monotonic): a
        #: recheck asked for the account since then is owed to it once it is registered.
        self.read_from = time.monotonic() if read_from is None else read_from
        self._send = send
        #: The server's connection (``link.find_link``); without one, known only through send.
        self.link = link if link is not None else Link()
        #: Frames the writer still holds (made on first use: daphne's sockets never need it).
        self._queue: deque[tuple[dict[str, Any], int]] | None = None
        self._queued = 0
        self._writer: asyncio.Task[None] | None = None
        #: When the writer's send under way began (``None``: no send under way).
        self._sending_since: float | None = None
        #: When the backlog was first observed over ``STALL_BYTES`` in the current run
        #: (``None``: under it at the last observation).
        self._over_since: float | None = None
        self.user = user
        #: The account's id in its one normalised form (``realtime.encoding.normal_id``).
        self.user_id: Any = normal_id(user.pk)
        self.token = token
        self.ask = ask
        #: Scope id -> slug, in the order the client asked for them.
        self.scopes = scopes
        #: Channels subscribed to; they apply to every scope the socket reads.
        self.channels: set[str] = set()
        #: Of ``channels``, those the ``may_subscribe`` hook allowed, by scope id it reads
        #: (``None``: the hook is the default one, and every channel is heard in every scope).
        self.allowed: dict[Any, set[str]] | None = None
        #: Bumped by each client ``watch``: an older recheck answer is then discarded.
        self.scope_version = 0
        #: A client ``watch`` is being resolved: the scopes above are about to change.
        self.watching = False
        self.next_recheck = 0.0
        #: Takes no more frames (closing, or closed).
        self.closed = False
        #: Told when a send of this socket's writer failed (the manager drops the socket).
        self.on_failure: Callable[[Socket], None] | None = None
        #: Opted in to resume: each event frame carries a cursor.
        self.resumable = resumable
        #: The sockets the manager's stall watch observes every tick; this one joins on each
        #: frame handed to it (``None``: not registered, nobody watches).
        self.watch: set[Socket] | None = None
        #: Where this socket has every frame up to, in each stream it heard when its
        #: handshake finished (a resuming socket's, once its handshake read the history): a
        #: frame at or below it is not sent again.
        self.floor: Vector | None = None
        #: Where the last cursor handed to it (in a frame, or answering a heartbeat) said it
        #: was: the next one is never behind it.
        self.handed: Vector | None = None
        #: The scopes it gained after its handshake (a recheck, a ``watch``), each with the
        #: stream it is heard in and where in it the socket started hearing it (``None``:
        #: not known yet): a cursor names it only from there (``scopes_named``).
        self.gained: dict[Any, tuple[str, StreamPos | None]] = {}
        #: While its handshake finishes, the frames delivered to it wait here with their log
        #: positions (``None`` once it is live; see ``SocketManager.go_live``).
        self.held: deque[Held] | None = deque()
        #: The versions of each row its resume's replay let through: a frame of an older one,
        #: held or live, is dropped as it would go out. Kept until the worker's memory has
        #: them and every frame planned before went out (``Dispatcher.replayed``).
        self.replayed: RecordOrder | None = None
        #: Its frames are held (in ``held``) until a requested recheck answers: refused, they
        #: are dropped; kept, those of scopes it still reads go out.
        self.rechecking = False
        #: A recheck was asked while its frames were held already (its handshake or resume,
        #: or a recheck under way): when they would go out, they stay held for that recheck.
        self.recheck_asked = False
        #: Its live queries by id (``realtime.sockets.live_queries``).
        self.queries: dict[str, Any] = {}

    def channels_in(self, scope_id: Any) -> Collection[str]:
        """The channels it hears in the scope ``scope_id``."""
        if self.allowed is None:
            return self.channels
        return self.allowed.get(scope_id, ())

    def hears(self, scope_id: Any, channels: Iterable[str]) -> set[str]:
        """Of ``channels``, those it hears in the scope ``scope_id`` (``None``: an event to
        its account, which no subscription narrows: those it holds)."""
        if scope_id is None or self.allowed is None:
            return self.channels.intersection(channels)
        return self.allowed.get(scope_id, set()).intersection(channels)

    def scopes_named(self, where: Vector | None) -> list[Any]:
        """The scopes a cursor of ``where`` names: those it reads, but one it gained and
        started hearing after ``where``. What that scope said up to there was not this
        socket's (its account may have joined it only then): a resume from a cursor naming
        it would replay it, where one from a cursor that does not is refused."""
        if not self.gained:
            return list(self.scopes)
        return [scope_id for scope_id in self.scopes if self.hears_at(scope_id, where)]

    def hears_at(self, scope_id: Any, where: Vector | None) -> bool:
        """Whether it heard the scope ``scope_id`` (which it reads) up to ``where``."""
        gained = self.gained.get(scope_id)
        if gained is None:
            return True
        start = gained[1]
        return start is not None and where is not None and where.reached(start)

    def has_heard(self, position: StreamPos | None) -> bool:
        """Whether the frame of the message at ``position`` went out to it already."""
        floor = self.floor
        return floor is not None and position is not None and floor.covers(position)

    def reads(self, held: Held) -> bool:
        """Whether a frame held during a recheck is still for this socket (``reads_event``)."""
        return self.reads_event(held.scope_id, held.channels)

    def reads_event(self, scope_id: Any, channels: Iterable[str] | None) -> bool:
        """Whether the frame of an event addressed to ``scope_id`` (``None``: to no scope) on
        ``channels`` is still for this socket: one of a scope it no longer reads, or of
        channels it no longer hears there (unsubscribed, or refused by a recheck's
        ``may_subscribe``), is not. Asked again as each frame goes out: a recheck may take a
        scope away between a message's planning and its sending."""
        if scope_id is None:
            return True
        if scope_id not in self.scopes:
            return False
        return channels is None or bool(self.hears(scope_id, channels))

    def backlog(self) -> int:
        """Bytes not yet sent on the network."""
        return self._queued + self.link.pending()

    def settled(self) -> bool:
        """Whether nothing of it is on the way: no send under way, no backlog (the kernel's
        queue read only if frames went out since it was last found empty)."""
        if self._sending_since is not None or self._queued:
            return False
        return not self.link.most() or not self.link.pending()

    def stalled(self, timeout: float, now: float | None = None, *, exact: bool = False) -> bool:
        """Observe the socket: whether a send or a too large backlog has lasted ``timeout``
        seconds (``now``: the ``time.monotonic()`` of the observation; ``exact``: read the
        kernel's queue whatever the count of bytes handed over says).

        A run of observations over the bound ends only at one under it, never for the time
        between two (see the module docstring).
        """
        if (
            not exact
            and self._sending_since is None
            and self._queued + self.link.most() <= SURELY_UNDER
        ):
            # The usual case: the backlog cannot be near the bound, and the kernel's queue is
            # not read (see ``link``). Never during a run: the reading that started it was
            # over the bound, and until the next one that sum is never less.
            self._over_since = None
            return False
        sending = self._sending_since
        if sending is not None:
            now = time.monotonic() if now is None else now
            if now - sending >= timeout:
                return True
        if self._queued + self.link.pending() <= STALL_BYTES:
            self._over_since = None
            return False
        now = time.monotonic() if now is None else now
        if self._over_since is None:
            self._over_since = now
        return now - self._over_since >= timeout

    async def send_frame(self, message: dict[str, Any], timeout: float) -> bool:
        """Hand one ``websocket.send`` message on; ``False`` when the socket is not reading.

        Whatever the server's ``send`` raises means the same: this socket cannot take the
        frame, and it must not keep the others from theirs.
        """
        if self.closed:
            return True
        if self.stalled(timeout):
            return False
        if self.watch is not None:
            self.watch.add(self)
        text = message["text"]
        if self.link.buffered:
            # At most the bytes it becomes (isascii() is a flag, read for free; a character
            # is at most 4 bytes of UTF-8), and its header.
            self.link.handed(FRAME_HEADER + (len(text) if text.isascii() else 4 * len(text)))
            try:
                await self._send(message)
            except Exception:
                return False
            return True
        # Counted as the bytes it becomes: moving a frame from the queue into the server must
        # not grow the backlog unobserved.
        size = len(text) if text.isascii() else len(text.encode())
        if self._queue is None:
            self._queue = deque()
        self._queue.append((message, size))
        self._queued += size
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._write())
        return True

    async def _write(self) -> None:
        """Send the queue in order; on a failure tell ``on_failure``. A send that does not
        complete is noticed by ``stalled`` (and the writer cancelled by ``stop``)."""
        queue = self._queue
        assert queue is not None
        try:
            while queue:
                message, size = queue[0]
                self._sending_since = time.monotonic()
                await self._send(message)
                queue.popleft()
                self._queued -= size
                self.link.handed(FRAME_HEADER + size)
        except Exception:
            queue.clear()
            self._queued = 0
            if not self.closed and self.on_failure is not None:
                self.on_failure(self)
        finally:
            self._writer = None
            self._sending_since = None

    def stop(self) -> bool:
        """Take no more frames and drop those held (idempotent); ``False`` if already so."""
        if self.closed:
            return False
        self.closed = True
        if self._queue is not None:
            self._queue.clear()
        self._queued = 0
        if self._writer is not None:
            self._writer.cancel()
        return True

    async def shut(self, code: int, answer_within: float) -> None:
        """Close the connection with ``code`` whether stopped or not (see ``Link.shut``)."""
        await self.link.shut(self._send, code, answer_within)
