"""Resume by property: a socket that drops at random points and comes back, on either worker,
hears exactly what a socket that never dropped hears.

Each example connects two opted-in sockets of one account: a reference that stays connected
to one worker, and a wanderer. Then it plays a random sequence of writes — contacts created,
updated, moved between a scope the account reads and one it does not, deleted, some rolled
back; guarded notes the account may or may not read; account events for it and for another
account — interleaved with drops (the wanderer handles the frames that have arrived, is cut
without a close frame, and stays away for the following writes) and returns (with the cursor
of the last frame it handled, to one worker or the other). Permissions do not change during
an example, so the reference's stream is exactly what the wanderer must hear across its lives:
every frame once, in order, nothing foreign, nothing missing — and every return resumes.

``REALTIME_PROPERTY_EXAMPLES`` examples per transport: 4 by default, 50 in CI (tox.ini), 300
in the long run (see docs/contributing.md). They are drawn the same in every run, so that a
failure reproduces by running the test again; ``REALTIME_PROPERTY_RANDOM=1`` draws new ones
each run and keeps those that failed in ``.hypothesis/`` to try first the next time.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.db import transaction
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase

from realtime.broadcast import broadcast_to_user
from tests.helpers import ROOT, off_loop
from tests.live import Client, Clients, LiveServers, Server
from tests.test_resume_e2e import MARKER, make_member, make_workspace, resuming
from tests.testapp.models import Contact, PrivateNote, Workspace

EXAMPLES = int(os.environ.get("REALTIME_PROPERTY_EXAMPLES", "4"))
RANDOM = os.environ.get("REALTIME_PROPERTY_RANDOM") == "1"

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("each_transport"),
    # The suite's timeout is per test, and all the examples run in one test: a few seconds
    # each (an example takes a third of a second at most on two busy cores).
    pytest.mark.timeout(60 + 4 * EXAMPLES),
]
#: How long the wanderer waits for one more frame when handling what has arrived before a
#: drop. Any cut point is a valid example: this only decides where the cut falls.
ARRIVED = 0.02
_examples = itertools.count()

Frame = dict[str, Any]

rolled_back = st.booleans()
operations = st.lists(
    st.one_of(
        st.tuples(st.just("create"), st.booleans(), rolled_back),  # in the read scope?
        st.tuples(st.just("update"), st.integers(0, 7), rolled_back),
        st.tuples(st.just("move"), st.integers(0, 7), rolled_back),
        st.tuples(st.just("delete"), st.integers(0, 7), rolled_back),
        st.tuples(st.just("note"), st.booleans(), rolled_back),  # by the account itself?
        st.tuples(st.just("notice"), st.booleans()),  # to the account itself?
        st.tuples(st.just("drop")),
        st.tuples(st.just("return"), st.integers(0, 1)),  # to which worker
    ),
    min_size=4,
    max_size=14,
)


@dataclass
class World:
    read: Workspace  # the account is a member
    unread: Workspace  # it is not
    user: Any
    other: Any
    token: str
    #: The ids of the contacts that exist (not the instances: a delete rolled back leaves its
    #: instance without a primary key).
    contacts: list[Any] = field(default_factory=list)


def build() -> World:
    n = next(_examples)
    read, unread = make_workspace(f"read{n}"), make_workspace(f"unread{n}")
    user, token = make_member(f"ann{n}", read)
    other, _ = make_member(f"bob{n}", read, unread)
    return World(read, unread, user, other, token)


def play(world: World, operation: tuple[Any, ...]) -> None:
    """Make one write (or none, when rolled back)."""
    kind, *args = operation
    if kind == "notice":
        (own,) = args
        broadcast_to_user((world.user if own else world.other).pk, "test.notice", {"own": own})
        return
    *args, undo = args
    contacts = list(world.contacts)
    try:
        with transaction.atomic():
            _write(world, kind, args)
            if undo:
                raise _UndoError
    except _UndoError:
        world.contacts = contacts


class _UndoError(Exception):
    pass


def _write(world: World, kind: str, args: list[Any]) -> None:
    if kind == "create":
        (in_read,) = args
        scope = world.read if in_read else world.unread
        world.contacts.append(Contact.objects.create(workspace=scope, name="new").pk)
    elif kind == "note":
        (own,) = args
        author = world.user if own else world.other
        PrivateNote.objects.create(workspace=world.read, author=author, title="note")
    elif world.contacts:
        pk = world.contacts[args[0] % len(world.contacts)]
        contact = Contact.objects.get(pk=pk)
        if kind == "update":
            contact.name = f"{contact.name}+"
            contact.save()
        elif kind == "move":
            contact.workspace_id = (
                world.unread.pk if contact.workspace_id == world.read.pk else world.read.pk
            )
            contact.save()
        else:
            contact.delete()
            world.contacts.remove(pk)


async def arrived(client: Client) -> list[Frame]:
    """The frames that have arrived (as many as come within ``ARRIVED`` of each other)."""
    frames: list[Frame] = []
    while True:
        try:
            frames.append(await client.next_frame(ARRIVED))
        except TimeoutError:
            return frames


def without_cursor(frames: list[Frame]) -> list[Frame]:
    return [{k: v for k, v in frame.items() if k != "cursor"} for frame in frames]


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not RANDOM,
    database=DirectoryBasedExampleDatabase(ROOT / ".hypothesis" / "examples") if RANDOM else None,
    print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plan=operations)
# Found by CI: a rolled-back delete, then an update of the same row.
@example(
    plan=[
        ("create", False, False),
        ("create", False, False),
        ("delete", 0, True),
        ("update", 0, False),
    ]
)
# Away while a contact is created, one moved out of the read scope, a note it may not read
# and account events for it and for another are written; back on the other worker.
@example(
    plan=[
        ("create", True, False),
        ("drop",),
        ("create", True, False),
        ("move", 0, False),
        ("note", False, False),
        ("notice", True),
        ("notice", False),
        ("return", 0),
        ("update", 1, False),
    ]
)
async def test_a_socket_dropping_and_returning_anywhere_hears_what_a_connected_one_hears(
    live_servers: LiveServers, ws: Clients, plan: list[tuple[Any, ...]]
) -> None:
    servers: list[Server] = [live_servers.get("worker-1"), live_servers.get("worker-2")]
    world = await off_loop(build)
    scopes = [world.read.slug]
    reference, _ = await resuming(ws, servers[0], world.token, scopes=scopes)
    wanderer: Client | None
    wanderer, answer = await resuming(ws, servers[1], world.token, scopes=scopes)
    cursor: str = answer["data"]["cursor"]
    heard: list[Frame] = []
    for operation in plan:
        if operation[0] == "drop":
            if wanderer is not None:
                heard += await arrived(wanderer)
                cursor = heard[-1]["cursor"] if heard else cursor
                wanderer.drop()
                wanderer = None
        elif operation[0] == "return":
            if wanderer is None:
                server = servers[operation[1]]
                wanderer, answer = await resuming(ws, server, world.token, cursor, scopes=scopes)
                assert answer["data"]["resumed"] is True, operation
        else:
            await off_loop(play, world, operation)
    if wanderer is None:
        wanderer, answer = await resuming(ws, servers[0], world.token, cursor, scopes=scopes)
        assert answer["data"]["resumed"] is True
    await off_loop(broadcast_to_user, world.user.pk, MARKER, None)
    heard += await wanderer.frames_until(MARKER)
    expected = await reference.frames_until(MARKER)

    assert without_cursor(heard) == without_cursor(expected)
    assert all(frame["type"] != "test.notice" or frame["data"]["own"] for frame in heard)
    await asyncio.gather(reference.close(), wanderer.close())
