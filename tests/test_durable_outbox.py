"""The durable outbox: announcements written in the write's transaction, relayed after commit
by the writer, and by a sweeper when the writer could not (a failed publish, a writer killed
between its commit and its relay), each row once, on the real test database.

The durable transport is the table transport with ``durable = True``
(``tests.durable_transport``): the outbox depends on no transport of its own.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from realtime import logs, metrics
from realtime.auth import issue_token
from realtime.broadcast import broadcast_to_user, broadcast_to_users
from realtime.checks.database import check_outbox_databases
from realtime.writes import outbox as outbox_table
from realtime.writes import outbox_form
from realtime.writes.items import UsersBroadcast
from realtime.writes.relay import Sweeper
from tests.durable_transport import DurableTableTransport
from tests.helpers import (
    ROOT,
    WAIT,
    events,
    forget_messages,
    go_together,
    off_loop,
    only_on,
    subprocess_env,
)
from tests.live import Clients, LiveServers
from tests.testapp.models import Company, Membership, Workspace

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")

DURABLE = "tests.durable_transport.DurableTableTransport"


@pytest.fixture
def durable_transport(settings: Any) -> None:
    settings.REALTIME_TRANSPORT = DURABLE
    DurableTableTransport.keys.clear()


@pytest.fixture(autouse=True)
def no_other_sweepers(live_servers: LiveServers) -> None:
    """Stop the daphne servers earlier tests left running: one on a durable transport (Redis)
    sweeps this database's outbox too, and would relay rows these tests relay themselves
    (those a test needs start again when it asks for them)."""
    live_servers.stop_all()


def outbox() -> list[tuple[str, int]]:
    """(txn, seq) of each row of the outbox, oldest first, on this thread's connection."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT txn, seq FROM realtime_outbox ORDER BY id")
        return [(str(txn), int(seq)) for txn, seq in cursor.fetchall()]


def names() -> list[tuple[str, str]]:
    return [(m["event_type"], m["data"]["name"]) for m in events() if "name" in m["data"]]


class RollBackError(Exception):
    pass


def in_rolled_back_block(work: Any, seen: list[int]) -> None:
    """Run ``work`` in an atomic block that rolls back, noting how many rows the outbox held
    just before."""
    try:
        with transaction.atomic():
            work()
            seen.append(len(outbox()))
            raise RollBackError
    except RollBackError:
        pass


# The writer ----------------------------------------------------------------------------------


@pytest.mark.usefixtures("durable_transport")
def test_rows_are_written_in_the_transaction_and_deleted_once_relayed(workspace: Workspace) -> None:
    forget_messages()
    with transaction.atomic():
        Company.objects.create(workspace=workspace, name="A")
        Company.objects.create(workspace=workspace, name="B")
        inside = outbox()
        assert names() == []
    txn = inside[0][0]
    assert inside == [(txn, 0), (txn, 1)]
    assert outbox() == []
    assert names() == [("company.created", "A"), ("company.created", "B")]
    assert DurableTableTransport.keys == [f"{txn}.0.2"]


@pytest.mark.usefixtures("durable_transport")
def test_each_transaction_has_a_key_of_its_own(workspace: Workspace) -> None:
    for name in ("A", "B"):
        with transaction.atomic():
            Company.objects.create(workspace=workspace, name=name)
    first, second = DurableTableTransport.keys
    assert first is not None
    assert second is not None
    assert first.split(".")[0] != second.split(".")[0]


@pytest.mark.usefixtures("durable_transport")
def test_a_rolled_back_transaction_leaves_no_row_and_announces_nothing(
    workspace: Workspace,
) -> None:
    forget_messages()
    seen: list[int] = []
    in_rolled_back_block(lambda: Company.objects.create(workspace=workspace, name="lost"), seen)
    assert seen == [1]
    assert outbox() == []
    assert names() == []
    assert DurableTableTransport.keys == []


@pytest.mark.usefixtures("durable_transport")
def test_a_rolled_back_savepoint_takes_its_row_with_it(workspace: Workspace) -> None:
    forget_messages()
    with transaction.atomic():
        Company.objects.create(workspace=workspace, name="kept")
        seen: list[int] = []
        in_rolled_back_block(lambda: Company.objects.create(workspace=workspace, name="x"), seen)
        assert seen == [2]
        assert len(outbox()) == 1
    assert outbox() == []
    assert names() == [("company.created", "kept")]


