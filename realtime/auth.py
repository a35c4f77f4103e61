"""``RealtimeAuth``: who a bearer is, which scopes it reads, and who hears an event.

The service named by ``REALTIME_AUTH``; subclass it and override a hook to change one answer.
Hooks are plain synchronous methods using the ORM: the socket side calls them off the event
loop. Scopes are instances of ``REALTIME_SCOPE_MODEL``, named by ``REALTIME_SCOPE_SLUG_FIELD``
and joined through ``REALTIME_SCOPE_MEMBERS``; hooks answer with ``Scope`` values (id and slug)
so that a renamed slug never loses a socket its scope.

Handshakes that arrive together and recheck rounds ask the bulk forms (``users_of_tokens``,
``scopes_of_many``): their defaults answer many sockets in a few statements of at most 200 ids
each. A subclass that overrides only a single form (``user_of_token``, ``scope_of``,
``scopes_of``, ``held_scopes``) keeps its answers: the bulk defaults then ask that form once
per question.

Ids a hook answers (accounts, ``Scope`` ids, reached scopes) are read by their model's primary
key field before they are compared (``account_ids``, ``scope_key``): ``"3"`` is the key ``3``
of an integer-keyed model, as it is for the ids given to the broadcast functions.

``issue_token(user)`` (from ``realtime.tokens``) signs a bearer the default ``user_of_token``
accepts: it expires after ``REALTIME_TOKEN_MAX_AGE`` and stops standing for the account once
its username or email change (or its password, with ``REALTIME_REVOKE_ON_PASSWORD_CHANGE``),
or it is deactivated.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from django.apps import apps
from django.contrib.auth import get_user_model
from django.db import models
from django.utils.module_loading import import_string

from realtime.audience import readers
from realtime.chunks import id_chunks
from realtime.conf import conf
from realtime.encoding import key_of, normal_id, storable
from realtime.messages import row_alias
from realtime.paths import to_lookup
from realtime.primary import on_primary, primary
from realtime.registry import ModelOptions, options_named

# ``issue_token`` is a public name of this module; tokens live in ``realtime.tokens``.
from realtime.tokens import claims_of, issue_token, refusal_cause, standing

__all__ = ["RealtimeAuth", "Scope", "ScopeQuestion", "get_auth", "issue_token", "reset_auth"]


class Scope(NamedTuple):
    """A scope a socket reads: its primary key, and the slug clients name it by."""

    id: Any
    slug: str


def scope_model() -> type[models.Model] | None:
    """The model of ``REALTIME_SCOPE_MODEL``, or ``None`` when the project has no scopes.

    A label that names no installed model raises Django's error again (``LookupError`` or
    ``ValueError``) with the setting named: at run time every handshake fails on it, and its
    log line must say what to fix (``manage.py check`` says it as ``realtime.E003``)."""
    label = conf.SCOPE_MODEL
    if label is None:
        return None
    try:
        return apps.get_model(label)
    except (LookupError, ValueError) as exc:
        raise type(exc)(
            f"REALTIME_SCOPE_MODEL {label!r} names no installed model (realtime.E003): {exc}"
        ) from exc


def scope_key(scope_id: Any) -> Any:
    """A scope id application code gave, in the one form ids are compared in: read by the
    scope model's primary key field (``"3"`` names the scope of integer key ``3``; a string
    or UUID key keeps its text), then ``normal_id``."""
    model = scope_model()
    return normal_id(scope_id) if model is None else key_of(model, scope_id)


def account_ids(user_ids: Iterable[Any]) -> list[Any]:
    """Account ids application code gave (a broadcast's, a hook's answer), each in the one
    form ids are compared in: read by the user model's primary key field, then
    ``normal_id``. Order and repeats are kept."""
    given = list(user_ids)
    if not given:
        return given
    model = get_user_model()
    return [key_of(model, user_id) for user_id in given]


def normal_scopes(scopes: Iterable[Scope]) -> list[Scope]:
    """Scopes a hook answered, their ids in the one form (see ``scope_key``)."""
    return [Scope(scope_key(scope.id), scope.slug) for scope in scopes]


def members_lookup() -> str:
    return to_lookup(conf.SCOPE_MEMBERS)


def member_ids(scope_id: Any, using: str | None = None) -> models.QuerySet[Any, Any]:
    """The ids of a scope's members, as a lazy query (usable as a subquery)."""
    model = scope_model()
    if model is None:
        return get_user_model()._default_manager.none().values_list("pk", flat=True)
    members = on_primary(model, using).filter(pk=scope_id)
    return members.values_list(members_lookup(), flat=True)


def readers_pool(
    options: ModelOptions, scope_id: Any, using: str | None = None
) -> models.QuerySet[Any, Any]:
    """The accounts a row of ``options`` may reach, as a lazy query: its scope's members; for
    a global model, every active account (its guard narrows them)."""
    if not options.is_global:
        return member_ids(scope_id, using)
    accounts = on_primary(get_user_model(), using or primary(options.model)).all()
    if any(field.name == "is_active" for field in accounts.model._meta.concrete_fields):
        accounts = accounts.filter(is_active=True)
    return accounts.values_list("pk", flat=True)


