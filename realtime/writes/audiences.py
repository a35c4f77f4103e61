"""Who hears a model event beyond its scope's sockets: the write side's audience questions.

Asked in the write's transaction for a delete (the row and its links are about to go) and
after commit for the rest. Each answer comes from a ``RealtimeAuth`` hook; a hook that fails
costs its own answer, logged, never the write and never the other messages of the event:
``recipients`` failing means the account event reaches nobody, ``shared_readers`` or
``outside_recipients`` failing means only those extra messages are not sent. Where a failure
must not pass for an empty answer (who leaves a view, ``realtime.writes.views``), the
``*_or_none`` forms answer ``None`` instead: undecided, never "nobody". What a hook raises is
logged at ERROR with its traceback, limited per hook (``realtime.logs``); the ids a hook
answers are read by the user model's primary key field (``realtime.auth.account_ids``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from realtime.audience import readers
from realtime.auth import account_ids, get_auth, overridden, readers_pool
from realtime.logs import log_hook_failure
from realtime.readers import shared_readers_of
from realtime.writes.events import Event

logger = logging.getLogger(__name__)


def recipients(event: Event) -> list[Any]:
    """Ask ``auth.recipients``; when it fails, the event reaches nobody."""
    return recipients_or_none(event) or []


def recipients_or_none(
    event: Event, accounts: Iterable[Any] | None = None, failing: str = "it reaches nobody"
) -> list[Any] | None:
    """``auth.recipients`` asked about ``accounts`` (by default the event's); ``None`` when
    it raises, logged once with its traceback and ``failing`` (what the failure costs)."""
    if accounts is None:
        accounts = event.user_ids or ()
    try:
        return account_ids(get_auth().recipients(event.event_type, event.data, list(accounts)))
    except Exception as exc:
        log_hook_failure(
            logger, "realtime: recipients() failed for %s; %s", exc, event.event_type, failing
        )
        return None


def guarded_readers(event: Event, using: str) -> list[Any]:
    """The accounts who may read a guarded row (its scope's members; every active account,
    for a global model), asked through ``auth.audience`` — or, when the application keeps
    Django's default, asked of the guard on ``using``, in the write's transaction."""
    about = {"model": event.options.name, "id": event.data["id"]}
    pool = readers_pool(event.options, event.scope_id, using)
    auth = get_auth()
    if not overridden(auth, "audience"):
        return readers(event.options, event.pk, pool, active_only=True, using=using)
    return list(auth.audience(event.scope_id, event.event_type, event.data, pool, about))


def shared_readers(event: Event, using: str | None = None) -> list[Any]:
    """Readers of the event's shared root outside its scope (guard-checked); [] on failure."""
    return shared_readers_or_none(event, "they hear nothing of it", using) or []


def shared_readers_or_none(
    event: Event, failing: str, using: str | None = None
) -> list[Any] | None:
    """``shared_readers`` of the event; ``None`` on failure (see ``shared_readers_of``)."""
    return shared_readers_of(
        event.options,
        event.pk,
        event.scope_id,
        event.extra.get("root_pk"),
        event.event_type,
        failing,
        using,
    )


def outside_recipients(event: Event) -> list[Any]:
    """Ask ``auth.outside_recipients``; when it fails, log: the scope event still goes."""
    try:
        return account_ids(
            get_auth().outside_recipients(event.scope_id, event.event_type, event.data)
        )
    except Exception as exc:
        log_hook_failure(
            logger, "realtime: outside_recipients() failed for %s", exc, event.event_type
        )
        return []
