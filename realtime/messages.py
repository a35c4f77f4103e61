"""The internal messages between publishing processes and listening workers.

The write side builds them (``realtime.writes.packing``) and a transport carries them; the
socket side reads them (``realtime.sockets.delivery``). Neither side imports the other: this
module is the contract between them. A message is a JSON object with a ``target``:

``scope``
    on ``<REALTIME_CHANNEL>_<scope id>``: ``scope_id``, ``event_type``, ``data``, ``channels``
    (``null``: every socket of the scope), ``meta``; optionally ``only`` (the accounts it
    reaches), ``exclude`` (accounts it skips) and ``about`` (``{"model", "id"}``, and
    ``using`` as below: ask the audience hook).
``global``
    on ``<REALTIME_CHANNEL>``: ``event_type``, ``data``, ``channels``, ``meta``; optionally
    ``only`` and ``about`` as above. An event of a global model (``scope_field=None``): every
    signed-in socket holding one of ``channels`` hears it, whatever scopes it reads.
``users``
    on ``<REALTIME_CHANNEL>``: ``user_ids``, ``event_type``, ``data``, ``channels``, ``meta``;
    optionally ``skip_scope`` (sockets reading that scope heard it there already), ``row``
    (``true``: a model's event about the row its data names, which a resume re-decides; an
    application's own event never has it) and, beside it, ``using`` as below.
``recheck``
    on ``<REALTIME_CHANNEL>``: ``user_ids`` whose sockets every worker rechecks now; optionally
    ``ended_sessions`` (the ``session_claim`` of sessions signed out of: their sockets are
    refused at once); every worker reads it, to remember it (``asks_recheck``).

A message naming the row it tells of (``about``; an account message's ``row``) names the
database alias the row was written on, ``using``, when that is not where its model's writes go
(``router.db_for_write``): a write made with ``using=`` or on a queryset's ``using()``. Every
read a worker makes about that row goes there (``row_alias``); the messages of writes made
where their model's writes go have no such key.

Every message carries a unique ``mid`` (PostgreSQL merges identical notifications of one
transaction): 32 hex digits, the publish time in microseconds since the epoch (13 digits)
then 19 random ones (``new_mid``). The time gives the socket side its commit→frame lag
(``published_at``); an id of another form (a UUID's hex, from a publisher of an earlier
version) reads as a time years away, and is taken as none. ``meta`` holds ``origin``,
``changed`` and ``truncated`` when they apply, and a model event's ``order``: ``[source,
number]``, or ``[source, number, "links"]`` (``LINKS``) for an event of a row's many-to-many
links alone (``realtime.writes.order``, ``realtime.sockets.record_order``).

The messages of one publication (one transaction's, published together) of two or more
begin with ``"pub": [id, rest, channels]`` (``mark_publication``): the publication's id, how
many of its messages follow on the same channel, and on how many channels it has messages.
A worker tells its live queries' clients what a publication changed once it has carried all
of it (``publication_of``), not half of it.

Every worker hears every account's events (the base channel), most of them for accounts it
holds no socket for; realtime writes ``user_ids`` last, so ``addressed_to`` reads them from
the end of a message without decoding the rest.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any, Final, NamedTuple

from django.db import models

from realtime.conf import conf
from realtime.primary import primary

SCOPE: Final = "scope"
GLOBAL: Final = "global"
USERS: Final = "users"
RECHECK: Final = "recheck"


#: The third part of the ``order`` of an event of a row's many-to-many links alone.
LINKS = "links"

#: The types of the frames the socket protocol sends of its own (``realtime.sockets.protocol``:
#: ``auth_success``, ``auth_error``, resume's ``cursor``; ``realtime.sockets.live_queries``:
#: ``query.*``). Clients route a frame by its type, so an application's event under one of
#: them would be taken for the protocol's frame (a second handshake, a refusal, a cursor, a
#: live query's answer): the broadcast API refuses them as event types.
PROTOCOL_FRAME_TYPES: Final = frozenset(
    {"auth_success", "auth_error", "cursor", "query.rows", "query.diff", "query.error"}
)


def scope_channel(scope_id: Any) -> str:
    """The transport channel of one scope's events."""
    return f"{conf.CHANNEL}_{scope_id}"


def base_channel() -> str:
    """The transport channel of account events and recheck requests."""
    return conf.CHANNEL


