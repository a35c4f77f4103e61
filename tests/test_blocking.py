"""Realtime's threads keep their database connections across calls, and replace broken ones.

The calls run on the real thread pool against the real test database; a connection is broken
for real, by ending its backend from another connection (PostgreSQL, MariaDB).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import DatabaseError, connection
from django.db.backends.signals import connection_created

from realtime import blocking, statement_clock
from realtime.blocking import close_connections, run_blocking
from tests.helpers import calling_every, off_loop, only_on
from tests.proxy import Proxy, default_database_through

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def opened() -> Iterator[list[str]]:
    """The names of the threads that opened a database connection during the test."""
    names: list[str] = []

    def note(sender: Any, **kwargs: Any) -> None:
        names.append(threading.current_thread().name)

    close_connections()
    connection_created.connect(note)
    yield names
    connection_created.disconnect(note)


def backend_id() -> int:
    """The database server's id of this thread's connection."""
    query = "SELECT pg_backend_pid()" if connection.vendor == "postgresql" else "SELECT 1"
    if connection.vendor == "mysql":
        query = "SELECT CONNECTION_ID()"
    with connection.cursor() as cursor:
        cursor.execute(query)
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


def end_backend(backend: int) -> None:
    """End a connection's backend from this (another) connection."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_terminate_backend(%s)", [backend])
        else:
            cursor.execute(f"KILL {int(backend)}")


async def test_realtime_threads_open_no_connection_per_call_with_conn_max_age_zero(
    opened: list[str],
) -> None:
    assert connection.settings_dict["CONN_MAX_AGE"] == 0
    for _ in range(3 * blocking.THREADS):
        await run_blocking(backend_id)
    assert opened
    assert len(opened) <= blocking.THREADS
    assert all(name.startswith("realtime-orm") for name in opened)


async def test_the_recheck_thread_keeps_its_connection_across_calls(opened: list[str]) -> None:
    for _ in range(5):
        await blocking.run_in_background(backend_id)
    assert opened == ["realtime-recheck_0"]


async def test_reads_frames_wait_for_run_while_every_handshake_thread_is_busy(
    opened: list[str],
) -> None:
    """A burst of handshakes (every socket of a worker reconnecting) fills realtime's pool;
    the reads a live frame waits for (an audience, a live query's refill) have threads of
    their own, and do not queue behind it."""
    release = threading.Event()

    def handshake() -> int:
        release.wait(10)
        return backend_id()

    burst = [asyncio.ensure_future(run_blocking(handshake)) for _ in range(3 * blocking.THREADS)]
    try:
        await asyncio.sleep(0.05)
        assert not any(call.done() for call in burst)  # every realtime-orm thread is held
        await asyncio.wait_for(blocking.run_for_delivery(backend_id), 5)
        assert not any(call.done() for call in burst)
    finally:
        release.set()
        await asyncio.gather(*burst)
    assert [name for name in opened if name.startswith("realtime-delivery")]


async def test_close_connections_closes_what_every_thread_kept(opened: list[str]) -> None:
    for _ in range(3 * blocking.THREADS):
        await run_blocking(backend_id)
    await blocking.run_in_background(backend_id)
    await blocking.run_for_delivery(backend_id)
    before = len(opened)
    close_connections()
    await run_blocking(backend_id)
    assert len(opened) == before + 1


@only_on("postgresql", "mysql")
async def test_a_kept_connection_that_was_ended_while_idle_is_replaced_before_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = await blocking.run_in_background(backend_id)
    await off_loop(end_backend, backend)
    monkeypatch.setattr(blocking, "IDLE_CHECK", 0.0)  # the connection counts as idle now
    assert await blocking.run_in_background(backend_id) != backend


@only_on("postgresql", "mysql")
async def test_a_call_that_failed_on_an_ended_connection_leaves_a_fresh_one_for_the_next() -> None:
    backend = await blocking.run_in_background(backend_id)
    await off_loop(end_backend, backend)
    with pytest.raises(DatabaseError):
        await blocking.run_in_background(backend_id)
    assert await blocking.run_in_background(backend_id) != backend


@only_on("postgresql", "mysql")
@pytest.mark.parametrize("idle", [False, True], ids=["in-a-statement", "in-the-idle-check"])
async def test_a_kept_connection_gone_silent_is_cut_past_the_bound_and_the_thread_works_again(
    proxy: Proxy,
    settings: Any,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    idle: bool,
) -> None:
    settings.REALTIME_HEARTBEAT_TIMEOUT = 0.2
    monkeypatch.setattr(statement_clock, "CUT_GRACE", 0.1)
    with default_database_through(proxy), caplog.at_level(logging.WARNING, logger="realtime"):
        backend = await blocking.run_in_background(backend_id)  # kept, through the relay
        proxy.freeze()  # its flow goes silent; new connections still flow
        # Idle: the check before the call waits on it; otherwise the call's own statement.
        monkeypatch.setattr(blocking, "IDLE_CHECK", 0.0 if idle else 3600.0)
        async with calling_every(0.05, blocking.cut_stuck_statements):
            call = blocking.run_in_background(backend_id)
            if idle:  # the check was cut and the connection replaced: the call works
                assert await asyncio.wait_for(call, 10) != backend
            else:  # the statement was cut: the call fails, and leaves the thread free
                with pytest.raises(DatabaseError):
                    await asyncio.wait_for(call, 10)
            assert await asyncio.wait_for(blocking.run_in_background(backend_id), 10) != backend
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("realtime")]
    assert len(lines) == 1, lines
    assert "had no answer for" in lines[0]
    assert "cut its connection" in lines[0]
