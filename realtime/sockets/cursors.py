"""Resume cursors: where a socket is in the history, signed for one account, stamped with its
time.

A cursor is ``<where>.<time>.<signature>``: where the socket is, the time it was handed out
(seconds, base 36) and an HMAC-SHA256 of both under a key derived from ``SECRET_KEY`` and the
account's id (128 bits, URL-safe base64). Any worker sharing the secret reads it; a garbled or
forged cursor, one of another account, or one older than ``REALTIME_RESUME_WINDOW`` reads as
nothing. ``SECRET_KEY_FALLBACKS`` still verify cursors signed before a rotation.

``where`` takes one of two forms (``realtime.positions``):

* a transport with one global log (table, pg_notify): the log id of the last message the
  socket was handed, base 36, or ``-`` when there is none; then ``_<mark>``, the mark of the
  message at that id (``realtime.positions.mark_of``), when it is known: a resume checks that
  the log still holds that message there (its ids may have started over since; a cursor
  made before marks were, or bound to no message, is resumed only where the log no longer
  holds its position); then ``~<stream key>`` for each
  channel of a scope the socket heard when the cursor was handed out (the key below). One
  log id is a place in every channel: it is one in a scope's only if the socket heard that
  scope then. A socket that comes back hearing a scope its cursor does not name (gained
  while away, or asked for now) is not resumed: what that scope said before was not its to
  hear. A cursor of the form without keys names no scope;
* a transport with a stream per channel (Redis): ``2.<entry>~<entry>…``, one entry per stream
  the socket hears, each ``<stream key><epoch><offset>``: 4 characters of the stream name's
  SHA-256 (URL-safe base64), the first ``EPOCH_CHARS`` characters of its epoch and the offset
  in base 36. The stream a key names is found among the streams the socket hears when it
  comes back (two of them with one key make no cursor). Where the entries would make a cursor
  longer than ``MAX_LENGTH``, the cursor names no position: such a socket keeps its frames but
  is not resumed.

Either way, two channels a socket hears with one key make no cursor, and a socket that comes
back hearing two channels of one key is not resumed: a key must name one channel.

Signing costs one HMAC per frame of a resumable socket (per account and frame on a global
log), with the account's key cached.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Collection
from functools import lru_cache
from typing import Any, Final

from django.conf import settings

from realtime.conf import conf
from realtime.positions import GLOBAL, Vector

SALT: Final = "realtime.cursor"
#: The longest cursor a client may send back: anything longer is garbage.
MAX_LENGTH: Final = 256
NO_POSITION: Final = "-"
#: Seconds a cursor may seem to come from the future (workers' clocks differ a little).
CLOCK_SKEW: Final = 60
#: Characters of a stream's epoch a cursor keeps (36 bits of a random epoch).
EPOCH_CHARS: Final = 6
#: The mark of a cursor whose position is a vector of streams.
STREAMS: Final = "2"
STREAM_KEY_CHARS: Final = 4
ENTRY_SEPARATOR: Final = "~"
#: Between a global log's position and the mark of its message.
MARK_SEPARATOR: Final = "_"


def cursor_for(
    user_id: Any, where: Vector | None, now: float | None = None, *, heard: Collection[str] = ()
) -> str:
    """The cursor of ``where`` for the account ``user_id`` (normalised id); ``heard``: the
    channels of the scopes the socket hears (named by a cursor of a global log)."""
    stamp = _base36(int(time.time() if now is None else now))
    message = f"{_where(where, heard)}.{stamp}"
    if len(message) + 23 > MAX_LENGTH:  # the signature and its dot
        message = f"{NO_POSITION}.{stamp}"
    return f"{message}.{_signature(settings.SECRET_KEY, user_id, message)}"


def read_cursor(
    user_id: Any,
    cursor: Any,
    streams: Collection[str] = (GLOBAL,),
    now: float | None = None,
    *,
    heard: Collection[str] = (),
) -> Vector | None:
    """Where a cursor says the socket of ``user_id`` was, among ``streams`` (those it hears
    now: a stream's entry is found by its key); ``None`` for anything that is not a valid,
    unexpired cursor of that account with a position, and for a cursor of a global log that
    does not name each of ``heard`` (the channels of the scopes the socket hears now).

    The epochs of a stream vector's entries are what the cursor kept of them: compare them
    with ``same_epoch``."""
    if not isinstance(cursor, str) or not 0 < len(cursor) <= MAX_LENGTH or not cursor.isascii():
        return None
    message, _, signature = cursor.rpartition(".")
    where, _, stamp = message.rpartition(".")
    secrets = [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", [])]
    if not any(hmac.compare_digest(signature, _signature(s, user_id, message)) for s in secrets):
        return None
    try:
        handed_out = int(stamp, 36)
        vector = _vector(where, streams, heard)
    except ValueError:
        return None
    age = (time.time() if now is None else now) - handed_out
    # Another worker's clock may run a little ahead of this one's.
    if age > conf.RESUME_WINDOW or age < -CLOCK_SKEW:
        return None
    return vector


def position_of(user_id: Any, cursor: Any, now: float | None = None) -> int | None:
    """The global log position a cursor names for ``user_id`` (``None``: none, or not a valid
    cursor of that account); see ``read_cursor``."""
    vector = read_cursor(user_id, cursor, (GLOBAL,), now)
    entry = None if vector is None else vector.get(GLOBAL)
    return None if entry is None else entry[1]


def stamp_of(cursor: str) -> int:
    """When a cursor ``read_cursor`` accepted was handed out (seconds)."""
    return int(cursor.rpartition(".")[0].rpartition(".")[2], 36)


def same_epoch(epoch: str, kept: str) -> bool:
    """Whether ``kept``, an epoch as a cursor gave it back, is ``epoch``."""
    return kept == epoch or kept == _epoch_prefix(epoch)


def _epoch_prefix(epoch: str) -> str:
    """What a stream cursor keeps of ``epoch``: its first ``EPOCH_CHARS`` characters."""
    return f"{epoch[:EPOCH_CHARS]:_<{EPOCH_CHARS}}"


def _where(where: Vector | None, heard: Collection[str]) -> str:
    if not where:
        return NO_POSITION
    if set(where) == {GLOBAL}:
        mark, offset = where[GLOBAL]
        named = {stream_key(channel) for channel in heard}
        if len(named) < len(set(heard)):
            return NO_POSITION  # two channels of one key: see the module docstring
        position = f"{_base36(offset)}{MARK_SEPARATOR}{mark}" if mark else _base36(offset)
        return "".join([position, *(f"{ENTRY_SEPARATOR}{k}" for k in sorted(named))])
    keys = [stream_key(stream) for stream in where]
    if len(set(keys)) < len(keys):
        return NO_POSITION  # two streams of one key: a cursor could not tell them apart
    entries = [
        f"{key}{_epoch_prefix(epoch)}{_base36(offset)}"
        for key, (epoch, offset) in zip(keys, where.values(), strict=True)
    ]
    return f"{STREAMS}.{ENTRY_SEPARATOR.join(sorted(entries))}"


def _vector(where: str, streams: Collection[str], heard: Collection[str]) -> Vector | None:
    """Raises ``ValueError`` for what is not a ``where``."""
    if where == NO_POSITION:
        return None
    kind, _, entries = where.rpartition(".")
    if not kind:
        if "." in where:
            raise ValueError(where)
        position, *named = where.split(ENTRY_SEPARATOR)
        if any(len(key) != STREAM_KEY_CHARS for key in named):
            raise ValueError(where)
        keys = {stream_key(channel) for channel in heard}
        if len(keys) < len(set(heard)) or not keys <= set(named):
            return None  # a scope heard now that the socket did not hear then
        log_id, marked, mark = position.partition(MARK_SEPARATOR)
        if marked:
            _number(mark)
        return Vector({GLOBAL: (mark, _number(log_id))})
    if kind != STREAMS:
        raise ValueError(where)
    by_key: dict[str, str] = {}
    for stream in streams:
        by_key.setdefault(stream_key(stream), stream)
    vector: dict[str, tuple[str, int]] = {}
    for entry in entries.split(ENTRY_SEPARATOR):
        key = entry[:STREAM_KEY_CHARS]
        epoch = entry[STREAM_KEY_CHARS : STREAM_KEY_CHARS + EPOCH_CHARS]
        offset = _number(entry[STREAM_KEY_CHARS + EPOCH_CHARS :])
        if key in by_key:
            vector[by_key[key]] = (epoch, offset)
    return Vector(vector)


def _number(text: str) -> int:
    if not text or not text.isalnum():
        raise ValueError(text)
    return int(text, 36)


@lru_cache(maxsize=65536)
def stream_key(stream: str) -> str:
    """The characters that stand for ``stream`` in a cursor."""
    digest = hashlib.sha256(stream.encode("utf-8")).digest()[:3]
    return base64.urlsafe_b64encode(digest).decode("ascii")


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
