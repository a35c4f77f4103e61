"""Ask workers to recheck sockets, after commit, when what let an account in may have changed.

A socket stays open long after its first frame; these writes send ``recheck_users`` for the
accounts they touch, so every worker re-resolves those sockets at once instead of at the next
periodic round: a membership saved or deleted (the model ``REALTIME_SCOPE_MEMBERS`` passes
through, or the links of a many-to-many), a scope deleted (its members), an account deleted,
made inactive, or whose username or email changed (its password too, with
``REALTIME_REVOKE_ON_PASSWORD_CHANGE``), and any write of a ``REALTIME_RECHECK_MODELS`` model.
A name change triggers nothing. These models get receivers and so lose Django's fast delete.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.apps import apps
from django.contrib.auth import get_user_model
from django.db import models
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_delete, pre_save

from realtime import outbox, snapshots
from realtime.auth import member_ids, scope_model
from realtime.conf import conf
from realtime.paths import resolve_path, split_path, to_lookup
from realtime.publishing import Recheck

logger = logging.getLogger(__name__)

PENDING = "_realtime_pending_recheck"
UID = "realtime:recheck"


@dataclass(frozen=True)
class Watched:
    """A model whose writes recheck accounts, and the path from it to them."""

    model: type[models.Model]
    path: str

    def accounts(self, instance: models.Model) -> list[Any]:
        parts = split_path(self.path)
        first = instance._meta.get_field(parts[0])
        if len(parts) == 1 and first.concrete and (first.many_to_one or first.one_to_one):
            value = instance.__dict__.get(first.attname)
            return [] if value is None else [value]
        rows = self.model._base_manager.filter(pk=instance.pk).values_list(
            to_lookup(self.path), flat=True
        )
        return [value for value in rows if value is not None]


def connect() -> None:
    """Connect every trigger for the current settings (once models are ready)."""
    user_model = get_user_model()
    pre_save.connect(_on_account_saving, sender=user_model, dispatch_uid=UID)
    post_save.connect(_on_account_saved, sender=user_model, dispatch_uid=UID)
    pre_delete.connect(_on_account_deleting, sender=user_model, dispatch_uid=UID)
    post_delete.connect(_on_deleted, sender=user_model, dispatch_uid=UID)
    snapshots.track(user_model)
    scope = scope_model()
    if scope is not None:
        pre_delete.connect(_on_scope_deleting, sender=scope, dispatch_uid=UID)
        post_delete.connect(_on_deleted, sender=scope, dispatch_uid=UID)
        _connect_memberships(scope)
    for label, path in conf.RECHECK_MODELS.items():
        _watch(Watched(apps.get_model(label), path))


_watched: dict[type[models.Model], Watched] = {}


def _watch(watched: Watched) -> None:
    _watched[watched.model] = watched
    post_save.connect(_on_watched_saved, sender=watched.model, dispatch_uid=UID)
    pre_delete.connect(_on_watched_deleting, sender=watched.model, dispatch_uid=UID)
    post_delete.connect(_on_deleted, sender=watched.model, dispatch_uid=UID)


def _connect_memberships(scope: type[models.Model]) -> None:
    fields = resolve_path(scope, conf.SCOPE_MEMBERS)
    last = fields[-1]
    if last.many_to_many:
        through = last.remote_field.through if last.concrete else last.through  # type: ignore[union-attr]
        m2m_changed.connect(_on_links_changed, sender=through, dispatch_uid=UID)
        user_fk = next(
            f.name
            for f in through._meta.get_fields()
            if f.many_to_one and f.related_model is get_user_model()
        )
        _watch(Watched(through, user_fk))
    else:
        owner = last.model
        _watch(Watched(owner, last.name))


def request(user_ids: Iterable[Any], using: str = "default") -> None:
    """Recheck the sockets of these accounts on every worker, after the current commit."""
    ids = [user_id for user_id in user_ids if user_id is not None]
    if ids:
        outbox.add(Recheck(ids), using)


def _on_account_saving(sender: type[models.Model], instance: Any, **kwargs: Any) -> None:
    # Compared before the save: post_save receivers refresh the snapshot.
    before = instance.__dict__.get(snapshots.SNAPSHOT)
    if before is None or instance._state.adding:
        return
    watched = [instance.get_email_field_name(), instance.USERNAME_FIELD, "is_active"]
    if conf.REVOKE_ON_PASSWORD_CHANGE:
        watched.append("password")
    values = instance.__dict__
    if any(name in before and before[name] != values.get(name) for name in watched):
        instance.__dict__[PENDING] = [instance.pk]


def _on_account_saved(sender: type[models.Model], instance: Any, using: str, **kwargs: Any) -> None:
    snapshots.take(instance, snapshots.written_attnames(instance, kwargs.get("update_fields")))
    request(instance.__dict__.pop(PENDING, []), using)


def _on_account_deleting(sender: type[models.Model], instance: Any, **kwargs: Any) -> None:
    instance.__dict__[PENDING] = [instance.pk]


def _on_scope_deleting(sender: type[models.Model], instance: Any, **kwargs: Any) -> None:
    try:
        instance.__dict__[PENDING] = list(member_ids(instance.pk))
    except Exception:
        logger.exception("realtime: reading the members of a deleted scope failed")


def _on_watched_deleting(sender: type[models.Model], instance: Any, **kwargs: Any) -> None:
    watched = _watched.get(sender)
    if watched is not None:
        instance.__dict__[PENDING] = watched.accounts(instance)


def _on_deleted(sender: type[models.Model], instance: Any, using: str, **kwargs: Any) -> None:
    request(instance.__dict__.pop(PENDING, []), using)


def _on_watched_saved(
    sender: type[models.Model], instance: Any, using: str, raw: bool = False, **kwargs: Any
) -> None:
    watched = _watched.get(sender)
    if watched is not None and not raw:
        request(watched.accounts(instance), using)


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
            instance.__dict__[PENDING] = [instance.pk]
        else:
            instance.__dict__[PENDING] = list(member_ids(instance.pk))
    elif action == "post_clear":
        request(instance.__dict__.pop(PENDING, []), using)
    elif action in ("post_add", "post_remove"):
        request([instance.pk] if isinstance(instance, user_model) else list(pk_set or ()), using)
