"""Where one transport channel lives in Redis: its hash tag, keys and shard channel.

Each transport channel (``realtime_<scope id>``, and the base channel ``realtime``) is one
*stream* of its own, kept in four places that share a hash tag ``T``, so that on a Redis
Cluster they sit in one slot and one script may touch them all (a fifth key is never
written):

* ``T:x``, the stream: one entry per message, id ``<ms>-<offset>``, fields ``p`` (the
  payload) and ``k`` (the transaction key, when the publisher gave one);
* ``T:m``, the meta hash: ``e`` the epoch, ``n`` the top offset, ``t`` the milliseconds of
  the last id, ``r`` the server's ``run_id`` and replication ID at the last write;
* ``T:t``, the transaction keys relayed lately (a sorted set: a re-relay is dropped);
* ``T`` itself, the shard channel live messages are published on, as
  ``<epoch>:<offset>:<payload>`` (``<epoch>:<offset>:`` alone for a payload too large to
  travel live: the worker reads it from the stream);
* ``T:g``, the guard, never written: a publish names it, so that no publish runs while a
  Redis Cluster migrates the channel's slot. A node runs a command whose keys it does not
  all hold only when its slot is stable: while the slot is being migrated the node giving
  it away redirects the command (``ASK``, or ``TRYAGAIN``: some keys moved), and the node
  taking it refuses it too (``TRYAGAIN``: a command of several keys, some missing). A
  publish run there would reach no worker: a shard channel is served by the node giving the
  slot away until the migration is done, and the workers are subscribed there, while the
  node taking it sends its messages to its own subscribers alone. Refused, the publish
  fails (``PublishError``) and the outbox relays it once the slot has moved.

The tag is the channel name in braces; a name that holds a brace itself (a custom channel, a
text scope key) is tagged by a digest instead, the same on every process.
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple


def tag(channel: str) -> str:
    """The hash tag of ``channel``: ``{channel}``, or ``{h:<digest>}`` if it holds a brace."""
    if "{" in channel or "}" in channel:
        return "{h:" + hashlib.sha256(channel.encode("utf-8")).hexdigest()[:16] + "}"
    return "{" + channel + "}"


def stream_key(channel: str) -> str:
    return tag(channel) + ":x"


def meta_key(channel: str) -> str:
    return tag(channel) + ":m"


def dedupe_key(channel: str) -> str:
    return tag(channel) + ":t"


def guard_key(channel: str) -> str:
    """A key of ``channel``'s slot that is never written (see the module docstring)."""
    return tag(channel) + ":g"


def shard_channel(channel: str) -> str:
    """The Pub/Sub shard channel the live messages of ``channel`` go out on."""
    return tag(channel)


class Live(NamedTuple):
    """One live message: the stream's epoch, the offset (``seq``), and the payload (``None``: too
    large to travel live, read it from the stream)."""

    epoch: str
    seq: int
    payload: bytes | None


def parse_live(data: bytes) -> Live | None:
    """The parts of ``<epoch>:<offset>:<payload>``; ``None`` if ``data`` is not one."""
    epoch, _, rest = data.partition(b":")
    offset, colon, payload = rest.partition(b":")
    if not epoch or not colon or not offset.isdigit():
        return None
    return Live(epoch.decode("ascii", "replace"), int(offset), payload or None)
