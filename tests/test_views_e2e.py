"""Over real sockets on a real daphne: readers who lose sight of a row hear it deleted, those
who gain it hear it created, those who keep it hear it updated; nobody else hears anything."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction

from realtime.auth import RealtimeAuth, issue_token
from realtime.broadcast import broadcast_to_user
from tests.helpers import off_loop
from tests.live import Client, Clients, LiveServers
from tests.testapp.models import (
    Contact,
    GuardedTask,
    Membership,
    Message,
    PrivateNote,
    Project,
    Task,
    Thread,
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


async def heard(client: Client, user: Any) -> list[dict[str, Any]]:
    """What the client received before a marker sent to its account now."""
    await off_loop(broadcast_to_user, user.pk, "test.marker", None)
    return await client.frames_until("test.marker")


async def listening(ws: Clients, live_servers: LiveServers, token: str, **ask: Any) -> Client:
    # Channels asked in authenticate are in place before auth_success; a separate
    # subscribe has no answer and could still be on its way when a test writes.
    channels = ["contact", "private_note", "task"]
    return await ws.authenticated(live_servers.get(), token, channels=channels, **ask)


async def test_a_contact_moved_to_another_workspace_leaves_one_view_and_enters_the_other(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme, beta = await off_loop(make_workspace, "acme"), await off_loop(make_workspace, "beta")
    ann, ann_token = await off_loop(make_member, "ann", acme)
    bob, bob_token = await off_loop(make_member, "bob", beta)
    both, both_token = await off_loop(make_member, "cy", acme, beta)
    clients = {
        ann: await listening(ws, live_servers, ann_token, scope="acme"),
        bob: await listening(ws, live_servers, bob_token, scope="beta"),
        both: await listening(ws, live_servers, both_token, scopes=["acme", "beta"]),
    }
    contact = await off_loop(Contact.objects.create, workspace=acme, name="Ann Lee")
    for user, client in clients.items():
        await heard(client, user)

    def move() -> None:
        contact.workspace = beta
        contact.save()

    await off_loop(move)
    left = {"type": "contact.deleted", "data": {"model": "contact", "id": contact.pk}}
    assert await heard(clients[ann], ann) == [{**left, "scope_id": acme.pk, "moved": True}]
    (entered,) = await heard(clients[bob], bob)
    assert entered["type"] == "contact.created"
    assert entered["data"]["name"] == "Ann Lee"
    assert entered["scope_id"] == beta.pk
    assert entered["moved"] is True
    assert list(entered)[-1] == "moved"
    assert [(f["type"], f["scope_id"]) for f in await heard(clients[both], both)] == [
        ("contact.deleted", acme.pk),
        ("contact.created", beta.pk),
    ]


async def test_a_private_note_given_to_another_author_leaves_the_old_owner_only(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme = await off_loop(make_workspace, "acme")
    accounts = [await off_loop(make_member, name, acme) for name in ("ann", "bob", "cy")]
    (ann, _), (bob, _), (cy, _) = accounts
    clients = {
        user: await listening(ws, live_servers, token, scope="acme") for user, token in accounts
    }
    note = await off_loop(PrivateNote.objects.create, workspace=acme, author=ann, title="mine")
    for user, client in clients.items():
        await heard(client, user)

    def give() -> None:
        note.author = bob
        note.save()

    await off_loop(give)
    assert await heard(clients[ann], ann) == [
        {
            "type": "private_note.deleted",
            "data": {"model": "private_note", "id": note.pk},
            "scope_id": acme.pk,
            "moved": True,
        }
    ]
    assert [f["type"] for f in await heard(clients[bob], bob)] == ["private_note.created"]
    assert await heard(clients[cy], cy) == []


async def test_an_account_removed_from_a_thread_hears_its_messages_leave(
    live_servers: LiveServers, ws: Clients
) -> None:
    ann, ann_token = await off_loop(make_member, "ann")
    bob, bob_token = await off_loop(make_member, "bob")
    thread = await off_loop(Thread.objects.create, title="deal")
    await off_loop(thread.members.set, [ann, bob])
    message = await off_loop(Message.objects.create, thread=thread, text="hi")
    clients = {
        ann: await listening(ws, live_servers, ann_token),
        bob: await listening(ws, live_servers, bob_token),
    }
    for user, client in clients.items():
        await heard(client, user)
    await off_loop(thread.members.remove, bob)
    assert await heard(clients[bob], bob) == [
        {"type": "message.deleted", "data": {"model": "message", "id": message.pk}, "moved": True}
    ]
    assert await heard(clients[ann], ann) == []
    await off_loop(thread.members.add, bob)
    assert [(f["type"], f["data"]["text"]) for f in await heard(clients[bob], bob)] == [
        ("message.created", "hi")
    ]


async def test_a_project_shared_and_unshared_enters_and_leaves_its_tasks_outside_the_scope(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme, beta = await off_loop(make_workspace, "acme"), await off_loop(make_workspace, "beta")
    reader, token = await off_loop(make_member, "bee", beta)
    project = await off_loop(Project.objects.create, workspace=acme, name="Launch")
    task = await off_loop(Task.objects.create, workspace=acme, project=project, title="Plan")
    client = await listening(ws, live_servers, token, scope="beta")
    await heard(client, reader)
    await off_loop(project.shared_with.add, beta)
    assert [(f["type"], f["data"]["title"], f["moved"]) for f in await heard(client, reader)] == [
        ("task.created", "Plan", True)
    ]
    await off_loop(project.shared_with.remove, beta)
    assert await heard(client, reader) == [
        {"type": "task.deleted", "data": {"model": "task", "id": task.pk}, "moved": True}
    ]


async def test_a_shared_task_its_guard_stops_admitting_leaves_and_enters_outside_readers_again(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme, beta = await off_loop(make_workspace, "acme"), await off_loop(make_workspace, "beta")
    reader, token = await off_loop(make_member, "bee", beta)
    project = await off_loop(Project.objects.create, workspace=acme, name="Launch")
    await off_loop(project.shared_with.add, beta)
    task = await off_loop(GuardedTask.objects.create, workspace=acme, project=project, title="t")
    client = await ws.authenticated(
        live_servers.get(), token, scope="beta", channels=["guarded_task"]
    )
    await heard(client, reader)

    def secret(value: bool) -> None:
        task.secret = value
        task.save()

    await off_loop(secret, True)
    assert await heard(client, reader) == [
        {
            "type": "guarded_task.deleted",
            "data": {"model": "guarded_task", "id": task.pk},
            "moved": True,
        }
    ]
    await off_loop(secret, False)
    assert [(f["type"], f["data"]["title"], f["moved"]) for f in await heard(client, reader)] == [
        ("guarded_task.created", "t", True)
    ]


async def test_moves_inside_one_transaction_announce_only_the_outcome(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme, beta = await off_loop(make_workspace, "acme"), await off_loop(make_workspace, "beta")
    ann, token = await off_loop(make_member, "ann", acme, beta)
    client = await listening(ws, live_servers, token, scopes=["acme", "beta"])
    await heard(client, ann)

    def created_then_moved() -> Contact:
        with transaction.atomic():
            contact = Contact.objects.create(workspace=acme, name="New")
            contact.workspace = beta
            contact.save()
            return contact

    moved = await off_loop(created_then_moved)
    assert [(f["type"], f["scope_id"], "moved" in f) for f in await heard(client, ann)] == [
        ("contact.created", beta.pk, False)
    ]

    def moved_and_back() -> None:
        with transaction.atomic():
            moved.workspace = acme
            moved.save()
            moved.workspace = beta
            moved.name = "Renamed"
            moved.save()

    await off_loop(moved_and_back)
    (frame,) = await heard(client, ann)
    assert (frame["type"], frame["scope_id"], frame["changed"]) == (
        "contact.updated",
        beta.pk,
        ["name", "workspace"],
    )
    assert "moved" not in frame


async def test_a_note_made_private_and_deleted_in_one_transaction_goes_from_every_earlier_reader(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme = await off_loop(make_workspace, "acme")
    accounts = [await off_loop(make_member, name, acme) for name in ("ann", "bob")]
    (ann, _), (bob, _) = accounts
    clients = {
        user: await listening(ws, live_servers, token, scope="acme") for user, token in accounts
    }
    note = await off_loop(
        PrivateNote.objects.create, workspace=acme, author=ann, title="n", public=True
    )
    for user, client in clients.items():
        assert [f["type"] for f in await heard(client, user)] == ["private_note.created"]
    pk = note.pk

    def hide_and_delete() -> None:
        with transaction.atomic():
            note.public = False
            note.title = "mine alone"
            note.save()
            note.delete()

    await off_loop(hide_and_delete)
    # bob read it before the transaction: he hears it go, its identity alone.
    assert await heard(clients[bob], bob) == [
        {
            "type": "private_note.deleted",
            "data": {"model": "private_note", "id": pk},
            "scope_id": acme.pk,
        }
    ]
    assert [(f["type"], f["data"]) for f in await heard(clients[ann], ann)] == [
        ("private_note.deleted", {"model": "private_note", "id": pk, "title": "mine alone"})
    ]


# A hook that fails while deciding who leaves ------------------------------------------------


class RecipientsFailAboutCarol(RealtimeAuth):
    def recipients(self, event_type: str, data: Any, user_ids: list[Any]) -> Iterable[Any]:
        if get_user_model().objects.filter(pk__in=user_ids, username="carol").exists():
            raise RuntimeError("recipients hook bug")
        return user_ids


class RecipientsFailAboutAnn(RealtimeAuth):
    def recipients(self, event_type: str, data: Any, user_ids: list[Any]) -> Iterable[Any]:
        if get_user_model().objects.filter(pk__in=user_ids, username="ann").exists():
            raise RuntimeError("recipients hook bug")
        return user_ids


class SharedReadersFailForTwo(RealtimeAuth):
    def shared_readers(self, root: Any, scope_id: Any) -> Iterable[Any]:
        if root.name == "Two":
            raise RuntimeError("shared_readers hook bug")
        return super().shared_readers(root, scope_id)


class SharedReadersFailForOne(RealtimeAuth):
    def shared_readers(self, root: Any, scope_id: Any) -> Iterable[Any]:
        if root.name == "One":
            raise RuntimeError("shared_readers hook bug")
        return super().shared_readers(root, scope_id)


def the_failure(caplog: pytest.LogCaptureFixture, hook: str) -> None:
    """One ERROR was logged, naming ``hook``, with its traceback."""
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [f"{hook}()" in r.getMessage() for r in errors] == [True]
    assert errors[0].exc_info is not None
    assert "hook bug" in str(errors[0].exc_info[1])


async def a_message_in_two_threads(
    ws: Clients, live_servers: LiveServers
) -> tuple[Message, Thread, dict[str, tuple[Any, Client]]]:
    """ann and bob in the message's thread, bob and carol in another, each listening."""
    users = {name: await off_loop(make_member, name) for name in ("ann", "bob", "carol")}
    first = await off_loop(Thread.objects.create, title="first")
    second = await off_loop(Thread.objects.create, title="second")
    await off_loop(first.members.set, [users["ann"][0], users["bob"][0]])
    await off_loop(second.members.set, [users["bob"][0], users["carol"][0]])
    message = await off_loop(Message.objects.create, thread=first, text="hi")
    clients = {}
    for name, (user, token) in users.items():
        clients[name] = (user, await listening(ws, live_servers, token))
        await heard(clients[name][1], user)
    return message, second, clients


