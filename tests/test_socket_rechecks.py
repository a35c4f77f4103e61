"""Sockets are checked again while they stay open: periodically, and at once on request."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction
from django.test import override_settings

from realtime.auth import RealtimeAuth, issue_token
from realtime.broadcast import broadcast_to_users, recheck_users
from realtime.sockets.manager import get_manager
from realtime.testing import in_thread, realtime_client
from tests.live import Clients, LiveServers, sockets_of, wait_for_socket
from tests.testapp.models import Company, Membership, Notification, Workspace

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("each_transport")]

User = get_user_model()


def setup_member(username: str, *slugs: str) -> tuple[Any, str, list[Workspace]]:
    workspaces = [
        Workspace.objects.get_or_create(slug=slug, defaults={"name": slug})[0] for slug in slugs
    ]
    user = User.objects.create_user(username=username, email=f"{username}@example.com")
    for workspace in workspaces:
        Membership.objects.create(workspace=workspace, user=user)
    return user, issue_token(user), workspaces


async def test_a_bearer_that_no_longer_stands_is_refused_and_closed(
    live_servers: LiveServers, ws: Clients
) -> None:
    user, token, _ = await in_thread(setup_member, "ann", "acme")
    client = await ws.authenticated(live_servers.get(), token, scope="acme")
    user.email = "changed@example.com"  # tokens remember the email: this one stops standing
    await in_thread(user.save)
    assert await client.closed_with() == 1008
    assert client.received[-1] == {
        "type": "auth_error",
        "data": {"message": "Invalid authentication token"},
    }


@pytest.mark.parametrize("only", [(), ("pk",)], ids=["whole", "loaded-with-only"])
async def test_a_deleted_membership_leaves_the_scope_but_keeps_the_socket(
    live_servers: LiveServers, ws: Clients, only: tuple[str, ...]
) -> None:
    user, token, (acme,) = await in_thread(setup_member, "ann", "acme")
    server = live_servers.get()
    client = await ws.authenticated(server, token, scope="acme")
    await client.send("subscribe", {"channels": ["company"]})
    rows = Membership.objects.filter(user=user, workspace=acme)
    await in_thread((rows.only(*only) if only else rows).delete)
    await server.wait_for_state(
        lambda state: [s["scopes"] for s in sockets_of(state, user.pk)] == [[]], timeout=5
    )
    await in_thread(Company.objects.create, workspace=acme, name="Not for ann any more")
    note = await in_thread(Notification.objects.create, user=user, text="still for ann")
    frame = await client.wait_for(lambda f: f["type"] == "notification.created")
    assert frame["data"]["id"] == note.pk
    assert [f["type"] for f in client.received] == ["auth_success", "notification.created"]


def remove_then_write(user: Any, workspace: Workspace) -> int:
    """A member removed, then a write in the scope she left: one transaction."""
    with transaction.atomic():
        Membership.objects.filter(user=user, workspace=workspace).delete()
        return Company.objects.create(workspace=workspace, name="After ann left").pk


def deactivate_then_write(user: Any, workspace: Workspace) -> None:
    with transaction.atomic():
        user.is_active = False
        user.save()
        Company.objects.create(workspace=workspace, name="After ann was deactivated")


async def test_a_write_in_the_transaction_that_removed_a_member_never_reaches_her(
    live_servers: LiveServers, ws: Clients
) -> None:
    ann, ann_token, (acme,) = await in_thread(setup_member, "ann", "acme")
    bob, bob_token, _ = await in_thread(setup_member, "bob", "acme")
    server = live_servers.get()
    ann_client = await ws.authenticated(server, ann_token, scope="acme", channels=["company"])
    bob_client = await ws.authenticated(server, bob_token, scope="acme", channels=["company"])
    pk = await in_thread(remove_then_write, ann, acme)
    await in_thread(broadcast_to_users, [ann.pk, bob.pk], "test.marker", None)
    bob_heard = await bob_client.frames_until("test.marker")
    assert [f["data"]["id"] for f in bob_heard if f["type"] == "company.created"] == [pk]
    assert await ann_client.frames_until("test.marker") == []


async def test_a_write_in_the_transaction_that_deactivated_an_account_never_reaches_it(
    live_servers: LiveServers, ws: Clients
) -> None:
    ann, token, (acme,) = await in_thread(setup_member, "ann", "acme")
    client = await ws.authenticated(live_servers.get(), token, scope="acme", channels=["company"])
    await in_thread(deactivate_then_write, ann, acme)
    assert await client.closed_with() == 1008
    assert [frame["type"] for frame in client.received] == ["auth_success", "auth_error"]


async def test_a_renamed_slug_keeps_the_socket_in_its_scope(
    live_servers: LiveServers, ws: Clients
) -> None:
    user, token, (acme,) = await in_thread(setup_member, "ann", "acme")
    server = live_servers.get()
    client = await ws.authenticated(server, token, scope="acme")
    acme.slug = "acme-renamed"
    await in_thread(acme.save)
    await in_thread(recheck_users, [user.pk])
    state = await server.wait_for_state(
        lambda state: [s["slugs"] for s in sockets_of(state, user.pk)] == [["acme-renamed"]],
        timeout=5,
    )
    assert [s["scopes"] for s in sockets_of(state, user.pk)] == [[acme.pk]]
    await client.send("subscribe", {"channels": ["company"]})
    await wait_for_socket(server, user.pk, channels=["company"])
    await in_thread(Company.objects.create, workspace=acme, name="Still heard")
    frame = await client.wait_for(lambda f: f["type"] == "company.created")
    assert frame["scope_id"] == acme.pk


async def test_periodic_rechecks_catch_writes_no_signal_saw(
    live_servers: LiveServers, ws: Clients
) -> None:
    user, token, _ = await in_thread(setup_member, "ann", "acme")
    server = live_servers.get("fast-recheck", REALTIME_RECHECK_INTERVAL=0.3)
    client = await ws.authenticated(server, token, scope="acme")
    # update() sends no signal, so no recheck is requested: only the periodic round sees it.
    await in_thread(User.objects.filter(pk=user.pk).update, is_active=False)
    assert await client.closed_with() == 1008
    assert client.received[-1]["data"] == {"message": "Invalid authentication token"}


class GatedAuth(RealtimeAuth):
    """Holds ``user_of_token`` (asked by rechecks, not by watch) until the test opens it."""

    armed = False
    entered = threading.Event()
    gate = threading.Event()

    def user_of_token(self, token: str) -> Any:
        if GatedAuth.armed:
            GatedAuth.entered.set()
            GatedAuth.gate.wait(10)
        return super().user_of_token(token)


@override_settings(REALTIME_AUTH="tests.test_socket_rechecks.GatedAuth")
async def test_a_late_recheck_answer_never_undoes_a_newer_watch() -> None:
    user, _, (acme, beta) = await in_thread(setup_member, "ann", "acme", "beta")
    async with realtime_client(user, scope="acme") as client:
        manager = get_manager()
        (socket,) = [s for s in manager.index.sockets if s.user_id == user.pk]
        GatedAuth.armed = True
        GatedAuth.entered.clear()
        GatedAuth.gate.clear()
        try:
            manager.request_recheck([user.pk])
            assert await in_thread(GatedAuth.entered.wait, 10)
            await client.watch(scope="beta")
            assert list(socket.scopes.values()) == ["beta"]
        finally:
            GatedAuth.gate.set()
            GatedAuth.armed = False
        await client.subscribe("company")  # its marker comes after the recheck's answer
        assert list(socket.scopes.values()) == ["beta"]
        await in_thread(Company.objects.create, workspace=acme, name="A")
        await in_thread(Company.objects.create, workspace=beta, name="B")
        heard = await client.frames_before_marker()
        assert [(f["data"]["name"], f["scope_id"]) for f in heard] == [("B", beta.pk)]
