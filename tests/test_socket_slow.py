"""Sockets that stop reading are closed 1011 while the others keep hearing, promptly.

Every test runs under daphne (whose ``send`` only buffers) and uvicorn (whose ``send`` waits
while the transport's buffer is full), each serving the socket bare and inside Channels'
``AuthMiddlewareStack`` (``each_stack``). A client stops reading by never calling ``recv``
with a one-frame queue and a small receive buffer: the server's output to it piles up. Large
frames carry random text, so that permessage-deflate (uvicorn negotiates it) cannot shrink
them; a stream of thousands of small ones piles up in the kernel's send queue instead.

These are the ``stall`` tests: ``REALTIME_SLOW_REPEAT`` runs each that many times, and
``REALTIME_CPU_LOAD`` keeps that many cores busy meanwhile (``tests/conftest.py``; the long run
of docs/contributing.md).
"""

from __future__ import annotations

import asyncio
import base64
import os
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction

from realtime.auth import issue_token
from realtime.broadcast import broadcast_to_scope, broadcast_to_users
from realtime.testing import in_thread
from tests.live import Client, Clients, LiveServers, Server, each_stack  # noqa: F401
from tests.testapp.models import Membership, Workspace

# Large frames: the table transport carries them whole (pg_notify would shrink them).
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("each_stack"),
    pytest.mark.stall,
]

MAX_EVENTS = 1500  # 30 MB of 20,000-character frames at most: past any loopback buffer
#: Small frames published to a scope in one stream, 200 a transaction: about 1.2 MB in all
#: (random text: compression cannot shrink it under the bound), which a loopback
#: connection's kernel send queue (up to 4 MiB) takes whole.
STREAM = 8000
STREAM_BATCH = 200


def noise(size: int) -> str:
    """``size`` characters of random text (incompressible)."""
    return base64.b64encode(os.urandom(size * 3 // 4 + 3)).decode()[:size]


def accounts(*names: str) -> tuple[list[Any], list[str]]:
    users = [get_user_model().objects.create_user(username=name) for name in names]
    return users, [issue_token(user) for user in users]


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
    slow = await ws.not_reading(server, slow_token)
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
    stalled = [await ws.not_reading(server, token) for token in tokens[:4]]
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


def members(count: int) -> tuple[Any, list[Any], list[str]]:
    workspace = Workspace.objects.create(name="Acme", slug="acme")
    users, tokens = accounts(*(f"member-{n}" for n in range(count)))
    for user in users:
        Membership.objects.create(workspace=workspace, user=user)
    return workspace, users, tokens


def publish_stream(scope_id: Any, start: int) -> None:
    """Publish ticks ``start`` to ``start + STREAM_BATCH``, each a small frame, in one
    transaction."""
    with transaction.atomic():
        for n in range(start, start + STREAM_BATCH):
            broadcast_to_scope(scope_id, "tick", {"n": n, "b": noise(100)})


async def ticks_heard(client: Client, last: int) -> list[int]:
    """Read ``client``'s ticks up to ``last`` (bounded); their numbers, in the order heard."""
    heard: list[int] = []
    while not heard or heard[-1] < last:
        frame = await client.wait_for(lambda f: f["type"] == "tick", timeout=60)
        heard.append(frame["data"]["n"])
    return heard


async def test_a_socket_that_stops_reading_amid_thousands_of_small_frames_is_closed_1011(
    live_servers: LiveServers, ws: Clients
) -> None:
    # One socket of a scope stops reading while two others read a stream of 8,000 small
    # frames. None of it reaches the server's own buffer for long (the kernel's send queue
    # takes all of it), yet the stalled socket is closed 1011 and the readers hear every
    # frame, in order.
    server = live_servers.get("slow-socket-default")
    workspace, users, tokens = await in_thread(members, 3)
    stalled = await ws.not_reading(server, tokens[0], scope="acme")
    readers = [await ws.authenticated(server, token, scope="acme") for token in tokens[1:]]

    hearing = asyncio.gather(*(ticks_heard(reader, STREAM - 1) for reader in readers))
    # The stalled client reads again as soon as the server lets go of it (the close is given
    # the send timeout from then), not once the readers are done: on a busy machine they may
    # take longer than that.
    closing = asyncio.ensure_future(
        close_code_once_dropped(server, stalled, users[0].pk, asyncio.Event())
    )
    try:
        for start in range(0, STREAM, STREAM_BATCH):
            await in_thread(publish_stream, workspace.pk, start)
        assert await hearing == [list(range(STREAM))] * len(readers)
        assert await closing == 1011
    finally:
        hearing.cancel()
        closing.cancel()

    await in_thread(broadcast_to_scope, workspace.pk, "late", None)
    for reader in readers:
        assert [f["type"] for f in await reader.frames_until("late")] == []
    # What the stalled socket got before its close, it got in order.
    ticks = [f["data"]["n"] for f in stalled.received if f["type"] == "tick"]
    assert ticks == list(range(len(ticks)))
