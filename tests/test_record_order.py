"""Per-record order over real sockets: two processes writing the same rows as fast as they
can, and a socket that must see each row's versions in the order they committed.

Each writer adds 1 to ``points`` of three shared tickets, over and over, so a row's versions
committed in increasing ``points``: a frame whose ``points`` is not above the last one the
socket had for that row is an inversion (an older version shown after a newer one), and the
last frame of each row must be the row as the database holds it at the end. A marker sent
to the scope after both writers are done ends the reading.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, transaction

from realtime.auth import issue_token
from realtime.broadcast import broadcast_to_scope
from realtime.models import OutboxItem
from realtime.sockets.record_order import RecordOrder
from tests.helpers import (
    ROOT,
    WAIT,
    forget_messages,
    go_together,
    off_loop,
    only_on,
    published,
    subprocess_env,
)
from tests.live import Client, Clients, LiveServers, Server
from tests.proxy import Proxy
from tests.redis_server import RedisServer
from tests.test_resume_e2e import heard, kinds, make_member, make_workspace, resuming, went_away
from tests.testapp.models import Contact, Membership, Tag, Ticket, Workspace

pytestmark = pytest.mark.django_db(transaction=True)

MARKER = "test.marker"
#: Writes per writer process.
WRITES = 300


def shared_rows() -> tuple[Workspace, list[int], str]:
    """A workspace, three tickets in it and the token of a member who reads them."""
    acme = Workspace.objects.create(name="Acme", slug="acme")
    reader = get_user_model().objects.create_user(username="reader")
    Membership.objects.create(workspace=acme, user=reader)
    ids = [Ticket.objects.create(workspace=acme, title=f"t{n}").pk for n in range(3)]
    return acme, ids, issue_token(reader)


def test_a_merge_keeps_each_row_s_greater_number_and_whether_it_deleted_the_row() -> None:
    live, replayed = RecordOrder(), RecordOrder()
    live.superseded(told(7, row=1))
    live.superseded(told(3, row=2))
    replayed.superseded(told(5, row=1))
    replayed.superseded(told(4, row=2))
    replayed.superseded({**told(6, row=3), "event_type": "ticket.deleted"})

    live.merge(replayed)

    assert not live.superseded(told(7, row=1))  # its own 7 stays: the replay's 5 is older
    assert live.superseded(told(3, row=2))  # the replay's 4 is the greater
    assert not live.superseded(told(4, row=2))
    assert live.superseded(links(5, row=3))  # the replay's delete is remembered as one


def a_late_write(pk: int, committed: threading.Event, gate: threading.Event) -> None:
    """Set ``points`` of ticket ``pk`` to 4 in a transaction whose publish waits (behind an
    on_commit callback registered first) until ``gate`` is set; ``committed`` once it has."""

    def hold_the_publish() -> None:
        committed.set()
        gate.wait(WAIT * 3)

    try:
        with transaction.atomic():
            transaction.on_commit(hold_the_publish)
            Ticket.objects.filter(pk=pk).update(points=4)
    finally:
        connection.close()


def set_points(pk: int, points: int) -> None:
    with transaction.atomic():
        Ticket.objects.filter(pk=pk).update(points=points)


async def frames_through(client: Client, type_: str) -> list[dict[str, Any]]:
    """Read frames up to and including one of ``type_`` (bounded)."""
    heard = []
    async with asyncio.timeout(WAIT):
        while True:
            heard.append(frame := await client.next_frame())
            if frame.get("type") == type_:
                return heard


@pytest.mark.usefixtures("each_transport")
async def test_an_older_version_coming_live_after_a_resume_replayed_a_newer_one_is_dropped(
    live_servers: LiveServers, ws: Clients
) -> None:
    # The socket leaves; v4 of a row commits, then v5, published at once; v4's publish waits.
    # The socket resumes on a worker that holds no other socket of the scope: its replay
    # gives v5, then v4 comes live. The replay's memory joined the worker's: v4 is dropped.
    acme, (pk, *_), token = await off_loop(shared_rows)
    first, other = live_servers.get(), live_servers.get("order-resumed")
    stays = await ws.authenticated(first, token, scope="acme", resume=None, channels=["ticket"])
    leaves = await ws.authenticated(first, token, scope="acme", resume=None, channels=["ticket"])
    await off_loop(end_reading, acme.pk)
    await stays.frames_until(MARKER)
    cursor = (await frames_through(leaves, MARKER))[-1]["cursor"]
    committed, gate = threading.Event(), threading.Event()
    late = threading.Thread(target=a_late_write, args=(pk, committed, gate))
    late.start()
    try:
        assert await off_loop(committed.wait, WAIT)
        leaves.drop()
        await off_loop(set_points, pk, 5)
        assert (await frames_through(stays, "ticket.updated"))[-1]["data"]["points"] == 5

        back = await ws.connect(other)
        answer = await back.authenticate(token, scope="acme", resume=cursor, channels=["ticket"])
        assert answer["data"]["resumed"] is True, answer
        replayed = await frames_through(back, "ticket.updated")
        assert replayed[-1]["data"]["points"] == 5
    finally:
        gate.set()
        await off_loop(late.join, WAIT)
    await off_loop(end_reading, acme.pk)  # after v4's publish: it has come by then

    assert await points_until_marker(back) == []
    assert await points_until_marker(stays) == []  # dropped there as it came, as ever


async def test_a_resume_read_ahead_of_live_delivery_drops_no_version_for_the_sockets_connected(
    live_servers: LiveServers, ws: Clients
) -> None:
    # A slow poller leaves live delivery behind the log; a row is created (v1), then updated
    # (v2) in another transaction; ann resumes before the next poll and her replay gives
    # both. Bob, connected all along, hears both live: what the replay let through is no
    # version older than one live delivery has carried yet.
    acme = await off_loop(make_workspace, "acme")
    ann, ann_token = await off_loop(make_member, "ann", acme)
    bob, bob_token = await off_loop(make_member, "bob", acme)
    server = live_servers.get("slow-poll", REALTIME_POLLING_INTERVAL=4.0)
    cursor = await went_away(ws, server, ann_token, ann, scope="acme")
    bob_socket, _ = await resuming(ws, server, bob_token, scope="acme")
    await heard(bob_socket, bob)  # a poll just happened: the next one is seconds away

    def while_away() -> int:
        with transaction.atomic():
            row = Contact.objects.create(workspace=acme, name="v1")
        with transaction.atomic():
            row.name = "v2"
            row.save()
        return row.pk

    row = await off_loop(while_away)
    back, answer = await resuming(ws, server, ann_token, cursor, scope="acme")
    assert answer["data"]["resumed"] is True

    both = [("contact.created", row), ("contact.updated", row)]
    assert kinds(await heard(back, ann)) == both
    assert kinds(await heard(bob_socket, bob)) == both


async def points_until_marker(client: Client) -> list[int]:
    """The ``points`` of the ticket frames heard before the marker."""
    heard = await client.frames_until(MARKER)
    return [frame["data"]["points"] for frame in heard if frame["type"] == "ticket.updated"]


def race(hows: list[str], ids: list[int], chosen: dict[str, Any]) -> None:
    """Run one writer process per entry of ``hows`` (see ``race-writes`` in ``tests.worker``)
    with the settings ``chosen``, started together, and wait until every one is done."""
    env = {**subprocess_env(), "REALTIME_TEST_SETTINGS": json.dumps(chosen)}
    command = [sys.executable, "-m", "tests.worker", "race-writes"]
    writers = [
        subprocess.Popen(
            [*command, how, ",".join(map(str, ids)), str(WRITES)],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for how in hows
    ]
    try:
        go_together(writers)
        for writer in writers:
            out, _ = writer.communicate(timeout=WAIT * 12)
            assert out.strip() == "done", out
    finally:
        for writer in writers:
            writer.kill()


def end_reading(workspace_id: int) -> None:
    with transaction.atomic():
        broadcast_to_scope(workspace_id, MARKER, None)


async def versions_seen(client: Client) -> dict[int, list[int]]:
    """Each ticket's ``points`` in the order the socket heard them, up to the marker."""
    seen: dict[int, list[int]] = {}
    for frame in await client.frames_until(MARKER, timeout=WAIT * 12):
        if frame.get("type") == "ticket.updated":
            seen.setdefault(frame["data"]["id"], []).append(frame["data"]["points"])
    return seen


