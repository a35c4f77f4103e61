"""``manage.py realtime_trim`` and ``manage.py realtime_stats`` on the real test database.

Transactional tests: the SQLite trim takes its own ``BEGIN IMMEDIATE`` and refuses to run
inside a transaction, so the test cannot wrap it in one.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections
from django.test import override_settings

from realtime.fields import naive_utc_now
from realtime.management.commands import realtime_trim
from realtime.transports import table_store
from realtime.transports.table import TableTransport
from tests.helpers import ROOT, db_datetime, only_on, start_worker, subprocess_env

HOUR = datetime.timedelta(hours=1)
database = pytest.mark.django_db(transaction=True)


def insert_rows(rows: list[tuple[str, bytes]], age: datetime.timedelta) -> None:
    """Insert ``(channel, payload)`` rows created ``age`` ago, with plain SQL."""
    created_at = db_datetime(naive_utc_now() - age)
    with connection.cursor() as cursor:
        for channel, payload in rows:
            encoded = channel.encode()
            cursor.execute(
                f"INSERT INTO {table_store.TABLE} (channel, payload, channel_hash, created_at) "
                "VALUES (%s, %s, %s, %s)",
                [encoded, payload, table_store.channel_hash(encoded), created_at],
            )


def insert_old_rows(count: int, age: datetime.timedelta = HOUR) -> list[bytes]:
    payloads = [f"old {index}".encode() for index in range(count)]
    insert_rows([("old", payload) for payload in payloads], age)
    return payloads


def publish_fresh_rows(count: int) -> list[bytes]:
    payloads = [f"fresh {index}".encode() for index in range(count)]
    TableTransport(auto_trim=False).publish([("fresh", payload) for payload in payloads])
    return payloads


def stored_payloads() -> list[bytes]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT payload FROM {table_store.TABLE} ORDER BY id")
        return [bytes(row[0]) for row in cursor.fetchall()]


def run(command: str, *args: str) -> list[str]:
    """Run a management command in this process; return the lines it printed."""
    stdout = io.StringIO()
    call_command(command, *args, stdout=stdout, no_color=True)
    return stdout.getvalue().splitlines()


# realtime_trim


@database
def test_trim_deletes_only_expired_rows_batch_by_batch() -> None:
    insert_old_rows(5)
    fresh = publish_fresh_rows(3)
    lines = run("realtime_trim", "--retention", "60", "--batch-size", "2")
    assert lines == [
        "Deleted 2 rows (2 so far)",
        "Deleted 2 rows (4 so far)",
        "Deleted 1 rows (5 so far)",
        "Deleted 5 expired messages.",
    ]
    assert stored_payloads() == fresh


@database
def test_trim_loops_until_a_batch_comes_back_short() -> None:
    insert_old_rows(7)
    fresh = publish_fresh_rows(2)
    lines = run("realtime_trim", "--retention", "60", "--batch-size", "3")
    assert lines == [
        "Deleted 3 rows (3 so far)",
        "Deleted 3 rows (6 so far)",
        "Deleted 1 rows (7 so far)",
        "Deleted 7 expired messages.",
    ]
    assert stored_payloads() == fresh


@database
def test_trim_of_a_multiple_of_the_batch_size_stops_at_the_empty_batch() -> None:
    insert_old_rows(6)
    lines = run("realtime_trim", "--retention", "60", "--batch-size", "3")
    assert lines == [
        "Deleted 3 rows (3 so far)",
        "Deleted 3 rows (6 so far)",
        "Deleted 6 expired messages.",
    ]
    assert stored_payloads() == []


@database
def test_trim_with_nothing_expired_deletes_nothing() -> None:
    fresh = publish_fresh_rows(4)
    assert run("realtime_trim", "--retention", "60", "--batch-size", "2") == [
        "Deleted 0 expired messages."
    ]
    assert stored_payloads() == fresh


@database
def test_trim_keeps_rows_younger_than_the_retention() -> None:
    insert_old_rows(2, age=2 * HOUR)
    middle = insert_old_rows(3, age=datetime.timedelta(minutes=30))
    lines = run("realtime_trim", "--retention", "3600")
    assert lines == ["Deleted 2 rows (2 so far)", "Deleted 2 expired messages."]
    assert stored_payloads() == middle


@database
def test_trim_defaults_to_the_retention_and_batch_size_settings() -> None:
    insert_old_rows(3, age=datetime.timedelta(minutes=10))
    fresh = publish_fresh_rows(1)
    with override_settings(REALTIME_MESSAGE_RETENTION=60, REALTIME_TRIM_BATCH_SIZE=2):
        lines = run("realtime_trim")
    assert lines == [
        "Deleted 2 rows (2 so far)",
        "Deleted 1 rows (3 so far)",
        "Deleted 3 expired messages.",
    ]
    assert stored_payloads() == fresh


@database
def test_a_trim_run_beside_another_waits_for_its_turn_and_ends_with_its_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Cron starts a run while another trim holds its turn (one long batch): the run waits
    for it and goes on, on every database. On MySQL it waits longer than a publisher waits
    for its lock (made short here): it used to fail then, with a traceback."""
    monkeypatch.setattr(table_store, "PUBLISH_LOCK_WAIT", 0.5)
    insert_old_rows(3)
    with holding_a_trim_turn() as release:
        trimming = ThreadPoolExecutor(max_workers=1)
        lines = trimming.submit(run_and_close, "realtime_trim", "--retention", "60")
        with pytest.raises(FutureTimeout):
            lines.result(timeout=2.0)  # its turn has not come, four publisher's waits later
        release()
        assert lines.result(timeout=30) == [
            "Deleted 3 rows (3 so far)",
            "Deleted 3 expired messages.",
        ]
        trimming.shutdown()
    assert stored_payloads() == []


