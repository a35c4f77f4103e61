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

A row the relayed transaction wrote more than once is decided by its last announcement there:
the earlier ones pass as written when it stands (re-read, or a delete), and go with it when it
does not. Coalescing (``realtime.writes.publish``) then merges them into the last, which keeps
what only the first knew: who could read the row before the transaction. A transaction that
moved a row and then deleted it so tells the readers the move took it from that it went.

"Differ" is judged as each field reads the values (``to_python``), not by their JSON forms:
the announcement holds what the writer's instance held, which need not be the form the
database gives back — ``Decimal("9.9")`` in a field of two places is stored ``9.90``, ``10``
comes back ``10.00``, a foreign key set from a form's text ``"5"`` comes back ``5``, a naive
datetime is stored in the default time zone. Taken for a later write, such a row would be
announced by nobody. A decimal given more places than its field keeps is rounded by the
database, each its own way: it is the same if it lies within half a unit of the last place
kept. A value its field cannot read is compared as it is.
"""

from __future__ import annotations

import datetime
import decimal
import logging
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

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
    return _with_earlier(items, out)


def _with_earlier(items: Sequence[Any], decided: list[Any | None]) -> list[Any | None]:
    """``decided`` (``items`` each read again) with the earlier announcements of each row
    the relay announces more than once settled by its last: as written where it stands (a
    delete, or the row read again), dropped with it where it does not."""
    last: dict[Any, int] = {}
    for at, item in enumerate(items):
        if _rereadable(item) or _deleted(item):
            last[item.key] = at
    out = list(decided)
    for at, item in enumerate(items):
        if not _rereadable(item):
            continue
        final = last[item.key]
        if final != at:
            out[at] = item if decided[final] is not None else None
    return out


def _deleted(item: Any) -> bool:
    return (
        isinstance(item, Event)
        and item.action == "deleted"
        and not item.folded
        and item.accounts is None
    )


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
    if fresh is None or (not item.links_only and _written_since(item, fresh)):
        return None
    if item.links_only:  # its data may be older than the row: readers hear its identity
        fresh.links_only, fresh.values = True, None
    fresh.origin = item.origin
    fresh.before = item.before
    fresh.order = item.order
    return fresh


def _written_since(item: Event, fresh: Event) -> bool:
    """Whether the row read again differs from what ``item`` says of it: in a declared field
    or its scope (what the application's own ``payload=`` adds may change without a write),
    each compared as its field reads it."""
    options = item.options
    meta = options.model._meta
    scope = meta.get_field(options.scope_attname) if options.scope_attname else None
    if not _same(scope, fresh.scope_id, item.scope_id):
        return True
    return any(
        not _same(meta.get_field(attname), fresh.data.get(wire), item.data.get(wire))
        for wire, attname in options.field_attnames.items()
    )


def _same(field: Any, stored: Any, written: Any) -> bool:
    """Whether ``written`` (as the writer held it) is the value ``stored`` as ``field`` reads
    both."""
    if stored == written:
        return True
    if field is None or stored is None or written is None:
        return False
    stored, written = _read(field, stored), _read(field, written)
    if isinstance(field, models.DecimalField) and all(
        isinstance(value, decimal.Decimal) for value in (stored, written)
    ):
        places = field.decimal_places
        if places is not None and written.is_finite() and stored.is_finite():
            return bool(abs(stored - written) <= decimal.Decimal(5).scaleb(-places - 1))
    return bool(stored == written)


def _read(field: Any, value: Any) -> Any:
    """``value`` as ``field`` reads it, a naive datetime in the default time zone as Django
    stores it (``value`` itself when the field cannot read it)."""
    try:
        value = field.to_python(value)
    except Exception:
        return value
    if isinstance(value, datetime.datetime) and settings.USE_TZ and timezone.is_naive(value):
        try:
            return timezone.make_aware(value, timezone.get_default_timezone())
        except Exception:
            return value
    return value
