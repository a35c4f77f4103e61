"""``SocketManager`` and ``Dispatcher`` on their own: who hears a message, and what they get.

How these tests stand in for the rest of the stack:

* The sockets are real ``realtime.sockets.connection.Socket`` objects whose ASGI ``send`` is a
  fake that records what it is handed (or fails, hangs, or plays daphne's buffered ``send`` partial
  with an autobahn-like protocol whose pending output the test controls, handed to the socket
  as the ``DaphneLink`` the consumer would find behind daphne's real ``send``). Fake sends are
  the only fakes here.
* ``register`` and ``set_scopes`` follow the scopes a socket reads on the manager's
  transport. Rather than replacing those calls, each manager gets a real ``TableTransport``
  (fast polling, built by the ``make_table_transport`` fixture, which stops it afterwards):
  following happens for real against the test database, so every test is transactional. The
  process-wide transport and the manager's listener and housekeeping are never started.
* Messages are the JSON built by ``realtime.writes.packing.scope_messages`` / ``users_messages``,
  decoded, and handed to ``dispatcher.plan`` then ``dispatcher.carry_out`` directly, so each
  test decides when a delivery happens. Only the ``on_message`` test goes through the queue.
  ``deliver`` then lets what the delivery started beside it finish (bounded): the sockets'
  writers (a send that may wait has one per socket) and the closes of dropped sockets.
"""

from __future__ import annotations

import asyncio
import difflib
import functools
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from realtime import logs, signals
from realtime.auth import RealtimeAuth, Scope
from realtime.compat import daphne
from realtime.messages import base_channel, mark_publication, scope_channel
from realtime.positions import GLOBAL, StreamPos, Vector, global_position
from realtime.sockets import live_queries, protocol
from realtime.sockets import manager as manager_module
from realtime.sockets.connection import STALL_BYTES, Send, Socket
from realtime.sockets.cursors import position_of, read_cursor
from realtime.sockets.delivery import Plan
from realtime.sockets.link import DaphneLink, Link
from realtime.sockets.manager import SocketManager
from realtime.sockets.record_order import RecordOrder
from realtime.sockets.refresh import cursor_answer
from realtime.transports.table import TableTransport
from realtime.writes.packing import recheck_messages, scope_messages, users_messages
from tests.helpers import WAIT, off_loop
from tests.testapp.models import Case, Company, Job, PrivateNote, Workspace

pytestmark = pytest.mark.django_db(transaction=True)

MakeTransport = Callable[..., TableTransport]
Message = dict[str, Any]

ANN, BOB, CAROL = 101, 102, 103


@dataclass(frozen=True)
class Account:
    """An account as a socket needs it: something with a ``pk``."""

    pk: int


class FakeSend:
    """A fake ASGI ``send``: records every message it is handed."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def __call__(self, message: Message) -> None:
        self.messages.append(message)

    @property
    def frames(self) -> list[str]:
        return [m["text"] for m in self.messages if m["type"] == "websocket.send"]

    @property
    def closes(self) -> list[int]:
        return [m["code"] for m in self.messages if m["type"] == "websocket.close"]


class SendFailedError(Exception):
    """What a server of its own kind may raise from ``send`` once the client is gone."""


class FailingSend(FakeSend):
    """A ``send`` that records the message, then raises."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error = error

    async def __call__(self, message: Message) -> None:
        self.messages.append(message)
        raise self.error


class HangingSend(FakeSend):
    """A ``send`` that records the message, then never completes (a client not reading)."""

    async def __call__(self, message: Message) -> None:
        self.messages.append(message)
        await asyncio.Event().wait()


class FakeTwistedTransport:
    """The attributes of a Twisted TCP transport that tell how much output is waiting."""

    def __init__(self) -> None:
        self.dataBuffer = b""
        self.offset = 0
        self._tempDataLen = 0


class FakeAutobahnProtocol:
    """What daphne's ``send`` partial is bound to: an autobahn WebSocket protocol."""

    STATE_CLOSED = 0
    STATE_CONNECTING = 1
    STATE_CLOSING = 2
    STATE_OPEN = 3

    def __init__(self, *, fail_with: BaseException | None = None) -> None:
        self.state = self.STATE_OPEN
        self.transport = FakeTwistedTransport()
        self.replies: list[Message] = []
        self.close_frames: list[dict[str, Any]] = []
        self.fail_with = fail_with

    def sendCloseFrame(  # noqa: N802 - autobahn's name
        self,
        code: int | None = None,
        reasonUtf8: bytes | None = None,  # noqa: N803 - autobahn's name
        isReply: bool = False,  # noqa: N803 - autobahn's name
    ) -> None:
        self.close_frames.append({"code": code, "reasonUtf8": reasonUtf8, "isReply": isReply})
        self.state = self.STATE_CLOSING

    @property
    def frames(self) -> list[str]:
        return [m["text"] for m in self.replies if m["type"] == "websocket.send"]


async def fake_handle_reply(protocol_: FakeAutobahnProtocol, message: Message) -> None:
    """Daphne's ``Server.handle_reply``: hand the message to the protocol, never wait."""
    protocol_.replies.append(message)
    if protocol_.fail_with is not None:
        raise protocol_.fail_with


def daphne_send(protocol_: FakeAutobahnProtocol) -> Send:
    return functools.partial(fake_handle_reply, protocol_)


@pytest.fixture
async def manager(make_table_transport: MakeTransport) -> AsyncIterator[SocketManager]:
    """A manager following scopes on a real table transport; its delivery tasks are
    cancelled afterwards (the fixture that built the transport stops it)."""
    built = SocketManager()
    built._transport = make_table_transport()
    _made.clear()
    yield built
    writers = [socket._writer for socket in _made if socket._writer is not None]
    _made.clear()
    tasks = [*built.dispatcher._tasks, *built.dispatcher._spawned, *built._beside_tasks, *writers]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


#: Every socket the current test made, so that ``settle`` can wait for their writers.
_made: list[Socket] = []


