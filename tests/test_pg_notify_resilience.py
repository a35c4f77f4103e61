"""The pg_notify transport's LISTEN connection under stress, against a real PostgreSQL.

Each test builds its own ``PgNotifyTransport`` with short intervals and listens through it,
recording what reaches the transport's listeners (``Inbox``) and, where the test is about what
the server sends at all, every notification the LISTEN connection itself receives
(``RawNotifies``). Waits are bounded; absence is proven with a marker published afterwards.

Outages are real and confined to this test run: a backend of the test database is terminated
with ``pg_terminate_backend``, or the process reaches PostgreSQL through ``Proxy``, a TCP relay
in the test's event loop that the test closes (the database is unreachable: connections are
cut and refused) and opens again, or freezes (the flow goes silent, as behind a NAT that forgot
it). The PostgreSQL cluster itself is never stopped: other test runs share it.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any

import pytest
from django.db import connection, transaction

from realtime.auth import Scope
from realtime.messages import scope_channel
from realtime.sockets import manager as manager_module
from realtime.sockets.manager import SocketManager
from realtime.transports import pg_notify
from realtime.transports.pg_listener import APPLICATION_NAME, PgListener
from realtime.transports.pg_notify import PgNotifyTransport
from tests.helpers import WAIT, Inbox, eventually, off_loop, only_on, running_task
from tests.proxy import Proxy, default_database_through
from tests.test_manager import make_socket, recorder, until

pytestmark = [pytest.mark.django_db(transaction=True), only_on("postgresql")]

MARKER = b"marker"
MakeTransport = Callable[..., PgNotifyTransport]


# Helpers ----------------------------------------------------------------------------------


@pytest.fixture
async def make_pg_transport() -> AsyncIterator[MakeTransport]:
    """Build pg_notify transports with fast test timings; stop them afterwards."""
    built: list[PgNotifyTransport] = []

    def make(**options: Any) -> PgNotifyTransport:
        options.setdefault("supervise_interval", 0.2)
        options.setdefault("backoff_start", 0.05)
        options.setdefault("backoff_max", 0.4)
        transport = PgNotifyTransport(**options)
        built.append(transport)
        return transport

    yield make
    for transport in built:
        await transport.stop()
        transport.close()


class RawNotifies:
    """Every notification the LISTEN connection receives, before the transport filters it."""

    def __init__(self, listener: PgListener) -> None:
        self.received: list[tuple[str, str]] = []
        self._forward = listener.on_notify
        listener.on_notify = self

    def __call__(self, channel: str, payload: str) -> None:
        self.received.append((channel, payload))
        self._forward(channel, payload)

    def channels(self) -> set[str]:
        return {channel for channel, _ in self.received}


async def started(transport: PgNotifyTransport) -> PgListener:
    await transport.start()
    assert transport.listener is not None
    return transport.listener


async def publish(transport: PgNotifyTransport, *messages: tuple[str, bytes]) -> None:
    await off_loop(transport.publish, list(messages))


def notify(*pairs: tuple[str, str]) -> None:
    """Send raw NOTIFYs in one transaction, past the transport (no filtering, no naming)."""
    with transaction.atomic(), connection.cursor() as cursor:
        for channel, payload in pairs:
            cursor.execute("SELECT pg_notify(%s, %s)", [channel, payload])


def listener_backends() -> dict[int, str]:
    """The LISTEN connections open on the test database: backend pid → last query."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, query FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = %s",
            [APPLICATION_NAME],
        )
        return {pid: query for pid, query in cursor.fetchall()}


async def until_gone(pid: int | None) -> None:
    """Wait, bounded, until backend ``pid`` has left the test database."""
    async with asyncio.timeout(WAIT):
        while True:  # pg_stat_activity has no event to wait on: poll it
            if pid not in await off_loop(listener_backends):
                return
            await asyncio.sleep(0.02)


