"""An account made inactive hears nothing committed after it, on every transport.

Saving ``is_active=False`` asks every worker to recheck the account's sockets, and each
worker holds their frames from that request (which arrives in publication order) until the
recheck answers: the socket gets ``auth_error`` and 1008, and none of the events committed
after the deactivation. ``QuerySet.update(is_active=False)`` sends no signal: the delivery-time
audience check still refuses the account every guarded row, and ``recheck_users`` closes it.
A removed membership is held the same way: nothing of that scope committed after it arrives;
a recheck the account passes lets every held frame through, in order. Signing out of a session
(Django's ``logout``) refuses at once the sockets whose token the token view issued to it, and
only those. Real daphne workers, real clients.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client as HttpClient
from django.urls import include, path

from realtime.auth import issue_token
from realtime.broadcast import broadcast_to_users, recheck_users
from realtime.testing import in_thread
from tests.live import Client, Clients, LiveServers
from tests.testapp.models import Contact, Membership, PrivateNote, Workspace

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("each_transport")]

urlpatterns = [path("realtime/", include("realtime.urls"))]

User = get_user_model()
TOKEN_REFUSED = {"type": "auth_error", "data": {"message": "Invalid authentication token"}}


def make_members() -> tuple[Workspace, Any, Any]:
    acme = Workspace.objects.create(name="Acme", slug="acme")
    ann = User.objects.create_user(username="ann")
    bob = User.objects.create_user(username="bob")
    for user in (ann, bob):
        Membership.objects.create(workspace=acme, user=user)
    return acme, ann, bob


def deactivate_then_write(ann: Any, acme: Workspace) -> list[int]:
    """Save the deactivation, then commit writes at once, as a busy application would."""
    ann.is_active = False
    ann.save()
    return [Contact.objects.create(workspace=acme, name=f"after {n}").pk for n in range(5)]


async def test_events_committed_after_a_saved_deactivation_never_reach_the_socket(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme, ann, bob = await in_thread(make_members)
    server = live_servers.get()
    ann_socket, bob_socket = [
        await ws.authenticated(
            server, await in_thread(issue_token, user), scope="acme", channels=["contact"]
        )
        for user in (ann, bob)
    ]
    await in_thread(Contact.objects.create, workspace=acme, name="before")
    await ann_socket.wait_for(lambda f: f["type"] == "contact.created")

    written = await in_thread(deactivate_then_write, ann, acme)
    await in_thread(broadcast_to_users, [ann.pk, bob.pk], "test.marker", None)

    # Bob heard every write, then the marker: they were delivered, to those who may read them.
    before_marker = await bob_socket.frames_until("test.marker")
    assert [f["data"]["id"] for f in before_marker if f["type"] == "contact.created"][-5:] == (
        written
    )
    # Ann's socket was refused and closed, and heard none of them on the way.
    assert await ann_socket.closed_with() == 1008
    assert ann_socket.received[-1] == TOKEN_REFUSED
    assert [f["type"] for f in ann_socket.received] == [
        "auth_success",
        "contact.created",
        "auth_error",
    ]


def deactivate_by_update_then_write(ann: Any, acme: Workspace) -> int:
    User.objects.filter(pk=ann.pk).update(is_active=False)
    note = PrivateNote.objects.create(workspace=acme, author=ann, title="after", public=False)
    return note.pk


async def test_a_guarded_row_never_reaches_an_account_made_inactive_by_update(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme, ann, _ = await in_thread(make_members)
    server = live_servers.get()
    client = await ws.authenticated(
        server, await in_thread(issue_token, ann), scope="acme", channels=["private_note"]
    )
    await in_thread(PrivateNote.objects.create, workspace=acme, author=ann, title="before")
    await client.wait_for(lambda f: f["type"] == "private_note.created")

    await in_thread(deactivate_by_update_then_write, ann, acme)
    await in_thread(broadcast_to_users, [ann.pk], "test.marker", None)
    # update() sent no signal, so no recheck: the socket is open and hears the marker, but
    # the audience check at delivery refused the inactive author her own note.
    assert await client.frames_until("test.marker") == []


async def test_recheck_users_after_a_bulk_deactivation_closes_the_socket(
    live_servers: LiveServers, ws: Clients
) -> None:
    _, ann, _ = await in_thread(make_members)
    client = await ws.authenticated(
        live_servers.get(), await in_thread(issue_token, ann), scope="acme"
    )
    await in_thread(User.objects.filter(pk=ann.pk).update, is_active=False)
    await in_thread(recheck_users, [ann.pk])
    assert await client.closed_with() == 1008
    assert client.received[-1] == TOKEN_REFUSED


async def hearing_contacts(live_servers: LiveServers, ws: Clients) -> tuple[Workspace, Any, Client]:
    """Ann's socket in Acme, subscribed to contacts, once it heard one created there."""
    acme, ann, _ = await in_thread(make_members)
    client = await ws.authenticated(
        live_servers.get(), await in_thread(issue_token, ann), scope="acme", channels=["contact"]
    )
    await in_thread(Contact.objects.create, workspace=acme, name="before")
    await client.wait_for(lambda f: f["type"] == "contact.created")
    return acme, ann, client


