"""Tokens: the signed bearer ``issue_token`` makes and the default ``RealtimeAuth`` reads.

A token holds an account id, a fingerprint of what it remembers of the account (username,
email, and the password with ``REALTIME_REVOKE_ON_PASSWORD_CHANGE``) and the second it was
issued, signed with Django's ``signing``; one the token view issued also names the session it
was issued to (``session_claim``), so that signing out of that session ends its sockets. It
stands while it is younger than ``REALTIME_TOKEN_MAX_AGE`` and the account is active and still
what it remembers (``stands``: the one rule, whether an account is read as an instance or as
columns). Its signature is checked once per worker and remembered; its age at every read.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import functools
import hashlib
import hmac
import json
import time
import zlib
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core import signing
from django.utils.crypto import salted_hmac

from realtime.conf import conf

TOKEN_SALT = "realtime.token"  # noqa: S105 - a namespace for signing, not a secret
#: The namespace of the keyed hash that names a session in a token (never its key itself).
SESSION_SALT = "realtime.token.session"
#: Hex digits of that hash a token holds: enough that two sessions never share one.
SESSION_CLAIM_DIGITS = 16

#: Well-signed tokens kept once checked (least recently used dropped first): a socket's token
#: is read again at every recheck, and checking a signature was a quarter of the cost. Only
#: tokens this project signed get in (a failure raises, and is not kept), so their size is ours.
CHECKED_TOKENS = 65_536


def claims_of(token: str) -> tuple[Any, str] | None:
    """The account id and fingerprint a well-signed, unexpired token holds, else ``None``.

    Its age is checked at every read, its signature only at the first (``_signed``). A token
    holds the second it was issued in its signed payload (``"t"``); one issued before it did
    (without ``"t"``) is read as Django's signing reads its age, ``signing.loads`` with
    ``max_age``, signature included, at every read: that lasts ``REALTIME_TOKEN_MAX_AGE`` at
    most, until the last such token expires.
    """
    try:
        user_id, fingerprint, issued, _ = _signed(token)
        if issued is None:
            max_age = datetime.timedelta(seconds=conf.TOKEN_MAX_AGE)
            signing.loads(token, salt=TOKEN_SALT, max_age=max_age)
        elif time.time() - issued > conf.TOKEN_MAX_AGE:
            return None  # expired as Django's signing tells it: older than the maximum age
    except (signing.BadSignature, ValueError, TypeError):
        return None
    return user_id, fingerprint


def session_claim(token: str) -> str | None:
    """The session a well-signed token was issued to (``session_hash`` of its key), else
    ``None``: a token ``issue_token`` signed without one, or none of this project's."""
    try:
        return _signed(token)[3]
    except (signing.BadSignature, ValueError, TypeError):
        return None


@functools.lru_cache(maxsize=CHECKED_TOKENS)
def _signed(token: str) -> tuple[Any, str, int | float | None, str | None]:
    """What a token signed with this project's keys holds: its account id, its fingerprint,
    the second it was issued (``None``: a token from before it was held) and the session it
    names (``None``: none); raises ``BadSignature`` (or ``ValueError``) for any other."""
    claims = signing.loads(token, salt=TOKEN_SALT)
    if not isinstance(claims, dict) or "u" not in claims or "f" not in claims:
        raise signing.BadSignature("not a realtime token")
    issued = claims.get("t")
    if issued is not None and (isinstance(issued, bool) or not isinstance(issued, int | float)):
        raise signing.BadSignature("not a realtime token")
    session = claims.get("s")
    return claims["u"], str(claims["f"]), issued, session if isinstance(session, str) else None


def refusal_cause(token: str, account: Callable[[Any], Any | None]) -> str:
    """Why ``claims_of`` and ``standing`` refuse ``token``, in words that name the fix: for the
    server's log only (the client is told the protocol's one reason). ``account`` reads the
    account of an id (``None``: there is none); it is asked only of a well-signed token."""
    try:
        user_id, fingerprint, issued, _ = _signed(token)
    except (signing.BadSignature, ValueError, TypeError):
        if _looks_signed(token):
            return (
                "its signature is not this project's: signed under another SECRET_KEY (add the "
                "old key to SECRET_KEY_FALLBACKS while tokens signed with it live) or altered"
            )
        return "malformed: not a token issue_token made"
    age = None if issued is None else time.time() - issued
    if claims_of(token) is None:
        shown = "" if age is None else f"issued {age:.0f} s ago, "
        return f"expired: {shown}older than REALTIME_TOKEN_MAX_AGE ({conf.TOKEN_MAX_AGE:g} s)"
    user = account(user_id)
    if user is None:
        return f"account {user_id!r} no longer exists"
    if not getattr(user, "is_active", True):
        return f"account {user_id!r} is inactive"
    if standing(user, (user_id, fingerprint)) is None:
        remembered_fields = "username or email"
        if conf.REVOKE_ON_PASSWORD_CHANGE:
            remembered_fields = "username, email or password"
        return (
            f"account {user_id!r} changed its {remembered_fields} since the token was issued: "
            "a new token stands"
        )
    return f"account {user_id!r} stands now (it did not when the socket was refused)"