@pytest.mark.usefixtures("durable_transport")
def test_a_bulk_write_costs_one_insert_into_the_outbox(workspace: Workspace) -> None:
    Company.objects.bulk_create([Company(workspace=workspace, name=f"c{i}") for i in range(30)])
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        Company.objects.filter(workspace=workspace).update(name="same")
        assert len(outbox()) == 30
    inserts = [q for q in queries.captured_queries if "INSERT INTO realtime_outbox" in q["sql"]]
    assert len(inserts) == 1
    assert outbox() == []


@pytest.mark.usefixtures("durable_transport")
def test_a_large_bulk_write_is_written_in_inserts_of_bounded_size(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outbox_table, "INSERT_BYTES", 2000)
    Company.objects.bulk_create([Company(workspace=workspace, name=f"c{i}") for i in range(30)])
    forget_messages()
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        Company.objects.filter(workspace=workspace).update(name="same")
        rows = outbox()
    inserts = [q for q in queries.captured_queries if "INSERT INTO realtime_outbox" in q["sql"]]
    assert len(inserts) > 1
    assert [seq for _, seq in rows] == list(range(30))
    assert outbox() == []
    assert len(names()) == 30


@pytest.mark.usefixtures("durable_transport")
def test_in_autocommit_there_is_no_transaction_to_join_and_the_write_is_published_at_once(
    workspace: Workspace,
) -> None:
    forget_messages()
    with CaptureQueriesContext(connection) as queries:
        Company.objects.create(workspace=workspace, name="at once")
    assert not [q for q in queries.captured_queries if "realtime_outbox" in q["sql"]]
    assert names() == [("company.created", "at once")]
    # With a key all the same: if the publish had failed, its rows would carry it.
    (key,) = DurableTableTransport.keys
    assert key is not None


@pytest.mark.usefixtures("durable_transport")
def test_a_failed_publish_in_autocommit_is_kept_in_the_outbox_and_relayed_with_its_key(
    workspace: Workspace, caplog: pytest.LogCaptureFixture
) -> None:
    forget_messages()
    with TableAway(), caplog.at_level(logging.WARNING, "realtime"):
        Company.objects.create(workspace=workspace, name="kept")
        assert len(outbox()) == 1
    assert "1 announcement(s) of a committed write were kept in realtime_outbox" in caplog.text
    assert names() == []
    assert Sweeper(grace=0.0).sweep() == 1
    assert outbox() == []
    assert names() == [("company.created", "kept")]
    writer, sweeper = DurableTableTransport.keys
    assert writer == sweeper
    assert writer is not None


def test_a_transport_that_is_not_durable_never_touches_the_outbox(
    workspace: Workspace, settings: Any
) -> None:
    settings.REALTIME_TRANSPORT = "table"
    with CaptureQueriesContext(connection) as queries:
        with transaction.atomic():
            company = Company.objects.create(workspace=workspace, name="A")
            broadcast_to_users([1], "app.hello", None)
        Company.objects.filter(pk=company.pk).update(name="B")
    assert not [q for q in queries.captured_queries if "realtime_outbox" in q["sql"]]
    assert "INSERT INTO firm_channel_messages" in " ".join(
        q["sql"] for q in queries.captured_queries
    )


# The sweeper ---------------------------------------------------------------------------------


