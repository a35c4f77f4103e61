"""Fixtures shared by the whole suite: transports that clean up after themselves."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from realtime.transports.table import TableTransport
from tests.helpers import Inbox


@pytest.fixture
async def make_table_transport() -> AsyncIterator[Callable[..., TableTransport]]:
    """Build table transports with fast test timings; stop and close them afterwards."""
    built: list[TableTransport] = []

    def make(**options: Any) -> TableTransport:
        options.setdefault("polling_interval", 0.02)
        options.setdefault("auto_trim", False)
        transport = TableTransport(**options)
        built.append(transport)
        return transport

    yield make
    for transport in built:
        await transport.stop()
        transport.close()


@pytest.fixture
def inbox() -> Inbox:
    return Inbox()
