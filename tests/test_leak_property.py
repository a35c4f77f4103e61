"""Leak-proof by property: in random worlds, under random writes, every socket hears exactly
what its account may read.

Each example builds a world — accounts, scopes, memberships, a project shared with other
scopes, a thread — connects one real socket per account to a real daphne worker (each asks
for every scope of the world and subscribes to every model), then plays a random sequence of
operations: creates, updates and deletes of scoped, guarded, shared and account-addressed
rows, some rolled back, bulk writes (``update()`` moving rows between scopes or changing what
a guard admits, ``bulk_create``), rows written on a second database inside a transaction on
the first, and memberships added and removed mid-run (scopes, a thread's links through its
manager and as rows of its through table). After every operation a
marker goes to every account; what each socket received before its marker must be exactly
what a model of the rules says that account may read at that moment: nothing foreign,
nothing missing, nothing twice.

``REALTIME_PROPERTY_EXAMPLES`` examples per transport: 4 by default, 50 in CI (tox.ini), 300
in the long run (see docs/contributing.md). They are drawn the same in every run, so that a
failure reproduces by running the test again; ``REALTIME_PROPERTY_RANDOM=1`` draws new ones
each run and keeps those that failed in ``.hypothesis/`` to try first the next time.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import F, Value
from django.db.models.functions import Concat
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase

from realtime.auth import issue_token
from realtime.broadcast import broadcast_to_users
from tests.helpers import ROOT, WAIT, off_loop
from tests.live import Client, Clients, LiveServers, Server
from tests.testapp.models import (
    Chat,
    ChatLine,
    Membership,
    Message,
    Notification,
    PrivateNote,
    Project,
    Seat,
    Task,
    Thread,
    Workspace,
)
from tests.testapp.models import Contact as ContactRow

EXAMPLES = int(os.environ.get("REALTIME_PROPERTY_EXAMPLES", "4"))
RANDOM = os.environ.get("REALTIME_PROPERTY_RANDOM") == "1"

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "other"]),
    pytest.mark.usefixtures("each_transport"),
    # The suite's timeout is per test, and all the examples run in one test: a few seconds
    # each (an example takes half a second at most on two busy cores).
    pytest.mark.timeout(60 + 4 * EXAMPLES),
]

CHANNELS = ["contact", "private_note", "task"]
_worlds = itertools.count()
_edits = itertools.count()

# The world ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """A world and the operations played in it, as drawn by hypothesis."""

    accounts: int
    scopes: int
    #: For each account, the scopes it is a member of at the start (never empty).
    memberships: tuple[frozenset[int], ...]
    #: The scopes the project of scope 0 is shared with.
    shared_with: frozenset[int]
    #: The accounts in the thread.
    thread: frozenset[int]
    operations: tuple[tuple[Any, ...], ...]


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    accounts = draw(st.integers(2, 4))
    scopes = draw(st.integers(2, 3))
    scope = st.integers(0, scopes - 1)
    account = st.integers(0, accounts - 1)
    memberships = tuple(
        frozenset(draw(st.sets(scope, min_size=1, max_size=scopes))) for _ in range(accounts)
    )
    shared_with = frozenset(draw(st.sets(st.integers(1, scopes - 1), max_size=scopes - 1)))
    thread = frozenset(draw(st.sets(account, max_size=accounts)))
    rolled_back = st.booleans()
    action = st.sampled_from(["create", "update", "delete"])
    operations = draw(
        st.lists(
            st.one_of(
                st.tuples(st.just("contact"), action, scope, rolled_back),
                st.tuples(st.just("contact_move"), scope, scope, rolled_back),
                st.tuples(st.just("note_author"), scope, account, rolled_back),
                st.tuples(st.just("note"), action, scope, account, st.booleans(), rolled_back),
                st.tuples(st.just("task"), action, rolled_back),
                st.tuples(st.just("notification"), account, rolled_back),
                st.tuples(st.just("message"), rolled_back),
                st.tuples(st.just("join"), account, scope),
                st.tuples(st.just("leave"), account, scope),
                st.tuples(st.just("move"), account, scope, scope),
                st.tuples(st.just("handover"), account, account, scope),
                st.tuples(st.just("thread_join"), account),
                st.tuples(st.just("thread_leave"), account),
                st.tuples(st.just("share"), st.integers(1, scopes - 1)),
                st.tuples(st.just("unshare"), st.integers(1, scopes - 1)),
                # Bulk writes, links kept as rows, and a second database.
                st.tuples(st.just("contacts_renamed"), scope, rolled_back),
                st.tuples(st.just("contacts_moved"), scope, scope, rolled_back),
                st.tuples(st.just("contacts_made"), scope, rolled_back),
                st.tuples(st.just("notes_made_public"), scope, st.booleans(), rolled_back),
                st.tuples(st.just("thread_rows_join"), account),
                st.tuples(st.just("thread_rows_leave"), account),
                st.tuples(st.just("contact_elsewhere"), scope, st.booleans(), st.booleans()),
                st.tuples(st.just("seat_join"), account),
                st.tuples(st.just("seat_leave"), account),
                st.tuples(st.just("seat_handover"), account, account),
                st.tuples(st.just("chat_line"), rolled_back),
            ),
            # Each example pays for its world and its sockets, an operation only for a write
            # and a marker: a few operations at least, so that most examples mix several.
            min_size=4,
            max_size=16,
        )
    )
    return Plan(accounts, scopes, memberships, shared_with, thread, tuple(operations))


@dataclass
class World:
    """The rows of one example, and the rules' model of who may read what."""

    users: list[Any]
    workspaces: list[Workspace]
    members: list[set[int]]  # scope index -> account indexes
    project: Project
    shared_with: set[int]
    thread: Thread
    thread_members: set[int]
    contacts: dict[int, list[Any]] = field(default_factory=dict)  # scope -> rows
    notes: list[Any] = field(default_factory=list)
    tasks: list[Any] = field(default_factory=list)
    messages: list[Any] = field(default_factory=list)
    #: A chat whose members are kept as rows of a through model of its own (``Seat``).
    chat: Any = None
    seated: set[int] = field(default_factory=set)
    lines: list[Any] = field(default_factory=list)

    def scope_readers(self, scope: int) -> set[int]:
        return set(self.members[scope])

    def note_readers(self, note: Any) -> set[int]:
        scope = self.scope_of(note.workspace_id)
        readers = self.scope_readers(scope)
        if note.public:
            return readers
        return {a for a in readers if self.users[a].pk == note.author_id}

    def task_readers(self) -> set[int]:
        return self.scope_readers(0) | self.task_outside_readers()

    def task_outside_readers(self) -> set[int]:
        """The readers of the shared project outside its scope (account events)."""
        outside: set[int] = set()
        for scope in self.shared_with:
            outside |= self.scope_readers(scope)
        return outside - self.scope_readers(0)

    def scope_of(self, workspace_id: Any) -> int:
        return next(i for i, w in enumerate(self.workspaces) if w.pk == workspace_id)


