"""What the outbox carries besides model events: announcements that build their own messages.

Each is plain data — the arguments of the call that made it — so that it can be written to
realtime's outbox in the caller's transaction (``realtime.writes.outbox_form``) and its messages
built after commit, by the writer or by any worker relaying it later. Ids are read by their
model's primary key field when the messages are built, as the broadcast API documents.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from realtime.auth import account_ids, scope_key
from realtime.encoding import key_of
from realtime.registry import options_named
from realtime.writes.packing import recheck_messages, scope_messages, users_messages


class Announcement(Protocol):
    """An item of the outbox that is not a model event: it builds its own messages."""

    def messages(self, budget: int | None) -> list[tuple[str, bytes]]: ...


@dataclass
class Recheck:
    """A request that every worker recheck the sockets of these accounts, refusing at once
    those whose token names one of ``ended_sessions`` (a sign-out's)."""

    user_ids: list[Any]
    ended_sessions: list[str] = field(default_factory=list)

    def messages(self, budget: int | None) -> list[tuple[str, bytes]]:
        return recheck_messages(self.user_ids, budget, self.ended_sessions)


@dataclass
class ScopeBroadcast:
    """``broadcast_to_scope``'s event, as it was called."""

    scope_id: Any
    event_type: str
    data: Any
    channels: list[str] | None
    meta: dict[str, Any]
    exclude: list[Any]
    #: ``(model name, id)`` of the record the event is about, if any.
    about: tuple[str, Any] | None
    #: The only accounts to hear it (``None``: the scope's sockets).
    only: list[Any] | None

    def messages(self, budget: int | None) -> list[tuple[str, bytes]]:
        return scope_messages(
            scope_key(self.scope_id),
            self.event_type,
            self.data,
            channels=self.channels,
            meta=dict(self.meta),
            exclude=account_ids(self.exclude),
            about=_about(self.about),
            only=None if self.only is None else account_ids(self.only),
            budget=budget,
        )


@dataclass
class UsersBroadcast:
    """``broadcast_to_users``'s event, as it was called."""

    user_ids: list[Any]
    event_type: str
    data: Any
    channels: list[str] | None
    meta: dict[str, Any]
    skip_scope: Any = None

    def messages(self, budget: int | None) -> list[tuple[str, bytes]]:
        return users_messages(
            account_ids(self.user_ids),
            self.event_type,
            self.data,
            channels=self.channels,
            meta=dict(self.meta),
            skip_scope=None if self.skip_scope is None else scope_key(self.skip_scope),
            budget=budget,
        )


def _about(about: tuple[str, Any] | None) -> dict[str, Any] | None:
    if about is None:
        return None
    name, pk = about
    options = options_named(name)
    return {"model": name, "id": pk if options is None else key_of(options.model, pk)}
