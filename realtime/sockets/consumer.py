"""``RealtimeConsumer``: the socket protocol as an explicit state machine (async only).

States: CONNECTING (before ``websocket.connect``), AUTHENTICATING (accepted, waiting for the
first frame, resolving the bearer and its scopes, registering the socket with its frames held
and, for a socket that resumes, reading what it missed), OPEN (``auth_success`` sent, frames
flowing and read) and CLOSED. A refused handshake gets ``auth_error`` with its reason and
close 1008; a bad frame once open gets its documented close code and one log line, never an
exception.

Outgoing events never pass through this class: the ``SocketManager`` sends each frame to the
socket's ASGI ``send`` itself. Incoming messages are read here directly through an ``Inbox``
(which applies the frame limits from the first frame after ``authenticate``), not through
Channels' ``dispatch`` (which hops to a thread for every message). The server's connection
behind ``send`` is found once (``link``), where realtime knows how: then it closes with the
protocol's codes and a socket that stops reading is noticed.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import django.db
from channels.consumer import AsyncConsumer

from realtime import metrics, signals
from realtime.auth import Scope, get_auth, token_refusal_cause
from realtime.blocking import run_blocking
from realtime.compat import daphne
from realtime.conf import conf
from realtime.encoding import normal_id, storable
from realtime.logs import describe, log_operation
from realtime.sockets import live_queries, protocol, subscriptions
from realtime.sockets.access import resolve_scopes
from realtime.sockets.connection import Socket
from realtime.sockets.inbox import ClientGoneError, Inbox, OverLimitError
from realtime.sockets.limits import (
    log_bad_input,
    log_hook_failure,
    log_own_failure,
    unauthenticated,
)
from realtime.sockets.link import find_link
from realtime.sockets.manager import LISTEN_WAIT, get_manager
from realtime.sockets.protocol import CloseCode, Frame, FrameError, Refusal, ScopeAsk
from realtime.sockets.refresh import cursor_answer

logger = logging.getLogger(__name__)

Message = dict[str, Any]

#: Seconds a client has to answer the close of its socket before the connection is cut.
CLOSE_ANSWER = 5.0
#: Seconds a stopping server's close frame is given to leave before the server drops the
#: connection (daphne cuts every connection once its applications have ended).
STOP_FLUSH = 1.0
FLUSH_POLL = 0.01


class State(enum.Enum):
    CONNECTING = "connecting"
    AUTHENTICATING = "authenticating"
    OPEN = "open"
    CLOSED = "closed"


class RealtimeConsumer(AsyncConsumer):  # type: ignore[misc]
    """Serve one socket: handshake, then frames, until it closes. See the module docstring."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        _serving.add(self)
        _close_when_the_server_stops()
        self.scope = scope
        self.base_send = send
        self.link = find_link(send, scope)
        self.inbox = Inbox(receive)
        self.state = State.CONNECTING
        self.user: Any = None
        #: The account a place is reserved for (``SocketManager.reserve``) until registered.
        self.reserved: Any = None
        self.socket: Socket | None = None
        self.code: int | None = None
        #: The client address holding a place in ``unauthenticated`` (``None``: none held).
        self.unproven: str | None = None
        try:
            if await self._handshake():
                await self._read_frames()
        except ClientGoneError:
            self.state = State.CLOSED
            self.code = self.inbox.code
        except OverLimitError as exc:
            await self._close(exc.code)
        except asyncio.CancelledError:
            await self._close_for_stop()
            raise
        finally:
            await self._finish()

    async def _close_for_stop(self) -> None:
        """The server is stopping: daphne cancels every application, then drops every
        connection without a close frame (the client would see 1006 and guess). Close 1012
        instead, as uvicorn does for its own sockets, so the client reconnects and reads again
        at once; the frame is given ``STOP_FLUSH`` seconds to leave the server's buffer."""
        if self.state is State.CLOSED:
            return
        await self._close(CloseCode.SERVICE_RESTART)
        # The server's buffer says no more than its size: polled, a hundredth of a second apart.
        await asyncio.sleep(0)
        for _ in range(round(STOP_FLUSH / FLUSH_POLL)):
            if self.link.buffer() == 0:
                break
            await asyncio.sleep(FLUSH_POLL)

    # Handshake ----------------------------------------------------------------------------

    async def _handshake(self) -> bool:
        message = await self.inbox.next()
        if message.get("type") != "websocket.connect":
            return False
        address = _client_address(self.scope)
        if not unauthenticated.take(address):
            # Before accepting: the server answers the handshake with HTTP 403.
            log_bad_input("realtime: refused a socket: too many unauthenticated from one address")
            metrics.handshake("address_cap")
            await self.base_send({"type": "websocket.close", "code": CloseCode.POLICY_VIOLATION})
            self.state = State.CLOSED
            return False
        self.unproven = address
        await self.base_send({"type": "websocket.accept"})
        self.state = State.AUTHENTICATING
        try:
            # A timeout scope rather than ``wait_for``: no task of its own per handshake.
            async with asyncio.timeout(conf.AUTH_TIMEOUT):
                message = await self.inbox.next()
        except TimeoutError:
            return await self._refuse(Refusal.TIMEOUT)
        if message.get("type") != "websocket.receive":
            return await self._refuse(Refusal.TIMEOUT)
        text = message.get("text")
        if not isinstance(text, str) or len(text) > conf.MAX_FRAME_SIZE:
            return await self._refuse(Refusal.FORMAT)
        try:
            frame = protocol.parse_frame(text)
        except FrameError:
            return await self._refuse(Refusal.FORMAT)
        token = frame.data.get("token")
        if frame.type != protocol.AUTHENTICATE or not isinstance(token, str) or not token:
            return await self._refuse(Refusal.MESSAGE)
        if not storable(token):
            # No bearer holds a NUL or a lone surrogate; no hook is asked about one.
            return await self._refuse(Refusal.TOKEN, "it holds a NUL or a lone surrogate")
        ask = protocol.read_scopes(frame.data)
        read_from = time.monotonic()
        try:
            user, scopes = await self.inbox.watching(get_manager().handshakes.ask((token, ask)))
        except (ClientGoneError, OverLimitError):
            raise
        except django.db.Error as exc:
            # A database that cannot answer now (a blip, a failover; any of Django's database
            # errors, InterfaceError among them) says nothing of the token: the client comes
            # back with it, after its usual delay, rather than refresh it.
            log_hook_failure("realtime: authenticating a socket failed; closed it 1012", exc)
            metrics.handshake("database_unavailable")
            await self._close(CloseCode.SERVICE_RESTART)
            return False
        except Exception as exc:
            log_hook_failure("realtime: authenticating a socket failed", exc)
            return await self._refuse(Refusal.TOKEN)
        if user is None:
            return await self._refuse(Refusal.TOKEN, await _token_refusal_cause(token))
        manager = get_manager()
        if manager.signed_out(token):
            return await self._refuse(Refusal.TOKEN, "its session was signed out of")
        if ask.asked and not scopes:
            return await self._refuse(Refusal.SCOPE)
        if not manager.reserve(user.pk):
            return await self._refuse(Refusal.TOO_MANY)
        self.reserved = user.pk
        try:
            await self._start_listening()
            if not await self._open(user, token, ask, scopes, frame.data, read_from):
                return False
        finally:
            self._give_back_place()
        metrics.handshake("accepted")
        return True

    async def _open(
        self,
        user: Any,
        token: str,
        ask: ScopeAsk,
        scopes: list[Scope],
        data: dict[str, Any],
        read_from: float,
    ) -> bool:
        """Register the socket (subscribed to ``authenticate.channels``, following its scopes,
        its frames held), work out how it starts, then say ``auth_success`` and let the
        frames flow: the missed ones first for a socket that resumes, then the held ones.

        Registering before ``auth_success`` means a write that commits at any point after it
        reaches the socket: nothing falls between the answer and the follow. A worker that
        could not start hearing everything the socket reads (its listener or a scope's
        follow took too long), or could not read the history a cursor asks to resume,
        closes it 1012 instead: its client reconnects (with its cursor), rather than miss
        what is written meanwhile or reload what it shows. ``False`` then.
        """
        manager = get_manager()
        resume = protocol.read_resume(data)
        socket = Socket(
            consumer=self,
            send=self.base_send,
            user=user,
            token=token,
            ask=ask,
            scopes={normal_id(s.id): s.slug for s in scopes},
            link=self.link,
            resumable=resume.opted,
            read_from=read_from,
        )
        if subscriptions.hooked(get_auth()):
            socket.allowed = {}
        self.user, self.socket = user, socket
        self._proven()
        # Asked before the socket is registered: no frame, live or replayed, of a channel
        # the hook refuses ever reaches it.
        channels, allowed = await self.inbox.watching(
            manager.decide(socket, protocol.read_channels(data))
        )
        # Indexed, the socket holds its place itself: counted once while it resumes.
        self.reserved = None
        followed = await manager.register(socket, channels, allowed, reserved=True)
        if not followed:
            metrics.handshake("not_listening")
        if not followed or socket.closed:
            return await self._restart()
        slugs = list(socket.scopes.values())
        if not resume.opted:
            await self.base_send(_text(protocol.auth_success(socket.user_id, slugs)))
            self.state = State.OPEN
            await manager.go_live(socket)
            return True
        start = await self.inbox.watching(manager.resumer.resume(socket, resume))
        if start.unreadable:
            metrics.handshake("history_unreadable")
        if start.unreadable or socket.closed:
            return await self._restart()
        socket.floor = start.floor
        success = protocol.auth_success(socket.user_id, slugs, start.cursor, start.resumed)
        await self.base_send(_text(success))
        self.state = State.OPEN
        # The missed frames go out first, with the held ones (and wait with them for a
        # recheck asked meanwhile).
        if socket.held is not None:  # None: closed meanwhile
            socket.held.extendleft(reversed(start.frames))
            await manager.go_live(socket)
        return True

    async def _restart(self) -> bool:
        """End the handshake with close 1012 (its client comes back); ``False``.

        The manager may have closed the socket already while the handshake waited for its
        follows or its resume's reads: 1012, as it may have missed messages (``on_missed``)
        or its scope's follow was late (its frames are held until ``auth_success``: none
        can find it not reading). Nothing more goes out then, ``auth_success`` least of all:
        the server refuses a frame after the close (uvicorn raises).
        """
        socket = self.socket
        if socket is not None and socket.closed:
            self.state = State.CLOSED
            self.code = CloseCode.SERVICE_RESTART
        else:
            await self._close(CloseCode.SERVICE_RESTART)
        return False

    async def _start_listening(self) -> None:
        manager = get_manager()
        if manager.serving():
            return
        try:
            await self.inbox.watching(asyncio.wait_for(manager.ensure_listening(), LISTEN_WAIT))
        except (ClientGoneError, OverLimitError):
            raise
        except Exception as exc:
            # The socket is closed 1012 (see ``_open``); housekeeping retries the listener.
            # One WARNING (decision 13): the client reconnects, nothing is lost.
            log_operation(
                logger,
                logging.WARNING,
                "realtime: the listener did not start in time (%s); the socket is closed 1012",
                describe(exc),
            )

    async def _refuse(self, reason: Refusal, cause: str | None = None) -> bool:
        """Refuse the handshake: ``auth_error`` with ``reason``, then 1008. ``cause`` goes to
        the server's log only, beside the reason."""
        if cause is None:
            log_bad_input("realtime: refused a socket: %s", reason.value)
        else:
            log_bad_input("realtime: refused a socket: %s: %s", reason.value, cause)
        metrics.handshake(metrics.outcome_of(reason.value))
        await self._say_auth_error(reason)
        await self._close(CloseCode.POLICY_VIOLATION)
        return False

    async def refuse_later(self, reason: Refusal) -> None:
        """Refuse an open socket whose credentials no longer stand (a recheck's verdict):
        the events still waiting for it are dropped, ``auth_error`` goes out, then 1008."""
        if self.state is State.OPEN:
            log_bad_input("realtime: closed a socket on recheck: %s", reason.value)
            if self.socket is not None:
                self.socket.stop()
            await self._say_auth_error(reason)
            await self._close(CloseCode.POLICY_VIOLATION)

    async def _say_auth_error(self, reason: Refusal) -> None:
        """Send ``auth_error``, bounded: a client that is not reading is closed anyway."""
        try:
            await asyncio.wait_for(
                self.base_send(_text(protocol.auth_error(reason))), conf.SEND_TIMEOUT
            )
        except Exception:
            logger.debug("realtime: auth_error could not be sent; closing")

    # Frames -------------------------------------------------------------------------------

    async def _read_frames(self) -> None:
        handlers: dict[str, Callable[[Frame], Awaitable[None]]] = {
            protocol.WATCH: self._on_watch,
            protocol.SUBSCRIBE: self._on_subscribe,
            protocol.UNSUBSCRIBE: self._on_unsubscribe,
            protocol.HEARTBEAT: self._on_heartbeat,
            protocol.AUTHENTICATE: _ignore,
            live_queries.QUERY: self._on_query,
            live_queries.UNQUERY: self._on_unquery,
        }
        while self.state is State.OPEN:
            message = await self.inbox.next_frame()
            if message.get("type") != "websocket.receive":
                continue
            try:
                frame = protocol.parse_frame(message.get("text"))
            except FrameError as exc:
                log_bad_input("realtime: closed a socket sending a bad frame (%s)", exc)
                return await self._close(CloseCode.POLICY_VIOLATION)
            if frame.type is None:
                continue
            handler = handlers.get(frame.type)
            if handler is not None:
                await handler(frame)
            else:
                await signals.send_robustly(
                    signals.frame_received,
                    RealtimeConsumer,
                    consumer=self,
                    user=self.user,
                    event_type=frame.type,
                    data=frame.data,
                )

    async def _on_watch(self, frame: Frame) -> None:
        socket = self.socket
        assert socket is not None
        ask = protocol.read_scopes(frame.data)
        if ask == socket.ask:
            return
        # Bumping the version first makes any recheck already under way discard its answer.
        socket.ask = ask
        socket.scope_version += 1
        socket.watching = True
        version = socket.scope_version
        try:
            scopes = await run_blocking(resolve_scopes, get_auth(), self.user, socket.token, ask)
        except Exception as exc:
            # Its old scopes are not what it asks for, and no scope would leave it deaf to
            # what it asked for: it comes back and asks again (with its cursor, if it has one).
            log_hook_failure("realtime: resolving a watch failed; closed the socket 1012", exc)
            return await self._close(CloseCode.SERVICE_RESTART)
        finally:
            socket.watching = False
        if version == socket.scope_version and self.state is State.OPEN:
            await get_manager().set_scopes(socket, scopes, keep_channels=False)

    async def _on_heartbeat(self, frame: Frame) -> None:
        """Answer an opted-in socket with a fresh cursor when a sound one is known (see
        ``refresh``); the others, as ever, with nothing."""
        socket = self.socket
        assert socket is not None
        if not socket.resumable:
            return
        manager = get_manager()
        answer = cursor_answer(socket, manager.dispatcher)
        if answer is not None and not await socket.send_frame(_text(answer), conf.SEND_TIMEOUT):
            manager.drop_soon(socket)

    async def _on_subscribe(self, frame: Frame) -> None:
        assert self.socket is not None
        # Awaited before the next frame is read: an unsubscribe after it comes after it.
        await get_manager().subscribe(self.socket, protocol.read_channels(frame.data))

    async def _on_unsubscribe(self, frame: Frame) -> None:
        assert self.socket is not None
        get_manager().unsubscribe(self.socket, protocol.read_channels(frame.data))

    async def _on_query(self, frame: Frame) -> None:
        assert self.socket is not None
        # Awaited before the next frame is read: an unquery after it comes after it.
        await get_manager().dispatcher.live.start(self.socket, frame.data)

    async def _on_unquery(self, frame: Frame) -> None:
        assert self.socket is not None
        get_manager().dispatcher.live.stop(self.socket, frame.data.get("id"))

    # Plumbing -----------------------------------------------------------------------------

    async def _close(self, code: int) -> None:
        """Close with ``code`` once; the socket takes no more frames from then on."""
        if self.state is State.CLOSED:
            return
        self.state = State.CLOSED
        self.code = int(code)
        if self.socket is not None:
            self.socket.stop()
        await self.link.shut(self.base_send, code, CLOSE_ANSWER)

    def _give_back_place(self) -> None:
        """Give back the place ``reserve`` held for this socket, unless ``register`` took it."""
        if self.reserved is not None:
            get_manager().release(self.reserved)
            self.reserved = None

    def _proven(self) -> None:
        """Give back the place this socket held among the unauthenticated (once)."""
        if self.unproven is not None:
            unauthenticated.give_back(self.unproven)
            self.unproven = None

    async def _finish(self) -> None:
        _serving.discard(self)
        self.state = State.CLOSED
        self._proven()
        metrics.closed(self.code)
        self.inbox.close()
        # A client that stopped reading may leave its close frame, its own or the stopping
        # server's, behind a backlog it never takes: the connection is cut then, as a send's.
        self.link.let_go(conf.SEND_TIMEOUT)
        if self.socket is not None:
            self.socket.stop()
            try:
                await get_manager().unregister(self.socket)
            except Exception as exc:
                log_own_failure("realtime: unregistering a socket failed", exc)
        await signals.send_robustly(
            signals.socket_disconnected,
            RealtimeConsumer,
            consumer=self,
            user=self.user,
            code=self.code,
        )


