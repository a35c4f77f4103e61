"""Whether tokens still stand, read as bare columns: the recheck's shortcut for the default hooks.

A recheck of the default ``RealtimeAuth`` only asks whether each socket's token still stands
for the account it was opened as, and keeps no account. Building the instances
``users_of_tokens`` returns (and their snapshots) was half of a round's CPU, and handed the
garbage collector a few objects per socket to promote. So a recheck reads the columns a token
remembers (``tokens.remembered_of``) and knows each account as an ``Account``, its id: all the
default ``scopes_of_many`` reads of an account.

Only where an instance would hold exactly those columns' values. Its instances are asked
instead (``accounts_of_tokens`` answers ``None``) when the user model is not an
``AbstractBaseUser`` or has its own ``get_username``, ``__init__`` or ``from_db``; when the
username, email, ``is_active`` or password is not a plain column (a property, a relation, a
descriptor of its own); when its default manager annotates, adds ``extra`` columns or builds
rows its own way; or when ``pre_init``/``post_init`` receivers may change an instance (those
last two Django does not document: ``realtime.compat.django`` tells them, or says it cannot).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any, NamedTuple

from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import FieldDoesNotExist
from django.db import models
from django.db.models.signals import post_init, pre_init

from realtime import tokens
from realtime.chunks import id_chunks
from realtime.compat.django import has_receivers, plain_instances
from realtime.primary import on_primary
from realtime.tokens import claims_of

logger = logging.getLogger(__name__)


class Account(NamedTuple):
    """An account a token still stands for, as the default scope hooks need it: its id."""

    pk: Any


class Columns(NamedTuple):
    """Where a user model keeps what a token remembers; ``None``: no such column, and an
    instance answers ``""`` (the email) or ``True`` (``is_active``) as Django's base does."""

    username: str
    email: str | None
    is_active: str | None
    password: str


def accounts_of_tokens(tokens: Sequence[str]) -> list[Account | None] | None:
    """For each token, the account it stands for as ``RealtimeAuth.users_of_tokens`` would
    answer (``None``: none), reading the columns of up to ``MAX_IDS_PER_MESSAGE`` accounts per
    statement; ``None`` when only instances can tell (see the module docstring)."""
    model = get_user_model()
    columns = columns_of(model)
    if columns is None or _loads_its_own_way(model):
        return None
    names = list(dict.fromkeys(name for name in ("pk", *columns) if name is not None))
    claims = [claims_of(token) for token in tokens]
    pks = list(dict.fromkeys(str(c[0]) for c in claims if c is not None))
    rows: dict[str, dict[str, Any]] = {}
    for chunk in id_chunks(pks):
        for values in on_primary(model).filter(pk__in=chunk).values_list(*names):
            rows[str(values[0])] = dict(zip(names, values, strict=True))
    answers: list[Account | None] = []
    for claim in claims:
        found = None if claim is None else rows.get(str(claim[0]))
        if claim is None or found is None or not _row_stands(found, columns, claim[1]):
            answers.append(None)
        else:
            answers.append(Account(found["pk"]))
    return answers


def _row_stands(row: dict[str, Any], columns: Columns, fingerprint: str) -> bool:
    """Whether the token still stands for the account of ``row`` (``tokens.stands``, read from
    its columns as an instance would answer them)."""
    active = True if columns.is_active is None else row[columns.is_active]
    email = "" if columns.email is None else row[columns.email]
    return tokens.stands(fingerprint, active, row[columns.username], email, row[columns.password])


def columns_of(model: type[models.Model]) -> Columns | None:
    """Where ``model`` keeps what a token remembers, when its instances read those columns as
    they are; ``None`` when they may not, or when that cannot be told."""
    try:
        return _columns_of(model)
    except Exception:
        logger.debug("realtime: %s is rechecked through instances", model, exc_info=True)
        return None


@functools.cache
def _columns_of(model: type[models.Model]) -> Columns | None:
    if not issubclass(model, AbstractBaseUser):
        return None
    if model.get_username is not AbstractBaseUser.get_username:
        return None
    if model.__init__ is not models.Model.__init__ or _own_from_db(model):
        return None
    username = _column(model, model.USERNAME_FIELD)  # type: ignore[attr-defined]
    password = _column(model, "password")
    email_name = model.get_email_field_name()
    email = _column(model, email_name)
    active = _column(model, "is_active")
    if username is None or password is None:
        return None
    if email is None and hasattr(model, email_name):
        return None  # an attribute, not a column: only an instance tells its value
    if active is None and getattr(model, "is_active", True) is not True:
        return None  # a property, or no account is ever active: let the hook say
    return Columns(username, email, active, password)


def _own_from_db(model: type[models.Model]) -> bool:
    """Whether ``model`` loads its rows with a ``from_db`` of its own (Django documents that
    hook for customizing the instances a query builds)."""
    method = getattr(model.from_db, "__func__", None)
    return method is not getattr(models.Model.from_db, "__func__", None)


def _column(model: type[models.Model], name: str) -> str | None:
    """``name`` if an instance of ``model`` reads it as its column's plain value: a concrete
    field, no relation, read through the descriptor every Django field has by default
    (``Field.descriptor_class``: nothing of a field class or a subclass shadowing it)."""
    try:
        field = model._meta.get_field(name)
    except FieldDoesNotExist:
        return None
    if not field.concrete or field.is_relation or field.name != name:
        return None
    return name if type(getattr(model, name, None)) is models.Field.descriptor_class else None


def _loads_its_own_way(model: type[models.Model]) -> bool:
    """Whether ``model``'s default manager or its init receivers may make an instance hold
    other values than its columns (asked at every round: receivers come and go)."""
    if not plain_instances(model._default_manager.all()):
        return True
    return has_receivers(pre_init, model) or has_receivers(post_init, model)
