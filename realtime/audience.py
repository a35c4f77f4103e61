"""Who may read a row: the one-statement read check of guarded models, and scope members.

``guard(user)`` answers, for one account, which rows of the model it may read. Asking it row
by row and account by account would cost a query each; instead every account's question is
built as an ``EXISTS`` subquery and all of them go to the database in one statement (at most
200 columns per statement: databases cap the select list).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import FieldDoesNotExist
from django.db.models import Exists, Model, OuterRef

from realtime import limits
from realtime.chunks import chunked
from realtime.registry import ModelOptions


def readers(
    options: ModelOptions, pk: Any, user_ids: Iterable[Any], *, active_only: bool = False
) -> list[Any]:
    """Of ``user_ids``, those whose ``guard`` lets them read row ``pk`` (with ``active_only``,
    of the accounts still active); none if it is gone.

    One query for the accounts (``user_ids`` may be a lazy query: it becomes a subquery),
    then one statement per 200 accounts.
    """
    guard = options.guard
    if guard is None:
        return list(user_ids)
    accounts = get_user_model()._default_manager.filter(pk__in=user_ids)
    if active_only and _has_field(accounts.model, "is_active"):
        # Checked at delivery too, not only by rechecks: an account made inactive by an
        # ``update()`` (which sends no signal) reads no guarded row from then on.
        accounts = accounts.filter(is_active=True)
    users = list(accounts.order_by("pk"))
    model = options.model
    allowed: list[Any] = []
    for chunk in chunked(users, limits.MAX_IDS_PER_MESSAGE):
        checks = {
            f"r{index}": Exists(model._base_manager.filter(pk=OuterRef("pk")).filter(guard(user)))
            for index, user in enumerate(chunk)
        }
        row = model._base_manager.filter(pk=pk).annotate(**checks).values_list(*checks).first()
        if row is None:
            return []
        allowed += [user.pk for user, may_read in zip(chunk, row, strict=True) if may_read]
    return allowed


def _has_field(model: type[Model], name: str) -> bool:
    try:
        model._meta.get_field(name)
    except FieldDoesNotExist:
        return False
    return True
