"""A model's ``payload=``: ``data`` keys of the application's own, read in the write's transaction.

The callable is given the instance as its announcement reads it (after a save, the row as
written; in ``pre_delete``, the row about to go; after a bulk ``update()``, the row read again)
and returns a dict whose keys follow the declared fields in ``data``. Its values take the JSON
forms declared fields take (``strict_jsonable``: ISO dates, ``Decimal`` and ``UUID`` as text).

It is application code, so whatever goes wrong with it — it raises, it returns something that
is not a dict, a value with no JSON form, or a key ``data`` already holds (``model``, ``id``, a
declared field: overwriting one would send a record that lies about itself) — costs that
write's record, never the write and never a removal: one ERROR line with the traceback, within
the budget of the model's place (``log_hook_failure``). A delete is still announced, with its
declared fields alone; an update that takes the row from readers still tells them (their
frame carries its identity alone); nobody else hears of that write (``events.read_event``).

Its queries are its own cost: a callable that queries does so once per row of a bulk write.
On PostgreSQL a failed statement aborts the transaction it runs in, so there, inside a
transaction, the callable's first query opens a savepoint
(``failsafe.savepoint_from_first_query``), rolled back if the callable fails or one of its
statements did (a callable may catch its own database error: what it returns is then
announced). A callable that does not query costs no statement at all, however many rows a
bulk write announces; SQLite and MySQL go on after a failed statement, and take no savepoint.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from django.db import models, router

from realtime.encoding import jsonable, strict_jsonable
from realtime.logs import log_hook_failure
from realtime.registry import ModelOptions
from realtime.writes.failsafe import savepoint_from_first_query

logger = logging.getLogger(__name__)


#: What a failure costs the announcement of each action (``events.read_event`` acts on it).
_COSTS = {
    "deleted": "the delete of %s:%s is announced without its keys",
    "created": "%s:%s is not announced",
}
_UPDATE_COST = "%s:%s is not announced, but to the readers it leaves"


def add_payload(
    options: ModelOptions,
    instance: models.Model,
    action: str,
    data: dict[str, Any],
    using: str | None,
) -> bool:
    """Add the keys ``options.payload`` gives for ``instance`` to ``data``; ``False`` when it
    failed (logged, with what the failure costs the announcement of ``action``)."""
    hook = options.payload
    if hook is None:
        return True
    try:
        found = _call(hook, instance, using or _alias(instance))
        if not isinstance(found, Mapping):
            raise TypeError(f"payload= returned a {type(found).__name__}, not a dict")
        extra = strict_jsonable(dict(found))
        clash = sorted(set(extra) & set(data))
        if clash:
            raise ValueError(f"payload= returned keys data already holds: {', '.join(clash)}")
    except Exception as error:
        log_hook_failure(
            logger,
            "realtime: payload= of %s failed; "
            + _COSTS.get(action, _UPDATE_COST)
            + " (the write stands)",
            error,
            options.name,
            options.name,
            jsonable(instance.pk),
            place=options.name,
        )
        return False
    data.update(extra)
    return True


def _alias(instance: models.Model) -> str:
    return instance._state.db or router.db_for_write(type(instance), instance=instance)


def _call(hook: Callable[[Any], Any], instance: models.Model, using: str) -> Any:
    """Call ``hook``; its queries in a savepoint opened by the first, where one is needed."""
    with savepoint_from_first_query(using):
        return hook(instance)