def terminate(pid: int) -> bool:
    """Terminate one backend of the test database (never one of another database)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE pid = %s AND datname = current_database()",
            [pid],
        )
        row = cursor.fetchone()
    return bool(row and row[0])


def realtime_records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("realtime") and r.levelno >= level]


def lost_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "LISTEN connection is lost" in r.getMessage()]


def attempt_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The lines of failed attempts to connect: the loss, then each later attempt."""
    return [
        r
        for r in caplog.records
        if "LISTEN connection is lost" in r.getMessage()
        or ("LISTEN connection: attempt" in r.getMessage() and "failed too" in r.getMessage())
    ]


# A worker hears what it follows, and nothing else ------------------------------------------


async def test_a_notify_on_a_channel_never_followed_never_reaches_the_worker(
    make_pg_transport: MakeTransport, inbox: Inbox
) -> None:
    transport = make_pg_transport()
    transport.add_listener(inbox)
    raw = RawNotifies(await started(transport))
    await transport.follow("h8_scope_1")
    assert transport.listener is not None
    assert transport.listener.listening == {"h8_scope_1"}
    await off_loop(notify, ("h8_scope_2", "never followed"), ("h8_scope_1", "marker"))
    await inbox.wait_for("h8_scope_1", MARKER)
    assert raw.received == [("h8_scope_1", "marker")]
    assert inbox.messages == [("h8_scope_1", MARKER)]


async def test_unfollowing_the_last_holder_of_a_channel_unlistens_it_on_the_server(
    make_pg_transport: MakeTransport, inbox: Inbox
) -> None:
    transport = make_pg_transport()
    transport.add_listener(inbox)
    listener = await started(transport)
    raw = RawNotifies(listener)
    await transport.follow("h8_scope_1")
    await transport.follow("h8_scope_2")
    assert listener.listening == {"h8_scope_1", "h8_scope_2"}
    await transport.unfollow("h8_scope_1")
    await eventually(lambda: listener.listening == {"h8_scope_2"})
    await off_loop(notify, ("h8_scope_1", "after unlisten"), ("h8_scope_2", "marker"))
    await inbox.wait_for("h8_scope_2", MARKER)
    # Not merely filtered out by the transport: the server no longer sends it.
    assert raw.channels() == {"h8_scope_2"}
    assert inbox.messages == [("h8_scope_2", MARKER)]


# Losing the connection -----------------------------------------------------------------


async def test_a_terminated_listen_backend_is_replaced_by_a_new_one_and_delivery_resumes(
    make_pg_transport: MakeTransport, inbox: Inbox, caplog: pytest.LogCaptureFixture
) -> None:
    transport = make_pg_transport()
    transport.add_listener(inbox)
    await transport.follow("h8_room")
    listener = transport.listener
    assert listener is not None
    old_pid = listener.backend_pid
    assert old_pid is not None
    assert old_pid in await off_loop(listener_backends)
    with caplog.at_level(logging.WARNING, logger="realtime"):
        assert await off_loop(terminate, old_pid)
        await eventually(
            lambda: listener.backend_pid != old_pid and "h8_room" in listener.listening,
            timeout=5.0,
        )
        assert listener.backend_pid in await off_loop(listener_backends)
        await publish(transport, ("h8_room", b"after the cut"))
        await inbox.wait_for("h8_room", b"after the cut")
    assert inbox.messages == [("h8_room", b"after the cut")]
    await until_gone(old_pid)
    assert lost_records(caplog), "the lost connection was not logged"
    assert realtime_records(caplog, logging.ERROR) == []