def build(plan: Plan) -> World:
    number = next(_worlds)
    user_model = get_user_model()
    users = [
        user_model.objects.create_user(username=f"leak{number}-{a}") for a in range(plan.accounts)
    ]
    workspaces = [
        Workspace.objects.create(name=f"w{s}", slug=f"leak{number}-{s}") for s in range(plan.scopes)
    ]
    members: list[set[int]] = [set() for _ in range(plan.scopes)]
    for a, scopes in enumerate(plan.memberships):
        for s in scopes:
            Membership.objects.create(workspace=workspaces[s], user=users[a])
            members[s].add(a)
    project = Project.objects.create(workspace=workspaces[0], name="shared")
    project.shared_with.set([workspaces[s] for s in plan.shared_with])
    thread = Thread.objects.create(title="thread")
    thread.members.set([users[a] for a in plan.thread])
    for workspace in workspaces:  # the scopes of the rows written on the second database
        Workspace.objects.using("other").create(
            pk=workspace.pk, name=workspace.name, slug=workspace.slug
        )
    world = World(
        users, workspaces, members, project, set(plan.shared_with), thread, set(plan.thread)
    )
    world.chat = Chat.objects.create(title="chat")
    return world


# Playing one operation ---------------------------------------------------------------------


class RollBackError(Exception):
    """Raised to roll an operation back."""


Heard = Counter[tuple[str, Any]]


#: Operations that change who reads what without a write of the rows read.
ACCESS = {
    "join",
    "leave",
    "move",
    "handover",
    "thread_join",
    "thread_leave",
    "thread_rows_join",
    "thread_rows_leave",
    "seat_join",
    "seat_leave",
    "seat_handover",
    "share",
    "unshare",
}
#: Those of them that change which scopes a socket reads (the worker rechecks it).
MEMBERSHIP = {"join", "leave", "move", "handover"}