def move_to(message: Message, thread: Thread) -> None:
    message.thread = thread
    message.save()


async def test_a_failing_recipients_hook_about_the_readers_after_tells_nobody_it_left(
    live_servers: LiveServers, ws: Clients, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    message, second, clients = await a_message_in_two_threads(ws, live_servers)
    settings.REALTIME_AUTH = f"{__name__}.RecipientsFailAboutCarol"
    with caplog.at_level(logging.ERROR, logger="realtime"):
        await off_loop(move_to, message, second)
    for user, client in clients.values():
        assert await heard(client, user) == []
    the_failure(caplog, "recipients")


async def test_a_failing_recipients_hook_about_the_readers_before_tells_those_after_an_update(
    live_servers: LiveServers, ws: Clients, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    message, second, clients = await a_message_in_two_threads(ws, live_servers)
    settings.REALTIME_AUTH = f"{__name__}.RecipientsFailAboutAnn"
    with caplog.at_level(logging.ERROR, logger="realtime"):
        await off_loop(move_to, message, second)
    heard_by = {name: await heard(client, user) for name, (user, client) in clients.items()}
    assert heard_by["ann"] == []
    for name in ("bob", "carol"):
        assert [(f["type"], f["data"]["text"], "moved" in f) for f in heard_by[name]] == [
            ("message.updated", "hi", False)
        ]
    the_failure(caplog, "recipients")


async def a_task_shared_with_beta(
    ws: Clients, live_servers: LiveServers
) -> tuple[Task, Project, dict[str, tuple[Any, Client]]]:
    """A task of acme's project One; One and Two both shared with beta; ann reads acme, bee
    beta."""
    acme, beta = await off_loop(make_workspace, "acme"), await off_loop(make_workspace, "beta")
    ann, ann_token = await off_loop(make_member, "ann", acme)
    bee, bee_token = await off_loop(make_member, "bee", beta)
    one = await off_loop(Project.objects.create, workspace=acme, name="One")
    two = await off_loop(Project.objects.create, workspace=acme, name="Two")
    await off_loop(one.shared_with.add, beta)
    await off_loop(two.shared_with.add, beta)
    task = await off_loop(Task.objects.create, workspace=acme, project=one, title="Plan")
    clients = {
        "ann": (ann, await listening(ws, live_servers, ann_token, scope="acme")),
        "bee": (bee, await listening(ws, live_servers, bee_token, scope="beta")),
    }
    for user, client in clients.values():
        await heard(client, user)
    return task, two, clients


def move_task(task: Task, project: Project) -> None:
    task.project = project
    task.save()


async def test_a_failing_shared_readers_hook_about_the_readers_after_tells_nobody_it_left(
    live_servers: LiveServers, ws: Clients, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    task, two, clients = await a_task_shared_with_beta(ws, live_servers)
    settings.REALTIME_AUTH = f"{__name__}.SharedReadersFailForTwo"
    with caplog.at_level(logging.ERROR, logger="realtime"):
        await off_loop(move_task, task, two)
    ann, ann_client = clients["ann"]
    assert [f["type"] for f in await heard(ann_client, ann)] == ["task.updated"]
    bee, bee_client = clients["bee"]
    assert await heard(bee_client, bee) == []
    the_failure(caplog, "shared_readers")


async def test_a_failing_shared_readers_hook_about_the_readers_before_tells_those_after_an_update(
    live_servers: LiveServers, ws: Clients, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    task, two, clients = await a_task_shared_with_beta(ws, live_servers)
    settings.REALTIME_AUTH = f"{__name__}.SharedReadersFailForOne"
    with caplog.at_level(logging.ERROR, logger="realtime"):
        await off_loop(move_task, task, two)
    ann, ann_client = clients["ann"]
    assert [f["type"] for f in await heard(ann_client, ann)] == ["task.updated"]
    bee, bee_client = clients["bee"]
    assert [(f["type"], "moved" in f) for f in await heard(bee_client, bee)] == [
        ("task.updated", False)
    ]
    the_failure(caplog, "shared_readers")
