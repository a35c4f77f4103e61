"""Sockets that stop reading are closed 1011 while the others keep hearing, promptly.

Every test runs under daphne (whose ``send`` only buffers) and uvicorn (whose ``send`` waits
while the transport's buffer is full), each serving the socket bare and inside Channels'
``AuthMiddlewareStack`` (``each_stack``). A client stops reading by never calling ``recv``
with a one-frame queue and a small receive buffer: the server's output to it piles up. Frames
carry random text, so that permessage-deflate (uvicorn negotiates it) cannot shrink them.
"""

from __future__ import annotations

import asyncio
import base64
import os
import socket
from typing import Any

import pytest
import websockets
from django.contrib.auth import get_user_model

from realtime.auth import issue_token
from realtime.broadcast import broadcast_to_users
from realtime.testing import in_thread
from tests.helpers import WAIT
from tests.live import Client, Clients, LiveServers, Server, each_stack  # noqa: F401

# Large frames: the table transport carries them whole (pg_notify would shrink them).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("each_stack")]

MAX_EVENTS = 1500  # 30 MB of 20,000-character frames at most: past any loopback buffer


def noise(size: int) -> str:
    """``size`` characters of random text (incompressible)."""
    return base64.b64encode(os.urandom(size * 3 // 4 + 3)).decode()[:size]


def accounts(*names: str) -> tuple[list[Any], list[str]]:
    users = [get_user_model().objects.create_user(username=name) for name in names]
    return users, [issue_token(user) for user in users]


async def not_reading(server: Server, token: str, ws: Clients) -> Client:
    """An authenticated client that will never read again: one-frame queue, small window."""
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)  # before connect: sets the window
    raw.connect(("127.0.0.1", server.port))
    client = Client(
        await websockets.connect(
            server.url, sock=raw, max_queue=1, max_size=None, open_timeout=WAIT
        )
    )
    ws.opened.append(client)
    assert (await client.authenticate(token))["type"] == "auth_success"
    return client


def held(state: dict[str, Any], user_ids: list[Any]) -> list[Any]:
    return [s["user_id"] for s in state["sockets"] if s["user_id"] in user_ids]


async def close_code_once_dropped(
    server: Server, client: Client, user_id: Any, dropped: asyncio.Event
) -> int | None:
    """As soon as the server has let go of ``client``, set ``dropped`` and read again: what
    was sent before the close, then the close (the server gives a closing peer the send
    timeout to answer, from the moment it lets go)."""
    await server.wait_for_state(lambda state: not held(state, [user_id]), timeout=120)
    dropped.set()
    return await client.closed_with(timeout=30)


async def test_a_socket_that_stops_reading_is_closed_1011_while_others_hear_everything(
    live_servers: LiveServers, ws: Clients
) -> None:
    # The default send timeout: the dropped client, on a busy machine, reads its backlog and
    # the close within it.
    server = live_servers.get("slow-socket-default")
    (slow_user, fast_user), (slow_token, fast_token) = await in_thread(accounts, "slow", "fast")
    slow = await not_reading(server, slow_token, ws)
    fast = await ws.authenticated(server, fast_token)

    dropped = asyncio.Event()
    closing = asyncio.ensure_future(close_code_once_dropped(server, slow, slow_user.pk, dropped))
    # Events keep coming, and the reading socket hears each one, until the server notices
    # the other one stopped reading.
    sent = 0
    while not dropped.is_set() and sent < MAX_EVENTS:
        await in_thread(
            broadcast_to_users, [slow_user.pk, fast_user.pk], "big", {"n": sent, "b": noise(20_000)}
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


async def test_stalled_sockets_hold_no_other_socket_back(
    live_servers: LiveServers, ws: Clients
) -> None:
    # Four sockets stop reading; one reads. Closing the stalled ones (each may take up to the
    # send timeout) happens beside delivery, and no stalled send holds the reader's next
    # frame: the reader hears every event within one send timeout, where closing them in
    # turn on the delivery path would hold an event for four or more.
    timeout = 3.0
    server = live_servers.get("stalls", REALTIME_SEND_TIMEOUT=timeout)
    users, tokens = await in_thread(accounts, "s1", "s2", "s3", "s4", "reader")
    stalled_ids = [user.pk for user in users[:4]]
    stalled = [await not_reading(server, token, ws) for token in tokens[:4]]
    reader = await ws.authenticated(server, tokens[4])
    everyone = [user.pk for user in users]

    drops = [asyncio.Event() for _ in stalled]
    closing = asyncio.gather(
        *(
            close_code_once_dropped(server, client, user_id, dropped)
            for client, user_id, dropped in zip(stalled, stalled_ids, drops, strict=True)
        )
    )
    sent = 0
    try:
        while not all(dropped.is_set() for dropped in drops) and sent < MAX_EVENTS:
            await in_thread(broadcast_to_users, everyone, "big", {"n": sent, "b": noise(64_000)})
            frame = await reader.wait_for(lambda f: f["type"] == "big", timeout=timeout)
            assert frame["data"]["n"] == sent
            sent += 1
        # And after the drops, consecutive events still reach the reader each in time.
        for n in range(sent, sent + 3):
            await in_thread(broadcast_to_users, everyone, "big", {"n": n, "b": "small"})
            frame = await reader.wait_for(lambda f: f["type"] == "big", timeout=timeout)
            assert frame["data"]["n"] == n
        assert await closing == [1011] * 4
    finally:
        closing.cancel()


async def test_a_reading_socket_receiving_large_frames_is_not_dropped(
    live_servers: LiveServers, ws: Clients
) -> None:
    server = live_servers.get("slow-socket", REALTIME_SEND_TIMEOUT=2.0)
    (user,), (token,) = await in_thread(accounts, "reader")
    client = await ws.authenticated(server, token)
    for n in range(3):
        await in_thread(broadcast_to_users, [user.pk], "big", {"n": n, "b": noise(20_000)})
    heard = [await client.wait_for(lambda f: f["type"] == "big") for _ in range(3)]
    assert [f["data"]["n"] for f in heard] == [0, 1, 2]


async def test_a_reader_of_frames_larger_than_the_stall_bound_is_never_dropped(
    live_servers: LiveServers, ws: Clients
) -> None:
    # Each frame alone is over the 256 KiB a backlog may hold, and they come a little more
    # often than the send timeout of this server. The client reads each one at once: between
    # two frames its backlog is empty, however rarely the server happens to look at it.
    server = live_servers.get("short-send-timeout", REALTIME_SEND_TIMEOUT=0.5)
    (user,), (token,) = await in_thread(accounts, "reader")
    client = await ws.authenticated(server, token)
    for n in range(8):
        await in_thread(broadcast_to_users, [user.pk], "huge", {"n": n, "b": noise(300_000)})
        frame = await client.wait_for(lambda f: f["type"] == "huge")
        assert frame["data"]["n"] == n
        await asyncio.sleep(0.6)  # paces the frames; absence is proven by the marker below
    await in_thread(broadcast_to_users, [user.pk], "test.marker", None)
    assert await client.frames_until("test.marker") == []
    state = await asyncio.to_thread(server.state)
    assert held(state, [user.pk]) == [user.pk]
