"""An announcement as one row of realtime's outbox: ``dump`` in the write's transaction,
``load`` when it is relayed.

What is written is the *item* — the ``Event`` read in the transaction, a ``Recheck``, a
broadcast's arguments — never its messages: those are built after commit, asking the audiences
as they are then (``realtime.writes.publish``), whether the writer relays its own rows at once
or a worker relays them later. So the round trip must keep everything the building reads:
publishing a loaded item builds exactly the messages the original builds.

The form is compact JSON (``realtime.encoding.encode``), every value in its JSON form, which is
the form messages carry anyway. Values the building hands to application hooks or queries —
a row's key, its scope, its accounts, its shared root — are read back by their model field
(``to_python``), so a hook is given an ``int`` or a ``UUID`` where the write gave one. A
model event names its model by label; its options are those the registry holds for it when
the row is loaded.

A row that cannot be read — written by a version that used another form, its model no longer
decorated, garbled — raises ``UnreadableError``; the relay logs it and drops the row.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from django.apps import apps
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import models

from realtime.encoding import encode, jsonable
from realtime.paths import key_fields, split_path
from realtime.registry import ModelOptions, options_for
from realtime.writes.events import Before, Event
from realtime.writes.items import Recheck, ScopeBroadcast, UsersBroadcast

#: The form of the rows this version writes (and the only one it reads).
FORMAT = 1

Item = Event | Recheck | ScopeBroadcast | UsersBroadcast


class UnreadableError(ValueError):
    """An outbox row that cannot be turned back into an announcement."""


def dump(item: Any) -> bytes:
    """The row of ``item``; ``TypeError`` for an item of no known kind."""
    if isinstance(item, Event):
        body = _dump_event(item)
    elif isinstance(item, Recheck):
        body = {"k": "recheck", "user_ids": item.user_ids}
        if item.ended_sessions:
            body["ended_sessions"] = item.ended_sessions
    elif isinstance(item, ScopeBroadcast):
        body = {
            "k": "scope",
            "scope_id": item.scope_id,
            "event_type": item.event_type,
            "data": item.data,
            "channels": item.channels,
            "meta": item.meta,
            "exclude": item.exclude,
            "about": item.about,
            "only": item.only,
        }
    elif isinstance(item, UsersBroadcast):
        body = {
            "k": "users",
            "user_ids": item.user_ids,
            "event_type": item.event_type,
            "data": item.data,
            "channels": item.channels,
            "meta": item.meta,
            "skip_scope": item.skip_scope,
        }
    else:
        raise TypeError(f"realtime's outbox cannot hold a {type(item).__name__}")
    return encode({"v": FORMAT, **body})


def load(raw: bytes | memoryview) -> Item:
    """The announcement of a row written by ``dump``; ``UnreadableError`` when it cannot be read."""
    try:
        body = json.loads(bytes(raw))
    except ValueError as exc:
        raise UnreadableError(f"not JSON: {exc}") from None
    if not isinstance(body, dict) or body.get("v") != FORMAT:
        raise UnreadableError("written in a form this version does not read")
    try:
        return _load(body)
    except UnreadableError:
        raise
    except (KeyError, TypeError, ValueError, LookupError) as exc:
        raise UnreadableError(f"{type(exc).__name__}: {exc}") from None


def _load(body: dict[str, Any]) -> Item:
    kind = body["k"]
    if kind == "event":
        return _load_event(body)
    if kind == "recheck":
        return Recheck(list(body["user_ids"]), list(body.get("ended_sessions") or ()))
    if kind == "scope":
        about = body["about"]
        return ScopeBroadcast(
            body["scope_id"],
            body["event_type"],
            body["data"],
            channels=body["channels"],
            meta=body["meta"],
            exclude=body["exclude"],
            about=None if about is None else (about[0], about[1]),
            only=body["only"],
        )
    if kind == "users":
        return UsersBroadcast(
            body["user_ids"],
            body["event_type"],
            body["data"],
            channels=body["channels"],
            meta=body["meta"],
            skip_scope=body["skip_scope"],
        )
    raise UnreadableError(f"an announcement of unknown kind {kind!r}")


# Model events ---------------------------------------------------------------------------------


def _dump_event(event: Event) -> dict[str, Any]:
    before = event.before
    return {
        "k": "event",
        "model": event.options.model._meta.label,
        "action": event.action,
        "pk": jsonable(event.pk),
        "data": event.data,
        "channels": event.channels,
        "scope_id": event.scope_id,
        "user_ids": event.user_ids,
        "changed": event.changed,
        "origin": event.origin,
        "readers": event.readers,
        "shared": event.shared,
        "outside": event.outside,
        "folded": event.folded,
        "extra": event.extra,
        "before": None
        if before is None
        else {
            "scope_id": before.scope_id,
            "readers": before.readers,
            "accounts": before.accounts,
            "shared": before.shared,
            "channels": before.channels,
        },
        "accounts": event.accounts,
        "leaves_only": event.leaves_only,
        "order": event.order,
        "links_only": event.links_only,
    }


def _load_event(body: dict[str, Any]) -> Event:
    model = apps.get_model(body["model"])
    options = options_for(model)
    if options is None or options.model is not model:
        raise UnreadableError(f"{body['model']} is not a decorated model")
    extra = dict(body["extra"])
    if "root_pk" in extra:
        extra["root_pk"] = _as_field(_root_field(options), extra["root_pk"])
    before = body["before"]
    user_model = get_user_model()
    user_ids = body["user_ids"]
    return Event(
        options=options,
        action=body["action"],
        pk=_as_key(model, body["pk"]),
        data=body["data"],
        channels=body["channels"],
        scope_id=_as_field(_scope_field(options), body["scope_id"]),
        user_ids=None if user_ids is None else [_as_key(user_model, u) for u in user_ids],
        changed=body["changed"],
        origin=body["origin"],
        readers=body["readers"],
        shared=body["shared"],
        outside=body["outside"],
        folded=bool(body["folded"]),
        extra=extra,
        before=None if before is None else Before(**before),
        accounts=body["accounts"],
        leaves_only=bool(body["leaves_only"]),
        order=body.get("order"),
        links_only=bool(body.get("links_only")),
    )


def _as_key(model: type[models.Model], value: Any) -> Any:
    """A primary key of ``model`` from its JSON form (a composite key: a tuple)."""
    parts = key_fields(model)
    if isinstance(value, list) and len(parts) > 1:
        return tuple(_as_field(part, v) for part, v in zip(parts, value, strict=True))
    return _as_field(model._meta.pk, value)


def _as_field(field: Any, value: Any) -> Any:
    """``value`` read by ``field`` (kept as it is when there is no field or it cannot)."""
    if value is None or field is None:
        return value
    with contextlib.suppress(ValidationError, TypeError, ValueError):
        return field.to_python(value)
    return value


def _scope_field(options: ModelOptions) -> Any:
    if options.scope_attname is None:
        return None
    return options.model._meta.get_field(options.scope_attname)


def _root_field(options: ModelOptions) -> Any:
    if not options.shared_via:
        return None
    return options.model._meta.get_field(split_path(options.shared_via)[0])
