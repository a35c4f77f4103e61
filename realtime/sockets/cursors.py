"""Resume cursors: a position in the log, signed for one account, stamped with its time.

A cursor is ``<position>.<time>.<signature>``: the position (the log id of the last message
the socket was handed, base 36; ``-`` when there is none), the time it was handed out (seconds,
base 36) and an HMAC-SHA256 of both under a key derived from ``SECRET_KEY`` and the account's
id (128 bits, URL-safe base64). Any worker sharing the database and the secret reads it; a
garbled or forged cursor, one of another account, or one older than ``REALTIME_RESUME_WINDOW``
reads as nothing. ``SECRET_KEY_FALLBACKS`` still verify cursors signed before a rotation.

Signing costs one HMAC per frame of a resumable socket, with the account's key cached.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from functools import lru_cache
from typing import Any, Final

from django.conf import settings

from realtime.conf import conf

SALT: Final = "realtime.cursor"
#: The longest cursor a client may send back: anything longer is garbage.
MAX_LENGTH: Final = 256
NO_POSITION: Final = "-"
#: Seconds a cursor may seem to come from the future (workers' clocks differ a little).
CLOCK_SKEW: Final = 60


def cursor_for(user_id: Any, position: int | None, now: float | None = None) -> str:
    """The cursor of ``position`` for the account ``user_id`` (normalised id)."""
    stamp = _base36(int(time.time() if now is None else now))
    where = NO_POSITION if position is None else _base36(position)
    message = f"{where}.{stamp}"
    return f"{message}.{_signature(settings.SECRET_KEY, user_id, message)}"


def position_of(user_id: Any, cursor: Any, now: float | None = None) -> int | None:
    """The position a cursor names for ``user_id``; ``None`` for anything that is not a valid,
    unexpired cursor of that account with a position."""
    if not isinstance(cursor, str) or not 0 < len(cursor) <= MAX_LENGTH or not cursor.isascii():
        return None
    parts = cursor.split(".")
    if len(parts) != 3:
        return None
    where, stamp, signature = parts
    message = f"{where}.{stamp}"
    secrets = [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", [])]
    if not any(hmac.compare_digest(signature, _signature(s, user_id, message)) for s in secrets):
        return None
    try:
        handed_out = int(stamp, 36)
        position = None if where == NO_POSITION else int(where, 36)
    except ValueError:
        return None
    age = (time.time() if now is None else now) - handed_out
    # Another worker's clock may run a little ahead of this one's.
    if age > conf.RESUME_WINDOW or age < -CLOCK_SKEW:
        return None
    return position


def _signature(secret: Any, user_id: Any, message: str) -> str:
    mac = hmac.new(_key(str(secret), str(user_id)), message.encode("ascii"), hashlib.sha256)
    return base64.urlsafe_b64encode(mac.digest()[:16]).rstrip(b"=").decode("ascii")


@lru_cache(maxsize=8192)
def _key(secret: str, user_id: str) -> bytes:
    return hashlib.sha256(f"{SALT}:{user_id}:{secret}".encode()).digest()


def _base36(number: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    if number < 0:
        raise ValueError("positions and times are not negative")
    text = ""
    while True:
        number, digit = divmod(number, 36)
        text = digits[digit] + text
        if number == 0:
            return text
