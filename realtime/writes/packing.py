"""Building internal messages after commit: their shapes, and fitting them into a budget.

The shapes are those of ``realtime.messages``. A transport may cap a message
(``Transport.max_message_bytes``). Over the cap, a message first loses its ``data`` (kept:
``{"model", "id"}`` when present, else ``null``) and is marked ``truncated``; still over, it
loses the channels that narrow it and reaches the whole scope. Over-telling beats a silence
nothing recovers from. Account lists are sliced into messages of at most 200 ids, and further
until each message fits.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from realtime import messages
from realtime.chunks import id_chunks
from realtime.encoding import encode, sorted_ids
from realtime.messages import base_channel, new_mid, scope_channel

logger = logging.getLogger(__name__)

Message = dict[str, Any]


def identity(data: Any) -> dict[str, Any] | None:
    """What survives truncation of ``data``: the model and id naming a record, else nothing."""
    if isinstance(data, dict) and "model" in data and "id" in data:
        return {"model": data["model"], "id": data["id"]}
    return None


def fit(message: Message, budget: int | None, *, whole: bool = False) -> bytes | None:
    """Encode ``message``, shrinking it in the two documented steps (``whole``: not at all);
    ``None`` if it cannot fit."""
    encoded = encode(message)
    if budget is None or len(encoded) <= budget:
        return encoded
    if whole or "event_type" not in message:
        return None
    meta = message.get("meta")
    if isinstance(meta, dict) and meta.get("filters"):
        # Live queries' values go first: without them a worker reads its queries' rows
        # again, while every other reader keeps the record whole.
        message["meta"] = {**meta, "filters": None}
        encoded = encode(message)
        if len(encoded) <= budget:
            return encoded
    message["data"] = identity(message.get("data"))
    message["meta"] = {**message.get("meta", {}), "truncated": True}
    encoded = encode(message)
    if len(encoded) <= budget:
        return encoded
    if message.get("target") == messages.SCOPE:
        message["channels"] = None
        encoded = encode(message)
        if len(encoded) <= budget:
            return encoded
    return None


def about_row(name: str, id: Any, using: str | None) -> dict[str, Any]:
    """The ``about`` of a message of a guarded model's row, whose readers the worker decides:
    its model and id, and ``using``, the alias it was written on, where the message names one
    (``messages.named_alias``)."""
    about: dict[str, Any] = {"model": name, "id": id}
    if using is not None:
        about[messages.USING] = using
    return about


def scope_messages(
    scope_id: Any,
    event_type: str,
    data: Any,
    *,
    channels: Sequence[str] | None,
    meta: dict[str, Any],
    exclude: Iterable[Any] | None = None,
    about: dict[str, Any] | None = None,
    only: Sequence[Any] | None = None,
    budget: int | None,
) -> list[tuple[str, bytes]]:
    """Build the messages of one scope event (several when ``only`` names over 200 accounts)."""
    base: Message = {
        "target": messages.SCOPE,
        "scope_id": scope_id,
        "event_type": event_type,
        "data": data,
        "channels": list(channels) if channels is not None else None,
        "meta": meta,
    }
    return _addressed(base, scope_channel(scope_id), exclude, about, only, budget)


def global_messages(
    event_type: str,
    data: Any,
    *,
    channels: Sequence[str],
    meta: dict[str, Any],
    about: dict[str, Any] | None = None,
    only: Sequence[Any] | None = None,
    budget: int | None,
) -> list[tuple[str, bytes]]:
    """Build the messages of one event of a global model: to every signed-in socket
    subscribed to one of ``channels`` (several messages when ``only`` names over 200
    accounts). Its channels are never dropped to fit: they are all that narrows it."""
    base: Message = {
        "target": messages.GLOBAL,
        "event_type": event_type,
        "data": data,
        "channels": list(channels),
        "meta": meta,
    }
    return _addressed(base, base_channel(), None, about, only, budget)


def place_messages(
    is_global: bool,
    scope_id: Any,
    event_type: str,
    data: Any,
    *,
    channels: Sequence[str],
    meta: dict[str, Any],
    about: dict[str, Any] | None = None,
    only: Sequence[Any] | None = None,
    budget: int | None,
) -> list[tuple[str, bytes]]:
    """The messages of a model's event to the place its rows are read in: its scope, or,
    for a global model, every signed-in socket subscribed to its channels."""
    if is_global:
        return global_messages(
            event_type, data, channels=channels, meta=meta, about=about, only=only, budget=budget
        )
    return scope_messages(
        scope_id,
        event_type,
        data,
        channels=channels,
        meta=meta,
        about=about,
        only=only,
        budget=budget,
    )


def _addressed(
    base: Message,
    channel: str,
    exclude: Iterable[Any] | None,
    about: dict[str, Any] | None,
    only: Sequence[Any] | None,
    budget: int | None,
) -> list[tuple[str, bytes]]:
    """The messages of one event on ``channel``, sliced by ``only``, fitted to ``budget``."""
    if about is not None:
        base["about"] = about
    elif only is None and not exclude:
        # The common message (a scope's or every signed-in socket's, no account list): one,
        # unless it must shrink to fit.
        encoded = encode({**base, "mid": new_mid()})
        if budget is None or len(encoded) <= budget:
            return [(channel, encoded)]
    excluded = sorted_ids(exclude or ())
    slices: list[list[Any] | None] = [None] if only is None else list(_id_slices(only))
    out: list[tuple[str, bytes]] = []
    for ids in slices:
        for payload in _fit_with_ids(base, "only", ids, excluded, base["event_type"], budget):
            out.append((channel, payload))
    return out


def users_messages(
    user_ids: Iterable[Any],
    event_type: str,
    data: Any,
    *,
    channels: Sequence[str] | None,
    meta: dict[str, Any],
    skip_scope: Any = None,
    budget: int | None,
    row: bool = False,
    using: str | None = None,
) -> list[tuple[str, bytes]]:
    """Build the messages of one account event: at most 200 ids each, sorted, no duplicates.

    ``row``: a model's event about the row its data names (not an application's own event,
    whatever it looks like): a resume re-decides it by the model's rules (``readers``), on
    ``using``, the alias the row was written on where the message names one
    (``messages.named_alias``)."""
    base: Message = {
        "target": messages.USERS,
        "event_type": event_type,
        "data": data,
        "channels": list(channels) if channels is not None else None,
        "meta": meta,
    }
    if skip_scope is not None:
        base["skip_scope"] = skip_scope
    if row:
        base["row"] = True
        if using is not None:
            base[messages.USING] = using
    out: list[tuple[str, bytes]] = []
    for ids in _id_slices(user_ids):
        for payload in _fit_with_ids(base, "user_ids", ids, [], event_type, budget):
            out.append((base_channel(), payload))
    return out


def recheck_messages(
    user_ids: Iterable[Any], budget: int | None, ended_sessions: Iterable[str] = ()
) -> list[tuple[str, bytes]]:
    """Build the messages asking every worker to recheck the sockets of these accounts, and to
    refuse at once those whose token names one of ``ended_sessions`` (each message carries
    them all; a message without them, an older worker's, asks the recheck alone)."""
    ended = sorted(set(ended_sessions))
    out: list[tuple[str, bytes]] = []
    for ids in _id_slices(user_ids):
        base: Message = {"target": messages.RECHECK}
        if ended:
            base["ended_sessions"] = ended
        out += [
            (base_channel(), payload)
            for payload in _fit_with_ids(base, "user_ids", ids, [], "recheck", budget)
        ]
    return out


def _id_slices(ids: Iterable[Any]) -> Iterable[list[Any]]:
    """The ids sorted, without duplicates, in slices of at most 200."""
    return (list(chunk) for chunk in id_chunks(sorted_ids(ids)))


def _fit_with_ids(
    base: Message,
    key: str,
    ids: list[Any] | None,
    exclude: list[Any],
    event_type: str,
    budget: int | None,
) -> list[bytes]:
    """Fit one message carrying ``ids``, halving the id list until each part fits. An
    ``exclude`` list is a courtesy: kept only while the message fits whole, and dropped
    before its data or channels are."""
    message = {**base, "mid": new_mid()}
    if ids is not None:
        message[key] = ids
    if exclude:
        message["exclude"] = exclude
    payload = fit(dict(message), budget, whole=bool(exclude))
    if payload is not None:
        return [payload]
    if exclude:
        logger.warning(
            "realtime: %s: dropping the exclude list (%d accounts) to fit the transport's budget",
            event_type,
            len(exclude),
        )
        return _fit_with_ids(base, key, ids, [], event_type, budget)
    if ids is not None and len(ids) > 1:
        half = len(ids) // 2
        return [
            *_fit_with_ids(base, key, ids[:half], [], event_type, budget),
            *_fit_with_ids(base, key, ids[half:], [], event_type, budget),
        ]
    logger.error(
        "realtime: %s does not fit the transport's budget even shrunk; dropped", event_type
    )
    return []
