"""A socket that stops reading is closed 1011 while the others keep hearing, under daphne."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import websockets
from django.contrib.auth import get_user_model

from realtime.auth import issue_token
from realtime.broadcast import broadcast_to_users
from realtime.testing import in_thread
from tests.helpers import WAIT
from tests.live import Client, Clients, LiveServers

# Large frames: the table transport carries them whole (pg_notify would shrink them).
pytestmark = pytest.mark.django_db(transaction=True)

BIG = "x" * 20_000
MAX_EVENTS = 1500  # 30 MB at most: far past what any loopback buffer holds


@pytest.fixture
async def ws() -> AsyncIterator[Clients]:
    pool = Clients()
    yield pool
    await pool.close_all()


def accounts() -> tuple[list[Any], list[str]]:
    users = [get_user_model().objects.create_user(username=name) for name in ("slow", "fast")]
    return users, [issue_token(user) for user in users]


async def test_a_socket_that_stops_reading_is_closed_1011_while_others_hear_everything(
    live_servers: LiveServers, ws: Clients
) -> None:
    server = live_servers.get("slow-socket", REALTIME_SEND_TIMEOUT=2.0)
    (slow_user, fast_user), (slow_token, fast_token) = await in_thread(accounts)
    # A small receive buffer and a one-frame queue: once it stops reading, the server's
    # output to it piles up in daphne's buffer instead of the kernel's.
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)  # before connect: sets the window
    raw.connect(("127.0.0.1", server.port))
    slow = Client(
        await websockets.connect(
            server.url, sock=raw, max_queue=1, max_size=None, open_timeout=WAIT
        )
    )
    ws.opened.append(slow)
    assert (await slow.authenticate(slow_token))["type"] == "auth_success"
    fast = await ws.authenticated(server, fast_token)

    dropped = asyncio.Event()

    async def slow_side() -> int | None:
        # As soon as the server has let go of it, read again: what was sent before the
        # close, then the close (autobahn gives a closing peer a second to answer).
        await server.wait_for_state(
            lambda state: slow_user.pk not in [s["user_id"] for s in state["sockets"]],
            timeout=60,
        )
        dropped.set()
        return await slow.closed_with(timeout=30)

    closing = asyncio.ensure_future(slow_side())
    # Events keep coming, and the reading socket hears each one, until the server notices
    # the other one stopped reading.
    sent = 0
    while not dropped.is_set() and sent < MAX_EVENTS:
        await in_thread(
            broadcast_to_users, [slow_user.pk, fast_user.pk], "big", {"n": sent, "b": BIG}
        )
        frame = await fast.wait_for(lambda f: f["type"] == "big", timeout=30)
        assert frame["data"]["n"] == sent
        sent += 1
    # It was dropped from deliveries and closed with 1011, and only it.
    assert await closing == 1011
    await in_thread(broadcast_to_users, [slow_user.pk, fast_user.pk], "late", None)
    await fast.wait_for(lambda f: f["type"] == "late")
    assert [f["type"] for f in slow.received if f["type"] != "big"] == ["auth_success"]
    assert len([f for f in slow.received if f["type"] == "big"]) <= sent


async def test_a_reading_socket_receiving_large_frames_is_not_dropped(
    live_servers: LiveServers, ws: Clients
) -> None:
    server = live_servers.get("slow-socket", REALTIME_SEND_TIMEOUT=2.0)
    (user, _), (token, _) = await in_thread(accounts)
    client = await ws.authenticated(server, token)
    for n in range(3):
        await in_thread(broadcast_to_users, [user.pk], "big", {"n": n, "b": BIG})
    heard = [await client.wait_for(lambda f: f["type"] == "big") for _ in range(3)]
    assert [f["data"]["n"] for f in heard] == [0, 1, 2]