class TableAway:
    """``firm_channel_messages`` renamed away: every publish of the table transport fails
    as it would with its database gone."""

    def __enter__(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE firm_channel_messages RENAME TO realtime_test_away")

    def __exit__(self, *exc: object) -> None:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE realtime_test_away RENAME TO firm_channel_messages")


@pytest.mark.usefixtures("durable_transport")
def test_publishes_failing_on_every_write_log_within_the_operation_budget_and_lose_nothing(
    workspace: Workspace, caplog: pytest.LogCaptureFixture
) -> None:
    """An outage fails every write's publish: its lines (the failure, the rows kept) come
    within realtime's budget of operation lines, not one traceback per write, and every
    announcement is kept for a sweep all the same."""
    writes = logs.OPERATION_LINES_PER_MINUTE  # two lines each: twice the budget
    forget_messages()
    with TableAway(), caplog.at_level(logging.WARNING, "realtime"):
        for number in range(writes):
            Company.objects.create(workspace=workspace, name=f"during {number}")
        assert len(outbox()) == writes
    lines = [r for r in caplog.records if r.name.startswith("realtime")]
    assert len(lines) == logs.OPERATION_LINES_PER_MINUTE
    assert logs.operation_budget.suppressed == writes * 2 - len(lines)
    assert Sweeper(grace=0.0).sweep() == writes
    assert len(names()) == writes


@pytest.mark.usefixtures("durable_transport")
def test_a_failed_publish_leaves_the_rows_and_a_sweep_relays_them_with_the_same_key(
    workspace: Workspace, caplog: pytest.LogCaptureFixture
) -> None:
    forget_messages()
    with TableAway():
        with transaction.atomic():
            Company.objects.create(workspace=workspace, name="late")
        assert len(outbox()) == 1
        assert "publishing 1 announcement(s) failed" in caplog.text
        with caplog.at_level(logging.WARNING, "realtime"):
            assert Sweeper(grace=0.0).sweep_logged() == 0  # still away: the rows stay
        assert "relaying realtime_outbox on 'default' failed" in caplog.text
        assert len(outbox()) == 1
    assert names() == []
    assert Sweeper(grace=0.0).sweep() == 1
    assert outbox() == []
    assert names() == [("company.created", "late")]
    # The writer's, the sweep's that failed too, the sweep's that went through.
    writer, failed, sweeper = DurableTableTransport.keys
    assert writer == failed == sweeper
    assert writer is not None


@pytest.mark.usefixtures("durable_transport")
def test_a_sweeper_relays_only_transactions_it_has_seen_for_the_commit_grace(
    workspace: Workspace,
) -> None:
    forget_messages()
    with TableAway(), transaction.atomic():
        Company.objects.create(workspace=workspace, name="late")
    patient = Sweeper(grace=3600.0)
    assert patient.sweep() == 0
    assert patient.sweep() == 0
    assert len(outbox()) == 1
    assert list(patient.seen["default"]) == [outbox()[0][0]]
    assert Sweeper(grace=0.0).sweep() == 1
    assert names() == [("company.created", "late")]


@pytest.mark.usefixtures("durable_transport")
def test_an_unreadable_row_is_logged_and_dropped_and_the_others_are_relayed(
    workspace: Workspace, caplog: pytest.LogCaptureFixture
) -> None:
    forget_messages()
    outbox_table.insert("default", "0" * 32, [(0, b"garbled")])
    with TableAway(), transaction.atomic():
        Company.objects.create(workspace=workspace, name="readable")
    with caplog.at_level(logging.WARNING, "realtime"):
        assert Sweeper(grace=0.0).sweep() == 2
    assert "1 row(s) of realtime_outbox could not be read and were dropped" in caplog.text
    assert outbox() == []
    assert names() == [("company.created", "readable")]


@pytest.mark.usefixtures("durable_transport")
def test_the_sweeper_measures_the_outbox(workspace: Workspace) -> None:
    if metrics.get() is None:
        pytest.skip("prometheus_client is not installed")
    with TableAway(), transaction.atomic():
        Company.objects.create(workspace=workspace, name="late")
    Sweeper(grace=3600.0).sweep()
    samples = outbox_samples()
    assert samples[("realtime_outbox_pending", "default")] == 1
    assert samples[("realtime_outbox_oldest_seconds", "default")] >= 0
    sweeper = Sweeper(grace=0.0)
    assert sweeper.sweep() == 1
    sweeper.sweep()  # what the sweep finds is what the gauges say
    samples = outbox_samples()
    assert samples[("realtime_outbox_pending", "default")] == 0
    assert samples[("realtime_outbox_oldest_seconds", "default")] == 0


@pytest.mark.usefixtures("durable_transport")
def test_the_relay_command_relays_what_writers_left(workspace: Workspace, settings: Any) -> None:
    import io

    settings.REALTIME_COMMIT_GRACE = 0.05
    forget_messages()
    with TableAway(), transaction.atomic():
        Company.objects.create(workspace=workspace, name="late")
    out = io.StringIO()
    call_command("realtime_relay", stdout=out)
    assert "Relayed 1 announcement(s)." in out.getvalue()
    assert outbox() == []
    assert names() == [("company.created", "late")]


@pytest.mark.usefixtures("durable_transport")
def test_the_relay_commands_loop_outlives_an_outage_and_relays_once_it_is_over(
    workspace: Workspace,
) -> None:
    """``realtime_relay --loop`` (a process of its own) while the transport is away: its
    sweeps fail, logged once, and it goes on; once the transport is back it relays what the
    writers left."""
    forget_messages()
    env = {
        **subprocess_env(),
        "REALTIME_TEST_SETTINGS": json.dumps(
            {
                "REALTIME_TRANSPORT": "tests.durable_transport.DurableTableTransport",
                "REALTIME_COMMIT_GRACE": 0.05,
            }
        ),
    }
    command = [sys.executable, "manage.py", "realtime_relay", "--loop", "--interval", "0.05"]
    failing = "relaying realtime_outbox on 'default' failed"
    logged: list[str] = []
    with TableAway():
        with transaction.atomic():
            Company.objects.create(workspace=workspace, name="late")
        looping = subprocess.Popen(command, cwd=ROOT, env=env, text=True, stderr=subprocess.PIPE)
        assert looping.stderr is not None
        reading = threading.Thread(target=lambda: logged.extend(looping.stderr or ()))
        reading.start()
        try:
            deadline = time.monotonic() + WAIT
            while not any(failing in line for line in logged) and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.3)  # a few more sweeps, failing too
            assert looping.poll() is None, "".join(logged)
        except BaseException:
            looping.kill()
            reading.join(WAIT)
            looping.stderr.close()
            raise
    try:
        deadline = time.monotonic() + WAIT
        while outbox() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert outbox() == []
        assert names() == [("company.created", "late")]
        assert looping.poll() is None
    finally:
        looping.terminate()
        looping.wait(WAIT)
        reading.join(WAIT)
        looping.stderr.close()
    assert sum(failing in line for line in logged) == 1, "".join(logged)


