"""Who hears a row's account events, asked of the row as it is now.

An account event of a model — to the accounts its ``user_field`` path reaches, to the shared
readers of its root, to its scope's outside recipients, or an enter frame of a view — goes to
the accounts the write side decides after commit. A socket that resumes is replayed such an
event only if its account would still be among them if the event were published now
(``readers_now``): an account removed from a thread while away is not replayed the thread's
messages. Which row an event is about is read from the event itself (``row_of``): a model's
account event is marked so (``row``: an application's own event that looks like one is
replayed as sent), and its data names its model and id; the row is read on the database it
was written on (``realtime.messages.row_alias``). A delete goes to those who had the
row when it was deleted, as published — the row is gone, so who may read it now cannot be
asked — but replayed with the model and id alone (``replayed_data``), as a view's leave
frame is: an account that lost the row's path since is told the row is gone, not what it
held. Both sides ask the same hooks here, so the rule is written once.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, NamedTuple

from django.db import models

from realtime.audience import readers
from realtime.auth import account_ids, get_auth, member_ids
from realtime.chunks import id_chunks
from realtime.encoding import normal_id, row_key, sorted_ids
from realtime.logs import log_hook_failure
from realtime.messages import row_alias
from realtime.paths import key_lookup, path_target, values_on_path
from realtime.primary import on_primary
from realtime.registry import ModelOptions, options_named

logger = logging.getLogger(__name__)


class Row(NamedTuple):
    """The row an account message tells of: its decorated model, its key, and the alias it
    lives on (``None``: where the model's writes go)."""

    options: ModelOptions
    pk: Any
    using: str | None = None


def row_of(message: dict[str, Any]) -> Row | None:
    """The row an account message tells of a change to (a model's ``<model>.created`` or
    ``<model>.updated``, whose data names the row's ``model`` and ``id``), on the alias the
    message says it was written on (``row_alias``); ``None`` for any other — a delete, which
    goes to those who had the row, or an application's own event."""
    data, event_type = message.get("data"), message.get("event_type")
    if message.get("row") is not True or not isinstance(data, dict):
        return None
    name = data.get("model")
    if event_type not in (f"{name}.created", f"{name}.updated") or "id" not in data:
        return None
    options = options_named(str(name))
    if options is None:
        return None
    return Row(options, data["id"], row_alias(options.model, message))


def replayed_data(message: dict[str, Any]) -> Any:
    """The data a replayed account message carries: a model's delete, its model and id
    alone (see the module docstring); any other, its data as published."""
    data, event_type = message.get("data"), message.get("event_type")
    if message.get("row") is not True or not isinstance(data, dict):
        return data
    name = data.get("model")
    if event_type != f"{name}.deleted" or "id" not in data:
        return data
    return {"model": name, "id": data["id"]}


def readers_now(row: Row, event_type: Any, data: Any, user_ids: Iterable[Any]) -> list[Any]:
    """Of ``user_ids``, those an account event about ``row`` (see ``row_of``) would reach if
    it were published now: none when the row is gone or a hook fails (logged)."""
    return readers_now_many([(row, event_type, data, list(user_ids))])[0]


#: ``readers_now``'s arguments: the row, the event's type and data, the accounts asked.
Ask = tuple[Row, Any, Any, list[Any]]

#: Where rows are read: a model, on an alias (``None``: where its writes go).
Place = tuple[type[models.Model], str | None]


def readers_now_many(asks: Sequence[Ask]) -> list[list[Any]]:
    """``readers_now`` of each ask, the rows of one model on one database loaded in one
    query: a resume decides a page of replayed account events at once."""
    wanted: dict[Place, set[Any]] = {}
    for row, _, _, user_ids in asks:
        if user_ids:
            wanted.setdefault((row.options.model, row.using), set()).add(row_key(row.pk))
    loaded: dict[tuple[Place, Any], models.Model] = {}
    failed: set[Place] = set()
    for place, keys in wanted.items():
        model, using = place
        try:
            found = rows_by_key(model, keys, using)
        except Exception as exc:
            failed.add(place)
            log_hook_failure(logger, "realtime: reading %s rows to replay failed", exc, model)
            continue
        loaded.update(((place, key), instance) for key, instance in found.items())
    answers: list[list[Any]] = []
    for row, event_type, data, user_ids in asks:
        place = (row.options.model, row.using)
        instance = loaded.get((place, row_key(row.pk)))
        if not user_ids or instance is None or place in failed:
            answers.append([])
        else:
            answers.append(_readers_of(row, instance, event_type, data, user_ids))
    return answers


def rows_by_key(
    model: type[models.Model], keys: Collection[Any], using: str | None = None
) -> dict[Any, models.Model]:
    """The rows of ``model`` with these keys (``row_key`` forms) that still exist, by key:
    one query per ``MAX_IDS_PER_MESSAGE`` keys, through the base manager (``using``, else
    where its writes go)."""
    found: dict[Any, models.Model] = {}
    manager = on_primary(model, using, base=True)
    for chunk in id_chunks(list(keys)):
        for row in manager.filter(pk__in=chunk):
            found[row_key(row.pk)] = row
    return found


def _readers_of(
    row: Row, instance: Any, event_type: Any, data: Any, user_ids: Iterable[Any]
) -> list[Any]:
    options, using = row.options, row.using
    candidates = {normal_id(user_id) for user_id in user_ids}
    try:
        auth = get_auth()
        if options.user_field is not None:
            reached = values_on_path(instance, options.user_field, using)
            now = set(account_ids(auth.recipients(event_type, data, reached)))
        else:
            scope_id = getattr(instance, options.scope_attname or "", None)
            shared = shared_readers_of(
                options,
                instance.pk,
                scope_id,
                None,
                event_type,
                "it is not replayed to them",
                using,
            )
            now = set(shared or ())
            if scope_id is not None:
                now.update(account_ids(auth.outside_recipients(scope_id, event_type, data)))
    except Exception as exc:
        log_hook_failure(logger, "realtime: deciding who may still read %s failed", exc, event_type)
        return []
    return sorted_ids(candidates & {normal_id(user_id) for user_id in now})


def shared_readers_of(
    options: ModelOptions,
    pk: Any,
    scope_id: Any,
    root_pk: Any,
    what: str,
    failing: str,
    using: str | None = None,
    guarded: bool = True,
) -> list[Any] | None:
    """Readers of a row's shared root outside ``scope_id`` (guard-checked, unless not
    ``guarded``: for an event that names no row); ``None`` when asking fails, logged once
    with its traceback and ``failing`` (what the failure costs).

    ``root_pk`` names the root when the instance held it; else it is read from the row.
    """
    if options.shared_via is None:
        return []
    try:
        memo = _shared_memo.get()
        key = (options.model, normal_id(root_pk), normal_id(scope_id), using)
        if memo is not None and root_pk is not None and key in memo:
            found = set(memo[key])
        else:
            root = load_root(options, pk, root_pk, using)
            if root is None:
                return []
            found = set(account_ids(get_auth().shared_readers(root, scope_id)))
            found -= members_of(scope_id, using)
            if memo is not None and root_pk is not None:
                memo[key] = frozenset(found)
        if found and guarded and options.guard is not None:
            found = set(readers(options, pk, found, using=using))
        return sorted_ids(found)
    except Exception as exc:
        log_hook_failure(logger, "realtime: shared_readers() failed for %s; %s", exc, what, failing)
        return None


#: The readers of shared roots outside their scopes asked while a publication is built, by
#: model, root, scope and alias, and scopes' members (``shared_readers_once``); ``None``
#: outside one.
_shared_memo: ContextVar[dict[Any, frozenset[Any]] | None] = ContextVar(
    "realtime_shared_memo", default=None
)


@contextmanager
def shared_readers_once() -> Iterator[None]:
    """Within the block, each shared root's readers outside a scope are asked once: the rows
    of a bulk write that share a root (a project's tasks) cost its reads (the root, the
    application's ``shared_readers``, the scope's members) once, not once per row. What a
    guard admits of them is still asked per row."""
    token = _shared_memo.set({})
    try:
        yield
    finally:
        _shared_memo.reset(token)


def members_of(scope_id: Any, using: str | None = None) -> frozenset[Any]:
    """The ids of a scope's members (``normal_id``); read once per scope within
    ``shared_readers_once``."""
    memo = _shared_memo.get()
    key = ("members", normal_id(scope_id), using)
    if memo is not None and key in memo:
        return memo[key]
    found = frozenset(sorted_ids(member_ids(scope_id, using)))
    if memo is not None:
        memo[key] = found
    return found


def load_root(options: ModelOptions, pk: Any, root_pk: Any = None, using: str | None = None) -> Any:
    """The record ``shared_via`` points at, read from the database (``using``, else where
    its writes go)."""
    path = options.shared_via or ""
    target = path_target(options.model, path)
    if target is None:
        return None
    if root_pk is None:
        root_pk = (
            on_primary(options.model, using, base=True)
            .filter(pk=pk)
            .values_list(key_lookup(options.model, path), flat=True)
            .first()
        )
    if root_pk is None:
        return None
    return on_primary(target, using, base=True).filter(pk=root_pk).first()
