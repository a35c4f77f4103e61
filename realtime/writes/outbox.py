"""SQL on ``realtime_outbox``: write a row in the write's transaction, delete it once relayed,
and what a sweeper reads and claims.

Plain SQL through Django's connections, as ``realtime.transports.table_store`` does for the
log: the INSERT runs inside the application's transaction on every announcing write. Times
are the database's (``db_now``). Rows are deleted and claimed by primary key: on MySQL a
statement on ``id IN (...)`` may be planned as a scan that waits for rows other transactions
hold (an application's uncommitted rows among them), so there each row is its own statement.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from django.db import connections, router
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

from realtime.chunks import chunked
from realtime.compat.django import in_transaction
from realtime.transports.table_store import PG_NO_FLUSH, as_datetime, db_now, write_transaction

logger = logging.getLogger(__name__)

TABLE: Final = "realtime_outbox"
#: Rows per statement that names rows by id, or writes them.
CHUNK: Final = 500
#: Bytes of announcements one INSERT carries at most (but one row, whatever its size): far
#: below MySQL's smallest usual ``max_allowed_packet`` (16 MiB on MariaDB).
INSERT_BYTES: Final = 1 << 20
#: Seconds before an alias found without the table is looked at again.
RECHECK_MISSING = 10.0


@dataclass(frozen=True, slots=True)
class Row:
    """One row of the outbox as a sweeper claimed it."""

    id: int
    txn: str
    seq: int
    item: bytes


@dataclass(frozen=True, slots=True)
class Backlog:
    """What the outbox of one database holds: rows, and the age of the oldest (seconds)."""

    rows: int
    oldest: float | None


_ready: dict[str, bool] = {}
_missing_since: dict[str, float] = {}


def holds_outbox(using: str) -> bool:
    """Whether database ``using`` holds the outbox: the routers allow it there and it was
    migrated (looked up once; an alias without it is looked at again after a while)."""
    if _ready.get(using):
        return True
    missing = _missing_since.get(using)
    if missing is not None and time.monotonic() - missing < RECHECK_MISSING:
        return False
    from realtime.models import OutboxItem  # not at import: models.py may import the decorator

    ready = router.allow_migrate_model(using, OutboxItem) and TABLE in (
        connections[using].introspection.table_names()
    )
    if ready:
        _ready[using] = True
        _missing_since.pop(using, None)
    else:
        _missing_since[using] = time.monotonic()
    return ready


def forget_tables() -> None:
    """Look again for the table on every alias (databases created or migrated since)."""
    _ready.clear()
    _missing_since.clear()


def insert(using: str, txn: str, rows: Sequence[tuple[int, bytes]]) -> list[int]:
    """Write ``(seq, item)`` rows of transaction ``txn`` on ``using``'s connection (in its
    open transaction), one statement per ``CHUNK`` rows; their ids, in order. One row costs
    one statement; several, on a database that cannot return their ids, one more to read
    them."""
    connection = connections[using]
    now = db_now(connection)
    ids: dict[int, int] = {}
    with connection.cursor() as cursor:
        for chunk in _batches(rows):
            values = ", ".join([f"(%s, %s, {now}, %s)"] * len(chunk))
            sql = f"INSERT INTO {TABLE} (txn, seq, created_at, item) VALUES {values}"
            params: list[Any] = []
            for seq, item in chunk:
                params += [txn, seq, item]
            if connection.vendor == "postgresql":
                cursor.execute(f"{sql} RETURNING seq, id", params)
                ids.update((int(seq), int(id_)) for seq, id_ in cursor.fetchall())
            elif len(chunk) == 1:
                cursor.execute(sql, params)
                ids[chunk[0][0]] = int(cursor.lastrowid)
            else:
                cursor.execute(sql, params)
                cursor.execute(
                    f"SELECT seq, id FROM {TABLE} WHERE txn = %s AND seq >= %s AND seq <= %s",
                    [txn, chunk[0][0], chunk[-1][0]],
                )
                ids.update((int(seq), int(id_)) for seq, id_ in cursor.fetchall())
    return [ids[seq] for seq, _ in rows]


def _batches(rows: Sequence[tuple[int, bytes]]) -> list[list[tuple[int, bytes]]]:
    """``rows`` in runs of at most ``CHUNK`` rows and ``INSERT_BYTES`` bytes (or one row)."""
    batches: list[list[tuple[int, bytes]]] = []
    size = 0
    for row in rows:
        if not batches or len(batches[-1]) >= CHUNK or size + len(row[1]) > INSERT_BYTES:
            batches.append([])
            size = 0
        batches[-1].append(row)
        size += len(row[1])
    return batches


def delete(using: str, ids: Sequence[int]) -> None:
    """Delete the rows ``ids`` (relayed), on ``using``'s connection as it is.

    On PostgreSQL, a delete that is a transaction of its own does not wait for its WAL flush
    (``synchronous_commit`` off for it alone): lost in a crash, it leaves rows a sweeper
    relays again under their key, which the transport drops; the writer does not wait for a
    disk flush after every announced transaction."""
    connection = connections[using]
    statement = f"DELETE FROM {TABLE} WHERE id"
    if connection.vendor == "postgresql" and not in_transaction(connection):
        statement = f"DELETE FROM {TABLE} USING (SELECT {PG_NO_FLUSH}) AS f WHERE id"
    with connection.cursor() as cursor:
        _by_ids(connection, cursor, statement, ids)


def backlog(using: str) -> Backlog:
    """How many rows the outbox of ``using`` holds, and how old the oldest is."""
    connection = connections[using]
    with connection.cursor() as cursor:
        # Parameters, even none: Django's SQLite cursor reads ``%%`` only then.
        cursor.execute(f"SELECT COUNT(*), MIN(created_at), {db_now(connection)} FROM {TABLE}", [])
        row = cursor.fetchone()
    count, oldest, now = row if row else (0, None, None)
    if oldest is None or now is None:
        return Backlog(int(count or 0), None)
    age = (as_datetime(now) - as_datetime(oldest)).total_seconds()
    return Backlog(int(count), max(0.0, age))


def visible(using: str, limit: int) -> list[tuple[int, str]]:
    """The ids and transaction keys of the oldest ``limit`` rows nobody holds."""
    connection = connections[using]
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id, txn FROM {TABLE} WHERE claimed_until IS NULL "
            f"OR claimed_until < {db_now(connection)} ORDER BY id LIMIT %s",
            [limit],
        )
        return [(int(id_), str(txn)) for id_, txn in cursor.fetchall()]


def claim(using: str, txns: Sequence[str], lease: float) -> list[Row]:
    """Hold the rows of these transactions that nobody holds for ``lease`` seconds, and read
    them, in one short transaction of their own: rows another sweeper is claiming are
    skipped, not waited for (``SKIP LOCKED``; SQLite has one writer at a time).

    A transaction is claimed whole or not at all: one whose rows are partly locked (another
    sweeper claiming it, its writer deleting what it relayed) or partly leased is left for a
    later sweep, so that its rows are always relayed together, under one key."""
    if not txns:
        return []
    connection = connections[using]
    now = db_now(connection)
    lock = "" if connection.vendor == "sqlite" else " FOR UPDATE SKIP LOCKED"
    rows: list[Row] = []
    with write_transaction(using) as cursor:
        for chunk in chunked(list(txns), CHUNK):
            placeholders = ", ".join(["%s"] * len(chunk))
            cursor.execute(
                f"SELECT id, txn, seq, item FROM {TABLE} WHERE txn IN ({placeholders}) AND "
                f"(claimed_until IS NULL OR claimed_until < {now}) ORDER BY id{lock}",
                list(chunk),
            )
            held = [
                Row(int(id_), str(txn), int(seq), bytes(item))
                for id_, txn, seq, item in cursor.fetchall()
            ]
            cursor.execute(
                f"SELECT txn, COUNT(*) FROM {TABLE} WHERE txn IN ({placeholders}) GROUP BY txn",
                list(chunk),
            )
            whole = dict(cursor.fetchall())
            taken = Counter(row.txn for row in held)
            rows += [row for row in held if taken[row.txn] == whole.get(row.txn)]
        held_until = _seconds_ahead(connection)
        _by_ids(
            connection,
            cursor,
            f"UPDATE {TABLE} SET claimed_until = {held_until} WHERE id",
            [row.id for row in rows],
            [lease],
        )
    rows.sort(key=lambda row: row.id)
    return rows


def release(using: str, ids: Sequence[int]) -> None:
    """Let go of claimed rows (not relayed): the next sweep may take them."""
    connection = connections[using]
    with connection.cursor() as cursor:
        _by_ids(connection, cursor, f"UPDATE {TABLE} SET claimed_until = NULL WHERE id", ids)


def _by_ids(
    connection: BaseDatabaseWrapper,
    cursor: CursorWrapper,
    statement: str,
    ids: Sequence[int],
    before: Sequence[Any] = (),
) -> None:
    """Run ``<statement> IN (ids)`` (``before``: the parameters ahead of the ids), by chunk;
    on MySQL ``<statement> = id`` once per row (see the module docstring)."""
    if not ids:
        return
    if connection.vendor == "mysql":
        cursor.executemany(f"{statement} = %s", [(*before, id_) for id_ in ids])
        return
    for chunk in chunked(list(ids), CHUNK):
        placeholders = ", ".join(["%s"] * len(chunk))
        cursor.execute(f"{statement} IN ({placeholders})", [*before, *chunk])


def _seconds_ahead(connection: BaseDatabaseWrapper) -> str:
    """SQL for the database's time some seconds ahead (one float parameter), as ``db_now``."""
    if connection.vendor == "postgresql":
        return f"({db_now(connection)} + make_interval(secs => %s))"
    if connection.vendor == "mysql":
        return "(UTC_TIMESTAMP(6) + INTERVAL ROUND(%s * 1000000) MICROSECOND)"
    return "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('+%%.6f seconds', %s))"