async def test_a_database_outage_is_ridden_out_with_backoff_and_one_line_per_change(
    make_pg_transport: MakeTransport,
    inbox: Inbox,
    proxy: Proxy,
    caplog: pytest.LogCaptureFixture,
    settings: Any,
) -> None:
    # The log's trimming thread has an outage line of its own when a trim meets the cut.
    settings.REALTIME_AUTO_TRIM = False
    with default_database_through(proxy), caplog.at_level(logging.DEBUG, logger="realtime"):
        transport = make_pg_transport(backoff_start=0.1, backoff_max=0.4)
        transport.add_listener(inbox)
        await transport.follow("h8_room")
        listener = transport.listener
        assert listener is not None
        old_pid = listener.backend_pid
        await publish(transport, ("h8_room", b"before"))
        await inbox.wait_for("h8_room", b"before")
        reached_through_proxy = proxy.accepted

        await proxy.close()  # the database is gone for this process
        await eventually(lambda: len(attempt_records(caplog)) >= 5, timeout=5.0)
        assert not listener.connected.is_set()
        await proxy.open()  # and back
        await eventually(
            lambda: listener.connected.is_set() and "h8_room" in listener.listening,
            timeout=5.0,
        )
        await publish(transport, ("h8_room", b"after"))
        await inbox.wait_for("h8_room", b"after")

    assert reached_through_proxy >= 2  # the LISTEN connection and the publisher's
    assert listener.backend_pid != old_pid
    assert inbox.messages == [("h8_room", b"before"), ("h8_room", b"after")]
    attempts = attempt_records(caplog)
    delays = [float(re.findall(r"retrying in ([\d.]+) s", r.getMessage())[0]) for r in attempts]
    assert delays[:5] == [0.1, 0.2, 0.4, 0.4, 0.4]  # doubling from the start, capped
    for earlier, later, delay in zip(attempts[:5], attempts[1:5], delays, strict=False):
        assert later.created - earlier.created >= delay - 0.02
    # One WARNING when lost, one when back; the attempts between are DEBUG, with no traceback.
    warnings = realtime_records(caplog, logging.WARNING)
    assert [r.levelno for r in warnings] == [logging.WARNING, logging.WARNING]
    assert "LISTEN connection is lost (attempt 1" in warnings[0].getMessage()
    assert re.search(r"LISTEN connection is back after [\d.]+ s", warnings[1].getMessage())
    assert all(r.levelno == logging.DEBUG for r in attempts[1:])
    assert not [r for r in caplog.records if r.name.startswith("realtime") and r.exc_info]


