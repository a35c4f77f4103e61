"""The table transport: the shared contract on every database, and what only it promises."""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import pytest
from django.db import connection, transaction

from realtime.fields import naive_utc_now
from realtime.transports import table_poller, table_store
from realtime.transports.table import TableTransport
from realtime.transports.table_store import channel_hash
from tests.helpers import (
    Inbox,
    db_datetime,
    go_together,
    off_loop,
    only_on,
    start_worker,
    vendor,
)
from tests.transport_contract import MARKER, TransportContract

pytestmark = pytest.mark.django_db(transaction=True)

MakeTransport = Callable[..., TableTransport]


def insert_row(
    channel: str,
    payload: bytes,
    *,
    id_: int | None = None,
    age: float = 0.0,
    hash_of: str | None = None,
) -> None:
    """Insert a row the way another writer (or firm-channel) could, committed at once."""
    created_at = db_datetime(naive_utc_now() - datetime.timedelta(seconds=age))
    columns = "channel, payload, channel_hash, created_at"
    params: list[Any] = [
        channel.encode(),
        payload,
        channel_hash((hash_of or channel).encode()),
        created_at,
    ]
    if id_ is not None:
        columns = "id, " + columns
        params.insert(0, id_)
    placeholders = ", ".join(["%s"] * len(params))
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO firm_channel_messages ({columns}) VALUES ({placeholders})", params
        )


def row_count() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM firm_channel_messages")
        row = cursor.fetchone()
    return int(row[0]) if row else 0


class TestTableTransportContract(TransportContract):
    @pytest.fixture
    def transport(self, make_table_transport: MakeTransport) -> TableTransport:
        return make_table_transport()

    @pytest.fixture
    def idle_transport(self, make_table_transport: MakeTransport) -> TableTransport:
        return make_table_transport(polling_interval=60.0)

    def publish_from_another_process(self, channel: str, payload: str) -> None:
        worker = start_worker("publish", channel, payload)
        out, _ = worker.communicate(timeout=60)
        assert worker.returncode == 0
        assert out.strip() == "published"


def test_channel_hash_is_signed_big_endian_sha256_prefix() -> None:
    assert channel_hash(b"room:42") == 4058071420173215221
    assert channel_hash(b"a") == -3848465438864589366


