"""Native clients (FastEdgy's Flutter client, any phone or server-side client) connect.

``dart:io``'s ``WebSocket.connect`` sends a ``User-Agent`` and no ``Origin``, and pings every
30 s. These tests connect the same way, with pings scaled down to every 0.2 s for the whole
test, to the example project's own ASGI application under daphne, and check the ``Origin``
rules of ``realtime.origins`` over the real handshake. Writes come from another process
(``manage.py shell``).
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import websockets
from websockets.asyncio.client import connect

from realtime.broadcast import broadcast_to_scope
from tests.example import ExampleProject
from tests.helpers import WAIT, off_loop
from tests.live import Client, Clients, LiveServers
from tests.testapp.models import Workspace

#: What ``dart:io`` sends as ``User-Agent``.
DART_USER_AGENT = "Dart/3.5 (dart:io)"
#: The Flutter client pings every 30 s; the tests ping every 0.2 s.
PING_INTERVAL = 0.2
FRONT_END = "https://app.example.net"
FORBIDDEN = 403
POLICY_VIOLATION = 1008


@pytest.fixture(scope="module")
def example() -> Iterator[ExampleProject]:
    """The example project under daphne, allowing one front end on another host."""
    with tempfile.TemporaryDirectory() as workdir:
        project = ExampleProject(Path(workdir), REALTIME_ALLOWED_ORIGINS=FRONT_END)
        project.prepare()
        project.start_daphne()
        yield project
        project.stop()


async def connect_natively(url: str) -> Client:
    """Connect as the Flutter client does: ``User-Agent`` only, pings all along."""
    connection = await connect(
        url,
        user_agent_header=DART_USER_AGENT,
        ping_interval=PING_INTERVAL,
        ping_timeout=WAIT,
        open_timeout=WAIT,
    )
    assert connection.request is not None
    assert "Origin" not in connection.request.headers
    return Client(connection)


async def write_contact(example: ExampleProject, workspace: str, name: str) -> None:
    """Create a contact from another process, without holding up this event loop."""
    await asyncio.to_thread(
        example.shell,
        "from example_project.crm.models import Contact, Workspace; "
        f"Contact.objects.create(workspace=Workspace.objects.get(slug={workspace!r}), "
        f"name={name!r})",
    )


def is_contact(name: str) -> Any:
    return lambda frame: frame["type"] == "contact.created" and frame["data"]["name"] == name


async def test_a_flutter_shaped_client_authenticates_subscribes_watches_and_hears_writes(
    example: ExampleProject,
) -> None:
    token = await asyncio.to_thread(example.token, "alice")
    client = await connect_natively(example.socket_url)
    try:
        answer = await client.authenticate(token, scope="acme")
        assert answer["type"] == "auth_success"
        assert answer["data"]["scopes"] == ["acme"]
        await client.send("subscribe", {"channels": ["contact"]})
        await write_contact(example, "acme", "Heard in acme")
        heard = await client.wait_for(is_contact("Heard in acme"))
        assert "scope_id" in heard

        await client.send("watch", {"scope": "globex"})
        await client.send("subscribe", {"channels": ["contact"]})
        # A write in the scope it left, then one in the scope it watches: only the second.
        await write_contact(example, "acme", "Not heard after the watch")
        await write_contact(example, "globex", "Heard in globex")
        before = await client.frames_until("contact.created")
        assert before == []
        assert client.received[-1]["data"]["name"] == "Heard in globex"
        assert client.received[-1]["scope_id"] != heard["scope_id"]

        # The pings went on all along, answered (latency is measured from a pong).
        assert client.connection.latency > 0
        assert client.connection.close_code is None
    finally:
        await client.close()


async def handshake(url: str, origin: str) -> Client:
    connection = await connect(url, origin=origin, open_timeout=WAIT)  # type: ignore[arg-type]
    return Client(connection)


async def test_a_browser_origin_from_a_foreign_site_is_refused_with_http_403(
    example: ExampleProject,
) -> None:
    with pytest.raises(websockets.InvalidStatus) as refused:
        await handshake(example.socket_url, "https://evil.example.com")
    assert refused.value.response.status_code == FORBIDDEN


async def test_a_null_origin_is_refused_with_http_403(example: ExampleProject) -> None:
    with pytest.raises(websockets.InvalidStatus) as refused:
        await handshake(example.socket_url, "null")
    assert refused.value.response.status_code == FORBIDDEN


@pytest.mark.parametrize(
    "origin", [FRONT_END, "http://127.0.0.1:8000", "http://localhost:5173"], ids=str
)
async def test_an_origin_from_allowed_hosts_or_realtime_allowed_origins_is_admitted(
    example: ExampleProject, origin: str
) -> None:
    token = await asyncio.to_thread(example.token, "bob")
    client = await handshake(example.socket_url, origin)
    try:
        answer = await client.authenticate(token, scope="acme")
        assert answer["type"] == "auth_success"
    finally:
        await client.close()


# Pings and the frame limit, on the suite's own servers and database -------------------------


@pytest.mark.django_db(transaction=True)
async def test_pings_beyond_the_frame_limit_never_close_the_socket(
    live_servers: LiveServers, ws: Clients, make_user: Any
) -> None:
    limit = 5
    server = live_servers.get("few-frames", REALTIME_FRAME_LIMIT=limit)
    acme = await off_loop(Workspace.objects.create, name="Acme", slug="acme")
    user = await off_loop(make_user, "ann", member_of=acme)
    from realtime.auth import issue_token

    client = await ws.authenticated(server, await off_loop(issue_token, user), scope="acme")
    # One frame short of the limit, then four times the limit in pings, in the same window.
    for _ in range(limit - 1):
        await client.send("heartbeat")
    for _ in range(limit * 4):
        pong = await client.connection.ping()
        await asyncio.wait_for(pong, WAIT)
    await off_loop(broadcast_to_scope, acme.pk, "test.after_pings", None)
    assert (await client.next_frame())["type"] == "test.after_pings"
    # The limit is live on this server: the frames before the pings still count.
    await client.send("heartbeat")
    await client.send("heartbeat")
    assert await client.closed_with() == POLICY_VIOLATION
