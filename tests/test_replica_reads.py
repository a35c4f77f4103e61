"""A project whose router sends reads to a replica: what realtime reads about a write that
just committed (accounts, memberships, a guard's readers, a live query's rows) it reads where
the write went (``realtime.primary``). A replica behind its primary would answer from before
the write, and nothing later would correct it.

The server's replica here is a database with the tables and none of the rows: a replica as
far behind as one can be. Any read realtime sent there would find nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connections, router
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from realtime.audience import readers
from realtime.auth import RealtimeAuth, ScopeQuestion, get_auth, issue_token
from realtime.registry import options_for
from realtime.sockets.live_queries import read_query, read_rows
from realtime.writes.events import read_event
from tests.helpers import events, forget_messages, off_loop
from tests.live import Clients, LiveServers
from tests.live_lists import apply_frames, orm_answer, same_rows
from tests.routers import ReadsFromTheReplica
from tests.test_live_queries import marker_for
from tests.testapp.models import (
    Attachment,
    Case,
    Chat,
    ChatLine,
    Contact,
    GuardedTask,
    Membership,
    Message,
    Project,
    Report,
    Room,
    Seat,
    Tag,
    Task,
    Thread,
    Workspace,
)

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
    contact = Contact.objects.create(workspace=workspace, name="Cid")
    tag = Tag.objects.create(workspace=workspace, name="vip")
    contact.tags.add(tag)
    _, shape = read_query({"id": "q", "model": "case"})
    auth, options, contacts = get_auth(), options_for(Case), options_for(Contact)
    assert options is not None
    assert contacts is not None
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
        event = read_event(contacts, contact, "updated")  # no alias given: the model's writes'
        assert event is not None
        assert f"tag:{tag.pk}" in event.channels
    assert replica.captured_queries == []
    assert default.captured_queries


class ReadersOnThePrimary(RealtimeAuth):
    """``shared_readers`` as an application routing its hook's reads itself, to where the
    links are written: the hook is the application's, and so is where it reads."""

    def shared_readers(self, root: Any, scope_id: Any) -> list[Any]:
        using = router.db_for_write(Project)
        partners = Project.objects.using(using).filter(pk=root.pk).values("shared_with")
        links = Membership.objects.using(using).filter(workspace__in=partners)
        return list(links.values_list("user_id", flat=True))


def replica_statements(write: Callable[[], Any]) -> list[str]:
    """The statements ``write`` (and what realtime reads about it) sent to the replica."""
    with (
        override_settings(
            DATABASE_ROUTERS=[ReadsFromTheReplica()],
            REALTIME_AUTH=f"{__name__}.ReadersOnThePrimary",
        ),
        CaptureQueriesContext(connections["replica"]) as replica,
    ):
        write()
    return [query["sql"] for query in replica.captured_queries]


def bulk_updated(instance: Any, **values: Any) -> Callable[[], None]:
    def bulk_update() -> None:
        for name, value in values.items():
            setattr(instance, name, value)
        type(instance).objects.bulk_update([instance], list(values))

    return bulk_update


def saved(instance: Any, **values: Any) -> Callable[[], None]:
    def save() -> None:
        for name, value in values.items():
            setattr(instance, name, value)
        instance.save()

    return save


