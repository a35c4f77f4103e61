"""The ``may_subscribe`` hook, end to end: real daphne servers, real WebSocket clients.

The servers run ``tests.subscribe_auth.ChoosyAuth``, whose hook reads the database (asked on
the event loop it would fail and refuse everything, so every "allowed channel hears" below
also proves it is asked off the loop). A refused channel is dropped like an unknown one: no
frame, no close. Absence is proven with a marker sent to the account afterwards; what a
server holds is read from its manager's state (``tests.urls``).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from realtime.broadcast import broadcast_to_user, recheck_users
from tests.helpers import WAIT, off_loop
from tests.live import Client, Clients, LiveServers, Server, wait_for_follow, wait_for_socket
from tests.test_socket_protocol import make_member, make_workspaces, read_log
from tests.testapp.models import Company, Contact, Membership, Tag, Workspace

pytestmark = pytest.mark.django_db(transaction=True)

CHOOSY = {"REALTIME_AUTH": "tests.subscribe_auth.ChoosyAuth"}
MARKER = "test.marker"


def choosy(live_servers: LiveServers, name: str = "choosy", **settings: Any) -> Server:
    return live_servers.get(name, **CHOOSY, **settings)


async def heard(client: Client, user: Any) -> list[tuple[str, Any]]:
    """What the client received before a marker sent to its account now."""
    await off_loop(broadcast_to_user, user.pk, MARKER, None)
    frames = await client.frames_until(MARKER)
    return [(frame["type"], (frame["data"] or {}).get("id")) for frame in frames]


async def ann_in_acme(server: Server, ws: Clients, *channels: str) -> tuple[Workspace, Any, Client]:
    """The workspace acme, its member ann, and ann's socket reading it, subscribed to
    ``channels`` (and holding them) when any are given.

    With channels, the recheck ann's membership asked for when it was saved is over too: the
    worker may hear it only once the socket is open, and its round, asking the hook about
    the channels, would then race the test's own changes (a round reading a last name the
    test has just changed drops the channel before the test's recheck, held at the gate,
    can ask about it). The marker comes after that request; if it starts a recheck, the
    marker is held until it answers."""
    (acme,) = await off_loop(make_workspaces, "acme")
    user, token = await off_loop(make_member, "ann", acme)
    client = await ws.authenticated(server, token, scope="acme")
    if channels:
        await client.send("subscribe", {"channels": list(channels)})
        await wait_for_socket(server, user.pk, channels=list(channels))
        assert await heard(client, user) == []
    return acme, user, client


def last_name(user: Any, name: str) -> None:
    get_user_model()._default_manager.filter(pk=user.pk).update(last_name=name)


def rename(workspace: Workspace, name: str) -> None:
    Workspace.objects.filter(pk=workspace.pk).update(name=name)


def write_company(workspace: Workspace) -> int:
    return int(Company.objects.create(workspace=workspace, name="c").pk)


def write_contact(workspace: Workspace) -> int:
    return int(Contact.objects.create(workspace=workspace, name="c").pk)


def write_tag_and_company(workspace: Workspace) -> tuple[int, int]:
    tag = Tag.objects.create(workspace=workspace, name="t")
    company = Company.objects.create(workspace=workspace, name="c")
    return tag.pk, company.pk


async def test_a_refused_channel_hears_nothing_and_the_allowed_one_hears(
    live_servers: LiveServers, ws: Clients
) -> None:
    server = choosy(live_servers)
    acme, user, client = await ann_in_acme(server, ws)
    await client.send("subscribe", {"channels": ["tag", "company"]})
    # The refused channel is not held: it takes no room and says nothing.
    await wait_for_socket(server, user.pk, channels=["company"])
    _, company = await off_loop(write_tag_and_company, acme)
    assert await heard(client, user) == [("company.created", company)]


async def test_channels_of_authenticate_go_through_the_hook(
    live_servers: LiveServers, ws: Clients
) -> None:
    server = choosy(live_servers)
    (acme,) = await off_loop(make_workspaces, "acme")
    user, token = await off_loop(make_member, "ann", acme)
    client = await ws.authenticated(server, token, scope="acme", channels=["tag", "company"])
    await wait_for_socket(server, user.pk, channels=["company"])
    _, company = await off_loop(write_tag_and_company, acme)
    assert await heard(client, user) == [("company.created", company)]


async def test_a_resumed_socket_is_not_replayed_frames_of_a_refused_channel(
    live_servers: LiveServers, ws: Clients
) -> None:
    server = choosy(live_servers)
    (acme,) = await off_loop(make_workspaces, "acme")
    user, token = await off_loop(make_member, "ann", acme)
    channels = ["tag", "company"]
    first = await ws.connect(server)
    answer = await first.authenticate(token, scope="acme", resume=None, channels=channels)
    cursor = answer["data"]["cursor"]
    await first.close()
    _, company = await off_loop(write_tag_and_company, acme)
    back = await ws.connect(server)
    answer = await back.authenticate(token, scope="acme", resume=cursor, channels=channels)
    assert answer["data"]["resumed"] is True
    assert await heard(back, user) == [("company.created", company)]


async def test_a_channel_is_asked_about_in_each_scope_the_socket_reads(
    live_servers: LiveServers, ws: Clients
) -> None:
    server = choosy(live_servers)
    acme, secret = await off_loop(make_workspaces, "acme", "secret")
    user, token = await off_loop(make_member, "ann", acme, secret)
    client = await ws.authenticated(server, token, scopes=["acme", "secret"])
    await client.send("subscribe", {"channel": "company"})
    await wait_for_socket(server, user.pk, channels=["company"])
    _, hidden = await off_loop(write_tag_and_company, secret)
    _, shown = await off_loop(write_tag_and_company, acme)
    assert await heard(client, user) == [("company.created", shown)]
    assert hidden != shown


async def test_a_hook_that_raises_refuses_that_subscribes_channels_and_is_logged(
    live_servers: LiveServers, ws: Clients
) -> None:
    server = choosy(live_servers, "choosy-raises")  # its log is this test's alone
    acme, user, client = await ann_in_acme(server, ws)
    await client.send("subscribe", {"channels": ["company", "contact:666"]})
    await client.send("subscribe", {"channel": "contact"})  # read after it
    await wait_for_socket(server, user.pk, channels=["contact"])
    await off_loop(write_tag_and_company, acme)
    contact = await off_loop(Contact.objects.create, workspace=acme, name="c")
    assert await heard(client, user) == [("contact.created", contact.pk)]
    log = await read_log(server)
    assert "may_subscribe failed; the subscribe's channels are refused" in log
    assert "RuntimeError: a bug in may_subscribe" in log  # with its traceback


@pytest.mark.parametrize("debug", [True, False], ids=["debug", "no-debug"])
async def test_with_debug_each_dropped_channel_says_why_in_one_line(
    live_servers: LiveServers, ws: Clients, debug: bool
) -> None:
    server = choosy(live_servers, f"choosy-debug-{debug}", DEBUG=debug)
    _, user, client = await ann_in_acme(server, ws)
    asked = ["contacts", "tag", "contacts", "compani:4", "zzzzzz", "company"]
    await client.send("subscribe", {"channels": asked})
    await wait_for_socket(server, user.pk, channels=["company"])
    lines = [line for line in (await read_log(server)).splitlines() if "dropped channel" in line]
    expected = [
        "dropped channel 'contacts': no such channel (did you mean 'contact'?)",
        "dropped channel 'tag': refused by may_subscribe",
        "dropped channel 'compani:4': no such channel (did you mean 'company:4'?)",
        "dropped channel 'zzzzzz': no such channel",
    ]
    if not debug:
        assert lines == []
        return
    assert len(lines) == len(expected)  # one line per channel of the frame
    for line in expected:
        assert any(logged.endswith(line) for logged in lines), (line, lines)


async def test_a_recheck_asks_again_and_drops_a_channel_now_refused(
    live_servers: LiveServers, ws: Clients
) -> None:
    server = choosy(live_servers)
    acme, user, client = await ann_in_acme(server, ws, "company", "contact")
    users = get_user_model()._default_manager
    await off_loop(users.filter(pk=user.pk).update, last_name="no-company")
    await off_loop(recheck_users, [user.pk])
    await wait_for_socket(server, user.pk, channels=["contact"])
    _, company = await off_loop(write_tag_and_company, acme)
    contact = await off_loop(Contact.objects.create, workspace=acme, name="c")
    assert company
    # Dropped quietly: no frame about it, the socket still open and hearing the other.
    assert await heard(client, user) == [("contact.created", contact.pk)]


async def test_a_subscribe_then_an_unsubscribe_end_as_without_the_hook(
    live_servers: LiveServers, ws: Clients
) -> None:
    server = choosy(live_servers)
    acme, user, client = await ann_in_acme(server, ws)
    # Sent at once: a late answer of the hook never adds back what was unsubscribed.
    await client.send("subscribe", {"channels": ["company", "contact"]})
    await client.send("unsubscribe", {"channel": "company"})
    await client.send("subscribe", {"channel": "contact:1"})
    await client.send("unsubscribe", {"channel": "contact:1"})
    await client.send("subscribe", {"channel": "contact:2"})  # read after them
    await wait_for_socket(server, user.pk, channels=["contact", "contact:2"])
    _, company = await off_loop(write_tag_and_company, acme)
    contact = await off_loop(Contact.objects.create, workspace=acme, name="c")
    assert company
    assert await heard(client, user) == [("contact.created", contact.pk)]


# Holding the hook: races with rechecks, and batches ------------------------------------------

#: The directory the gated servers watch (one per test session: the servers are reused).
GATE_DIR = Path(tempfile.gettempdir()) / f"realtime-subscribe-gate-{os.getpid()}"


class Gate:
    """Holds the server's ``may_subscribe`` asks about a channel (``tests.subscribe_auth``)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def close(self, channel: str) -> None:
        (self.directory / f"closed-{channel}").touch()

    def open(self, channel: str) -> None:
        (self.directory / f"closed-{channel}").unlink(missing_ok=True)

    async def reached(self, channel: str, times: int = 1) -> None:
        """Wait (bounded) until ``times`` asks about ``channel`` are held or were."""
        entered = self.directory / f"entered-{channel}"
        async with asyncio.timeout(WAIT):
            while True:
                if entered.exists() and len(entered.read_text().splitlines()) >= times:
                    return
                await asyncio.sleep(0.02)

    def trips(self) -> dict[tuple[int, str], set[int]]:
        """By account and channel, the trips to realtime's threads it was asked about in."""
        trips: dict[tuple[int, str], set[int]] = {}
        for line in (self.directory / "calls").read_text().splitlines():
            user, channel, trip = line.split()
            trips.setdefault((int(user), channel), set()).add(int(trip))
        return trips


