"""A quiet socket stays resumable: an opted-in socket's ``heartbeat`` is answered with a fresh
cursor, over real sockets on real daphne workers, on both transports.

Time passes only through a short ``REALTIME_RESUME_WINDOW`` on the server and bounded waits;
absence is proven with a marker sent to the account afterwards.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from tests.helpers import off_loop
from tests.histories import place, reached, trim_everything
from tests.live import Client, Clients, LiveServers
from tests.test_resume_e2e import MARKER, heard, kinds, make_member, make_workspace, resuming
from tests.testapp.models import Company

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("each_transport")]

#: Seconds a cursor resumes for on the short-window server.
WINDOW = 2.0
#: Seconds a heartbeat's answer may take before the heartbeat is sent again.
ANSWER_WAIT = 1.0


async def refreshed(client: Client) -> str:
    """Send ``heartbeat`` until it is answered with a ``cursor`` frame (bounded); that frame's
    cursor. The frame is exactly ``{"type": "cursor", "cursor": <c>}``."""
    async with asyncio.timeout(10):
        while True:
            await client.send("heartbeat", None)
            try:
                raw = await asyncio.wait_for(client.connection.recv(), ANSWER_WAIT)
            except TimeoutError:
                continue
            frame = json.loads(raw)
            assert list(frame) == ["type", "cursor"], frame
            assert frame["type"] == "cursor"
            cursor: str = frame["cursor"]
            return cursor


async def test_an_opted_in_socket_s_heartbeat_is_answered_with_a_cursor_not_behind_its_last(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    client, answer = await resuming(ws, live_servers.get(), token, scope="acme")
    start = place(ann.pk, answer["data"]["cursor"], acme.pk)
    assert start is not None

    first = await refreshed(client)
    company = await off_loop(Company.objects.create, workspace=acme, name="Initech")
    frame = await client.wait_for(lambda f: f["type"] == "company.created")
    assert frame["data"]["id"] == company.pk
    second = await refreshed(client)

    first_at = place(ann.pk, first, acme.pk)
    assert reached(first_at, start), (first_at, start)
    frame_at = place(ann.pk, frame["cursor"], acme.pk)
    second_at = place(ann.pk, second, acme.pk)
    assert reached(second_at, frame_at), (second_at, frame_at)


async def test_a_socket_that_did_not_opt_in_gets_no_answer_to_heartbeat(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    client = await ws.connect(live_servers.get())
    assert (await client.authenticate(token, scope="acme"))["type"] == "auth_success"

    await client.send("heartbeat", None)
    await client.send("heartbeat", {"any": "thing"})

    assert await heard(client, ann) == []
    marker = client.received[-1]
    assert marker == {"type": MARKER, "data": None}


async def test_a_quiet_socket_resumes_after_twice_the_window_with_its_refreshed_cursor(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    server = live_servers.get("short-window", REALTIME_RESUME_WINDOW=WINDOW)
    client, answer = await resuming(ws, server, token, scope="acme")
    handed_out = answer["data"]["cursor"]

    # Quiet for twice the window, heartbeating as a client does.
    cursor = handed_out
    quiet_until = time.monotonic() + 2 * WINDOW
    while time.monotonic() < quiet_until:
        await asyncio.sleep(WINDOW / 2)
        cursor = await refreshed(client)
    await client.close()
    missed = await off_loop(Company.objects.create, workspace=acme, name="missed")

    # The cursor of auth_success has expired on the server; the refreshed one has not.
    stale, expired = await resuming(ws, server, token, handed_out, scope="acme")
    assert expired["data"]["resumed"] is False
    await stale.close()
    back, again = await resuming(ws, server, token, cursor, scope="acme")

    assert again["data"]["resumed"] is True
    assert kinds(await heard(back, ann)) == [("company.created", missed.pk)]


async def test_a_refreshed_cursor_whose_message_was_trimmed_resumes_when_nothing_was_lost(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    server = live_servers.get()
    client, _ = await resuming(ws, server, token, scope="acme")
    await off_loop(Company.objects.create, workspace=acme, name="heard")
    await client.wait_for(lambda f: f["type"] == "company.created")
    cursor = await refreshed(client)
    await client.close()

    # Its position's message trimmed, nothing after it: covered, nothing to replay.
    await off_loop(trim_everything)
    back, answer = await resuming(ws, server, token, cursor, scope="acme")
    assert answer["data"]["resumed"] is True
    assert await heard(back, ann) == []
    cursor = await refreshed(back)  # past the marker heard
    await back.close()

    # Its position's message trimmed, what came after it kept: replayed.
    await off_loop(trim_everything)
    missed = await off_loop(Company.objects.create, workspace=acme, name="missed")
    back, answer = await resuming(ws, server, token, cursor, scope="acme")
    assert answer["data"]["resumed"] is True
    assert kinds(await heard(back, ann)) == [("company.created", missed.pk)]


async def test_a_refreshed_cursor_is_refused_once_what_came_after_it_was_trimmed(
    live_servers: LiveServers, ws: Clients
) -> None:
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    server = live_servers.get()
    client, _ = await resuming(ws, server, token, scope="acme")
    cursor = await refreshed(client)
    await client.close()
    await off_loop(Company.objects.create, workspace=acme, name="missed, then trimmed")
    await off_loop(trim_everything)
    await off_loop(Company.objects.create, workspace=acme, name="missed, kept")

    back, answer = await resuming(ws, server, token, cursor, scope="acme")

    assert answer["data"]["resumed"] is False
    assert await heard(back, ann) == []
