"""Resumes under way: sockets resuming together, and a recheck asked meanwhile.

A worker answers the resumes that arrive together in one batch (one read of the log for all
of them). A socket of a flooded scope, or with an old cursor, starts afresh on its own; the
sockets resuming beside it still get exactly what they missed. A recheck asked while a
socket resumes holds its frames, replayed and live, until it answers. The servers here take
over a second to check the audience of an event marked ``slow``: a socket whose resume plans
one is still resuming while the test acts (others come back into the same batch, a
membership is deleted).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.db import transaction

from realtime.broadcast import broadcast_to_scope
from tests.helpers import off_loop
from tests.histories import place, trim_up_to
from tests.live import Clients, LiveServers, Server
from tests.test_resume_e2e import heard, make_member, make_workspace, resuming, went_away
from tests.testapp.models import Company, Membership

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("each_transport")]

SETTINGS: dict[str, Any] = {
    "REALTIME_AUTH": "tests.slow_auth.SlowAudience",
    "REALTIME_RESUME_MAX_FRAMES": 5,
}


def said(scope_id: Any, count: int, event_type: str = "test.said", **data: Any) -> None:
    """``count`` events to a scope, in one transaction."""
    with transaction.atomic():
        for n in range(count):
            broadcast_to_scope(scope_id, event_type, {"n": n, **data})


async def test_a_flooded_scope_refuses_its_own_socket_not_the_one_resuming_beside_it(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme, beta, gamma = [await off_loop(make_workspace, slug) for slug in ("acme", "beta", "gamma")]
    ann, ann_token = await off_loop(make_member, "ann", acme)
    bob, bob_token = await off_loop(make_member, "bob", beta)
    cid, cid_token = await off_loop(make_member, "cid", gamma)
    server = live_servers.get("batches", **SETTINGS)
    cursors = [
        await went_away(ws, server, token, user, scope=scope)
        for token, user, scope in (
            (ann_token, ann, "acme"),
            (bob_token, bob, "beta"),
            (cid_token, cid, "gamma"),
        )
    ]
    await off_loop(said, gamma.pk, 1, slow=True)
    await off_loop(said, acme.pk, 1200)  # more than a page of the log
    await off_loop(said, beta.pk, 2)

    # cid's resume plans the slow event; ann and bob come back while it does.
    holding = asyncio.ensure_future(resuming(ws, server, cid_token, cursors[2], scope="gamma"))
    await asyncio.sleep(0.3)
    (ann_back, ann_answer), (bob_back, bob_answer) = await asyncio.gather(
        resuming(ws, server, ann_token, cursors[0], scope="acme"),
        resuming(ws, server, bob_token, cursors[1], scope="beta"),
    )
    cid_back, cid_answer = await holding

    assert ann_answer["data"]["resumed"] is False
    assert await heard(ann_back, ann) == []
    assert bob_answer["data"]["resumed"] is True
    assert [(f["type"], f["data"]["n"]) for f in await heard(bob_back, bob)] == [
        ("test.said", 0),
        ("test.said", 1),
    ]
    assert cid_answer["data"]["resumed"] is True
    assert [f["data"] for f in await heard(cid_back, cid)] == [{"n": 0, "slow": True}]


async def test_an_old_cursor_refuses_its_own_socket_not_a_recent_one_beside_it(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme, gamma = [await off_loop(make_workspace, slug) for slug in ("acme", "gamma")]
    ann, ann_token = await off_loop(make_member, "ann", acme)
    bob, bob_token = await off_loop(make_member, "bob", acme)
    cid, cid_token = await off_loop(make_member, "cid", gamma)
    server = live_servers.get("batches", **SETTINGS)
    old = await went_away(ws, server, ann_token, ann, scope="acme")
    await off_loop(said, acme.pk, 1200)  # ann missed all of these
    recent = await went_away(ws, server, bob_token, bob, scope="acme")
    cid_cursor = await went_away(ws, server, cid_token, cid, scope="gamma")
    await off_loop(said, gamma.pk, 1, slow=True)
    await off_loop(said, acme.pk, 3, event_type="test.after")

    holding = asyncio.ensure_future(resuming(ws, server, cid_token, cid_cursor, scope="gamma"))
    await asyncio.sleep(0.3)
    (ann_back, ann_answer), (bob_back, bob_answer) = await asyncio.gather(
        resuming(ws, server, ann_token, old, scope="acme"),
        resuming(ws, server, bob_token, recent, scope="acme"),
    )
    await holding

    assert ann_answer["data"]["resumed"] is False
    assert await heard(ann_back, ann) == []
    assert bob_answer["data"]["resumed"] is True
    assert [(f["type"], f["data"]["n"]) for f in await heard(bob_back, bob)] == [
        ("test.after", 0),
        ("test.after", 1),
        ("test.after", 2),
    ]


async def test_a_recheck_asked_during_a_resume_holds_its_frames_until_it_answers(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    server = live_servers.get("batches", **SETTINGS)
    cursor = await went_away(ws, server, token, ann, scope="acme")
    await off_loop(said, acme.pk, 1, slow=True)

    coming_back = asyncio.ensure_future(resuming(ws, server, token, cursor, scope="acme"))
    await asyncio.sleep(0.3)  # its resume is planning the slow event: ann reads acme still
    await off_loop(Membership.objects.filter(user=ann, workspace=acme).delete)
    await off_loop(Company.objects.create, workspace=acme, name="Not for ann any more")
    back, answer = await coming_back

    assert answer["data"]["resumed"] is True
    # Its recheck hands it a cursor naming no scope (owed until its frames are let go).
    assert [frame for frame in await heard(back, ann) if frame["type"] != "cursor"] == []


async def test_a_resuming_socket_counts_once_toward_the_accounts_socket_limit(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    server = live_servers.get("batches-two", **SETTINGS, REALTIME_MAX_SOCKETS_PER_USER=2)
    cursor = await went_away(ws, server, token, ann, scope="acme")
    await off_loop(said, acme.pk, 1, slow=True)

    coming_back = asyncio.ensure_future(resuming(ws, server, token, cursor, scope="acme"))
    await asyncio.sleep(0.3)  # its resume is planning the slow event
    other = await ws.connect(server)
    answer = await other.authenticate(token, scope="acme")
    _, resumed = await coming_back

    assert (answer["type"], resumed["data"]["resumed"]) == ("auth_success", True)


async def test_a_resuming_socket_whose_held_frames_reach_the_bound_is_closed_1012(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    server = live_servers.get("held", **SETTINGS, REALTIME_NOTIFY_QUEUE_SIZE=8)
    cursor = await went_away(ws, server, token, ann, scope="acme")
    await off_loop(said, acme.pk, 1, slow=True)
    before = await off_loop(overflows, server)
    client = await ws.connect(server)
    await client.send("authenticate", {"token": token, "scope": "acme", "resume": cursor})

    await asyncio.sleep(0.3)  # its resume is planning the slow event: live frames are held
    for _ in range(4):
        await off_loop(said, acme.pk, 3, event_type="test.live")  # 12 > 10 (twice 5, over 8)

    assert await client.closed_with() == 1012
    assert await off_loop(overflows, server) == before + 1


def overflows(server: Server) -> float:
    """The sockets a server closed because their held frames reached the bound."""
    key = ("realtime_queue_overflows_total", (("queue", "held_frames"),))
    return server.metrics().get(key, 0.0)


async def test_a_trim_committed_while_the_history_is_read_past_the_cursor_refuses_the_resume(
    live_servers: LiveServers, ws: Clients, each_transport: str
) -> None:
    if each_transport == "redis":
        pytest.skip("a read of a Redis stream that lost the entry after it fails (closed 1012)")
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    server = live_servers.get("batches-long", **{**SETTINGS, "REALTIME_RESUME_MAX_FRAMES": 2000})
    cursor = await went_away(ws, server, token, ann, scope="acme")
    await off_loop(said, acme.pk, 1, slow=True)
    await off_loop(said, acme.pk, 1200)  # more than a page of the log

    coming_back = asyncio.ensure_future(resuming(ws, server, token, cursor, scope="acme"))
    await asyncio.sleep(0.3)  # its first page read, it plans the slow event
    # A trim commits: the start of the history, into the page it reads next.
    await off_loop(trim_up_to, place(ann.pk, cursor, acme.pk), 1100)
    back, answer = await coming_back

    assert answer["data"]["resumed"] is False
    assert await heard(back, ann) == []
