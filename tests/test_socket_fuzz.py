"""Whatever an authenticated client sends, the outcome is one the protocol documents.

A real daphne server (``tests.live``) serves two sockets of two accounts. The "victim" gets
random and malformed frames from Hypothesis: arbitrary text, JSON of arbitrary shapes,
frames that look valid (the protocol's types and others, with odd ``data``), deeply nested
JSON, binary frames and strings around and past ``REALTIME_MAX_FRAME_SIZE``. After each
example a marker event is published to both accounts:

* the victim either hears it (still open, and nothing else was said: no frame of the
  protocol is answered) or was closed with 1008 or 1009, never another code — it is then
  connected again for the next example;
* the "bystander" hears the marker and nothing else, every time;
* the server's log shows no traceback and no error.

Frames stay under daphne's own 1 MiB message cap: past it autobahn drops the TCP connection
itself, a server limit the deploy guide covers, not the protocol.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import websockets
from django.contrib.auth import get_user_model
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from realtime.auth import issue_token
from realtime.broadcast import broadcast_to_users
from tests.helpers import off_loop
from tests.live import Client, LiveServers, Server
from tests.testapp.models import Membership, Workspace

pytestmark = pytest.mark.django_db(transaction=True)

#: The server's ``REALTIME_MAX_FRAME_SIZE`` (the default).
MAX_FRAME_SIZE = 65536
#: Close codes the protocol documents for what a client sends once authenticated.
DOCUMENTED_CLOSES = {1008, 1009}
#: What the server must never log.
FAILURE_IN_LOG = re.compile(r"Traceback|\b(ERROR|CRITICAL)\b")

# Strategies ----------------------------------------------------------------------------------

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=16,
)
slugs = st.sampled_from(
    ["acme", "beta", "gamma", "ACME", "", " acme", "acme\x00", "\ud800", "acme\udfff"]
)
scope_values = slugs | json_values
scope_lists = st.lists(scope_values, max_size=5)
channel_names = st.sampled_from(
    ["contact", "contact:1", "company", "company:", "private_note:x", "plain", ":", ""]
) | st.text(max_size=30)
channel_values = channel_names | json_values
frame_data = (
    st.fixed_dictionaries(
        {},
        optional={
            "scope": scope_values,
            "scopes": scope_lists | scope_values,
            "workspace": scope_values,
            "workspaces": scope_lists | scope_values,
            "channels": st.lists(channel_values, max_size=8) | json_values,
            "channel": channel_values,
            "token": st.text(max_size=40) | json_values,
        },
    )
    | json_values
)
protocol_types = st.sampled_from(
    ["watch", "subscribe", "unsubscribe", "heartbeat", "authenticate", "auth_success"]
)
frame_types = (
    st.sampled_from(["auth_error", "contact.created", "test.marker", "", "WATCH"])
    | st.text(max_size=20)
    | json_values
)


def frame_of(type_: Any, data: Any) -> str:
    return json.dumps({"type": type_, "data": data})


def nested_lists(depth: int) -> str:
    return "[" * depth + "]" * depth


def nested_objects(depth: int) -> str:
    return '{"type":' * depth + "null" + "}" * depth


def many_channels(count: int) -> str:
    return frame_of("subscribe", {"channels": [f"contact:{i}" for i in range(count)]})


def repeated(character: str, length: int) -> str:
    return character * length


#: JSON objects, as the protocol's frames are: most look valid, with odd ``data``.
object_frames: st.SearchStrategy[str] = st.one_of(
    st.builds(frame_of, protocol_types, frame_data),
    st.builds(frame_of, protocol_types, frame_data),
    st.builds(frame_of, frame_types, frame_data),
    st.dictionaries(st.sampled_from(["type", "data", "Type", "extra"]), json_values).map(
        json.dumps
    ),
    st.integers(1, 8000).map(many_channels),
)
#: Frames that are not JSON objects, or too large: each ends the socket once authenticated.
disruptive_frames: st.SearchStrategy[str | bytes] = st.one_of(
    st.text(max_size=200),
    json_values.map(json.dumps),
    st.integers(1, MAX_FRAME_SIZE // 2).map(nested_lists),
    st.integers(1, MAX_FRAME_SIZE // 9).map(nested_objects),
    st.builds(
        repeated,
        st.characters(codec="utf-8"),
        st.sampled_from([MAX_FRAME_SIZE - 1, MAX_FRAME_SIZE, MAX_FRAME_SIZE + 1, 100_000]),
    ),
    st.binary(max_size=64),
)


def then(frames: list[str], last: str | bytes | None) -> list[str | bytes]:
    return [*frames, *([] if last is None else [last])]


#: One example: up to four object frames, then (half the time) one disruptive frame.
examples: st.SearchStrategy[list[str | bytes]] = st.builds(
    then, st.lists(object_frames, max_size=4), st.none() | disruptive_frames
).filter(bool)


# The session under test ------------------------------------------------------------------------


@dataclass
class Fuzzing:
    """The server, the two accounts and their sockets, across the examples of one test."""

    server: Server
    victim_id: int
    victim_token: str
    bystander_id: int
    bystander: Client
    log_offset: int
    victim: Client | None = None
    examples: int = 0
    closes: list[int] = field(default_factory=list)
    opened: list[Client] = field(default_factory=list)

    async def open_victim(self) -> Client:
        if self.victim is None:
            client = await Client.connect(self.server)
            self.opened.append(client)
            answer = await client.authenticate(self.victim_token, scope="acme")
            assert answer["type"] == "auth_success", answer
            await client.send("subscribe", {"channels": ["contact", "company:1"]})
            self.victim = client
        return self.victim

    async def run(self, frames: list[str | bytes]) -> None:
        """Send one example's frames, then check every outcome; a failed example leaves a
        fresh victim and a clean log region to the next one (Hypothesis replays examples)."""
        self.examples += 1
        marker = {"type": "test.marker", "data": {"n": self.examples}}
        try:
            await self.check(frames, marker)
        except BaseException:
            if self.victim is not None:
                await self.victim.close()
                self.victim = None
            raise
        finally:
            self.log_offset = await asyncio.to_thread(os.path.getsize, self.server.log.name)

    async def check(self, frames: list[str | bytes], marker: dict[str, Any]) -> None:
        victim = await self.open_victim()
        for frame in frames:
            try:
                await victim.send_raw(frame)
            except websockets.ConnectionClosed:
                break
        await off_loop(
            broadcast_to_users,
            [self.victim_id, self.bystander_id],
            "test.marker",
            marker["data"],
        )

        code = await self.outcome(victim, marker)
        if code is not None:
            self.closes.append(code)
            self.victim = None
        await self.marker_reaches(self.bystander, marker)
        assert code is None or code in DOCUMENTED_CLOSES, f"the victim was closed with {code}"
        self.check_log()

    async def outcome(self, victim: Client, marker: dict[str, Any]) -> int | None:
        """``None`` when the victim heard the marker (and nothing else), else its close code."""
        try:
            await self.marker_reaches(victim, marker)
        except websockets.ConnectionClosed:
            received = victim.connection.protocol.close_rcvd
            assert received is not None, "the server dropped the victim without a close frame"
            return int(received.code)
        return None

    @staticmethod
    async def marker_reaches(client: Client, marker: dict[str, Any]) -> None:
        """Read up to ``marker``: anything else said before it is a failure (markers of
        earlier examples that failed before reading theirs excepted)."""
        while True:
            frame = await client.next_frame()
            if frame == marker:
                return
            assert frame.get("type") == "test.marker", frame
            assert frame["data"]["n"] < marker["data"]["n"], frame

    def check_log(self) -> None:
        """No traceback and no error in what the server logged during this example."""
        with open(self.server.log.name, "rb") as file:
            file.seek(self.log_offset)
            log = file.read().decode(errors="replace")
        failures = [line for line in log.splitlines() if FAILURE_IN_LOG.search(line)]
        assert failures == [], log

    async def close(self) -> None:
        for client in [*self.opened, self.bystander]:
            await client.close()


def make_accounts() -> tuple[Any, str, Any, str]:
    acme = Workspace.objects.create(name="Acme", slug="acme")
    beta = Workspace.objects.create(name="Beta", slug="beta")
    user_model = get_user_model()
    victim = user_model.objects.create_user(username="victim")
    bystander = user_model.objects.create_user(username="bystander")
    for workspace, user in ((acme, victim), (beta, victim), (acme, bystander)):
        Membership.objects.create(workspace=workspace, user=user)
    return victim, issue_token(victim), bystander, issue_token(bystander)


@pytest.fixture
async def fuzzing(live_servers: LiveServers) -> AsyncIterator[Fuzzing]:
    victim, victim_token, bystander, bystander_token = await off_loop(make_accounts)
    server = live_servers.get("fuzz")
    log_offset = await asyncio.to_thread(os.path.getsize, server.log.name)
    watcher = await Client.connect(server)
    answer = await watcher.authenticate(bystander_token, scope="acme")
    assert answer["type"] == "auth_success", answer
    await watcher.send("subscribe", {"channels": ["contact"]})
    session = Fuzzing(
        server=server,
        victim_id=victim.pk,
        victim_token=victim_token,
        bystander_id=bystander.pk,
        bystander=watcher,
        log_offset=log_offset,
    )
    yield session
    await session.close()


@settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(frames=examples)
# Slugs no scope can have (a NUL byte: PostgreSQL refuses it in a text parameter).
@example(frames=[frame_of("watch", {"scope": "acme\x00"})])
@example(frames=[frame_of("watch", {"scopes": ["beta", "acme\x00"]})])
# Nor a lone UTF-16 surrogate: valid JSON, but no driver can encode it.
@example(frames=[frame_of("watch", {"scope": "\ud800"})] * 4)
@example(frames=[frame_of("watch", {"scopes": ["beta", "\udc00acme"]})])
@example(frames=[frame_of("subscribe", {"channels": ["contact:\ud800", "\ud800"]})])
async def test_any_frame_an_authenticated_client_sends_ends_in_a_documented_outcome(
    fuzzing: Fuzzing, frames: list[str | bytes]
) -> None:
    await fuzzing.run(frames)
