"""Durable transports for the tests of realtime's outbox: the table transport with
``durable = True``, named by dotted path in ``REALTIME_TRANSPORT`` (the outbox depends on no
transport of its own).

``DurableTableTransport`` notes the key of every publish. ``DyingTransport`` ends its process
(``os._exit``) when asked to publish: a writer that dies between its commit and its relay.
``DyingRedisTransport`` and ``RelayingThenDyingRedisTransport`` die on Redis, before and just
after relaying. ``RoundTripTransport`` checks, at every publish of outbox rows, that the rows
loaded back build exactly the messages it was given (``mid`` aside), before publishing them
(a mismatch raises: nothing is published).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any, ClassVar

from django.conf import settings
from django.db import connections

from realtime.transports.redis import RedisTransport
from realtime.transports.table import TableTransport
from realtime.writes import order, outbox, outbox_form
from realtime.writes.publish import RECHECKS, Built, build


class DurableTableTransport(TableTransport):
    durable = True
    #: The ``txn`` of each publish in this process, in order.
    keys: ClassVar[list[str | None]] = []

    def publish(self, messages: Sequence[tuple[str, bytes]], *, txn: str | None = None) -> None:
        self.keys.append(txn)
        super().publish(messages, txn=txn)


class DyingTransport(DurableTableTransport):
    def publish(self, messages: Sequence[tuple[str, bytes]], *, txn: str | None = None) -> None:
        os._exit(1)


class RoundTripTransport(DurableTableTransport):
    #: Keys whose rows were loaded and rebuilt, and what did not match.
    checked: ClassVar[list[str]] = []
    mismatches: ClassVar[list[tuple[str, Any, Any]]] = []

    def publish(self, messages: Sequence[tuple[str, bytes]], *, txn: str | None = None) -> None:
        if txn is not None:
            self.check(messages, txn)
        super().publish(messages, txn=txn)

    def check(self, messages: Sequence[tuple[str, bytes]], key: str) -> None:
        relay, _, run = key.partition("/")  # one run of a relay (``run_key``)
        txn, first, count = relay.split(".")
        items, seqs = [], []
        written_on = None  # the alias whose outbox holds the rows: their writes'
        for alias in settings.DATABASES:
            try:
                if not outbox.holds_outbox(alias):
                    continue
                with connections[alias].cursor() as cursor:
                    cursor.execute(
                        "SELECT id, seq, item FROM realtime_outbox WHERE txn = %s AND seq >= %s "
                        "ORDER BY seq LIMIT %s",
                        [txn, int(first), int(count)],
                    )
                    rows = cursor.fetchall()
            except AssertionError:  # Django's DatabaseOperationForbidden
                continue  # a test that uses one database only
            for id_, seq, raw in rows:
                written_on = alias
                item = outbox_form.load(bytes(raw))
                order.relayed(item, alias, id_)  # as a relay loads it
                items.append(item)
                seqs.append(seq)
        if not items:
            return  # an autocommit write's key: its rows are written only if it fails
        rebuilt = run_of(build(items, self.max_message_bytes, seqs, written_on), run)
        if comparable(rebuilt) != comparable(messages):
            self.mismatches.append((key, comparable(messages), comparable(rebuilt)))
            raise AssertionError(f"outbox rows {key} rebuild other messages: {rebuilt!r}")
        self.checked.append(key)


def run_of(built: Built, run: str) -> list[tuple[str, bytes]]:
    """The messages of one run of ``built``, named as its key names it (``""``: the first)."""
    wanted = 0 if not run else RECHECKS if run == "r" else int(run)
    start = 0
    for number, count in built.runs:
        if number == wanted:
            return built.messages[start : start + count]
        start += count
    return []


def comparable(messages: Sequence[tuple[str, bytes]]) -> list[tuple[str, Any]]:
    """Messages as (channel, decoded payload without its random ``mid`` and publication id:
    their places in the publication stay)."""
    out = []
    for channel, payload in messages:
        message = json.loads(payload)
        message.pop("mid", None)
        if "pub" in message:
            message["pub"] = message["pub"][1:]
        out.append((channel, message))
    return out


class DyingRedisTransport(RedisTransport):
    """The Redis transport of a writer that dies between its commit and its relay."""

    def publish(self, messages: Sequence[tuple[str, bytes]], *, txn: str | None = None) -> None:
        os._exit(1)


class RelayingThenDyingRedisTransport(RedisTransport):
    """The Redis transport of a writer that relays, then dies before deleting its rows: the
    rows stay, and a sweeper relays them again, with the same key."""

    def publish(self, messages: Sequence[tuple[str, bytes]], *, txn: str | None = None) -> None:
        super().publish(messages, txn=txn)
        os._exit(1)


class ClientRefusingRedisTransport(RedisTransport):
    """The Redis transport of a writer whose client library refuses its own options, as
    redis-py 8 refused keepalive options on a Unix socket: a ``TypeError`` from inside the
    transport, about no value of the announcement."""

    def publish(self, messages: Sequence[tuple[str, bytes]], *, txn: str | None = None) -> None:
        raise TypeError("AbstractConnection.__init__() got an unexpected keyword argument")
