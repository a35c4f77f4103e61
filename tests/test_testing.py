"""``realtime.testing``: the helpers applications use in their own tests, used here."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from realtime.testing import RealtimeClient, in_thread, realtime_client
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