def outbox_samples() -> dict[tuple[str, str | None], float]:
    found = metrics.samples()
    assert found is not None
    return {(name, labels.get("database")): value for name, labels, value in found}


def start(command: list[str], settings: dict[str, Any]) -> subprocess.Popen[str]:
    env = subprocess_env()
    env["REALTIME_TEST_SETTINGS"] = json.dumps(settings)
    return subprocess.Popen(
        [sys.executable, "-m", "tests.worker", *command],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


@only_on("postgresql", "mysql")  # SQLite: one claim at a time
def test_a_claim_takes_a_transaction_whole_or_not_at_all() -> None:
    with transaction.atomic():
        outbox_table.insert("default", "T", [(0, b"a"), (1, b"b"), (2, b"c")])
    locked, done = threading.Event(), threading.Event()

    def another_claim_part_way() -> None:
        # Another sweeper's claim (ORDER BY id) holds the first row, not the others yet.
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(
                    "SELECT id FROM realtime_outbox WHERE txn = 'T' AND seq = 0 FOR UPDATE"
                )
                locked.set()
                done.wait(WAIT)
        finally:
            connection.close()

    thread = threading.Thread(target=another_claim_part_way)
    thread.start()
    assert locked.wait(WAIT)
    try:
        part_way = outbox_table.claim("default", ["T"], 30.0)
    finally:
        done.set()
        thread.join()
    # Its rows would be relayed under another key than its writer's: a duplicate on Redis.
    assert part_way == []
    assert [row.seq for row in outbox_table.claim("default", ["T"], 30.0)] == [0, 1, 2]


@pytest.mark.usefixtures("durable_transport")
def test_two_sweepers_in_two_processes_relay_each_row_once(workspace: Workspace) -> None:
    forget_messages()
    count = 300
    for index in range(count):
        item = UsersBroadcast([1], "test.row", {"n": index}, None, {})
        outbox_table.insert("default", f"{index:032x}", [(0, outbox_form.dump(item))])
    sweepers = [start(["relay"], {"REALTIME_TRANSPORT": DURABLE}) for _ in range(2)]
    try:
        go_together(sweepers)
        relayed = [int(process.communicate(timeout=120)[0].strip()) for process in sweepers]
    finally:
        for process in sweepers:
            if process.poll() is None:
                process.kill()
    assert sum(relayed) == count
    heard = sorted(m["data"]["n"] for m in events() if m.get("event_type") == "test.row")
    assert heard == list(range(count))
    assert outbox() == []


@pytest.mark.usefixtures("durable_transport")
async def test_a_writer_killed_between_commit_and_relay_is_relayed_by_a_worker_and_heard_once(
    live_servers: LiveServers, ws: Clients
) -> None:
    from django.contrib.auth import get_user_model

    def setup() -> tuple[Workspace, Any]:
        workspace = Workspace.objects.create(name="Acme", slug="acme")
        user = get_user_model().objects.create_user(username="ann")
        Membership.objects.create(workspace=workspace, user=user)
        return workspace, user

    workspace, user = await off_loop(setup)
    server = live_servers.get(REALTIME_TRANSPORT=DURABLE, REALTIME_COMMIT_GRACE=0.2)
    client = await ws.authenticated(server, await off_loop(issue_token, user), scope="acme")
    await client.send("subscribe", {"channel": "company"})
    await off_loop(broadcast_to_user, user.pk, "test.marker", None)
    await client.frames_until("test.marker")  # subscribed
    writer = start(
        ["durable-write", str(workspace.pk), "orphan"],
        {"REALTIME_TRANSPORT": "tests.durable_transport.DyingTransport"},
    )
    out, _ = await off_loop(writer.communicate, timeout=WAIT)
    assert writer.returncode == 1  # died in its relay
    assert "committed" not in out
    frame = await client.wait_for(lambda f: f["type"] == "company.created", timeout=30)
    assert frame["data"]["name"] == "orphan"
    await off_loop(broadcast_to_user, user.pk, "test.marker", None)
    after = await client.frames_until("test.marker")
    assert [f for f in after if f["type"] == "company.created"] == []
    assert await off_loop(outbox) == []
    assert await off_loop(lambda: Company.objects.filter(name="orphan").count()) == 1
    await client.close()


# Several databases ---------------------------------------------------------------------------


class RealtimeOnDefaultOnly:
    """A router keeping realtime's tables on ``default`` alone."""

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        if app_label == "realtime":
            return db == "default"
        return None


def test_a_router_refusing_the_outbox_where_writes_are_announced_is_an_error(
    settings: Any,
) -> None:
    settings.DATABASE_ROUTERS = [f"{__name__}.RealtimeOnDefaultOnly"]
    settings.REALTIME_TRANSPORT = "table"
    assert check_outbox_databases() == []
    settings.REALTIME_TRANSPORT = DURABLE
    (error,) = check_outbox_databases()
    assert error.id == "realtime.E025"
    assert "'other'" in error.msg
    assert "testapp.Company" in error.msg
    settings.DATABASE_ROUTERS = []
    assert check_outbox_databases() == []


@only_on("postgresql")
def test_a_relayed_rows_delete_waits_for_no_flush_and_never_changes_an_open_transaction(
    workspace: Workspace,
) -> None:
    # Lost in a crash, the delete leaves rows a sweeper relays again under their key (which
    # the transport drops): the writer need not wait for a disk flush after every write.
    ids = outbox_table.insert("default", "k1", [(0, b"{}")])
    with CaptureQueriesContext(connection) as queries:
        outbox_table.delete("default", ids)
    (delete,) = [q["sql"] for q in queries.captured_queries if "DELETE" in q["sql"]]
    assert "set_config('synchronous_commit', 'off', true)" in delete
    assert outbox() == []
    # Inside a transaction (the application's), the setting would outlive the delete.
    with transaction.atomic():
        ids = outbox_table.insert("default", "k2", [(0, b"{}")])
        with CaptureQueriesContext(connection) as queries:
            outbox_table.delete("default", ids)
        with connection.cursor() as cursor:
            cursor.execute("SHOW synchronous_commit")
            assert cursor.fetchone()[0] == "on"
    (delete,) = [q["sql"] for q in queries.captured_queries if "DELETE" in q["sql"]]
    assert "synchronous_commit" not in delete
