"""SQL on ``firm_channel_messages``: insert, scan, trim and measure, on every database.

Plain SQL through Django's connections (not the ORM) because these run on the hot path and on
background threads, and because each statement must match what firm-channel does: the
listener filters on ``channel_hash`` and then compares exact channel bytes. Trimming deletes
only a prefix of the log (its lowest ids), one trimmer at a time, so that the log's first id
tells what a resume can still read (see ``MessageStore.trim_batch``).
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import logging
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

from realtime import limits
from realtime.chunks import chunked, weighed_chunks
from realtime.compat.django import driver_connection, driver_errors
from realtime.exceptions import ChannelTooLongError, PublishError, TransportError
from realtime.fields import to_naive_utc
from realtime.positions import mark_of
from realtime.transports.base import LogEntry

logger = logging.getLogger(__name__)

TABLE: Final = "firm_channel_messages"
MAX_CHANNEL_BYTES: Final = 1024
# Ids per statement that reads rows by id.
READ_CHUNK: Final = 500


def channel_hash(channel: bytes) -> int:
    """Return the first 8 bytes of SHA-256 of ``channel`` as a signed big-endian integer."""
    return int.from_bytes(hashlib.sha256(channel).digest()[:8], "big", signed=True)


def encode_channel(channel: str) -> bytes:
    """Return the UTF-8 bytes of ``channel``, refusing names the column cannot hold."""
    encoded = channel.encode("utf-8")
    if len(encoded) > MAX_CHANNEL_BYTES:
        raise ChannelTooLongError(
            f"channel name is {len(encoded)} bytes in UTF-8; at most {MAX_CHANNEL_BYTES} fit"
        )
    return encoded


@dataclass(frozen=True, slots=True)
class Row:
    """One buffered message as the listener reads it."""

    id: int
    channel: bytes
    payload: bytes


@dataclass(frozen=True, slots=True)
class Poll:
    """What one poll read: the new rows, and the highest id old enough to be settled."""

    rows: list[Row]
    settled: int | None


@dataclass(frozen=True, slots=True)
class TableStats:
    """What ``realtime_stats`` reports about the buffer."""

    rows: int
    channels: int
    oldest: datetime.datetime | None
    payload_bytes: int


def as_datetime(value: Any) -> datetime.datetime:
    """A naive UTC datetime read from a time column (SQLite answers text)."""
    if isinstance(value, str):
        value = datetime.datetime.fromisoformat(value)
    if not isinstance(value, datetime.datetime):
        raise TypeError(f"created_at read as {type(value).__name__}")
    return to_naive_utc(value)


def db_now(connection: BaseDatabaseWrapper | str) -> str:
    """SQL for the database's current time as naive UTC, in the column's own form, on
    ``connection`` (or a database of that vendor, named).

    Every time the table holds or is compared with is the database's, taken when the statement
    runs: a publisher that stalls before its INSERT, or whose clock is off, cannot write a row
    that looks older than it is (one that the poller's floor would already pass).
    """
    vendor = _vendor(connection)
    if vendor == "postgresql":
        return "(statement_timestamp() AT TIME ZONE 'UTC')"
    if vendor == "mysql":
        return "UTC_TIMESTAMP(6)"
    return "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"


def db_seconds_ago(connection: BaseDatabaseWrapper | str, *, qmark: bool = False) -> str:
    """SQL for the database's time some seconds ago (one float parameter), as ``db_now``.

    Written for Django's cursors: ``%s`` placeholders, ``%%`` for a percent sign (the drivers
    of PostgreSQL and MySQL take the same). With ``qmark``, for SQLite's own driver: ``?``
    placeholders, the SQL taken as written (its paramstyle).
    """
    vendor = _vendor(connection)
    if vendor == "postgresql":
        return f"({db_now(vendor)} - make_interval(secs => %s))"
    if vendor == "mysql":
        return "(UTC_TIMESTAMP(6) - INTERVAL ROUND(%s * 1000000) MICROSECOND)"
    if qmark:
        return "strftime('%Y-%m-%d %H:%M:%f', 'now', printf('-%.6f seconds', ?))"
    return "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('-%%.6f seconds', %s))"


def _vendor(connection: BaseDatabaseWrapper | str) -> str:
    return connection if isinstance(connection, str) else connection.vendor


def is_mariadb(cursor: CursorWrapper) -> bool:
    """Whether the MySQL-family server behind ``cursor`` is MariaDB (its version says so)."""
    cursor.execute("SELECT VERSION()")
    row = cursor.fetchone()
    return row is not None and "mariadb" in str(row[0]).lower()


#: The PostgreSQL advisory lock (and the MySQL named lock) publishers take: holding it from
#: before their INSERT to their COMMIT makes ids grow in commit order (see ``insert``).
PUBLISH_LOCK_KEY: Final = 0x7265616C74696D65  # "realtime"
PUBLISH_LOCK_NAME: Final = "realtime.firm_channel_messages.publish"
#: What a PostgreSQL publish starts with: the publish lock, and no wait for the WAL flush at
#: its commit (for this transaction only). The write it announces is durable already; the log
#: is a buffer, and serialized publishers must not each wait for a disk flush in turn.
PG_NO_FLUSH: Final = "set_config('synchronous_commit', 'off', true)"
PG_PUBLISH_START: Final = f"pg_advisory_xact_lock(%s), {PG_NO_FLUSH}"
#: Rows of a chunk from which PostgreSQL takes them by binary ``COPY`` rather than one
#: ``INSERT``: a round trip more (the lock, then the rows), and about half the cost per row
#: (1,000 messages of 250 bytes: 9 ms against 20 ms).
PG_COPY_FROM: Final = 100
PG_COPY: Final = (
    f"COPY {TABLE} (channel, payload, channel_hash, created_at) FROM STDIN (FORMAT BINARY)"
)
#: Seconds a MySQL publisher (or trimmer) waits for its lock before it refuses to go on (see
#: ``MessageStore._serialized``).
PUBLISH_LOCK_WAIT: Final = 10
#: The PostgreSQL advisory lock (and the MySQL named lock) a trim holds for its batch:
#: trimmers take turns, so that each deletes a prefix of the log (see ``trim_batch``).
TRIM_LOCK_KEY: Final = 0x7265616C7472696D  # "realtrim"
TRIM_LOCK_NAME: Final = "realtime.firm_channel_messages.trim"


#: The MySQL named lock of a name, for the log in the connection's database. ``GET_LOCK``
#: names are the server's, not a database's (PostgreSQL's advisory locks are per database):
#: two deployments on one server (staging beside production) must not take turns, or wait
#: for each other's holds, on one lock. A digest of the database's name keeps the whole
#: within MySQL's 64 characters.
MYSQL_LOCK: Final = "CONCAT(%s, ':', LEFT(SHA2(DATABASE(), 256), 16))"


def close_connection(using: str) -> None:
    """Drop this thread's connection so that the next query opens a fresh one."""
    try:
        connections[using].close()
    except Exception:
        logger.debug("realtime: closing a broken connection failed", exc_info=True)


