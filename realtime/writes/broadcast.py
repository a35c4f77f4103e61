"""Broadcast API: events of the application's own, to a scope or to accounts.

Each call publishes after the current transaction commits (at once outside one), from sync or
async code; from async code the work runs on the thread that holds the caller's transaction
(``realtime.writes.from_async``). Failures are logged, never raised into the caller. The ids a
call is given are read by their model's primary key field (``realtime.auth.scope_key``,
``account_ids``): a scope or an account named ``"3"`` where the key is an integer is the one of
key ``3``. A scope id whose channel no transport takes (over 1,024 bytes:
``ChannelTooLongError``) is refused at the call, logged like any failure: with a durable
transport its outbox row would fail every relay. So is an event type the socket protocol uses
for its own frames (``auth_success``, ``auth_error``, ``cursor``, ``query.rows``,
``query.diff``, ``query.error``: a ``ValueError``), which clients would take for the
protocol's frame rather than hear as an event.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from django.db import DEFAULT_DB_ALIAS, models

from realtime.auth import account_ids, scope_key
from realtime.messages import PROTOCOL_FRAME_TYPES, scope_channel
from realtime.registry import wire_name
from realtime.transports.table_store import encode_channel
from realtime.writes import from_async, on_commit, rechecks
from realtime.writes.items import ScopeBroadcast, UsersBroadcast

logger = logging.getLogger(__name__)

Broadcast = TypeVar("Broadcast", ScopeBroadcast, UsersBroadcast)


def _submit(work: Callable[[], None], using: str) -> None:
    if from_async.in_async_code():
        from_async.hand_over(lambda: _logged(work), [using])
    else:
        _logged(work)


def _logged(work: Callable[[], None]) -> None:
    try:
        work()
    except Exception:
        logger.exception("realtime: broadcasting failed")


def _about(about: tuple[type[models.Model] | str, Any] | None) -> tuple[str, Any] | None:
    if about is None:
        return None
    model, pk = about
    return (model if isinstance(model, str) else wire_name(model), pk)


def broadcast_to_scope(
    scope_id: Any,
    event_type: str,
    data: Any,
    *,
    channels: Iterable[str] | None = None,
    meta: dict[str, Any] | None = None,
    exclude_user_ids: Iterable[Any] | None = None,
    about: tuple[type[models.Model] | str, Any] | None = None,
    audience: Iterable[Any] | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> None:
    """Send an event to the sockets of a scope (those subscribed to ``channels``, if given),
    after the current transaction on ``using`` commits."""
    only = None if audience is None else list(audience)
    if only == []:
        return
    item = ScopeBroadcast(
        scope_id,
        event_type,
        data,
        channels=None if channels is None else list(channels),
        meta=dict(meta or {}),
        exclude=list(exclude_user_ids or ()),
        about=_about(about),
        only=only,
    )
    _submit(lambda: on_commit.add(_fitting(_application_event(item)), using), using)


def _application_event(item: Broadcast) -> Broadcast:
    """``item``, once its type is known not to be one the socket protocol sends of its own:
    clients would take such an event for the protocol's frame (a second ``auth_success``
    replacing the session, an ``auth_error`` ending the connection, a ``cursor`` swallowed, a
    live query's answer). Refused at the call, logged like any failure (the message names the
    type and what to do), and nothing is published."""
    if item.event_type in PROTOCOL_FRAME_TYPES:
        reserved = ", ".join(sorted(PROTOCOL_FRAME_TYPES))
        raise ValueError(
            f"realtime: the event type {item.event_type!r} is a frame type of the socket "
            f"protocol ({reserved}), which clients would take for the protocol's own frame; "
            f"nothing was broadcast. Give the event a name of the application's, e.g. "
            f"'app.{item.event_type}'."
        )
    return item


def _fitting(item: ScopeBroadcast) -> ScopeBroadcast:
    """``item``, once its scope's channel is known to fit every transport (1,024 bytes):
    one that does not is refused here, where the caller's log line says which broadcast it
    was, rather than by every publish of it after the commit (each relay of its outbox row,
    with a durable transport, failing the same way)."""
    encode_channel(scope_channel(scope_key(item.scope_id)))
    return item


def broadcast_to_users(
    user_ids: Iterable[Any],
    event_type: str,
    data: Any,
    *,
    channels: Iterable[str] | None = None,
    meta: dict[str, Any] | None = None,
    skip_scope: Any = None,
    using: str = DEFAULT_DB_ALIAS,
) -> None:
    """Send an event to every socket of these accounts, whatever scope each one reads, after
    the current transaction on ``using`` commits."""
    ids = list(user_ids)
    if not ids:
        return
    item = UsersBroadcast(
        ids,
        event_type,
        data,
        channels=None if channels is None else list(channels),
        meta=dict(meta or {}),
        skip_scope=skip_scope,
    )
    _submit(lambda: on_commit.add(_application_event(item), using), using)


def broadcast_to_user(
    user_id: Any,
    event_type: str,
    data: Any,
    *,
    meta: dict[str, Any] | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> None:
    """Send an event to every socket of one account."""
    broadcast_to_users([user_id], event_type, data, meta=meta, using=using)


def recheck_users(user_ids: Iterable[Any]) -> None:
    """Have every worker re-resolve, at once, what let these accounts' sockets in."""
    ids = list(user_ids)
    _submit(lambda: rechecks.request(account_ids(ids), DEFAULT_DB_ALIAS), DEFAULT_DB_ALIAS)