#: The key naming the alias a message's row was written on (see the module docstring).
USING: Final = "using"


def named_alias(model: type[models.Model], using: str | None) -> str | None:
    """The alias a message names for a row of ``model`` written on ``using``: ``None`` (it
    names none) when that is where the model's writes go, or is not known."""
    return None if using is None or using == primary(model) else using


def row_alias(model: type[models.Model], naming: Mapping[str, Any]) -> str:
    """The alias the row of ``model`` that ``naming`` tells of lives on (``naming``: a
    message's ``about``, or an account message about a row): the alias it names, else where
    the model's writes go. The one answer every read a worker makes about a message's row
    asks."""
    using = naming.get(USING)
    return using if isinstance(using, str) else primary(model)


def new_mid() -> str:
    """A unique message id that says when it was made (see the module docstring)."""
    return f"{time.time_ns() // 1000:013x}{os.urandom(10).hex()[:19]}"


#: Seconds a publish time may lie from now and still be believed (clocks, queues, outages).
BELIEVABLE = 86400.0


def published_at(mid: Any) -> float | None:
    """The Unix time a ``new_mid`` was made; ``None`` for an id of any other form."""
    if not isinstance(mid, str) or len(mid) != 32:
        return None
    try:
        at = int(mid[:13], 16) / 1_000_000
    except ValueError:
        return None
    return at if abs(time.time() - at) < BELIEVABLE else None


_USER_IDS: Final = b'"user_ids":'


def addressed_to(payload: bytes) -> list[Any] | None:
    """The ``user_ids`` of an account message (``users``, ``recheck``), read from the key
    that ends it, without decoding the rest; ``None`` when the payload does not end with it
    (a message of another kind, or of another writer's layout): decode it whole.

    A JSON string cannot hold ``"user_ids":`` with bare quotes, so its last occurrence is a
    key; the tail from there parses as an object only if that key is the top level's (one
    nested deeper leaves closing braces over)."""
    at = payload.rfind(_USER_IDS)
    if at < 0:
        return None
    try:
        tail = json.loads(b"{" + payload[at:])
    except ValueError:
        return None
    ids = tail.get("user_ids") if isinstance(tail, dict) else None
    return ids if isinstance(ids, list) else None


_RECHECK: Final = b'"recheck"'


def asks_recheck(payload: bytes) -> bool:
    """Whether a message may be a ``recheck``: every worker decodes it, holding a socket of
    its accounts or not, to remember the request for the sockets still in their handshake
    (their account read before it, they are owed it once registered), and the sessions it
    names signed out of (``ended_sessions``) for the sockets still to come with their
    tokens. A string holding the word costs only a decoding."""
    return _RECHECK in payload


_PUB: Final = b'{"pub":'


class Publication(NamedTuple):
    """A message's place in its publication: its ``id``, how many of its messages ``rest``
    on the same channel after this one, and on how many ``channels`` it has messages."""

    id: str
    rest: int
    channels: int


def mark_publication(
    messages: list[tuple[str, bytes]], budget: int | None = None
) -> list[tuple[str, bytes]]:
    """``messages`` (one publication, in order), each told its place in it (see the module
    docstring); a publication of one message is left as it is, and so is a message the mark
    would take past ``budget`` (a worker then takes it for a publication of its own: at
    worst, a live query hears that publication in two diffs)."""
    if len(messages) < 2:
        return messages
    publication = os.urandom(6).hex().encode()
    rest = Counter(channel for channel, _ in messages)
    channels = len(rest)
    marked = []
    for channel, payload in messages:
        rest[channel] -= 1
        mark = b'%s["%s",%d,%d],' % (_PUB, publication, rest[channel], channels)
        fits = budget is None or len(mark) + len(payload) - 1 <= budget
        marked.append((channel, mark + payload[1:] if fits else payload))
    return marked


def publication_of(payload: bytes) -> Publication | None:
    """The place of a message in its publication, read from its start without decoding the
    rest; ``None`` for a publication of one message (or a message of another layout)."""
    if not payload.startswith(_PUB):
        return None
    end = payload.find(b"]", len(_PUB))
    try:
        publication, rest, channels = json.loads(payload[len(_PUB) : end + 1])
    except (ValueError, TypeError):
        return None
    if isinstance(publication, str) and isinstance(rest, int) and isinstance(channels, int):
        return Publication(publication, rest, channels)
    return None