#: The consumers serving a socket in this process, closed 1012 when the server stops.
_serving: weakref.WeakSet[RealtimeConsumer] = weakref.WeakSet()
_stop_hooked = False


def _close_when_the_server_stops() -> None:
    """Under daphne, close every socket 1012 before the server stops (once per process).

    daphne drops its connections as it stops, without a close frame (its own attempt to end
    the applications first fails on daphne 4.2: ``KeyError: 'application_instance'``); the
    clients would see 1006. uvicorn closes its sockets 1012 itself."""
    global _stop_hooked
    if not _stop_hooked:
        _stop_hooked = daphne.before_stop(_close_all_for_stop)


async def _close_all_for_stop() -> None:
    consumers = list(_serving)
    if consumers:
        logger.info("realtime: the server is stopping: closing %d socket(s) 1012", len(consumers))
    await asyncio.gather(
        *(consumer._close_for_stop() for consumer in consumers), return_exceptions=True
    )


async def _ignore(frame: Frame) -> None:
    return None


def _client_address(scope: dict[str, Any]) -> str | None:
    """The client's host as the server saw it (a forwarded one when the server reads proxy
    headers); ``None`` over a Unix socket or when the server does not say."""
    client = scope.get("client")
    if isinstance(client, list | tuple) and client and isinstance(client[0], str):
        return client[0]
    return None


def _text(frame: str) -> Message:
    return {"type": "websocket.send", "text": frame}


async def _token_refusal_cause(token: str) -> str:
    """Why ``token`` named no account, for the log line of its refusal (never raises: a cause
    that cannot be told is said to be so)."""
    try:
        return await run_blocking(token_refusal_cause, token)
    except Exception as exc:
        return f"the cause could not be told ({type(exc).__name__})"