async def test_a_listen_database_that_fails_while_the_database_answers_is_an_error_from_the_second_attempt(  # noqa: E501
    make_pg_transport: MakeTransport,
    proxy: Proxy,
    settings: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # REALTIME_LISTEN_DATABASE names a database that does not exist; the default one answers.
    missing = f"{connection.settings_dict['NAME']}_missing"
    settings.REALTIME_LISTEN_DATABASE = proxy.dsn(missing)
    with caplog.at_level(logging.WARNING, logger="realtime"):
        transport = make_pg_transport(backoff_start=0.05, backoff_max=0.1)
        assert transport.listen_database == proxy.dsn(missing)
        await transport.start()
        await eventually(lambda: bool(realtime_records(caplog, logging.ERROR)), timeout=5.0)
    assert proxy.accepted >= 2  # the listener really used REALTIME_LISTEN_DATABASE
    attempts = [r for r in caplog.records if "LISTEN connection" in r.getMessage()]
    assert attempts[0].levelno == logging.WARNING
    assert "attempt 1" in attempts[0].getMessage()
    first_error = realtime_records(caplog, logging.ERROR)[0]
    assert "attempt 2" in first_error.getMessage()
    assert "database answers" in first_error.getMessage()


async def test_a_database_back_between_a_failed_attempt_and_the_check_is_no_error(
    make_pg_transport: MakeTransport,
    inbox: Inbox,
    proxy: Proxy,
    settings: Any,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The LISTEN connection goes through the relay, the other queries straight to the
    # database. The relay is cut; it opens again exactly while the listener asks whether the
    # database answers, after its second attempt failed: a restart, seen at the worst moment.
    settings.REALTIME_LISTEN_DATABASE = proxy.dsn(str(connection.settings_dict["NAME"]))
    answers = pg_notify._database_answers

    async def back_while_asked() -> bool:
        await proxy.open()
        return await answers()

    monkeypatch.setattr(pg_notify, "_database_answers", back_while_asked)
    with caplog.at_level(logging.DEBUG, logger="realtime"):
        transport = make_pg_transport(backoff_start=0.05, backoff_max=0.1)
        transport.add_listener(inbox)
        await transport.follow("h8_room")
        listener = transport.listener
        assert listener is not None
        await proxy.close()
        await eventually(lambda: not listener.connected.is_set())
        await eventually(lambda: listener.connected.is_set() and "h8_room" in listener.listening)
        await publish(transport, ("h8_room", b"after"))
        await inbox.wait_for("h8_room", b"after")
    assert realtime_records(caplog, logging.ERROR) == []
    warnings = [r.getMessage() for r in realtime_records(caplog, logging.WARNING)]
    assert len(warnings) == 2, warnings
    assert "is lost" in warnings[0]
    assert "is back" in warnings[1]


async def test_hundreds_of_channels_asked_for_at_once_are_listened_to_in_a_few_round_trips(
    make_pg_transport: MakeTransport, inbox: Inbox
) -> None:
    transport = make_pg_transport()
    transport.add_listener(inbox)
    await transport.follow("h8_first")  # connected
    listener = transport.listener
    assert listener is not None
    statements: list[Any] = []
    execute = listener._execute

    async def counted(connection: Any, query: Any) -> Any:
        statements.append(query)
        return await execute(connection, query)

    listener._execute = counted  # type: ignore[method-assign]
    channels = [f"h8_burst_{n}" for n in range(250)]
    await asyncio.gather(*(transport.follow(channel) for channel in channels))
    # One round trip per hundred channels, give or take the turns the loop takes between the
    # follows: far from one per channel.
    assert len(statements) <= 25, len(statements)
    listener.verify()
    await eventually(lambda: not listener._verify)
    # What the server itself says is listened to (read by the verification).
    assert {pg_notify.pg_channel(channel) for channel in channels} <= listener.listening
    await publish(transport, ("h8_burst_0", b"first"), ("h8_burst_249", b"last"))
    await inbox.wait_for("h8_burst_249", b"last")
    assert inbox.messages == [("h8_burst_0", b"first"), ("h8_burst_249", b"last")]


async def test_a_scope_whose_listen_is_late_closes_its_sockets_1012_in_one_warning(
    make_pg_transport: MakeTransport,
    proxy: Proxy,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The LISTEN connection goes silent (as behind a burst of handshakes, or a frozen
    # network): a new scope's LISTEN does not complete within the handshake's wait.
    monkeypatch.setattr(manager_module, "LISTEN_WAIT", 0.2)
    transport = make_pg_transport(listen_database=proxy.dsn(str(connection.settings_dict["NAME"])))
    await transport.follow("h8_room")  # connected
    manager = SocketManager()
    manager._transport = transport
    proxy.freeze()
    first, second = make_socket(SimpleNamespace(pk=1), 7), make_socket(SimpleNamespace(pk=2), 7)
    with caplog.at_level(logging.WARNING, logger="realtime"):
        followed = await asyncio.gather(manager.register(first), manager.register(second))
        async with asyncio.timeout(WAIT):
            await until(lambda: bool(recorder(first).closes and recorder(second).closes))

    # Neither reads a scope the worker does not hear: both reconnect.
    assert list(followed) == [False, False]
    assert recorder(first).closes == recorder(second).closes == [1012]
    assert manager.index.sockets == set()
    # The follow is taken back: a LISTEN that completes later serves nobody.
    assert 7 not in manager._followed
    assert scope_channel(7) not in transport._names.values()
    lines = [r for r in caplog.records if r.name.startswith("realtime")]
    assert [r.getMessage() for r in lines] == [
        "realtime: following scope 7 took over 0.2 s; closed its 2 socket(s) 1012 to make "
        "them reconnect"
    ]
    assert not any(r.exc_info for r in lines)


async def test_a_watch_adding_a_scope_whose_listen_is_late_closes_the_socket_1012(
    make_pg_transport: MakeTransport, proxy: Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(manager_module, "LISTEN_WAIT", 0.2)
    transport = make_pg_transport(listen_database=proxy.dsn(str(connection.settings_dict["NAME"])))
    manager = SocketManager()
    manager._transport = transport
    reading = make_socket(SimpleNamespace(pk=1), 7)
    await manager.register(reading)
    assert 7 in manager._followed  # scope 7 is heard
    proxy.freeze()
    await manager.set_scopes(reading, [Scope(7, "seven"), Scope(8, "eight")], keep_channels=False)
    async with asyncio.timeout(WAIT):
        await until(lambda: bool(recorder(reading).closes))

    assert recorder(reading).closes == [1012]
    assert manager.index.sockets == set()
    assert 8 not in manager._followed


@pytest.mark.parametrize(
    "supervise_interval",
    [
        pytest.param(60.0, id="caught-by-a-probe"),
        pytest.param(0.1, id="caught-while-the-supervisor-checks-it"),
    ],
)
async def test_a_connection_that_goes_silent_is_replaced_within_the_heartbeat_timeout(
    make_pg_transport: MakeTransport,
    inbox: Inbox,
    proxy: Proxy,
    caplog: pytest.LogCaptureFixture,
    supervise_interval: float,
) -> None:
    interval, timeout, backoff = 0.2, 0.3, 0.1
    transport = make_pg_transport(
        listen_database=proxy.dsn(str(connection.settings_dict["NAME"])),
        heartbeat_interval=interval,
        heartbeat_timeout=timeout,
        backoff_start=backoff,
        backoff_max=backoff,
        supervise_interval=supervise_interval,
    )
    transport.add_listener(inbox)
    with caplog.at_level(logging.WARNING, logger="realtime"):
        await transport.follow("h8_room")
        listener = transport.listener
        assert listener is not None
        old_pid = listener.backend_pid
        # The flow goes silent (a NAT forgot it, the server hangs): nothing errors, nothing
        # answers. The server itself and new connections are fine.
        proxy.freeze()
        # Whatever else the connection is asked (a supervisor's check, say), a probe is due
        # every interval and gives up after the timeout; then one backoff and a
        # reconnection, which 2 s of slack cover.
        await eventually(
            lambda: listener.backend_pid != old_pid and "h8_room" in listener.listening,
            timeout=interval + timeout + backoff + 2.0,
        )
        await publish(transport, ("h8_room", b"on the new connection"))
        await inbox.wait_for("h8_room", b"on the new connection")
    assert inbox.messages == [("h8_room", b"on the new connection")]
    assert lost_records(caplog)
    assert realtime_records(caplog, logging.ERROR) == []


# Supervision and probes ----------------------------------------------------------------


async def test_the_supervisor_restarts_a_cancelled_listener_task(
    make_pg_transport: MakeTransport, inbox: Inbox
) -> None:
    transport = make_pg_transport(supervise_interval=0.05)
    transport.add_listener(inbox)
    await transport.follow("h8_room")
    listener = transport.listener
    assert listener is not None
    old_pid = listener.backend_pid
    task = running_task(transport, "listener")
    task.cancel()
    await eventually(lambda: task.done())
    await eventually(
        lambda: (
            running_task(transport, "listener") is not task
            and not running_task(transport, "listener").done()
            and listener.connected.is_set()
            and "h8_room" in listener.listening
        )
    )
    assert listener.backend_pid != old_pid
    await publish(transport, ("h8_room", b"after the restart"))
    await inbox.wait_for("h8_room", b"after the restart")
    assert inbox.messages == [("h8_room", b"after the restart")]
    await until_gone(old_pid)


class ReturnsOnceListener(PgListener):
    """A listener whose first run returns at once, as a bug would make it."""

    runs = 0

    async def run(self) -> None:
        self.runs += 1
        if self.runs == 1:
            return
        await super().run()


async def test_the_supervisor_restarts_a_listener_task_that_returned_and_logs_it(
    make_pg_transport: MakeTransport,
    inbox: Inbox,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(pg_notify, "PgListener", ReturnsOnceListener)
    transport = make_pg_transport(supervise_interval=0.05)
    transport.add_listener(inbox)
    with caplog.at_level(logging.ERROR, logger="realtime"):
        # follow returns only once the channel is LISTENed: by the restarted run.
        await asyncio.wait_for(transport.follow("h8_room"), WAIT)
    listener = transport.listener
    assert isinstance(listener, ReturnsOnceListener)
    assert listener.runs == 2
    await publish(transport, ("h8_room", b"after the restart"))
    await inbox.wait_for("h8_room", b"after the restart")
    assert [r.getMessage() for r in realtime_records(caplog, logging.ERROR)] == [
        "realtime: the pg_notify listener stopped; restarting it"
    ]


async def test_probes_keep_an_idle_connection_alive_on_the_same_backend(
    make_pg_transport: MakeTransport, inbox: Inbox
) -> None:
    transport = make_pg_transport(heartbeat_interval=0.05, supervise_interval=60.0)
    transport.add_listener(inbox)
    await transport.follow("h8_idle")
    listener = transport.listener
    assert listener is not None
    pid, probes = listener.backend_pid, listener.probes
    started_at = time.monotonic()
    await eventually(lambda: listener.probes >= probes + 5)
    assert time.monotonic() - started_at >= 4 * 0.05  # one probe per interval, not a burst
    assert listener.backend_pid == pid
    backends = await off_loop(listener_backends)
    assert pid is not None
    assert backends[pid] == "SELECT 1"  # the probes reached the server
    await publish(transport, ("h8_idle", b"still heard"))
    await inbox.wait_for("h8_idle", b"still heard")
    assert listener.backend_pid == pid


# Coming back promptly, and cleanly -----------------------------------------------------


async def test_a_listen_connection_given_up_on_leaves_no_backend_behind(
    make_pg_transport: MakeTransport, inbox: Inbox, proxy: Proxy
) -> None:
    transport = make_pg_transport(
        listen_database=proxy.dsn(str(connection.settings_dict["NAME"])),
        heartbeat_interval=0.2,
        heartbeat_timeout=0.3,
        backoff_start=0.1,
        backoff_max=0.1,
    )
    transport.add_listener(inbox)
    await transport.follow("h8_room")
    listener = transport.listener
    assert listener is not None
    old_pid = listener.backend_pid
    # Half-open: the old connection goes silent (its backend lives on behind the relay),
    # new connections flow.
    proxy.freeze()
    await eventually(lambda: listener.backend_pid != old_pid and listener.connected.is_set())
    await until_gone(old_pid)
    backends = await off_loop(listener_backends)
    assert [pid for pid in backends if pid in (old_pid, listener.backend_pid)] == [
        listener.backend_pid
    ]
    await publish(transport, ("h8_room", b"on the new connection"))
    await inbox.wait_for("h8_room", b"on the new connection")


async def test_the_listener_comes_back_at_once_when_the_database_does_within_a_long_backoff(
    make_pg_transport: MakeTransport,
    inbox: Inbox,
    proxy: Proxy,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with default_database_through(proxy), caplog.at_level(logging.DEBUG, logger="realtime"):
        transport = make_pg_transport(backoff_start=0.05, backoff_max=30.0)
        transport.add_listener(inbox)
        await transport.follow("h8_room")
        listener = transport.listener
        assert listener is not None
        await proxy.close()
        # The seventh attempt failed: the next one is scheduled 3.2 s later.
        await eventually(lambda: listener.outage.attempts >= 7)
        pending = float(
            re.findall(r"retrying in ([\d.]+) s", attempt_records(caplog)[-1].getMessage())[0]
        )
        assert pending >= 3.2
        await proxy.open()
        # Far sooner than the backoff: the listener saw the server accept connections again.
        await eventually(listener.connected.is_set, timeout=pending / 2)
        await publish(transport, ("h8_room", b"back"))
        await inbox.wait_for("h8_room", b"back")
    assert listener.prompt_retries == 1
