"""Global models (``scope_field=None``): announced on the base channel to every signed-in
socket subscribed to their channels, narrowed by their guard."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core import checks
from django.db import models
from django.test.utils import isolate_apps

from realtime import realtime_model
from realtime.auth import issue_token
from realtime.broadcast import broadcast_to_user
from realtime.checks.declarations import check_models
from realtime.writes.decorator import unregister
from tests.helpers import events, forget_messages, off_loop, published
from tests.live import Client, Clients, LiveServers
from tests.testapp.models import Bulletin, Membership, Release, Workspace

pytestmark = pytest.mark.django_db(transaction=True)


def account(username: str, **extra: Any) -> Any:
    return get_user_model().objects.create_user(username=username, **extra)


def test_a_global_row_is_announced_on_the_base_channel_to_its_channels() -> None:
    bulletin = Bulletin.objects.create(title="Maintenance tonight")
    ((channel, message),) = published()
    assert channel == "realtime"
    assert {key: value for key, value in message.items() if key != "mid"} == {
        "target": "global",
        "event_type": "bulletin.created",
        "data": {"model": "bulletin", "id": bulletin.pk, "title": "Maintenance tonight"},
        "channels": ["bulletin", f"bulletin:{bulletin.pk}"],
        "meta": {},
    }


def test_a_guarded_global_row_is_checked_against_its_guard_at_delivery() -> None:
    owner = account("owner")
    release = Release.objects.create(title="v2", owner=owner)
    (message,) = events("global")
    assert message["event_type"] == "release.created"
    assert message["about"] == {"model": "release", "id": release.pk}
    assert "only" not in message


def test_a_deleted_guarded_global_row_reaches_only_the_accounts_that_could_read_it() -> None:
    owner, other = account("owner"), account("other")
    account("gone", is_active=False)
    private = Release.objects.create(title="draft", owner=owner)
    public = Release.objects.create(title="out", owner=owner, public=True)
    forget_messages()
    private.delete()
    public.delete()
    first, second = events("global")
    assert (first["event_type"], first["only"]) == ("release.deleted", [owner.pk])
    # Public: every active account could read it; the inactive one is not told.
    assert (second["event_type"], second["only"]) == ("release.deleted", [owner.pk, other.pk])


def test_a_global_row_its_guard_no_longer_admits_leaves_the_readers_it_lost() -> None:
    owner, other = account("owner"), account("other")
    release = Release.objects.create(title="out", owner=owner, public=True)
    forget_messages()
    release.public = False
    release.save()
    by_type = {message["event_type"]: message for message in events("global")}
    assert by_type["release.deleted"]["only"] == [other.pk]
    assert by_type["release.deleted"]["data"] == {"model": "release", "id": release.pk}
    assert by_type["release.deleted"]["meta"] == {"moved": True}
    assert by_type["release.updated"]["only"] == [owner.pk]


def test_a_bulk_update_past_the_limit_folds_into_one_global_event(settings: Any) -> None:
    settings.REALTIME_BULK_LIMIT = 2
    Bulletin.objects.bulk_create([Bulletin(title=f"b{n}") for n in range(4)])
    forget_messages()
    Bulletin.objects.update(title="same")
    kinds = [(m["event_type"], m["meta"].get("truncated", False)) for m in events("global")]
    assert kinds == [
        ("bulletin.updated", False),
        ("bulletin.updated", False),
        ("bulletin.updated", True),
    ]
    assert events("global")[-1]["data"] is None


# Django 6.1 runs the model checks against every alias (a field's check may connect).
@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_a_global_model_needs_no_scope_model(settings: Any) -> None:
    settings.REALTIME_SCOPE_MODEL = None
    ids = {message.id for message in checks.run_checks() if message.obj is Bulletin}
    assert ids == set()


@isolate_apps("tests.testapp")
def test_a_global_model_sharing_its_rows_is_a_check_error() -> None:
    class Shelf(models.Model):  # noqa: DJ008 - never shown
        class Meta:
            app_label = "testapp"

    class Book(models.Model):  # noqa: DJ008 - never shown
        shelf = models.ForeignKey(Shelf, on_delete=models.CASCADE)

        class Meta:
            app_label = "testapp"

    realtime_model(scope_field=None, shared_via="shelf", name="global_book")(Book)
    try:
        found = [m for m in check_models() if m.obj is Book]
        assert [m.id for m in found] == ["realtime.E038"]
    finally:
        unregister(Book)


@isolate_apps("tests.testapp")
def test_a_scope_field_the_model_lacks_names_the_global_declaration() -> None:
    class Loose(models.Model):  # noqa: DJ008 - never shown
        class Meta:
            app_label = "testapp"

    with pytest.raises(ValueError, match=r"has no scope field 'workspace'.*scope_field=None"):
        realtime_model()(Loose)


@isolate_apps("tests.testapp")
def test_a_scope_model_without_the_scope_field_is_told_to_use_its_own_key(settings: Any) -> None:
    # Told "global", a newcomer decorating the scope model would announce every scope to
    # every signed-in account.
    settings.REALTIME_SCOPE_MODEL = "testapp.Crew"

    class Crew(models.Model):  # noqa: DJ008 - never shown
        class Meta:
            app_label = "testapp"

    with pytest.raises(ValueError, match=r"has no scope field 'workspace'.*scope_field=\"id\""):
        realtime_model()(Crew)


def test_the_scope_model_declared_global_is_a_check_warning(settings: Any) -> None:
    settings.REALTIME_SCOPE_MODEL = "testapp.Bulletin"  # global, as a newcomer might declare it
    found = [m for m in check_models() if m.obj is Bulletin]
    assert [m.id for m in found] == ["realtime.W035"]
    assert 'scope_field="id"' in str(found[0].hint)
    settings.REALTIME_SCOPE_MODEL = "testapp.Workspace"
    assert [m for m in check_models() if m.obj is Bulletin] == []


# Over sockets ------------------------------------------------------------------------------


async def marker_for(client: Client, user_id: Any) -> list[dict[str, Any]]:
    await off_loop(broadcast_to_user, user_id, "test.marker", None)
    return await client.frames_until("test.marker")


@pytest.mark.usefixtures("each_transport")
async def test_sockets_hear_a_global_row_whatever_scope_they_read(
    live_servers: LiveServers, ws: Clients
) -> None:
    workspace = await off_loop(Workspace.objects.create, name="Acme", slug="acme")
    member = await off_loop(account, "member")
    await off_loop(Membership.objects.create, workspace=workspace, user=member)
    loner = await off_loop(account, "loner")
    in_scope = await ws.authenticated(live_servers.get(), issue_token(member), scope="acme")
    no_scope = await ws.authenticated(live_servers.get(), issue_token(loner))
    deaf = await ws.authenticated(live_servers.get(), issue_token(loner))
    for client, user in ((in_scope, member), (no_scope, loner)):
        await client.send("subscribe", {"channels": ["bulletin"]})
        await marker_for(client, user.pk)
    bulletin = await off_loop(Bulletin.objects.create, title="Hello")
    for client, user in ((in_scope, member), (no_scope, loner)):
        assert await marker_for(client, user.pk) == [
            {
                "type": "bulletin.created",
                "data": {"model": "bulletin", "id": bulletin.pk, "title": "Hello"},
            }
        ]
    # Not subscribed: nothing, as the marker sent after it shows.
    assert await marker_for(deaf, loner.pk) == []
    for client in (in_scope, no_scope, deaf):
        await client.close()


@pytest.mark.usefixtures("each_transport")
async def test_a_guarded_global_row_reaches_only_its_readers_over_sockets(
    live_servers: LiveServers, ws: Clients
) -> None:
    owner = await off_loop(account, "owner")
    other = await off_loop(account, "other")
    clients = {}
    for user in (owner, other):
        client = await ws.authenticated(live_servers.get(), issue_token(user))
        await client.send("subscribe", {"channels": ["release"]})
        await marker_for(client, user.pk)
        clients[user.pk] = client
    draft = await off_loop(Release.objects.create, title="draft", owner=owner)
    # A guarded row is checked when a worker delivers it: wait for that before changing it.
    created = {
        pk: [f["type"] for f in await marker_for(client, pk)] for pk, client in clients.items()
    }
    assert created == {owner.pk: ["release.created"], other.pk: []}
    draft.public = True
    await off_loop(draft.save)
    published = {pk: await marker_for(client, pk) for pk, client in clients.items()}
    assert [f["type"] for f in published[owner.pk]] == ["release.updated"]
    # The other account hears the release enter its view when it becomes public.
    assert [(f["type"], f.get("moved")) for f in published[other.pk]] == [("release.created", True)]
    for client in clients.values():
        await client.close()
