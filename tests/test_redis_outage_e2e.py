"""Redis going away under a real daphne worker while writes flow: opted-in sockets hear every
event once, in order.

The worker reaches Redis through ``Proxy``; this process publishes to Redis directly. The
worker's connections are cut (and refused), then frozen (half-open: silent, while new ones
flow). An outage shorter than the stall bound only delays frames (the worker reads what its
streams got meanwhile); a longer one closes the sockets 1012, and they come back with the
cursor of the last frame they handled (a handshake while the worker cannot reach Redis is
closed 1012 too, and comes back). Either way each socket's life, put end to end, is every
event once and in order — never a gap, never a repeat. A marker published after the
last write ends each socket's reading.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import websockets
from django.contrib.auth import get_user_model
from django.db import transaction

from realtime.auth import issue_token
from realtime.broadcast import broadcast_to_scope
from tests.helpers import WAIT, off_loop
from tests.live import Clients, LiveServers, Server
from tests.proxy import Proxy
from tests.redis_server import RedisServer
from tests.test_resume_e2e import resuming
from tests.testapp.models import Membership, Workspace

pytestmark = pytest.mark.django_db(transaction=True)

MARKER = "test.marker"
TICK = "test.tick"
#: Heartbeats and reconnections quick enough for a test.
QUICK = {
    "REALTIME_HEARTBEAT_INTERVAL": 0.5,
    "REALTIME_HEARTBEAT_TIMEOUT": 0.5,
    "REALTIME_RECONNECT_BACKOFF_START": 0.05,
    "REALTIME_RECONNECT_BACKOFF_MAX": 0.2,
}


@pytest.fixture
async def redis_proxy(sockets_redis: RedisServer) -> AsyncIterator[Proxy]:
    relay = Proxy("127.0.0.1", sockets_redis.port)
    await relay.open()
    yield relay
    await relay.close()


def members(count: int) -> tuple[Workspace, list[str]]:
    workspace = Workspace.objects.create(name="Acme", slug="acme")
    tokens = []
    for number in range(count):
        user = get_user_model().objects.create_user(username=f"member{number}")
        Membership.objects.create(workspace=workspace, user=user)
        tokens.append(issue_token(user))
    return workspace, tokens


def tick(workspace_id: int, number: int) -> None:
    with transaction.atomic():
        broadcast_to_scope(workspace_id, TICK, {"n": number})


class Reader:
    """An opted-in socket that reads until the marker, coming back with its last cursor each
    time it is closed."""

    def __init__(self, ws: Clients, server: Server, token: str) -> None:
        self.ws, self.server, self.token = ws, server, token
        self.numbers: list[int] = []
        self.lives = 0
        #: Handshakes closed before auth_success, and their close codes.
        self.refused = 0
        self.closed_codes: list[int | None] = []
        self.cursor: Any = None

    async def read_until_marker(self) -> None:
        while True:
            try:
                client, answer = await resuming(
                    self.ws, self.server, self.token, self.cursor, scope="acme"
                )
            except websockets.ConnectionClosed as closed:
                # Closed in its handshake: the worker could not hear Redis or read its
                # streams yet. A client comes back a little later, with the same cursor.
                self.closed_codes.append(closed.rcvd.code if closed.rcvd else None)
                self.refused += 1
                assert self.refused < 100, "the worker never took the socket back"
                await asyncio.sleep(0.1)
                continue
            self.lives += 1
            if self.cursor is not None:
                assert answer["data"]["resumed"] is True, answer
            with contextlib.suppress(websockets.ConnectionClosed):
                while True:
                    frame = await client.next_frame(timeout=3 * WAIT)
                    self.cursor = frame.get("cursor", self.cursor)
                    if frame["type"] == MARKER:
                        return
                    if frame["type"] == TICK:
                        self.numbers.append(frame["data"]["n"])
            assert client.connection.close_code == 1012, client.connection.close_code


async def test_a_cut_and_a_half_open_connection_to_redis_lose_and_repeat_nothing(
    live_servers: LiveServers,
    ws: Clients,
    settings: Any,
    sockets_redis: RedisServer,
    redis_proxy: Proxy,
) -> None:
    settings.REALTIME_TRANSPORT = "redis"
    settings.REALTIME_REDIS_URL = sockets_redis.url
    server = live_servers.get(
        "redis-through-proxy",
        REALTIME_TRANSPORT="redis",
        REALTIME_REDIS_URL=f"redis://127.0.0.1:{redis_proxy.port}/0",
        **QUICK,
    )
    workspace, tokens = await off_loop(members, 2)
    readers = [Reader(ws, server, token) for token in tokens]
    # Each opens its first socket before anything is written: it must hear all of it.
    first = [await resuming(ws, server, token, scope="acme") for token in tokens]
    for reader, (_, answer) in zip(readers, first, strict=True):
        reader.cursor = answer["data"]["cursor"]
    for client, _ in first:
        await client.close()
    written = 0

    async def write(count: int) -> None:
        nonlocal written
        for _ in range(count):
            await off_loop(tick, workspace.pk, written)
            written += 1

    reading = [asyncio.ensure_future(reader.read_until_marker()) for reader in readers]
    await write(10)
    connected = redis_proxy.accepted
    await redis_proxy.close()  # cut, and refused
    await write(10)
    await redis_proxy.open()
    await write(10)
    redis_proxy.freeze()  # the open connections go silent; new ones flow
    await write(10)
    await write(10)
    await off_loop(broadcast_to_scope, workspace.pk, MARKER, {})
    for done in reading:
        await done
    for reader in readers:
        assert reader.numbers == list(range(written))
        assert set(reader.closed_codes) <= {1012}, reader.closed_codes
    assert written == 50
    # The worker came back after the cut, and again after the freeze.
    assert redis_proxy.accepted >= connected + 2
