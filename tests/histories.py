"""What the transport of a test keeps as history, read and trimmed whatever its shape: the
table and pg_notify transports' log in ``firm_channel_messages``, or Redis's streams.

Resume tests compare what a socket heard with the history, and cut the history to see a
resume refused; these helpers let one test do so on every transport (``each_transport``).
"""

from __future__ import annotations

from io import StringIO
from typing import Any

from django.core.management import call_command
from django.core.management.color import no_style
from django.db import connection

from realtime.conf import conf
from realtime.messages import base_channel, scope_channel
from realtime.positions import GLOBAL, StreamPos, Vector
from realtime.sockets.cursors import read_cursor
from realtime.transports import get_transport
from realtime.transports.redis_keys import stream_key
from realtime.transports.table_store import MessageStore


def place(user_id: Any, cursor: Any, *scope_ids: Any) -> Vector | None:
    """Where ``cursor`` says the socket of ``user_id`` was: a global log's position, or its
    place in Redis's streams of the base channel and of ``scope_ids``."""
    streams = [GLOBAL, base_channel(), *(scope_channel(scope_id) for scope_id in scope_ids)]
    return read_cursor(user_id, cursor, streams)


def reached(later: Vector | None, earlier: Vector | None) -> bool:
    """Whether ``later`` is at or past ``earlier`` in each of ``earlier``'s streams."""
    if later is None or earlier is None:
        return False
    return all(later.covers(StreamPos(s, epoch, seq)) for s, (epoch, seq) in earlier.items())


def passed(later: Vector | None, earlier: Vector | None) -> bool:
    """Whether ``later`` is past ``earlier``: at or past it everywhere, and not the same."""
    return reached(later, earlier) and later != earlier


def _redis() -> Any:
    import redis

    return redis.Redis.from_url(conf.REDIS_URL)


def _full_epochs(where: Vector) -> Vector:
    """``where`` with each stream's whole epoch (a cursor keeps the first characters only)."""
    if set(where) <= {GLOBAL}:
        return where
    bounds = get_transport().stream_bounds(list(where)) or {}
    return Vector({s: (bounds[s].epoch, seq) for s, (_, seq) in where.items() if s in bounds})


def messages_between(
    channels: list[str], after: Vector, upto: Vector | None = None
) -> list[tuple[str, bytes, StreamPos]]:
    """The messages of ``channels`` the history holds after ``after`` (up to ``upto``, in
    each of its streams), in order within each stream."""
    transport = get_transport()
    after = _full_epochs(after)
    found = []
    while True:
        page = transport.read_streams(channels, after, 1000)
        found += page
        if len(page) < 1000:
            break
        after = after.merged(Vector.of(position for _, _, position in page))
    if upto is None:
        return found
    upto = _full_epochs(upto)
    return [entry for entry in found if upto.covers(entry[2])]


def trim_everything() -> None:
    """Cut all the history: every row of the log (``realtime_trim`` with no retention), or
    every entry of every Redis stream (their metas, the top offsets, stay)."""
    if conf.TRANSPORT != "redis":
        call_command("realtime_trim", retention=0, stdout=StringIO())
        return
    client = _redis()
    for key in client.scan_iter(match="*:x", _type="stream"):
        client.xtrim(key, maxlen=0)


def start_the_log_over() -> int:
    """Empty the log with its ids, as ``manage.py flush`` does (and, in effect, a backup of
    an older copy restored): the next message is id 1 again. Return the last id it had
    handed out; give it to ``go_on_after`` before the test ends."""
    high = _highest_id()
    sql = connection.ops.sql_flush(no_style(), ["firm_channel_messages"], reset_sequences=True)
    connection.ops.execute_sql_flush(sql)
    return high


def next_id_is(number: int) -> None:
    """Have the log's next message take id ``number`` (it holds none at or above it)."""
    with connection.cursor() as sql:
        if connection.vendor == "sqlite":
            sql.execute("DELETE FROM sqlite_sequence WHERE name = 'firm_channel_messages'")
            sql.execute(
                "INSERT INTO sqlite_sequence (name, seq) VALUES ('firm_channel_messages', %s)",
                [number - 1],
            )
        elif connection.vendor == "postgresql":
            # The ids below ``number`` count as handed out (``is_called``), as they were: an
            # empty table reads its last id from the sequence, and one set "not called" reads
            # as none handed out, so that a second test starting the log over would take the
            # workers' ids back to 1, below what they have handed over.
            sequence = "pg_get_serial_sequence('firm_channel_messages', 'id')"
            if number > 1:
                sql.execute(f"SELECT setval({sequence}, %s, true)", [number - 1])
            else:
                sql.execute(f"SELECT setval({sequence}, 1, false)")
        else:
            sql.execute(f"ALTER TABLE firm_channel_messages AUTO_INCREMENT = {int(number)}")


def go_on_after(high: int) -> None:
    """Have the log's ids go on after ``high`` (what ``start_the_log_over`` returned) and
    after what it holds: the run's workers, which outlive the test, follow the log from
    where it was, and would take what comes at lower ids for messages they handed over."""
    next_id_is(max(high, _highest_id()) + 1)


def _highest_id() -> int:
    """The last id the log handed out (its highest, or its sequence's when it is empty)."""
    return MessageStore().bounds()[1]


def trim_up_to(where: Vector, then: int = 1) -> None:
    """Cut the history up to ``then`` message(s) past ``where`` in each of its streams: the
    first message(s) a socket there missed (a global log's ids count in the whole log)."""
    if conf.TRANSPORT != "redis":
        ((_, last),) = where.values()
        with connection.cursor() as sql:
            sql.execute("DELETE FROM firm_channel_messages WHERE id <= %s", [last + then])
        return
    client = _redis()
    for stream, (_, seq) in where.items():
        key = stream_key(stream)
        for entry_id, _fields in client.xrange(key):
            if int(entry_id.split(b"-")[1]) <= seq + then:
                client.xdel(key, entry_id)