def play(world: World, operation: tuple[Any, ...]) -> dict[int, Heard]:
    """Carry out one operation; return what each account may hear because of it."""
    if operation[0] in ACCESS:
        return _change_access(world, operation)
    if operation[0] == "contact_elsewhere":
        return _write_elsewhere(world, operation)
    rolled_back = operation[-1]
    try:
        with transaction.atomic():
            expected = _write(world, operation)
            if rolled_back:
                raise RollBackError
    except RollBackError:
        _forget_rolled_back(world)
        return {}
    return expected


def _pick(candidates: set[int], index: int) -> int | None:
    """The ``index``-th of ``candidates`` (modulo their number); ``None`` when there are none.

    Operations name accounts by position among those it can apply to, so that most drawn
    operations do something whatever the state.
    """
    ordered = sorted(candidates)
    return ordered[index % len(ordered)] if ordered else None


def _change_access(world: World, operation: tuple[Any, ...]) -> dict[int, Heard]:
    """Change memberships (which announce nothing: the worker rechecks the sockets), or the
    links of the thread or of the shared project (its rows enter or leave views)."""
    kind, *args = operation
    users, workspaces, members = world.users, world.workspaces, world.members
    everyone = set(range(len(users)))
    if kind in ("join", "leave", "move", "handover"):
        scope = args[-1] if kind != "move" else args[1]
        member = _pick(members[scope], args[0])
        outsider = _pick(everyone - members[scope], args[0])
        if kind == "join" and outsider is not None:
            Membership.objects.create(workspace=workspaces[scope], user=users[outsider])
            members[scope].add(outsider)
            return {}
        if member is None:
            return {}
        membership = Membership.objects.get(workspace=workspaces[scope], user=users[member])
        if kind == "leave":
            membership.delete()
            members[scope].discard(member)
        elif kind == "move" and member not in members[args[2]]:
            membership.workspace = workspaces[args[2]]
            membership.save()
            members[scope].discard(member)
            members[args[2]].add(member)
        elif kind == "handover":
            taker = _pick(everyone - members[scope], args[1])
            if taker is not None:
                membership.user = users[taker]
                membership.save()
                members[scope].discard(member)
                members[scope].add(taker)
        return {}
    if kind.startswith("seat_"):
        return _seats(world, operation)
    if kind in ("thread_join", "thread_leave", "thread_rows_join", "thread_rows_leave"):
        account = args[0]
        joins = kind.endswith("_join")
        if (account in world.thread_members) == joins:
            return {}
        links = Thread.members.through
        if kind == "thread_rows_join":  # the through table's rows written in bulk
            links.objects.bulk_create([links(thread=world.thread, user=users[account])])
        elif kind == "thread_rows_leave":
            links.objects.filter(thread=world.thread, user=users[account]).delete()
        elif joins:
            world.thread.members.add(users[account])
        else:
            world.thread.members.remove(users[account])
        if joins:
            world.thread_members.add(account)
        else:
            world.thread_members.discard(account)
        action = "created" if joins else "deleted"
        return {account: Counter((f"message.{action}", m.pk) for m in world.messages)}
    before = world.task_outside_readers()
    if kind == "share" and args[0] not in world.shared_with:
        world.project.shared_with.add(workspaces[args[0]])
        world.shared_with.add(args[0])
    elif kind == "unshare" and args[0] in world.shared_with:
        world.project.shared_with.remove(workspaces[args[0]])
        world.shared_with.discard(args[0])
    after = world.task_outside_readers()
    expected: dict[int, Heard] = {}
    for accounts, action in ((after - before, "created"), (before - after, "deleted")):
        for account in accounts:
            expected[account] = Counter((f"task.{action}", t.pk) for t in world.tasks)
    return expected