def _window(
    connection: BaseDatabaseWrapper, hashes: Collection[int], floor: int, grace: float
) -> list[tuple[Any, Any]]:
    """A poll's first statement: the ids above ``floor`` on these hashes, each with whether it
    is older than ``grace`` seconds.

    It runs on the driver's own cursor (``realtime.compat.django``), its SQL written once per
    database and number of hashes in the driver's own paramstyle: an idle worker polls ten
    times a second, and after each sleep Django's cursor wrapper (the placeholders rewritten
    at every call, the query log, the wrappers) cost more than the statement (measured on
    SQLite, caches cold: a poll took 400 µs, the same statement on the driver's cursor
    170 µs; a poll now takes 300 µs). The driver's errors are still raised as Django's; what
    is skipped is what the poller's own thread, connection and clock make moot: the query log
    and ``execute_wrapper`` hooks, the checks of thread sharing and of a transaction left
    broken (it runs in autocommit). Where the driver's connection cannot be had (not open
    yet, or a Django that keeps it elsewhere), Django's cursor runs it.
    """
    params = [grace, *hashes, floor]
    raw = driver_connection(connection)
    errors = None if raw is None else driver_errors(connection)
    if raw is None or errors is None:
        with connection.cursor() as django_cursor:
            django_cursor.execute(_window_sql(connection.vendor, len(hashes), False), params)
            return list(django_cursor.fetchall())
    with errors:
        cursor = raw.cursor()
        try:
            cursor.execute(_window_sql(connection.vendor, len(hashes), True), params)
            return list(cursor.fetchall())
        finally:
            cursor.close()


