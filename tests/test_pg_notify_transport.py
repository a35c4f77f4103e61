"""The pg_notify transport: the shared contract, and what LISTEN/NOTIFY adds (PostgreSQL)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from realtime.transports.pg_notify import PgNotifyTransport, pg_channel
from tests.helpers import only_on, start_worker
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