def _write(world: World, operation: tuple[Any, ...]) -> dict[int, Heard]:
    kind = operation[0]
    if kind == "contact":
        _, action, scope, _ = operation
        rows = world.contacts.setdefault(scope, [])
        readers = world.scope_readers(scope)
        row, action = _act(rows, action, lambda: ContactRow(workspace=world.workspaces[scope]))
        return _expect(readers, "contact", action, row.pk)
    if kind == "note":
        _, action, scope, author, public, _ = operation
        rows = [note for note in world.notes if world.scope_of(note.workspace_id) == scope]
        before = world.note_readers(rows[-1]) if rows and action != "create" else set()

        def new() -> PrivateNote:
            return PrivateNote(workspace=world.workspaces[scope], author=world.users[author])

        row, action = _act(rows, action, new, public=public)
        world.notes = [n for n in world.notes if n.pk != row.pk] + (
            [row] if action != "deleted" else []
        )
        if action == "updated":
            return _views(before, world.note_readers(row), "private_note", row.pk)
        readers = before if action == "deleted" else world.note_readers(row)
        return _expect(readers, "private_note", action, row.pk)
    if kind == "note_author":
        _, scope, author, _ = operation
        rows = [note for note in world.notes if world.scope_of(note.workspace_id) == scope]
        if not rows:
            return {}
        note = rows[-1]
        before = world.note_readers(note)
        unchanged = note.author_id == world.users[author].pk
        note.author = world.users[author]
        note.save()
        if unchanged:
            return {}  # a save that changed nothing announces nothing
        return _views(before, world.note_readers(note), "private_note", note.pk)
    if kind == "contact_move":
        _, source, target, _ = operation
        rows = world.contacts.get(source) or []
        if not rows or source == target:
            return {}
        contact = rows.pop()
        contact.workspace = world.workspaces[target]
        contact.save()
        world.contacts.setdefault(target, []).append(contact)
        expected = _expect(world.scope_readers(source), "contact", "deleted", contact.pk)
        for account, heard in _expect(
            world.scope_readers(target), "contact", "created", contact.pk
        ).items():
            expected[account] = expected.get(account, Counter()) + heard
        return expected
    if kind == "contacts_renamed":
        _, scope, _ = operation
        rows = world.contacts.get(scope) or []
        ContactRow.objects.filter(workspace=world.workspaces[scope]).update(
            name=Concat(F("name"), Value("!"))
        )
        return _merged(
            _expect(world.scope_readers(scope), "contact", "updated", r.pk) for r in rows
        )
    if kind == "contacts_moved":
        _, source, target, _ = operation
        rows = world.contacts.get(source) or []
        if source == target:
            return {}
        ContactRow.objects.filter(workspace=world.workspaces[source]).update(
            workspace=world.workspaces[target]
        )
        world.contacts[source] = []
        world.contacts.setdefault(target, []).extend(rows)
        return _merged(
            heard
            for row in rows
            for heard in (
                _expect(world.scope_readers(source), "contact", "deleted", row.pk),
                _expect(world.scope_readers(target), "contact", "created", row.pk),
            )
        )
    if kind == "contacts_made":
        _, scope, _ = operation
        made = ContactRow.objects.bulk_create(
            [ContactRow(workspace=world.workspaces[scope], name=f"bulk {n}") for n in range(2)]
        )
        world.contacts.setdefault(scope, []).extend(made)
        return _merged(
            _expect(world.scope_readers(scope), "contact", "created", r.pk) for r in made
        )
    if kind == "notes_made_public":
        _, scope, public, _ = operation
        rows = [note for note in world.notes if world.scope_of(note.workspace_id) == scope]
        was = {note.pk: world.note_readers(note) for note in rows}
        PrivateNote.objects.filter(workspace=world.workspaces[scope]).update(public=public)
        for note in rows:
            note.public = public
        return _merged(
            _views(was[note.pk], world.note_readers(note), "private_note", note.pk) for note in rows
        )
    if kind == "task":
        _, action, _ = operation

        def new_task() -> Task:
            return Task(workspace=world.workspaces[0], project=world.project)

        row, action = _act(world.tasks, action, new_task)
        return _expect(world.task_readers(), "task", action, row.pk)
    if kind == "notification":
        _, account, _ = operation
        row = Notification.objects.create(user=world.users[account], text="n")
        return _expect({account}, "notification", "created", row.pk)
    if kind == "chat_line":
        line = ChatLine.objects.create(chat=world.chat, text="l")
        world.lines.append(line)
        return _expect(set(world.seated), "chat_line", "created", line.pk)
    _, _ = operation
    row = Message.objects.create(thread=world.thread, text="m")
    world.messages.append(row)
    return _expect(set(world.thread_members), "message", "created", row.pk)


def _act(rows: list[Any], action: str, new: Any, **values: Any) -> tuple[Any, str]:
    """Create, update or delete a row of ``rows`` (create when there is none)."""
    if action == "create" or not rows:
        row = new()
        row.title = row.name = "x"
        for name, value in values.items():
            setattr(row, name, value)
        row.save()
        rows.append(row)
        return row, "created"
    row = rows[-1]
    if action == "update":
        row.title = row.name = f"edit {next(_edits)}"
        for name, value in values.items():
            setattr(row, name, value)
        row.save()
        return row, "updated"
    rows.remove(row)
    pk = row.pk
    row.delete()
    row.pk = pk
    return row, "deleted"