async def reader(server: Server, ws: Clients, token: str, acme: Workspace) -> Client:
    """A socket of ``token`` reading acme's tickets, its subscription in place."""
    client = await ws.authenticated(server, token, scope="acme")
    await client.send("subscribe", {"channels": ["ticket"]})
    await off_loop(end_reading, acme.pk)  # the subscription is in place once it is heard
    await client.frames_until(MARKER)
    return client


def assert_in_commit_order(seen: dict[int, list[int]], writes: int) -> None:
    """No row's versions heard out of order, and each row heard last as it is stored."""
    inversions = {
        pk: [(a, b) for a, b in itertools.pairwise(points) if b <= a] for pk, points in seen.items()
    }
    assert {pk: pairs for pk, pairs in inversions.items() if pairs} == {}
    final = dict(Ticket.objects.values_list("pk", "points"))
    assert {pk: points[-1] for pk, points in seen.items()} == final
    assert sum(final.values()) == writes


@pytest.mark.usefixtures("each_transport")
@pytest.mark.parametrize("hows", [["update", "update"], ["update", "save"]])
async def test_two_writers_racing_on_the_same_rows_are_heard_in_commit_order(
    hows: list[str], live_servers: LiveServers, ws: Clients, settings: Any
) -> None:
    acme, ids, token = await off_loop(shared_rows)
    client = await reader(live_servers.get(), ws, token, acme)
    reading = asyncio.create_task(versions_seen(client))

    await off_loop(race, hows, ids, chosen_transport(settings))
    await off_loop(end_reading, acme.pk)

    await off_loop(assert_in_commit_order, await reading, WRITES * len(hows))


