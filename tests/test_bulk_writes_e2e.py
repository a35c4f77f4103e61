"""Over real sockets on a real daphne: what bulk writes announce is what readers hear, and
nobody else hears anything (each absence proved by a marker sent afterwards)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import F

from realtime.auth import issue_token
from realtime.broadcast import broadcast_to_user
from tests.helpers import off_loop
from tests.live import Client, Clients, LiveServers
from tests.testapp.models import Membership, Notification, Ticket, Workspace

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("each_transport")]


def member(username: str, *workspaces: Workspace) -> tuple[Any, str]:
    user = get_user_model().objects.create_user(username=username)
    for workspace in workspaces:
        Membership.objects.create(workspace=workspace, user=user)
    return user, issue_token(user)


def workspace(slug: str) -> Workspace:
    return Workspace.objects.create(name=slug.title(), slug=slug)


async def heard(client: Client, user: Any) -> list[dict[str, Any]]:
    """What the client received before a marker sent to its account now."""
    await off_loop(broadcast_to_user, user.pk, "test.marker", None)
    return await client.frames_until("test.marker")


def shapes(frames: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [(frame["type"], (frame["data"] or {}).get("id")) for frame in frames]


async def readers(
    ws: Clients, live_servers: LiveServers, *scopes: str
) -> tuple[dict[str, tuple[Any, Client]], dict[str, Workspace]]:
    """One workspace per slug and one reader of each, subscribed to tickets and notifications."""
    places = {slug: await off_loop(workspace, slug) for slug in scopes}
    clients = {}
    for slug, place in places.items():
        user, token = await off_loop(member, f"{slug}-reader", place)
        # Subscribed before auth_success: a separate subscribe has no answer to wait for.
        channels = ["ticket", "notification"]
        client = await ws.authenticated(live_servers.get(), token, scope=slug, channels=channels)
        clients[slug] = (user, client)
    return clients, places


async def test_an_update_is_heard_by_the_rows_readers_only(
    live_servers: LiveServers, ws: Clients
) -> None:
    clients, places = await readers(ws, live_servers, "acme", "beta")
    made = [
        await off_loop(Ticket.objects.create, workspace=places["acme"], title=f"t{i}")
        for i in range(3)
    ]
    for user, client in clients.values():
        await heard(client, user)

    await off_loop(Ticket.objects.filter(workspace=places["acme"]).update, points=F("points") + 2)

    acme_user, acme_client = clients["acme"]
    frames = await heard(acme_client, acme_user)
    assert shapes(frames) == [("ticket.updated", ticket.pk) for ticket in made]
    assert all(frame["data"]["points"] == 2 for frame in frames)
    assert all(frame["changed"] == ["points"] for frame in frames)
    beta_user, beta_client = clients["beta"]
    assert await heard(beta_client, beta_user) == []


async def test_an_update_moving_rows_is_heard_as_leave_and_enter(
    live_servers: LiveServers, ws: Clients
) -> None:
    clients, places = await readers(ws, live_servers, "acme", "beta")
    ticket = await off_loop(Ticket.objects.create, workspace=places["acme"], title="t")
    for user, client in clients.values():
        await heard(client, user)

    await off_loop(Ticket.objects.filter(pk=ticket.pk).update, workspace=places["beta"])

    acme_user, acme_client = clients["acme"]
    (left,) = await heard(acme_client, acme_user)
    assert (left["type"], left["data"], left["moved"]) == (
        "ticket.deleted",
        {"model": "ticket", "id": ticket.pk},
        True,
    )
    beta_user, beta_client = clients["beta"]
    (entered,) = await heard(beta_client, beta_user)
    assert (entered["type"], entered["data"]["title"], entered["moved"]) == (
        "ticket.created",
        "t",
        True,
    )


async def test_bulk_create_and_bulk_update_are_heard(
    live_servers: LiveServers, ws: Clients
) -> None:
    clients, places = await readers(ws, live_servers, "acme")
    user, client = clients["acme"]
    acme = places["acme"]

    made = await off_loop(
        Ticket.objects.bulk_create, [Ticket(workspace=acme, title=f"t{i}") for i in range(2)]
    )
    frames = await heard(client, user)
    # MySQL's features ask the server: off the event loop.
    if await off_loop(lambda: connection.features.can_return_rows_from_bulk_insert):
        assert shapes(frames) == [("ticket.created", ticket.pk) for ticket in made]
    else:
        assert shapes(frames) == [("ticket.created", None)]

    stored = await off_loop(lambda: list(Ticket.objects.order_by("pk")))
    stored[1].title = "renamed"
    await off_loop(Ticket.objects.bulk_update, stored, ["title"])
    (frame,) = await heard(client, user)
    assert (frame["type"], frame["data"]["title"], frame["changed"]) == (
        "ticket.updated",
        "renamed",
        ["title"],
    )


async def test_past_the_bulk_limit_readers_hear_one_truncated_event(
    live_servers: LiveServers, ws: Clients, settings: Any
) -> None:
    settings.REALTIME_BULK_LIMIT = 1
    clients, places = await readers(ws, live_servers, "acme")
    user, client = clients["acme"]
    made = [
        await off_loop(Ticket.objects.create, workspace=places["acme"], title=f"t{i}")
        for i in range(3)
    ]
    await heard(client, user)

    await off_loop(Ticket.objects.update, done=True)

    first, folded = await heard(client, user)
    assert shapes([first]) == [("ticket.updated", made[0].pk)]
    assert (folded["type"], folded["data"], folded["truncated"]) == ("ticket.updated", None, True)


async def test_an_account_changed_in_bulk_hears_its_row_leave(
    live_servers: LiveServers, ws: Clients
) -> None:
    ann, ann_token = await off_loop(member, "ann")
    bob, bob_token = await off_loop(member, "bob")
    clients = {}
    for user, token in ((ann, ann_token), (bob, bob_token)):
        clients[user] = await ws.authenticated(live_servers.get(), token, channels=["notification"])
    note = await off_loop(Notification.objects.create, user=ann, text="hi")
    await heard(clients[ann], ann)

    await off_loop(Notification.objects.filter(pk=note.pk).update, user=bob)

    assert shapes(await heard(clients[ann], ann)) == [("notification.deleted", note.pk)]
    assert shapes(await heard(clients[bob], bob)) == [("notification.created", note.pk)]