def _seats(world: World, operation: tuple[Any, ...]) -> dict[int, Heard]:
    """A seat of the chat created, deleted or handed to another account (one each at most):
    the account that gains the chat hears its lines created, the one that loses it deleted."""
    kind, account, *rest = operation
    users, chat = world.users, world.chat
    gained: set[int] = set()
    lost: set[int] = set()
    if kind == "seat_join" and account not in world.seated:
        Seat.objects.create(chat=chat, user=users[account])
        gained.add(account)
    elif kind == "seat_leave" and account in world.seated:
        Seat.objects.get(chat=chat, user=users[account]).delete()
        lost.add(account)
    elif kind == "seat_handover" and account in world.seated and rest[0] not in world.seated:
        seat = Seat.objects.get(chat=chat, user=users[account])
        seat.user = users[rest[0]]
        seat.save()
        lost.add(account)
        gained.add(rest[0])
    world.seated = (world.seated | gained) - lost
    return _merged(
        _expect(accounts, "chat_line", action, line.pk)
        for accounts, action in ((gained, "created"), (lost, "deleted"))
        for line in world.lines
    )


def _write_elsewhere(world: World, operation: tuple[Any, ...]) -> dict[int, Heard]:
    """A contact written on the second database, in a transaction of its own there, inside a
    transaction on ``default``: announced once ``other`` commits, whatever ``default`` does."""
    _, scope, other_rolls_back, default_rolls_back = operation
    expected: dict[int, Heard] = {}
    try:
        with transaction.atomic():
            try:
                with transaction.atomic(using="other"):
                    row = ContactRow.objects.using("other").create(
                        workspace_id=world.workspaces[scope].pk, name="elsewhere"
                    )
                    if other_rolls_back:
                        raise RollBackError
                expected = _expect(world.scope_readers(scope), "contact", "created", row.pk)
            except RollBackError:
                pass
            if default_rolls_back:
                raise RollBackError
    except RollBackError:
        pass
    return expected


def _merged(parts: Iterable[dict[int, Heard]]) -> dict[int, Heard]:
    """What each account hears of several rows written together."""
    merged: dict[int, Heard] = {}
    for part in parts:
        for account, heard in part.items():
            merged[account] = merged.get(account, Counter()) + heard
    return merged


def _forget_rolled_back(world: World) -> None:
    """Read the model of the rows again from the database after a rollback."""
    world.contacts = {
        scope: list(ContactRow.objects.filter(workspace=workspace).order_by("pk"))
        for scope, workspace in enumerate(world.workspaces)
    }
    world.notes = list(PrivateNote.objects.filter(workspace__in=world.workspaces).order_by("pk"))
    world.tasks = list(Task.objects.filter(project=world.project).order_by("pk"))
    world.messages = list(Message.objects.filter(thread=world.thread).order_by("pk"))
    world.lines = list(ChatLine.objects.filter(chat=world.chat).order_by("pk"))


def _expect(readers: set[int], model: str, action: str, pk: Any) -> dict[int, Heard]:
    return {a: Counter({(f"{model}.{action}", pk): 1}) for a in readers}


def _views(before: set[int], after: set[int], model: str, pk: Any) -> dict[int, Heard]:
    """An update as each reader sees it: leavers hear a delete, enterers a create."""
    return {
        **_expect(before - after, model, "deleted", pk),
        **_expect(after - before, model, "created", pk),
        **_expect(after & before, model, "updated", pk),
    }


# The sockets -------------------------------------------------------------------------------


async def connect(server: Server, ws: Clients, world: World) -> list[Client]:
    """One socket per account, reading every scope of the world, subscribed to every model
    in ``authenticate`` (so before it hears anything)."""
    slugs = [w.slug for w in world.workspaces]
    tokens = await off_loop(lambda: [issue_token(user) for user in world.users])
    clients = list(
        await asyncio.gather(
            *(ws.authenticated(server, t, scopes=slugs, channels=CHANNELS) for t in tokens)
        )
    )
    await heard_since_last(world, clients)
    return clients


async def heard_since_last(world: World, clients: list[Client]) -> list[Heard]:
    """Send a marker to every account; return what each socket heard before its own.

    The markers go out together, after the operation committed: each is addressed to one
    account and comes after everything announced to it before, whatever the others'."""
    users = [user.pk for user in world.users]
    await off_loop(broadcast_to_users, users, "test.marker", None)
    received = await asyncio.gather(
        *(client.frames_until("test.marker", timeout=WAIT) for client in clients)
    )
    return [Counter((f["type"], f["data"]["id"]) for f in frames) for frames in received]


