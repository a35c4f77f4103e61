"""In the write's transaction: turn one write into an ``Event``, never failing the write.

Preparation reads only what the write left on the instance, plus at most one bounded query per
to-many relation or multi-hop account path. Inside a transaction such queries run in a
savepoint, so that a failure cannot poison the write's transaction (on PostgreSQL a failed
statement aborts everything after it). Nothing raised while preparing reaches the write: it is
logged and the announcement is dropped.

A delete is prepared while the row and its links still exist: its scope or accounts, and for
guarded, shared and outside readers, who may read it, asked now because afterwards there is
nothing left to ask about.
"""

from __future__ import annotations

from typing import Any

from django.db import models

from realtime.auth import RealtimeAuth, get_auth
from realtime.registry import ModelOptions
from realtime.writes.audiences import (
    guarded_readers,
    outside_recipients,
    recipients,
    shared_readers,
)
from realtime.writes.events import Event, read_event
from realtime.writes.failsafe import failsafe

#: Hooks whose default answers a delete's preparation reads without a query.
DELETE_HOOKS = ("recipients", "outside_recipients", "audience", "shared_readers")


def prepare_write(
    options: ModelOptions,
    instance: models.Model,
    action: str,
    changed: list[str] | None,
    using: str,
    *,
    scopeless: bool = False,
    to_many: dict[str, list[Any]] | None = None,
) -> Event | None:
    """The event of a create or an update, read in the write's transaction (``scopeless``:
    also when the row is in no scope, for an update that may have taken it out of one;
    ``to_many``: its to-many relations' targets, read already for many rows at once). Run by
    a caller that never fails the write (``realtime.writes.failsafe``)."""
    return read_event(
        options,
        instance,
        action,
        changed,
        scopeless=scopeless,
        to_many=to_many,
        using=using,
    )


def write_queries(options: ModelOptions, action: str, to_many: bool = False) -> bool:
    """Whether reading the event of a create or an update may query (``to_many``: its
    to-many targets are read already)."""
    if action == "created":
        return options.create_queries
    return options.queries_besides_to_many if to_many else options.write_queries


def prepare_delete(options: ModelOptions, instance: models.Model, using: str) -> Event | None:
    """The event of a delete and its audiences, read while the row still exists; never
    failing the delete."""
    return failsafe(
        f"{options.name}:{instance.pk}",
        using,
        delete_queries(options),
        lambda: delete_event(options, instance, using),
    )


def delete_queries(options: ModelOptions) -> bool:
    """Whether preparing a delete may query: the model's own reads, or an auth hook the
    application overrode (the defaults of the hooks asked here do not query)."""
    auth = type(get_auth())
    overridden = any(
        getattr(auth, hook) is not getattr(RealtimeAuth, hook) for hook in DELETE_HOOKS
    )
    return options.delete_queries or overridden


def delete_event(
    options: ModelOptions, instance: models.Model, using: str | None = None
) -> Event | None:
    """Read a deletion's event and decide its audiences while the row still exists."""
    event = read_event(options, instance, "deleted", using=using)
    if event is None:
        return None
    if options.user_field is not None:
        event.readers = recipients(event)
        return event
    db = using or instance._state.db or "default"
    if options.guard is not None:
        event.readers = guarded_readers(event, db)
    if options.shared_via is not None:
        event.shared = shared_readers(event, db)
    if not options.is_global:
        event.outside = outside_recipients(event)
    return event
