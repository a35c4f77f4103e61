"""The table transport keeps time by the database's clock, not the publisher's.

A publisher whose clock is behind — skewed, or stalled between taking the time and sending its
INSERT — used to write a row that looked older than it was: already past the commit grace, so
the poller's floor moved over it at once and over any lower id still being committed, which
was then never delivered. The publishers here run under ``faketime`` with their clock an hour
behind. (On SQLite the database's clock is the writing process's own, but SQLite commits one
writer at a time, in id order: no lower id can still be on its way.)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable

import pytest
from django.db import connection

from realtime.transports.table import TableTransport
from tests.helpers import ROOT, Inbox, off_loop, only_on, start_worker, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True)

MARKER = b"marker"
#: An hour behind: far past any commit grace.
BEHIND = "-3600s"


def faketime() -> str:
    path = shutil.which("faketime")
    if path is None:
        raise RuntimeError("faketime is not installed (scripts/provision installs it)")
    return path


def publish_behind(channel: str, payload: str) -> None:
    """Publish one message from a process whose clock is an hour behind."""
    env = subprocess_env()
    env["FAKETIME_DONT_FAKE_MONOTONIC"] = "1"
    command = [sys.executable, "-m", "tests.worker", "publish", channel, payload]
    result = subprocess.run(
        [faketime(), "-f", BEHIND, *command],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.strip() == "published", result.stderr


def age_of_newest_row() -> float:
    """Seconds between the newest row's ``created_at`` and the database's clock now."""
    now = {
        "postgresql": "clock_timestamp() AT TIME ZONE 'UTC'",
        "mysql": "UTC_TIMESTAMP(6)",
    }[connection.vendor]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"SELECT EXTRACT(EPOCH FROM ({now}) - created_at) "
                "FROM firm_channel_messages ORDER BY id DESC LIMIT 1"
            )
        else:
            cursor.execute(
                f"SELECT TIMESTAMPDIFF(MICROSECOND, created_at, {now}) / 1000000 "
                "FROM firm_channel_messages ORDER BY id DESC LIMIT 1"
            )
        row = cursor.fetchone()
    assert row is not None
    return float(row[0])


@only_on("postgresql", "mysql")
def test_a_publisher_whose_clock_is_behind_writes_the_databases_time() -> None:
    publish_behind("clock", "behind")
    assert abs(age_of_newest_row()) < 60


@only_on("postgresql", "mysql")
async def test_a_row_committed_late_is_delivered_though_a_behind_publisher_wrote_after_it(
    make_table_transport: Callable[..., TableTransport], inbox: Inbox
) -> None:
    transport = make_table_transport(commit_grace=30.0)
    transport.add_listener(inbox)
    await transport.follow("clock")
    holder = start_worker("hold-insert", "clock", "committed late")
    try:
        assert holder.stdout is not None
        assert holder.stdin is not None
        assert (await off_loop(holder.stdout.readline)).startswith("inserted")
        # A higher id, from a publisher an hour behind, commits first and is delivered.
        await off_loop(publish_behind, "clock", "behind")
        await inbox.wait_for("clock", b"behind")
        holder.stdin.write("commit\n")
        holder.stdin.flush()
        assert (await off_loop(holder.stdout.readline)).strip() == "committed"
    finally:
        holder.communicate(timeout=30)
    await off_loop(transport.publish, [("clock", MARKER)])
    await inbox.wait_for("clock", MARKER)
    assert inbox.payloads("clock") == [b"behind", b"committed late", MARKER]