class TestSchema:
    def test_indexes_have_firm_channel_names(self) -> None:
        with connection.cursor() as cursor:
            constraints = connection.introspection.get_constraints(cursor, "firm_channel_messages")
        indexes = {name: c["columns"] for name, c in constraints.items() if c["index"]}
        assert indexes["index_firm_channel_messages_on_channel"] == ["channel"]
        assert indexes["index_firm_channel_messages_on_channel_hash"] == ["channel_hash"]
        assert indexes["index_firm_channel_messages_on_created_at"] == ["created_at"]

    def test_column_types_match_firm_channel(self) -> None:
        expected = {
            "sqlite": {
                "id": "integer",
                "channel": "blob",
                "payload": "blob",
                "channel_hash": "bigint",
                "created_at": "datetime",
            },
            "postgresql": {
                "id": "bigint",
                "channel": "bytea",
                "payload": "bytea",
                "channel_hash": "bigint",
                "created_at": "timestamp without time zone",
            },
            "mysql": {
                "id": "bigint(20)",
                "channel": "varbinary(1024)",
                "payload": "longblob",
                "channel_hash": "bigint(20)",
                "created_at": "datetime(6)",
            },
        }[vendor()]
        assert column_types() == expected

    @only_on("sqlite")
    def test_sqlite_ids_autoincrement(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT sql FROM sqlite_master WHERE name = 'firm_channel_messages'")
            row = cursor.fetchone()
        assert row is not None
        assert '"id" integer NOT NULL PRIMARY KEY AUTOINCREMENT' in row[0]

    @only_on("postgresql")
    def test_postgresql_ids_come_from_a_bigserial_sequence(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT column_default, is_identity FROM information_schema.columns "
                "WHERE table_name = 'firm_channel_messages' AND column_name = 'id'"
            )
            row = cursor.fetchone()
        assert row is not None
        default, is_identity = row
        assert default.startswith("nextval('firm_channel_messages_id_seq'")
        assert is_identity == "NO"

    @only_on("mysql")
    def test_mysql_ids_auto_increment(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT extra FROM information_schema.columns WHERE table_schema = DATABASE() "
                "AND table_name = 'firm_channel_messages' AND column_name = 'id'"
            )
            row = cursor.fetchone()
        assert row is not None
        assert "auto_increment" in row[0].lower()

    def test_created_at_holds_naive_utc_without_warnings(self) -> None:
        # Warnings are errors in this suite: a naive value under USE_TZ would fail the test.
        TableTransport(auto_trim=False).publish([("c", b"x")])
        with connection.cursor() as cursor:
            cursor.execute("SELECT created_at FROM firm_channel_messages")
            row = cursor.fetchone()
        assert row is not None
        value = table_store.as_datetime(row[0])
        assert value.tzinfo is None
        assert abs((naive_utc_now() - value).total_seconds()) < 60

    def test_a_publish_of_many_rows_stores_each_as_a_publish_of_one_does(self) -> None:
        # PostgreSQL takes a chunk of PG_COPY_FROM rows or more by COPY, and fewer by INSERT.
        many = [(f"c{n % 2}", f"m{n}".encode()) for n in range(table_store.PG_COPY_FROM + 1)]
        TableTransport(auto_trim=False).publish([("c1", b"one")])
        TableTransport(auto_trim=False).publish(many)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT id, channel, payload, channel_hash, created_at "
                "FROM firm_channel_messages ORDER BY id"
            )
            rows = cursor.fetchall()
        assert [(bytes(c), bytes(p)) for _, c, p, _, _ in rows] == [
            (b"c1", b"one"),
            *((c.encode(), p) for c, p in many),
        ]
        assert all(h == channel_hash(bytes(c)) for _, c, _, h, _ in rows)
        times = [table_store.as_datetime(row[4]) for row in rows]
        assert all(t.tzinfo is None for t in times)
        assert all(abs((naive_utc_now() - t).total_seconds()) < 60 for t in times)
        assert times == sorted(times)


def column_types() -> dict[str, str]:
    with connection.cursor() as cursor:
        if vendor() == "sqlite":
            cursor.execute("SELECT name, type FROM pragma_table_info('firm_channel_messages')")
        elif vendor() == "postgresql":
            cursor.execute(
                "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_name = 'firm_channel_messages'"
            )
        else:
            cursor.execute(
                "SELECT column_name, column_type FROM information_schema.columns "
                "WHERE table_schema = DATABASE() AND table_name = 'firm_channel_messages'"
            )
        return {name: str(kind).lower() for name, kind in cursor.fetchall()}


needs_server = only_on("postgresql", "mysql")


class TestOutOfOrderCommits:
    @needs_server
    async def test_lower_id_committing_after_a_higher_one_is_delivered_once(
        self, make_table_transport: MakeTransport, inbox: Inbox
    ) -> None:
        transport = make_table_transport()
        transport.add_listener(inbox)
        await transport.follow("race")
        holder = start_worker("hold-insert", "race", "low")
        try:
            assert holder.stdout is not None
            assert holder.stdin is not None
            line = await off_loop(holder.stdout.readline)
            low_id = int(line.split()[1])
            await off_loop(transport.publish, [("race", b"high")])
            await inbox.wait_for("race", b"high")
            assert await off_loop(_max_id_now) > low_id
            holder.stdin.write("commit\n")
            holder.stdin.flush()
            assert (await off_loop(holder.stdout.readline)).strip() == "committed"
        finally:
            holder.communicate(timeout=30)
        await inbox.wait_for("race", b"low")
        await off_loop(transport.publish, [("race", MARKER)])
        await inbox.wait_for("race", MARKER)
        assert inbox.payloads("race") == [b"high", b"low", MARKER]

    async def test_explicit_ids_inserted_out_of_order_are_each_delivered_once(
        self, make_table_transport: MakeTransport, inbox: Inbox
    ) -> None:
        transport = make_table_transport()
        transport.add_listener(inbox)
        await transport.follow("explicit")
        await off_loop(insert_row, "explicit", b"hundred", id_=100)
        await inbox.wait_for("explicit", b"hundred")
        await off_loop(insert_row, "explicit", b"fifty", id_=50)
        await inbox.wait_for("explicit", b"fifty")
        await off_loop(insert_row, "explicit", MARKER, id_=101)
        await inbox.wait_for("explicit", MARKER)
        assert inbox.payloads("explicit") == [b"hundred", b"fifty", MARKER]


