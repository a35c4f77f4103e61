"""This process's sockets, indexed the way deliveries look them up.

Sockets are indexed by scope, by (scope, channel), by channel (what a global model's events
look up: every socket holding the channel, whatever it reads) and by account, so an event
costs what it delivers, not what the process holds. Subscriptions are per socket and apply to
every scope it reads, but for a channel the ``may_subscribe`` hook did not allow in a scope
(``Socket.allowed``): that one is not indexed under that scope. The index only records:
following scopes on the transport is the manager's job.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from realtime.conf import conf
from realtime.registry import subscribable_names
from realtime.sockets.connection import Socket
from realtime.sockets.protocol import channel_model
from realtime.sockets.subscriptions import log_unknown

T = TypeVar("T")


class SocketIndex:
    """The sockets of this process by scope, by (scope, channel), by channel and by account."""

    def __init__(self) -> None:
        self.sockets: set[Socket] = set()
        self.by_scope: dict[Any, set[Socket]] = {}
        self.by_scope_channel: dict[tuple[Any, str], set[Socket]] = {}
        self.by_channel: dict[str, set[Socket]] = {}
        self.by_user: dict[Any, set[Socket]] = {}

    def add(self, socket: Socket) -> None:
        """Index a socket, the scopes it reads and the channels it holds."""
        self.sockets.add(socket)
        self.by_user.setdefault(socket.user_id, set()).add(socket)
        for channel in socket.channels:
            self.by_channel.setdefault(channel, set()).add(socket)
        self.enter(socket, list(socket.scopes))

    def remove(self, socket: Socket) -> bool:
        """Forget a socket and its scopes; ``False`` when it was not indexed."""
        if socket not in self.sockets:
            return False
        self.sockets.discard(socket)
        discard(self.by_user, socket.user_id, socket)
        for channel in socket.channels:
            discard(self.by_channel, channel, socket)
        self.leave(socket, list(socket.scopes))
        return True

    def enter(self, socket: Socket, scope_ids: Iterable[Any]) -> None:
        """Index ``socket`` under scopes it now reads, with the subscriptions it hears there."""
        for scope_id in scope_ids:
            self.by_scope.setdefault(scope_id, set()).add(socket)
            for channel in socket.channels_in(scope_id):
                self.by_scope_channel.setdefault((scope_id, channel), set()).add(socket)

    def leave(self, socket: Socket, scope_ids: Iterable[Any]) -> None:
        """Unindex ``socket`` from scopes it no longer reads."""
        for scope_id in scope_ids:
            discard(self.by_scope, scope_id, socket)
            self.unindex_channels(socket, scope_id, socket.channels)
            if socket.allowed is not None:
                socket.allowed.pop(scope_id, None)

    def clear_channels(self, socket: Socket) -> None:
        """Drop every subscription of ``socket``."""
        for scope_id in socket.scopes:
            self.unindex_channels(socket, scope_id, socket.channels)
        for channel in socket.channels:
            discard(self.by_channel, channel, socket)
        socket.channels.clear()
        if socket.allowed is not None:
            socket.allowed.clear()

    def candidates(self, socket: Socket, channels: Iterable[str]) -> list[str]:
        """The channels of a client's frame that could be subscribed: those of known models
        (the others are dropped, said with ``DEBUG``), not held yet, each once, in order, at
        most ``REALTIME_MAX_CHANNELS`` (those after are dropped unread)."""
        known = subscribable_names()
        most = conf.MAX_CHANNELS
        seen: set[str] = set()
        fresh: list[str] = []
        for channel in channels:
            if len(fresh) >= most:
                break
            if channel in seen or channel in socket.channels:
                continue
            seen.add(channel)
            if channel_model(channel) not in known:
                log_unknown(channel, known)
                continue
            fresh.append(channel)
        return fresh

    def room(self, socket: Socket) -> int:
        """How many more channels ``socket`` may hold (``REALTIME_MAX_CHANNELS``)."""
        return max(0, conf.MAX_CHANNELS - len(socket.channels))

    def subscribe(
        self,
        socket: Socket,
        channels: Iterable[str],
        allowed: dict[Any, set[str]] | None = None,
    ) -> None:
        """Add ``channels`` as ``SocketManager.decide`` read them (known, each once), but
        those held meanwhile, up to ``REALTIME_MAX_CHANNELS``: the first that does not fit
        and those after it are dropped. ``allowed``: the channels ``may_subscribe`` allowed
        in each scope, for a socket whose hook is asked (a scope it does not name hears
        none of them)."""
        fresh = [channel for channel in channels if channel not in socket.channels]
        fresh = fresh[: self.room(socket)]
        if not fresh:
            return
        socket.channels.update(fresh)
        if socket in self.sockets:
            for channel in fresh:
                self.by_channel.setdefault(channel, set()).add(socket)
        if socket.allowed is not None and allowed:
            for scope_id in socket.scopes:
                there = allowed.get(scope_id)
                if there:
                    heard = [channel for channel in fresh if channel in there]
                    socket.allowed.setdefault(scope_id, set()).update(heard)
        for scope_id in socket.scopes:
            for channel in socket.hears(scope_id, fresh):
                self.by_scope_channel.setdefault((scope_id, channel), set()).add(socket)

    def unsubscribe(self, socket: Socket, channels: Iterable[str]) -> None:
        held = [channel for channel in channels if channel in socket.channels]
        if not held:
            return
        socket.channels.difference_update(held)
        for channel in held:
            discard(self.by_channel, channel, socket)
        for scope_id in socket.scopes:
            self.unindex_channels(socket, scope_id, held)
        if socket.allowed is not None:
            for there in socket.allowed.values():
                there.difference_update(held)

    def reallow(self, socket: Socket, asked: Iterable[str], allowed: dict[Any, set[str]]) -> None:
        """Apply a recheck's answer about the channels it ``asked`` about, in the scopes
        ``allowed`` names (those the socket reads once the recheck is applied): of those
        still held, drop the ones no scope allows, and hear each other one in exactly the
        scopes that allow it. A channel subscribed since the recheck asked keeps what its own
        subscribe decided; a scope the socket is about to enter is indexed when it does."""
        assert socket.allowed is not None
        held = {channel for channel in asked if channel in socket.channels}
        heard = set().union(*allowed.values())
        self.unsubscribe(socket, held - heard)
        held &= heard
        for scope_id, there in allowed.items():
            if scope_id is None:
                continue  # a socket reading no scope: holding the channel is all there is
            before = socket.allowed.get(scope_id, set())
            now = (before - held) | (there & held)
            socket.allowed[scope_id] = now
            if scope_id in socket.scopes:
                self.unindex_channels(socket, scope_id, before - now)
                for channel in now - before:
                    self.by_scope_channel.setdefault((scope_id, channel), set()).add(socket)

    def unindex_channels(self, socket: Socket, scope_id: Any, channels: Iterable[str]) -> None:
        for channel in channels:
            discard(self.by_scope_channel, (scope_id, channel), socket)

    def held_by(self, user_id: Any) -> int:
        """How many sockets of an account this process holds."""
        return len(self.by_user.get(user_id, ()))


def discard(index: dict[Any, set[T]], key: Any, item: T) -> None:
    """Take ``item`` out of ``index[key]``, and the key out once its set is empty."""
    group = index.get(key)
    if group is not None:
        group.discard(item)
        if not group:
            del index[key]
