"""Limits at the edge: WebSocket pings, and unauthenticated sockets per client address.

Pings are control frames the server answers itself (daphne's autobahn, uvicorn's websockets):
they never reach the application, so they count toward no frame limit — a Flutter client
pinging every 30 s, or far faster, is never closed for it — while the protocol's own
``heartbeat`` frames do count. ``REALTIME_MAX_UNAUTHENTICATED_PER_ADDRESS`` caps the sockets
one address holds before they authenticate; over it, the handshake is refused with HTTP 403.
Real servers, real clients.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import websockets
from django.contrib.auth import get_user_model

from realtime.auth import issue_token
from realtime.broadcast import broadcast_to_users
from realtime.testing import in_thread
from tests.live import Client, Clients, LiveServers, Server

pytestmark = pytest.mark.django_db(transaction=True)

SERVERS = [
    pytest.param("daphne", id="daphne"),
    pytest.param("uvicorn", id="uvicorn"),
]


@pytest.fixture(params=SERVERS)
def server_kind(request: pytest.FixtureRequest, live_servers: LiveServers) -> Iterator[str]:
    live_servers.kind = request.param
    yield request.param
    live_servers.kind = "daphne"


def make_account() -> tuple[int, str]:
    user = get_user_model().objects.create_user(username="flutter")
    return user.pk, issue_token(user)


@pytest.mark.usefixtures("server_kind")
async def test_websocket_pings_never_count_toward_the_frame_limit(
    live_servers: LiveServers, ws: Clients
) -> None:
    user_id, token = await in_thread(make_account)
    server = live_servers.get("frame-limit-5", REALTIME_FRAME_LIMIT=5)
    client = await ws.authenticated(server, token)
    for _ in range(20):  # four times the limit, within one window
        pong = await client.connection.ping()
        await asyncio.wait_for(pong, 10)
    await in_thread(broadcast_to_users, [user_id], "test.marker", None)
    assert await client.frames_until("test.marker") == []
    # The limit itself is live: heartbeats are frames of the protocol, and they count.
    for _ in range(6):
        await client.send("heartbeat")
    assert await client.closed_with() == 1008


@pytest.mark.usefixtures("server_kind")
async def test_unauthenticated_sockets_over_the_address_cap_are_refused_before_opening(
    live_servers: LiveServers, ws: Clients
) -> None:
    _, token = await in_thread(make_account)
    server = live_servers.get("address-cap-2", REALTIME_MAX_UNAUTHENTICATED_PER_ADDRESS=2)
    first = await ws.connect(server)
    second = await ws.connect(server)
    with pytest.raises(websockets.InvalidStatus) as refused:
        await ws.connect(server)
    assert refused.value.response.status_code == 403
    # An authenticated socket no longer counts; neither does one that left.
    assert (await first.authenticate(token))["type"] == "auth_success"
    third = await ws.connect(server)
    await second.close()
    fourth = await connect_soon(ws, server)
    for client in (third, fourth):
        assert (await client.authenticate(token))["type"] == "auth_success"


async def connect_soon(ws: Clients, server: Server) -> Client:
    """Connect, retrying while the server still counts a socket that just left (bounded)."""
    async with asyncio.timeout(10):
        while True:
            try:
                return await ws.connect(server)
            except websockets.InvalidStatus:
                await asyncio.sleep(0.05)


async def test_without_the_setting_unauthenticated_sockets_are_not_capped(
    live_servers: LiveServers, ws: Clients
) -> None:
    _, token = await in_thread(make_account)
    server = live_servers.get()
    clients = [await ws.connect(server) for _ in range(6)]
    for client in clients:
        assert (await client.authenticate(token))["type"] == "auth_success"
