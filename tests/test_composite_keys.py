"""Models with a composite primary key announce like any other: ``"id": [12, 3]`` and the
record channel ``line:12,3`` (what ``String([12, 3])`` gives a JavaScript client)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db.models import F

from realtime import announce
from realtime.auth import issue_token
from realtime.broadcast import broadcast_to_user
from realtime.encoding import record_channel
from tests.helpers import events, forget_messages, off_loop
from tests.live import Clients, LiveServers
from tests.live_lists import apply_frames, orm_answer, same_rows
from tests.testapp.models import Line, Membership, Stock, Workspace

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def acme() -> Workspace:
    return Workspace.objects.create(name="Acme", slug="acme")


def line_event(action: str, data: Any, scope: Workspace, **meta: Any) -> dict[str, Any]:
    return {
        "target": "scope",
        "scope_id": scope.pk,
        "event_type": f"line.{action}",
        "data": data,
        "channels": ["line", "line:12,3"],
        "meta": meta,
    }


def test_a_composite_key_travels_as_an_array_and_names_its_channel_with_commas(
    acme: Workspace,
) -> None:
    line = Line.objects.create(workspace=acme, order_no=12, position=3, quantity=2)
    line.quantity = 5
    line.save()
    line.delete()

    data = {"model": "line", "id": [12, 3], "quantity": 2}
    assert events() == [
        line_event("created", data, acme),
        line_event("updated", {**data, "quantity": 5}, acme, changed=["quantity"]),
        line_event("deleted", {**data, "quantity": 5}, acme),
    ]


def test_a_composite_key_row_knows_what_a_save_changed(acme: Workspace) -> None:
    Line.objects.create(workspace=acme, order_no=12, position=3)
    forget_messages()
    line = Line.objects.get(pk=(12, 3))

    line.save()  # nothing changed since it was read
    line.quantity = 4
    line.save()

    assert [e["meta"] for e in events()] == [{"changed": ["quantity"]}]


def test_bulk_writes_of_composite_keys_announce_each_row(acme: Workspace) -> None:
    Line.objects.bulk_create([Line(workspace=acme, order_no=12, position=3)])
    Line.objects.filter(order_no=12).update(quantity=F("quantity") + 1)

    assert [(e["event_type"], e["data"]["id"], e["channels"]) for e in events()] == [
        ("line.created", [12, 3], ["line", "line:12,3"]),
        ("line.updated", [12, 3], ["line", "line:12,3"]),
    ]


def test_announce_takes_composite_key_rows(acme: Workspace) -> None:
    line = Line.objects.create(workspace=acme, order_no=12, position=3)
    forget_messages()

    announce(line, "updated", changed=["quantity"])

    (event,) = events()
    assert event["data"]["id"] == [12, 3]


def test_record_channels_are_what_javascript_builds() -> None:
    assert record_channel("line", (12, 3)) == "line:12,3"
    assert record_channel("line", ["a", True, None]) == "line:a,true,"
    assert record_channel("contact", 42) == "contact:42"


@pytest.mark.usefixtures("each_transport")
async def test_a_reader_of_the_record_channel_hears_its_writes(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme = await off_loop(Workspace.objects.create, name="Acme", slug="acme")
    user = await off_loop(get_user_model().objects.create_user, username="ann")
    await off_loop(Membership.objects.create, workspace=acme, user=user)
    token = await off_loop(issue_token, user)
    client = await ws.authenticated(live_servers.get(), token, scope="acme", channels=["line:12,3"])

    await off_loop(Line.objects.create, workspace=acme, order_no=12, position=3)
    await off_loop(Line.objects.create, workspace=acme, order_no=12, position=4)
    await off_loop(broadcast_to_user, user.pk, "test.marker", None)

    frames = await client.frames_until("test.marker")
    assert [(frame["type"], frame["data"]["id"]) for frame in frames] == [("line.created", [12, 3])]


def test_a_composite_key_row_moved_to_another_scope_leaves_and_enters(acme: Workspace) -> None:
    beta = Workspace.objects.create(name="Beta", slug="beta")
    line = Line.objects.create(workspace=acme, order_no=12, position=3)
    forget_messages()

    line.workspace = beta
    line.save()
    Line.objects.filter(order_no=12).update(workspace=acme)

    assert [(e["event_type"], e["scope_id"], e["data"]["id"]) for e in events()] == [
        ("line.deleted", acme.pk, [12, 3]),
        ("line.created", beta.pk, [12, 3]),
        ("line.deleted", beta.pk, [12, 3]),
        ("line.created", acme.pk, [12, 3]),
    ]


@pytest.mark.usefixtures("each_transport")
async def test_a_live_query_of_composite_keys_stays_the_orm_answer(
    live_servers: LiveServers, ws: Clients
) -> None:
    workspace = await off_loop(Workspace.objects.create, name="Acme", slug="acme")
    ann = await off_loop(get_user_model().objects.create_user, username="ann")
    await off_loop(Membership.objects.create, workspace=workspace, user=ann)
    for warehouse, sku, quantity in ((1, 1, 5), (1, 2, 9), (2, 1, 7)):
        await off_loop(
            Stock.objects.create,
            workspace=workspace,
            warehouse=warehouse,
            sku=sku,
            shelf=1,
            quantity=quantity,
        )
    client = await ws.authenticated(live_servers.get(), issue_token(ann), scope="acme")
    ask = {"model": "stock", "where": {"shelf": 1}, "order_by": ["-quantity"], "limit": 2}
    await client.send("query", {"id": "shelf", **ask})
    first = await client.wait_for(lambda f: f["type"] == "query.rows")
    assert [row["id"] for row in first["data"]["rows"]] == [[1, 2], [2, 1]]
    lists: dict[str, list[dict[str, Any]]] = {}
    apply_frames(lists, [first])

    async def settled() -> None:
        await off_loop(broadcast_to_user, ann.pk, "test.marker", None)
        apply_frames(lists, await client.frames_until("test.marker"))
        assert same_rows(lists["shelf"], await off_loop(orm_answer, ask, ann, [workspace.pk]))

    # Moved off the shelf: it leaves, and the next row by quantity takes its place.
    await off_loop(Stock.objects.filter(pk=(1, 2)).update, shelf=2)
    await settled()
    # An update inside the window, by the row's save().
    row = await off_loop(Stock.objects.get, pk=(2, 1))
    row.quantity = 3
    await off_loop(row.save)
    await settled()
    # A tie at the window's end is broken by the key, part by part: (2, 1) before (10, 0).
    await off_loop(
        Stock.objects.create, workspace=workspace, warehouse=10, sku=0, shelf=1, quantity=3
    )
    await settled()
    assert sorted(row["id"] for row in lists["shelf"]) == [[1, 1], [2, 1]]
    # Deleted: it leaves, and the window is refilled with the row after it.
    await off_loop(Stock.objects.filter(pk=(1, 1)).delete)
    await settled()
    assert sorted(row["id"] for row in lists["shelf"]) == [[2, 1], [10, 0]]
