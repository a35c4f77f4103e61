"""Who may read a row: the one-statement read check of guarded models, and scope members.

``guard(user)`` answers, for one account, which rows of the model it may read. Asking it row
by row and account by account would cost a query each; instead every account's question is
built as an ``EXISTS`` subquery and all of them go to the database in one statement (at most
200 columns per statement: databases cap the select list).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import FieldDoesNotExist
from django.db.models import Exists, Model, OuterRef, Q, QuerySet

from realtime import limits
from realtime.chunks import chunked
from realtime.encoding import row_key
from realtime.guard_checks import Check, Forms, in_process
from realtime.logs import log_hook_failure
from realtime.primary import primary
from realtime.registry import ModelOptions

logger = logging.getLogger(__name__)


def guard_condition(options: ModelOptions, user: Any) -> Q | None:
    """What ``options.guard`` answers for the account ``user``: the condition its readable
    rows meet. ``None`` when the guard raises: it is application code, logged at ERROR with
    its traceback within its place's budget, and the account reads none of the rows (the
    write, the socket and the other accounts go on)."""
    assert options.guard is not None
    try:
        return options.guard(user)
    except Exception as exc:
        log_hook_failure(
            logger,
            "realtime: the guard of %s failed for an account; it reads none of its rows",
            exc,
            options.name,
        )
        return None


def readers(
    options: ModelOptions,
    pk: Any,
    user_ids: Iterable[Any],
    *,
    active_only: bool = False,
    using: str | None = None,
) -> list[Any]:
    """Of ``user_ids``, those whose ``guard`` lets them read row ``pk`` (with ``active_only``,
    of the accounts still active); none if it is gone.

    One query for the accounts (``user_ids`` may be a lazy query: it becomes a subquery),
    then one statement per 200 accounts.
    """
    found = readers_of_rows(options, [pk], user_ids, active_only=active_only, using=using)
    return found[row_key(pk)]


def readers_of_rows(
    options: ModelOptions,
    pks: Sequence[Any],
    user_ids: Iterable[Any],
    *,
    active_only: bool = False,
    using: str | None = None,
) -> dict[Any, list[Any]]:
    """``readers`` of several rows at once, by ``row_key`` (a row that is gone: none): one
    query for the accounts; then, for the accounts whose guard is decided in process
    (``realtime.guard_checks``), one statement reading the rows' columns per 500 rows, and
    for the others one statement per 200 accounts and 500 rows."""
    guard = options.guard
    if guard is None:
        everyone = list(user_ids)
        return {row_key(pk): list(everyone) for pk in pks}
    model = options.model
    using = using or primary(model)  # read where the row was written, not on a replica
    accounts = get_user_model()._default_manager.db_manager(using).filter(pk__in=user_ids)
    if active_only:
        accounts = active(accounts)
    users = list(accounts.order_by("pk"))
    here: list[tuple[Any, Check]] = []  # decided in process
    asked: list[tuple[Any, Any]] = []  # left to the database
    columns: set[str] = set()
    forms: Forms = {}
    for user in users:
        condition = guard_condition(options, user)
        if condition is None:
            continue
        decided = in_process(model, condition, forms)
        if decided is None:
            asked.append((user, condition))
        else:
            here.append((user, decided[0]))
            columns |= decided[1]
    allowed: dict[Any, set[Any]] = {}
    for rows in chunked(list(pks), ROWS_PER_STATEMENT):
        if here:
            found = model._base_manager.db_manager(using).filter(pk__in=rows)
            for values in found.values("pk", *columns):
                admitted = allowed.setdefault(row_key(values["pk"]), set())
                admitted.update(user.pk for user, check in here if check(values))
        for chunk in chunked(asked, limits.MAX_IDS_PER_MESSAGE):
            checks = {
                f"r{index}": Exists(model._base_manager.filter(pk=OuterRef("pk")).filter(condition))
                for index, (_, condition) in enumerate(chunk)
            }
            found = model._base_manager.db_manager(using).filter(pk__in=rows).annotate(**checks)
            for pk, *may_read in found.values_list("pk", *checks):
                admitted = allowed.setdefault(row_key(pk), set())
                admitted.update(
                    user.pk for (user, _), yes in zip(chunk, may_read, strict=True) if yes
                )
    # In the accounts' order, as one statement per chunk of them answered before.
    return {
        row_key(pk): [user.pk for user in users if user.pk in allowed.get(row_key(pk), ())]
        for pk in pks
    }


#: Rows asked about in one statement.
ROWS_PER_STATEMENT = 500


def active(accounts: QuerySet[Any, Any]) -> QuerySet[Any, Any]:
    """``accounts`` without the inactive ones, where the account model has ``is_active``.
    Checked wherever guarded rows are decided, not only by rechecks: an account made
    inactive by an ``update()`` (which sends no signal) reads no guarded row from then on."""
    if _has_field(accounts.model, "is_active"):
        return accounts.filter(is_active=True)
    return accounts


def _has_field(model: type[Model], name: str) -> bool:
    try:
        model._meta.get_field(name)
    except FieldDoesNotExist:
        return False
    return True