@functools.lru_cache(maxsize=64)
def _window_sql(vendor: str, hashes: int, driver: bool) -> str:
    """The SQL of ``_window`` for Django's cursor, or (``driver``) for the driver's own:
    SQLite's takes ``?`` placeholders (paramstyle qmark), PostgreSQL's and MySQL's the ``%s``
    of Django's (format)."""
    qmark = driver and vendor == "sqlite"
    mark = "?" if qmark else "%s"
    return (
        f"SELECT id, CASE WHEN created_at < {db_seconds_ago(vendor, qmark=qmark)} THEN 1 "
        f"ELSE 0 END FROM {TABLE} WHERE channel_hash IN ({', '.join([mark] * hashes)}) "
        f"AND id > {mark} ORDER BY id"
    )


@contextmanager
def write_transaction(using: str) -> Iterator[CursorWrapper]:
    """Open a transaction that locks rows (a trim, a claim of the outbox): ``BEGIN IMMEDIATE``
    on SQLite, else ``atomic``.

    SQLite has no row locks: taking the write lock up front makes a second such transaction
    wait for the first to commit (then find other rows) instead of failing to upgrade a read
    lock halfway through.
    """
    connection = connections[using]
    if connection.vendor != "sqlite":
        with transaction.atomic(using=using), connection.cursor() as cursor:
            yield cursor
        return
    if not transaction.get_autocommit(using):
        raise RuntimeError("a SQLite write transaction needs a connection outside any transaction")
    with connection.cursor() as cursor:
        cursor.execute("BEGIN IMMEDIATE")
        try:
            yield cursor
        except BaseException:
            cursor.execute("ROLLBACK")
            raise
        cursor.execute("COMMIT")


def _expired_prefix(oldest: Sequence[tuple[Any, Any]]) -> list[int]:
    """The ids of the log's first rows (``(id, expired)``, by id) up to the first one not
    expired."""
    ids = []
    for id_, expired in oldest:
        if not expired:
            break
        ids.append(int(id_))
    return ids


def _weight(message: tuple[bytes, bytes]) -> int:
    """What one ``(channel, payload)`` row adds to an INSERT, near enough."""
    return len(message[0]) + len(message[1])


