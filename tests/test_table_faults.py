"""The table poller under network faults and overload, against real databases.

The poller reaches the database through ``Proxy`` (a TCP relay in the test's event loop):
frozen, its established connections go silent while new ones flow (half-open); closed, the
database is unreachable. ``housekeeping`` calls the transport's watchdog every tick, as a
worker's housekeeping does. Waits are bounded; absence is proven with a marker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from types import SimpleNamespace

import pytest
from django.test import override_settings

from realtime.checks.settings import check_settings
from realtime.messages import scope_channel
from realtime.sockets import manager as manager_module
from realtime.sockets.manager import SocketManager
from realtime.transports import table_poller
from realtime.transports.bounds import Bounds, bounded_connection
from realtime.transports.table import TableTransport
from tests.helpers import (
    WAIT,
    Inbox,
    SmallQueue,
    calling_every,
    eventually,
    off_loop,
    only_on,
    vendor,
)
from tests.proxy import Proxy, default_database_through
from tests.test_compat_django import on_a_thread, statement_limit
from tests.test_manager import make_socket, recorder, until

pytestmark = pytest.mark.django_db(transaction=True)

MakeTransport = Callable[..., TableTransport]
MARKER = b"marker"
#: Short bounds: a statement may take half a second before it is cut.
SHORT = Bounds(statement_timeout=0.5, keepidle=1, keepintvl=1, keepcnt=2)
networked = only_on("postgresql", "mysql")


def housekeeping(
    transport: TableTransport, tick: float = 0.1
) -> contextlib.AbstractAsyncContextManager[None]:
    """Call the transport's watchdog every ``tick`` seconds, as a worker's housekeeping."""
    return calling_every(tick, transport.watch)


def bounded(transport: TableTransport) -> TableTransport:
    transport._poller.bounds = SHORT
    return transport


async def outage_of_the_poller(
    transport: TableTransport,
    inbox: Inbox,
    proxy: Proxy,
    while_down: Callable[[TableTransport], Awaitable[None]],
) -> None:
    """A poller through ``proxy`` hears "before"; the database goes away until ``while_down``
    returns, then comes back, and "after" is published."""
    with default_database_through(proxy):
        transport = bounded(transport)
        transport.add_listener(inbox)
        async with housekeeping(transport):
            await transport.follow("c")
            await off_loop(transport.publish, [("c", b"before")])
            await inbox.wait_for("c", b"before")
            await proxy.close()
            await while_down(transport)
            await proxy.open()
            await off_loop(transport.publish, [("c", b"after")])
            await inbox.wait_for("c", b"after")


def realtime_lines(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("realtime") and r.levelno >= level]


@networked
async def test_a_poller_whose_connection_goes_half_open_is_cut_and_delivers_again(
    make_table_transport: MakeTransport,
    inbox: Inbox,
    proxy: Proxy,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with default_database_through(proxy), caplog.at_level(logging.DEBUG, logger="realtime"):
        transport = bounded(make_table_transport())
        transport.add_listener(inbox)
        async with housekeeping(transport):
            await transport.follow("c")
            await off_loop(transport.publish, [("c", b"before")])
            await inbox.wait_for("c", b"before")
            # Established connections go silent; new ones (the publisher's) still flow.
            proxy.freeze()
            await off_loop(transport.publish, [("c", b"during")])
            await inbox.wait_for("c", b"during")
            await off_loop(transport.publish, [("c", MARKER)])
            await inbox.wait_for("c", MARKER)
    assert inbox.payloads("c") == [b"before", b"during", MARKER]
    # PostgreSQL has no client read timeout: the watchdog cut the statement. MySQL's
    # read_timeout may fire first. Either way, one line says why.
    why = [
        r.getMessage()
        for r in realtime_lines(caplog, logging.WARNING)
        if "cut its connection" in r.getMessage() or "failed (attempt 1" in r.getMessage()
    ]
    assert why
    if vendor() == "postgresql":
        assert transport._poller.cuts >= 1
    assert not [r for r in caplog.records if r.name.startswith("realtime") and r.exc_info]


@networked
async def test_an_outage_of_the_poller_logs_one_line_when_lost_and_one_when_back(
    make_table_transport: MakeTransport,
    inbox: Inbox,
    proxy: Proxy,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def while_down(transport: TableTransport) -> None:
        await eventually(lambda: transport._poller.outage.attempts >= 4)

    with caplog.at_level(logging.DEBUG, logger="realtime"):
        await outage_of_the_poller(make_table_transport(), inbox, proxy, while_down)
    assert inbox.payloads("c") == [b"before", b"after"]
    lines = [r.getMessage() for r in realtime_lines(caplog, logging.WARNING)]
    assert len(lines) == 2, lines
    assert "polling firm_channel_messages failed (attempt 1" in lines[0]
    assert "polling firm_channel_messages works again after" in lines[1]
    retries = [r for r in caplog.records if "failed too" in r.getMessage()]
    assert len(retries) >= 3
    assert all(r.levelno == logging.DEBUG for r in retries)
    assert not [r for r in caplog.records if r.name.startswith("realtime") and r.exc_info]


@networked
async def test_a_poller_outage_longer_than_the_bound_is_one_error_then_one_line_when_back(
    make_table_transport: MakeTransport,
    inbox: Inbox,
    proxy: Proxy,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The bound is 60 s in a worker; a fraction of a second here.
    monkeypatch.setattr(table_poller, "ERROR_AFTER", 0.3)

    async def while_down(transport: TableTransport) -> None:
        await eventually(lambda: bool(realtime_lines(caplog, logging.ERROR)))
        # Still failing after the error: no second one.
        attempts = transport._poller.outage.attempts
        await eventually(lambda: transport._poller.outage.attempts >= attempts + 2)

    with caplog.at_level(logging.DEBUG, logger="realtime"):
        await outage_of_the_poller(make_table_transport(), inbox, proxy, while_down)
    assert inbox.payloads("c") == [b"before", b"after"]
    lines = [(r.levelno, r.getMessage()) for r in realtime_lines(caplog, logging.WARNING)]
    assert [level for level, _ in lines] == [logging.WARNING, logging.ERROR, logging.WARNING]
    assert "polling firm_channel_messages failed (attempt 1" in lines[0][1]
    assert "polling firm_channel_messages is still lost" in lines[1][1]
    assert "polling firm_channel_messages works again after" in lines[2][1]


async def test_the_watchdog_restarts_a_poller_thread_that_stopped_and_nothing_is_heard_twice(
    make_table_transport: MakeTransport, inbox: Inbox, caplog: pytest.LogCaptureFixture
) -> None:
    transport = bounded(make_table_transport())
    transport.add_listener(inbox)
    await transport.follow("c")
    await off_loop(transport.publish, [("c", b"before")])
    await inbox.wait_for("c", b"before")
    poller = transport._poller
    thread = poller._thread
    assert thread is not None
    # The thread ends as if it had died, while the transport still wants it.
    poller._generation += 1
    await asyncio.to_thread(thread.join, WAIT)
    assert not thread.is_alive()
    await off_loop(transport.publish, [("c", b"while stopped")])
    with caplog.at_level(logging.WARNING, logger="realtime"):
        transport.watch()
    assert poller.restarts == 1
    assert poller._thread is not thread
    await inbox.wait_for("c", b"while stopped")
    await off_loop(transport.publish, [("c", MARKER)])
    await inbox.wait_for("c", MARKER)
    assert inbox.payloads("c") == [b"before", b"while stopped", MARKER]
    restarted = [r.getMessage() for r in realtime_lines(caplog, logging.ERROR)]
    assert restarted == ["realtime: the table poller is restarted: its thread stopped"]


async def test_one_publish_of_more_rows_than_the_queue_holds_reaches_the_listener_whole(
    make_table_transport: MakeTransport,
) -> None:
    transport = make_table_transport()
    queue = SmallQueue(size=20, per_tick=7)
    transport.add_listener(queue, room=queue.room)
    drain = asyncio.ensure_future(queue.drain())
    try:
        await transport.follow("c")
        sent = [f"{n}".encode() for n in range(150)]
        await off_loop(transport.publish, [("c", payload) for payload in sent])
        await off_loop(transport.publish, [("c", MARKER)])
        await eventually(lambda: MARKER in queue.heard)
    finally:
        drain.cancel()
    assert queue.overflowed == 0
    assert queue.heard == [*sent, MARKER]


@networked
def test_the_longest_bounds_check_lets_pass_open_the_held_connections() -> None:
    """The most ``manage.py check`` lets pass for the poller's and the trims' connections
    (realtime.E007, E008): the driver, the server and the kernel take them all."""
    longest = {
        "REALTIME_HEARTBEAT_TIMEOUT": 2_147_483,
        "REALTIME_TCP_KEEPIDLE": 32_767,
        "REALTIME_TCP_KEEPINTVL": 32_767,
        "REALTIME_TCP_KEEPCNT": 127,
    }
    with override_settings(**longest):
        assert check_settings() == []
        bounds = Bounds.from_settings()
    limit = on_a_thread(lambda: statement_limit(bounded_connection("default", bounds)))
    if vendor() == "postgresql":
        assert limit == "2147483s"
    else:
        assert float(limit) == 2_147_483


@networked
async def test_a_trim_whose_connection_goes_half_open_is_cut_and_the_next_trim_works(
    make_table_transport: MakeTransport, proxy: Proxy, caplog: pytest.LogCaptureFixture
) -> None:
    with default_database_through(proxy), caplog.at_level(logging.DEBUG, logger="realtime"):
        transport = make_table_transport(auto_trim=True, trim_batch_size=1, retention=0)
        transport.trimmer.bounds = SHORT
        async with housekeeping(transport):
            await off_loop(transport.publish, [("c", b"first")])
            await asyncio.to_thread(transport.wait_for_trims, WAIT)  # its connection is open
            proxy.freeze()
            await off_loop(transport.publish, [("c", b"second")])
            await asyncio.to_thread(transport.wait_for_trims, WAIT)  # cut, or timed out
            await off_loop(transport.publish, [("c", b"third")])
            await asyncio.to_thread(transport.wait_for_trims, WAIT)
    lines = [r.getMessage() for r in realtime_lines(caplog, logging.WARNING)]
    assert any("trimming firm_channel_messages failed (attempt 1" in line for line in lines)
    assert any("trimming firm_channel_messages works again" in line for line in lines)
    if vendor() == "postgresql":
        assert transport.trimmer.cuts >= 1
    assert not [r for r in caplog.records if r.name.startswith("realtime") and r.exc_info]


@networked
async def test_a_scope_the_poller_does_not_start_following_in_time_closes_its_sockets_1012(
    make_table_transport: MakeTransport,
    inbox: Inbox,
    proxy: Proxy,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(manager_module, "LISTEN_WAIT", 0.2)
    with default_database_through(proxy), caplog.at_level(logging.WARNING, logger="realtime"):
        transport = bounded(make_table_transport())
        transport.add_listener(inbox)
        async with housekeeping(transport):
            await transport.follow("c")
            manager = SocketManager()
            manager._transport = transport
            # The poller's statement hangs until the watchdog cuts it: a new scope is not
            # anchored within the handshake's wait.
            proxy.freeze()
            socket = make_socket(SimpleNamespace(pk=1), 7)
            assert await manager.register(socket) is False
            async with asyncio.timeout(WAIT):
                await until(lambda: bool(recorder(socket).closes))
            # The poller reads on, and the scope nobody reads any more is not followed.
            await off_loop(transport.publish, [("c", MARKER)])
            await inbox.wait_for("c", MARKER)
    assert recorder(socket).closes == [1012]
    assert 7 not in manager._followed
    assert not transport._poller.follows(scope_channel(7).encode("utf-8"))
    assert any(
        "following scope 7 took over 0.2 s; closed its 1 socket(s) 1012" in r.getMessage()
        for r in realtime_lines(caplog, logging.WARNING)
    )
