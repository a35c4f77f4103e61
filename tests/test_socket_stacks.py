"""The socket behind the stacks real projects serve: daphne or uvicorn, bare or wrapped.

One event reaches every subscribed socket of a workspace, exactly once, under each server and
stack (``each_stack``). Behind a middleware whose ``send`` realtime does not look inside
(``tests.asgi.opaque``: a closure), sockets are still served, one ERROR line says once what is
lost and what cures it, and the metrics count each such socket. Inside
``SocketOriginValidator``, outermost (``tests.asgi.guarded``), the same middleware loses
nothing: refusals close with the protocol's codes and a socket that stops reading is closed
1011 while another hears everything. A worker reports its server's self-test when it starts,
before any socket. A stopping worker closes its sockets 1012 and ends, though a client that
stopped reading holds a backlog; a socket the worker closes during its handshake is sent
nothing after its close. Absence is proven after a marker frame came back.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import subprocess
from typing import Any

import pytest
import websockets
from django.contrib.auth import get_user_model
from django.db import transaction

from realtime.auth import issue_token
from realtime.broadcast import broadcast_to_user, broadcast_to_users
from realtime.messages import scope_channel
from realtime.sockets.manager import get_manager
from tests.helpers import WAIT, off_loop
from tests.live import (  # noqa: F401
    FAST,
    Client,
    Clients,
    LiveServers,
    Server,
    each_server,
    each_stack,
    start_server,
)
from tests.testapp.models import Company, Membership, Workspace

pytestmark = pytest.mark.django_db(transaction=True)

#: Sockets one event fans out to.
FAN_OUT = 30
#: What a worker logs once when a socket's ``send`` is one realtime does not look inside.
NOT_LOOKED_INSIDE = "slow-socket protection"
CURE = "Wrap the socket route in realtime.origins.SocketOriginValidator, outermost"
#: Events sent at most to fill a socket that stopped reading: 30 MB of 20,000-character frames.
MAX_EVENTS = 1500
#: Frames of 500,000 characters that fill a connection past the kernel's send queue (up to
#: 4 MiB on loopback), the client's buffers and the server's high-water mark (8 MB).
BACKLOG = 16
#: The send timeout of the server stopped with such a backlog.
STOP_SEND_TIMEOUT = 3.0


def members(count: int) -> tuple[Workspace, list[Any], list[str]]:
    workspace = Workspace.objects.create(name="Acme", slug="acme")
    users = []
    for n in range(count):
        user = get_user_model().objects.create_user(username=f"member-{n}")
        Membership.objects.create(workspace=workspace, user=user)
        users.append(user)
    return workspace, users, [issue_token(user) for user in users]


async def marker_for(client: Client, user_id: Any) -> list[dict[str, Any]]:
    await off_loop(broadcast_to_user, user_id, "test.marker", None)
    return await client.frames_until("test.marker")


def noise(size: int) -> str:
    """``size`` characters of random text (incompressible)."""
    return base64.b64encode(os.urandom(size * 3 // 4 + 3)).decode()[:size]


def sample(server: Server, name: str, **labels: str) -> float:
    """The sum of a server's samples of ``name`` whose labels include ``labels``."""
    return sum(
        value
        for (found, found_labels), value in server.metrics().items()
        if found == name and set(labels.items()) <= set(found_labels)
    )


def unprotected_lines(server: Server) -> list[str]:
    return [line for line in server.log_text().splitlines() if NOT_LOOKED_INSIDE in line]