class MessageStore:
    """The ``firm_channel_messages`` table of one database alias."""

    def __init__(self, using: str = "default") -> None:
        self.using = using

    @property
    def connection(self) -> BaseDatabaseWrapper:
        """The calling thread's connection (Django keeps one per thread)."""
        return connections[self.using]

    def insert(self, messages: Sequence[tuple[bytes, bytes]]) -> None:
        """Insert ``(channel, payload)`` rows, in order, a chunk (``PUBLISH_CHUNK`` rows,
        ``PUBLISH_CHUNK_BYTES`` of them at most: a statement within any database's packet)
        at a time, each chunk one statement in a transaction of its own.

        Publishers serialize: each holds a lock from before its INSERT until its COMMIT
        (PostgreSQL: a transaction-scoped advisory lock taken in the statement itself, see
        ``PG_PUBLISH_START``; MySQL: a named lock around it, and no insert without it, see
        ``_serialized``; SQLite has one writer at a time anyway). So a row becomes visible
        only after every row with a lower id: the id is a position in the log, and every id
        below the highest one visible has committed or never will. The lock is held for one
        chunk, not for a whole publish: another publisher waits for 500 rows at most, not
        for the 100,000 of a large transaction (whose rows may so interleave with theirs:
        each row is a message of its own).

        Raises ``PublishError`` when MySQL's lock was not granted (nothing more was
        inserted; the chunks before were).
        """
        connection = self.connection
        now = db_now(connection)
        vendor = connection.vendor
        hashes: dict[bytes, int] = {}  # a publish's messages share a few channels
        for chunk in weighed_chunks(
            messages, limits.PUBLISH_CHUNK, limits.PUBLISH_CHUNK_BYTES, _weight
        ):
            params: list[Any] = []
            for channel, payload in chunk:
                found = hashes.get(channel)
                if found is None:
                    found = hashes[channel] = channel_hash(channel)
                params += [channel, payload, found]
            if vendor == "postgresql" and len(chunk) >= PG_COPY_FROM and self._copy(params):
                continue
            with self._serialized(), connection.cursor() as cursor:
                if vendor == "postgresql":
                    rows = ", ".join(["(%s::bytea, %s::bytea, %s::bigint)"] * len(chunk))
                    cursor.execute(
                        f"INSERT INTO {TABLE} (channel, payload, channel_hash, created_at) "
                        f"SELECT v.c, v.p, v.h, {now} "
                        f"FROM (SELECT {PG_PUBLISH_START}) AS l, "
                        f"(VALUES {rows}) AS v(c, p, h)",
                        [PUBLISH_LOCK_KEY, *params],
                    )
                    continue
                values = ", ".join([f"(%s, %s, %s, {now})"] * len(chunk))
                cursor.execute(
                    f"INSERT INTO {TABLE} (channel, payload, channel_hash, created_at) "
                    f"VALUES {values}",
                    params,
                )

    def _copy(self, params: list[Any]) -> bool:
        """Insert the rows ``params`` holds (channel, payload, hash, ...) on PostgreSQL by
        binary ``COPY``, in a transaction of its own that takes the publish lock first. The
        lock is taken on Django's cursor (so the query log and execute wrappers see the
        publish), the rows go on the driver's own (Django's has no ``COPY``; the driver's
        errors are raised as Django's). ``False``, having done nothing, where the driver's
        connection cannot be had (not open yet): the caller inserts them."""
        connection = self.connection
        raw = driver_connection(connection)
        errors = None if raw is None else driver_errors(connection)
        if raw is None or errors is None:
            return False
        with transaction.atomic(using=self.using):
            with connection.cursor() as django_cursor:
                # The time is read once the lock is held (the rows become visible then).
                django_cursor.execute(
                    "SELECT (clock_timestamp() AT TIME ZONE 'UTC') "
                    f"FROM (SELECT {PG_PUBLISH_START}) AS l",
                    [PUBLISH_LOCK_KEY],
                )
                (created,) = django_cursor.fetchone()
            with errors:
                cursor = raw.cursor()
                try:
                    with cursor.copy(PG_COPY) as copy:
                        copy.set_types(["bytea", "bytea", "int8", "timestamp"])
                        for at in range(0, len(params), 3):
                            copy.write_row((*params[at : at + 3], created))
                finally:
                    cursor.close()
        return True

    @contextmanager
    def _serialized(
        self,
        refusal: type[TransportError] = PublishError,
        name: str = PUBLISH_LOCK_NAME,
        wait: float | None = None,
    ) -> Iterator[None]:
        """On MySQL, hold the publish lock (or the lock ``name``) around the block (others
        take theirs in SQL).

        ``GET_LOCK`` answers 1 (granted), 0 (another session kept it for ``wait`` seconds,
        ``PUBLISH_LOCK_WAIT`` by default) or NULL (an error: the session killed, out of
        memory). Without the lock the block does not run: a row inserted beside another
        publisher's may commit out of id order, and a resume across it would miss it or hear
        it twice. It raises ``refusal`` instead, naming the answer; a publish is then lost
        like any failed publish (logged, never failing the write it announces).

        A session that holds the lock already is granted it again (MySQL 5.7+ and MariaDB
        10.0.2+ count a session's holds of one name): each grant here is paired with one
        ``RELEASE_LOCK``, and a refusal releases nothing, so a hold that is not this block's
        is never let go.
        """
        connection = self.connection
        if connection.vendor != "mysql":
            yield
            return
        wait = PUBLISH_LOCK_WAIT if wait is None else wait
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT GET_LOCK({MYSQL_LOCK}, %s)", [name, wait])
            row = cursor.fetchone()
        answer = None if row is None else row[0]
        if answer != 1:
            why = (
                "NULL: an error"
                if answer is None
                else f"{answer}: another session held it for {wait} s"
            )
            raise refusal(
                f"the log's lock {name!r} was not granted (GET_LOCK answered {why}); "
                "refused rather than written out of order"
            )
        try:
            yield
        finally:
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT RELEASE_LOCK({MYSQL_LOCK})", [name])

    def read_after(self, channels: Collection[bytes], after: int, limit: int) -> list[Row]:
        """At most ``limit`` rows of ``channels`` with an id above ``after``, by id; fewer only
        when there are no more (the exact channel is compared in SQL, after the hash the
        index serves)."""
        if not channels:
            return []
        wanted = list(channels)
        hashes = ", ".join(["%s"] * len(wanted))
        names = ", ".join(["%s"] * len(wanted))
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"SELECT id, channel, payload FROM {TABLE} WHERE channel_hash IN ({hashes}) "
                f"AND channel IN ({names}) AND id > %s ORDER BY id LIMIT %s",
                [*(channel_hash(c) for c in wanted), *wanted, after, limit],
            )
            return [
                Row(int(id_), bytes(channel), bytes(payload))
                for id_, channel, payload in cursor.fetchall()
            ]

    def read_log(self, channels: Sequence[str], after: int, limit: int) -> list[LogEntry]:
        """``read_after`` in a transport's terms: the log's entries of these channels (named
        as strings) after position ``after``, at most ``limit``, in order."""
        rows = self.read_after({encode_channel(c) for c in channels}, after, limit)
        return [(row.channel.decode("utf-8"), row.payload, row.id) for row in rows]

    def read_ids(self, ids: Collection[int]) -> list[Row]:
        """The rows of these ids that exist, by id."""
        if not ids:
            return []
        placeholders = ", ".join(["%s"] * len(ids))
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"SELECT id, channel, payload FROM {TABLE} WHERE id IN ({placeholders}) "
                "ORDER BY id",
                list(ids),
            )
            return [
                Row(int(id_), bytes(channel), bytes(payload))
                for id_, channel, payload in cursor.fetchall()
            ]

    def bounds(self) -> tuple[int | None, int]:
        """The lowest id the table still holds (``None``: it is empty) and the highest id
        settled: every message at or below it has committed or never will.

        Trims delete a prefix of the log (``trim_batch``): every message after the lowest id
        is still there, and only those before it may have been trimmed.

        The highest id is the table's while it holds rows. Emptied by trimming, the table
        still has handed out ids: the last one comes from the id sequence, read while holding
        the publish lock (so no publish is under way and every id handed out is settled);
        MySQL's lock not granted raises ``TransportError`` (no bounds, no resume).
        """
        with self.connection.cursor() as cursor:
            cursor.execute(f"SELECT MIN(id), MAX(id) FROM {TABLE}")
            row = cursor.fetchone()
        if row and row[1] is not None:
            return int(row[0]), int(row[1])
        return None, self._last_handed_out()

    def marked_bounds(self) -> tuple[int | None, int, str]:
        """``bounds``, and the mark of the message at the highest id (``""`` when the table
        is empty), read in the same statement: the mark is that of the very row whose id is
        the last position (see ``realtime.positions``)."""
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"SELECT b.low, b.high, m.payload "
                f"FROM (SELECT MIN(id) AS low, MAX(id) AS high FROM {TABLE}) AS b "
                f"LEFT JOIN {TABLE} AS m ON m.id = b.high"
            )
            row = cursor.fetchone()
        if row and row[1] is not None:
            mark = "" if row[2] is None else mark_of(bytes(row[2]))
            return int(row[0]), int(row[1]), mark
        return None, self._last_handed_out(), ""

    def marks(self, ids: Collection[int]) -> dict[int, str]:
        """The mark of the message of each of these ids that the table holds."""
        marks: dict[int, str] = {}
        for chunk in chunked(sorted(ids), READ_CHUNK):
            marks.update((row.id, mark_of(row.payload)) for row in self.read_ids(chunk))
        return marks

    def first_kept(self) -> int:
        """The first position the log holds: its lowest id, or one past the last id handed
        out when it is empty. Ids grow in commit order and trims delete the start of the log,
        so every message below it that ever committed is trimmed (or is an id that never
        committed), and none below it commits later.

        An empty log is looked at again once the last id is read: a publish that committed
        meanwhile is at or below that id, and must not be taken for trimmed.
        """
        first = self._lowest_id()
        if first is not None:
            return first
        last = self._last_handed_out()
        first = self._lowest_id()
        return last + 1 if first is None else first

    def _lowest_id(self) -> int | None:
        with self.connection.cursor() as cursor:
            cursor.execute(f"SELECT MIN(id) FROM {TABLE}")
            row = cursor.fetchone()
        return int(row[0]) if row and row[0] is not None else None

    def _last_handed_out(self) -> int:
        """The last id the table handed out (0: none), settled (see ``bounds``)."""
        connection = self.connection
        vendor = connection.vendor
        if vendor == "sqlite":
            # AUTOINCREMENT's counter; SQLite has one writer at a time, so it is settled.
            with connection.cursor() as cursor:
                cursor.execute("SELECT seq FROM sqlite_sequence WHERE name = %s", [TABLE])
                row = cursor.fetchone()
            return int(row[0]) if row else 0
        if vendor == "postgresql":
            with transaction.atomic(using=self.using), connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [PUBLISH_LOCK_KEY])
                cursor.execute("SELECT pg_get_serial_sequence(%s, 'id')", [TABLE])
                row = cursor.fetchone()
                if not row or row[0] is None:
                    return 0
                cursor.execute(f"SELECT last_value, is_called FROM {row[0]}")
                last = cursor.fetchone()
            return int(last[0]) if last and last[1] else 0
        with self._serialized(TransportError), connection.cursor() as cursor:
            if not is_mariadb(cursor):
                # MySQL 8 caches table statistics, AUTO_INCREMENT among them.
                cursor.execute("SET SESSION information_schema_stats_expiry = 0")
            cursor.execute(
                "SELECT AUTO_INCREMENT FROM information_schema.TABLES "
                "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
                [TABLE],
            )
            row = cursor.fetchone()
        return int(row[0]) - 1 if row and row[0] is not None else 0

    def max_id(self) -> int:
        """Return the highest id committed so far, 0 for an empty table."""
        with self.connection.cursor() as cursor:
            cursor.execute(f"SELECT MAX(id) FROM {TABLE}")
            row = cursor.fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def poll(
        self,
        hashes: Collection[int],
        floor: int,
        grace: float,
        known: Collection[int],
        limit: int | None = None,
    ) -> Poll:
        """Read what one poll needs: the ids above ``floor`` whose hash is one of ``hashes``,
        and the rows of those not in ``known``; plus the highest id older than ``grace``
        seconds by the database's clock (settled: its transaction had time to commit).

        The window above the floor is re-read every poll (that is how a late commit is
        caught), so it is read as bare ids, compared with the cutoff by the database; only
        new rows come with their channel and payload, in a second query. With ``limit``, at
        most that many new rows are read, and ``settled`` stays below the first one left.
        """
        if not hashes:
            return Poll([], None)
        connection = self.connection
        window = _window(connection, hashes, floor, grace)
        settled = max((int(id_) for id_, old in window if old), default=None)
        fresh = [int(id_) for id_, _ in window if int(id_) not in known]
        if limit is not None and len(fresh) > limit:
            left = fresh[limit]
            fresh = fresh[:limit]
            settled = max((int(i) for i, old in window if old and int(i) < left), default=None)
        if not fresh:
            return Poll([], settled)
        with connection.cursor() as cursor:
            rows: list[Row] = []
            for chunk in chunked(fresh, READ_CHUNK):
                cursor.execute(
                    f"SELECT id, channel, payload FROM {TABLE} WHERE id IN "
                    f"({', '.join(['%s'] * len(chunk))}) ORDER BY id",
                    list(chunk),
                )
                rows += [
                    Row(int(id_), bytes(channel), bytes(payload))
                    for id_, channel, payload in cursor.fetchall()
                ]
        return Poll(rows, settled)

    def trim_batch(
        self, retention: float, batch_size: int, turn_wait: float | None = None
    ) -> list[int]:
        """Delete the lowest ids of the log, at most ``batch_size``, up to the first row not
        older than ``retention`` seconds; return their ids.

        A trim deletes a prefix of the log and nothing else: the first row not expired stays,
        and every row after it. So the log holds every message from its first id on, and
        that id is how far it was trimmed: a resume from a position at or above the id before
        it misses nothing (``bounds``; ``realtime.sockets.resume`` looks again once it has
        read). Age alone would not do: ids grow in commit order, and the time a row is
        stamped with need not (PostgreSQL stamps a small publish when its statement starts,
        before it waits for the publish lock, and a ``COPY`` once it holds it), so a row may
        be older than one below it. A row that expired behind one that has not yet waits
        for it, a few seconds at most.

        Trimmers take turns (``_trim_turn``): two at once, each skipping the rows the other
        holds, would delete above a row kept. On MySQL a trim waits ``turn_wait`` seconds at
        most for another's turn to end (``PUBLISH_LOCK_WAIT`` by default), then raises
        ``TransportError``; PostgreSQL's and SQLite's wait as long as their connection lets
        a statement wait.
        """
        connection = self.connection
        oldest = (
            f"SELECT id, CASE WHEN created_at < {db_seconds_ago(connection)} THEN 1 ELSE 0 END "
            f"FROM {TABLE} ORDER BY id LIMIT %s"
        )
        # Look before locking: most trims find nothing expired, and on SQLite taking the
        # write lock for nothing makes the application's own transactions wait or fail.
        with connection.cursor() as cursor:
            cursor.execute(oldest, [retention, 1])
            if not _expired_prefix(cursor.fetchall()):
                return []
        with self._trim_turn(turn_wait) as cursor:
            cursor.execute(oldest, [retention, batch_size])
            ids = _expired_prefix(cursor.fetchall())
            if ids and connection.vendor == "mysql":
                # One primary-key delete per row: InnoDB locks those rows only, where a range
                # ("id <= ...") locks the next key too, past the last row the gap publishers
                # insert in.
                cursor.executemany(f"DELETE FROM {TABLE} WHERE id = %s", [(id_,) for id_ in ids])
            elif ids:
                cursor.execute(f"DELETE FROM {TABLE} WHERE id <= %s", [ids[-1]])
        return ids

    @contextmanager
    def _trim_turn(self, wait: float | None = None) -> Iterator[CursorWrapper]:
        """A write transaction (``write_transaction``) of one trim, once no other trim is
        under way: PostgreSQL waits for a transaction-scoped advisory lock, MySQL for a named
        lock held until after the commit (``wait`` seconds at most; not granted:
        ``TransportError``), and SQLite lets one writer at a time anyway. No other writer
        deletes from the log, so the rows a trim reads in its turn are the log's first until
        it commits."""
        with (
            self._serialized(TransportError, TRIM_LOCK_NAME, wait),
            write_transaction(self.using) as cursor,
        ):
            if self.connection.vendor == "postgresql":
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [TRIM_LOCK_KEY])
            yield cursor

    def stats(self) -> TableStats:
        """Count rows, distinct channels and payload bytes, and find the oldest row."""
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"SELECT COUNT(*), COUNT(DISTINCT channel), MIN(created_at), "
                f"COALESCE(SUM(LENGTH(payload)), 0) FROM {TABLE}"
            )
            row = cursor.fetchone()
        rows, channels, oldest, payload_bytes = row if row else (0, 0, None, 0)
        return TableStats(
            rows=int(rows),
            channels=int(channels),
            oldest=None if oldest is None else as_datetime(oldest),
            payload_bytes=int(payload_bytes),
        )