def _max_id_now() -> int:
    return table_store.MessageStore().max_id()


class TestHashCollisions:
    async def test_a_row_of_another_channel_sharing_the_hash_is_skipped(
        self, make_table_transport: MakeTransport, inbox: Inbox
    ) -> None:
        transport = make_table_transport()
        transport.add_listener(inbox)
        await transport.follow("mine")
        await off_loop(insert_row, "impostor", b"not mine", hash_of="mine")
        await off_loop(transport.publish, [("mine", MARKER)])
        await inbox.wait_for("mine", MARKER)
        assert inbox.messages == [("mine", MARKER)]

    async def test_channels_with_equal_hashes_each_get_only_their_own(
        self, make_table_transport: MakeTransport, inbox: Inbox, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        def constant_hash(channel: bytes) -> int:
            return 7

        monkeypatch.setattr(table_store, "channel_hash", constant_hash)
        monkeypatch.setattr(table_poller, "channel_hash", constant_hash)
        transport = make_table_transport()
        transport.add_listener(inbox)
        await transport.follow("one")
        await transport.follow("two")
        await off_loop(transport.publish, [("one", b"1"), ("two", b"2"), ("three", b"3")])
        await off_loop(transport.publish, [("two", MARKER)])
        await inbox.wait_for("two", MARKER)
        assert inbox.messages == [("one", b"1"), ("two", b"2"), ("two", MARKER)]


class TestAnchors:
    async def test_backlog_of_a_quiet_channel_is_not_replayed_to_a_later_follower(
        self, make_table_transport: MakeTransport, inbox: Inbox
    ) -> None:
        transport = make_table_transport()
        transport.add_listener(inbox)
        await transport.follow("busy")
        await off_loop(transport.publish, [("quiet", f"old {n}".encode()) for n in range(5)])
        await off_loop(transport.publish, [("busy", b"tick")])
        await inbox.wait_for("busy", b"tick")
        await transport.follow("quiet")
        await off_loop(transport.publish, [("quiet", MARKER)])
        await inbox.wait_for("quiet", MARKER)
        assert inbox.payloads("quiet") == [MARKER]

    async def test_a_refollow_does_not_replay_the_gap(
        self, make_table_transport: MakeTransport, inbox: Inbox
    ) -> None:
        transport = make_table_transport()
        transport.add_listener(inbox)
        await transport.follow("keep")
        await transport.follow("gap")
        await off_loop(transport.publish, [("gap", b"before")])
        await inbox.wait_for("gap", b"before")
        await transport.unfollow("gap")
        await off_loop(transport.publish, [("gap", b"during gap 1"), ("gap", b"during gap 2")])
        await off_loop(transport.publish, [("keep", b"tick")])
        await inbox.wait_for("keep", b"tick")
        await transport.follow("gap")
        await off_loop(transport.publish, [("gap", MARKER)])
        await inbox.wait_for("gap", MARKER)
        assert inbox.payloads("gap") == [b"before", MARKER]


class TestTrimming:
    def test_trim_deletes_in_batches_until_none_is_left(self) -> None:
        for n in range(5):
            insert_row("old", f"{n}".encode(), age=3600)
        transport = TableTransport(retention=60, trim_batch_size=2, auto_trim=False)
        assert [transport.trim() for _ in range(4)] == [2, 2, 1, 0]
        assert row_count() == 0

    def test_trim_keeps_fresh_rows(self) -> None:
        insert_row("old", b"old", age=3600)
        insert_row("fresh", b"fresh", age=10)
        transport = TableTransport(retention=60, auto_trim=False)
        assert transport.trim() == 1
        with connection.cursor() as cursor:
            cursor.execute("SELECT payload FROM firm_channel_messages")
            assert [bytes(row[0]) for row in cursor.fetchall()] == [b"fresh"]

    def test_auto_trim_with_batch_of_two_trims_on_every_publish(self) -> None:
        for n in range(5):
            insert_row("old", f"{n}".encode(), age=3600)
        transport = TableTransport(retention=60, trim_batch_size=2, auto_trim=True)
        try:
            remaining = []
            for n in range(3):
                transport.publish([("new", f"{n}".encode())])
                transport.wait_for_trims(timeout=30)
                remaining.append(row_count() - (n + 1))
        finally:
            transport.close()
        assert remaining == [3, 1, 0]

    def test_a_publish_whose_trim_cannot_be_scheduled_is_published_without_an_error(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        """As when a script's last broadcasts run while the interpreter exits: the executor
        refuses new work once the row is in. The trim is skipped, not the publish failed."""
        transport = TableTransport(retention=60, trim_batch_size=2, auto_trim=True)
        refusing = transport.trimmer._thread = ThreadPoolExecutor(max_workers=1)
        refusing.shutdown()
        try:
            with caplog.at_level(logging.DEBUG, logger="realtime"):
                transport.publish([("c", b"published")])
        finally:
            transport.trimmer._thread = None
        assert payloads() == [b"published"]
        assert transport.trimmer.pending == 0
        assert [r.getMessage() for r in caplog.records if r.levelno > logging.DEBUG] == []

    @only_on("sqlite")
    def test_a_sqlite_trim_inside_a_transaction_is_refused_and_deletes_nothing(self) -> None:
        insert_row("old", b"old", age=3600)
        transport = TableTransport(retention=60, auto_trim=False)
        with transaction.atomic(), pytest.raises(RuntimeError, match="outside any transaction"):
            transport.trim()
        assert row_count() == 1
        assert transport.trim() == 1

    def test_auto_trim_off_never_trims(self) -> None:
        insert_row("old", b"old", age=3600)
        transport = TableTransport(retention=60, trim_batch_size=1, auto_trim=False)
        transport.publish([("new", b"new")])
        transport.wait_for_trims(timeout=30)
        assert row_count() == 2

    @needs_server
    def test_concurrent_trimmers_delete_disjoint_rows_and_the_right_total(self) -> None:
        total = 600
        with connection.cursor() as cursor:
            for start in range(0, total, 100):
                rows = ", ".join(["(%s, %s, %s, %s)"] * 100)
                created = db_datetime(naive_utc_now() - datetime.timedelta(hours=1))
                params: list[Any] = []
                for n in range(start, start + 100):
                    params += [b"old", str(n).encode(), channel_hash(b"old"), created]
                cursor.execute(
                    "INSERT INTO firm_channel_messages (channel, payload, channel_hash, "
                    f"created_at) VALUES {rows}",
                    params,
                )
        trimmers = [start_worker("trim", "7") for _ in range(2)]
        go_together(trimmers)
        results = [_json_ids(trimmer.communicate(timeout=120)[0]) for trimmer in trimmers]
        first, second = results
        assert not set(first) & set(second)
        assert len(first) + len(second) == total
        assert row_count() == 0

    def test_a_trim_stops_at_the_first_row_not_expired_even_with_older_rows_after_it(
        self,
    ) -> None:
        # Ids grow in commit order, times need not (a publish stamped before it waited for
        # the lock): a row may be older than one below it.
        insert_row("old", b"old 1", age=3600)
        insert_row("fresh", b"fresh", age=10)
        insert_row("old", b"old 2", age=3600)
        transport = TableTransport(retention=60, trim_batch_size=10, auto_trim=False)
        assert transport.trim() == 1
        assert transport.trim() == 0
        assert payloads() == [b"fresh", b"old 2"]

    @needs_server
    def test_a_trim_waits_for_another_trims_turn_rather_than_delete_past_the_rows_it_holds(
        self,
    ) -> None:
        for n in range(4):
            insert_row("old", f"{n}".encode(), age=3600)
        with connection.cursor() as cursor:
            cursor.execute("SELECT MIN(id) FROM firm_channel_messages")
            row = cursor.fetchone()
        assert row is not None
        holder = start_worker("hold-trim", str(row[0]))
        try:
            assert holder.stdout is not None
            assert holder.stdin is not None
            assert holder.stdout.readline().strip() == "locked"
            trimmer = TableTransport(retention=60, trim_batch_size=10, auto_trim=False)
            trimming = ThreadPoolExecutor(max_workers=1)
            deleted = trimming.submit(_trim_and_close, trimmer)
            with pytest.raises(FutureTimeout):
                deleted.result(timeout=1.0)  # its turn has not come
            assert row_count() == 4
            holder.stdin.write("release\n")
            holder.stdin.flush()
            assert deleted.result(timeout=30) == 4
            trimming.shutdown()
        finally:
            holder.communicate(timeout=30)
        assert row_count() == 0

    async def test_an_emptying_trim_does_not_make_the_next_message_vanish(
        self, make_table_transport: MakeTransport, inbox: Inbox
    ) -> None:
        transport = make_table_transport()
        transport.add_listener(inbox)
        await transport.follow("c")
        await off_loop(transport.publish, [("c", b"1"), ("c", b"2")])
        await inbox.wait_for("c", b"2")
        deleted = await off_loop(TableTransport(retention=0, auto_trim=False).trim)
        assert deleted == 2
        assert await off_loop(row_count) == 0
        await off_loop(transport.publish, [("c", b"after emptying")])
        await inbox.wait_for("c", b"after emptying")


def _trim_and_close(transport: TableTransport) -> int:
    """One trim on this thread's own connection, closed after."""
    try:
        return transport.trim()
    finally:
        connection.close()


def payloads() -> list[bytes]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT payload FROM firm_channel_messages ORDER BY id")
        return [bytes(row[0]) for row in cursor.fetchall()]


def _json_ids(text: str) -> list[int]:
    import json

    return [int(id_) for id_ in json.loads(text)]


class TestResilience:
    @needs_server
    async def test_listener_keeps_delivering_after_its_connection_is_killed(
        self, make_table_transport: MakeTransport, inbox: Inbox, caplog: pytest.LogCaptureFixture
    ) -> None:
        transport = make_table_transport()
        transport.add_listener(inbox)
        await transport.follow("c")
        await off_loop(transport.publish, [("c", b"before")])
        await inbox.wait_for("c", b"before")
        with caplog.at_level(logging.WARNING, logger="realtime"):
            killed = await off_loop(kill_other_connections)
            assert killed >= 1
            await off_loop(transport.publish, [("c", b"after kill")])
            await inbox.wait_for("c", b"after kill", timeout=30)
        assert inbox.payloads("c") == [b"before", b"after kill"]
        assert any("polling firm_channel_messages failed" in r.getMessage() for r in caplog.records)

    async def test_listener_survives_a_query_error_and_logs_it(
        self, make_table_transport: MakeTransport, inbox: Inbox, caplog: pytest.LogCaptureFixture
    ) -> None:
        transport = make_table_transport()
        transport.add_listener(inbox)
        await transport.follow("c")
        failed = asyncio.Event()
        loop = asyncio.get_running_loop()

        class FailureSpy(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                if "polling firm_channel_messages failed" in record.getMessage():
                    loop.call_soon_threadsafe(failed.set)

        spy = FailureSpy()
        logging.getLogger("realtime").addHandler(spy)
        try:
            await off_loop(rename_table, "firm_channel_messages", "firm_channel_messages_away")
            try:
                await asyncio.wait_for(failed.wait(), timeout=30)
            finally:
                await off_loop(rename_table, "firm_channel_messages_away", "firm_channel_messages")
        finally:
            logging.getLogger("realtime").removeHandler(spy)
        await off_loop(transport.publish, [("c", b"after error")])
        await inbox.wait_for("c", b"after error", timeout=30)


def kill_other_connections() -> int:
    """Kill every other connection to the test database; return how many went."""
    with connection.cursor() as cursor:
        if vendor() == "postgresql":
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            return len(cursor.fetchall())
        cursor.execute(
            "SELECT id FROM information_schema.processlist "
            "WHERE db = DATABASE() AND id <> CONNECTION_ID()"
        )
        ids = [row[0] for row in cursor.fetchall()]
        for id_ in ids:
            cursor.execute(f"KILL {int(id_)}")
        return len(ids)


def rename_table(old: str, new: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {old} RENAME TO {new}")