@pytest.fixture
async def stall_watch(
    manager: SocketManager, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[None]:
    """Run the manager's stall watch, every 20 ms rather than every second."""
    monkeypatch.setattr(manager_module, "TICK", 0.02)
    task = asyncio.get_running_loop().create_task(manager._watch_stalls())
    yield
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def link_of(send: Send | None) -> Link | None:
    """The link the consumer finds behind daphne's ``send``, for the autobahn-like protocol a
    fake daphne ``send`` is bound to (``None``: the socket knows its connection only through
    ``send``)."""
    if isinstance(send, functools.partial) and isinstance(send.args[0], FakeAutobahnProtocol):
        fake = send.args[0]
        return DaphneLink(daphne.Connection(fake, fake.transport), buffered=True)
    return None


def make_socket(user: Any, *scope_ids: int, send: Send | None = None) -> Socket:
    socket = Socket(
        consumer=None,
        send=send or FakeSend(),
        user=user,
        token="t",
        ask=protocol.read_scopes({}),
        scopes={scope_id: f"scope-{scope_id}" for scope_id in scope_ids},
        link=link_of(send),
    )
    _made.append(socket)
    return socket


async def settle(manager: SocketManager) -> None:
    """Wait (bounded) until the sockets' writers are idle and the closes of dropped sockets
    have run."""
    async with asyncio.timeout(WAIT):
        while True:
            busy: list[asyncio.Task[Any]] = [s._writer for s in _made if s._writer is not None]
            busy += manager._beside_tasks
            if not busy:
                return
            await asyncio.wait(busy)


def recorder(socket: Socket) -> FakeSend:
    send = socket._send
    assert isinstance(send, FakeSend)
    return send


async def open_socket(
    manager: SocketManager,
    user: Any,
    *scope_ids: int,
    channels: Iterable[str] = (),
    send: Send | None = None,
) -> Socket:
    """Register a socket of ``user`` reading ``scope_ids`` and subscribe it to ``channels``."""
    socket = make_socket(
        user if not isinstance(user, int) else Account(user), *scope_ids, send=send
    )
    await manager.register(socket, channels)
    await manager.go_live(socket)
    return socket


def only(messages: list[tuple[str, bytes]]) -> Message:
    assert len(messages) == 1
    decoded: Message = json.loads(messages[0][1])
    return decoded


def scope_event(
    scope_id: int,
    event_type: str = "contact.updated",
    data: Any = None,
    *,
    channels: list[str] | None = None,
    meta: dict[str, Any] | None = None,
    **options: Any,
) -> Message:
    """A scope message exactly as ``payload.scope_messages`` builds it."""
    if data is None:
        data = {"model": "contact", "id": 7}
    return only(
        scope_messages(
            scope_id, event_type, data, channels=channels, meta=meta or {}, budget=None, **options
        )
    )


def users_event(
    user_ids: list[int],
    event_type: str = "user.updated",
    data: Any = None,
    *,
    channels: list[str] | None = None,
    meta: dict[str, Any] | None = None,
    skip_scope: int | None = None,
) -> Message:
    """An account message exactly as ``payload.users_messages`` builds it."""
    return only(
        users_messages(
            user_ids,
            event_type,
            {"id": 5} if data is None else data,
            channels=channels,
            meta=meta or {},
            skip_scope=skip_scope,
            budget=None,
        )
    )


async def deliver(manager: SocketManager, message: Message) -> Plan | None:
    """Plan ``message`` and carry it out, as the delivery pipeline does when no next message
    is ready to carry."""
    plan = await manager.dispatcher.plan(message)
    if plan is not None:
        await manager.dispatcher.carry_out(plan)
    await manager.dispatcher.flush_queries()  # no next message is ready
    await settle(manager)
    return plan


def heard(*sockets: Socket) -> list[list[str]]:
    return [recorder(socket).frames for socket in sockets]


# Scope events ------------------------------------------------------------------------------


async def test_a_scope_event_reaches_only_sockets_of_that_scope_subscribed_to_one_of_its_channels(
    manager: SocketManager,
) -> None:
    model = await open_socket(manager, ANN, 1, channels=["contact"])
    record = await open_socket(manager, BOB, 1, channels=["contact:7"])
    both_scopes = await open_socket(manager, CAROL, 2, 1, channels=["contact"])
    other_channel = await open_socket(manager, ANN, 1, channels=["company", "contact:8"])
    unsubscribed = await open_socket(manager, BOB, 1)
    other_scope = await open_socket(manager, ANN, 2, channels=["contact"])
    no_scope = await open_socket(manager, ANN, channels=["contact", "contact:7"])

    plan = await deliver(manager, scope_event(1, channels=["contact", "contact:7"]))

    assert plan is not None
    assert plan.targets == {model, record, both_scopes}
    frame = '{"type":"contact.updated","data":{"model":"contact","id":7},"scope_id":1}'
    assert heard(model, record, both_scopes) == [[frame]] * 3
    assert heard(other_channel, unsubscribed, other_scope, no_scope) == [[]] * 4


async def test_a_scope_event_without_channels_reaches_every_socket_of_the_scope(
    manager: SocketManager,
) -> None:
    subscribed = await open_socket(manager, ANN, 1, channels=["contact"])
    elsewhere = await open_socket(manager, BOB, 1, channels=["company"])
    unsubscribed = await open_socket(manager, CAROL, 1)
    other_scope = await open_socket(manager, ANN, 2, channels=["contact"])
    no_scope = await open_socket(manager, BOB)

    await deliver(manager, scope_event(1, channels=None))

    frame = '{"type":"contact.updated","data":{"model":"contact","id":7},"scope_id":1}'
    assert heard(subscribed, elsewhere, unsubscribed) == [[frame]] * 3
    assert heard(other_scope, no_scope) == [[], []]


async def test_a_scope_event_for_a_scope_nobody_here_reads_is_planned_to_nobody(
    manager: SocketManager,
) -> None:
    elsewhere = await open_socket(manager, ANN, 2, channels=["contact"])

    assert await deliver(manager, scope_event(1, channels=None)) is None
    assert heard(elsewhere) == [[]]


async def test_a_subscription_made_while_reading_no_scope_reaches_nothing_addressed_to_a_scope(
    manager: SocketManager,
) -> None:
    member = await open_socket(manager, ANN, 1, channels=["contact"])
    scopeless = await open_socket(manager, ANN, channels=["contact"])

    await deliver(manager, scope_event(1, channels=["contact"]))

    assert heard(member, scopeless) == [
        ['{"type":"contact.updated","data":{"model":"contact","id":7},"scope_id":1}'],
        [],
    ]


@pytest.mark.parametrize(
    ("event_type", "data", "meta", "frame"),
    [
        (
            "contact.created",
            {"model": "contact", "id": 7},
            {},
            '{"type":"contact.created","data":{"model":"contact","id":7},"scope_id":3}',
        ),
        (
            "contact.updated",
            {"model": "contact", "id": 7},
            {"changed": ["name"], "origin": "tab-1"},
            '{"type":"contact.updated","data":{"model":"contact","id":7},'
            '"origin":"tab-1","changed":["name"],"scope_id":3}',
        ),
        (
            "contact.updated",
            {"model": "contact", "id": 7},
            {"truncated": True, "changed": ["notes"]},
            '{"type":"contact.updated","data":{"model":"contact","id":7},'
            '"changed":["notes"],"truncated":true,"scope_id":3}',
        ),
        (
            "report.ready",
            None,
            {"truncated": True},
            '{"type":"report.ready","data":null,"truncated":true,"scope_id":3}',
        ),
    ],
)
async def test_the_frame_is_compact_json_with_keys_in_protocol_order(
    manager: SocketManager, event_type: str, data: Any, meta: dict[str, Any], frame: str
) -> None:
    socket = await open_socket(manager, ANN, 3)
    message = only(scope_messages(3, event_type, data, channels=None, meta=meta, budget=None))

    await deliver(manager, message)

    assert heard(socket) == [[frame]]


async def test_non_ascii_text_is_sent_as_is(manager: SocketManager) -> None:
    socket = await open_socket(manager, ANN, 3)
    data = {"model": "contact", "id": 7, "name": "Zoë “東京” 🚀"}

    await deliver(manager, scope_event(3, "contact.created", data))

    assert heard(socket) == [
        [
            '{"type":"contact.created","data":{"model":"contact","id":7,'
            '"name":"Zoë “東京” 🚀"},"scope_id":3}'
        ]
    ]


async def test_the_frame_is_encoded_once_and_handed_to_every_socket_as_the_same_string(
    manager: SocketManager,
) -> None:
    sockets = [
        await open_socket(manager, ANN, 1, channels=["contact"]),
        await open_socket(manager, BOB, 1, channels=["contact:7"]),
        await open_socket(manager, CAROL, 1, channels=["contact"]),
    ]
    buffered = FakeAutobahnProtocol()
    sockets.append(
        await open_socket(manager, CAROL, 1, channels=["contact"], send=daphne_send(buffered))
    )

    plan = await manager.dispatcher.plan(scope_event(1, channels=["contact", "contact:7"]))
    assert plan is not None
    await manager.dispatcher.carry_out(plan)
    await settle(manager)

    texts = [recorder(socket).frames[0] for socket in sockets[:3]] + buffered.frames
    assert len(texts) == 4
    assert all(text is plan.frame for text in texts)


async def test_excluded_accounts_hear_nothing(manager: SocketManager) -> None:
    ann = await open_socket(manager, ANN, 1, channels=["contact"])
    ann_again = await open_socket(manager, ANN, 1)
    bob = await open_socket(manager, BOB, 1, channels=["contact"])

    await deliver(manager, scope_event(1, channels=["contact"], exclude=[ANN]))
    await deliver(manager, scope_event(1, "contact.deleted", channels=None, exclude=[ANN]))

    assert [len(frames) for frames in heard(ann, ann_again, bob)] == [0, 0, 2]


async def test_only_the_named_accounts_hear_an_event_restricted_to_them(
    manager: SocketManager,
) -> None:
    ann = await open_socket(manager, ANN, 1, channels=["contact"])
    bob = await open_socket(manager, BOB, 1, channels=["contact"])
    bob_unsubscribed = await open_socket(manager, BOB, 1)
    carol = await open_socket(manager, CAROL, 1, channels=["contact"])

    await deliver(manager, scope_event(1, channels=["contact"], only=[BOB, CAROL]))

    assert [len(frames) for frames in heard(ann, bob, bob_unsubscribed, carol)] == [0, 1, 0, 1]


async def test_an_event_restricted_to_nobody_here_reaches_nobody(manager: SocketManager) -> None:
    ann = await open_socket(manager, ANN, 1, channels=["contact"])

    plan = await deliver(manager, scope_event(1, channels=None, only=[BOB]))

    assert plan is not None
    assert plan.targets == set()
    assert heard(ann) == [[]]


# Account events ---------------------------------------------------------------------------


async def test_an_account_event_reaches_every_socket_of_the_account_whatever_it_reads(
    manager: SocketManager,
) -> None:
    in_one = await open_socket(manager, ANN, 1)
    in_two = await open_socket(manager, ANN, 2, 1, channels=["company"])
    nowhere = await open_socket(manager, ANN)
    bob = await open_socket(manager, BOB, 1, channels=["notification"])

    await deliver(manager, users_event([ANN], meta={"origin": "tab-1"}))
    # Channels do not narrow an account event: sockets that subscribed to none of them hear it.
    await deliver(manager, users_event([ANN], "notification.created", channels=["notification"]))

    expected = [
        '{"type":"user.updated","data":{"id":5},"origin":"tab-1"}',
        '{"type":"notification.created","data":{"id":5}}',
    ]
    assert heard(in_one, in_two, nowhere) == [expected] * 3
    assert heard(bob) == [[]]


async def test_skip_scope_leaves_out_the_sockets_reading_that_scope(
    manager: SocketManager,
) -> None:
    reading_it = await open_socket(manager, ANN, 1)
    reading_it_among_others = await open_socket(manager, ANN, 2, 1)
    reading_another = await open_socket(manager, ANN, 2)
    nowhere = await open_socket(manager, ANN)
    other_account = await open_socket(manager, BOB, 2)

    await deliver(manager, users_event([ANN], skip_scope=1))

    frame = '{"type":"user.updated","data":{"id":5}}'
    assert heard(reading_it, reading_it_among_others, other_account) == [[]] * 3
    assert heard(reading_another, nowhere) == [[frame]] * 2


# Guarded records ---------------------------------------------------------------------------


def make_notes() -> tuple[Workspace, Any, Any, PrivateNote, PrivateNote]:
    workspace = Workspace.objects.create(name="Acme", slug="acme")
    user_model = get_user_model()
    author = user_model.objects.create_user(username="ann")
    other = user_model.objects.create_user(username="bob")
    secret = PrivateNote.objects.create(workspace=workspace, author=author, title="mine")
    public = PrivateNote.objects.create(
        workspace=workspace, author=other, title="ours", public=True
    )
    return workspace, author, other, secret, public


async def test_an_event_about_a_guarded_record_reaches_only_its_readers(
    manager: SocketManager,
) -> None:
    workspace, author, other, secret, public = await off_loop(make_notes)
    scope = int(workspace.pk)
    author_socket = await open_socket(manager, author, scope, channels=["private_note"])
    other_socket = await open_socket(manager, other, scope, channels=["private_note"])

    for note in (secret, public):
        message = scope_event(
            scope,
            "private_note.updated",
            {"model": "private_note", "id": note.pk, "title": note.title},
            channels=["private_note", f"private_note:{note.pk}"],
            about={"model": "private_note", "id": note.pk},
        )
        await deliver(manager, message)

    assert [[json.loads(f)["data"]["id"] for f in frames] for frames in heard(author_socket)] == [
        [secret.pk, public.pk]
    ]
    assert [[json.loads(f)["data"]["id"] for f in frames] for frames in heard(other_socket)] == [
        [public.pk]
    ]


class AskedAudience(RealtimeAuth):
    """The default auth service, noting the accounts each audience check asks about."""

    asked: ClassVar[list[list[Any]]] = []

    def audience(
        self,
        scope_id: Any,
        event_type: str,
        data: Any,
        user_ids: Iterable[Any],
        about: dict[str, Any] | None,
    ) -> Iterable[Any]:
        user_ids = list(user_ids)
        self.asked.append(sorted(user_ids))
        return super().audience(scope_id, event_type, data, user_ids, about)


class UnknowableAudience(RealtimeAuth):
    """The default auth service, but its audience check fails for a row titled
    ``unknowable`` (as a hook reading a database that is away would)."""

    def audience(
        self,
        scope_id: Any,
        event_type: str,
        data: Any,
        user_ids: Iterable[Any],
        about: dict[str, Any] | None,
    ) -> Iterable[Any]:
        if isinstance(data, dict) and data.get("title") == "unknowable":
            raise RuntimeError("who may read it is not known")
        return super().audience(scope_id, event_type, data, user_ids, about)


async def test_a_live_list_stays_exact_when_who_may_read_a_written_row_cannot_be_told(
    manager: SocketManager, caplog: pytest.LogCaptureFixture
) -> None:
    """Nobody hears the event whose audience check failed; the live queries it may change
    read their rows again with their own permissions, rather than drop a row they list."""
    workspace, (ann, _), acme, _ = await off_loop(make_case_readers)
    scope = int(workspace.pk)
    socket = await open_socket(manager, ann, scope)
    case = await off_loop(Case.objects.create, workspace=workspace, company=acme, title="x")
    await manager.dispatcher.live.start(
        socket, {"id": "open", "model": "case", "where": {"status": "open"}}
    )
    case.title = "unknowable"
    await off_loop(case.save)
    with (
        override_settings(REALTIME_AUTH=f"{__name__}.UnknowableAudience"),
        caplog.at_level(logging.ERROR, logger="realtime"),
    ):
        await deliver(manager, case_event(scope, case))
        await settle(manager)
    frames = [json.loads(frame) for frame in recorder(socket).frames]
    assert [frame["type"] for frame in frames] == ["query.rows", "query.diff"]
    diff = frames[-1]["data"]
    assert (diff["leave"], diff["enter"]) == ([], [])
    assert [(row["id"], row["title"]) for row in diff["update"]] == [(case.pk, "unknowable")]
    assert any("audience() failed" in r.getMessage() for r in caplog.records)


def case_event(scope: int, case: Case) -> Message:
    """A ``case.created`` message as a publication of ``case`` builds it: the guard's
    ``about``, the ``filters`` values in ``meta``."""
    data = {"model": "case", "id": case.pk, "title": case.title}
    data |= {"status": case.status, "priority": case.priority}
    filters = {"status": case.status, "company": case.company_id, "assignee": case.assignee_id}
    filters |= {"priority": case.priority, "due": None, "private": case.private}
    return scope_event(
        scope,
        "case.created",
        data,
        channels=["case", f"case:{case.pk}"],
        meta={"filters": filters},
        about={"model": "case", "id": case.pk},
    )


def make_case_readers() -> tuple[Workspace, list[Any], Company, Company]:
    workspace = Workspace.objects.create(name="Acme", slug="acme")
    users = [get_user_model().objects.create_user(username=name) for name in ("ann", "bob")]
    acme = Company.objects.create(workspace=workspace, name="Acme")
    globex = Company.objects.create(workspace=workspace, name="Globex")
    return workspace, users, acme, globex


@override_settings(REALTIME_AUTH="tests.test_manager.AskedAudience")
async def test_a_guarded_write_asks_the_audience_only_of_sockets_whose_live_queries_it_may_change(
    manager: SocketManager,
) -> None:
    workspace, (ann, bob), acme, globex = await off_loop(make_case_readers)
    scope = int(workspace.pk)
    ann_socket, bob_socket = [await open_socket(manager, user, scope) for user in (ann, bob)]
    live = manager.dispatcher.live
    await live.start(ann_socket, {"id": "acme", "model": "case", "where": {"company": acme.pk}})
    await live.start(bob_socket, {"id": "urgent", "model": "case", "where": {"priority__gte": 5}})
    await settle(manager)

    def create(company: Company, priority: int) -> Case:
        return Case.objects.create(
            workspace=workspace, company=company, title=company.name, priority=priority
        )

    nowhere, acme_case, urgent = [
        await off_loop(create, company, priority)
        for company, priority in ((globex, 0), (acme, 0), (globex, 7))
    ]
    AskedAudience.asked.clear()
    # Matched in process first: a write no query of these sockets shows asks nothing...
    await deliver(manager, case_event(scope, nowhere))
    assert AskedAudience.asked == []
    # ... and one that a query shows asks only about that query's account.
    await deliver(manager, case_event(scope, acme_case))
    await deliver(manager, case_event(scope, urgent))
    assert AskedAudience.asked == [[ann.pk], [bob.pk]]
    for frames, case in zip(heard(ann_socket, bob_socket), (acme_case, urgent), strict=True):
        assert [json.loads(frame)["type"] for frame in frames] == ["query.rows", "query.diff"]
        assert json.loads(frames[1])["data"]["enter"][0]["id"] == case.pk


async def test_writes_carried_together_reach_a_live_query_in_one_diff(
    manager: SocketManager,
) -> None:
    workspace, (ann, _), acme, _ = await off_loop(make_case_readers)
    scope = int(workspace.pk)
    socket = await open_socket(manager, ann, scope)
    await manager.dispatcher.live.start(socket, {"id": "acme", "model": "case"})
    first, second = [
        await off_loop(Case.objects.create, workspace=workspace, company=acme, title=title)
        for title in ("first", "second")
    ]
    # As the pipeline does when both messages of a publication are planned and ready:
    # carried one after the other, then the clients told.
    for case in (first, second):
        plan = await manager.dispatcher.plan(case_event(scope, case))
        assert plan is not None
        await manager.dispatcher.carry_out(plan)
    await manager.dispatcher.flush_queries()
    await settle(manager)
    frames = [json.loads(frame) for frame in recorder(socket).frames]
    assert [frame["type"] for frame in frames] == ["query.rows", "query.diff"]
    assert [row["id"] for row in frames[1]["data"]["enter"]] == [first.pk, second.pk]


async def test_a_live_query_read_while_a_recheck_takes_a_scope_shows_none_of_its_rows(
    manager: SocketManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first read of a live query runs off the event loop; a recheck taking one of the
    scopes it reads from the socket meanwhile makes it read again: no row of that scope is
    ever sent, not even in a ``query.rows`` superseded a moment later."""
    workspace, (ann, _), acme, _ = await off_loop(make_case_readers)
    other = await off_loop(Workspace.objects.create, name="Other", slug="other")
    kept = await off_loop(Case.objects.create, workspace=workspace, company=acme, title="kept")
    lost = await off_loop(Case.objects.create, workspace=other, title="lost")
    socket = await open_socket(manager, ann, int(workspace.pk), int(other.pk))
    reading, go = threading.Event(), threading.Event()
    first_read = live_queries.read_rows

    def held_read(*args: Any) -> Any:
        rows = first_read(*args)
        if not reading.is_set():
            reading.set()
            assert go.wait(WAIT)
        return rows

    monkeypatch.setattr(live_queries, "read_rows", held_read)
    started = asyncio.ensure_future(
        manager.dispatcher.live.start(socket, {"id": "all", "model": "case"})
    )
    assert await off_loop(reading.wait, WAIT)
    await manager.set_scopes(socket, [Scope(int(workspace.pk), "acme")], keep_channels=True)
    go.set()
    await started
    await settle(manager)

    frames = [json.loads(frame) for frame in recorder(socket).frames]
    shown = {row["id"] for frame in frames for row in frame["data"].get("rows", ())}
    shown |= {row["id"] for frame in frames for row in frame["data"].get("enter", ())}
    assert shown == {kept.pk}
    assert lost.pk not in shown


async def test_a_live_query_reads_its_guarded_rows_for_the_account_as_it_is_now(
    manager: SocketManager,
) -> None:
    """A guard is decided for the account as it is when the rows are read, as delivery
    decides guarded rows, not as it was at the socket's handshake: an account made inactive
    since (by an ``update()``, which no recheck hears) lists no guarded row."""
    workspace, (ann, _), acme, _ = await off_loop(make_case_readers)
    await off_loop(Case.objects.create, workspace=workspace, company=acme, title="open")
    socket = await open_socket(manager, ann, int(workspace.pk))
    live = manager.dispatcher.live
    await live.start(socket, {"id": "before", "model": "case"})
    await off_loop(lambda: get_user_model().objects.filter(pk=ann.pk).update(is_active=False))
    await live.start(socket, {"id": "after", "model": "case"})
    await settle(manager)

    frames = [json.loads(frame) for frame in recorder(socket).frames]
    listed = {frame["data"]["id"]: len(frame["data"]["rows"]) for frame in frames}
    assert listed == {"before": 1, "after": 0}


async def test_windows_refilled_for_one_message_are_read_once_per_shape_and_account(
    manager: SocketManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    workspace, (ann, bob), _, _ = await off_loop(make_case_readers)
    scope = int(workspace.pk)
    sockets = [await open_socket(manager, user, scope) for user in (ann, ann, ann, bob, bob)]
    top = await off_loop(Case.objects.create, workspace=workspace, title="top", priority=9)
    reserve = await off_loop(Case.objects.create, workspace=workspace, title="held", priority=5)
    await off_loop(Case.objects.create, workspace=workspace, title="next", priority=1)
    # A private row only ann may read, below the rows every account reads.
    await off_loop(
        Case.objects.create,
        workspace=workspace,
        title="ann's",
        priority=0,
        private=True,
        assignee=ann,
    )
    ask: dict[str, Any] = {"id": "top", "model": "case", "where": {"status": "open"}}
    ask |= {"order_by": ["-priority"], "limit": 1}
    live = manager.dispatcher.live
    for socket in sockets:
        await live.start(socket, ask)
    # Each window holds the top row and one more past its limit; that one leaves first.
    reserve.status = "closed"
    await off_loop(reserve.save)
    await deliver(manager, case_event(scope, reserve))
    statements: list[int] = []
    shared = live_queries.read_shared_rows

    def counted(*args: Any) -> Any:
        with CaptureQueriesContext(connection) as queries:
            found = shared(*args)
        statements.append(len(queries.captured_queries))
        return found

    monkeypatch.setattr(live_queries, "read_shared_rows", counted)
    top.status = "closed"
    await off_loop(top.save)
    await deliver(manager, case_event(scope, top))
    # The top row left every full window, which holds no other row now: the rows after it
    # are read once for ann's three sockets and bob's two, in two statements (the accounts
    # as they are now, then the rows), each account's guard decided on them here.
    assert statements == [2]
    for frames in heard(*sockets):
        diff = json.loads(frames[-1])["data"]
        assert (diff["leave"], [row["title"] for row in diff["enter"]]) == ([top.pk], ["next"])


async def test_accounts_sharing_a_guarded_shape_get_each_the_rows_their_guard_lets_them_read(
    manager: SocketManager,
) -> None:
    """One read serves the accounts of a guarded shape; each window is refilled with the
    rows its account may read, as the ORM lists them for it. Bob's is not filled by the rows
    that read holds (ann's private rows come first): it is read for him alone."""
    workspace, (ann, bob), _, _ = await off_loop(make_case_readers)
    scope = int(workspace.pk)
    sockets = {user.pk: await open_socket(manager, user, scope) for user in (ann, bob)}
    ask: dict[str, Any] = {"id": "open", "model": "case", "where": {"status": "open"}}
    ask |= {"order_by": ["-priority"], "limit": 2}

    def make() -> list[Case]:
        made = [
            Case(workspace=workspace, title=f"ann's {n}", priority=n, private=True, assignee=ann)
            for n in range(100, 125)
        ]
        made += [Case(workspace=workspace, title=f"shared {n}", priority=n) for n in range(1, 6)]
        return Case.objects.bulk_create(made)

    rows = await off_loop(make)
    live = manager.dispatcher.live
    for socket in sockets.values():
        await live.start(socket, ask)
    # Each window and its reserve leave together: both are read again, in one flush.
    leaving = [row for row in rows if row.priority >= 121 or 2 <= row.priority <= 5]
    await off_loop(
        lambda: Case.objects.filter(pk__in=[row.pk for row in leaving]).update(status="closed")
    )
    for row in leaving:
        row.status = "closed"
        plan = await manager.dispatcher.plan(case_event(scope, row))
        if plan is not None:
            await manager.dispatcher.carry_out(plan)
    await manager.dispatcher.flush_queries()
    await settle(manager)
    assert listed(sockets[ann.pk], "open") == ["ann's 120", "ann's 119"]
    assert listed(sockets[bob.pk], "open") == ["shared 1"]
    for user in (ann, bob):
        assert listed(sockets[user.pk], "open") == await off_loop(orm_titles, ask, user, scope)


def orm_titles(ask: dict[str, Any], user: Any, scope: int) -> list[str]:
    _, shape = live_queries.read_query(ask)
    rows = live_queries.queryset(shape, user, [scope])[: shape.limit]
    return [row.title for row in rows]


def listed(socket: Socket, query_id: str) -> list[str]:
    """The titles a client holds for ``query_id`` after the frames ``socket`` was sent, in
    the order of the query (``-priority``)."""
    held: dict[Any, dict[str, Any]] = {}
    for text in recorder(socket).frames:
        frame = json.loads(text)
        data = frame["data"]
        if data.get("id") != query_id:
            continue
        if frame["type"] == "query.rows":
            held = {row["id"]: row for row in data["rows"]}
        elif frame["type"] == "query.diff":
            for key in data["leave"]:
                held.pop(key, None)
            for row in [*data["enter"], *data["update"]]:
                held[row["id"]] = row
    return [row["title"] for row in sorted(held.values(), key=lambda row: -row["priority"])]


async def test_a_window_whose_refill_fails_closes_its_socket_1012_to_ask_again(
    manager: SocketManager, caplog: pytest.LogCaptureFixture
) -> None:
    """A list that could not be read again after a row left it may be short or stale: its
    socket reconnects and asks again rather than keep it (the table is away: a real
    failure of the database's, not a stand-in)."""
    workspace, (ann, _), _, _ = await off_loop(make_case_readers)
    scope = int(workspace.pk)
    socket = await open_socket(manager, ann, scope)
    top = await off_loop(Job.objects.create, workspace=workspace, title="top", priority=9)
    reserve = await off_loop(Job.objects.create, workspace=workspace, title="held", priority=5)
    await off_loop(Job.objects.create, workspace=workspace, title="next", priority=1)
    ask: dict[str, Any] = {"id": "top", "model": "job", "where": {"status": "open"}}
    ask |= {"order_by": ["-priority"], "limit": 1}
    await manager.dispatcher.live.start(socket, ask)
    reserve.status = "closed"
    await off_loop(reserve.save)
    await deliver(manager, job_event(scope, reserve))  # the reserve goes: no read
    top.status = "closed"
    await off_loop(top.save)
    table = Job._meta.db_table
    await off_loop(rename_table, table, f"{table}_away")
    try:
        with caplog.at_level(logging.ERROR, logger="realtime"):
            await deliver(manager, job_event(scope, top))  # its window is read again: fails
            await settle(manager)
    finally:
        await off_loop(rename_table, f"{table}_away", table)
    assert recorder(socket).closes == [1012]
    assert any("closed 1012 to reconnect and ask again" in r.getMessage() for r in caplog.records)


def job_event(scope: int, job: Job) -> Message:
    """A ``job.updated`` message as a publication of ``job`` builds it."""
    data = {"model": "job", "id": job.pk, "title": job.title}
    data |= {"status": job.status, "priority": job.priority}
    return scope_event(
        scope,
        "job.updated",
        data,
        channels=["job", f"job:{job.pk}"],
        meta={"filters": {"status": job.status, "priority": job.priority}},
        about={"model": "job", "id": job.pk},
    )


def rename_table(old: str, new: str) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {old} RENAME TO {new}")


async def test_a_row_a_query_comes_to_hold_after_a_message_about_it_was_planned_is_followed(
    manager: SocketManager,
) -> None:
    workspace, (ann, _), acme, _ = await off_loop(make_case_readers)
    scope = int(workspace.pk)
    socket = await open_socket(manager, ann, scope)
    await manager.dispatcher.live.start(
        socket, {"id": "open", "model": "case", "where": {"status": "open"}}
    )
    case = await off_loop(Case.objects.create, workspace=workspace, company=acme, title="x")
    created = case_event(scope, case)
    case.status = "closed"
    await off_loop(case.save)
    closed = case_event(scope, case)
    # Planned ahead, as the pipeline plans the next messages while one is carried out: when
    # the second is planned, no query holds the row yet, and its new values match none.
    plans = [await manager.dispatcher.plan(message) for message in (created, closed)]
    for plan in plans:
        assert plan is not None
        await manager.dispatcher.carry_out(plan)
    await manager.dispatcher.flush_queries()
    await settle(manager)
    frames = [json.loads(frame) for frame in recorder(socket).frames]
    # The row entered and left again before the client was told: nothing to tell.
    assert [frame["type"] for frame in frames] == ["query.rows"]
    assert manager.dispatcher.live.by_model["case"].all.pop().held == {}


async def test_a_live_querys_diff_goes_before_a_later_messages_frame_to_its_socket(
    manager: SocketManager,
) -> None:
    workspace, (ann, _), acme, _ = await off_loop(make_case_readers)
    scope = int(workspace.pk)
    socket = await open_socket(manager, ann, scope, channels=["contact"])
    await manager.dispatcher.live.start(socket, {"id": "acme", "model": "case"})
    case = await off_loop(Case.objects.create, workspace=workspace, company=acme, title="first")
    for message in (case_event(scope, case), scope_event(scope, channels=["contact"])):
        plan = await manager.dispatcher.plan(message)
        assert plan is not None
        await manager.dispatcher.carry_out(plan)  # no flush between: the second forces it
    await settle(manager)
    frames = [json.loads(frame) for frame in recorder(socket).frames]
    assert [frame["type"] for frame in frames] == ["query.rows", "query.diff", "contact.updated"]


async def test_a_live_querys_diff_goes_before_the_frames_of_a_later_publication_of_several(
    manager: SocketManager,
) -> None:
    """Messages put in hand together: the diff of a write goes before the frame a later
    publication sends the socket, even where that frame is not its publication's first (the
    first reaches other sockets)."""
    workspace, (ann, _), acme, _ = await off_loop(make_case_readers)
    scope = int(workspace.pk)
    socket = await open_socket(manager, ann, scope, channels=["contact"])
    await manager.dispatcher.live.start(socket, {"id": "acme", "model": "case"})
    await settle(manager)
    case = await off_loop(Case.objects.create, workspace=workspace, company=acme, title="first")
    channel = scope_channel(scope)
    later = mark_publication(
        [
            (channel, json.dumps(scope_event(scope, channels=["nobody's"])).encode()),
            (channel, json.dumps(scope_event(scope, channels=["contact"])).encode()),
        ]
    )
    manager.dispatcher.ensure_running()
    manager.on_message(channel, json.dumps(case_event(scope, case)).encode())
    for _, payload in later:
        manager.on_message(channel, payload)
    await manager.dispatcher.quiet()
    await settle(manager)
    frames = [json.loads(frame) for frame in recorder(socket).frames]
    assert [frame["type"] for frame in frames] == ["query.rows", "query.diff", "contact.updated"]


async def test_an_event_about_a_model_nobody_declared_reaches_nobody(
    manager: SocketManager,
) -> None:
    workspace, author, other, _, _ = await off_loop(make_notes)
    scope = int(workspace.pk)
    sockets = [await open_socket(manager, user, scope) for user in (author, other)]

    plan = await deliver(
        manager, scope_event(scope, "plain.updated", about={"model": "plain", "id": 1})
    )

    assert plan is not None
    assert plan.targets == set()
    assert heard(*sockets) == [[], []]


# Rechecks ---------------------------------------------------------------------------------


async def test_a_recheck_message_makes_the_sockets_of_those_accounts_due_now(
    manager: SocketManager,
) -> None:
    ann = [await open_socket(manager, ANN, 1), await open_socket(manager, ANN)]
    bob = await open_socket(manager, BOB, 1)
    carol = await open_socket(manager, CAROL, 2)
    message = only(recheck_messages([ANN, CAROL, 999], None))

    plan = await deliver(manager, message)

    now = time.monotonic()
    assert plan is not None
    assert plan.targets == set()
    assert [socket.next_recheck <= now for socket in (*ann, carol)] == [True] * 3
    assert bob.next_recheck > now
    assert heard(*ann, bob, carol) == [[]] * 4


# Sockets that do not take their frame ------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [ConnectionResetError("reset by peer"), RuntimeError("send after close"), SendFailedError()],
    ids=["os-error", "runtime-error", "server-specific-error"],
)
async def test_a_socket_whose_send_fails_is_closed_1011_and_dropped_while_the_others_hear_it(
    manager: SocketManager, error: BaseException
) -> None:
    failing = await open_socket(manager, ANN, 1, channels=["contact"], send=FailingSend(error))
    healthy = await open_socket(manager, BOB, 1, channels=["contact"])
    buffered = FakeAutobahnProtocol()
    healthy_buffered = await open_socket(
        manager, CAROL, 1, channels=["contact"], send=daphne_send(buffered)
    )

    async with asyncio.timeout(WAIT):
        plan = await deliver(manager, scope_event(1, channels=["contact"]))

    assert plan is not None
    assert heard(healthy) == [[plan.frame]]
    assert buffered.frames == [plan.frame]
    assert recorder(failing).closes == [1011]
    assert manager.index.sockets == {healthy, healthy_buffered}
    assert failing not in manager.index.by_user.get(ANN, set())
    assert failing not in manager.index.by_scope_channel.get((1, "contact"), set())


async def test_a_daphne_socket_whose_send_fails_is_closed_1011_and_dropped_while_the_others_hear_it(
    manager: SocketManager,
) -> None:
    broken = FakeAutobahnProtocol(fail_with=ConnectionResetError("reset by peer"))
    failing = await open_socket(manager, ANN, 1, channels=["contact"], send=daphne_send(broken))
    healthy = await open_socket(manager, BOB, 1, channels=["contact"])
    buffered = FakeAutobahnProtocol()
    healthy_buffered = await open_socket(
        manager, CAROL, 1, channels=["contact"], send=daphne_send(buffered)
    )

    async with asyncio.timeout(WAIT):
        plan = await deliver(manager, scope_event(1, channels=["contact"]))

    assert plan is not None
    assert heard(healthy) == [[plan.frame]]
    assert buffered.frames == [plan.frame]
    assert [close["code"] for close in broken.close_frames] == [1011]
    assert manager.index.sockets == {healthy, healthy_buffered}
    assert failing not in manager.index.by_user.get(ANN, set())


@override_settings(REALTIME_SEND_TIMEOUT=0.2)
async def test_a_socket_whose_send_never_completes_is_closed_1011_and_dropped_in_time(
    manager: SocketManager, stall_watch: None
) -> None:
    hanging = await open_socket(manager, ANN, 1, channels=["contact"], send=HangingSend())
    healthy = await open_socket(manager, BOB, 1, channels=["contact"])
    buffered = FakeAutobahnProtocol()
    healthy_buffered = await open_socket(
        manager, CAROL, 1, channels=["contact"], send=daphne_send(buffered)
    )

    started = time.monotonic()
    async with asyncio.timeout(WAIT):
        plan = await carry_out(manager, scope_event(1, channels=["contact"]))
        await until(lambda: hanging not in manager.index.sockets)
        await settle(manager)

    assert time.monotonic() - started >= 0.2
    assert plan is not None
    assert heard(healthy) == [[plan.frame]]
    assert buffered.frames == [plan.frame]
    assert recorder(hanging).frames == [plan.frame]
    assert recorder(hanging).closes == [1011]
    assert manager.index.sockets == {healthy, healthy_buffered}


@override_settings(REALTIME_SEND_TIMEOUT=0.2)
async def test_a_daphne_socket_with_output_piling_up_past_the_timeout_is_closed_1011(
    manager: SocketManager,
) -> None:
    stalled = FakeAutobahnProtocol()
    stalled.transport.dataBuffer = b"x" * (STALL_BYTES // 2)
    stalled.transport.offset = 10
    stalled.transport._tempDataLen = STALL_BYTES // 2 + 11  # one byte over the bound
    reader = FakeAutobahnProtocol()
    reader.transport.dataBuffer = b"x" * (STALL_BYTES // 2)
    stalled_socket = await open_socket(
        manager, ANN, 1, channels=["contact"], send=daphne_send(stalled)
    )
    reading = await open_socket(manager, BOB, 1, channels=["contact"], send=daphne_send(reader))
    plain = await open_socket(manager, CAROL, 1, channels=["contact"])

    stalled_from = time.monotonic()
    await deliver(manager, scope_event(1, "contact.created", channels=["contact"]))
    # A backlog that has not lasted the timeout yet is tolerated.
    assert stalled_socket in manager.index.sockets
    assert stalled.close_frames == []

    sent = 1
    async with asyncio.timeout(WAIT):
        while stalled_socket in manager.index.sockets:
            await asyncio.sleep(0.05)
            await deliver(manager, scope_event(1, channels=["contact"]))
            sent += 1

    assert time.monotonic() - stalled_from >= 0.2
    assert stalled.close_frames == [{"code": 1011, "reasonUtf8": None, "isReply": False}]
    assert not [m for m in stalled.replies if m["type"] == "websocket.close"]
    # The backlog is observed before each frame: the frame it was found stalled at is not
    # added to it.
    assert len(stalled.frames) == sent - 1
    assert len(reader.frames) == len(recorder(plain).frames) == sent
    assert reader.close_frames == []
    assert manager.index.sockets == {reading, plain}
    assert stalled_socket not in manager.index.by_scope.get(1, set())


@override_settings(REALTIME_SEND_TIMEOUT=0.2)
async def test_a_backlog_no_frame_of_ours_made_is_found_by_the_stall_watch_and_closed_1011(
    manager: SocketManager, stall_watch: None
) -> None:
    # Pongs the server wrote for a client that sends pings and reads nothing: no frame of
    # realtime's was ever handed to this socket.
    pinger = FakeAutobahnProtocol()
    pinging = await open_socket(manager, ANN, 1, send=daphne_send(pinger))
    pinger.transport._tempDataLen = STALL_BYTES + 1
    reader = FakeAutobahnProtocol()
    reading = await open_socket(manager, BOB, 1, send=daphne_send(reader))

    async with asyncio.timeout(WAIT):
        await until(lambda: pinging not in manager.index.sockets)
        await settle(manager)

    assert pinger.close_frames == [{"code": 1011, "reasonUtf8": None, "isReply": False}]
    assert manager.index.sockets == {reading}
    assert reader.close_frames == []


async def test_the_stall_watch_observes_every_tick_only_the_sockets_handed_frames_lately(
    manager: SocketManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    observed: list[Socket] = []
    stalled = Socket.stalled

    def observing(
        socket: Socket, timeout: float, now: float | None = None, *, exact: bool = False
    ) -> bool:
        observed.append(socket)
        return stalled(socket, timeout, now, exact=exact)

    monkeypatch.setattr(Socket, "stalled", observing)
    hearing = FakeAutobahnProtocol()
    heard_by = await open_socket(manager, ANN, 1, channels=["contact"], send=daphne_send(hearing))
    idle = await open_socket(manager, BOB, 2)
    await deliver(manager, scope_event(1, channels=["contact"]))
    hearing.transport._tempDataLen = 100  # the frame is still on its way
    observed.clear()

    def ticks(count: int) -> list[list[Socket]]:
        seen = []
        for _ in range(count):
            manager.drop_stalled()
            seen.append(list(observed))
            observed.clear()
        return seen

    assert ticks(2) == [[heard_by], [heard_by]]
    hearing.transport._tempDataLen = 0  # the client read it
    # Seen once more (with nothing on the way now), then not until the sweep.
    sweep = manager_module.SWEEP_TICKS
    assert ticks(sweep - 3) == [[heard_by]] + [[]] * (sweep - 4)
    # Every SWEEP_TICKS ticks, every socket.
    assert sorted(map(id, ticks(1)[0])) == sorted(map(id, [heard_by, idle]))
    await deliver(manager, scope_event(1, channels=["contact"]))
    observed.clear()
    assert ticks(1) == [[heard_by]]


class CloseHangsSend(FakeSend):
    """A ``send`` that fails every frame and never completes a close (a client gone silent)."""

    async def __call__(self, message: Message) -> None:
        self.messages.append(message)
        if message["type"] == "websocket.close":
            await asyncio.Event().wait()
        raise ConnectionResetError("reset by peer")


async def carry_out(manager: SocketManager, message: Message) -> Plan:
    """Plan and carry out one message, without waiting for what runs beside delivery."""
    plan = await manager.dispatcher.plan(message)
    assert plan is not None
    await manager.dispatcher.carry_out(plan)
    return plan


async def until(predicate: Callable[[], bool]) -> None:
    """Wait, at most ``WAIT`` seconds, until ``predicate`` holds."""
    async with asyncio.timeout(WAIT):
        while True:
            if predicate():
                return
            await asyncio.sleep(0.01)


async def frames_of(socket: Socket, count: int) -> list[str]:
    """Wait (bounded) until the socket's send has been handed ``count`` frames."""
    await until(lambda: len(recorder(socket).frames) >= count)
    return recorder(socket).frames


@override_settings(REALTIME_SEND_TIMEOUT=60.0)
async def test_a_socket_whose_send_hangs_holds_no_other_socket_s_next_frames(
    manager: SocketManager,
) -> None:
    hanging = await open_socket(manager, ANN, 1, channels=["contact"], send=HangingSend())
    healthy = await open_socket(manager, BOB, 1, channels=["contact"])

    # Far within the send timeout: delivery never waits for the hanging send.
    async with asyncio.timeout(WAIT):
        first = await carry_out(manager, scope_event(1, "contact.created", channels=["contact"]))
        second = await carry_out(manager, scope_event(1, channels=["contact"]))
        assert await frames_of(healthy, 2) == [first.frame, second.frame]

    # The hanging socket got the first frame and holds the second, in order, until its
    # send completes or times out.
    assert recorder(hanging).frames == [first.frame]
    assert hanging in manager.index.sockets


@override_settings(REALTIME_SEND_TIMEOUT=60.0)
async def test_dropped_sockets_are_closed_beside_delivery(manager: SocketManager) -> None:
    silent = [
        await open_socket(manager, user, 1, channels=["contact"], send=CloseHangsSend())
        for user in (ANN, CAROL, 104)
    ]
    healthy = await open_socket(manager, BOB, 1, channels=["contact"])

    # Each close may take the send timeout (a minute here): none is waited for on the way.
    async with asyncio.timeout(WAIT):
        first = await carry_out(manager, scope_event(1, "contact.created", channels=["contact"]))
        await until(lambda: manager.index.sockets == {healthy})
        second = await carry_out(manager, scope_event(1, channels=["contact"]))
        assert await frames_of(healthy, 2) == [first.frame, second.frame]
        # Every close went out at once, beside the deliveries; none has completed.
        await until(lambda: all(recorder(socket).closes == [1011] for socket in silent))
    assert len(manager._beside_tasks) == 3


class BufferingProtocol(FakeAutobahnProtocol):
    """Daphne's protocol whose transport buffers what it is handed until ``flush``."""

    def take(self, message: Message) -> None:
        if message["type"] == "websocket.send":
            self.transport._tempDataLen += len(message["text"].encode())

    def flush(self) -> None:
        """The reactor wrote everything to the network: the client is reading."""
        self.transport._tempDataLen = 0


async def buffering_handle_reply(protocol_: BufferingProtocol, message: Message) -> None:
    protocol_.replies.append(message)
    protocol_.take(message)


@override_settings(REALTIME_SEND_TIMEOUT=0.2)
async def test_a_reader_of_frames_each_larger_than_the_stall_bound_is_not_dropped(
    manager: SocketManager,
) -> None:
    reader = BufferingProtocol()
    send = functools.partial(buffering_handle_reply, reader)
    socket = await open_socket(manager, ANN, 1, channels=["contact"], send=send)
    big = {"model": "contact", "id": 7, "b": "x" * (STALL_BYTES + 1)}

    # Each frame alone is over the bound right after it is handed over, and the next one
    # comes after the timeout; between the two the client read everything, and no
    # housekeeping round happened to look.
    for n in range(3):
        await deliver(manager, scope_event(1, data={**big, "n": n}, channels=["contact"]))
        reader.flush()
        await asyncio.sleep(0.25)

    assert socket in manager.index.sockets
    assert len(reader.frames) == 3
    assert reader.close_frames == []


async def test_observations_over_the_bound_are_one_run_however_far_apart_until_one_is_under(
    manager: SocketManager,
) -> None:
    stalled = FakeAutobahnProtocol()
    stalled.transport._tempDataLen = STALL_BYTES + 1
    socket = make_socket(Account(ANN), 1, send=daphne_send(stalled))

    assert not socket.stalled(5.0, now=100.0)  # the backlog is seen: a run starts
    # The next observation comes 8 s late (a loaded event loop held the watch back). Nothing
    # was added unobserved meanwhile, so the backlog can only have shrunk: it was over the
    # bound all along.
    assert socket.stalled(5.0, now=108.0)

    reader = FakeAutobahnProtocol()
    reader.transport._tempDataLen = STALL_BYTES + 1
    reading = make_socket(Account(BOB), 1, send=daphne_send(reader))
    assert not reading.stalled(5.0, now=200.0)
    reader.transport._tempDataLen = STALL_BYTES  # the client read some: the run ends
    assert not reading.stalled(5.0, now=201.0)
    reader.transport._tempDataLen = STALL_BYTES + 1
    assert not reading.stalled(5.0, now=202.0)  # a new run
    assert not reading.stalled(5.0, now=206.9)
    assert reading.stalled(5.0, now=207.0)


# event_delivered ----------------------------------------------------------------------------


class Deliveries:
    """An ``event_delivered`` receiver that records what it is told and lets a test wait."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self._arrived = asyncio.Event()

    async def receive(self, sender: Any, **kwargs: Any) -> None:
        self.calls.append({"sender": sender, **kwargs})
        self._arrived.set()

    async def wait_for(self, count: int) -> list[dict[str, Any]]:
        async with asyncio.timeout(WAIT):
            while len(self.calls) < count:
                self._arrived.clear()
                await self._arrived.wait()
        return self.calls


@pytest.fixture
def deliveries() -> Iterator[Deliveries]:
    receiver = Deliveries()
    signals.event_delivered.connect(receiver.receive, sender=SocketManager, weak=False)
    yield receiver
    signals.event_delivered.disconnect(receiver.receive, sender=SocketManager)


MARKER_DATA = {"model": "company", "id": 1}


async def deliver_marker(manager: SocketManager) -> None:
    """An event someone watches: its ``event_delivered`` follows those of earlier events."""
    await deliver(manager, scope_event(1, "company.updated", MARKER_DATA, channels=["company"]))


async def test_event_delivered_maps_each_watching_account_to_the_channels_it_heard(
    manager: SocketManager, deliveries: Deliveries
) -> None:
    await open_socket(manager, ANN, 1, channels=["contact:7"])
    await open_socket(manager, ANN, 1, channels=["company:3", "contact", "tag"])
    await open_socket(manager, BOB, 2, 1, channels=["contact"])
    await open_socket(manager, CAROL, 1, channels=["company"])
    data = {"model": "contact", "id": 7, "name": "Zed"}

    await deliver(
        manager,
        scope_event(1, "contact.updated", data, channels=["contact", "contact:7", "company:3"]),
    )

    assert await deliveries.wait_for(1) == [
        {
            "sender": SocketManager,
            "signal": signals.event_delivered,
            "event_type": "contact.updated",
            "data": data,
            "watchers": {ANN: ["company:3", "contact", "contact:7"], BOB: ["contact"]},
        }
    ]


async def test_event_delivered_is_not_sent_for_an_event_without_channels(
    manager: SocketManager, deliveries: Deliveries
) -> None:
    listening = await open_socket(manager, ANN, 1, channels=["contact", "company"])

    await deliver(manager, scope_event(1, channels=None))
    await deliver(manager, users_event([ANN], channels=None))
    await deliver_marker(manager)

    calls = await deliveries.wait_for(1)
    assert [call["event_type"] for call in calls] == ["company.updated"]
    assert len(recorder(listening).frames) == 3


async def test_event_delivered_is_not_sent_when_no_socket_watches_its_channels(
    manager: SocketManager, deliveries: Deliveries
) -> None:
    unsubscribed = await open_socket(manager, ANN, 1, channels=["company"])

    # An account event carrying channels nobody here subscribed to still reaches the account.
    await deliver(manager, users_event([ANN], "notification.created", channels=["notification"]))
    await deliver_marker(manager)

    calls = await deliveries.wait_for(1)
    assert [call["event_type"] for call in calls] == ["company.updated"]
    assert len(recorder(unsubscribed).frames) == 2


async def test_event_delivered_is_not_sent_when_no_receiver_listens(
    manager: SocketManager,
) -> None:
    assert not signals.event_delivered.has_listeners(SocketManager)
    watching = await open_socket(manager, ANN, 1, channels=["contact"])

    await deliver(manager, scope_event(1, channels=["contact"]))

    assert len(recorder(watching).frames) == 1
    assert manager.dispatcher._spawned == set()


# The transport's listener -------------------------------------------------------------------


class LogLines(logging.Handler):
    """Records what a logger says on the event loop, and lets a test wait for it."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[str, str]] = []
        self._arrived = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.name, record.getMessage()))
        self._arrived.set()

    async def wait_for(self, count: int) -> list[tuple[str, str]]:
        async with asyncio.timeout(WAIT):
            while len(self.lines) < count:
                self._arrived.clear()
                await self._arrived.wait()
        return self.lines


@pytest.fixture
def realtime_log() -> Iterator[LogLines]:
    handler = LogLines()
    logger = logging.getLogger("realtime")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


async def test_a_manager_holding_no_socket_drops_a_message_before_parsing_it(
    manager: SocketManager, realtime_log: LogLines
) -> None:
    manager.dispatcher.ensure_running()
    queue = manager.dispatcher._queue
    assert queue is not None

    manager.on_message("realtime", b"\xff{ not JSON")

    assert queue.qsize() == 0
    assert realtime_log.lines == []

    # The same bytes reach the parser once a socket is held, and are dropped there with a
    # warning: what the empty manager skipped is the queue, not just the log line.
    await open_socket(manager, ANN)
    manager.on_message("realtime", b"\xff{ not JSON")
    assert queue.qsize() == 1
    assert await realtime_log.wait_for(1) == [
        ("realtime.sockets.delivery", "realtime: dropped an unreadable message")
    ]


# Subscriptions and scopes ------------------------------------------------------------------


async def test_channels_of_models_nobody_declared_are_dropped_without_a_word(
    manager: SocketManager, realtime_log: LogLines
) -> None:
    socket = await open_socket(manager, ANN, 1)

    await manager.subscribe(
        socket, ["plain", "plain:1", "nope:contact", "contact:7", "", ":7", "company", "Contact"]
    )

    assert socket.channels == {"contact:7", "company"}
    assert realtime_log.lines == []
    await deliver(manager, scope_event(1, "plain.updated", channels=["plain", "plain:1"]))
    assert heard(socket) == [[]]


@override_settings(DEBUG=True)
async def test_with_debug_unknown_channels_past_the_log_budget_cost_no_search(
    manager: SocketManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    socket = await open_socket(manager, ANN, 1)
    monkeypatch.setattr(logs, "client_budget", logs.LogLimiter())  # this test's own budget
    searched: list[str] = []
    search = difflib.get_close_matches

    def counted(word: str, *args: Any, **kwargs: Any) -> list[str]:
        searched.append(word)
        return search(word, *args, **kwargs)

    monkeypatch.setattr(difflib, "get_close_matches", counted)

    await manager.subscribe(socket, ["x" * 10_000, *(f"nope{n}" for n in range(5_000))])

    # One search per line the budget lets through, each of a bounded name.
    assert len(searched) == logs.CLIENT_LINES_PER_MINUTE
    assert max(len(word) for word in searched) <= 100
    assert socket.channels == set()


@override_settings(REALTIME_MAX_CHANNELS=3)
async def test_a_subscribe_stops_at_the_first_new_channel_that_does_not_fit(
    manager: SocketManager,
) -> None:
    socket = await open_socket(manager, ANN, 1)

    await manager.subscribe(socket, ["contact", "nope", "company", "tag", "contact:1", "item"])

    assert socket.channels == {"contact", "company", "tag"}
    await manager.subscribe(socket, ["item", "contact"])
    assert socket.channels == {"contact", "company", "tag"}
    await deliver(manager, scope_event(1, "contact.updated", channels=["contact:1"]))
    await deliver(manager, scope_event(1, "item.updated", channels=["item"]))
    assert heard(socket) == [[]]


@override_settings(REALTIME_MAX_CHANNELS=3)
async def test_a_channel_named_twice_in_one_subscribe_takes_one_place(
    manager: SocketManager,
) -> None:
    socket = await open_socket(manager, ANN, 1)

    await manager.subscribe(socket, ["contact", "contact", "company", "tag"])

    assert socket.channels == {"contact", "company", "tag"}


@override_settings(REALTIME_MAX_CHANNELS=3)
async def test_channels_already_held_may_be_sent_again_at_the_limit(
    manager: SocketManager,
) -> None:
    socket = await open_socket(manager, ANN, 1, channels=["contact", "company", "tag"])

    await manager.subscribe(socket, ["tag", "contact", "company"])

    assert socket.channels == {"contact", "company", "tag"}
    for channel in ("contact", "company", "tag"):
        assert manager.index.by_scope_channel[(1, channel)] == {socket}
    await deliver(manager, scope_event(1, channels=["tag"]))
    assert len(recorder(socket).frames) == 1


async def test_unsubscribe_stops_what_those_channels_brought(manager: SocketManager) -> None:
    socket = await open_socket(manager, ANN, 2, 1, channels=["contact", "company"])

    manager.unsubscribe(socket, ["contact", "never-held", "tag"])

    assert socket.channels == {"company"}
    assert set(manager.index.by_scope_channel) == {(1, "company"), (2, "company")}
    await deliver(manager, scope_event(1, channels=["contact"]))
    await deliver(manager, scope_event(2, channels=["contact", "contact:7"]))
    assert heard(socket) == [[]]
    await deliver(manager, scope_event(2, "company.updated", channels=["company"]))
    assert len(recorder(socket).frames) == 1


async def test_subscriptions_apply_to_every_scope_the_socket_reads(
    manager: SocketManager,
) -> None:
    socket = await open_socket(manager, ANN, 1, 2, channels=["contact"])

    await deliver(manager, scope_event(1, channels=["contact"]))
    await deliver(manager, scope_event(2, channels=["contact"]))

    assert [json.loads(frame)["scope_id"] for frame in recorder(socket).frames] == [1, 2]


async def test_a_watch_that_changes_the_scopes_drops_every_subscription(
    manager: SocketManager,
) -> None:
    socket = await open_socket(manager, ANN, 1, 2, channels=["contact", "company"])
    neighbour = await open_socket(manager, BOB, 1, channels=["contact"])

    await manager.set_scopes(
        socket, [Scope(2, "scope-2"), Scope(3, "scope-3")], keep_channels=False
    )

    assert socket.scopes == {2: "scope-2", 3: "scope-3"}
    assert socket.channels == set()
    assert manager.index.by_scope_channel == {(1, "contact"): {neighbour}}
    assert manager.index.by_scope == {1: {neighbour}, 2: {socket}, 3: {socket}}
    for scope_id in (1, 2, 3):
        await deliver(manager, scope_event(scope_id, channels=["contact"]))
    assert heard(socket, neighbour) == [
        [],
        ['{"type":"contact.updated","data":{"model":"contact","id":7},"scope_id":1}'],
    ]
    await deliver(manager, scope_event(3, channels=None))
    assert len(recorder(socket).frames) == 1


async def test_a_message_planned_before_a_recheck_took_its_scope_is_not_sent_after_it(
    manager: SocketManager,
) -> None:
    """Messages are planned ahead of the one being sent: a recheck that takes a scope away
    in between leaves the socket out of the frame (and of the live change) at sending."""
    socket = await open_socket(manager, ANN, 1, 2, channels=["contact"])
    neighbour = await open_socket(manager, BOB, 1, channels=["contact"])
    plan = await manager.dispatcher.plan(scope_event(1, channels=["contact"]))
    assert plan is not None
    assert plan.targets == {socket, neighbour}

    await manager.set_scopes(socket, [Scope(2, "scope-2")], keep_channels=True)
    await manager.dispatcher.carry_out(plan)
    await settle(manager)

    assert heard(socket) == [[]]
    assert len(recorder(neighbour).frames) == 1


async def test_a_watch_naming_the_scopes_already_read_keeps_the_subscriptions(
    manager: SocketManager,
) -> None:
    socket = await open_socket(manager, ANN, 1, 2, channels=["contact"])

    await manager.set_scopes(
        socket, [Scope(2, "renamed"), Scope(1, "scope-1")], keep_channels=False
    )

    assert socket.channels == {"contact"}
    assert set(manager.index.by_scope_channel) == {(1, "contact"), (2, "contact")}
    await deliver(manager, scope_event(2, channels=["contact"]))
    assert len(recorder(socket).frames) == 1


async def test_a_recheck_that_loses_a_scope_removes_only_that_scopes_entries(
    manager: SocketManager,
) -> None:
    socket = await open_socket(manager, ANN, 1, 2, channels=["contact", "company"])

    await manager.set_scopes(socket, [Scope(1, "scope-1")], keep_channels=True)

    assert socket.channels == {"contact", "company"}
    assert set(manager.index.by_scope_channel) == {(1, "contact"), (1, "company")}
    assert set(manager.index.by_scope) == {1}
    assert await deliver(manager, scope_event(2, channels=None)) is None
    await deliver(manager, scope_event(1, channels=["contact"]))
    assert len(recorder(socket).frames) == 1

    # A scope regained on a later recheck comes back with the socket's subscriptions.
    await manager.set_scopes(socket, [Scope(1, "scope-1"), Scope(2, "scope-2")], keep_channels=True)

    assert set(manager.index.by_scope_channel) == {
        (1, "contact"),
        (1, "company"),
        (2, "contact"),
        (2, "company"),
    }
    await deliver(manager, scope_event(2, "company.updated", channels=["company"]))
    assert len(recorder(socket).frames) == 2


async def test_a_heartbeat_cursor_is_never_behind_the_last_frame_s_once_delivery_lost_a_message(
    manager: SocketManager,
) -> None:
    socket = await open_socket(manager, 1, 7)
    socket.resumable = True
    socket.floor = Vector({GLOBAL: ("", 5)})
    await manager.dispatcher.send_all([socket], '{"type":"x","data":null}', global_position(50))
    await settle(manager)
    manager.dispatcher.trusted = False  # a delivery failed somewhere in this worker

    answer = cursor_answer(socket, manager.dispatcher)

    assert answer is not None
    assert position_of(1, json.loads(answer)["cursor"]) == 50


async def test_a_live_frame_held_through_a_resume_older_than_a_version_replayed_is_dropped() -> (
    None
):
    # Planned live while the socket resumed, before the replay's memory joined the worker's:
    # v4 of a row, held, is older than the v5 the replay gave; v6 is not.
    manager = SocketManager()
    socket = make_socket(Account(1), 7)

    def told(points: int) -> dict[str, Any]:
        data = {"id": 3, "points": points}
        meta = {"order": ["default:outbox", points]}
        return {"target": "scope", "event_type": "job.updated", "data": data, "meta": meta}

    for points in (4, 6):
        frame = json.dumps({"type": "job.updated", "data": told(points)["data"]})
        await manager.dispatcher.send_all([socket], frame, None, 7, None, told(points))
    socket.replayed = RecordOrder()
    assert not socket.replayed.superseded(told(5))
    sent = recorder(socket)

    await manager.go_live(socket)
    await settle(manager)

    assert [json.loads(text)["data"]["points"] for text in sent.frames] == [6]


async def test_a_frame_held_through_a_resume_goes_out_with_a_cursor_not_behind_the_replay(
    make_redis_transport: Callable[..., Any],
) -> None:
    # Redis: a stream per channel. A frame of the socket's scope is held while it resumes;
    # meanwhile the resume read its account's stream further than this worker had carried.
    manager = SocketManager()
    manager._transport = make_redis_transport()
    epoch = "AbCdEfGhIjKl"
    scope, base = scope_channel(7), base_channel()
    socket = make_socket(Account(1), 7)
    socket.resumable = True
    manager.dispatcher.carried = Vector({base: (epoch, 5), scope: (epoch, 1)})
    await manager.dispatcher.send_all(
        [socket], '{"type":"x","data":null}', StreamPos(scope, epoch, 2)
    )
    socket.floor = Vector({base: (epoch, 9), scope: (epoch, 1)})  # where the resume read to
    sent = recorder(socket)

    await manager.go_live(socket)
    await settle(manager)

    (text,) = sent.frames
    cursor = json.loads(text)["cursor"]
    assert read_cursor(1, cursor, [base, scope]) == Vector(
        {base: (epoch[:6], 9), scope: (epoch[:6], 2)}
    )
