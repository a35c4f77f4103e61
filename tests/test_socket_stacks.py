"""The socket behind the stacks real projects serve: daphne or uvicorn, bare or wrapped.

One event reaches every subscribed socket of a workspace, exactly once, under each server and
stack (``each_stack``). Behind a middleware whose ``send`` hides the server's connection
(``tests.asgi.opaque``), daphne's sockets are still served, and the log says once that slow
sockets go unnoticed and refusals cannot close 1008.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from realtime.auth import issue_token
from realtime.broadcast import broadcast_to_user
from tests.helpers import off_loop
from tests.live import Client, Clients, LiveServers, each_stack  # noqa: F401
from tests.testapp.models import Company, Membership, Workspace

pytestmark = pytest.mark.django_db(transaction=True)

#: Sockets one event fans out to.
FAN_OUT = 30
#: What the server logs once when it cannot find daphne's connection behind ``send``.
NOT_FOUND = "daphne's connection could not be found behind the ASGI send"


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


async def test_a_send_hiding_daphnes_connection_is_reported_once_and_still_served(
    live_servers: LiveServers, ws: Clients
) -> None:
    live_servers.stack = "opaque"
    try:
        server = live_servers.get("opaque")
    finally:
        live_servers.stack = "bare"
    _, users, tokens = await off_loop(members, 2)
    clients = [await ws.authenticated(server, token, scope="acme") for token in tokens]
    for client, user in zip(clients, users, strict=True):
        assert await marker_for(client, user.pk) == []
    # A refusal still says why; the close code is the one autobahn lets through untold.
    refused = await ws.connect(server)
    await refused.authenticate("garbage")
    assert await refused.closed_with() == 1000
    assert refused.received == [
        {"type": "auth_error", "data": {"message": "Invalid authentication token"}}
    ]
    log = await asyncio.to_thread(Path(server.log.name).read_text, errors="replace")
    assert log.count(NOT_FOUND) == 1
    assert "Exception inside application" not in log
