"""Who hears a model event beyond its scope's sockets: the write side's audience questions.

Asked in the write's transaction for a delete (the row and its links are about to go) and
after commit for the rest. Each answer comes from a ``RealtimeAuth`` hook; a hook that fails
costs its own answer, logged, never the write and never the other messages of the event:
``recipients`` failing means the account event reaches nobody, ``shared_readers`` or
``outside_recipients`` failing means only those extra messages are not sent. Where a failure
must not pass for an empty answer (who leaves a view, ``realtime.writes.views``), the
``*_or_none`` forms answer ``None`` instead: undecided, never "nobody".
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from realtime.audience import readers
from realtime.auth import get_auth, member_ids
from realtime.encoding import sorted_ids
from realtime.paths import path_target, to_lookup
from realtime.registry import ModelOptions
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
        return list(get_auth().recipients(event.event_type, event.data, list(accounts)))
    except Exception:
        logger.exception("realtime: recipients() failed for %s; %s", event.event_type, failing)
        return None


def guarded_readers(event: Event) -> list[Any]:
    """The scope's members who may read a guarded row, asked through ``auth.audience``."""
    about = {"model": event.options.name, "id": event.data["id"]}
    return list(
        get_auth().audience(
            event.scope_id, event.event_type, event.data, member_ids(event.scope_id), about
        )
    )


def shared_readers(event: Event) -> list[Any]:
    """Readers of the event's shared root outside its scope (guard-checked); [] on failure."""
    return shared_readers_or_none(event, "they hear nothing of it") or []


def shared_readers_or_none(event: Event, failing: str) -> list[Any] | None:
    """``shared_readers`` of the event; ``None`` on failure (see ``shared_readers_of``)."""
    return shared_readers_of(
        event.options,
        event.pk,
        event.scope_id,
        event.extra.get("root_pk"),
        event.event_type,
        failing,
    )


def shared_readers_of(
    options: ModelOptions, pk: Any, scope_id: Any, root_pk: Any, what: str, failing: str
) -> list[Any] | None:
    """Readers of a row's shared root outside ``scope_id`` (guard-checked); ``None`` when
    asking fails, logged once with its traceback and ``failing`` (what the failure costs).

    ``root_pk`` names the root when the instance held it; else it is read from the row.
    """
    if options.shared_via is None:
        return []
    try:
        root = load_root(options, pk, root_pk)
        if root is None:
            return []
        found = set(get_auth().shared_readers(root, scope_id))
        found -= set(member_ids(scope_id))
        if found and options.guard is not None:
            found = set(readers(options, pk, found))
        return sorted_ids(found)
    except Exception:
        logger.exception("realtime: shared_readers() failed for %s; %s", what, failing)
        return None


def load_root(options: ModelOptions, pk: Any, root_pk: Any = None) -> Any:
    """The record ``shared_via`` points at, read from the database."""
    path = options.shared_via or ""
    target = path_target(options.model, path)
    if target is None:
        return None
    if root_pk is None:
        root_pk = (
            options.model._base_manager.filter(pk=pk)
            .values_list(to_lookup(path), flat=True)
            .first()
        )
    if root_pk is None:
        return None
    return target._base_manager.filter(pk=root_pk).first()


def outside_recipients(event: Event) -> list[Any]:
    """Ask ``auth.outside_recipients``; when it fails, log: the scope event still goes."""
    try:
        return list(get_auth().outside_recipients(event.scope_id, event.event_type, event.data))
    except Exception:
        logger.exception("realtime: outside_recipients() failed for %s", event.event_type)
        return []
