"""Who hears a model event beyond its scope's sockets: the write side's audience questions.

Asked in the write's transaction for a delete (the row and its links are about to go) and
after commit for the rest. Each answer comes from a ``RealtimeAuth`` hook; a hook that fails
costs its own answer, logged, never the write and never the other messages of the event:
``recipients`` failing means the account event reaches nobody, ``shared_readers`` or
``outside_recipients`` failing means only those extra messages are not sent.
"""

from __future__ import annotations

import logging
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
    try:
        return list(get_auth().recipients(event.event_type, event.data, list(event.user_ids or ())))
    except Exception:
        logger.exception(
            "realtime: recipients() failed for %s; it reaches nobody", event.event_type
        )
        return []


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
    return shared_readers_of(
        event.options, event.pk, event.scope_id, event.extra.get("root_pk"), event.event_type
    )


def shared_readers_of(
    options: ModelOptions, pk: Any, scope_id: Any, root_pk: Any, what: str
) -> list[Any]:
    """Readers of a row's shared root outside ``scope_id`` (guard-checked); [] on failure.

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
        logger.exception("realtime: shared_readers() failed for %s", what)
        return []


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