@pytest.mark.usefixtures("each_stack")
async def test_one_event_reaches_every_subscribed_socket_once(
    live_servers: LiveServers, ws: Clients
) -> None:
    server = live_servers.get()
    workspace, users, tokens = await off_loop(members, FAN_OUT)
    clients = [await ws.authenticated(server, token, scope="acme") for token in tokens]
    for client in clients:
        await client.send("subscribe", {"channels": ["company"]})
    # Each subscription is in place once the socket's marker is back.
    for client, user in zip(clients, users, strict=True):
        assert await marker_for(client, user.pk) == []

    company = await off_loop(Company.objects.create, workspace=workspace, name="Fan")

    heard = await asyncio.gather(*(c.wait_for(lambda f: f["type"] != "") for c in clients))
    assert {(f["type"], f["data"]["id"], f["scope_id"]) for f in heard} == {
        ("company.created", company.pk, workspace.pk)
    }
    for client, user in zip(clients, users, strict=True):
        assert await marker_for(client, user.pk) == []


@pytest.mark.usefixtures("each_server")
async def test_a_send_realtime_does_not_look_inside_is_reported_once_and_still_served(
    live_servers: LiveServers, ws: Clients
) -> None:
    kind = live_servers.kind
    live_servers.stack = "opaque"
    server = live_servers.get("unknown-send")
    _, users, tokens = await off_loop(members, 2)
    clients = [await ws.authenticated(server, token, scope="acme") for token in tokens]
    for client, user in zip(clients, users, strict=True):
        assert await marker_for(client, user.pk) == []
    # A refusal still says why. Under daphne the close code is the one its relay lets
    # through untold; uvicorn's send takes any code.
    refused = await ws.connect(server)
    await refused.authenticate("garbage")
    assert await refused.closed_with() == (1000 if kind == "daphne" else 1008)
    assert refused.received == [
        {"type": "auth_error", "data": {"message": "Invalid authentication token"}}
    ]

    (line,) = await asyncio.to_thread(unprotected_lines, server)
    assert "PassThrough.__call__.<locals>.send_through" in line
    assert CURE in line
    assert ("close codes" in line) == (kind == "daphne")
    assert "Exception inside application" not in server.log_text()
    metrics = await asyncio.to_thread(sample, server, "realtime_unprotected_sockets_total")
    assert metrics == 3  # each socket served so, the refused one too
    # The server's own seam is fine: only what is wrapped around its send is unknown.
    assert (
        await asyncio.to_thread(sample, server, "realtime_slow_socket_protection", library=kind)
        == 1
    )


@pytest.mark.stall
@pytest.mark.usefixtures("each_server")
async def test_the_validator_outermost_keeps_protection_through_any_middleware(
    live_servers: LiveServers, ws: Clients
) -> None:
    live_servers.stack = "guarded"
    server = live_servers.get("guarded")
    users, tokens = await off_loop(accounts, "slow", "fast", "refused")
    refused = await ws.connect(server)
    await refused.authenticate("garbage")
    assert await refused.closed_with() == 1008

    slow = await ws.not_reading(server, tokens[0])
    fast = await ws.authenticated(server, tokens[1])
    dropped = asyncio.Event()
    closing = asyncio.ensure_future(close_code_once_dropped(server, slow, users[0].pk, dropped))
    sent = 0
    try:
        while not dropped.is_set() and sent < MAX_EVENTS:
            await off_loop(
                broadcast_to_users, [users[0].pk, users[1].pk], "big", {"b": noise(20_000)}
            )
            await fast.wait_for(lambda f: f["type"] == "big", timeout=30)
            sent += 1
        assert await closing == 1011
    finally:
        closing.cancel()

    assert await marker_for(fast, users[1].pk) == []
    assert await asyncio.to_thread(unprotected_lines, server) == []
    assert await asyncio.to_thread(sample, server, "realtime_unprotected_sockets_total") == 0