def test_no_write_sends_realtimes_reads_to_the_replica() -> None:
    acme = Workspace.objects.create(name="Acme", slug="acme")
    partner = Workspace.objects.create(name="Partner", slug="partner")
    ann, bob = member(acme, "ann"), member(partner, "bob")
    project = Project.objects.create(workspace=acme, name="Launch")
    Task.objects.create(workspace=acme, project=project, title="plan")
    hidden = GuardedTask.objects.create(workspace=acme, project=project, title="budget")
    case = Case.objects.create(workspace=acme, title="ann's", private=True, assignee=ann)
    report = Report.objects.create(workspace=acme, owner=ann, title="Q3")
    contact = Contact.objects.create(workspace=acme, name="Cid")
    Attachment.objects.create(workspace=acme, contact=contact, name="cv.pdf")
    tag = Tag.objects.create(workspace=acme, name="vip")
    thread = Thread.objects.create(title="talk")
    Message.objects.create(thread=thread, text="hi")
    chat = Chat.objects.create(title="chat")
    ChatLine.objects.create(chat=chat, text="hello")
    handed = Seat.objects.create(chat=chat, user=bob)
    room = Room.objects.create(name="room")
    room.participants.add(bob)
    kept = Contact.objects.create(workspace=acme, name="Dee")
    partial = Contact.objects.only("id", "score").get(pk=kept.pk)
    gone = Contact.objects.create(workspace=acme, name="Eve")
    doomed = Contact.objects.only("id").get(pk=gone.pk)
    forget_messages()
    writes: dict[str, Callable[[], Any]] = {
        # many-to-many links of a shared root, from either side
        "share": lambda: project.shared_with.add(partner),
        "unshare": lambda: project.shared_with.remove(partner),
        "share from the other side": lambda: partner.shared_projects.add(project),
        "clear": lambda: project.shared_with.clear(),
        # guarded saves: readers before and after
        "guarded save": saved(case, assignee=bob),
        "guarded save, public": saved(case, private=False),
        "guarded save without guard_fields": saved(report, title="Q4"),
        "guarded shared save": saved(hidden, secret=True),
        # account paths: links and membership rows
        "account path link": lambda: thread.members.add(ann),
        "account path unlink": lambda: thread.members.remove(ann),
        "membership row": lambda: Seat.objects.create(chat=chat, user=ann),
        "membership rows in bulk": lambda: Seat.objects.bulk_create([Seat(chat=chat, user=ann)]),
        "membership row handed on in bulk": bulk_updated(handed, user=ann),
        "membership rows updated": lambda: Seat.objects.filter(pk=handed.pk).update(user=bob),
        "link rows deleted": lambda: Room.participants.through.objects.filter(room=room).delete(),
        "membership rows deleted": lambda: Seat.objects.filter(chat=chat).delete(),
        "scope membership": lambda: Membership.objects.create(workspace=partner, user=ann),
        # an instance loaded without the columns its event carries
        "deferred save": saved(partial, score=3),
        "deferred delete": doomed.delete,
        # relations and deletes
        "relation link": lambda: contact.tags.add(tag),
        "relation target deleted": lambda: tag.delete(),
        "guarded delete": lambda: case.delete(),
        "cascading delete": lambda: contact.delete(),
        "guarded shared delete": lambda: hidden.delete(),
        "queryset delete": lambda: Report.objects.filter(workspace=acme).delete(),
        "root deleted": lambda: Project.objects.filter(pk=project.pk).delete(),
    }
    reached = {name: replica_statements(write) for name, write in writes.items()}
    assert {name: found for name, found in reached.items() if found} == {}
    kinds = {message.get("event_type") for message in events()}
    heard = {"task.created", "task.deleted", "guarded_task.created", "case.deleted"}
    contacts = [m for m in events() if m.get("event_type", "").startswith("contact.")]
    assert [m["data"]["name"] for m in contacts[:2]] == ["Dee", "Eve"]  # read, not null
    assert heard | {"message.created", "chat_line.created"} <= kinds


def test_a_shared_roots_readers_are_read_on_the_database_of_its_links() -> None:
    """Links written to ``other`` (``using``, past any router): the roots' rows and members
    are read there, not where the router would send the model's writes."""
    acme = Workspace.objects.using("other").create(name="Acme", slug="acme")
    partner = Workspace.objects.using("other").create(name="Partner", slug="partner")
    bob = get_user_model().objects.db_manager("other").create_user(username="bob")
    Membership.objects.using("other").create(workspace=partner, user=bob)
    project = Project.objects.using("other").create(workspace=acme, name="Launch")
    task = Task.objects.using("other").create(workspace=acme, project=project, title="plan")
    with (
        override_settings(REALTIME_AUTH=f"{__name__}.ReadersOnTheirDatabase"),
        CaptureQueriesContext(connections["default"]) as default,
    ):
        project.shared_with.add(partner)
        project.shared_with.remove(partner)
    tables = [Task._meta.db_table, GuardedTask._meta.db_table, Project._meta.db_table]
    assert [q["sql"] for q in default.captured_queries if any(t in q["sql"] for t in tables)] == []
    told = [(m["event_type"], m["user_ids"], m["data"]["id"]) for m in events("users")]
    assert told == [("task.created", [bob.pk], task.pk), ("task.deleted", [bob.pk], task.pk)]


class ReadersOnTheirDatabase(RealtimeAuth):
    """``shared_readers`` reading where the root was read."""

    def shared_readers(self, root: Any, scope_id: Any) -> list[Any]:
        using = root._state.db
        partners = Project.objects.using(using).filter(pk=root.pk).values("shared_with")
        links = Membership.objects.using(using).filter(workspace__in=partners)
        return list(links.values_list("user_id", flat=True))