async def rechecked(server: Server, world: World) -> None:
    """Wait until the worker's sockets read exactly the scopes their accounts belong to."""
    wanted = {
        str(user.pk): sorted(
            str(w.pk) for s, w in enumerate(world.workspaces) if a in world.members[s]
        )
        for a, user in enumerate(world.users)
    }

    def settled(state: dict[str, Any]) -> bool:
        reading = {
            str(s["user_id"]): sorted(str(scope) for scope in s["scopes"])
            for s in state["sockets"]
            if str(s["user_id"]) in wanted
        }
        return reading == wanted

    await server.wait_for_state(settled)


# The property -------------------------------------------------------------------------------


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not RANDOM,
    database=DirectoryBasedExampleDatabase(ROOT / ".hypothesis" / "examples") if RANDOM else None,
    print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plan=plans())
# A membership handed to another account, and one moved to another scope, then writes there.
@example(
    plan=Plan(
        accounts=2,
        scopes=2,
        memberships=(frozenset({0}), frozenset({1})),
        shared_with=frozenset(),
        thread=frozenset(),
        operations=(("handover", 0, 1, 0), ("contact", "create", 0, False)),
    )
)
@example(
    plan=Plan(
        accounts=2,
        scopes=2,
        memberships=(frozenset({0}), frozenset({1})),
        shared_with=frozenset({1}),
        thread=frozenset({0}),
        operations=(
            ("move", 0, 0, 1),
            ("contact", "create", 0, False),
            ("contact", "create", 1, False),
            ("task", "create", False),
            ("thread_leave", 0),
            ("message", False),
        ),
    )
)
# A guarded note: private to its author, made public, private again, handed to another author,
# saved unchanged; an account event; a rolled-back write; a member leaving, another joining,
# writes there.
@example(
    plan=Plan(
        accounts=3,
        scopes=2,
        memberships=(frozenset({0}), frozenset({0}), frozenset({1})),
        shared_with=frozenset(),
        thread=frozenset(),
        operations=(
            ("note", "create", 0, 0, False, False),
            ("note", "update", 0, 0, True, False),
            ("note", "update", 0, 0, False, False),
            ("note_author", 0, 1, False),
            ("note_author", 0, 1, False),
            ("notification", 2, False),
            ("contact", "create", 0, True),
            ("leave", 0, 0),
            ("join", 0, 1),
            ("contact", "create", 0, False),
            ("contact", "create", 1, False),
        ),
    )
)
# Bulk writes with rows to write (renamed, made, moved; notes made public and private again),
# a thread's links written as rows of its through table, and contacts on the second database
# (committed there while default rolls back; rolled back there while default commits).
@example(
    plan=Plan(
        accounts=3,
        scopes=2,
        memberships=(frozenset({0}), frozenset({0, 1}), frozenset({1})),
        shared_with=frozenset(),
        thread=frozenset({0}),
        operations=(
            ("contact", "create", 0, False),
            ("contact", "create", 0, False),
            ("contacts_renamed", 0, False),
            ("contacts_made", 1, False),
            ("contacts_moved", 0, 1, False),
            ("note", "create", 0, 0, False, False),
            ("notes_made_public", 0, True, False),
            ("notes_made_public", 0, False, False),
            ("message", False),
            ("thread_rows_join", 1),
            ("thread_rows_leave", 0),
            ("contact_elsewhere", 1, False, True),
            ("contact_elsewhere", 0, True, False),
            ("seat_join", 0),
            ("chat_line", False),
            ("seat_join", 1),
            ("seat_handover", 0, 2),
            ("seat_leave", 1),
            ("chat_line", True),
        ),
    )
)
async def test_every_socket_hears_exactly_what_its_account_may_read(
    live_servers: LiveServers, ws: Clients, plan: Plan
) -> None:
    server = live_servers.get("leak", REALTIME_RECHECK_INTERVAL=60.0)
    world = await off_loop(build, plan)
    clients = await connect(server, ws, world)
    try:
        for operation in plan.operations:
            expected = await off_loop(play, world, operation)
            if operation[0] in MEMBERSHIP:
                await rechecked(server, world)
            heard = await heard_since_last(world, clients)
            for account, got in enumerate(heard):
                assert got == expected.get(account, Counter()), (operation, account)
    finally:
        await asyncio.gather(*(client.close() for client in clients))
