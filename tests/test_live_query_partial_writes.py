"""Live queries after partial writes: a ``save(update_fields=...)`` or a ``bulk_update`` of an
instance read before another write changed a filtered column places the row by what the
database holds, not by the instance's stale value (over real sockets)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from realtime.auth import issue_token
from realtime.broadcast import broadcast_to_user
from tests.helpers import off_loop
from tests.live import Clients, LiveServers
from tests.live_lists import apply_frames, orm_answer, same_rows
from tests.testapp.models import Case, Membership, Workspace

pytestmark = pytest.mark.django_db(transaction=True)

ASK = {"model": "case", "where": {"status": "open"}, "limit": 10}


def _member() -> tuple[Workspace, Any]:
    acme = Workspace.objects.create(name="Acme", slug="acme")
    ann = get_user_model().objects.create_user(username="ann")
    Membership.objects.create(workspace=acme, user=ann)
    return acme, ann


def _save_title(stale: Case) -> None:
    stale.save(update_fields=["title"])


def _bulk_update_title(stale: Case) -> None:
    Case.objects.bulk_update([stale], ["title"])


@pytest.mark.parametrize("write", [_save_title, _bulk_update_title], ids=["save", "bulk_update"])
async def test_a_partial_write_of_a_stale_instance_lists_the_row_as_the_database_holds_it(
    live_servers: LiveServers, ws: Clients, write: Callable[[Case], None]
) -> None:
    acme, ann = await off_loop(_member)
    case = await off_loop(Case.objects.create, workspace=acme, title="t", status="open")
    client = await ws.authenticated(live_servers.get(), issue_token(ann), scopes=["acme"])
    await client.send("query", {"id": "q", **ASK})
    lists: dict[str, Any] = {}
    apply_frames(lists, [await client.wait_for(lambda f: f["type"].startswith("query."))])
    stale = await off_loop(Case.objects.get, pk=case.pk)
    await off_loop(Case.objects.filter(pk=case.pk).update, status="closed")
    stale.title = "renamed"
    await off_loop(write, stale)
    await off_loop(broadcast_to_user, ann.pk, "test.marker", None)
    frames = await client.frames_until("test.marker")
    apply_frames(lists, frames)
    expected = await off_loop(orm_answer, ASK, ann, [acme.pk])
    assert expected == []
    assert same_rows(lists["q"], expected), lists["q"]