def add_membership_then_write(ann: Any, acme: Workspace) -> list[int]:
    """A write that asks for a recheck the account passes, then writes at once."""
    beta = Workspace.objects.create(name="Beta", slug="beta")
    Membership.objects.create(workspace=beta, user=ann)
    return [Contact.objects.create(workspace=acme, name=f"after {n}").pk for n in range(5)]


async def test_frames_held_during_a_recheck_the_account_passes_all_arrive_in_order(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme, ann, client = await hearing_contacts(live_servers, ws)
    written = await in_thread(add_membership_then_write, ann, acme)
    await in_thread(broadcast_to_users, [ann.pk], "test.marker", None)
    heard = await client.frames_until("test.marker")
    assert [f["data"]["id"] for f in heard if f["type"] == "contact.created"] == written


def remove_membership_then_write(ann: Any, acme: Workspace) -> None:
    Membership.objects.filter(workspace=acme, user=ann).delete()
    for n in range(5):
        Contact.objects.create(workspace=acme, name=f"after {n}")


async def test_events_committed_after_a_membership_is_removed_never_reach_the_socket(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme, ann, client = await hearing_contacts(live_servers, ws)
    await in_thread(remove_membership_then_write, ann, acme)
    await in_thread(broadcast_to_users, [ann.pk], "test.marker", None)
    # The socket stays open for what is addressed to the account, and heard none of them.
    assert await client.frames_until("test.marker") == []


def signed_in(user: Any) -> tuple[HttpClient, str]:
    """A browser signed in as ``user`` (a session of its own), and the token realtime's token
    view answers it."""
    browser = HttpClient()
    browser.force_login(user)
    response = browser.get("/realtime/token")
    assert response.status_code == 200
    return browser, response.json()["token"]


def sign_out_then_write(browser: HttpClient, acme: Workspace) -> list[int]:
    browser.logout()
    return [Contact.objects.create(workspace=acme, name=f"after {n}").pk for n in range(3)]


@pytest.mark.urls(__name__)
async def test_signing_out_refuses_at_once_the_sockets_of_that_session_only(
    live_servers: LiveServers, ws: Clients, settings: Any
) -> None:
    settings.SESSION_ENGINE = "django.contrib.sessions.backends.cache"  # no table needed
    settings.MIDDLEWARE = [
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
    ]
    acme, ann, bob = await in_thread(make_members)
    server, elsewhere = live_servers.get(), live_servers.get("elsewhere")
    # The other worker holds none of Ann's sockets when she signs out.
    await ws.authenticated(elsewhere, await in_thread(issue_token, bob), scope="acme")
    (laptop, laptop_token), (_, phone_token) = [await in_thread(signed_in, ann) for _ in "ab"]
    laptop_socket, phone_socket = [
        await ws.authenticated(server, token, scope="acme", channels=["contact"])
        for token in (laptop_token, phone_token)
    ]
    await in_thread(Contact.objects.create, workspace=acme, name="before")
    for socket in (laptop_socket, phone_socket):
        await socket.wait_for(lambda f: f["type"] == "contact.created")

    written = await in_thread(sign_out_then_write, laptop, acme)
    await in_thread(broadcast_to_users, [ann.pk], "test.marker", None)

    # The other session's socket stays, and heard every write made after the sign-out.
    heard = await phone_socket.frames_until("test.marker")
    assert [f["data"]["id"] for f in heard if f["type"] == "contact.created"] == written
    # The signed-out session's socket was refused as a token that no longer stands is, and
    # heard none of them on the way.
    assert await laptop_socket.closed_with() == 1008
    assert [f["type"] for f in laptop_socket.received] == [
        "auth_success",
        "contact.created",
        "auth_error",
    ]
    assert laptop_socket.received[-1] == TOKEN_REFUSED
    # A client that kept the token and connects again with it is refused, on each worker.
    for worker in (server, elsewhere):
        again = await ws.connect(worker)
        assert await again.authenticate(laptop_token, scope="acme") == TOKEN_REFUSED