@database
@only_on("mysql")
def test_a_trim_whose_turn_does_not_come_says_so_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past its wait (a day; made short here) a run ends with a CommandError naming the
    lock, not a traceback."""
    monkeypatch.setattr(realtime_trim, "TURN_WAIT", 0.5)
    insert_old_rows(3)
    with holding_a_trim_turn(), pytest.raises(CommandError, match="Another trim held the turn"):
        run_and_close("realtime_trim", "--retention", "60")
    assert len(stored_payloads()) == 3


@contextlib.contextmanager
def holding_a_trim_turn() -> Iterator[Callable[[], None]]:
    """Another process holding a trim's turn, as a trim under way holds it for its batch,
    until the callable given is called (or the block ends)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT MIN(id) FROM {table_store.TABLE}")
        row = cursor.fetchone()
    assert row is not None
    holder = start_worker("hold-trim", str(row[0]))
    assert holder.stdout is not None
    assert holder.stdin is not None
    stdin = holder.stdin
    released: list[bool] = []

    def release() -> None:
        if not released:
            released.append(True)
            stdin.write("release\n")
            stdin.flush()

    try:
        assert holder.stdout.readline().strip() == "locked"
        yield release
    finally:
        release()
        holder.communicate(timeout=30)


def run_and_close(command: str, *args: str) -> list[str]:
    """``run`` on this thread's own connections, closed after."""
    try:
        return run(command, *args)
    finally:
        connections.close_all()


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--batch-size", "0"], "argument --batch-size: '0' must be at least 1"),
        (["--batch-size", "-3"], "argument --batch-size: '-3' must be at least 1"),
        (["--batch-size", "x"], "argument --batch-size: 'x' is not a whole number"),
        (["--batch-size", "1.5"], "argument --batch-size: '1.5' is not a whole number"),
        (["--retention", "-1"], "argument --retention: '-1' must be 0 or more seconds"),
        (["--retention", "abc"], "argument --retention: 'abc' is not a number of seconds"),
        (["--retention", "nan"], "argument --retention: 'nan' must be 0 or more seconds"),
        (["--retention", "inf"], "argument --retention: 'inf' is more than 3153600000 seconds"),
        (["--retention", "1e13"], "argument --retention: '1e13' is more than 3153600000 sec"),
    ],
)
def test_trim_with_bad_argument_raises_command_error(args: list[str], error: str) -> None:
    with pytest.raises(CommandError, match=re.escape(error)):
        call_command("realtime_trim", *args)


@database
def test_trim_with_the_longest_retention_keeps_every_row() -> None:
    """A hundred years, the most ``--retention`` takes: the database takes it too."""
    kept = insert_old_rows(2, age=datetime.timedelta(days=365))
    assert run("realtime_trim", "--retention", "3153600000") == ["Deleted 0 expired messages."]
    assert stored_payloads() == kept


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("0", "'0' must be more than 0 seconds"),
        ("inf", "'inf' is more than 3153600000 seconds (100 years)"),
        ("1e300", "'1e300' is more than 3153600000 seconds (100 years)"),
    ],
)
def test_relay_with_an_interval_out_of_bounds_raises_command_error(value: str, error: str) -> None:
    with pytest.raises(CommandError, match=re.escape(f"argument --interval: {error}")):
        call_command("realtime_relay", "--loop", "--interval", value)


def test_trim_with_bad_argument_from_the_command_line_exits_with_status_2() -> None:
    env = subprocess_env()
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    result = subprocess.run(
        [sys.executable, "manage.py", "realtime_trim", "--batch-size", "0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr.startswith("usage: manage.py realtime_trim")
    assert "error: argument --batch-size: '0' must be at least 1" in result.stderr


# realtime_stats

NO_SHARED_METRICS = (
    "metrics:       set PROMETHEUS_MULTIPROC_DIR for the workers and this command to read theirs"
)


@database
def test_stats_report_rows_channels_oldest_age_and_payload_bytes() -> None:
    insert_rows([("alpha", b"12345")], age=datetime.timedelta(seconds=120))
    insert_rows([("alpha", b"123456"), ("beta", b"1234567")], age=datetime.timedelta(seconds=5))
    lines = run("realtime_stats")
    assert len(lines) == 5
    assert lines[0] == "rows:          3"
    assert lines[1] == "channels:      2"
    oldest = re.fullmatch(r"oldest row:    (\d+\.\d) s", lines[2])
    assert oldest is not None, lines[2]
    assert 120.0 <= float(oldest.group(1)) < 180.0
    assert lines[3] == "payload bytes: 18"


@database
def test_stats_count_published_rows() -> None:
    publish_fresh_rows(2)
    TableTransport(auto_trim=False).publish([("other", b"")])
    lines = run("realtime_stats")
    assert lines[0] == "rows:          3"
    assert lines[1] == "channels:      2"
    oldest = re.fullmatch(r"oldest row:    (\d+\.\d) s", lines[2])
    assert oldest is not None, lines[2]
    assert 0.0 <= float(oldest.group(1)) < 60.0
    assert lines[3] == f"payload bytes: {len(b'fresh 0') + len(b'fresh 1')}"


@database
def test_stats_of_an_empty_table_show_a_dash_for_the_oldest_row() -> None:
    assert run("realtime_stats") == [
        "rows:          0",
        "channels:      0",
        "oldest row:    -",
        "payload bytes: 0",
        NO_SHARED_METRICS,
    ]


@database
def test_stats_without_a_metrics_directory_say_how_to_read_the_workers_metrics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    assert run("realtime_stats")[-1] == NO_SHARED_METRICS
