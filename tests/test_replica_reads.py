"""A project whose router sends reads to a replica: what realtime reads about a write that
just committed (accounts, memberships, a guard's readers, a live query's rows) it reads where
the write went (``realtime.primary``). A replica behind its primary would answer from before
the write, and nothing later would correct it.

The server's replica here is a database with the tables and none of the rows: a replica as
far behind as one can be. Any read realtime sent there would find nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connections
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from realtime.audience import readers
from realtime.auth import ScopeQuestion, get_auth, issue_token
from realtime.registry import options_for
from realtime.sockets.live_queries import read_query, read_rows
from tests.helpers import off_loop
from tests.live import Clients, LiveServers
from tests.live_lists import apply_frames, orm_answer, same_rows
from tests.routers import ReadsFromTheReplica
from tests.test_live_queries import marker_for
from tests.testapp.models import Case, Membership, Workspace

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "other", "replica"])

ROUTER = "tests.routers.ReadsFromTheReplica"


def member(workspace: Workspace, username: str) -> Any:
    user = get_user_model().objects.create_user(username=username)
    Membership.objects.create(workspace=workspace, user=user)
    return user


async def test_with_a_replica_behind_sockets_still_hear_and_lists_stay_exact(
    live_servers: LiveServers, ws: Clients
) -> None:
    stale = connections["other"].settings_dict["NAME"]  # migrated, and empty
    server = live_servers.get(DATABASE_ROUTERS=[ROUTER], STALE_REPLICA=stale)
    workspace = await off_loop(Workspace.objects.create, name="Acme", slug="acme")
    ann = await off_loop(member, workspace, "ann")
    bob = await off_loop(member, workspace, "bob")
    await off_loop(Case.objects.create, workspace=workspace, title="open to all")
    await off_loop(
        Case.objects.create, workspace=workspace, title="bob's", private=True, assignee=bob
    )

    # The account, its scope and the query's first rows: read on the primary.
    client = await ws.authenticated(server, issue_token(ann), scope="acme")
    await client.send("subscribe", {"channels": ["case"]})
    ask = {"model": "case", "order_by": ["-priority"], "limit": 5}
    await client.send("query", {"id": "cases", **ask})
    first = await client.wait_for(lambda f: f["type"] == "query.rows")
    assert [row["title"] for row in first["data"]["rows"]] == ["open to all"]
    lists: dict[str, list[dict[str, Any]]] = {}
    apply_frames(lists, [first])

    # A guarded row just written: its readers are asked where it was written.
    mine = await off_loop(
        Case.objects.create, workspace=workspace, title="ann's", private=True, assignee=ann
    )
    frames = await marker_for(client, ann.pk)
    assert [(f["type"], f["data"]["id"]) for f in frames if f["type"] == "case.created"] == [
        ("case.created", mine.pk)
    ]
    apply_frames(lists, frames)
    # A row leaving a full window is refilled from the primary.
    for n in range(5):
        await off_loop(
            Case.objects.create, workspace=workspace, title=f"urgent {n}", priority=10 + n
        )
    await off_loop(Case.objects.filter(title="urgent 4").delete)
    apply_frames(lists, await marker_for(client, ann.pk))
    assert same_rows(lists["cases"], await off_loop(orm_answer, ask, ann, [workspace.pk]))

    # A membership removed: the recheck reads it gone, and the scope's rows leave.
    await off_loop(Membership.objects.filter(user=ann).delete)
    left = await client.wait_for(lambda f: f["type"] == "query.diff")
    apply_frames(lists, [left])
    assert lists["cases"] == []


def test_realtimes_own_reads_about_a_write_never_go_to_the_replica() -> None:
    workspace = Workspace.objects.create(name="Acme", slug="acme")
    ann = member(workspace, "ann")
    case = Case.objects.create(workspace=workspace, title="ann's", private=True, assignee=ann)
    _, shape = read_query({"id": "q", "model": "case"})
    auth, options = get_auth(), options_for(Case)
    assert options is not None
    with (
        override_settings(DATABASE_ROUTERS=[ReadsFromTheReplica()]),
        CaptureQueriesContext(connections["replica"]) as replica,
        CaptureQueriesContext(connections["default"]) as default,
    ):
        assert auth.users_of_tokens([issue_token(ann)]) == [ann]
        assert [s.slug for s in auth.scopes_of_many([ScopeQuestion(ann, ["acme"], [])])[0]] == [
            "acme"
        ]
        assert readers(options, case.pk, [ann.pk]) == [ann.pk]
        assert [row["title"] for row in read_rows(shape, ann, [workspace.pk])] == ["ann's"]
    assert replica.captured_queries == []
    assert default.captured_queries
