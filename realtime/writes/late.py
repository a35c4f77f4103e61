"""A late relay never tells a record as it was before a newer write of it.

A sweeper relays the rows a writer left in the outbox (``realtime.writes.relay``): its publish
failed (Redis away), or it died first. Meanwhile the same records may have been written
again, and those later writes published at once: relayed as written, the old announcement
would reach sockets after the new one, and leave them showing an older version of a record,
or a row that is gone. So before a late relay is built, each created or updated row it
announces is read again (one query per model, on the database the rows came from). A row
written since (its declared fields or its scope differ) is not announced: the newer write's
own announcement tells it, with a greater order (``realtime.writes.order``), whether it was
published already or waits in the outbox too. A row gone since is not announced either: its
delete was, or will be. A row as it was written is announced as it is now, its channels,
accounts and readers taken afresh (the audience is asked after commit, as for every
publish); ``before`` and the order are kept. Deletes, account moves, folded bulk events and
announcements that are not a model's pass as written.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from django.db import models

from realtime.encoding import row_key
from realtime.logs import log_hook_failure
from realtime.readers import rows_by_key
from realtime.writes.events import Event, read_event

logger = logging.getLogger(__name__)


def as_now(items: Sequence[Any], using: str) -> list[Any | None]:
    """``items`` (announcements loaded from the outbox of ``using``) with each created or
    updated row read again: announced as it is now, or not at all (``None`` in its place)
    if it is gone or was written since."""
    wanted: dict[type[models.Model], set[Any]] = {}
    for item in items:
        if _rereadable(item):
            wanted.setdefault(item.options.model, set()).add(row_key(item.pk))
    now: dict[tuple[type[models.Model], Any], models.Model] = {}
    unread: set[type[models.Model]] = set()
    for model, keys in wanted.items():
        try:
            now.update(((model, key), row) for key, row in rows_by_key(model, keys, using).items())
        except Exception as exc:
            # Relayed as written (late, as before) rather than not at all.
            unread.add(model)
            log_hook_failure(logger, "realtime: reading %s rows again to relay failed", exc, model)
    out: list[Any | None] = []
    for item in items:
        if not _rereadable(item) or item.options.model in unread:
            out.append(item)
            continue
        row = now.get((item.options.model, row_key(item.pk)))
        # A row gone since is not announced: its delete tells the rest.
        out.append(None if row is None else _fresh(item, row, using))
    return out


def _rereadable(item: Any) -> bool:
    return (
        isinstance(item, Event)
        and item.action in ("created", "updated")
        and not item.folded
        and item.accounts is None
    )


def _fresh(item: Event, row: models.Model, using: str) -> Event | None:
    """The event ``item`` announces, read from ``row`` as it is now; ``None`` if the row was
    written since (or announces nothing now)."""
    fresh = read_event(
        item.options,
        row,
        item.action,
        item.changed,
        scopeless=item.before is not None,
        using=using,
    )
    if fresh is None or _written_since(item, fresh):
        return None
    fresh.origin = item.origin
    fresh.before = item.before
    fresh.order = item.order
    return fresh


def _written_since(item: Event, fresh: Event) -> bool:
    """Whether the row read again differs from what ``item`` says of it: in a declared field
    or its scope (what the application's own ``payload=`` adds may change without a write)."""
    declared = item.options.fields
    return fresh.scope_id != item.scope_id or any(
        fresh.data.get(wire) != item.data.get(wire) for wire in declared
    )
