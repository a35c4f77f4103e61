"""Ids the application gives as text reach the same sockets as the ids themselves, end to end.

A scope or an account named ``"3"`` where the key is the integer ``3`` (an id read from a URL,
a form, a JSON body) is the one of key ``3``: ``broadcast_to_scope`` reaches that scope's
sockets, and ``exclude_user_ids`` / ``audience`` leave out or keep exactly those accounts. Real
daphne worker, real clients; absence is proven with a marker sent afterwards.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model

from realtime.auth import issue_token
from realtime.broadcast import broadcast_to_scope
from tests.helpers import off_loop
from tests.live import Client, Clients, LiveServers
from tests.testapp.models import Membership, Workspace

pytestmark = pytest.mark.django_db(transaction=True)

SAID = "test.said"
MARKER = "test.marker"


def members() -> tuple[Workspace, list[Any], list[str]]:
    """A workspace and two members, ann and bob, with their tokens."""
    workspace = Workspace.objects.create(name="Acme", slug="acme")
    users = []
    for name in ("ann", "bob"):
        user = get_user_model().objects.create_user(username=name)
        Membership.objects.create(workspace=workspace, user=user)
        users.append(user)
    return workspace, users, [issue_token(user) for user in users]


async def said_before_marker(client: Client) -> list[Any]:
    frames = await client.frames_until(MARKER)
    return [frame["data"] for frame in frames if frame["type"] == SAID]


async def test_a_scope_named_by_the_text_of_its_integer_key_is_heard_by_its_sockets(
    live_servers: LiveServers, ws: Clients
) -> None:
    server = live_servers.get()
    workspace, _, tokens = await off_loop(members)
    assert isinstance(workspace.pk, int)
    clients = [await ws.authenticated(server, token, scope="acme") for token in tokens]
    await off_loop(broadcast_to_scope, str(workspace.pk), SAID, {"n": 1})
    await off_loop(broadcast_to_scope, workspace.pk, MARKER, {})
    for client in clients:
        assert await said_before_marker(client) == [{"n": 1}]


async def test_accounts_excluded_or_kept_by_the_text_of_their_integer_keys_are_those_accounts(
    live_servers: LiveServers, ws: Clients
) -> None:
    server = live_servers.get()
    workspace, (_, bob), tokens = await off_loop(members)
    ann_s, bob_s = [await ws.authenticated(server, token, scope="acme") for token in tokens]
    scope = workspace.pk
    await off_loop(broadcast_to_scope, scope, SAID, {"n": 1}, exclude_user_ids=[str(bob.pk)])
    await off_loop(broadcast_to_scope, scope, SAID, {"n": 2}, audience=[str(bob.pk)])
    await off_loop(broadcast_to_scope, workspace.pk, MARKER, {})
    assert await said_before_marker(ann_s) == [{"n": 1}]
    assert await said_before_marker(bob_s) == [{"n": 2}]