def _looks_signed(token: str) -> bool:
    """Whether ``token`` has the form of a value Django's ``signing.dumps`` made: a payload
    that decodes to a JSON object, a timestamp and a signature."""
    parts = token.split(":")
    if len(parts) != 3:
        return False
    payload = parts[0].removeprefix(".")
    try:
        # URL-safe base64 without its padding, as Django writes it (with the standard library:
        # Django's own decoder is not a documented function).
        decoded = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
        if parts[0].startswith("."):
            decoded = zlib.decompress(decoded)
        return isinstance(json.loads(decoded), dict)
    except (ValueError, zlib.error, binascii.Error):
        return False


def forget_checked_tokens() -> None:
    """Check every token's signature again (the project's signing keys changed)."""
    _signed.cache_clear()


def standing(user: Any | None, claims: tuple[Any, str]) -> Any | None:
    """``user`` if the token still stands for it (``stands``, read from the instance)."""
    if user is None:
        return None
    return (
        user if stands(claims[1], getattr(user, "is_active", True), *remembered_of(user)) else None
    )


def stands(fingerprint: str, active: Any, username: Any, email: Any, password: Any) -> bool:
    """Whether a token remembering ``fingerprint`` still stands for an account holding these
    values: the account is active (``active``: its ``is_active``, ``True`` where it has none)
    and still what the token remembers of it (``remembered``).

    The one rule of a token's standing: the instance path (``user_of_token``,
    ``users_of_tokens``) and the recheck's column path (``realtime.sockets.standing``) differ
    only in where they read these values.
    """
    return bool(active) and remembered(fingerprint, username, email, password)


def remembered(fingerprint: str, username: Any, email: Any, password: Any) -> bool:
    """Whether a token's ``fingerprint`` is that of an account holding these values, under
    the secret key or under a fallback key (a token issued before the key was rotated, as
    Django's signing accepts)."""
    return any(
        hmac.compare_digest(fingerprint, fingerprint_of(username, email, password, key))
        for key in (None, *settings.SECRET_KEY_FALLBACKS)
    )


def remembered_of(user: Any) -> tuple[Any, Any, Any]:
    """What a token remembers of ``user``: its username, its email and its password."""
    return user.get_username(), getattr(user, user.get_email_field_name(), ""), user.password


def token_fingerprint(user: Any, secret: str | bytes | None = None) -> str:
    """What a token remembers of its account: a change invalidates every token issued before.

    Keyed with ``secret`` (default: the ``SECRET_KEY``), so that a token reveals nothing.
    """
    return fingerprint_of(*remembered_of(user), secret)


def fingerprint_of(
    username: Any, email: Any, password: Any, secret: str | bytes | None = None
) -> str:
    """``token_fingerprint`` of an account with these values (the password counts only with
    ``REALTIME_REVOKE_ON_PASSWORD_CHANGE``): the first 20 hex digits of their HMAC-SHA256,
    keyed with the SHA-256 of ``TOKEN_SALT`` and ``secret`` (the construction Django's
    ``salted_hmac`` makes, written with the standard library so that no change of Django's
    revokes a token)."""
    parts = [str(username), str(email)]
    if conf.REVOKE_ON_PASSWORD_CHANGE:
        parts.append(str(password))
    key = settings.SECRET_KEY if secret is None else secret
    salted = hashlib.sha256(TOKEN_SALT.encode() + _bytes(key)).digest()
    return hmac.new(salted, "\0".join(parts).encode(), hashlib.sha256).hexdigest()[:20]


def _bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def issue_token(user: Any, *, session_key: str | None = None) -> str:
    """Sign a bearer for ``user`` that the default ``RealtimeAuth.user_of_token`` accepts.

    ``session_key``: the Django session it is issued to (the token view's). The token then
    names it (its ``session_hash``, never the key), and signing out of that session through
    Django's ``logout`` refuses its sockets at once (``realtime.writes.rechecks``)."""
    pk = user.pk if isinstance(user.pk, int | str) else str(user.pk)
    claims = {"u": pk, "f": token_fingerprint(user), "t": int(time.time())}
    if session_key:
        claims["s"] = session_hash(session_key)
    return signing.dumps(claims, salt=TOKEN_SALT)


def session_hash(session_key: str, secret: str | bytes | None = None) -> str:
    """How a token names a session: a keyed hash of its key (``SESSION_SALT``, keyed with
    ``secret``, default the ``SECRET_KEY``), so that a token reveals nothing of it."""
    digest = salted_hmac(SESSION_SALT, session_key, secret=secret, algorithm="sha256")
    return digest.hexdigest()[:SESSION_CLAIM_DIGITS]


def session_hashes(session_key: str) -> list[str]:
    """Every name a token may give a session: under the secret key and under each fallback
    key (a token issued before the key was rotated)."""
    keys = (None, *settings.SECRET_KEY_FALLBACKS)
    return list(dict.fromkeys(session_hash(session_key, key) for key in keys))