class ScopeQuestion(NamedTuple):
    """One socket's scope question in a bulk ask: of the scopes named by ``slugs`` and of
    those with ids ``held_ids``, which ``user`` is a member of."""

    user: Any
    slugs: Sequence[Any]
    held_ids: Sequence[Any]


class RealtimeAuth:
    """The default answers; every method is a hook an application may override."""

    # Who a bearer is ---------------------------------------------------------------------

    def user_of_token(self, token: str) -> Any | None:
        """Return the active account ``token`` stands for, or ``None``."""
        claims = claims_of(token)
        if claims is None:
            return None
        user = on_primary(get_user_model()).filter(pk=claims[0]).first()
        return standing(user, claims)

    def users_of_tokens(self, tokens: Sequence[str]) -> list[Any | None]:
        """Return, for each token in order, the active account it stands for, or ``None``.

        The default reads the accounts of up to 200 tokens per statement; a subclass that
        overrides ``user_of_token`` only is asked that once per token.
        """
        if overridden(self, "user_of_token"):
            return [self.user_of_token(token) for token in tokens]
        claims = [claims_of(token) for token in tokens]
        pks = list(dict.fromkeys(str(c[0]) for c in claims if c is not None))
        users: dict[str, Any] = {}
        manager = on_primary(get_user_model())
        for chunk in id_chunks(pks):
            users.update((str(user.pk), user) for user in manager.filter(pk__in=chunk))
        return [None if c is None else standing(users.get(str(c[0])), c) for c in claims]

    # Which scopes ------------------------------------------------------------------------

    def scope_of(self, user: Any, slug: Any) -> Scope | None:
        """Resolve the single-scope ask; ``None`` when none is named or none is reachable."""
        if slug is None:
            return None
        found = self.scopes_of(user, [slug])
        return found[0] if found else None

    def scopes_of(self, user: Any, slugs: Sequence[Any]) -> list[Scope]:
        """Resolve slugs to the scopes ``user`` is a member of, in one query, in asked order."""
        # A NUL character cannot be stored in PostgreSQL text, nor a lone surrogate encoded
        # by any driver, so no scope is named so.
        wanted = [slug for slug in slugs if storable(slug)]
        model = scope_model()
        if model is None or not wanted:
            return []
        slug_field = conf.SCOPE_SLUG_FIELD
        rows = (
            on_primary(model)
            .filter(**{f"{slug_field}__in": wanted, members_lookup(): user.pk})
            .values_list("pk", slug_field)
        )
        by_slug = {slug: Scope(pk, slug) for pk, slug in rows}
        return [by_slug[slug] for slug in dict.fromkeys(wanted) if slug in by_slug]

    def held_scopes(self, user: Any, ids: Iterable[Any]) -> list[Scope]:
        """Of the scope ids a socket reads, those ``user`` is still a member of (by id)."""
        model = scope_model()
        ids = list(ids)
        if model is None or not ids:
            return []
        rows = (
            on_primary(model)
            .filter(**{"pk__in": ids, members_lookup(): user.pk})
            .values_list("pk", conf.SCOPE_SLUG_FIELD)
        )
        found = {pk: Scope(pk, slug) for pk, slug in rows}
        return [found[pk] for pk in ids if pk in found]

    def scopes_of_many(self, questions: Sequence[ScopeQuestion]) -> list[list[Scope]]:
        """Answer each question: the scopes its slugs name (in asked order), then those of its
        ``held_ids`` not named so (in that order), of which its user is a member.

        The default answers every question at once, in one statement per 200 accounts and 200
        slugs and ids; a subclass that overrides ``scopes_of``, ``scope_of`` or
        ``held_scopes`` is asked those for each question instead.
        """
        if overridden(self, "scopes_of", "scope_of", "held_scopes"):
            return [self._scopes_one_by_one(question) for question in questions]
        model = scope_model()
        if model is None:
            return [[] for _ in questions]
        slug_field, lookup = conf.SCOPE_SLUG_FIELD, members_lookup()
        slugs = list(dict.fromkeys(s for q in questions for s in q.slugs if storable(s)))
        ids = list(dict.fromkeys(normal_id(i) for q in questions for i in q.held_ids))
        keys: list[tuple[str, Any]] = [("slug", s) for s in slugs] + [("id", i) for i in ids]
        users = list(dict.fromkeys(normal_id(q.user.pk) for q in questions))
        by_slug: dict[str, Scope] = {}
        by_id: dict[Any, Scope] = {}
        members: set[tuple[Any, Any]] = set()
        for key_chunk in id_chunks(keys):
            named = models.Q(**{f"{slug_field}__in": [v for k, v in key_chunk if k == "slug"]})
            held = models.Q(pk__in=[v for k, v in key_chunk if k == "id"])
            for user_chunk in id_chunks(users):
                rows = (
                    on_primary(model)
                    .filter(named | held, **{f"{lookup}__in": user_chunk})
                    .values_list("pk", slug_field, lookup)
                )
                for pk, slug, member in rows:
                    scope = Scope(pk, slug)
                    by_slug[slug] = by_id[normal_id(pk)] = scope
                    members.add((normal_id(member), normal_id(pk)))
        answers = []
        for question in questions:
            user = normal_id(question.user.pk)
            found = [
                by_slug[slug]
                for slug in dict.fromkeys(question.slugs)
                if slug in by_slug and (user, normal_id(by_slug[slug].id)) in members
            ]
            known = {normal_id(scope.id) for scope in found}
            found += [
                by_id[key]
                for key in dict.fromkeys(normal_id(i) for i in question.held_ids)
                if key not in known and key in by_id and (user, key) in members
            ]
            answers.append(found)
        return answers

    def _scopes_one_by_one(self, question: ScopeQuestion) -> list[Scope]:
        user, slugs = question.user, list(question.slugs)
        found = list(self.scopes_of(user, slugs)) if len(slugs) > 1 else []
        if len(slugs) == 1:
            scope = self.scope_of(user, slugs[0])
            found = [scope] if scope is not None else []
        known = {normal_id(scope.id) for scope in found}
        missing = [i for i in question.held_ids if normal_id(i) not in known]
        if missing:
            found += list(self.held_scopes(user, missing))
        return found

    def reached_scopes(self, token: str, ids: Iterable[Any]) -> list[Any]:
        """Narrow the scope ids a bearer may reach (an API key limited to one scope, say)."""
        return list(ids)

    # What a socket may subscribe to ------------------------------------------------------

    def may_subscribe(self, user: Any, scope_id: Any, channel: str) -> bool:
        """Whether ``user`` may hear ``channel`` (``contact`` or ``contact:7``) in the scope
        ``scope_id`` (``None``: a socket that reads no scope). Asked, off the event loop, for
        each new channel a ``subscribe`` or ``authenticate.channels`` names, once per scope the
        socket reads, and again at each recheck; a refused channel is dropped as an unknown
        one is, without a word to the client. Default: every channel."""
        return True

    # Who hears an event --------------------------------------------------------------------

    def recipients(self, event_type: str, data: Any, user_ids: list[Any]) -> Iterable[Any]:
        """Adjust the accounts an account-addressed event reaches (default: unchanged)."""
        return user_ids

    def audience(
        self,
        scope_id: Any,
        event_type: str,
        data: Any,
        user_ids: Iterable[Any],
        about: dict[str, Any] | None,
    ) -> Iterable[Any]:
        """Of ``user_ids``, those who may hear a scope event (``scope_id`` ``None``: an event
        of a global model, asked about every account holding a socket subscribed to it).

        An event ``about`` a record of a guarded model reaches that record's readers among
        the accounts still active (one statement for up to 200 accounts), read on the
        database the record was written on (``about["using"]`` when it was not where its
        model's writes go: ``realtime.messages.row_alias``); about a model nobody declared,
        nobody; any other event, every account asked.
        """
        if about is None:
            return user_ids
        options = options_named(str(about.get("model")))
        if options is None:
            return []
        if options.guard is None:
            return user_ids
        using = row_alias(options.model, about)
        return readers(options, about.get("id"), user_ids, active_only=True, using=using)

    def shared_readers(self, root: Any, scope_id: Any) -> Iterable[Any]:
        """Accounts outside ``scope_id`` reading ``root``; default ``root.realtime_readers()``."""
        method = getattr(root, "realtime_readers", None)
        return list(method()) if callable(method) else []

    def outside_recipients(self, scope_id: Any, event_type: str, data: Any) -> Iterable[Any]:
        """More accounts, outside the scope, that hear a scope event (default: nobody)."""
        return []


def token_refusal_cause(token: str) -> str:
    """Why no account was found for ``token``, for the server's log: the default
    ``RealtimeAuth`` tells each cause apart (``tokens.refusal_cause``); an application's
    ``user_of_token`` is named as the one that refused."""
    auth = get_auth()
    if overridden(auth, "user_of_token", "users_of_tokens"):
        return f"{type(auth).__qualname__}.user_of_token named no account"
    manager = on_primary(get_user_model())
    return refusal_cause(token, lambda pk: manager.filter(pk=pk).first())


def overridden(auth: RealtimeAuth, *names: str) -> bool:
    """Whether ``auth``'s class replaces any of these default hooks."""
    return any(getattr(type(auth), name) is not getattr(RealtimeAuth, name) for name in names)


_lock = threading.Lock()
_auth: RealtimeAuth | None = None


def get_auth() -> RealtimeAuth:
    """The service of ``REALTIME_AUTH``, built once (and again after a settings change)."""
    global _auth
    built = _auth
    if built is not None:  # asked for every announcement: no lock once built
        return built
    with _lock:
        if _auth is None:
            _auth = import_string(conf.AUTH)()
        return _auth


def reset_auth() -> None:
    global _auth
    with _lock:
        _auth = None
