"""Announcing writes no signal saw: ``announce`` and ``deleting``.

Raw SQL and writes made by other programs send no model signals (bulk writes through the
ORM announce themselves: ``realtime.writes.querysets``). ``announce`` announces such writes as
the signals would have, after the current transaction commits. A delete is the special case:
who may read a row (its guard's readers, the accounts of its path, readers of a shared root)
can only be asked while the row exists, so ``deleting`` reads the rows and their readers
*before* the block that deletes them, and announces them after it, once the transaction
commits.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from django.db import DEFAULT_DB_ALIAS, connections, models, router, transaction

from realtime.registry import ACTIONS, options_for
from realtime.writes import from_async, on_commit, tracking
from realtime.writes.audiences import prepare_delete
from realtime.writes.events import Event, lacks_columns, read_event, write_queries
from realtime.writes.failsafe import failsafe

logger = logging.getLogger(__name__)


def announce(
    instances: models.Model | Iterable[models.Model],
    action: str,
    *,
    changed: Iterable[str] | None = None,
    using: str | None = None,
) -> None:
    """Announce writes no signal saw (raw SQL, another program) as signals would.

    Published after the current transaction on ``using`` commits (at once outside one);
    ``using`` defaults to the database each instance was read from, else ``"default"``.
    ``changed`` names the fields an ``"updated"`` wrote (default: every concrete field). For
    deletes, prefer ``deleting``: a row already gone has no readers left to ask.

    From async code the announcing (reading the rows, their readers, the event) runs on the
    thread of the caller's transaction, as ``broadcast_*`` does (``realtime.writes.from_async``);
    what fails there (an instance of a model that is no ``@realtime_model`` included) is
    logged, not raised into the caller.
    """
    if action not in ACTIONS:
        raise ValueError(f"action must be one of {', '.join(ACTIONS)}, not {action!r}")
    if from_async.in_async_code():
        aliases = _aliases(instances, using)
        from_async.hand_over(lambda: _logged(instances, action, changed, using), aliases)
    else:
        _announce(instances, action, changed, using)


def _aliases(instances: models.Model | Iterable[models.Model], using: str | None) -> list[str]:
    """The databases whose transaction ``announce`` joins, known without a query (on an event
    loop): ``using``, those the instances were read from, a queryset's; every database for
    any other iterable, which only the work reads."""
    if using is not None:
        return [using]
    if isinstance(instances, models.Model):
        instances = [instances]
    if isinstance(instances, models.QuerySet):
        return [instances.db]
    if isinstance(instances, (list, tuple)):
        read_from = (getattr(getattr(item, "_state", None), "db", None) for item in instances)
        return list(dict.fromkeys(alias or DEFAULT_DB_ALIAS for alias in read_from))
    return list(connections)


def _logged(
    instances: models.Model | Iterable[models.Model],
    action: str,
    changed: Iterable[str] | None,
    using: str | None,
) -> None:
    try:
        _announce(instances, action, changed, using)
    except Exception:
        logger.exception("realtime: announcing failed")


def _announce(
    instances: models.Model | Iterable[models.Model],
    action: str,
    changed: Iterable[str] | None,
    using: str | None,
) -> None:
    if isinstance(instances, models.Model):
        instances = [instances]
    for instance in instances:
        options = options_for(type(instance))
        if options is None:
            raise TypeError(f"{type(instance).__name__} is not a @realtime_model")
        if action not in options.actions:
            continue
        alias = using or instance._state.db or DEFAULT_DB_ALIAS
        event: Event | None
        if action == "deleted":
            event = prepare_delete(options, instance, alias)
        else:
            fields = None
            if action == "updated":
                names = changed if changed is not None else tracking.all_fields(instance)
                fields = tracking.changed_fields(instance, names)
            event = failsafe(
                f"{options.name}:{instance.pk}",
                alias,
                write_queries(options, action) or bool(lacks_columns(options, instance)),
                lambda: read_event(options, instance, action, fields, using=alias),  # noqa: B023
            )
        if event is not None:
            on_commit.add(event, alias)


@contextmanager
def deleting(
    rows: models.QuerySet[models.Model] | Iterable[models.Model], *, using: str | None = None
) -> Iterator[list[models.Model]]:
    """Announce the deletion of ``rows`` made inside the block, readers asked before it::

        with deleting(Contact.objects.filter(company=company)) as doomed:
            Contact.objects.filter(pk__in=[c.pk for c in doomed]).delete()   # or raw SQL

    The block runs in ``transaction.atomic()``; the rows are read (a queryset is evaluated)
    and their events prepared on entry, and handed to the outbox when the block ends without
    an exception, so they are published once the outermost transaction commits. A block that
    raises announces nothing. Yields the rows as instances.
    """
    instances = list(rows)
    if using is None:
        if isinstance(rows, models.QuerySet):
            using = rows.db
        elif instances:
            using = instances[0]._state.db or router.db_for_write(type(instances[0]))
        else:
            using = DEFAULT_DB_ALIAS
    with transaction.atomic(using=using):
        events = []
        for instance in instances:
            options = options_for(type(instance))
            if options is None:
                raise TypeError(f"{type(instance).__name__} is not a @realtime_model")
            if "deleted" in options.actions:
                event = prepare_delete(options, instance, using)
                if event is not None:
                    events.append(event)
        yield instances
        on_commit.add_all(events, using)
