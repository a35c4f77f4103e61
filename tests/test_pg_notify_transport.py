"""The pg_notify transport: the shared contract, and what LISTEN/NOTIFY adds (PostgreSQL)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from realtime.transports.pg_notify import PgNotifyTransport, pg_channel
from tests.helpers import WAIT, only_on, start_worker
from tests.transport_contract import TransportContract

pytestmark = [pytest.mark.django_db(transaction=True), only_on("postgresql")]

MakeTransport = Callable[..., PgNotifyTransport]


@pytest.fixture
async def make_pg_transport() -> AsyncIterator[MakeTransport]:
    built: list[PgNotifyTransport] = []

    def make(**options: Any) -> PgNotifyTransport:
        options.setdefault("supervise_interval", 0.2)
        transport = PgNotifyTransport(**options)
        built.append(transport)
        return transport

    yield make
    for transport in built:
        await transport.stop()
        transport.close()


class TestPgNotifyContract(TransportContract):
    @pytest.fixture
    def transport(self, make_pg_transport: MakeTransport) -> PgNotifyTransport:
        return make_pg_transport()

    @pytest.fixture
    def idle_transport(self, make_pg_transport: MakeTransport) -> PgNotifyTransport:
        return make_pg_transport(heartbeat_interval=60.0)

    def publish_from_another_process(self, channel: str, payload: str) -> None:
        worker = start_worker("publish-pg", channel, payload)
        out, _ = worker.communicate(timeout=60)
        assert worker.returncode == 0
        assert out.strip() == "published"


def test_channel_names_over_63_bytes_are_shortened_deterministically() -> None:
    long = "realtime_" + "x" * 100
    assert pg_channel("realtime_7") == "realtime_7"
    assert len(pg_channel(long).encode()) <= 63
    assert pg_channel(long) == pg_channel(long)
    assert pg_channel(long) != pg_channel(long + "y")
    assert len(pg_channel("é" * 40).encode()) <= 63


class Statements:
    """Tells when the listener's LISTEN or UNLISTEN statements start and end (they still run
    on the real connection)."""

    def __init__(self, listener: Any) -> None:
        self.started = {"LISTEN": asyncio.Event(), "UNLISTEN": asyncio.Event()}
        self.ended = {"LISTEN": asyncio.Event(), "UNLISTEN": asyncio.Event()}
        execute = listener._execute

        async def observed(connection: Any, statement: Any) -> Any:
            text = statement if isinstance(statement, str) else statement.as_string(connection)
            command = text.split(" ", 1)[0]
            if command in self.started:
                self.started[command].set()
            try:
                return await execute(connection, statement)
            finally:
                if command in self.ended:
                    self.ended[command].set()

        listener._execute = observed

    def clear(self) -> None:
        for event in [*self.started.values(), *self.ended.values()]:
            event.clear()


async def listening_transport(make: MakeTransport) -> tuple[PgNotifyTransport, Any, Statements]:
    # No probe and no supervision round come in the test's time: a follow the listener's
    # loop missed would wait for one.
    transport = make(heartbeat_interval=600.0, supervise_interval=600.0)
    await transport.start()
    await asyncio.wait_for(transport.follow("warm-up"), WAIT)
    assert transport.listener is not None
    return transport, transport.listener, Statements(transport.listener)


async def test_a_follow_asked_while_another_listen_goes_out_is_not_left_for_the_next_probe(
    make_pg_transport: MakeTransport,
) -> None:
    transport, _, statements = await listening_transport(make_pg_transport)
    first = asyncio.ensure_future(transport.follow("first"))
    await asyncio.wait_for(statements.started["LISTEN"].wait(), WAIT)
    second = asyncio.ensure_future(transport.follow("second"))  # while the first goes out
    await asyncio.wait_for(asyncio.gather(first, second), WAIT)


async def test_a_channel_followed_again_while_its_unlisten_goes_out_is_listened_to(
    make_pg_transport: MakeTransport,
) -> None:
    transport, listener, statements = await listening_transport(make_pg_transport)
    await asyncio.wait_for(transport.follow("again"), WAIT)
    await transport.unfollow("again")
    await asyncio.wait_for(statements.started["UNLISTEN"].wait(), WAIT)
    # Followed again while the UNLISTEN is under way: the follow returns once it is LISTENed.
    await asyncio.wait_for(transport.follow("again"), WAIT)
    await asyncio.wait_for(statements.ended["UNLISTEN"].wait(), WAIT)
    for _ in range(3):  # the listener's loop takes its turn after the statement
        await asyncio.sleep(0)
    assert pg_channel("again") in listener.listening
