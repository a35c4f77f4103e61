"""Who a socket is and which scopes it reads: the socket side's questions to the auth hooks.

The handshake, a client's ``watch`` and the rechecks all resolve scopes the same way, here, so
the three always agree. These functions run off the event loop (the hooks use the ORM).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from realtime.auth import RealtimeAuth, Scope
from realtime.encoding import normal_id
from realtime.sockets.limits import log_failure
from realtime.sockets.protocol import ScopeAsk

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
    known = {scope.id for scope in found}
    missing = [scope_id for scope_id in held_ids if scope_id not in known]
    if missing:
        found += list(auth.held_scopes(user, missing))
    if not found:
        return []
    reached = set(auth.reached_scopes(token, [scope.id for scope in found]))
    return [scope for scope in found if scope.id in reached]


def recheck(auth: RealtimeAuth, questions: list[tuple[Any, str, ScopeAsk, list[Any]]]) -> list[Any]:
    """Resolve each socket's bearer and scopes again: its scopes, ``None`` when the bearer is
    lost, ``FAILED`` when the hooks failed (logged)."""
    answers: list[Any] = []
    for user_id, token, ask, held in questions:
        try:
            user = auth.user_of_token(token)
            if user is None or normal_id(user.pk) != user_id:
                answers.append(None)
            else:
                answers.append(resolve_scopes(auth, user, token, ask, held))
        except Exception as exc:
            # One line per failure, limited: with the database away, every socket fails.
            log_failure("realtime: rechecking a socket of account %s failed", exc, user_id)
            answers.append(FAILED)
    return answers
