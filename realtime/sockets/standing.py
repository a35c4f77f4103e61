"""Whether tokens still stand, read as bare columns: the recheck's shortcut for the default hooks.

A recheck of the default ``RealtimeAuth`` only needs to know whether each socket's token still
stands for the account it was opened as; the account instances ``users_of_tokens`` builds are
thrown away at once. Building them (and their snapshots) was half of a recheck's CPU, and each
round handed the garbage collector a few objects per socket to promote, which brought on the
full collections of a worker holding thousands of sockets sooner. So where an instance could
not answer differently, a recheck reads the few columns a token remembers instead, and knows
each account as an ``Account``: its id, all that the default ``scopes_of_many`` reads of one.

An instance could answer differently when the user model works out what a token remembers
itself: a ``get_username`` of its own, ``is_active`` or the email as a property, an
``__init__`` or ``from_db`` that changes what is loaded. ``accounts_of_tokens`` then answers
``None``, and the recheck asks ``users_of_tokens`` as a handshake does.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from typing import Any, NamedTuple

from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import FieldDoesNotExist
from django.db import models
from django.db.models import Value
from django.db.models.query_utils import DeferredAttribute

from realtime.auth import claims_of, fingerprint_of, id_chunks, remembered


class Account(NamedTuple):
    """An account a token still stands for, as the default scope hooks need it: its id."""

    pk: Any


def accounts_of_tokens(tokens: Sequence[str]) -> list[Account | None] | None:
    """For each token, the account it stands for as ``RealtimeAuth.users_of_tokens`` would
    answer (``None``: none), reading the columns of up to 200 accounts per statement; ``None``
    when the user model needs its instances to tell (see the module docstring)."""
    model = get_user_model()
    columns = columns_of(model)
    if columns is None:
        return None
    claims = [claims_of(token) for token in tokens]
    pks = list(dict.fromkeys(str(c[0]) for c in claims if c is not None))
    rows: dict[str, tuple[Any, ...]] = {}
    for chunk in id_chunks(pks):
        found = model._default_manager.filter(pk__in=chunk).values_list(*columns)
        rows.update((str(row[0]), row) for row in found)
    answers: list[Account | None] = []
    for claim in claims:
        row = None if claim is None else rows.get(str(claim[0]))
        answers.append(None if claim is None or row is None else _standing(row, claim[1]))
    return answers


def _standing(row: tuple[Any, ...], fingerprint: str) -> Account | None:
    """The account of ``row`` (pk, username, email, is_active, password) if it is active and
    still what the token remembers of it, as ``auth._standing`` tells of an instance."""
    pk, username, email, active, password = row
    if not active:
        return None
    if remembered(fingerprint, lambda key: fingerprint_of(username, email, password, key)):
        return Account(pk)
    return None


@functools.cache
def columns_of(model: type[models.Model]) -> tuple[Any, ...] | None:
    """What to read of ``model``'s rows for ``_standing``: its pk, username, email, active
    flag and password, each a column or the constant an instance would answer; ``None`` when
    only an instance can tell."""
    if not issubclass(model, AbstractBaseUser):
        return None
    if model.get_username is not AbstractBaseUser.get_username:
        return None
    loads = inspect.unwrap(model.from_db.__func__)  # type: ignore[attr-defined]
    if model.__init__ is not models.Model.__init__ or loads is not _DJANGO_FROM_DB:
        return None
    username = _column(model, model.USERNAME_FIELD)  # type: ignore[attr-defined]
    password = _column(model, "password")
    email_name = model.get_email_field_name()
    email: Any = _column(model, email_name)
    if email is None and not hasattr(model, email_name):
        email = Value("")  # as ``getattr(user, name, "")`` answers
    active: Any = _column(model, "is_active")
    if active is None and getattr(model, "is_active", True) is True:
        active = Value(True)  # as ``getattr(user, "is_active", True)`` answers
    if username is None or password is None or email is None or active is None:
        return None
    return ("pk", username, email, active, password)


def _column(model: type[models.Model], name: str) -> str | None:
    """``name`` if an instance of ``model`` reads it as its column's plain value: a concrete
    field, no relation, not shadowed by an attribute of a subclass."""
    try:
        field = model._meta.get_field(name)
    except FieldDoesNotExist:
        return None
    if not field.concrete or field.is_relation:
        return None
    return name if isinstance(getattr(model, name, None), DeferredAttribute) else None


_DJANGO_FROM_DB = models.Model.from_db.__func__  # type: ignore[attr-defined]
