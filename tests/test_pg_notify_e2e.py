"""The pg_notify transport end to end: daphne workers LISTENing, this process publishing.

Every server here runs with ``REALTIME_TRANSPORT="pg_notify"``, and so does this process (the
``settings`` fixture), so what a test writes or broadcasts goes out with ``pg_notify`` under
the transport's 7,000-byte budget and reaches the workers through their LISTEN connections.
The servers' state endpoint (``tests.urls``) shows what each worker LISTENs to. Waits are
bounded; absence is proven with a marker sent afterwards.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from collections.abc import Iterable
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.contenttypes.models import ContentType
from django.db import connection, transaction

from realtime.auth import issue_token
from realtime.broadcast import broadcast_to_scope, broadcast_to_users
from realtime.limits import PG_NOTIFY_BUDGET
from realtime.messages import base_channel, scope_channel
from realtime.transports.pg_listener import APPLICATION_NAME
from realtime.writes.packing import scope_messages
from tests.helpers import ROOT, off_loop, only_on, subprocess_env
from tests.live import Client, Clients, LiveServers, Server
from tests.testapp.models import Comment, Company, Membership, Workspace

pytestmark = [pytest.mark.django_db(transaction=True), only_on("postgresql")]

PG_NOTIFY = {"REALTIME_TRANSPORT": "pg_notify"}
MARKER = "test.marker"
Frame = dict[str, Any]


@pytest.fixture(autouse=True)
def publish_with_pg_notify(settings: Any) -> None:
    settings.REALTIME_TRANSPORT = "pg_notify"


@pytest.fixture
def worker(live_servers: LiveServers) -> Server:
    return live_servers.get("worker-1", **PG_NOTIFY)


def make_workspace(slug: str) -> Workspace:
    return Workspace.objects.create(name=slug.title(), slug=slug)


def make_member(username: str, *workspaces: Workspace) -> tuple[Any, str]:
    user = get_user_model().objects.create_user(username=username)
    for workspace in workspaces:
        Membership.objects.create(workspace=workspace, user=user)
    return user, issue_token(user)


def listening(state: dict[str, Any]) -> set[str]:
    return set(state["listening"])


async def settled(
    server: Server, user_ids: Iterable[Any], sockets: int, *scopes: Workspace
) -> dict[str, Any]:
    """Wait until ``server`` holds ``sockets`` sockets of these accounts and LISTENs to the
    base channel and to these scopes: a message published afterwards reaches them."""
    accounts = set(user_ids)
    wanted = {base_channel(), *(scope_channel(scope.pk) for scope in scopes)}

    def ready(state: dict[str, Any]) -> bool:
        held = [s for s in state["sockets"] if s["user_id"] in accounts]
        return len(held) == sockets and wanted <= listening(state)

    return await server.wait_for_state(ready)


async def subscribe(server: Server, client: Client, user_id: Any, *channels: str) -> None:
    """Subscribe and wait until the server shows it for that account."""
    await client.send("subscribe", {"channels": list(channels)})

    def shown(state: dict[str, Any]) -> bool:
        return any(
            s["user_id"] == user_id and set(channels) <= set(s["channels"])
            for s in state["sockets"]
        )

    await server.wait_for_state(shown)


async def marker(*user_ids: Any) -> None:
    await off_loop(broadcast_to_users, list(user_ids), MARKER, None)


async def frames_before_marker(client: Client) -> list[Frame]:
    return await client.frames_until(MARKER)


def typed(frames: list[Frame], prefix: str) -> list[Frame]:
    return [frame for frame in frames if str(frame.get("type", "")).startswith(prefix)]


def listener_backends() -> set[int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = %s",
            [APPLICATION_NAME],
        )
        return {row[0] for row in cursor.fetchall()}


def message_size(scope_id: Any, event_type: str, data: Any) -> int:
    """Bytes of the internal message ``broadcast_to_scope(scope_id, event_type, data)`` sends
    when nothing is cut (``mid`` is always 32 hex digits)."""
    ((_, payload),) = scope_messages(
        scope_id, event_type, data, channels=None, meta={}, budget=None
    )
    return len(payload)


# LISTEN follows the sockets ----------------------------------------------------------------


async def test_a_worker_listens_to_the_scopes_it_holds_and_unlistens_when_the_last_socket_goes(
    worker: Server, ws: Clients
) -> None:
    acme, beta = await off_loop(make_workspace, "acme"), await off_loop(make_workspace, "beta")
    ann, ann_token = await off_loop(make_member, "ann", acme, beta)
    bob, bob_token = await off_loop(make_member, "bob", acme)
    first = await ws.authenticated(worker, ann_token, scope="acme")
    second = await ws.authenticated(worker, bob_token, scope="acme")
    state = await settled(worker, [ann.pk, bob.pk], 2, acme)
    assert scope_channel(beta.pk) not in listening(state)  # a scope nobody here reads
    assert state["listener_pid"] in await off_loop(listener_backends)

    await subscribe(worker, first, ann.pk, "company")
    await off_loop(Company.objects.create, workspace=beta, name="Elsewhere")
    await off_loop(Company.objects.create, workspace=acme, name="Here")
    await marker(ann.pk)
    heard = await frames_before_marker(first)
    assert [(f["type"], f["data"]["name"]) for f in heard] == [("company.created", "Here")]

    await first.close()
    state = await worker.wait_for_state(lambda s: s["by_scope"].get(str(acme.pk)) == 1)
    assert scope_channel(acme.pk) in listening(state)  # bob still reads acme
    await second.close()
    state = await worker.wait_for_state(
        lambda s: scope_channel(acme.pk) not in listening(s) and str(acme.pk) not in s["by_scope"]
    )
    assert base_channel() in listening(state)


# With the log (the default): messages of any size arrive whole ---------------------------


async def test_fourteen_thousand_characters_of_data_arrive_whole_through_the_log(
    worker: Server, ws: Clients
) -> None:
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    client = await ws.authenticated(worker, token, scope="acme")
    await settled(worker, [ann.pk], 1, acme)
    await off_loop(broadcast_to_scope, acme.pk, "test.big", "x" * 14_000)
    await off_loop(broadcast_to_scope, acme.pk, "test.small", "after")
    frames = [await client.wait_for(lambda f: f["type"].startswith("test.")) for _ in range(2)]
    assert frames == [
        {"type": "test.big", "data": "x" * 14_000, "scope_id": acme.pk},
        {"type": "test.small", "data": "after", "scope_id": acme.pk},
    ]


async def test_an_oversized_record_event_arrives_whole_with_its_channels(
    worker: Server, ws: Clients
) -> None:
    acme = await off_loop(make_workspace, "acme")
    ann, ann_token = await off_loop(make_member, "ann", acme)
    bob, bob_token = await off_loop(make_member, "bob", acme)
    listed = await ws.authenticated(worker, ann_token, scope="acme")
    unlisted = await ws.authenticated(worker, bob_token, scope="acme")
    await subscribe(worker, listed, ann.pk, "contact:1")
    await subscribe(worker, unlisted, bob.pk, "company")
    await settled(worker, [ann.pk, bob.pk], 2, acme)
    channels = [f"contact:{n}" for n in range(1, 601)]
    await off_loop(broadcast_to_scope, acme.pk, "test.wide", "z" * 14_000, channels=channels)
    await marker(ann.pk, bob.pk)
    wide = {"type": "test.wide", "data": "z" * 14_000, "scope_id": acme.pk}
    assert typed(await frames_before_marker(listed), "test.") == [wide]
    assert typed(await frames_before_marker(unlisted), "test.") == []


# Without the log: the 7,000-byte budget ----------------------------------------------------

NO_LOG = {**PG_NOTIFY, "REALTIME_PG_NOTIFY_LOG": False}


@pytest.fixture
def bare_worker(live_servers: LiveServers, settings: Any) -> Server:
    """A worker, and this process publishing, with the log off (bare NOTIFY)."""
    settings.REALTIME_PG_NOTIFY_LOG = False
    return live_servers.get("bare-worker", **NO_LOG)


async def test_fourteen_thousand_characters_of_data_arrive_as_null_and_truncated(
    bare_worker: Server, ws: Clients
) -> None:
    worker = bare_worker
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    client = await ws.authenticated(worker, token, scope="acme")
    await settled(worker, [ann.pk], 1, acme)
    await off_loop(broadcast_to_scope, acme.pk, "test.big", "x" * 14_000)
    frame = await client.wait_for(lambda f: f["type"] == "test.big")
    assert frame == {"type": "test.big", "data": None, "truncated": True, "scope_id": acme.pk}


async def test_an_oversized_record_event_keeps_its_model_and_id(
    bare_worker: Server, ws: Clients
) -> None:
    worker = bare_worker
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    company = await off_loop(Company.objects.create, workspace=acme, name="Initech")
    client = await ws.authenticated(worker, token, scope="acme")
    await subscribe(worker, client, ann.pk, "remark")
    await settled(worker, [ann.pk], 1, acme)

    def remark() -> Comment:
        return Comment.objects.create(
            workspace=acme,
            text="y" * 14_000,
            target_type=ContentType.objects.get_for_model(Company),
            target_id=company.pk,
        )

    comment = await off_loop(remark)
    frame = await client.wait_for(lambda f: f["type"] == "remark.created")
    assert frame == {
        "type": "remark.created",
        "data": {"model": "remark", "id": comment.pk},
        "truncated": True,
        "scope_id": acme.pk,
    }


async def test_hundreds_of_channels_and_a_huge_payload_reach_every_socket_of_the_scope(
    bare_worker: Server, ws: Clients
) -> None:
    worker = bare_worker
    acme, beta = await off_loop(make_workspace, "acme"), await off_loop(make_workspace, "beta")
    ann, ann_token = await off_loop(make_member, "ann", acme)
    bob, bob_token = await off_loop(make_member, "bob", acme)
    carol, carol_token = await off_loop(make_member, "carol", beta)
    listed = await ws.authenticated(worker, ann_token, scope="acme")
    unlisted = await ws.authenticated(worker, bob_token, scope="acme")
    outsider = await ws.authenticated(worker, carol_token, scope="beta")
    await subscribe(worker, listed, ann.pk, "contact:1")
    await subscribe(worker, unlisted, bob.pk, "company")
    await settled(worker, [ann.pk, bob.pk, carol.pk], 3, acme, beta)
    channels = [f"contact:{n}" for n in range(1, 601)]

    # Within the budget, the channels narrow the event to the socket subscribed to one.
    await off_loop(broadcast_to_scope, acme.pk, "test.narrow", "small", channels=channels[:5])
    # Over it even without its data, the event drops its channels: the whole scope hears it.
    await off_loop(broadcast_to_scope, acme.pk, "test.wide", "z" * 14_000, channels=channels)
    await marker(ann.pk, bob.pk, carol.pk)
    wide = {"type": "test.wide", "data": None, "truncated": True, "scope_id": acme.pk}
    narrow = {"type": "test.narrow", "data": "small", "scope_id": acme.pk}
    assert typed(await frames_before_marker(listed), "test.") == [narrow, wide]
    assert typed(await frames_before_marker(unlisted), "test.") == [wide]
    assert typed(await frames_before_marker(outsider), "test.") == []


async def test_a_payload_that_fits_keeps_its_data(bare_worker: Server, ws: Clients) -> None:
    worker = bare_worker
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    client = await ws.authenticated(worker, token, scope="acme")
    await settled(worker, [ann.pk], 1, acme)
    data = {"model": "contact", "id": 7, "text": "é" * 1_000, "n": [1, 2.5, None, True]}
    await off_loop(broadcast_to_scope, acme.pk, "test.fits", data)
    frame = await client.wait_for(lambda f: f["type"] == "test.fits")
    assert frame == {"type": "test.fits", "data": data, "scope_id": acme.pk}


async def test_a_message_of_exactly_the_budget_keeps_its_data_and_one_byte_more_is_truncated(
    bare_worker: Server, ws: Clients
) -> None:
    worker = bare_worker
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    client = await ws.authenticated(worker, token, scope="acme")
    await settled(worker, [ann.pk], 1, acme)
    fill = PG_NOTIFY_BUDGET - message_size(acme.pk, "test.sized", "")
    assert message_size(acme.pk, "test.sized", "x" * fill) == PG_NOTIFY_BUDGET == 7000
    assert message_size(acme.pk, "test.sized", "x" * (fill + 1)) == PG_NOTIFY_BUDGET + 1
    await off_loop(broadcast_to_scope, acme.pk, "test.sized", "x" * fill)
    await off_loop(broadcast_to_scope, acme.pk, "test.sized", "x" * (fill + 1))
    await marker(ann.pk)
    assert typed(await frames_before_marker(client), "test.sized") == [
        {"type": "test.sized", "data": "x" * fill, "scope_id": acme.pk},
        {"type": "test.sized", "data": None, "truncated": True, "scope_id": acme.pk},
    ]


async def test_the_budget_counts_utf8_bytes_not_characters(
    bare_worker: Server, ws: Clients
) -> None:
    worker = bare_worker
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    client = await ws.authenticated(worker, token, scope="acme")
    await settled(worker, [ann.pk], 1, acme)
    data = "é" * 3_600  # 3,600 characters, 7,200 bytes
    message = scope_messages(acme.pk, "test.wide_chars", data, channels=None, meta={}, budget=None)
    ((_, payload),) = message
    assert len(payload.decode()) < PG_NOTIFY_BUDGET < len(payload)
    await off_loop(broadcast_to_scope, acme.pk, "test.wide_chars", data)
    frame = await client.wait_for(lambda f: f["type"] == "test.wide_chars")
    assert frame == {
        "type": "test.wide_chars",
        "data": None,
        "truncated": True,
        "scope_id": acme.pk,
    }


async def test_an_exclude_list_too_long_for_the_budget_is_dropped_with_a_warning(
    bare_worker: Server, ws: Clients, caplog: pytest.LogCaptureFixture
) -> None:
    worker = bare_worker
    acme = await off_loop(make_workspace, "acme")
    ann, ann_token = await off_loop(make_member, "ann", acme)
    bob, bob_token = await off_loop(make_member, "bob", acme)
    author = await ws.authenticated(worker, ann_token, scope="acme")
    reader = await ws.authenticated(worker, bob_token, scope="acme")
    await settled(worker, [ann.pk, bob.pk], 2, acme)
    excluded = [ann.pk, *range(10**12, 10**12 + 600)]  # 600 more ids: ~8,400 bytes
    with caplog.at_level(logging.WARNING, logger="realtime"):
        await off_loop(
            broadcast_to_scope, acme.pk, "test.courtesy", {"n": 1}, exclude_user_ids=excluded
        )
    expected = {"type": "test.courtesy", "data": {"n": 1}, "scope_id": acme.pk}
    # The exclusion was a courtesy: the event still goes, whole, to everyone, author included.
    for client in (author, reader):
        assert await client.wait_for(lambda f: f["type"] == "test.courtesy") == expected
    assert any("dropping the exclude list" in r.getMessage() for r in caplog.records)


async def test_an_audience_too_long_for_one_message_is_split_and_each_reader_hears_once(
    worker: Server, ws: Clients
) -> None:
    acme = await off_loop(make_workspace, "acme")
    ann, ann_token = await off_loop(make_member, "ann", acme)
    bob, bob_token = await off_loop(make_member, "bob", acme)
    carol, carol_token = await off_loop(make_member, "carol", acme)
    clients = {
        ann.pk: await ws.authenticated(worker, ann_token, scope="acme"),
        bob.pk: await ws.authenticated(worker, bob_token, scope="acme"),
        carol.pk: await ws.authenticated(worker, carol_token, scope="acme"),
    }
    await settled(worker, clients, 3, acme)
    # 200 ids of 41 digits do not fit in 7,000 bytes: the slice is halved until each fits.
    audience = [ann.pk, bob.pk, *range(10**40, 10**40 + 398)]
    await off_loop(broadcast_to_scope, acme.pk, "test.for_some", {"n": 2}, audience=audience)
    await marker(*clients)
    heard = {pk: typed(await frames_before_marker(c), "test.") for pk, c in clients.items()}
    expected = {"type": "test.for_some", "data": {"n": 2}, "scope_id": acme.pk}
    assert heard == {ann.pk: [expected], bob.pk: [expected], carol.pk: []}


# Identity of messages and several workers --------------------------------------------------


async def test_identical_events_in_one_transaction_are_each_delivered(
    worker: Server, ws: Clients
) -> None:
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    client = await ws.authenticated(worker, token, scope="acme")
    await settled(worker, [ann.pk], 1, acme)

    def twice() -> None:
        with transaction.atomic():
            broadcast_to_scope(acme.pk, "test.twice", {"same": True})
            broadcast_to_scope(acme.pk, "test.twice", {"same": True})

    await off_loop(twice)
    await marker(ann.pk)
    same = {"type": "test.twice", "data": {"same": True}, "scope_id": acme.pk}
    assert typed(await frames_before_marker(client), "test.") == [same, same]


def run_publish_contacts(slug: str, count: int) -> list[int]:
    """Run ``manage.py publish_contacts`` in a process of its own; return the contacts' ids."""
    env = subprocess_env()
    env["REALTIME_TEST_SETTINGS"] = json.dumps(PG_NOTIFY)
    done = subprocess.run(
        [sys.executable, "manage.py", "publish_contacts", slug, str(count)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [int(pk) for pk in done.stdout.split()]


async def test_a_command_publishing_contacts_reaches_every_subscribed_socket_on_two_workers_once(
    live_servers: LiveServers, ws: Clients
) -> None:
    workers = [live_servers.get(name, **PG_NOTIFY) for name in ("worker-1", "worker-2")]
    acme = await off_loop(make_workspace, "acme")
    ann, ann_token = await off_loop(make_member, "ann", acme)
    bob, bob_token = await off_loop(make_member, "bob", acme)
    subscribed: list[Client] = []
    unsubscribed: list[Client] = []
    for server in workers:
        for user, token in ((ann, ann_token), (bob, bob_token)):
            client = await ws.authenticated(server, token, scope="acme")
            await subscribe(server, client, user.pk, "contact")
            subscribed.append(client)
        idle = await ws.authenticated(server, bob_token, scope="acme")
        unsubscribed.append(idle)
        await settled(server, [ann.pk, bob.pk], 3, acme)
    pids = [(await asyncio.to_thread(server.state))["listener_pid"] for server in workers]
    assert len(set(pids)) == 2  # one LISTEN connection per worker

    ids = await asyncio.to_thread(run_publish_contacts, "acme", 25)
    assert len(set(ids)) == 25
    await marker(ann.pk, bob.pk)

    for client in subscribed:
        heard = typed(await frames_before_marker(client), "contact.")
        assert [f["type"] for f in heard] == ["contact.created"] * 25
        assert [f["data"]["id"] for f in heard] == ids  # each once, in commit order
    for client in unsubscribed:
        assert typed(await frames_before_marker(client), "contact.") == []