@pytest.fixture
def gate() -> Iterator[Gate]:
    shutil.rmtree(GATE_DIR, ignore_errors=True)
    GATE_DIR.mkdir(parents=True)
    yield Gate(GATE_DIR)
    shutil.rmtree(GATE_DIR, ignore_errors=True)  # opens every gate: nothing stays held


def gated(live_servers: LiveServers) -> Server:
    return choosy(live_servers, "choosy-gated", SUBSCRIBE_GATE=str(GATE_DIR))


async def test_a_recheck_drops_a_channel_it_refuses_though_the_client_subscribed_meanwhile(
    live_servers: LiveServers, ws: Clients, gate: Gate
) -> None:
    server = gated(live_servers)
    acme, user, client = await ann_in_acme(server, ws, "company", "contact")
    await off_loop(last_name, user, "no-company")
    gate.close("company")
    await off_loop(recheck_users, [user.pk])
    await gate.reached("company")  # the recheck is asking about it
    # A change of subscriptions while the recheck asks does not save the refused channel.
    await client.send("subscribe", {"channel": "contact:1"})
    await wait_for_socket(server, user.pk, channels=["company", "contact", "contact:1"])
    gate.open("company")
    await wait_for_socket(server, user.pk, channels=["contact", "contact:1"])
    await off_loop(write_company, acme)
    contact = await off_loop(write_contact, acme)
    assert await heard(client, user) == [("contact.created", contact)]


