"""Strings no database can take (a lone UTF-16 surrogate, a NUL) name nothing, end to end.

JSON lets a client send ``"\\ud800"``: a string Python holds but no UTF-8 driver can encode.
Sent as a scope, a channel or a token, it must be read as naming nothing — exactly like a slug
with a NUL in it — never reach a query, never answer ``Invalid authentication token`` for a
scope (the refusal clients cure by refreshing, so they would loop), and never write a
traceback. Real daphne server, real clients, the database under test.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from realtime.auth import issue_token
from realtime.broadcast import broadcast_to_users
from realtime.testing import in_thread
from tests.live import Clients, LiveServers, Server, wait_for_socket
from tests.testapp.models import Company, Membership, Workspace

pytestmark = pytest.mark.django_db(transaction=True)

SURROGATE = "\ud800"
#: What the server must never log for anything a client sends.
FAILURE_IN_LOG = re.compile(r"Traceback|Logging error|\b(ERROR|CRITICAL)\b")


def make_member() -> tuple[Any, str, Workspace]:
    acme = Workspace.objects.create(name="Acme", slug="acme")
    user = get_user_model().objects.create_user(username="ann")
    Membership.objects.create(workspace=acme, user=user)
    return user, issue_token(user), acme


def log_size(server: Server) -> int:
    return Path(server.log.name).stat().st_size


async def log_since(server: Server, offset: int) -> str:
    def read() -> str:
        with open(server.log.name, "rb") as file:
            file.seek(offset)
            return file.read().decode(errors="replace")

    return await asyncio.to_thread(read)


async def send_raw_json(client: Any, type_: str, data: Any) -> None:
    # json.dumps escapes the surrogate as \ud800: valid JSON, valid UTF-8 on the wire.
    await client.send_raw(json.dumps({"type": type_, "data": data}))


@pytest.mark.parametrize(
    "ask",
    [
        pytest.param({"scope": SURROGATE}, id="scope"),
        pytest.param({"scope": "acme" + SURROGATE}, id="scope-suffix"),
        pytest.param({"scopes": [SURROGATE]}, id="scopes"),
        pytest.param({"workspace": SURROGATE}, id="workspace"),
    ],
)
async def test_a_scope_holding_a_lone_surrogate_is_refused_scope_not_found(
    live_servers: LiveServers, ws: Clients, ask: dict[str, Any]
) -> None:
    _, token, _ = await in_thread(make_member)
    server = live_servers.get("surrogates")
    offset = await asyncio.to_thread(log_size, server)
    client = await ws.connect(server)
    await send_raw_json(client, "authenticate", {"token": token, **ask})
    assert await client.next_frame() == {
        "type": "auth_error",
        "data": {"message": "Scope not found"},
    }
    assert await client.closed_with() == 1008
    log = await log_since(server, offset)
    assert [line for line in log.splitlines() if FAILURE_IN_LOG.search(line)] == [], log


async def test_a_lone_surrogate_beside_a_real_scope_is_dropped(
    live_servers: LiveServers, ws: Clients
) -> None:
    _, token, _ = await in_thread(make_member)
    client = await ws.connect(live_servers.get("surrogates"))
    await send_raw_json(client, "authenticate", {"token": token, "scopes": [SURROGATE, "acme"]})
    answer = await client.next_frame()
    assert answer["type"] == "auth_success"
    assert answer["data"]["scopes"] == ["acme"]


async def test_a_token_holding_a_lone_surrogate_is_refused_invalid_token(
    live_servers: LiveServers, ws: Clients
) -> None:
    _, token, _ = await in_thread(make_member)
    server = live_servers.get("surrogates")
    offset = await asyncio.to_thread(log_size, server)
    client = await ws.connect(server)
    await send_raw_json(client, "authenticate", {"token": token + SURROGATE, "scope": "acme"})
    assert await client.next_frame() == {
        "type": "auth_error",
        "data": {"message": "Invalid authentication token"},
    }
    log = await log_since(server, offset)
    assert [line for line in log.splitlines() if FAILURE_IN_LOG.search(line)] == [], log


async def test_watches_and_subscribes_holding_lone_surrogates_name_nothing_and_log_nothing(
    live_servers: LiveServers, ws: Clients
) -> None:
    user, token, acme = await in_thread(make_member)
    server = live_servers.get("surrogates")
    offset = await asyncio.to_thread(log_size, server)
    client = await ws.authenticated(server, token, scope="acme")
    # Many frames, as the client that flooded the log sent them; under the frame limit.
    for _ in range(40):
        await send_raw_json(client, "subscribe", {"channels": [SURROGATE, "contact:" + SURROGATE]})
        await send_raw_json(client, "watch", {"scopes": ["acme", SURROGATE]})
    await send_raw_json(client, "subscribe", {"channel": "company"})
    await wait_for_socket(server, user.pk, channels=["company"])
    await in_thread(Company.objects.create, workspace=acme, name="Heard")
    frame = await client.wait_for(lambda f: f["type"] == "company.created")
    assert frame["scope_id"] == acme.pk
    # A watch naming only a surrogate reads no scope, and the socket stays open.
    await send_raw_json(client, "watch", {"scope": SURROGATE})
    await server.wait_for_state(
        lambda state: [s["scopes"] for s in state["sockets"] if s["user_id"] == user.pk] == [[]]
    )
    await in_thread(Company.objects.create, workspace=acme, name="Not heard")
    await in_thread(broadcast_to_users, [user.pk], "test.marker", {"n": 1})
    assert await client.frames_until("test.marker") == []
    log = await log_since(server, offset)
    assert [line for line in log.splitlines() if FAILURE_IN_LOG.search(line)] == [], log
