"""Resuming while writes are under way: commits out of id order from two processes, a publish
holding the log while a socket comes back, and writes flowing through every reconnect.

Each test compares what a socket heard with what the log holds: after ``resumed: true`` a
socket hears every message of its channels after its cursor, once, in order, then the live
ones, whatever happened at the seam. Processes other than the test's are ``tests.worker``;
waits are bounded and absence is proven with a marker sent afterwards.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from realtime.broadcast import broadcast_to_user
from realtime.messages import base_channel
from realtime.positions import Vector
from tests.helpers import off_loop, only_on, start_worker
from tests.histories import messages_between, place
from tests.live import Client, Clients, LiveServers
from tests.test_resume_e2e import heard, kinds, make_member, make_workspace, resuming, went_away

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("each_transport")]

TICK = "test.tick"


@pytest.fixture
def workers() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)


def said(process: subprocess.Popen[str], line: str = "") -> str:
    """Send ``line`` (if any) to a worker and return the next line it prints."""
    assert process.stdin is not None
    assert process.stdout is not None
    if line:
        process.stdin.write(f"{line}\n")
        process.stdin.flush()
    return process.stdout.readline().strip()


@only_on("postgresql", "mysql")  # SQLite has one writer at a time: no commit overtakes another
async def test_writes_committed_out_of_id_order_by_two_processes_are_replayed_once_in_commit_order(
    live_servers: LiveServers, ws: Clients, workers: list[subprocess.Popen[str]]
) -> None:
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    server = live_servers.get()
    cursor = await went_away(ws, server, token, ann, scope="acme")

    first = start_worker("hold-write", str(acme.pk), "first")
    workers.append(first)
    first_id = int((await off_loop(said, first)).split()[1])
    second = start_worker("hold-write", str(acme.pk), "second")
    workers.append(second)
    second_id = int((await off_loop(said, second)).split()[1])
    assert first_id < second_id
    assert await off_loop(said, second, "commit") == "committed"
    assert await off_loop(said, first, "commit") == "committed"

    back, answer = await resuming(ws, server, token, cursor, scope="acme")

    assert answer["data"]["resumed"] is True
    assert kinds(await heard(back, ann)) == [
        ("company.created", second_id),
        ("company.created", first_id),
    ]


async def test_a_publish_holding_the_log_while_a_socket_comes_back_reaches_it_once(
    live_servers: LiveServers,
    ws: Clients,
    workers: list[subprocess.Popen[str]],
    each_transport: str,
) -> None:
    if each_transport == "redis":
        pytest.skip("a Redis publish is one atomic script: nothing holds the history open")
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    server = live_servers.get()
    cursor = await went_away(ws, server, token, ann, scope="acme")
    await off_loop(broadcast_to_user, ann.pk, "user.notice", {"text": "missed"})
    holder = start_worker("hold-notice", each_transport, str(ann.pk), "under way")
    workers.append(holder)
    assert await off_loop(said, holder) == "inserted"

    back, answer = await resuming(ws, server, token, cursor, scope="acme")
    assert answer["data"]["resumed"] is True
    assert await off_loop(said, holder, "commit") == "committed"

    frames = await heard(back, ann)
    assert [f["data"] for f in frames] == [{"text": "missed"}, {"text": "under way"}]


def ticks_in_log(user_id: Any, after: Vector, upto: Vector | None = None) -> list[int]:
    """The ``n`` of every tick for ``user_id`` the history holds after ``after`` (up to
    ``upto``), in order."""
    entries = messages_between([base_channel()], after, upto)
    rows = [json.loads(payload) for _, payload, _ in entries]
    return [
        row["data"]["n"]
        for row in rows
        if row.get("event_type") == TICK and user_id in (row.get("user_ids") or [])
    ]


class Ticker:
    """A thread publishing numbered ticks to one account, one per publish, until stopped."""

    def __init__(self, user_id: Any, pace: float) -> None:
        self.user_id = user_id
        self.pace = pace
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                broadcast_to_user(self.user_id, TICK, {"n": self.sent})
                self.sent += 1
                self._stop.wait(self.pace)
        finally:
            connection.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


async def test_ticks_flowing_through_reconnects_each_reach_the_socket_once_in_order(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    servers = [live_servers.get("worker-1"), live_servers.get("worker-2")]
    ticker = Ticker(ann.pk, pace=0.004)
    heard_ticks: list[int] = []
    cursor: Any = None
    ticker.start()
    try:
        for round_ in range(6):
            client, answer = await resuming(ws, servers[round_ % 2], token, cursor, scope="acme")
            assert answer["data"].get("resumed", True) is True
            start = place(ann.pk, answer["data"]["cursor"], acme.pk)
            assert start is not None
            frames = [await client.wait_for(lambda f: f["type"] == TICK) for _ in range(15)]
            client.drop()
            cursor = frames[-1]["cursor"]
            end = place(ann.pk, cursor, acme.pk)
            assert end is not None
            got = [frame["data"]["n"] for frame in frames]
            # Exactly what the log holds for this socket between its start and its last frame.
            assert got == await off_loop(ticks_in_log, ann.pk, start, end)
            heard_ticks += got
    finally:
        await off_loop(ticker.stop)
    last, answer = await resuming(ws, servers[0], token, cursor, scope="acme")
    assert answer["data"]["resumed"] is True
    rest = [f for f in await heard(last, ann) if f["type"] == TICK]
    heard_ticks += [frame["data"]["n"] for frame in rest]
    assert heard_ticks == list(range(heard_ticks[0], ticker.sent))
    await asyncio.sleep(0)


async def test_a_socket_starting_now_hears_every_write_after_its_cursor_even_mid_handshake(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    server = live_servers.get()
    ticker = Ticker(ann.pk, pace=0.002)
    ticker.start()
    clients: list[tuple[Client, Vector]] = []
    try:
        for _ in range(5):
            client, answer = await resuming(ws, server, token, scope="acme")
            start = place(ann.pk, answer["data"]["cursor"], acme.pk)
            assert start is not None
            clients.append((client, start))
    finally:
        await off_loop(ticker.stop)
    # Every tick is committed now: each socket heard exactly those after its cursor.
    for client, start in clients:
        frames = [f for f in await heard(client, ann) if f["type"] == TICK]
        expected = await off_loop(ticks_in_log, ann.pk, start)
        assert [f["data"]["n"] for f in frames] == expected
        if client is clients[0][0]:
            # The first started before the ticker stopped: it heard ticks, up to the last.
            assert expected[-1:] == [ticker.sent - 1]
