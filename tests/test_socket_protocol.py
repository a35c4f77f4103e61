"""The socket protocol, end to end: real servers, real WebSocket clients.

Every refusal of the handshake with its reason and close code, the limits and close codes
after it, and what ``watch``, ``subscribe`` and ``unsubscribe`` do to what a socket hears.
The handshake, the refusals and the limits run under daphne and uvicorn, each serving the
socket bare and inside Channels' ``AuthMiddlewareStack`` (``each_stack``).
Absence is proven with a marker sent afterwards to the account; what a server holds is read
from its manager's state (``tests.urls``).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core import signing

from realtime.auth import issue_token
from realtime.broadcast import broadcast_to_scope, broadcast_to_user
from tests.helpers import off_loop
from tests.live import (  # noqa: F401
    Client,
    Clients,
    LiveServers,
    Server,
    each_stack,
    sockets_of,
    wait_for_socket,
)
from tests.testapp.models import Company, Membership, Notification, Tag, Workspace

pytestmark = pytest.mark.django_db(transaction=True)

POLICY_VIOLATION = 1008
MESSAGE_TOO_BIG = 1009

#: Setting overrides of the servers this module starts, by server name. Each distinct server
#: costs one daphne process for the session; "default" is shared with the other modules.
SERVERS: dict[str, dict[str, Any]] = {
    "default": {},
    "short-auth": {"REALTIME_AUTH_TIMEOUT": 0.5},
    "small-frames": {"REALTIME_MAX_FRAME_SIZE": 1000},
    # Room for a first frame nested too deep that is still under the frame size.
    "roomy-frames": {"REALTIME_MAX_FRAME_SIZE": 200_000},
    "few-frames": {"REALTIME_FRAME_LIMIT": 5},
    "two-per-user": {"REALTIME_MAX_SOCKETS_PER_USER": 2},
    "three-channels": {"REALTIME_MAX_CHANNELS": 3},
    # A bearer check of 1.5 s: frames sent right after authenticate arrive mid-handshake.
    "slow-handshake": {
        "REALTIME_AUTH": "tests.slow_auth.SlowAuth",
        "REALTIME_FRAME_LIMIT": 5,
        "REALTIME_MAX_FRAME_SIZE": 1000,
    },
    # Used by one test each: their state or their log is theirs alone.
    "gone-early": {},
    "logged": {},
    "log-flood": {},
    "token-causes": {},
}


def server_named(live_servers: LiveServers, name: str) -> Server:
    return live_servers.get(name, **SERVERS[name])


# Data ---------------------------------------------------------------------------------------


def make_workspace(slug: str) -> Workspace:
    return Workspace.objects.create(name=slug.title(), slug=slug)


def make_member(username: str, *workspaces: Workspace) -> tuple[Any, str]:
    user = get_user_model().objects.create_user(username=username)
    for workspace in workspaces:
        Membership.objects.create(workspace=workspace, user=user)
    return user, issue_token(user)


def make_workspaces(*slugs: str) -> list[Workspace]:
    return [make_workspace(slug) for slug in slugs]


# Clients and frames -------------------------------------------------------------------------


async def marker_for(client: Client, user_id: Any) -> list[dict[str, Any]]:
    """Send a marker to the user and return what the client received before it."""
    await off_loop(broadcast_to_user, user_id, "test.marker", None)
    return await client.frames_until("test.marker")


def auth_error(reason: str) -> dict[str, Any]:
    return {"type": "auth_error", "data": {"message": reason}}


async def assert_refused(client: Client, reason: str) -> None:
    """The client got exactly ``auth_error`` with ``reason``, then a close 1008."""
    code = await client.closed_with()
    assert client.received == [auth_error(reason)]
    assert code == POLICY_VIOLATION


def frame_text(type_: Any, data: Any) -> str:
    return json.dumps({"type": type_, "data": data})


def padded(type_: str, data: dict[str, Any], size: int, fill: str = "x") -> str:
    """A frame of exactly ``size`` characters: ``data`` plus a ``pad`` of ``fill``."""
    bare = json.dumps({"type": type_, "data": {**data, "pad": ""}}, ensure_ascii=False)
    text = json.dumps(
        {"type": type_, "data": {**data, "pad": fill * (size - len(bare))}}, ensure_ascii=False
    )
    assert len(text) == size
    return text


async def read_log(server: Server) -> str:
    return await asyncio.to_thread(Path(server.log.name).read_text, errors="replace")


# Refusals -----------------------------------------------------------------------------------


@pytest.mark.usefixtures("each_stack")
async def test_no_first_frame_within_the_auth_timeout_is_refused_authentication_timeout(
    live_servers: LiveServers, ws: Clients
) -> None:
    client = await ws.connect(server_named(live_servers, "short-auth"))
    started = time.monotonic()
    code = await client.closed_with()
    assert client.received == [auth_error("Authentication timeout")]
    assert code == POLICY_VIOLATION
    # Measured from after the client saw the accept, so a little under the server's wait.
    assert time.monotonic() - started >= 0.4


def _malformed(frame: str | bytes) -> Callable[[str], str | bytes]:
    return lambda token: frame


def _authenticate_holding(constant: str) -> Callable[[str], str | bytes]:
    """A valid ``authenticate`` for ``acme`` but for one more key, holding ``constant``."""
    return lambda token: (
        f'{{"type": "authenticate", "data": {{"token": {json.dumps(token)}, '
        f'"scope": "acme", "x": {constant}}}}}'
    )


def _authenticate_of_size(size: int, fill: str = "x") -> Callable[[str], str | bytes]:
    """A valid ``authenticate`` for ``acme``, padded to exactly ``size`` characters."""
    return lambda token: padded("authenticate", {"token": token, "scope": "acme"}, size, fill)


@pytest.mark.usefixtures("each_stack")
@pytest.mark.parametrize(
    ("server_name", "first_frame"),
    [
        pytest.param("default", _malformed(b"\x00\x01"), id="binary"),
        pytest.param("default", _malformed("not json"), id="not-json"),
        pytest.param("default", _malformed("[]"), id="json-array"),
        pytest.param("default", _malformed("null"), id="json-null"),
        pytest.param("default", _malformed("42"), id="json-number"),
        # Python's reader takes these constants; JSON has none of them.
        pytest.param("default", _authenticate_holding("NaN"), id="nan"),
        pytest.param("default", _authenticate_holding("-Infinity"), id="minus-infinity"),
        # 100,000 characters: on a server whose frame size allows them, so that the nesting,
        # not the size, is what is refused (the default 65,536 would refuse the size first).
        pytest.param("roomy-frames", _malformed("[" * 100_000), id="nested-too-deep"),
        # A first frame that would succeed but for its size: 1,001 characters over 1,000.
        pytest.param("small-frames", _authenticate_of_size(1001), id="over-max-frame-size"),
    ],
)
async def test_an_unreadable_first_frame_is_refused_invalid_authentication_format(
    live_servers: LiveServers,
    ws: Clients,
    server_name: str,
    first_frame: Callable[[str], str | bytes],
) -> None:
    acme = await off_loop(make_workspace, "acme")
    _, token = await off_loop(make_member, "ann", acme)
    client = await ws.connect(server_named(live_servers, server_name))
    await client.send_raw(first_frame(token))
    await assert_refused(client, "Invalid authentication format")


async def test_a_first_frame_of_exactly_the_frame_size_in_characters_is_read(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme = await off_loop(make_workspace, "acme")
    user, token = await off_loop(make_member, "ann", acme)
    client = await ws.connect(server_named(live_servers, "small-frames"))
    # 1,000 characters, most of them two bytes in UTF-8: the limit counts characters.
    await client.send_raw(_authenticate_of_size(1000, fill="é")(token))
    assert await client.next_frame() == {
        "type": "auth_success",
        "data": {"user_id": user.pk, "scope": "acme", "scopes": ["acme"]},
    }


@pytest.mark.usefixtures("each_stack")
@pytest.mark.parametrize(
    "first_frame",
    [
        pytest.param(lambda token: frame_text("watch", {"token": token}), id="type-not-auth"),
        pytest.param(lambda token: json.dumps({"data": {"token": token}}), id="type-missing"),
        pytest.param(lambda token: frame_text("authenticate", "x"), id="data-a-string"),
        pytest.param(lambda token: frame_text("authenticate", {"scope": "acme"}), id="no-token"),
        pytest.param(lambda token: frame_text("authenticate", {"token": 42}), id="token-42"),
        pytest.param(lambda token: frame_text("authenticate", {"token": ""}), id="token-empty"),
        pytest.param(lambda token: frame_text("authenticate", {"token": None}), id="token-null"),
    ],
)
async def test_a_first_frame_that_is_no_authenticate_message_is_refused_invalid_message(
    live_servers: LiveServers, ws: Clients, first_frame: Callable[[str], str]
) -> None:
    acme = await off_loop(make_workspace, "acme")
    _, token = await off_loop(make_member, "ann", acme)
    client = await ws.connect(live_servers.get())
    await client.send_raw(first_frame(token))
    await assert_refused(client, "Invalid authentication message")


@pytest.mark.usefixtures("each_stack")
@pytest.mark.parametrize(
    "token",
    [
        pytest.param("garbage", id="garbage"),
        pytest.param("x" * 60_000, id="60000-characters-under-the-frame-size"),
    ],
)
async def test_a_token_standing_for_no_account_is_refused_invalid_authentication_token(
    live_servers: LiveServers, ws: Clients, token: str
) -> None:
    client = await ws.connect(live_servers.get())
    await client.authenticate(token)
    await assert_refused(client, "Invalid authentication token")


@pytest.mark.usefixtures("each_stack")
async def test_a_70000_character_token_makes_the_first_frame_too_large_invalid_format(
    live_servers: LiveServers, ws: Clients
) -> None:
    # The frame carrying a 70,000-character token is over the default REALTIME_MAX_FRAME_SIZE
    # (65,536). The handshake refuses a first frame that is too large in step 2, as
    # "Invalid authentication format", before it reads a token at all (step 3 is where a
    # token standing for no account is refused): the token's reason never applies to it.
    client = await ws.connect(live_servers.get())
    await client.authenticate("x" * 70_000)
    await assert_refused(client, "Invalid authentication format")


@pytest.mark.usefixtures("each_stack")
@pytest.mark.parametrize(
    "ask",
    [
        pytest.param({"scope": "beta"}, id="scope-not-a-member"),
        pytest.param({"scopes": ["beta"]}, id="scopes-not-a-member"),
        pytest.param({"scope": "nowhere"}, id="scope-that-does-not-exist"),
        pytest.param({"scopes": [5]}, id="scopes-of-a-number"),
        pytest.param({"scopes": ["other-workspace-slug"]}, id="scopes-of-another-workspace"),
        pytest.param({"scopes": ["beta", "other-workspace-slug"]}, id="scopes-all-foreign"),
        pytest.param({"scope": 7}, id="scope-not-a-string"),
        pytest.param({"workspace": "beta"}, id="workspace-not-a-member"),
        pytest.param({"workspaces": [5]}, id="workspaces-of-a-number"),
    ],
)
async def test_a_scope_the_account_cannot_read_is_refused_scope_not_found(
    live_servers: LiveServers, ws: Clients, ask: dict[str, Any]
) -> None:
    acme, *_ = await off_loop(make_workspaces, "acme", "beta", "other-workspace-slug")
    _, token = await off_loop(make_member, "ann", acme)
    client = await ws.connect(live_servers.get())
    await client.authenticate(token, **ask)
    await assert_refused(client, "Scope not found")


@pytest.mark.parametrize(
    "ask",
    [
        pytest.param({"scopes": []}, id="empty-scopes"),
        pytest.param({"scope": None}, id="null-scope"),
        pytest.param({}, id="nothing-asked"),
        pytest.param({"workspaces": []}, id="empty-workspaces"),
    ],
)
async def test_an_empty_scope_list_or_a_null_scope_asks_for_no_scope(
    live_servers: LiveServers, ws: Clients, ask: dict[str, Any]
) -> None:
    acme = await off_loop(make_workspace, "acme")
    user, token = await off_loop(make_member, "ann", acme)
    client = await ws.connect(live_servers.get())
    assert await client.authenticate(token, **ask) == {
        "type": "auth_success",
        "data": {"user_id": user.pk, "scope": None, "scopes": []},
    }


@pytest.mark.usefixtures("each_stack")
async def test_auth_success_has_its_exact_shape(live_servers: LiveServers, ws: Clients) -> None:
    acme = await off_loop(make_workspace, "acme")
    user, token = await off_loop(make_member, "ann", acme)
    client = await ws.connect(live_servers.get())
    assert await client.authenticate(token, scope="acme") == {
        "type": "auth_success",
        "data": {"user_id": user.pk, "scope": "acme", "scopes": ["acme"]},
    }


@pytest.mark.parametrize(
    ("ask", "scopes"),
    [
        pytest.param({"workspace": "acme"}, ["acme"], id="workspace"),
        pytest.param({"workspaces": ["beta", "acme"]}, ["beta", "acme"], id="workspaces"),
        pytest.param({"scope": "acme", "workspace": "beta"}, ["acme"], id="scope-wins"),
        pytest.param({"scopes": ["beta"], "workspaces": ["acme"]}, ["beta"], id="scopes-win"),
    ],
)
async def test_workspace_and_workspaces_are_read_when_scope_and_scopes_are_absent(
    live_servers: LiveServers, ws: Clients, ask: dict[str, Any], scopes: list[str]
) -> None:
    acme, beta = await off_loop(make_workspaces, "acme", "beta")
    user, token = await off_loop(make_member, "ann", acme, beta)
    client = await ws.connect(live_servers.get())
    assert await client.authenticate(token, **ask) == {
        "type": "auth_success",
        "data": {"user_id": user.pk, "scope": scopes[0], "scopes": scopes},
    }


async def test_scopes_that_is_not_a_list_gives_way_to_scope(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme, _ = await off_loop(make_workspaces, "acme", "x")
    user, token = await off_loop(make_member, "ann", acme)
    client = await ws.connect(live_servers.get())
    assert await client.authenticate(token, scopes="x", scope="acme") == {
        "type": "auth_success",
        "data": {"user_id": user.pk, "scope": "acme", "scopes": ["acme"]},
    }


async def test_a_scope_list_reads_the_member_scopes_it_names_in_the_order_asked(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme, beta, _ = await off_loop(make_workspaces, "acme", "beta", "gamma")
    user, token = await off_loop(make_member, "ann", acme, beta)
    client = await ws.connect(live_servers.get())
    answer = await client.authenticate(token, scopes=["gamma", "beta", 5, "nowhere", "acme"])
    assert answer == {
        "type": "auth_success",
        "data": {"user_id": user.pk, "scope": "beta", "scopes": ["beta", "acme"]},
    }


@pytest.mark.usefixtures("each_stack")
async def test_a_socket_over_the_per_account_limit_is_refused_too_many_connections(
    live_servers: LiveServers, ws: Clients
) -> None:
    server = server_named(live_servers, "two-per-user")
    acme = await off_loop(make_workspace, "acme")
    user, token = await off_loop(make_member, "ann", acme)
    first = await ws.authenticated(server, token, scope="acme")
    second = await ws.authenticated(server, token, scope="acme")
    third = await ws.connect(server)
    await third.authenticate(token, scope="acme")
    await assert_refused(third, "Too many connections")
    # The two held sockets still hear the account.
    await off_loop(broadcast_to_user, user.pk, "test.marker", None)
    for client in (first, second):
        assert await client.frames_until("test.marker") == []
    await first.close()
    await server.wait_for_state(lambda state: len(sockets_of(state, user.pk)) == 1)
    fourth = await ws.authenticated(server, token, scope="acme")
    await off_loop(broadcast_to_user, user.pk, "test.marker", None)
    for client in (second, fourth):
        assert await client.frames_until("test.marker") == []


# After the handshake ------------------------------------------------------------------------


@pytest.mark.usefixtures("each_stack")
async def test_more_frames_than_the_frame_limit_in_the_window_close_1008_without_auth_error(
    live_servers: LiveServers, ws: Clients
) -> None:
    server = server_named(live_servers, "few-frames")  # REALTIME_FRAME_LIMIT=5
    acme = await off_loop(make_workspace, "acme")
    user, token = await off_loop(make_member, "ann", acme)
    client = await ws.authenticated(server, token, scope="acme")
    for _ in range(5):
        await client.send("heartbeat")
    assert await marker_for(client, user.pk) == []  # five frames are within the limit
    await client.send("heartbeat")  # the sixth, within the same 10-second window
    code = await client.closed_with()
    assert code == POLICY_VIOLATION
    assert [frame["type"] for frame in client.received] == ["auth_success", "test.marker"]


@pytest.mark.usefixtures("each_stack")
async def test_the_frame_limit_is_counted_before_the_size_check(
    live_servers: LiveServers, ws: Clients
) -> None:
    server = server_named(live_servers, "few-frames")  # REALTIME_FRAME_LIMIT=5, size 65,536
    acme = await off_loop(make_workspace, "acme")
    user, token = await off_loop(make_member, "ann", acme)
    oversized = padded("heartbeat", {}, 65_537)
    # On this server an oversized frame within the limit closes 1009 ...
    alone = await ws.authenticated(server, token, scope="acme")
    await alone.send_raw(oversized)
    assert await alone.closed_with() == MESSAGE_TOO_BIG
    # ... but as the frame over the limit it closes 1008: counted first.
    client = await ws.authenticated(server, token, scope="acme")
    for _ in range(5):
        await client.send("heartbeat")
    assert await marker_for(client, user.pk) == []
    await client.send_raw(oversized)
    assert await client.closed_with() == POLICY_VIOLATION
    assert [frame["type"] for frame in client.received] == ["auth_success", "test.marker"]


@pytest.mark.usefixtures("each_stack")
async def test_a_frame_over_the_frame_size_after_the_handshake_closes_1009(
    live_servers: LiveServers, ws: Clients
) -> None:
    server = server_named(live_servers, "small-frames")  # REALTIME_MAX_FRAME_SIZE=1000
    acme = await off_loop(make_workspace, "acme")
    _, token = await off_loop(make_member, "ann", acme)
    client = await ws.authenticated(server, token, scope="acme")
    await client.send_raw(padded("heartbeat", {}, 1001))
    assert await client.closed_with() == MESSAGE_TOO_BIG
    assert [frame["type"] for frame in client.received] == ["auth_success"]


async def test_a_frame_of_exactly_the_frame_size_in_characters_is_read_after_the_handshake(
    live_servers: LiveServers, ws: Clients
) -> None:
    server = server_named(live_servers, "small-frames")  # REALTIME_MAX_FRAME_SIZE=1000
    acme = await off_loop(make_workspace, "acme")
    user, token = await off_loop(make_member, "ann", acme)
    client = await ws.authenticated(server, token, scope="acme")
    # 1,000 characters, nearly 2,000 bytes: a subscribe, so that its effect shows.
    await client.send_raw(padded("subscribe", {"channels": ["company"]}, 1000, fill="é"))
    await wait_for_socket(server, user.pk, channels=["company"])
    assert await marker_for(client, user.pk) == []


# Frames sent during the handshake -----------------------------------------------------------


async def authenticate_then(server: Server, ws: Clients, token: str, *frames: str) -> Client:
    """Connect, send ``authenticate`` and, without waiting for its answer, ``frames``."""
    client = await ws.connect(server)
    await client.send("authenticate", {"token": token, "scope": "acme"})
    for frame in frames:
        await client.send_raw(frame)
    return client


@pytest.mark.usefixtures("each_stack")
async def test_frames_over_the_frame_limit_during_the_handshake_close_1008_at_once(
    live_servers: LiveServers, ws: Clients
) -> None:
    server = server_named(live_servers, "slow-handshake")  # REALTIME_FRAME_LIMIT=5
    acme = await off_loop(make_workspace, "acme")
    _, token = await off_loop(make_member, "ann", acme)
    heartbeat = frame_text("heartbeat", None)
    client = await authenticate_then(server, ws, token, *[heartbeat] * 6)
    assert await client.closed_with() == POLICY_VIOLATION
    # Closed while the bearer was still being checked: neither auth_success nor auth_error.
    assert client.received == []


@pytest.mark.usefixtures("each_stack")
async def test_a_frame_over_the_frame_size_during_the_handshake_closes_1009_at_once(
    live_servers: LiveServers, ws: Clients
) -> None:
    server = server_named(live_servers, "slow-handshake")  # REALTIME_MAX_FRAME_SIZE=1000
    acme = await off_loop(make_workspace, "acme")
    _, token = await off_loop(make_member, "ann", acme)
    client = await authenticate_then(server, ws, token, padded("heartbeat", {}, 1001))
    assert await client.closed_with() == MESSAGE_TOO_BIG
    assert client.received == []


@pytest.mark.usefixtures("each_stack")
async def test_frames_sent_during_the_handshake_are_read_in_order_and_count_in_the_window(
    live_servers: LiveServers, ws: Clients
) -> None:
    server = server_named(live_servers, "slow-handshake")  # REALTIME_FRAME_LIMIT=5
    acme = await off_loop(make_workspace, "acme")
    user, token = await off_loop(make_member, "ann", acme)
    heartbeat = frame_text("heartbeat", None)
    early = [frame_text("subscribe", {"channels": ["company", "tag"]}), heartbeat, heartbeat]
    early.append(frame_text("unsubscribe", {"channel": "tag"}))  # read after the subscribe
    client = await authenticate_then(server, ws, token, *early)
    assert (await client.next_frame())["type"] == "auth_success"
    await wait_for_socket(server, user.pk, channels=["company"])
    await client.send("heartbeat")  # the fifth frame of the window: within the limit
    assert await marker_for(client, user.pk) == []
    await client.send("heartbeat")  # the sixth
    assert await client.closed_with() == POLICY_VIOLATION
    assert [frame["type"] for frame in client.received] == ["auth_success", "test.marker"]


@pytest.mark.usefixtures("each_stack")
@pytest.mark.parametrize(
    "frame",
    [
        pytest.param(b"\x00\x01", id="binary"),
        pytest.param("not json", id="not-json"),
        pytest.param("[]", id="json-array"),
        pytest.param('[{"type": "heartbeat", "data": null}]', id="json-array-of-a-frame"),
        pytest.param("null", id="json-null"),
        pytest.param('"heartbeat"', id="json-string"),
        pytest.param("[" * 60_000, id="nested-too-deep"),
        pytest.param('{"type": "heartbeat", "data": NaN}', id="nan"),
        pytest.param('{"type": "heartbeat", "data": Infinity}', id="infinity"),
    ],
)
async def test_a_frame_that_is_not_a_json_object_after_the_handshake_closes_1008(
    live_servers: LiveServers, ws: Clients, frame: str | bytes
) -> None:
    acme = await off_loop(make_workspace, "acme")
    _, token = await off_loop(make_member, "ann", acme)
    client = await ws.authenticated(live_servers.get(), token, scope="acme")
    await client.send_raw(frame)
    assert await client.closed_with() == POLICY_VIOLATION
    assert [frame["type"] for frame in client.received] == ["auth_success"]


async def test_a_frame_without_a_string_type_is_ignored(
    live_servers: LiveServers, ws: Clients
) -> None:
    server = live_servers.get()
    acme = await off_loop(make_workspace, "acme")
    user, token = await off_loop(make_member, "ann", acme)
    client = await ws.authenticated(server, token, scope="acme")
    await client.send_raw(json.dumps({"data": {"channels": ["tag"]}}))
    await client.send_raw(json.dumps({}))
    await client.send_raw(frame_text(None, {"channels": ["tag"]}))
    await client.send_raw(frame_text(5, {"channels": ["tag"]}))
    await client.send_raw(frame_text(["subscribe"], {"channels": ["tag"]}))
    # Read after the frames above: the socket is still served and they subscribed nothing.
    await client.send("subscribe", {"channel": "company"})
    await wait_for_socket(server, user.pk, channels=["company"], slugs=["acme"])
    assert await marker_for(client, user.pk) == []


async def test_a_second_authenticate_is_ignored(live_servers: LiveServers, ws: Clients) -> None:
    server = live_servers.get()
    acme, beta = await off_loop(make_workspaces, "acme", "beta")
    user, token = await off_loop(make_member, "ann", acme, beta)
    client = await ws.authenticated(server, token, scope="acme")
    await client.send("authenticate", {"token": token, "scope": "beta"})
    await client.send("authenticate", {"token": "garbage"})
    await client.send("authenticate", "x")
    await client.send("subscribe", {"channel": "company"})
    await wait_for_socket(server, user.pk, channels=["company"], slugs=["acme"])
    assert await marker_for(client, user.pk) == []  # no answer, no auth_error, still open


@pytest.mark.parametrize("data", [None, {}, "x", [1, 2], {"token": "garbage"}])
async def test_a_heartbeat_is_not_answered(
    live_servers: LiveServers, ws: Clients, data: Any
) -> None:
    server = live_servers.get()
    acme = await off_loop(make_workspace, "acme")
    user, token = await off_loop(make_member, "ann", acme)
    client = await ws.authenticated(server, token, scope="acme")
    await client.send("heartbeat", data)
    # Read after the heartbeat: an answer to it would have been sent before this shows.
    await client.send("subscribe", {"channel": "company"})
    await wait_for_socket(server, user.pk, channels=["company"])
    assert await marker_for(client, user.pk) == []


async def test_a_frame_of_an_application_type_is_neither_answered_nor_closing(
    live_servers: LiveServers, ws: Clients
) -> None:
    # The frame goes to realtime.signals.frame_received inside the daphne process, where this
    # test cannot connect a receiver; what a client can see is that nothing else happens.
    server = live_servers.get()
    acme = await off_loop(make_workspace, "acme")
    user, token = await off_loop(make_member, "ann", acme)
    client = await ws.authenticated(server, token, scope="acme")
    await client.send("app.ping", {"x": 1})
    await client.send("app.ping", None)
    await client.send("subscribe", {"channel": "company"})
    await wait_for_socket(server, user.pk, channels=["company"], slugs=["acme"])
    assert await marker_for(client, user.pk) == []


# watch --------------------------------------------------------------------------------------


async def test_watch_reads_the_scopes_it_names_in_single_and_list_form(
    live_servers: LiveServers, ws: Clients
) -> None:
    server = live_servers.get()
    acme, beta = await off_loop(make_workspaces, "acme", "beta")
    user, token = await off_loop(make_member, "ann", acme, beta)
    client = await ws.authenticated(server, token, scope="acme")
    await client.send("watch", {"scopes": ["beta", "acme"]})
    await wait_for_socket(server, user.pk, slugs=["beta", "acme"], scopes=[beta.pk, acme.pk])
    await client.send("watch", {"scope": "beta"})
    await wait_for_socket(server, user.pk, slugs=["beta"], scopes=[beta.pk])
    await off_loop(broadcast_to_scope, beta.pk, "test.scoped", {"n": 1})
    assert await client.next_frame() == {
        "type": "test.scoped",
        "data": {"n": 1},
        "scope_id": beta.pk,
    }
    await client.send("watch", {"workspaces": ["acme"]})
    await wait_for_socket(server, user.pk, slugs=["acme"], scopes=[acme.pk])
    await client.send("watch", {"workspace": "beta"})
    await wait_for_socket(server, user.pk, slugs=["beta"], scopes=[beta.pk])
    # ``scopes`` that is not a list gives way to ``scope``.
    await client.send("watch", {"scopes": "beta", "scope": "acme"})
    await wait_for_socket(server, user.pk, slugs=["acme"], scopes=[acme.pk])
    await client.send("watch", {"scopes": []})
    await wait_for_socket(server, user.pk, slugs=[], scopes=[])
    assert await marker_for(client, user.pk) == []  # a watch is never answered


@pytest.mark.parametrize(
    ("asked", "watched"),
    [
        pytest.param({"scope": "acme"}, {"scope": "acme"}, id="same-scope"),
        pytest.param(
            {"scopes": ["acme", "beta"]}, {"scopes": ["acme", "beta"]}, id="same-scope-list"
        ),
        pytest.param({"scope": "acme"}, {"workspace": "acme"}, id="same-scope-by-alias"),
        pytest.param({"scope": "acme"}, {"scopes": ["acme"]}, id="same-set-as-a-list"),
        pytest.param(
            {"scopes": ["acme", "beta"]}, {"scopes": ["beta", "acme"]}, id="same-set-reordered"
        ),
    ],
)
async def test_a_watch_naming_the_scopes_already_read_keeps_every_subscription(
    live_servers: LiveServers,
    ws: Clients,
    asked: dict[str, Any],
    watched: dict[str, Any],
) -> None:
    server = live_servers.get()
    acme, beta = await off_loop(make_workspaces, "acme", "beta")
    user, token = await off_loop(make_member, "ann", acme, beta)
    client = await ws.authenticated(server, token, **asked)
    await client.send("subscribe", {"channels": ["company"]})
    before = await wait_for_socket(server, user.pk, channels=["company"])
    await client.send("watch", watched)
    await client.send("subscribe", {"channel": "tag"})  # read after the watch
    after = await wait_for_socket(server, user.pk, channels=["company", "tag"])
    assert sorted(after["scopes"]) == sorted(before["scopes"])
    company = await off_loop(Company.objects.create, workspace=acme, name="Kept")
    frame = await client.wait_for(lambda f: f["type"] == "company.created")
    assert frame["data"]["id"] == company.pk
    assert frame["scope_id"] == acme.pk


@pytest.mark.parametrize(
    ("asked", "watched", "slugs"),
    [
        pytest.param({"scope": "acme"}, {"scope": "beta"}, ["beta"], id="another-scope"),
        pytest.param(
            {"scope": "acme"}, {"scopes": ["acme", "beta"]}, ["acme", "beta"], id="one-more"
        ),
        pytest.param({"scopes": ["acme", "beta"]}, {"scope": "acme"}, ["acme"], id="one-less"),
        pytest.param({"scope": "acme"}, {"scope": None}, [], id="no-scope"),
        pytest.param({}, {"scope": "acme"}, ["acme"], id="from-no-scope"),
        # A ``data`` that is not an object is read as ``{}``: no scope.
        pytest.param({"scope": "acme"}, "beta", [], id="data-not-an-object"),
    ],
)
async def test_a_watch_changing_the_scopes_read_drops_every_subscription(
    live_servers: LiveServers,
    ws: Clients,
    asked: dict[str, Any],
    watched: Any,
    slugs: list[str],
) -> None:
    server = live_servers.get()
    acme, beta = await off_loop(make_workspaces, "acme", "beta")
    user, token = await off_loop(make_member, "ann", acme, beta)
    client = await ws.authenticated(server, token, **asked)
    await client.send("subscribe", {"channels": ["company", "contact:1", "tag"]})
    await wait_for_socket(server, user.pk, channels=["company", "contact:1", "tag"])
    await client.send("watch", watched)
    await wait_for_socket(server, user.pk, slugs=slugs, channels=[])
    assert await marker_for(client, user.pk) == []


async def test_after_a_watch_the_new_scope_is_heard_only_once_subscribed_again(
    live_servers: LiveServers, ws: Clients
) -> None:
    server = live_servers.get()
    acme, beta = await off_loop(make_workspaces, "acme", "beta")
    user, token = await off_loop(make_member, "ann", acme, beta)
    client = await ws.authenticated(server, token, scope="acme")
    await client.send("subscribe", {"channels": ["company"]})
    await wait_for_socket(server, user.pk, channels=["company"])
    first = await off_loop(Company.objects.create, workspace=acme, name="Heard in acme")
    frame = await client.wait_for(lambda f: f["type"] == "company.created")
    assert frame["data"]["id"] == first.pk
    await client.send("watch", {"scope": "beta"})
    await wait_for_socket(server, user.pk, slugs=["beta"], channels=[])
    await off_loop(Company.objects.create, workspace=beta, name="Unheard in beta")
    await off_loop(Company.objects.create, workspace=acme, name="Unheard in acme")
    assert await marker_for(client, user.pk) == []
    await client.send("subscribe", {"channels": ["company"]})
    await wait_for_socket(server, user.pk, slugs=["beta"], channels=["company"])
    await off_loop(Company.objects.create, workspace=acme, name="Left behind")
    heard = await off_loop(Company.objects.create, workspace=beta, name="Heard in beta")
    frames = await marker_for(client, user.pk)
    assert [(f["type"], f["data"]["id"], f["scope_id"]) for f in frames] == [
        ("company.created", heard.pk, beta.pk)
    ]


@pytest.mark.parametrize(
    "watched",
    [
        pytest.param({"scope": "other"}, id="scope"),
        pytest.param({"scopes": ["other"]}, id="scopes"),
        pytest.param({"scopes": ["other", 5]}, id="scopes-with-a-number"),
        pytest.param({"scope": 7}, id="scope-not-a-string"),
    ],
)
async def test_a_watch_to_a_scope_the_account_is_not_a_member_of_is_not_refused(
    live_servers: LiveServers, ws: Clients, watched: dict[str, Any]
) -> None:
    server = live_servers.get()
    acme, _ = await off_loop(make_workspaces, "acme", "other")
    user, token = await off_loop(make_member, "ann", acme)
    client = await ws.authenticated(server, token, scope="acme")
    await client.send("subscribe", {"channels": ["company"]})
    await wait_for_socket(server, user.pk, channels=["company"])
    await client.send("watch", watched)
    await wait_for_socket(server, user.pk, scopes=[], slugs=[], channels=[])
    await off_loop(Company.objects.create, workspace=acme, name="Not read any more")
    note = await off_loop(Notification.objects.create, user=user, text="still yours")
    # Nothing before the account event: no auth_error, no close, no scope event.
    assert await client.frames_until("notification.created") == []
    assert client.received[-1] == {
        "type": "notification.created",
        "data": {"model": "notification", "id": note.pk, "text": "still yours"},
    }


@pytest.mark.parametrize(
    ("asked", "watched"),
    [
        pytest.param({}, None, id="authenticated-without-scope"),
        pytest.param({"scopes": []}, None, id="authenticated-with-no-scopes"),
        pytest.param({"scope": "acme"}, {"scope": None}, id="watched-no-scope"),
        pytest.param({"scope": "acme"}, {"scope": "other"}, id="watched-a-foreign-scope"),
    ],
)
async def test_a_subscription_made_while_reading_no_scope_reaches_nothing_of_a_scope(
    live_servers: LiveServers,
    ws: Clients,
    asked: dict[str, Any],
    watched: dict[str, Any] | None,
) -> None:
    server = live_servers.get()
    acme, _ = await off_loop(make_workspaces, "acme", "other")
    user, token = await off_loop(make_member, "ann", acme)
    reader, reader_token = await off_loop(make_member, "bob", acme)
    # Bob reads acme on the same worker: acme's events do reach this process.
    control = await ws.authenticated(server, reader_token, scope="acme")
    await control.send("subscribe", {"channels": ["company"]})
    await wait_for_socket(server, reader.pk, channels=["company"])
    client = await ws.authenticated(server, token, **asked)
    if watched is not None:
        await client.send("watch", watched)
    await client.send("subscribe", {"channels": ["company"]})
    await wait_for_socket(server, user.pk, scopes=[], channels=["company"])
    company = await off_loop(Company.objects.create, workspace=acme, name="Scoped")
    await off_loop(broadcast_to_scope, acme.pk, "test.scoped", None)
    await off_loop(broadcast_to_scope, acme.pk, "test.channelled", None, channels=["company"])
    heard = await marker_for(control, reader.pk)
    assert [(f["type"], f["scope_id"]) for f in heard] == [
        ("company.created", acme.pk),
        ("test.scoped", acme.pk),
        ("test.channelled", acme.pk),
    ]
    assert heard[0]["data"]["id"] == company.pk
    assert await marker_for(client, user.pk) == []


# subscribe and unsubscribe ------------------------------------------------------------------


async def test_subscribe_takes_a_list_of_channels_or_a_single_channel(
    live_servers: LiveServers, ws: Clients
) -> None:
    server = live_servers.get()
    acme = await off_loop(make_workspace, "acme")
    user, token = await off_loop(make_member, "ann", acme)
    client = await ws.authenticated(server, token, scope="acme")
    await client.send("subscribe", {"channels": ["company", "contact:7"]})
    await client.send("subscribe", {"channel": "tag"})
    await wait_for_socket(server, user.pk, channels=["company", "contact:7", "tag"])
    tag = await off_loop(Tag.objects.create, workspace=acme, name="urgent")
    frames = await marker_for(client, user.pk)  # a subscribe is never answered
    assert frames == [
        {
            "type": "tag.created",
            "data": {"model": "tag", "id": tag.pk, "name": "urgent"},
            "scope_id": acme.pk,
        }
    ]


@pytest.mark.parametrize(
    ("data", "channels"),
    [
        pytest.param({"channels": [], "channel": "tag"}, ["tag"], id="empty-list-then-channel"),
        pytest.param({"channels": ["company"], "channel": "tag"}, ["company"], id="list-first"),
        pytest.param({"channels": ["company", 5, None, {}]}, ["company"], id="non-strings"),
        pytest.param({"channels": "company"}, [], id="channels-not-a-list"),
        pytest.param({"channel": 5}, [], id="channel-not-a-string"),
        pytest.param("company", [], id="data-not-an-object"),
    ],
)
async def test_subscribe_reads_channels_then_channel_and_skips_non_strings(
    live_servers: LiveServers, ws: Clients, data: Any, channels: list[str]
) -> None:
    server = live_servers.get()
    acme = await off_loop(make_workspace, "acme")
    user, token = await off_loop(make_member, "ann", acme)
    client = await ws.authenticated(server, token, scope="acme")
    await client.send("subscribe", data)
    await client.send("subscribe", {"channel": "contact:1"})  # read after it
    await wait_for_socket(server, user.pk, channels=sorted([*channels, "contact:1"]))
    assert await marker_for(client, user.pk) == []


async def test_channels_of_unknown_models_are_dropped_silently(
    live_servers: LiveServers, ws: Clients
) -> None:
    server = live_servers.get()
    acme = await off_loop(make_workspace, "acme")
    user, token = await off_loop(make_member, "ann", acme)
    client = await ws.authenticated(server, token, scope="acme")
    asked = ["ghost", "company", "ghost:3", "plain", "plain:1", "contact:9", "comment", "remark"]
    await client.send("subscribe", {"channels": asked})
    await client.send("subscribe", {"channel": "ghost:company"})
    await client.send("subscribe", {"channel": "tag"})  # read after them
    await wait_for_socket(server, user.pk, channels=["company", "contact:9", "remark", "tag"])
    assert await marker_for(client, user.pk) == []  # no answer, not closed


async def test_a_subscribe_stops_at_the_first_channel_over_the_channel_limit(
    live_servers: LiveServers, ws: Clients
) -> None:
    server = server_named(live_servers, "three-channels")  # REALTIME_MAX_CHANNELS=3
    acme = await off_loop(make_workspace, "acme")
    user, token = await off_loop(make_member, "ann", acme)
    client = await ws.authenticated(server, token, scope="acme")
    five = [f"company:{n}" for n in range(1, 6)]
    await client.send("subscribe", {"channels": five})
    await wait_for_socket(server, user.pk, channels=five[:3])
    # Channels already held may be sent again: nothing changes, nothing closes.
    await client.send("subscribe", {"channels": five[:3]})
    await client.send("unsubscribe", {"channel": "company:3"})  # read after it
    await wait_for_socket(server, user.pk, channels=["company:1", "company:2"])
    # Held channels take no more room: the first new one fits, the next does not.
    await client.send("subscribe", {"channels": ["company:1", "company:2", *five[3:]]})
    await wait_for_socket(server, user.pk, channels=["company:1", "company:2", "company:4"])
    assert await marker_for(client, user.pk) == []


async def test_unsubscribe_stops_delivery(live_servers: LiveServers, ws: Clients) -> None:
    server = live_servers.get()
    acme = await off_loop(make_workspace, "acme")
    user, token = await off_loop(make_member, "ann", acme)
    client = await ws.authenticated(server, token, scope="acme")
    await client.send("subscribe", {"channels": ["company", "tag"]})
    await wait_for_socket(server, user.pk, channels=["company", "tag"])
    heard = await off_loop(Company.objects.create, workspace=acme, name="Heard")
    frame = await client.wait_for(lambda f: f["type"] == "company.created")
    assert frame["data"]["id"] == heard.pk
    await client.send("unsubscribe", {"channel": "company"})
    await wait_for_socket(server, user.pk, channels=["tag"])
    await off_loop(Company.objects.create, workspace=acme, name="Unheard")
    tag = await off_loop(Tag.objects.create, workspace=acme, name="heard")
    frames = await marker_for(client, user.pk)
    assert [(f["type"], f["data"]["id"]) for f in frames] == [("tag.created", tag.pk)]
    await client.send("unsubscribe", {"channels": ["tag", "never-held"]})
    await wait_for_socket(server, user.pk, channels=[])
    await off_loop(Tag.objects.create, workspace=acme, name="unheard")
    assert await marker_for(client, user.pk) == []


# Leaving early ------------------------------------------------------------------------------


async def test_a_client_gone_before_auth_success_leaves_nothing_registered(
    live_servers: LiveServers, ws: Clients
) -> None:
    server = server_named(live_servers, "gone-early")  # used by this test only
    acme, beta = await off_loop(make_workspaces, "acme", "beta")
    leaver, leaver_token = await off_loop(make_member, "leaver", acme)
    stayer, stayer_token = await off_loop(make_member, "stayer", beta)
    for abrupt in (False, True) * 5:
        client = await Client.connect(server)
        await client.send("authenticate", {"token": leaver_token, "scope": "acme"})
        if abrupt:
            client.connection.transport.abort()  # no closing handshake at all
        await client.close()  # without reading auth_success
    # A socket made after them, on the same worker: once it shows, the leavers were served.
    stayer_client = await ws.authenticated(server, stayer_token, scope="beta")

    def only_the_stayer(state: dict[str, Any]) -> bool:
        return (
            [socket["user_id"] for socket in state["sockets"]] == [stayer.pk]
            and state["followed"] == [beta.pk]
            and state["by_scope"] == {str(beta.pk): 1}
            and state["by_user"] == {str(stayer.pk): 1}
        )

    try:
        await server.wait_for_state(only_the_stayer)
    except TimeoutError:
        raise AssertionError(f"left behind: {await asyncio.to_thread(server.state)}") from None
    # And still so after a round trip through the transport.
    assert await marker_for(stayer_client, stayer.pk) == []
    state = await asyncio.to_thread(server.state)
    assert sockets_of(state, leaver.pk) == []
    assert only_the_stayer(state), state


# Logs ---------------------------------------------------------------------------------------


async def test_refusals_and_bad_frames_never_log_tokens_or_frame_bodies(
    live_servers: LiveServers, ws: Clients
) -> None:
    server = server_named(live_servers, "logged")
    acme, _ = await off_loop(make_workspaces, "acme", "beta")
    _, token = await off_loop(make_member, "ann", acme)
    secret = f"garbage-token-{uuid.uuid4().hex}"
    refused = await ws.connect(server)
    await refused.authenticate(secret)
    await assert_refused(refused, "Invalid authentication token")
    foreign = await ws.connect(server)
    await foreign.authenticate(token, scope="beta")
    await assert_refused(foreign, "Scope not found")
    body = f"not json {uuid.uuid4().hex}"
    client = await ws.authenticated(server, token, scope="acme")
    await client.send_raw(body)
    assert await client.closed_with() == POLICY_VIOLATION
    log = await read_log(server)
    # The refusals are logged (each line is written before its auth_error is sent) ...
    assert "Invalid authentication token" in log
    assert "Scope not found" in log
    # ... but never what the client sent.
    assert secret not in log
    assert token not in log
    assert body not in log
    assert body.split()[-1] not in log


def refused_tokens() -> dict[str, str]:
    """Tokens refused for each cause the log tells apart, by the cause's first words."""
    from realtime.tokens import TOKEN_SALT, token_fingerprint

    def claims(user: Any, age: float = 0) -> dict[str, Any]:
        return {"u": user.pk, "f": token_fingerprint(user), "t": int(time.time() - age)}

    old = get_user_model().objects.create_user(username="old")
    inactive, inactive_token = make_member("inactive")
    inactive.is_active = False
    inactive.save()
    renamed, renamed_token = make_member("renamed")
    renamed.username = "renamed-since"
    renamed.save()
    return {
        "malformed": "garbage",
        "its signature is not this project's": signing.dumps(
            claims(old), salt=TOKEN_SALT, key="another project's key"
        ),
        "expired": signing.dumps(claims(old, age=86_400), salt=TOKEN_SALT),
        f"account {inactive.pk!r} is inactive": inactive_token,
        f"account {renamed.pk!r} changed its username or email": renamed_token,
    }


async def test_the_log_tells_why_a_token_was_refused_the_client_hears_one_reason(
    live_servers: LiveServers, ws: Clients
) -> None:
    server = server_named(live_servers, "token-causes")  # used by this test only
    tokens = await off_loop(refused_tokens)
    for token in tokens.values():
        client = await ws.connect(server)
        await client.authenticate(token)
        await assert_refused(client, "Invalid authentication token")
    log = await read_log(server)
    for cause in tokens:
        assert f"realtime: refused a socket: Invalid authentication token: {cause}" in log, log


async def test_repeated_bad_input_log_lines_are_rate_limited(
    live_servers: LiveServers, ws: Clients
) -> None:
    server = server_named(live_servers, "log-flood")  # used by this test only
    refusals = 70
    for _ in range(refusals):
        client = await ws.connect(server)
        await client.send_raw(b"\x00\x01")
        await assert_refused(client, "Invalid authentication format")
        await client.close()
    lines = [line for line in (await read_log(server)).splitlines() if "realtime" in line]
    logged = [line for line in lines if "Invalid authentication format" in line]
    assert 0 < len(logged) < refusals