async def test_a_recheck_overlapping_an_unsubscribe_never_brings_the_channel_back(
    live_servers: LiveServers, ws: Clients, gate: Gate
) -> None:
    server = gated(live_servers)
    acme, user, client = await ann_in_acme(server, ws, "company", "contact")
    gate.close("company")
    await off_loop(recheck_users, [user.pk])
    await gate.reached("company")  # the recheck is asking about it: it will allow it
    await client.send("unsubscribe", {"channel": "company"})
    await wait_for_socket(server, user.pk, channels=["contact"])
    gate.open("company")
    # The marker is held until the recheck answers: it is applied by then.
    assert await heard(client, user) == []
    await wait_for_socket(
        server, user.pk, channels=["contact"], allowed={str(acme.pk): ["contact"]}
    )
    await off_loop(write_company, acme)
    contact = await off_loop(write_contact, acme)
    assert await heard(client, user) == [("contact.created", contact)]


async def test_a_frame_held_by_a_recheck_that_refuses_its_channel_never_goes_out(
    live_servers: LiveServers, ws: Clients, gate: Gate
) -> None:
    server = gated(live_servers)
    acme, user, client = await ann_in_acme(server, ws, "company", "contact")
    await off_loop(last_name, user, "no-company")
    gate.close("company")
    await off_loop(recheck_users, [user.pk])
    await gate.reached("company")  # the socket's frames are held until the recheck answers
    await off_loop(write_company, acme)
    contact = await off_loop(write_contact, acme)
    await wait_for_socket(server, user.pk, held=2)  # both were for it when they came
    gate.open("company")
    assert await heard(client, user) == [("contact.created", contact)]


