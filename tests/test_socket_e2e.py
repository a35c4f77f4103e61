"""A write in one process reaches exactly the right sockets served by daphne in another."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model

from realtime.auth import issue_token
from realtime.broadcast import broadcast_to_user
from tests.helpers import off_loop
from tests.live import Client, Clients, LiveServers
from tests.testapp.models import (
    Company,
    Contact,
    Membership,
    Notification,
    PrivateNote,
    Workspace,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("each_transport")]


def make_member(username: str, *workspaces: Workspace) -> tuple[Any, str]:
    user = get_user_model().objects.create_user(username=username)
    for workspace in workspaces:
        Membership.objects.create(workspace=workspace, user=user)
    return user, issue_token(user)


def make_workspace(slug: str) -> Workspace:
    return Workspace.objects.create(name=slug.title(), slug=slug)


async def marker_for(client: Client, user_id: Any) -> list[dict[str, Any]]:
    """Send a marker to the user and return what the client received before it."""
    await off_loop(broadcast_to_user, user_id, "test.marker", None)
    return await client.frames_until("test.marker")


async def test_a_write_in_another_process_reaches_the_subscribed_socket(
    live_servers: LiveServers, ws: Clients
) -> None:
    workspace = await off_loop(make_workspace, "acme")
    user, token = await off_loop(make_member, "ann", workspace)
    client = await ws.authenticated(live_servers.get(), token, scope="acme")
    await client.send("subscribe", {"channels": ["contact"]})
    await marker_for(client, user.pk)  # the subscription is in place once the marker is back
    contact = await off_loop(Contact.objects.create, workspace=workspace, name="Zed")
    frame = await client.wait_for(lambda f: f["type"] == "contact.created")
    assert frame == {
        "type": "contact.created",
        "data": {
            "model": "contact",
            "id": contact.pk,
            "name": "Zed",
            "company": None,
            "born": None,
            "score": None,
        },
        "scope_id": workspace.pk,
    }
    await client.close()


async def test_an_unsubscribed_socket_hears_nothing(live_servers: LiveServers, ws: Clients) -> None:
    workspace = await off_loop(make_workspace, "acme")
    user, token = await off_loop(make_member, "ann", workspace)
    client = await ws.authenticated(live_servers.get(), token, scope="acme")
    await client.send("subscribe", {"channel": "company"})
    await marker_for(client, user.pk)
    await off_loop(Contact.objects.create, workspace=workspace, name="Unheard")
    await off_loop(Company.objects.create, workspace=workspace, name="Heard")
    frame = await client.wait_for(lambda f: f["type"] == "company.created")
    assert [f["type"] for f in client.received if f["type"].startswith("contact.")] == []
    assert frame["data"]["name"] == "Heard"
    await client.close()


async def test_two_worker_processes_each_deliver_to_their_sockets(
    live_servers: LiveServers, ws: Clients
) -> None:
    workspace = await off_loop(make_workspace, "acme")
    user, token = await off_loop(make_member, "ann", workspace)
    first = await ws.authenticated(live_servers.get("worker-1"), token, scope="acme")
    second = await ws.authenticated(live_servers.get("worker-2"), token, scope="acme")
    for client in (first, second):
        await client.send("subscribe", {"channels": ["contact"]})
        await marker_for(client, user.pk)
    await off_loop(Contact.objects.create, workspace=workspace, name="Everywhere")
    for client in (first, second):
        frame = await client.wait_for(lambda f: f["type"] == "contact.created")
        assert frame["data"]["name"] == "Everywhere"
        await client.close()


async def test_record_and_relation_channels_narrow_what_a_socket_hears(
    live_servers: LiveServers, ws: Clients
) -> None:
    workspace = await off_loop(make_workspace, "acme")
    user, token = await off_loop(make_member, "ann", workspace)
    company = await off_loop(Company.objects.create, workspace=workspace, name="Initech")
    watched = await off_loop(Contact.objects.create, workspace=workspace, name="Seven")
    other = await off_loop(Contact.objects.create, workspace=workspace, name="Other")
    client = await ws.authenticated(live_servers.get(), token, scope="acme")
    await client.send("subscribe", {"channels": [f"contact:{watched.pk}", f"company:{company.pk}"]})
    await marker_for(client, user.pk)
    other.name = "Other renamed"
    await off_loop(other.save)
    watched.name = "Seven renamed"
    await off_loop(watched.save)
    hired = await off_loop(
        Contact.objects.create, workspace=workspace, company=company, name="Hired"
    )
    heard = await marker_for(client, user.pk)
    assert [(f["type"], f["data"]["id"]) for f in heard] == [
        ("contact.updated", watched.pk),
        ("contact.created", hired.pk),
    ]
    await client.close()


async def test_account_events_reach_every_socket_of_the_account_whatever_its_scope(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme, beta = await off_loop(make_workspace, "acme"), await off_loop(make_workspace, "beta")
    user, token = await off_loop(make_member, "ann", acme, beta)
    in_acme = await ws.authenticated(live_servers.get(), token, scope="acme")
    in_beta = await ws.authenticated(live_servers.get(), token, scope="beta")
    nowhere = await ws.authenticated(live_servers.get(), token)
    note = await off_loop(Notification.objects.create, user=user, text="for you")
    for client in (in_acme, in_beta, nowhere):
        frame = await client.wait_for(lambda f: f["type"] == "notification.created")
        assert frame == {
            "type": "notification.created",
            "data": {"model": "notification", "id": note.pk, "text": "for you"},
        }
        await client.close()


async def test_guarded_rows_reach_only_their_readers(
    live_servers: LiveServers, ws: Clients
) -> None:
    workspace = await off_loop(make_workspace, "acme")
    author, author_token = await off_loop(make_member, "ann", workspace)
    other, other_token = await off_loop(make_member, "bob", workspace)
    clients = {
        author.pk: await ws.authenticated(live_servers.get(), author_token, scope="acme"),
        other.pk: await ws.authenticated(live_servers.get(), other_token, scope="acme"),
    }
    for user_id, client in clients.items():
        await client.send("subscribe", {"channels": ["private_note"]})
        await marker_for(client, user_id)
    note = await off_loop(
        PrivateNote.objects.create, workspace=workspace, author=author, title="mine"
    )
    # Deliveries of create and update ask who may read the row: let it exist meanwhile.
    await clients[author.pk].wait_for(lambda f: f["type"] == "private_note.created")
    await off_loop(note.delete)
    for user_id, client in clients.items():
        await marker_for(client, user_id)
    notes = {
        user_id: [f["type"] for f in client.received if f["type"].startswith("private_note")]
        for user_id, client in clients.items()
    }
    assert notes == {
        author.pk: ["private_note.created", "private_note.deleted"],
        other.pk: [],
    }
    for client in clients.values():
        await client.close()


async def test_a_socket_reading_several_scopes_gets_each_events_scope_id(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme, beta = await off_loop(make_workspace, "acme"), await off_loop(make_workspace, "beta")
    user, token = await off_loop(make_member, "ann", acme, beta)
    client = await ws.connect(live_servers.get())
    answer = await client.authenticate(token, scopes=["beta", "acme"])
    assert answer == {
        "type": "auth_success",
        "data": {"user_id": user.pk, "scope": "beta", "scopes": ["beta", "acme"]},
    }
    await client.send("subscribe", {"channels": ["company"]})
    await marker_for(client, user.pk)
    await off_loop(Company.objects.create, workspace=acme, name="A")
    await off_loop(Company.objects.create, workspace=beta, name="B")
    heard = await marker_for(client, user.pk)
    assert sorted((f["data"]["name"], f["scope_id"]) for f in heard) == [
        ("A", acme.pk),
        ("B", beta.pk),
    ]
    await client.close()