@pytest.mark.usefixtures("each_server")
async def test_a_refused_origin_is_one_warning_naming_it_and_the_settings_that_admit_it(
    live_servers: LiveServers, ws: Clients
) -> None:
    live_servers.stack = "guarded"
    server = live_servers.get("guarded")
    origin = f"https://elsewhere-{os.getpid()}.example:8443"
    with pytest.raises(websockets.InvalidStatus) as refused:
        await ws.connect(server, origin=origin)
    assert refused.value.response.status_code == 403
    no_origin = await ws.connect(server)  # a phone's socket: no Origin, admitted
    await no_origin.authenticate("garbage")  # its refusal is logged after the 403's line
    assert await no_origin.closed_with() == 1008

    log = await asyncio.to_thread(server.log_text)
    lines = [line for line in log.splitlines() if "refused a socket handshake" in line]
    assert len(lines) == 1, log
    assert lines[0].endswith(
        f"realtime: refused a socket handshake (HTTP 403): origin '{origin}' is not admitted: "
        f"add 'elsewhere-{os.getpid()}.example' to ALLOWED_HOSTS, or '{origin}' to "
        "REALTIME_ALLOWED_ORIGINS"
    ), lines[0]


@pytest.mark.usefixtures("each_server")
async def test_a_stopping_server_closes_its_sockets_1012(
    live_servers: LiveServers, ws: Clients
) -> None:
    server = await asyncio.to_thread(start_server, {}, live_servers.kind)  # this test's alone
    try:
        _, tokens = await off_loop(accounts, "staying")
        client = await ws.authenticated(server, tokens[0])
        await asyncio.to_thread(server.process.terminate)  # SIGTERM, as systemd stops a unit
        assert await client.closed_with() == 1012
    finally:
        await asyncio.to_thread(server.stop)


@pytest.mark.usefixtures("each_server")
async def test_a_stopping_server_ends_while_a_client_that_stopped_reading_holds_a_backlog(
    live_servers: LiveServers, ws: Clients
) -> None:
    # uvicorn closes each socket 1012 as it stops, and waits for its connections to close:
    # the stalled one's close frame waits behind a backlog the client never takes, and the
    # connection is cut REALTIME_SEND_TIMEOUT after its application ended.
    settings = {**FAST, "REALTIME_SEND_TIMEOUT": STOP_SEND_TIMEOUT}
    # Not compressed: deflating megabytes for each socket takes seconds on a loaded machine,
    # and the stall watch's clock runs from the backlog's first frames.
    args = ("--ws-per-message-deflate", "false") if live_servers.kind == "uvicorn" else ()
    server = await asyncio.to_thread(start_server, settings, live_servers.kind, args=args)
    try:
        (stalled_user, reading_user), tokens = await off_loop(accounts, "stalled", "reading")
        reading = await ws.authenticated(server, tokens[1])
        stalled = await ws.not_reading(server, tokens[0])
        await off_loop(backlog_for, [stalled_user.pk, reading_user.pk])
        await reading.wait_for(lambda f: f["type"] == "big" and f["data"]["n"] == BACKLOG - 1)
        # Still served: the stop, not the stall watch, is what closes it.
        state = await asyncio.to_thread(server.state)
        assert stalled_user.pk in [s["user_id"] for s in state["sockets"]]
        await asyncio.to_thread(server.process.terminate)
        assert await reading.closed_with() == 1012
        try:
            await asyncio.to_thread(server.process.wait, STOP_SEND_TIMEOUT + WAIT)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the server did not end: {server.log_text()[-2000:]}") from None
        stalled.drop()
    finally:
        await asyncio.to_thread(server.stop)


def backlog_for(user_ids: list[Any]) -> None:
    """``BACKLOG`` large frames to these accounts, in one transaction: sent within a moment,
    well within the send timeout that would drop a socket not reading them."""
    with transaction.atomic():
        for n in range(BACKLOG):
            broadcast_to_users(user_ids, "big", {"n": n, "b": noise(500_000)})


async def test_a_consumer_its_server_cancels_closes_its_socket_1012() -> None:
    """The other way a stopping server ends its applications (daphne when its own shutdown
    trigger works): cancelling them."""
    from channels.testing import WebsocketCommunicator

    from realtime.consumers import RealtimeConsumer

    communicator = WebsocketCommunicator(RealtimeConsumer.as_asgi(), "/api/ws")
    connected, _ = await communicator.connect()
    assert connected
    communicator.future.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(communicator.future, 10)
    assert communicator.output_queue.get_nowait() == {"type": "websocket.close", "code": 1012}


