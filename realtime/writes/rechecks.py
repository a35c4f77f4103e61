"""Ask workers to recheck sockets, after commit, when what let an account in may have changed.

A socket stays open long after its first frame; these writes send ``recheck_users`` for the
accounts they touch, so every worker re-resolves those sockets at once instead of at the next
periodic round: a membership saved or deleted (the model ``REALTIME_SCOPE_MEMBERS`` passes
through, or the links of a many-to-many), a scope deleted (its members), an account deleted,
made inactive, or whose username or email changed (its password too, with
``REALTIME_REVOKE_ON_PASSWORD_CHANGE``), and any write of a ``REALTIME_RECHECK_MODELS`` model.
A save rechecks every account the row named before it *and* after it: a membership handed to
another account drops the former member at once. A name change triggers nothing. These models
get receivers and so lose Django's fast delete. Writes that send no signal (``update()``,
``bulk_*``) trigger nothing: call ``recheck_users`` after them.

Signing out through Django's ``logout`` (``user_logged_out``) asks the account's recheck too,
naming the session it ends (``session_hashes``): each worker refuses at once the sockets whose
token the token view issued to that session, and rechecks the account's others as usual. A
session that merely expires, or is deleted on the server, sends no signal: its sockets stand
until their token expires (``REALTIME_TOKEN_MAX_AGE``).

Like every receiver of the write side, these never fail the write, and the queries they add
run in savepoints.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.apps import apps
from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, models
from django.db.models import ForeignObjectRel
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_delete, pre_save
from django.dispatch import Signal

from realtime.auth import member_ids, scope_model
from realtime.conf import conf
from realtime.paths import is_foreign_key, resolve_path, values_on_path
from realtime.tokens import session_hashes
from realtime.writes import on_commit, pending
from realtime.writes.failsafe import failsafe, never_raises
from realtime.writes.items import Recheck

logger = logging.getLogger(__name__)

LOGGED_OUT_UID = "realtime:logged-out"
PENDING = "_realtime_pending_recheck"
BEFORE = "_realtime_accounts_before"
UID = "realtime:recheck"


@dataclass(frozen=True)
class Watched:
    """A model whose writes recheck accounts, and the path from it to them."""

    model: type[models.Model]
    path: str

    def accounts(self, instance: models.Model, using: str) -> list[Any]:
        """The accounts the row names now (a multi-hop path costs a query, in a savepoint)."""
        label = f"the accounts of {self.model._meta.label}:{instance.pk}"
        found = failsafe(label, using, True, lambda: values_on_path(instance, self.path, using))
        return found or []

    def accounts_before(self, instance: models.Model, using: str) -> list[Any]:
        """The accounts the stored row names, read before the save about to run."""
        stored = self.model._base_manager.using(using).filter(pk=instance.pk).first()
        return [] if stored is None else values_on_path(stored, self.path, using)


_connected: list[tuple[Signal, Any]] = []
_watched: dict[type[models.Model], Watched] = {}


def _on(signal: Signal, receiver: Any, sender: Any) -> None:
    signal.connect(receiver, sender=sender, dispatch_uid=UID)
    _connected.append((signal, sender))


def connect() -> None:
    """Connect every trigger for the current settings, replacing earlier ones.

    Called once models are ready, and again when a setting it depends on changes.
    """
    for signal, sender in _connected:
        signal.disconnect(sender=sender, dispatch_uid=UID)
    _connected.clear()
    _watched.clear()
    try:
        user_model = get_user_model()
    except (ImproperlyConfigured, LookupError, ValueError):
        # AUTH_USER_MODEL names no installed model (a test's override_settings): nothing to
        # watch; Django's own checks say what is wrong.
        return
    _on(pre_save, _on_account_saving, user_model)
    _on(post_save, _on_account_saved, user_model)
    _on(pre_delete, _on_account_deleting, user_model)
    _on(post_delete, _on_deleted, user_model)
    # Invalid settings are the system checks' to report; wire what can be wired.
    try:
        scope = scope_model()
        if scope is not None:
            _on(pre_delete, _on_scope_deleting, scope)
            _on(post_delete, _on_deleted, scope)
            _connect_memberships(scope)
    except (LookupError, ValueError, TypeError, AttributeError, StopIteration) as exc:
        logger.warning("realtime: memberships are not watched: check REALTIME_SCOPE_* (%s)", exc)
    try:
        for label, path in dict(conf.RECHECK_MODELS).items():
            _watch(Watched(apps.get_model(label), path))
    except (LookupError, ValueError, TypeError, AttributeError):
        logger.warning("realtime: REALTIME_RECHECK_MODELS is invalid and not watched")


def _watch(watched: Watched) -> None:
    _watched[watched.model] = watched
    _on(pre_save, _on_watched_saving, watched.model)
    _on(post_save, _on_watched_saved, watched.model)
    _on(pre_delete, _on_watched_deleting, watched.model)
    _on(post_delete, _on_deleted, watched.model)


def _connect_memberships(scope: type[models.Model]) -> None:
    fields = resolve_path(scope, conf.SCOPE_MEMBERS)
    last = fields[-1]
    if last.many_to_many:
        # A reverse relation holds the through model; a forward field, its remote_field
        # (Django 6.1 no longer counts a ManyToManyField as concrete: it has no column).
        reverse = isinstance(last, ForeignObjectRel)
        through = last.through if reverse else last.remote_field.through  # type: ignore[union-attr]
        _on(m2m_changed, _on_links_changed, through)
        user_fk = next(
            f.name
            for f in through._meta.get_fields()
            if is_foreign_key(f) and f.related_model is get_user_model()
        )
        _watch(Watched(through, user_fk))
    else:
        _watch(Watched(last.model, last.name))


def request(user_ids: Iterable[Any], using: str = "default") -> None:
    """Recheck the sockets of these accounts on every worker, after the current commit."""
    ids = [user_id for user_id in user_ids if user_id is not None]
    if ids:
        on_commit.add(Recheck(ids), using)


@never_raises
def on_logged_out(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    """``user_logged_out``: the sockets of the session signed out of are refused at once, on
    every worker, after the current commit (a sign-out without a session or an account asks
    nothing)."""
    session = getattr(request, "session", None)
    session_key = None if session is None else session.session_key
    if user is None or user.pk is None or not session_key:
        return
    on_commit.add(Recheck([user.pk], session_hashes(session_key)), DEFAULT_DB_ALIAS)


@never_raises
def _on_account_saving(
    sender: type[models.Model], instance: Any, using: str, raw: bool = False, **kwargs: Any
) -> None:
    # Compared with the stored row before the save: a full save of an account is rare (a
    # login writes ``last_login`` alone), and the stored row is what the token remembers.
    inserting = instance._state.adding and instance._meta.pk.has_default()
    if raw or instance.pk is None or inserting:
        return
    watched = {instance.get_email_field_name(), instance.USERNAME_FIELD, "is_active"}
    if conf.REVOKE_ON_PASSWORD_CHANGE:
        watched.add("password")
    written = kwargs.get("update_fields")
    if written is not None:
        watched &= set(written)
    attnames = [f.attname for f in sender._meta.concrete_fields if f.name in watched]
    if not attnames:
        return
    label = f"the account {instance.pk} as stored"
    stored = failsafe(
        label,
        using,
        True,
        lambda: sender._base_manager.using(using).filter(pk=instance.pk).values(*attnames).first(),
    )
    values = instance.__dict__
    if stored is not None and any(
        attname in values and values[attname] != stored[attname] for attname in attnames
    ):
        pending.put(instance, PENDING, [instance.pk])


@never_raises
def _on_account_saved(sender: type[models.Model], instance: Any, using: str, **kwargs: Any) -> None:
    request(pending.take(instance, PENDING, []), using)


@never_raises
def _on_account_deleting(sender: type[models.Model], instance: Any, **kwargs: Any) -> None:
    pending.put(instance, PENDING, [instance.pk])


@never_raises
def _on_scope_deleting(
    sender: type[models.Model], instance: Any, using: str, **kwargs: Any
) -> None:
    members = failsafe(
        f"the members of deleted scope {instance.pk}",
        using,
        True,
        lambda: list(member_ids(instance.pk, using)),
    )
    pending.put(instance, PENDING, members or [])


@never_raises
def _on_watched_deleting(
    sender: type[models.Model], instance: Any, using: str, **kwargs: Any
) -> None:
    watched = _watched.get(sender)
    if watched is not None:
        pending.put(instance, PENDING, watched.accounts(instance, using))


@never_raises
def _on_deleted(sender: type[models.Model], instance: Any, using: str, **kwargs: Any) -> None:
    request(pending.take(instance, PENDING, []), using)


@never_raises
def _on_watched_saving(
    sender: type[models.Model], instance: Any, using: str, raw: bool = False, **kwargs: Any
) -> None:
    watched = _watched.get(sender)
    # A row built by hand with the pk of a stored one is an update too; like Django, take a
    # new row whose pk has a default (or no pk yet) for an insert.
    inserting = instance._state.adding and instance._meta.pk.has_default()
    if watched is None or raw or instance.pk is None or inserting:
        return
    label = f"the accounts {sender._meta.label}:{instance.pk} named"
    before = failsafe(label, using, True, lambda: watched.accounts_before(instance, using))
    pending.put(instance, BEFORE, before or [])


@never_raises
def _on_watched_saved(
    sender: type[models.Model], instance: Any, using: str, raw: bool = False, **kwargs: Any
) -> None:
    watched = _watched.get(sender)
    before = pending.take(instance, BEFORE, [])
    if watched is not None and not raw:
        request([*before, *watched.accounts(instance, using)], using)


@never_raises
def _on_links_changed(
    sender: type[models.Model],
    instance: Any,
    action: str,
    reverse: bool,
    pk_set: set[Any] | None,
    using: str,
    **kwargs: Any,
) -> None:
    user_model = get_user_model()
    if action == "pre_clear":
        if isinstance(instance, user_model):
            pending.put(instance, PENDING, [instance.pk])
        else:
            members = failsafe(
                f"the members of scope {instance.pk}",
                using,
                True,
                lambda: list(member_ids(instance.pk, using)),
            )
            pending.put(instance, PENDING, members or [])
    elif action == "post_clear":
        request(pending.take(instance, PENDING, []), using)
    elif action in ("post_add", "post_remove"):
        request([instance.pk] if isinstance(instance, user_model) else list(pk_set or ()), using)
