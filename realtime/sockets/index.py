"""This process's sockets, indexed the way deliveries look them up.

Sockets are indexed by scope, by (scope, channel) and by account, so an event costs what it
delivers, not what the process holds. Subscriptions are per socket and apply to every scope it
reads. The index only records: following scopes on the transport is the manager's job.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from realtime.conf import conf
from realtime.registry import subscribable_names
from realtime.sockets.connection import Socket
from realtime.sockets.protocol import channel_model


class SocketIndex:
    """The sockets of this process by scope, by (scope, channel) and by account."""

    def __init__(self) -> None:
        self.sockets: set[Socket] = set()
        self.by_scope: dict[Any, set[Socket]] = {}
        self.by_scope_channel: dict[tuple[Any, str], set[Socket]] = {}
        self.by_user: dict[Any, set[Socket]] = {}

    def add(self, socket: Socket) -> None:
        """Index a socket and the scopes it reads."""
        self.sockets.add(socket)
        self.by_user.setdefault(socket.user_id, set()).add(socket)
        self.enter(socket, list(socket.scopes))

    def remove(self, socket: Socket) -> bool:
        """Forget a socket and its scopes; ``False`` when it was not indexed."""
        if socket not in self.sockets:
            return False
        self.sockets.discard(socket)
        _discard(self.by_user, socket.user_id, socket)
        self.leave(socket, list(socket.scopes))
        return True

    def enter(self, socket: Socket, scope_ids: Iterable[Any]) -> None:
        """Index ``socket`` under scopes it now reads, with its subscriptions."""
        for scope_id in scope_ids:
            self.by_scope.setdefault(scope_id, set()).add(socket)
            for channel in socket.channels:
                self.by_scope_channel.setdefault((scope_id, channel), set()).add(socket)

    def leave(self, socket: Socket, scope_ids: Iterable[Any]) -> None:
        """Unindex ``socket`` from scopes it no longer reads."""
        for scope_id in scope_ids:
            _discard(self.by_scope, scope_id, socket)
            self.unindex_channels(socket, scope_id, socket.channels)

    def clear_channels(self, socket: Socket) -> None:
        """Drop every subscription of ``socket``."""
        for scope_id in socket.scopes:
            self.unindex_channels(socket, scope_id, socket.channels)
        socket.channels.clear()

    def subscribe(self, socket: Socket, channels: Iterable[str]) -> None:
        """Add channels (known models only, up to ``REALTIME_MAX_CHANNELS``)."""
        known = subscribable_names()
        limit = conf.MAX_CHANNELS
        fresh: list[str] = []
        for channel in channels:
            if channel_model(channel) not in known:
                continue
            if channel in socket.channels or channel in fresh:
                continue
            if len(socket.channels) + len(fresh) >= limit:
                break
            fresh.append(channel)
        socket.channels.update(fresh)
        for scope_id in socket.scopes:
            for channel in fresh:
                self.by_scope_channel.setdefault((scope_id, channel), set()).add(socket)

    def unsubscribe(self, socket: Socket, channels: Iterable[str]) -> None:
        held = [channel for channel in channels if channel in socket.channels]
        socket.channels.difference_update(held)
        for scope_id in socket.scopes:
            self.unindex_channels(socket, scope_id, held)

    def unindex_channels(self, socket: Socket, scope_id: Any, channels: Iterable[str]) -> None:
        for channel in channels:
            _discard(self.by_scope_channel, (scope_id, channel), socket)

    def held_by(self, user_id: Any) -> int:
        """How many sockets of an account this process holds."""
        return len(self.by_user.get(user_id, ()))


def _discard(index: dict[Any, set[Socket]], key: Any, socket: Socket) -> None:
    group = index.get(key)
    if group is not None:
        group.discard(socket)
        if not group:
            del index[key]