def chosen_transport(settings: Any) -> dict[str, Any]:
    names = ("REALTIME_TRANSPORT", "REALTIME_REDIS_URL")
    return {name: getattr(settings, name) for name in names if hasattr(settings, name)}


async def test_writers_racing_while_redis_goes_away_and_back_are_heard_in_commit_order(
    live_servers: LiveServers, ws: Clients, settings: Any, sockets_redis: RedisServer
) -> None:
    """The writers reach Redis through a proxy that is cut mid-race: the publishes that fail
    leave their rows in the outbox, which the worker's sweeper relays late, after newer
    versions of the same rows went out."""
    settings.REALTIME_TRANSPORT = "redis"
    settings.REALTIME_REDIS_URL = sockets_redis.url
    # Every worker on Redis sweeps the outbox: one an earlier test left running on another
    # Redis would relay the rows there. This one's quick sweeper is stopped after, likewise.
    live_servers.stop_all()
    server = live_servers.get(
        "record-order-redis", **chosen_transport(settings), REALTIME_COMMIT_GRACE=0.2
    )
    try:
        await race_through_a_cut(server, ws, chosen_transport(settings), sockets_redis)
    finally:
        server.stop()


async def race_through_a_cut(
    server: Server, ws: Clients, chosen: dict[str, Any], redis: RedisServer
) -> None:
    acme, ids, token = await off_loop(shared_rows)
    client = await reader(server, ws, token, acme)
    reading = asyncio.create_task(versions_seen(client))
    writers_redis = Proxy("127.0.0.1", redis.port)
    await writers_redis.open()
    try:
        through_proxy = {
            **chosen,
            "REALTIME_REDIS_URL": f"redis://127.0.0.1:{writers_redis.port}/0",
        }
        racing = asyncio.create_task(off_loop(race, ["update", "save"], ids, through_proxy))
        for _ in range(2):
            await asyncio.sleep(0.3)
            await writers_redis.close()  # cut, and refused
            await asyncio.sleep(0.3)
            await writers_redis.open()
        await racing
    finally:
        await writers_redis.close()
    async with asyncio.timeout(WAIT):  # the sweeper relays every row the writers left
        while True:
            if not await off_loop(OutboxItem.objects.exists):
                break
            await asyncio.sleep(0.05)
    await off_loop(end_reading, acme.pk)

    await off_loop(assert_in_commit_order, await reading, WRITES * 2)


# Links changed beside a write of their row ----------------------------------------------------


