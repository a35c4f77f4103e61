"""From committed announcements to transport messages: coalescing, audiences, one publish.

Runs after commit (from the outbox). Several events of one row in one transaction become one:
created+updated is a ``created``, updated+updated one ``updated`` whose ``changed`` is the
union, anything+deleted a ``deleted``, created+deleted nothing; the event sits at its last
write. Audience hooks that are asked after commit are asked here; a hook that fails costs its
own event (``recipients``) or only the extra messages (``shared_readers``,
``outside_recipients``), never the others.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from realtime.audience import readers
from realtime.auth import get_auth, member_ids
from realtime.events import Event
from realtime.payload import recheck_messages, scope_messages, sorted_ids, users_messages
from realtime.transports import get_transport

logger = logging.getLogger(__name__)


@dataclass
class Recheck:
    """A request that every worker recheck the sockets of these accounts."""

    user_ids: list[Any]

    def messages(self, budget: int | None) -> list[tuple[str, bytes]]:
        return recheck_messages(self.user_ids, budget)


def publish_announcements(items: Iterable[Any]) -> None:
    """Publish committed announcements in one transport call, in write order."""
    transport = get_transport()
    budget = transport.max_message_bytes
    messages: list[tuple[str, bytes]] = []
    rechecks: set[Any] = set()
    for item in coalesce(items):
        if isinstance(item, Recheck):
            rechecks.update(item.user_ids)
            continue
        try:
            messages += item.messages(budget)
        except Exception:
            logger.exception("realtime: preparing %s failed; it is not announced", _label(item))
    if rechecks:
        messages += recheck_messages(rechecks, budget)
    if messages:
        transport.publish(messages)


def _label(item: Any) -> str:
    return item.event_type if isinstance(item, Event) else type(item).__name__


def coalesce(items: Iterable[Any]) -> list[Any]:
    """Merge the events of one row (see the module docstring); other items pass through."""
    result: list[Any] = []
    position: dict[tuple[str, Any], int] = {}
    for item in items:
        if not isinstance(item, Event) or item.folded:
            result.append(item)
            continue
        earlier = position.pop(item.key, None)
        if earlier is not None:
            merged = _merge(result[earlier], item)
            result[earlier] = None
            if merged is None:
                continue
            item = merged
        position[item.key] = len(result)
        result.append(item)
    return [item for item in result if item is not None]


def _merge(first: Event, then: Event) -> Event | None:
    if then.action == "deleted":
        return None if first.action == "created" else then
    if first.action == "created":
        return replace(then, action="created", changed=None)
    if first.action == "updated" and then.action == "updated":
        changed = sorted({*(first.changed or ()), *(then.changed or ())})
        return replace(then, changed=changed)
    return then


def event_messages(event: Event, budget: int | None) -> list[tuple[str, bytes]]:
    """The messages of one model event: to its scope (and beyond), or to its accounts."""
    options = event.options
    data = None if event.folded else event.data
    common: dict[str, Any] = {
        "channels": event.channels,
        "meta": event.meta(),
        "budget": budget,
    }
    if options.user_field is not None:
        accounts = event.readers
        if accounts is None:
            accounts = recipients(event)
        return users_messages(accounts, event.event_type, data, **common)
    out: list[tuple[str, bytes]] = []
    if options.guard is not None and not event.folded and event.readers is not None:
        if event.readers:
            out += scope_messages(
                event.scope_id, event.event_type, data, only=event.readers, **common
            )
    elif options.guard is not None and not event.folded:
        about = {"model": options.name, "id": event.data["id"]}
        out += scope_messages(event.scope_id, event.event_type, data, about=about, **common)
    else:
        out += scope_messages(event.scope_id, event.event_type, data, **common)
    if event.folded:
        return out
    shared = event.shared if event.shared is not None else shared_readers(event)
    if shared:
        out += users_messages(shared, event.event_type, data, **common)
    outside = event.outside if event.outside is not None else outside_recipients(event)
    outside = [account for account in outside if account not in set(shared or ())]
    if outside:
        out += users_messages(outside, event.event_type, data, skip_scope=event.scope_id, **common)
    return out


def recipients(event: Event) -> list[Any]:
    """Ask ``auth.recipients``; when it fails, the event reaches nobody."""
    try:
        return list(get_auth().recipients(event.event_type, event.data, list(event.user_ids or ())))
    except Exception:
        logger.exception(
            "realtime: recipients() failed for %s; it reaches nobody", event.event_type
        )
        return []


def shared_readers(event: Event) -> list[Any]:
    """Readers of the event's shared root outside its scope (guard-checked); [] on failure."""
    options = event.options
    if options.shared_via is None:
        return []
    try:
        root = load_root(event)
        if root is None:
            return []
        found = set(get_auth().shared_readers(root, event.scope_id))
        found -= set(member_ids(event.scope_id))
        if found and options.guard is not None:
            found = set(readers(options, event.pk, found))
        return sorted_ids(found)
    except Exception:
        logger.exception("realtime: shared_readers() failed for %s", event.event_type)
        return []


def load_root(event: Event) -> Any:
    """The record ``shared_via`` points at, read from the database."""
    from realtime.paths import path_target, to_lookup

    options = event.options
    path = options.shared_via or ""
    target = path_target(options.model, path)
    if target is None:
        return None
    root_pk = event.extra.get("root_pk")
    if root_pk is None:
        root_pk = (
            options.model._base_manager.filter(pk=event.pk)
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