async def test_a_socket_the_manager_closes_during_its_handshake_is_told_nothing_after_the_close(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Messages its scope may have missed (``on_missed``) close every socket reading it 1012,
    one still waiting for that scope's follow in its handshake too: its ``auth_success``,
    after the close, would be refused by the server (uvicorn raises)."""
    from channels.testing import WebsocketCommunicator

    from realtime.consumers import RealtimeConsumer

    _, _, (token,) = await off_loop(members, 1)
    manager = get_manager()
    await manager.ensure_listening()
    transport = manager.transport()
    follow, following, followed = transport.follow, asyncio.Event(), asyncio.Event()

    async def held_follow(channel: str) -> Any:
        """The scope's follow, completing once the test says so."""
        following.set()
        await followed.wait()
        return await follow(channel)

    monkeypatch.setattr(transport, "follow", held_follow)
    communicator = WebsocketCommunicator(RealtimeConsumer.as_asgi(), "/api/ws")
    connected, _ = await communicator.connect()
    assert connected
    ask = {"token": token, "scope": "acme"}
    await communicator.send_json_to({"type": "authenticate", "data": ask})
    async with asyncio.timeout(WAIT):
        await following.wait()
    (socket,) = manager.index.sockets
    manager.on_missed(frozenset({scope_channel(next(iter(socket.scopes)))}))
    assert await communicator.receive_output(WAIT) == {"type": "websocket.close", "code": 1012}
    followed.set()
    # The client answers the close; the consumer has ended by then, or ends on it.
    await communicator.send_input({"type": "websocket.disconnect", "code": 1012})
    async with asyncio.timeout(WAIT):
        await communicator.wait()
    sent = []
    while not communicator.output_queue.empty():
        sent.append(communicator.output_queue.get_nowait())
    assert sent == []


def accounts(*names: str) -> tuple[list[Any], list[str]]:
    users = [get_user_model().objects.create_user(username=name) for name in names]
    return users, [issue_token(user) for user in users]


async def close_code_once_dropped(
    server: Server, client: Client, user_id: Any, dropped: asyncio.Event
) -> int | None:
    """As soon as the server has let go of ``client``, set ``dropped`` and read again: what
    was sent before the close, then the close."""

    def held(state: dict[str, Any]) -> bool:
        return any(s["user_id"] == user_id for s in state["sockets"])

    await server.wait_for_state(lambda state: not held(state), timeout=120)
    dropped.set()
    return await client.closed_with(timeout=30)


@pytest.mark.usefixtures("each_server")
async def test_a_worker_reports_its_servers_self_test_at_start_or_its_first_socket(
    live_servers: LiveServers, ws: Clients
) -> None:
    kind = live_servers.kind
    server = await asyncio.to_thread(start_server, dict(FAST), kind)
    try:
        # daphne runs no lifespan events: its self-test runs when Django's apps are ready,
        # before the worker serves anything. uvicorn loads its WebSocket protocol after the
        # application: its self-test runs at the first socket.
        at_start = await asyncio.to_thread(
            sample, server, "realtime_slow_socket_protection", library=kind
        )
        assert at_start == (1 if kind == "daphne" else 0)
        _, users, tokens = await off_loop(members, 1)
        client = await ws.authenticated(server, tokens[0])
        assert await marker_for(client, users[0].pk) == []
        assert (
            await asyncio.to_thread(sample, server, "realtime_slow_socket_protection", library=kind)
            == 1
        )
        assert await asyncio.to_thread(sample, server, "realtime_unprotected_sockets_total") == 0
        assert await asyncio.to_thread(unprotected_lines, server) == []
    finally:
        await client_closed(ws)
        await asyncio.to_thread(server.stop)


async def client_closed(ws: Clients) -> None:
    """Close the test's clients before their server stops."""
    await ws.close_all()
    ws.opened.clear()
