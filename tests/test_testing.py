"""``realtime.testing``: the helpers applications use in their own tests, used here."""

from __future__ import annotations

import asyncio
import threading

import pytest
from django.contrib.auth import get_user_model

from realtime import transports
from realtime.testing import RealtimeClient, in_thread, realtime_client
from realtime.transports.table import in_memory_sqlite
from tests.testapp.models import Company, Contact, Membership, Workspace

pytestmark = pytest.mark.django_db(transaction=True)


def member(username: str, workspace: Workspace) -> object:
    user = get_user_model().objects.create_user(username=username)
    Membership.objects.create(workspace=workspace, user=user)
    return user


async def test_a_connected_client_receives_what_it_subscribed_to() -> None:
    workspace = await in_thread(Workspace.objects.create, name="Acme", slug="acme")
    user = await in_thread(member, "ann", workspace)
    async with realtime_client(user, scope="acme") as client:
        assert client.auth_answer is not None
        assert client.auth_answer["data"]["scopes"] == ["acme"]
        await client.subscribe("contact")
        await in_thread(Contact.objects.create, workspace=workspace, name="Zed")
        frame = await client.receive("contact.created")
        assert frame["data"]["name"] == "Zed"
        assert frame["scope_id"] == workspace.pk


async def test_frames_before_marker_proves_nothing_else_arrived() -> None:
    workspace = await in_thread(Workspace.objects.create, name="Acme", slug="acme")
    user = await in_thread(member, "ann", workspace)
    async with realtime_client(user, scope="acme") as client:
        await client.subscribe("company")
        await in_thread(Contact.objects.create, workspace=workspace, name="Unheard")
        assert await client.frames_before_marker() == []
        await in_thread(Company.objects.create, workspace=workspace, name="Heard")
        heard = await client.frames_before_marker()
        assert [frame["type"] for frame in heard] == ["company.created"]


async def test_connecting_with_a_refused_token_fails_clearly() -> None:
    workspace = await in_thread(Workspace.objects.create, name="Acme", slug="acme")
    user = await in_thread(member, "ann", workspace)
    with pytest.raises(AssertionError, match="Invalid authentication token"):
        await RealtimeClient.connect(user, token="not a token")


def pollers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "realtime-table-poller" and t.is_alive()]


async def test_the_last_client_closed_stops_the_transport_and_its_poller() -> None:
    # The poller's connection would keep PostgreSQL from dropping the test database.
    workspace = await in_thread(Workspace.objects.create, name="Acme", slug="acme")
    user = await in_thread(member, "ann", workspace)
    async with realtime_client(user, scope="acme") as first:
        async with realtime_client(user, scope="acme") as second:
            await second.subscribe("contact")
        # The first is still open: its transport still runs, and it still hears.
        await first.subscribe("contact")
        await in_thread(Contact.objects.create, workspace=workspace, name="Zed")
        assert (await first.receive("contact.created"))["data"]["name"] == "Zed"
        assert pollers()
    assert transports._transport is None
    for poller in pollers():
        await asyncio.to_thread(poller.join, 5)
    assert pollers() == []


async def test_each_clients_markers_are_its_own_with_two_sockets_of_one_account() -> None:
    workspace = await in_thread(Workspace.objects.create, name="Acme", slug="acme")
    user = await in_thread(member, "ann", workspace)
    async with (
        realtime_client(user, scope="acme") as tab1,
        realtime_client(user, scope="acme") as tab2,
    ):
        await tab1.subscribe("contact")
        await tab2.subscribe("contact")
        assert await tab1.frames_before_marker() == []
        await in_thread(Contact.objects.create, workspace=workspace, name="Zed")
        # tab1's marker reached tab2 too, before the contact: it is not tab2's own.
        assert [f["type"] for f in await tab2.frames_before_marker()] == ["contact.created"]
        assert [f["type"] for f in await tab1.frames_before_marker()] == ["contact.created"]
        assert await tab2.frames_before_marker() == []


async def test_a_frame_not_received_in_time_fails_naming_it_and_what_came() -> None:
    workspace = await in_thread(Workspace.objects.create, name="Acme", slug="acme")
    user = await in_thread(member, "ann", workspace)
    async with realtime_client(user, scope="acme") as client:
        await client.subscribe("contact")
        await in_thread(Contact.objects.create, workspace=workspace, name="Zed")
        with pytest.raises(AssertionError, match=r"no 'company\.created' frame within 0\.5 s") as e:
            await client.receive("company.created", timeout=0.5)
        assert "contact.created" in str(e.value)


def test_an_in_memory_sqlite_database_is_told_apart_from_a_file() -> None:
    engine = "django.db.backends.sqlite3"
    assert in_memory_sqlite({"ENGINE": engine, "NAME": ":memory:"})
    assert in_memory_sqlite(
        {"ENGINE": engine, "NAME": "file:memorydb_default?mode=memory&cache=shared"}
    )
    assert not in_memory_sqlite({"ENGINE": engine, "NAME": "test_db.sqlite3"})
    assert not in_memory_sqlite({"ENGINE": "django.db.backends.postgresql", "NAME": "x"})