async def test_a_subscribe_waiting_on_the_hook_is_heard_in_a_scope_a_recheck_gave_meanwhile(
    live_servers: LiveServers, ws: Clients, gate: Gate
) -> None:
    server = gated(live_servers)
    acme, beta = await off_loop(make_workspaces, "acme", "beta")
    user, token = await off_loop(make_member, "ann", acme)
    client = await ws.authenticated(server, token, scopes=["acme", "beta"])
    gate.close("company")
    await client.send("subscribe", {"channel": "company"})
    await gate.reached("company")  # asked about in acme, the one scope the socket reads
    await off_loop(Membership.objects.create, workspace=beta, user=user)
    await off_loop(recheck_users, [user.pk])
    await wait_for_socket(server, user.pk, scopes=[acme.pk, beta.pk])
    await wait_for_follow(server, beta.pk)
    gate.open("company")
    await wait_for_socket(server, user.pk, channels=["company"])
    company = await off_loop(write_company, beta)
    assert await heard(client, user) == [("company.created", company)]


async def test_a_scope_a_recheck_gives_carries_the_channels_the_hook_allows_there(
    live_servers: LiveServers, ws: Clients
) -> None:
    server = choosy(live_servers)
    acme, beta = await off_loop(make_workspaces, "acme", "beta")
    await off_loop(rename, beta, "no-company")
    user, token = await off_loop(make_member, "ann", acme)
    client = await ws.authenticated(server, token, scopes=["acme", "beta"])
    await client.send("subscribe", {"channels": ["company", "contact"]})
    await wait_for_socket(server, user.pk, scopes=[acme.pk], channels=["company", "contact"])
    await off_loop(Membership.objects.create, workspace=beta, user=user)
    await off_loop(recheck_users, [user.pk])
    await wait_for_socket(server, user.pk, scopes=[acme.pk, beta.pk])
    await wait_for_follow(server, beta.pk)
    await off_loop(write_company, beta)
    contact = await off_loop(write_contact, beta)
    assert await heard(client, user) == [("contact.created", contact)]


async def test_a_recheck_narrows_a_channel_to_some_scopes_and_allows_it_again(
    live_servers: LiveServers, ws: Clients
) -> None:
    server = choosy(live_servers)
    acme, beta = await off_loop(make_workspaces, "acme", "beta")
    user, token = await off_loop(make_member, "ann", acme, beta)
    client = await ws.authenticated(server, token, scopes=["acme", "beta"])
    await client.send("subscribe", {"channel": "company"})
    both = {str(acme.pk): ["company"], str(beta.pk): ["company"]}
    await wait_for_socket(server, user.pk, channels=["company"], allowed=both)

    await off_loop(rename, beta, "no-company")
    await off_loop(recheck_users, [user.pk])
    narrowed = {str(acme.pk): ["company"], str(beta.pk): []}
    await wait_for_socket(server, user.pk, channels=["company"], allowed=narrowed)
    await off_loop(write_company, beta)
    shown = await off_loop(write_company, acme)
    assert await heard(client, user) == [("company.created", shown)]

    await off_loop(rename, beta, "beta")
    await off_loop(recheck_users, [user.pk])
    await wait_for_socket(server, user.pk, channels=["company"], allowed=both)
    again = await off_loop(write_company, beta)
    assert await heard(client, user) == [("company.created", again)]


async def test_sockets_subscribing_at_the_same_moment_are_asked_in_one_batch(
    live_servers: LiveServers, ws: Clients, gate: Gate
) -> None:
    server = gated(live_servers)
    (acme,) = await off_loop(make_workspaces, "acme")
    members = [await off_loop(make_member, name, acme) for name in ("g1", "g2", "a", "b", "c")]
    clients = [await ws.authenticated(server, token, scope="acme") for _, token in members]
    (g1, g2, *rest), users = clients, [user for user, _ in members]
    # The rechecks their memberships asked for are over (see ``ann_in_acme``): one heard
    # after a subscribe would ask the hook about its channel in a trip of its own.
    for client, user in zip(clients, users, strict=True):
        assert await heard(client, user) == []
    # Both lanes of the hook's batches are held, one subscribe each.
    gate.close("company")
    await g1.send("subscribe", {"channel": "company"})
    await gate.reached("company")
    await g2.send("subscribe", {"channel": "company"})
    await gate.reached("company", times=2)
    await asyncio.gather(*(client.send("subscribe", {"channel": "contact"}) for client in rest))
    await server.wait_for_state(lambda state: state["subscribes_waiting"] == 3)
    gate.open("company")
    for user in users[2:]:
        await wait_for_socket(server, user.pk, channels=["contact"])
    trips = gate.trips()
    held = trips[(users[0].pk, "company")] | trips[(users[1].pk, "company")]
    (together,) = {trip for user in users[2:] for trip in trips[(user.pk, "contact")]}
    assert len(held) == 2
    assert together not in held
