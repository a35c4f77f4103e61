"""Who a socket is and which scopes it reads: the socket side's questions to the auth hooks.

The handshake, a client's ``watch`` and the rechecks all resolve scopes the same way, here, so
the three always agree. These functions run off the event loop (the hooks use the ORM).

Handshakes that arrive together (``authenticate_many``) and recheck rounds (``recheck``) ask
the bulk hooks (``users_of_tokens``, ``scopes_of_many``) once for all their sockets, unless the
auth class overrides a single form without its bulk form: then each socket is asked alone,
exactly as a lone handshake would be. A recheck of the default hooks knows each account by its
id alone, read without building an instance (``realtime.sockets.standing``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from realtime.auth import (
    RealtimeAuth,
    Scope,
    ScopeQuestion,
    normal_scopes,
    overridden,
    scope_key,
)
from realtime.encoding import normal_id
from realtime.sockets.limits import log_hook_failure
from realtime.sockets.protocol import ScopeAsk
from realtime.sockets.standing import accounts_of_tokens

logger = logging.getLogger(__name__)

#: A recheck answer meaning "could not tell": the socket is left as it is.
FAILED = object()


def authenticate(auth: RealtimeAuth, token: str, ask: ScopeAsk) -> tuple[Any, list[Scope]]:
    """The account a bearer stands for and the scopes it asked for and may read."""
    user = auth.user_of_token(token)
    if user is None:
        return None, []
    return user, resolve_scopes(auth, user, token, ask)


def resolve_scopes(
    auth: RealtimeAuth, user: Any, token: str, ask: ScopeAsk, held_ids: Sequence[Any] = ()
) -> list[Scope]:
    """Resolve what a socket asked for, plus the scope ids it already reads and still holds,
    narrowed by what the bearer may reach."""
    if ask.many:
        found = list(auth.scopes_of(user, list(ask.slugs))) if ask.slugs else []
    elif ask.single is not None and not ask.slugs:
        # Asked, but not with a storable string: it names no scope.
        found = []
    else:
        scope = auth.scope_of(user, ask.single)
        found = [scope] if scope is not None else []
    found = normal_scopes(found)
    known = {scope.id for scope in found}
    missing = [scope_id for scope_id in held_ids if scope_id not in known]
    if missing:
        found += normal_scopes(auth.held_scopes(user, missing))
    if not found:
        return []
    reached = {scope_key(i) for i in auth.reached_scopes(token, [scope.id for scope in found])}
    return [scope for scope in found if scope.id in reached]


def _go_on() -> None:
    """No wait between the steps of a batch."""


def recheck(
    auth: RealtimeAuth,
    questions: list[tuple[Any, str, ScopeAsk, list[Any]]],
    between: Callable[[], None] = _go_on,
) -> list[Any]:
    """Resolve each socket's bearer and scopes again: its scopes, ``None`` when the bearer is
    lost, ``FAILED`` when the hooks failed (logged).

    ``between`` is called between the steps (each bulk hook, each socket asked alone): a
    round waits there while delivery has work, so that it shares the interpreter with
    delivery a step at a time rather than a whole batch at a time.
    """
    if not _in_bulk(auth):
        answers = []
        for question in questions:
            answers.append(_recheck_one(auth, *question))
            between()
        return answers
    try:
        users = _users(auth, [token for _, token, _, _ in questions], instances=False)
        between()
        # The bearer still stands for the account the socket was opened as.
        standing = [
            user is not None and normal_id(user.pk) == question[0]
            for user, question in zip(users, questions, strict=True)
        ]
        kept = [
            (user, token, ask, held)
            for user, stands, (_, token, ask, held) in zip(users, standing, questions, strict=True)
            if stands
        ]
        resolved = iter(_scopes(auth, kept, between))
    except Exception as exc:
        # A hook's failure (or the database's): with its traceback, limited per place, as
        # with the database away every round fails.
        log_hook_failure("realtime: rechecking %d sockets failed", exc, len(questions))
        return [FAILED for _ in questions]
    return [next(resolved) if stands else None for stands in standing]


def authenticate_many(auth: RealtimeAuth, asks: list[tuple[str, ScopeAsk]]) -> list[Any]:
    """``authenticate`` for handshakes that arrived together; an answer that failed is the
    exception it raised."""
    if not _in_bulk(auth):
        return [_authenticate_one(auth, token, ask) for token, ask in asks]
    users = _users(auth, [token for token, _ in asks])
    kept: list[tuple[Any, str, ScopeAsk, list[Any]]] = [
        (user, token, ask, []) for user, (token, ask) in zip(users, asks, strict=True) if user
    ]
    resolved = iter(_scopes(auth, kept))
    return [(user, next(resolved)) if user is not None else (None, []) for user in users]


_ACCOUNT_HOOKS = ("user_of_token", "users_of_tokens")
_SCOPE_HOOKS = ("scope_of", "scopes_of", "held_scopes")


def _in_bulk(auth: RealtimeAuth) -> bool:
    """Whether the bulk hooks answer as the single ones would (see the module docstring)."""
    if overridden(auth, "user_of_token") and not overridden(auth, "users_of_tokens"):
        return False
    return not overridden(auth, *_SCOPE_HOOKS) or overridden(auth, "scopes_of_many")


def _users(auth: RealtimeAuth, tokens: list[str], *, instances: bool = True) -> list[Any]:
    """The account of each token, asking once per distinct token. A recheck keeps no account
    (``instances=False``): of the default hooks it gets only each account's id, read without
    building an instance where the user model allows (``realtime.sockets.standing``)."""
    distinct = list(dict.fromkeys(tokens))
    answers = None
    if not instances and not overridden(auth, *_ACCOUNT_HOOKS, *_SCOPE_HOOKS, "scopes_of_many"):
        answers = accounts_of_tokens(distinct)
    if answers is None:
        answers = auth.users_of_tokens(distinct)
    found = dict(zip(distinct, answers, strict=True))
    return [found[token] for token in tokens]


def _scopes(
    auth: RealtimeAuth,
    sockets: list[tuple[Any, str, ScopeAsk, list[Any]]],
    between: Callable[[], None] = _go_on,
) -> list[Any]:
    """Each socket's scopes, as ``resolve_scopes`` would answer, from one bulk ask."""
    if not sockets:
        return []
    found = auth.scopes_of_many(
        [ScopeQuestion(user, ask.slugs, held) for user, _, ask, held in sockets]
    )
    between()
    answers = []
    for (_, token, _, _), listed in zip(sockets, found, strict=True):
        scopes = normal_scopes(listed)
        ids = [scope.id for scope in scopes]
        reached = {scope_key(i) for i in auth.reached_scopes(token, ids)} if scopes else set()
        answers.append([scope for scope in scopes if scope.id in reached])
    return answers


def _recheck_one(
    auth: RealtimeAuth, user_id: Any, token: str, ask: ScopeAsk, held: list[Any]
) -> Any:
    try:
        user = auth.user_of_token(token)
        if user is None or normal_id(user.pk) != user_id:
            return None
        return resolve_scopes(auth, user, token, ask, held)
    except Exception as exc:
        # With its traceback, limited per place: with the database away, every socket fails.
        log_hook_failure("realtime: rechecking a socket of account %s failed", exc, user_id)
        return FAILED


def _authenticate_one(auth: RealtimeAuth, token: str, ask: ScopeAsk) -> Any:
    try:
        return authenticate(auth, token, ask)
    except Exception as exc:
        return exc
