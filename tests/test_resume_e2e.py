"""Resumable delivery over real sockets on real daphne workers, on both transports.

A socket opts in with ``authenticate.resume``; each event frame it gets carries a cursor; a
socket that comes back with the cursor of the last frame it handled hears exactly the frames
it missed, once, in order, then the live ones, under the permissions it has now. Waits are
bounded; absence is proven with a marker sent to the account afterwards (a marker is an
account event: it goes through the log and gets a cursor like any frame).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction

from realtime import silent
from realtime.auth import issue_token
from realtime.broadcast import broadcast_to_user, recheck_users
from realtime.messages import base_channel, scope_channel
from realtime.positions import GLOBAL, Vector
from realtime.sockets.cursors import cursor_for, read_cursor
from tests.helpers import off_loop
from tests.histories import (
    go_on_after,
    next_id_is,
    passed,
    place,
    start_the_log_over,
    trim_up_to,
)
from tests.live import Client, Clients, LiveServers, Server, wait_for_socket
from tests.testapp.models import (
    Chat,
    ChatLine,
    Company,
    Contact,
    Membership,
    PrivateNote,
    Seat,
    Workspace,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("each_transport")]

MARKER = "test.marker"
CHANNELS = ["contact", "company", "private_note"]
Frame = dict[str, Any]


def make_workspace(slug: str) -> Workspace:
    return Workspace.objects.create(name=slug.title(), slug=slug)


def make_member(username: str, *workspaces: Workspace) -> tuple[Any, str]:
    user = get_user_model().objects.create_user(username=username)
    for workspace in workspaces:
        Membership.objects.create(workspace=workspace, user=user)
    return user, issue_token(user)


async def resuming(
    ws: Clients, server: Server, token: str, cursor: Any = None, **ask: Any
) -> tuple[Client, Frame]:
    """A socket that opts in to resume (from ``cursor``; ``None``: from now), subscribed to
    ``CHANNELS`` in ``authenticate``; its ``auth_success``."""
    client = await ws.connect(server)
    ask.setdefault("channels", CHANNELS)
    answer = await client.authenticate(token, resume=cursor, **ask)
    assert answer["type"] == "auth_success", answer
    return client, answer


async def heard(client: Client, user: Any) -> list[Frame]:
    """What the client received before a marker sent to its account now."""
    await off_loop(broadcast_to_user, user.pk, MARKER, None)
    return await client.frames_until(MARKER)


async def last_cursor(client: Client, user: Any) -> str:
    """The cursor of a marker sent now: everything before it was handled."""
    await off_loop(broadcast_to_user, user.pk, MARKER, None)
    frame = await client.wait_for(lambda f: f["type"] == MARKER)
    cursor: str = frame["cursor"]
    return cursor


async def went_away(ws: Clients, server: Server, token: str, user: Any, **ask: Any) -> str:
    """A resuming socket that handled everything said until now, then closed: its cursor."""
    client, _ = await resuming(ws, server, token, **ask)
    cursor = await last_cursor(client, user)
    await client.close()
    return cursor


def kinds(frames: list[Frame]) -> list[tuple[str, Any]]:
    return [(frame["type"], (frame["data"] or {}).get("id")) for frame in frames]


def places(user: Any, frames: list[Frame], *scope_ids: Any) -> list[Vector | None]:
    return [place(user.pk, frame["cursor"], *scope_ids) for frame in frames]


# The protocol ------------------------------------------------------------------------------


async def test_an_opted_in_socket_gets_a_cursor_and_every_event_frame_ends_with_one(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    client, answer = await resuming(ws, live_servers.get(), token, scope="acme")

    assert list(answer["data"]) == ["user_id", "scope", "scopes", "cursor"]
    assert place(ann.pk, answer["data"]["cursor"], acme.pk) is not None
    company = await off_loop(Company.objects.create, workspace=acme, name="Initech")
    raw = json.loads(await client.connection.recv())
    assert raw["type"] == "company.created"
    assert list(raw)[-1] == "cursor"
    assert list(raw)[:-1] == ["type", "data", "scope_id"]
    assert raw["data"]["id"] == company.pk
    start = place(ann.pk, answer["data"]["cursor"], acme.pk)
    here = place(ann.pk, raw["cursor"], acme.pk)
    assert passed(here, start), (here, start)


async def test_a_socket_that_does_not_opt_in_sees_exactly_the_frames_it_always_saw(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    server = live_servers.get()
    client = await ws.connect(server)
    await client.send("authenticate", {"token": token, "scope": "acme"})
    assert await client.connection.recv() == (
        f'{{"type":"auth_success","data":{{"user_id":{ann.pk},"scope":"acme","scopes":["acme"]}}}}'
    )
    await client.send("subscribe", {"channels": ["company"]})
    await wait_for_socket(server, ann.pk, channels=["company"])
    company = await off_loop(Company.objects.create, workspace=acme, name="Initech")
    assert await client.connection.recv() == (
        f'{{"type":"company.created","data":{{"model":"company","id":{company.pk},'
        f'"name":"Initech"}},"scope_id":{acme.pk}}}'
    )
    await off_loop(broadcast_to_user, ann.pk, MARKER, {"n": 1})
    assert await client.connection.recv() == '{"type":"test.marker","data":{"n":1}}'


async def test_channels_in_authenticate_are_subscribed_before_the_first_frame(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    client = await ws.authenticated(live_servers.get(), token, scope="acme", channels=["company"])
    await off_loop(Contact.objects.create, workspace=acme, name="not subscribed")
    company = await off_loop(Company.objects.create, workspace=acme, name="Initech")
    assert kinds(await heard(client, ann)) == [("company.created", company.pk)]


# Exactly the missed frames -------------------------------------------------------------------


async def test_a_socket_that_comes_back_hears_exactly_what_it_missed_in_order_then_live(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    server = live_servers.get()
    client, _ = await resuming(ws, server, token, scope="acme")
    first = await off_loop(Contact.objects.create, workspace=acme, name="First")
    await client.wait_for(lambda f: f["type"] == "contact.created")
    cursor = await last_cursor(client, ann)
    await client.close()

    def while_away() -> list[int]:
        second = Contact.objects.create(workspace=acme, name="Second")
        first.name = "First, renamed"
        first.save()
        note = PrivateNote.objects.create(workspace=acme, author=ann, title="mine")
        with transaction.atomic():
            company = Company.objects.create(workspace=acme, name="Initech")
            Contact.objects.filter(pk=second.pk).delete()
        broadcast_to_user(ann.pk, "user.notice", {"text": "hello"})
        return [second.pk, note.pk, company.pk]

    second, note, company = await off_loop(while_away)
    back, answer = await resuming(ws, server, token, cursor, scope="acme")

    assert answer["data"]["resumed"] is True
    assert answer["data"]["cursor"] == cursor
    missed = await heard(back, ann)
    assert kinds(missed) == [
        ("contact.created", second),
        ("contact.updated", first.pk),
        ("private_note.created", note),
        ("company.created", company),
        ("contact.deleted", second),
        ("user.notice", None),
    ]
    assert next(f for f in missed if f["type"] == "contact.updated")["data"]["name"] == (
        "First, renamed"
    )
    wheres = places(ann, missed, acme.pk)
    assert None not in wheres
    assert all(passed(later, earlier) for earlier, later in itertools.pairwise(wheres))
    live = await off_loop(Company.objects.create, workspace=acme, name="Live")
    assert kinds(await heard(back, ann)) == [("company.created", live.pk)]


async def test_a_socket_that_comes_back_hears_every_version_another_heard_live_meanwhile(
    live_servers: LiveServers, ws: Clients
) -> None:
    """The worker remembers each row's latest version to drop older ones that come late; a
    replay does not hold that against the versions before it."""
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    bob, bob_token = await off_loop(make_member, "bob", acme)
    server = live_servers.get()
    cursor = await went_away(ws, server, token, ann, scope="acme")
    staying, _ = await resuming(ws, server, bob_token, scope="acme")
    await heard(staying, bob)  # in place

    def while_away() -> int:
        with transaction.atomic():
            row = Contact.objects.create(workspace=acme, name="v1")
        with transaction.atomic():
            row.name = "v2"
            row.save()
        return row.pk

    row = await off_loop(while_away)
    live = await heard(staying, bob)
    back, answer = await resuming(ws, server, token, cursor, scope="acme")

    assert answer["data"]["resumed"] is True
    missed = await heard(back, ann)
    both = [("contact.created", row), ("contact.updated", row)]
    assert kinds(live) == both
    assert kinds(missed) == both


async def test_a_socket_resumes_on_another_worker(live_servers: LiveServers, ws: Clients) -> None:
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    cursor = await went_away(ws, live_servers.get("worker-1"), token, ann, scope="acme")
    company = await off_loop(Company.objects.create, workspace=acme, name="Initech")

    back, answer = await resuming(ws, live_servers.get("worker-2"), token, cursor, scope="acme")

    assert answer["data"]["resumed"] is True
    assert kinds(await heard(back, ann)) == [("company.created", company.pk)]


async def test_a_socket_resumes_on_another_worker_behind_uvicorn_and_the_auth_stack(
    live_servers: LiveServers, ws: Clients
) -> None:
    # The shape many projects serve: uvicorn, the router inside AuthMiddlewareStack.
    live_servers.kind, live_servers.stack = "uvicorn", "wrapped"
    try:
        acme = await off_loop(make_workspace, "acme")
        ann, token = await off_loop(make_member, "ann", acme)
        cursor = await went_away(ws, live_servers.get("worker-1"), token, ann, scope="acme")
        missed = [
            await off_loop(Company.objects.create, workspace=acme, name=name)
            for name in ("Initech", "Hooli")
        ]

        back, answer = await resuming(ws, live_servers.get("worker-2"), token, cursor, scope="acme")

        assert answer["data"]["resumed"] is True
        assert kinds(await heard(back, ann)) == [("company.created", c.pk) for c in missed]
    finally:
        live_servers.kind, live_servers.stack = "daphne", "bare"


async def test_resuming_with_nothing_missed_replays_nothing(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    server = live_servers.get()
    client, answer = await resuming(ws, server, token, scope="acme")
    await client.close()

    back, again = await resuming(ws, server, token, answer["data"]["cursor"], scope="acme")

    assert again["data"]["resumed"] is True
    assert await heard(back, ann) == []


# Permissions as of now -----------------------------------------------------------------------


async def test_a_scope_asked_for_on_return_is_refused_not_replayed(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme, beta = await off_loop(make_workspace, "acme"), await off_loop(make_workspace, "beta")
    ann, token = await off_loop(make_member, "ann", acme, beta)
    server = live_servers.get()
    cursor = await went_away(ws, server, token, ann, scopes=["acme"])
    await off_loop(Company.objects.create, workspace=beta, name="in beta")

    back, answer = await resuming(ws, server, token, cursor, scopes=["acme", "beta"])

    await assert_refused(back, answer, ann)


async def test_a_scope_joined_while_away_replays_nothing_said_there_before(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme, beta = await off_loop(make_workspace, "acme"), await off_loop(make_workspace, "beta")
    ann, token = await off_loop(make_member, "ann", acme)
    server = live_servers.get()
    cursor = await went_away(ws, server, token, ann, scopes=["acme", "beta"])

    def while_away() -> None:
        Contact.objects.create(workspace=beta, name="before ann").delete()
        Company.objects.create(workspace=beta, name="before ann")
        Membership.objects.create(workspace=beta, user=ann)

    await off_loop(while_away)
    back, answer = await resuming(ws, server, token, cursor, scopes=["acme", "beta"])

    assert answer["data"]["scopes"] == ["acme", "beta"]
    await assert_refused(back, answer, ann)
    company = await off_loop(Company.objects.create, workspace=beta, name="after")
    assert kinds(await heard(back, ann)) == [("company.created", company.pk)]


async def test_a_scope_gained_while_connected_then_written_while_away_is_never_skipped(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme, beta = await off_loop(make_workspace, "acme"), await off_loop(make_workspace, "beta")
    ann, token = await off_loop(make_member, "ann", acme)
    server = live_servers.get()
    client, _ = await resuming(ws, server, token, scopes=["acme", "beta"])
    before = await last_cursor(client, ann)
    await off_loop(Membership.objects.create, workspace=beta, user=ann)
    await off_loop(recheck_users, [ann.pk])
    await wait_for_socket(server, ann.pk, scopes=sorted([acme.pk, beta.pk]))
    after = await cursor_naming(client, ann, beta)
    await client.close()
    company = await off_loop(Company.objects.create, workspace=beta, name="in beta")

    back, answer = await resuming(ws, server, token, before, scopes=["acme", "beta"])
    await assert_refused(back, answer, ann)
    await back.close()
    back, answer = await resuming(ws, server, token, after, scopes=["acme", "beta"])
    assert answer["data"]["resumed"] is True
    assert kinds(await heard(back, ann)) == [("company.created", company.pk)]


async def test_a_scope_gained_by_a_periodic_recheck_replays_nothing_said_there_before(
    live_servers: LiveServers, ws: Clients
) -> None:
    # Ann joins beta unannounced, on a quiet worker that did not follow beta: the periodic
    # recheck gives her the scope and hands her a cursor. A resume from it must not replay
    # what beta said before she joined (a contact created and deleted there, a company).
    acme, beta = await off_loop(make_workspace, "acme"), await off_loop(make_workspace, "beta")
    ann, token = await off_loop(make_member, "ann", acme)
    server = live_servers.get("rechecks", REALTIME_RECHECK_INTERVAL=2.0)
    client, _ = await resuming(ws, server, token, scopes=["acme", "beta"])
    await last_cursor(client, ann)  # the worker has carried everything up to now

    def before_ann_joins() -> None:
        Contact.objects.create(workspace=beta, name="secret, before ann").delete()
        Company.objects.create(workspace=beta, name="before ann")
        with silent():  # a change realtime does not see: the periodic recheck finds it
            Membership.objects.bulk_create([Membership(workspace=beta, user=ann)])

    await off_loop(before_ann_joins)
    await wait_for_socket(server, ann.pk, scopes=sorted([acme.pk, beta.pk]))
    frame = await client.wait_for(lambda f: f["type"] == "cursor")
    await client.close()

    back, answer = await resuming(ws, server, token, frame["cursor"], scopes=["acme", "beta"])

    replayed = await heard(back, ann)
    assert answer["data"]["resumed"] is False or replayed == [], kinds(replayed)


async def cursor_naming(client: Client, user: Any, scope: Workspace) -> str:
    """The cursor of a marker sent now, once it names ``scope``: a global log's names the
    scopes the socket reads at once; on Redis it names a place in the scope's stream once the
    worker has one (it follows the stream a moment after the scope is gained)."""
    channel = scope_channel(scope.pk)
    for _ in range(50):
        cursor = await last_cursor(client, user)
        said = read_cursor(user.pk, cursor, [GLOBAL, base_channel(), channel], heard=[channel])
        if said is not None and (GLOBAL in said or channel in said):
            return cursor
        await asyncio.sleep(0.05)
    raise AssertionError(f"no cursor names {scope.slug}")


async def assert_refused(back: Client, answer: Frame, ann: Any) -> None:
    """A cursor handed out while the socket did not hear a scope it reads now: what that
    scope said since is not the socket's to be replayed (its account may have joined it only
    while away; on Redis the cursor names no place in its stream either), and a resume is
    never partial: refused."""
    assert answer["data"]["resumed"] is False
    assert await heard(back, ann) == []


async def test_a_scope_lost_while_away_is_not_replayed_and_the_others_are(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme, beta = await off_loop(make_workspace, "acme"), await off_loop(make_workspace, "beta")
    ann, token = await off_loop(make_member, "ann", acme, beta)
    server = live_servers.get()
    cursor = await went_away(ws, server, token, ann, scopes=["acme", "beta"])

    def while_away() -> tuple[int, int]:
        kept = Company.objects.create(workspace=acme, name="in acme")
        lost = Company.objects.create(workspace=beta, name="in beta")
        Membership.objects.filter(user=ann, workspace=beta).delete()
        return kept.pk, lost.pk

    kept, _lost = await off_loop(while_away)
    back, answer = await resuming(ws, server, token, cursor, scopes=["acme", "beta"])

    assert answer["data"]["scopes"] == ["acme"]
    assert answer["data"]["resumed"] is True
    assert kinds(await heard(back, ann)) == [("company.created", kept)]


async def test_a_scope_lost_while_away_is_not_named_by_the_cursor_the_resume_answers(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme, beta = await off_loop(make_workspace, "acme"), await off_loop(make_workspace, "beta")
    ann, token = await off_loop(make_member, "ann", acme, beta)
    server = live_servers.get()
    cursor = await went_away(ws, server, token, ann, scopes=["acme", "beta"])
    await off_loop(Membership.objects.filter(user=ann, workspace=beta).delete)
    back, answer = await resuming(ws, server, token, cursor, scopes=["acme", "beta"])
    assert (answer["data"]["scopes"], answer["data"]["resumed"]) == (["acme"], True)
    await back.close()  # nothing replayed: the client keeps the cursor of auth_success

    def while_away() -> None:
        Company.objects.create(workspace=beta, name="before ann is back in beta")
        Membership.objects.create(workspace=beta, user=ann)

    await off_loop(while_away)
    back, answer = await resuming(
        ws, server, token, answer["data"]["cursor"], scopes=["acme", "beta"]
    )

    await assert_refused(back, answer, ann)


async def test_a_scope_lost_while_connected_is_not_named_by_the_cursor_the_client_keeps(
    live_servers: LiveServers, ws: Clients
) -> None:
    # The recheck takes beta away; the socket drops before any frame of its own follows. The
    # cursor it keeps must not name beta: ann, back in beta while away, would be replayed
    # what beta said while she was out of it.
    acme, beta = await off_loop(make_workspace, "acme"), await off_loop(make_workspace, "beta")
    ann, token = await off_loop(make_member, "ann", acme, beta)
    server = live_servers.get()
    client, _ = await resuming(ws, server, token, scopes=["acme", "beta"])
    cursor = await last_cursor(client, ann)
    await off_loop(Membership.objects.filter(user=ann, workspace=beta).delete)
    await wait_for_socket(server, ann.pk, scopes=[acme.pk])
    for frame in await heard(client, ann):  # what reached the client before it dropped
        cursor = frame.get("cursor", cursor)
    await client.close()

    def while_away() -> None:
        Company.objects.create(workspace=beta, name="while ann was out of beta")
        Membership.objects.create(workspace=beta, user=ann)

    await off_loop(while_away)
    back, answer = await resuming(ws, server, token, cursor, scopes=["acme", "beta"])

    await assert_refused(back, answer, ann)


async def test_an_account_removed_from_a_thread_while_away_is_not_replayed_its_messages(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    bob, _ = await off_loop(make_member, "bob", acme)
    chat = await off_loop(Chat.objects.create, title="plans")
    for user in (ann, bob):
        await off_loop(Seat.objects.create, chat=chat, user=user)
    server = live_servers.get()
    channels = ["chat_line"]
    cursor = await went_away(ws, server, token, ann, scope="acme", channels=channels)

    def while_away() -> int:
        line = ChatLine.objects.create(chat=chat, text="said while ann was there")
        Seat.objects.filter(chat=chat, user=ann).delete()
        ChatLine.objects.create(chat=chat, text="said after")
        return line.pk

    line = await off_loop(while_away)
    back, answer = await resuming(ws, server, token, cursor, scope="acme", channels=channels)

    assert answer["data"]["resumed"] is True
    assert kinds(await heard(back, ann)) == [("chat_line.deleted", line)]


def seated(text: str) -> tuple[Any, str, Chat, ChatLine]:
    """ann, a member of acme seated in a chat, with her token, the chat, and a line of it."""
    acme = make_workspace("acme")
    ann, token = make_member("ann", acme)
    chat = Chat.objects.create(title="plans")
    Seat.objects.create(chat=chat, user=ann)
    return ann, token, chat, ChatLine.objects.create(chat=chat, text=text)


async def test_a_delete_replayed_to_an_account_that_lost_the_path_tells_only_model_and_id(
    live_servers: LiveServers, ws: Clients
) -> None:
    ann, token, chat, line = await off_loop(seated, "secret")
    server = live_servers.get()
    channels = ["chat_line"]
    cursor = await went_away(ws, server, token, ann, scope="acme", channels=channels)

    def while_away() -> None:
        ChatLine.objects.filter(pk=line.pk).delete()  # ann had it: the delete is hers
        Seat.objects.filter(chat=chat, user=ann).delete()  # then she leaves the chat

    await off_loop(while_away)
    back, answer = await resuming(ws, server, token, cursor, scope="acme", channels=channels)

    assert answer["data"]["resumed"] is True
    frames = await heard(back, ann)
    # Told the row is gone, not what it held: she may not read the chat any more.
    assert [(f["type"], f["data"]) for f in frames] == [
        ("chat_line.deleted", {"model": "chat_line", "id": line.pk})
    ]


async def test_a_live_delete_to_an_account_carries_its_declared_fields(
    live_servers: LiveServers, ws: Clients
) -> None:
    _, token, _, line = await off_loop(seated, "said")
    client, _ = await resuming(ws, live_servers.get(), token, scope="acme", channels=["chat_line"])
    await off_loop(ChatLine.objects.filter(pk=line.pk).delete)
    frame = await client.wait_for(lambda f: f["type"] == "chat_line.deleted")
    assert frame["data"]["text"] == "said"


async def test_an_application_event_shaped_like_a_model_event_is_replayed_as_sent(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    server = live_servers.get()
    cursor = await went_away(ws, server, token, ann, scope="acme")
    # No such row: were it re-decided by ChatLine's rules, nobody could read it.
    data = {"model": "chat_line", "id": 987654, "text": "from the application"}
    await off_loop(broadcast_to_user, ann.pk, "chat_line.created", data)

    back, _ = await resuming(ws, server, token, cursor, scope="acme")

    assert [(f["type"], f["data"]) for f in await heard(back, ann)] == [("chat_line.created", data)]


async def test_a_guarded_row_is_replayed_only_to_those_who_may_read_it_now(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme = await off_loop(make_workspace, "acme")
    ann, ann_token = await off_loop(make_member, "ann", acme)
    bob, bob_token = await off_loop(make_member, "bob", acme)
    server = live_servers.get()
    clients = {}
    for user, token in ((ann, ann_token), (bob, bob_token)):
        client, _ = await resuming(ws, server, token, scope="acme")
        clients[user] = (client, await last_cursor(client, user))
        await client.close()

    def while_away() -> int:
        note = PrivateNote.objects.create(workspace=acme, author=ann, title="t", public=True)
        # Made private again unannounced: bob may not read it any more.
        with silent():
            PrivateNote.objects.filter(pk=note.pk).update(public=False)
        return note.pk

    note = await off_loop(while_away)
    ann_back, _ = await resuming(ws, server, ann_token, clients[ann][1], scope="acme")
    bob_back, bob_answer = await resuming(ws, server, bob_token, clients[bob][1], scope="acme")

    assert kinds(await heard(ann_back, ann)) == [("private_note.created", note)]
    assert bob_answer["data"]["resumed"] is True
    assert await heard(bob_back, bob) == []


async def test_a_row_that_enters_a_view_while_away_replays_its_enter_not_its_unreadable_past(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    bob, _ = await off_loop(make_member, "bob", acme)
    server = live_servers.get()
    cursor = await went_away(ws, server, token, ann, scope="acme")

    def while_away() -> int:
        note = PrivateNote.objects.create(workspace=acme, author=bob, title="draft")
        note.title = "salaries"
        note.save()
        note.title, note.public = "announcement", True
        note.save()  # ann may read it from here: it enters her view
        return note.pk

    note = await off_loop(while_away)
    back, answer = await resuming(ws, server, token, cursor, scope="acme")

    assert answer["data"]["resumed"] is True
    missed = await heard(back, ann)
    assert [(f["type"], f["data"]["title"], f.get("moved")) for f in missed] == [
        ("private_note.created", "announcement", True)
    ]
    assert kinds(missed) == [("private_note.created", note)]


async def test_a_row_that_leaves_a_view_and_enters_again_replays_what_a_connected_socket_heard(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    bob, bob_token = await off_loop(make_member, "bob", acme)
    server = live_servers.get()
    author, _ = await resuming(ws, server, bob_token, scope="acme")
    stayed, _ = await resuming(ws, server, token, scope="acme")
    cursor = await went_away(ws, server, token, ann, scope="acme")
    await stayed.frames_until(MARKER)  # the marker that gave the cursor
    note = await off_loop(
        PrivateNote.objects.create, workspace=acme, author=bob, title="v1", public=True
    )
    await author.next_frame()
    # Each write is heard by its author before the next is made: the guard a connected
    # socket's frame was decided by is the one of its write.
    for title, public in [
        ("v2", True),
        ("v2", False),
        ("private", False),
        ("v3", True),
        ("v4", True),
    ]:
        note.title, note.public = title, public  # leaves ann's view, then enters it again
        await off_loop(note.save)
        await author.next_frame()

    back, _ = await resuming(ws, server, token, cursor, scope="acme")

    def seen(frames: list[Frame]) -> list[tuple[str, Any]]:
        return [(f["type"], f["data"].get("title")) for f in frames]

    live = seen(await heard(stayed, ann))
    assert live == [
        ("private_note.created", "v1"),
        ("private_note.updated", "v2"),
        ("private_note.deleted", None),
        ("private_note.created", "v3"),
        ("private_note.updated", "v4"),
    ]
    assert seen(await back.frames_until(MARKER)) == live


async def test_account_frames_of_another_account_are_never_replayed(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    bob, _ = await off_loop(make_member, "bob", acme)
    server = live_servers.get()
    cursor = await went_away(ws, server, token, ann, scope="acme")
    await off_loop(broadcast_to_user, bob.pk, "user.notice", {"for": "bob"})
    await off_loop(broadcast_to_user, ann.pk, "user.notice", {"for": "ann"})

    back, _ = await resuming(ws, server, token, cursor, scope="acme")

    assert [f["data"] for f in await heard(back, ann)] == [{"for": "ann"}]


# Refused plainly ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cursor",
    ["", "garbage", "a.b.c", "x" * 300, 42, ["list"], {"a": 1}, "é.é.é"],
    ids=["empty", "garbage", "three-parts", "too-long", "number", "list", "object", "non-ascii"],
)
async def test_a_garbled_cursor_starts_afresh_without_an_error(
    live_servers: LiveServers, ws: Clients, cursor: Any
) -> None:
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    await off_loop(Company.objects.create, workspace=acme, name="before")

    client, answer = await resuming(ws, live_servers.get(), token, cursor, scope="acme")

    assert answer["data"]["resumed"] is False
    assert place(ann.pk, answer["data"]["cursor"], acme.pk) is not None
    assert await heard(client, ann) == []
    live = await off_loop(Company.objects.create, workspace=acme, name="live")
    assert kinds(await heard(client, ann)) == [("company.created", live.pk)]


async def test_a_cursor_of_another_account_or_forged_gets_none_of_its_frames(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme = await off_loop(make_workspace, "acme")
    ann, ann_token = await off_loop(make_member, "ann", acme)
    bob, bob_token = await off_loop(make_member, "bob", acme)
    server = live_servers.get()
    client, _ = await resuming(ws, server, bob_token, scope="acme")
    bobs = await last_cursor(client, bob)
    await client.close()
    await off_loop(broadcast_to_user, bob.pk, "user.notice", {"for": "bob"})
    signed, _, _signature = bobs.rpartition(".")
    forged = f"{signed}.AAAAAAAAAAAAAAAAAAAAAA"

    for cursor in (bobs, forged):
        stolen, answer = await resuming(ws, server, ann_token, cursor, scope="acme")
        assert answer["data"]["resumed"] is False
        assert await heard(stolen, ann) == []


async def test_a_cursor_of_another_transport_s_shape_starts_afresh(
    live_servers: LiveServers, ws: Clients, each_transport: str
) -> None:
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    server = live_servers.get()
    await went_away(ws, server, token, ann, scope="acme")
    await off_loop(Company.objects.create, workspace=acme, name="missed")
    # Signed for ann and recent, but of the other shape of history (after a switch of
    # transport): a global log's id on Redis, Redis's streams on a global log.
    foreign = (
        Vector({GLOBAL: ("", 1)})
        if each_transport == "redis"
        else Vector({base_channel(): ("AbCdEfGhIjKl", 0), scope_channel(acme.pk): ("mNoPqR", 0)})
    )

    back, answer = await resuming(ws, server, token, cursor_for(ann.pk, foreign), scope="acme")

    assert answer["data"]["resumed"] is False
    assert await heard(back, ann) == []
    live = await off_loop(Company.objects.create, workspace=acme, name="live")
    assert kinds(await heard(back, ann)) == [("company.created", live.pk)]


async def test_a_cursor_older_than_the_window_starts_afresh(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    server = live_servers.get()
    client, answer = await resuming(ws, server, token, scope="acme")
    await client.close()
    where = place(ann.pk, answer["data"]["cursor"], acme.pk)
    # Signed properly, handed out 301 seconds ago (the window is 300).
    old = cursor_for(ann.pk, where, now=time.time() - 301)
    await off_loop(Company.objects.create, workspace=acme, name="missed")

    back, again = await resuming(ws, server, token, old, scope="acme")

    assert again["data"]["resumed"] is False
    assert await heard(back, ann) == []


async def test_a_cursor_whose_messages_were_trimmed_starts_afresh(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    server = live_servers.get()
    cursor = await went_away(ws, server, token, ann, scope="acme")
    await off_loop(Company.objects.create, workspace=acme, name="missed, then trimmed")
    await off_loop(Company.objects.create, workspace=acme, name="missed, kept")
    where = place(ann.pk, cursor, acme.pk)
    assert where is not None

    await off_loop(trim_up_to, where)
    back, answer = await resuming(ws, server, token, cursor, scope="acme")

    assert answer["data"]["resumed"] is False
    assert await heard(back, ann) == []


def missed_across_a_new_log(ann: Any, bob: Any, position: int | None) -> int:
    """Start the log over and say one thing to ``ann`` at id 1 of the new log, another
    message (to ``bob``) at ``position``, and another thing to ``ann`` after it (``None``:
    no position of the log, on Redis); return the highest id of the log before."""
    high = start_the_log_over()
    broadcast_to_user(ann.pk, "missed.before", {"n": 1})
    if position is not None and position > 1:
        next_id_is(position)
        broadcast_to_user(bob.pk, "filler", None)
    broadcast_to_user(ann.pk, "missed.after", {"n": 2})
    return high


@pytest.mark.parametrize("taken", ["from_a_frame", "from_auth_success"])
async def test_a_cursor_of_a_log_whose_ids_started_over_is_refused_not_resumed_with_a_gap(
    live_servers: LiveServers, ws: Clients, each_transport: str, taken: str
) -> None:
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    bob, _ = await off_loop(make_member, "bob", acme)
    server = live_servers.get()
    if taken == "from_a_frame":
        cursor = await went_away(ws, server, token, ann, scope="acme")
    else:  # "now" when it came: the log's last position then, a message to bob
        await off_loop(broadcast_to_user, bob.pk, "before", None)
        client, answer = await resuming(ws, server, token, scope="acme")
        await client.close()
        cursor = answer["data"]["cursor"]
    where = place(ann.pk, cursor, acme.pk)
    assert where is not None
    mark, position = where.get(GLOBAL, ("", None))

    high = await off_loop(missed_across_a_new_log, ann, bob, position)
    try:
        back, answer = await resuming(ws, server, token, cursor, scope="acme")
    finally:
        await off_loop(go_on_after, high)
    types = [frame["type"] for frame in await heard(back, ann)]

    if each_transport == "redis":  # its streams are its history, not the table
        assert (answer["data"]["resumed"], types) == (True, ["missed.before", "missed.after"])
    else:  # the new log holds another message at the cursor's position
        assert (answer["data"]["resumed"], types) == (False, [])
        assert mark  # the cursor named the message it was made at


async def test_a_cursor_made_before_cursors_named_their_message_is_refused_where_the_log_holds_it(
    live_servers: LiveServers, ws: Clients, each_transport: str
) -> None:
    if each_transport == "redis":
        pytest.skip("a global log's cursors only: Redis's name each stream's epoch")
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    server = live_servers.get()
    cursor = await went_away(ws, server, token, ann, scope="acme")
    where = place(ann.pk, cursor, acme.pk)
    assert where is not None
    ((mark, position),) = where.values()
    assert mark
    # The earlier form: the log id and the scopes, no mark (the very string it made).
    earlier = cursor_for(ann.pk, Vector({GLOBAL: ("", position)}), heard=[scope_channel(acme.pk)])
    assert earlier.split(".")[0] == cursor.split(".")[0].replace(f"_{mark}", "")
    await off_loop(Company.objects.create, workspace=acme, name="missed")

    back, answer = await resuming(ws, server, token, earlier, scope="acme")

    assert answer["data"]["resumed"] is False
    assert await heard(back, ann) == []
    live = await off_loop(Company.objects.create, workspace=acme, name="live")
    assert kinds(await heard(back, ann)) == [("company.created", live.pk)]


async def test_more_missed_frames_than_the_limit_start_afresh(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    server = live_servers.get("few-frames", REALTIME_RESUME_MAX_FRAMES=3)
    cursor = await went_away(ws, server, token, ann, scope="acme")
    for name in "abcd":
        await off_loop(Company.objects.create, workspace=acme, name=name)

    back, answer = await resuming(ws, server, token, cursor, scope="acme")

    assert answer["data"]["resumed"] is False
    assert await heard(back, ann) == []
    live = await off_loop(Company.objects.create, workspace=acme, name="live")
    assert kinds(await heard(back, ann)) == [("company.created", live.pk)]


def notices_to(user_id: Any, count: int) -> None:
    """``count`` account events to ``user_id``, in one transaction."""
    with transaction.atomic():
        for n in range(count):
            broadcast_to_user(user_id, "user.notice", {"n": n})


@pytest.mark.parametrize(("others", "resumed"), [(100, True), (200, False)])
async def test_the_deployments_account_events_are_scanned_on_a_budget_of_their_own(
    live_servers: LiveServers, ws: Clients, others: int, resumed: bool
) -> None:
    # Every account's events share one channel: a resume reads them all, so they have a
    # budget too (50 per frame of REALTIME_RESUME_MAX_FRAMES: 150 here), or a cursor would
    # cost a read of the whole deployment's account traffic since it.
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    bob, _ = await off_loop(make_member, "bob", acme)
    server = live_servers.get("few-frames", REALTIME_RESUME_MAX_FRAMES=3)
    cursor = await went_away(ws, server, token, ann, scope="acme")
    await off_loop(notices_to, bob.pk, others)
    made = await off_loop(Company.objects.create, workspace=acme, name="a")

    back, answer = await resuming(ws, server, token, cursor, scope="acme")

    assert answer["data"]["resumed"] is resumed
    expected = [("company.created", made.pk)] if resumed else []
    assert kinds(await heard(back, ann)) == expected


async def test_exactly_the_limit_of_missed_frames_is_replayed(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    server = live_servers.get("few-frames", REALTIME_RESUME_MAX_FRAMES=3)
    cursor = await went_away(ws, server, token, ann, scope="acme")
    # Frames of other accounts and channels the socket does not hear do not count.
    bob, _ = await off_loop(make_member, "bob", acme)
    await off_loop(broadcast_to_user, bob.pk, "user.notice", None)
    made = [await off_loop(Company.objects.create, workspace=acme, name=n) for n in "abc"]

    back, answer = await resuming(ws, server, token, cursor, scope="acme")

    assert answer["data"]["resumed"] is True
    assert kinds(await heard(back, ann)) == [("company.created", c.pk) for c in made]