@only_on("postgresql")  # SQLite: one writer at a time; MySQL's foreign key check locks the row
@pytest.mark.parametrize(
    "transport",
    ["table", "tests.durable_transport.DurableTableTransport"],
    ids=["clock", "outbox"],
)
def test_links_added_while_another_transaction_writes_their_row_are_heard_and_undo_nothing(
    transport: str, settings: Any, live_servers: LiveServers
) -> None:
    """``tags.add`` takes its number without holding the contact (PostgreSQL's foreign key
    check takes ``FOR KEY SHARE``, which an ``UPDATE`` does not wait for): a rename committed
    meanwhile takes a greater one and is published first. The links are still heard, after
    it, and tell the contact's identity alone: the name their instance held is the old one."""
    live_servers.stop_all()  # a worker on a durable transport would sweep the outbox too
    settings.REALTIME_TRANSPORT = transport
    acme = Workspace.objects.create(name="Acme", slug="acme")
    contact = Contact.objects.create(workspace=acme, name="Ann")
    tag = Tag.objects.create(workspace=acme, name="vip")
    forget_messages()

    def rename() -> None:
        try:
            with transaction.atomic():
                again = Contact.objects.get(pk=contact.pk)
                again.name = "Ann B."
                again.save()
        finally:
            connection.close()

    with transaction.atomic():
        contact.tags.add(tag)
        other = threading.Thread(target=rename)
        other.start()
        other.join(WAIT)  # not waiting for this transaction: it holds no lock on the row
        assert not other.is_alive()

    heard = [m for _, m in published() if m.get("event_type") == "contact.updated"]
    assert [m["meta"]["changed"] for m in heard] == [["name"], ["tags"]]
    assert heard[0]["meta"]["order"][1] > heard[1]["meta"]["order"][1]
    memory = RecordOrder()
    delivered = [(m["meta"]["changed"], m["data"]) for m in heard if not memory.superseded(m)]
    assert delivered == [
        (["name"], {**delivered[0][1], "name": "Ann B."}),
        (["tags"], {"model": "contact", "id": contact.pk}),
    ]


# A worker's memory of each row's last version -----------------------------------------------


def told(number: int, *, row: Any = 1, source: str = "default:outbox") -> dict[str, Any]:
    return {
        "target": "scope",
        "event_type": "ticket.updated",
        "data": {"model": "ticket", "id": row},
        "meta": {"order": [source, number]},
    }


def test_a_version_older_than_one_let_through_is_dropped_and_the_rest_pass() -> None:
    order = RecordOrder()
    assert [order.superseded(told(n)) for n in (5, 7, 6, 7, 8)] == [
        False,
        False,
        True,  # 6 came after 7
        False,  # another message of write 7 (its accounts', its leavers')
        False,
    ]
    assert not order.superseded(told(1, row=2))  # another row
    assert not order.superseded(told(1, source="other:outbox"))  # another database
    assert not order.superseded({**told(1), "meta": {}})  # no order: as it comes


def test_rows_beyond_the_memory_are_forgotten_oldest_first() -> None:
    order = RecordOrder(size=2)
    for row in (1, 2, 3):
        order.superseded(told(10, row=row))
    assert not order.superseded(told(5, row=1))  # forgotten
    assert order.superseded(told(5, row=3))


def test_a_writer_clock_ahead_of_the_worker_s_is_not_trusted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    order = RecordOrder()
    ahead = time.time_ns() + 60 * 10**9
    with caplog.at_level(logging.WARNING, "realtime"):
        assert not order.superseded(told(ahead, source="default:clock"))
        assert not order.superseded(told(time.time_ns(), source="default:clock"))
    assert "a writer's clock (default:clock) is 60.0 s ahead of this worker's" in caplog.text


def links(number: int, *, row: Any = 1) -> dict[str, Any]:
    return {**told(number, row=row), "meta": {"order": ["default:outbox", number, "links"]}}


def test_links_alone_pass_whatever_came_before_but_the_row_s_delete() -> None:
    order = RecordOrder()
    assert not order.superseded(told(7))
    assert not order.superseded(links(5))  # the row written since: its identity still holds
    assert not order.superseded(links(9))
    assert not order.superseded(told(8))  # links are not remembered
    assert order.superseded(told(6))
    moved = {"order": ["default:outbox", 9], "moved": True}
    assert not order.superseded({**told(9), "event_type": "ticket.deleted", "meta": moved})
    assert not order.superseded(links(8))  # it left some readers' view: still there
    assert not order.superseded({**told(10), "event_type": "ticket.deleted"})
    assert order.superseded(links(9))  # the delete waited for those links: they came before
    assert not order.superseded(links(11))
    assert not order.superseded(links(1, row=2))  # a row never seen
