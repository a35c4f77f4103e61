"""Who may read a row: the one-statement read check of guarded models, and scope members.

``guard(user)`` answers, for one account, which rows of the model it may read. Asking it row
by row and account by account would cost a query each; instead every account's question is
built as an ``EXISTS`` subquery and all of them go to the database in one statement (at most
200 columns per statement: databases cap the select list).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import FieldDoesNotExist
from django.db.models import Exists, Model, OuterRef

from realtime import limits
from realtime.chunks import chunked
from realtime.encoding import row_key
from realtime.registry import ModelOptions


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
    query for the accounts, then one statement per 200 accounts and 500 rows."""
    guard = options.guard
    if guard is None:
        everyone = list(user_ids)
        return {row_key(pk): list(everyone) for pk in pks}
    accounts = get_user_model()._default_manager.db_manager(using).filter(pk__in=user_ids)
    if active_only and _has_field(accounts.model, "is_active"):
        # Checked at delivery too, not only by rechecks: an account made inactive by an
        # ``update()`` (which sends no signal) reads no guarded row from then on.
        accounts = accounts.filter(is_active=True)
    users = list(accounts.order_by("pk"))
    model = options.model
    allowed: dict[Any, list[Any]] = {}
    for rows in chunked(list(pks), ROWS_PER_STATEMENT):
        for chunk in chunked(users, limits.MAX_IDS_PER_MESSAGE):
            checks = {
                f"r{index}": Exists(
                    model._base_manager.filter(pk=OuterRef("pk")).filter(guard(user))
                )
                for index, user in enumerate(chunk)
            }
            found = model._base_manager.db_manager(using).filter(pk__in=rows).annotate(**checks)
            for pk, *may_read in found.values_list("pk", *checks):
                admitted = allowed.setdefault(row_key(pk), [])
                admitted += [user.pk for user, yes in zip(chunk, may_read, strict=True) if yes]
    return {row_key(pk): allowed.get(row_key(pk), []) for pk in pks}


#: Rows asked about in one statement.
ROWS_PER_STATEMENT = 500


def _has_field(model: type[Model], name: str) -> bool:
    try:
        model._meta.get_field(name)
    except FieldDoesNotExist:
        return False
    return True
