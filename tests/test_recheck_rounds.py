"""Recheck rounds: spread over the interval, in small batches, behind delivery.

The manager and its sockets are those of ``test_manager`` (real ``Socket`` objects whose ASGI
``send`` is a fake, a real table transport to follow scopes on); the auth service is a
``RealtimeAuth`` of the test's own that answers from memory, records what it is asked, and can
be held mid-answer (on a real thread of realtime's pools) to show what waits for what.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import pytest
from django.test import override_settings

from realtime import auth as auth_module
from realtime.auth import RealtimeAuth, Scope, ScopeQuestion
from realtime.conf import conf
from realtime.sockets import manager as manager_module
from realtime.sockets import protocol
from realtime.sockets.connection import Socket
from realtime.sockets.link import Link
from realtime.sockets.manager import SocketManager
from realtime.writes.packing import recheck_messages
from tests.helpers import WAIT
from tests.test_manager import Account, FakeSend, MakeTransport, Message, scope_event

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE = 1


class Gate:
    """While ``closed`` is set, holds each thread that reaches it until ``opened`` is set;
    ``entered`` tells that one is waiting."""

    def __init__(self) -> None:
        self.closed = threading.Event()
        self.opened = threading.Event()
        self.entered = threading.Event()

    def go_through(self) -> None:
        if self.closed.is_set():
            self.entered.set()
            assert self.opened.wait(WAIT)

    async def reached(self) -> None:
        assert await asyncio.to_thread(self.entered.wait, WAIT)


class MemoryAuth(RealtimeAuth):
    """Bearers ``t<pk>`` stand for account ``pk``, which still reads every scope it held.

    ``calls`` lists what was asked, in order ("bearers", "scopes", "audience": the last once
    it answers); the bearer check of a round waits at the gate ``rounds``, the audience check
    at the gate ``audience``.
    """

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.batches: list[int] = []
        self.rounds = Gate()
        self.audience_gate = Gate()

    def user_of_token(self, token: str) -> Any | None:
        self.calls.append("bearers")
        self.rounds.go_through()
        return Account(int(token[1:]))

    def users_of_tokens(self, tokens: Sequence[str]) -> list[Any | None]:
        self.calls.append("bearers")
        self.batches.append(len(tokens))
        self.rounds.go_through()
        return [Account(int(token[1:])) for token in tokens]

    def scopes_of_many(self, questions: Sequence[ScopeQuestion]) -> list[list[Scope]]:
        self.calls.append("scopes")
        return [[Scope(i, f"scope-{i}") for i in q.held_ids] for q in questions]

    def held_scopes(self, user: Any, ids: Any) -> list[Scope]:
        return [Scope(i, f"scope-{i}") for i in ids]

    def audience(self, scope_id: Any, event_type: str, data: Any, user_ids: Any, about: Any) -> Any:
        self.audience_gate.go_through()
        self.calls.append("audience")
        return user_ids


@pytest.fixture
def auth(monkeypatch: pytest.MonkeyPatch) -> Iterator[MemoryAuth]:
    service = MemoryAuth()
    monkeypatch.setattr(auth_module, "_auth", service)
    yield service
    service.rounds.opened.set()
    service.audience_gate.opened.set()


@pytest.fixture
async def manager(make_table_transport: MakeTransport) -> AsyncIterator[SocketManager]:
    """A manager following scopes on a real table transport; its tasks cancelled after."""
    built = SocketManager()
    built._transport = make_table_transport()
    yield built
    tasks = [*built.dispatcher._tasks, *built.dispatcher._spawned, *built._beside_tasks]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class TellingSend(FakeSend):
    """A fake ``send`` that records what it is handed and tells those waiting for it."""

    def __init__(self) -> None:
        super().__init__()
        self.arrived = asyncio.Event()

    async def __call__(self, message: Message) -> None:
        await super().__call__(message)
        self.arrived.set()


async def open_sockets(manager: SocketManager, count: int) -> list[Socket]:
    """Register ``count`` sockets of accounts 1..count reading ``SCOPE``, subscribed to it."""
    sockets = []
    for pk in range(1, count + 1):
        socket = Socket(
            consumer=None,
            send=TellingSend(),
            user=Account(pk),
            token=f"t{pk}",
            ask=protocol.read_scopes({}),
            scopes={SCOPE: f"scope-{SCOPE}"},
        )
        await manager.register(socket, ["contact"])
        await manager.go_live(socket)
        sockets.append(socket)
    return sockets


def publish(manager: SocketManager, number: int) -> None:
    """Hand the manager a scope event as its transport would."""
    message = scope_event(SCOPE, data={"model": "contact", "id": number}, channels=["contact"])
    manager.on_message(f"scope-{SCOPE}", json.dumps(message).encode())


async def heard(socket: Socket, number: int) -> None:
    """Wait (bounded) until ``socket`` has the frame of event ``number``."""
    send = socket._send
    assert isinstance(send, TellingSend)
    async with asyncio.timeout(WAIT):
        while not any(json.loads(f)["data"]["id"] == number for f in send.frames):
            send.arrived.clear()
            await send.arrived.wait()


async def round_held_at_its_first_step(
    manager: SocketManager, auth: MemoryAuth
) -> tuple[list[Socket], asyncio.Task[None]]:
    """Start a periodic round over three sockets, held in its first step (the bearers)."""
    sockets = await open_sockets(manager, 3)
    manager.dispatcher.ensure_running()
    auth.rounds.closed.set()
    for socket in sockets:
        socket.next_recheck = 0.0  # due long ago
    round_ = asyncio.get_running_loop().create_task(manager.recheck_due())
    await auth.rounds.reached()
    return sockets, round_


@override_settings(REALTIME_RECHECK_INTERVAL=60.0)
async def test_sockets_registered_together_come_due_spread_over_the_interval_s_second_half(
    manager: SocketManager, auth: MemoryAuth
) -> None:
    start = time.monotonic()
    sockets = await open_sockets(manager, 200)
    end = time.monotonic()
    due = [socket.next_recheck for socket in sockets]
    assert all(start + 30.0 <= at <= end + 60.0 for at in due)
    assert len(set(due)) == 200
    assert max(due) - min(due) > 15.0  # 200 draws over 30 s all within 15 s: never seen


@override_settings(REALTIME_RECHECK_INTERVAL=60.0)
async def test_a_rechecked_socket_comes_due_again_within_one_interval(
    manager: SocketManager, auth: MemoryAuth
) -> None:
    sockets = await open_sockets(manager, 50)
    manager.request_recheck([socket.user_id for socket in sockets])
    before = time.monotonic()
    await manager.recheck_due()
    after = time.monotonic()
    assert all(before + 54.0 <= s.next_recheck <= after + 60.0 for s in sockets)


async def test_periodic_rechecks_wait_to_fill_a_batch_for_a_tenth_of_the_interval_at_most(
    manager: SocketManager, auth: MemoryAuth
) -> None:
    gather = conf.RECHECK_INTERVAL * manager_module.RECHECK_GATHER
    sockets = await open_sockets(manager, 250)
    now = time.monotonic()
    few, many = sockets[:50], sockets[50:]
    for socket in sockets:
        socket.next_recheck = now + 3600.0
    for socket in few:
        socket.next_recheck = now - gather / 2  # due, but not for long enough
    await manager.recheck_due()
    assert auth.batches == []
    few[0].next_recheck = now - gather - 1.0  # the first of them has now waited long enough
    await manager.recheck_due()
    assert auth.batches == [50]
    for socket in many:
        socket.next_recheck = now - 1.0  # due just now, but enough to fill a batch
    await manager.recheck_due()
    assert auth.batches == [50, 200]


async def test_a_round_over_1000_sockets_asks_the_bulk_hooks_in_batches_of_200(
    manager: SocketManager, auth: MemoryAuth
) -> None:
    sockets = await open_sockets(manager, 1000)
    manager.request_recheck([socket.user_id for socket in sockets])
    await manager.recheck_due()
    assert auth.batches == [200] * 5
    assert all(socket.scopes == {SCOPE: f"scope-{SCOPE}"} for socket in sockets)
    assert len(manager.index.by_scope_channel[(SCOPE, "contact")]) == 1000


async def test_a_recheck_round_waits_for_the_message_being_delivered(
    manager: SocketManager, auth: MemoryAuth
) -> None:
    (socket,) = await open_sockets(manager, 1)
    manager.dispatcher.ensure_running()
    auth.audience_gate.closed.set()
    publish(manager, 1)
    await auth.audience_gate.reached()
    manager.request_recheck([socket.user_id])
    round_ = asyncio.get_running_loop().create_task(manager.recheck_due())
    # Time for a round that does not wait to run to its end; one that waits is still waiting.
    await asyncio.wait({round_}, timeout=0.5)
    auth.audience_gate.opened.set()
    await heard(socket, 1)
    await asyncio.wait_for(round_, WAIT)
    assert auth.calls == ["audience", "bearers", "scopes"]


async def test_an_event_published_during_a_recheck_round_is_delivered_before_the_round_ends(
    manager: SocketManager, auth: MemoryAuth
) -> None:
    # A periodic round. (A *requested* recheck holds its sockets' frames until it answers, by
    # design: see test_revocation.py.)
    sockets, round_ = await round_held_at_its_first_step(manager, auth)
    publish(manager, 2)
    for socket in sockets:
        await heard(socket, 2)
    assert not round_.done()
    auth.rounds.opened.set()
    await asyncio.wait_for(round_, WAIT)
    assert auth.calls == ["bearers", "audience", "scopes"]


async def test_a_round_goes_on_with_its_next_step_only_once_delivery_is_done(
    manager: SocketManager, auth: MemoryAuth
) -> None:
    sockets, round_ = await round_held_at_its_first_step(manager, auth)
    auth.audience_gate.closed.set()
    publish(manager, 4)
    await auth.audience_gate.reached()  # a message is being delivered
    auth.rounds.opened.set()
    # Time for a batch that does not wait to run to its end; one that waits is still waiting.
    await asyncio.wait({round_}, timeout=0.5)
    assert auth.calls == ["bearers"]
    auth.audience_gate.opened.set()
    for socket in sockets:
        await heard(socket, 4)
    await asyncio.wait_for(round_, WAIT)
    assert auth.calls == ["bearers", "audience", "scopes"]


async def test_a_requested_recheck_does_not_wait_for_delivery_between_its_steps(
    manager: SocketManager, auth: MemoryAuth, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(manager_module, "BEHIND_DELIVERY", 10 * WAIT)  # no wait would end
    (socket,) = await open_sockets(manager, 1)
    manager.dispatcher.ensure_running()
    auth.rounds.closed.set()
    manager.request_recheck([socket.user_id])  # holds the socket's frames until it answers
    round_ = asyncio.get_running_loop().create_task(manager.recheck_due())
    await auth.rounds.reached()
    auth.audience_gate.closed.set()
    publish(manager, 5)
    await auth.audience_gate.reached()
    auth.rounds.opened.set()
    await asyncio.wait_for(round_, WAIT)
    assert auth.calls == ["bearers", "scopes"]
    auth.audience_gate.opened.set()
    await heard(socket, 5)


@pytest.mark.parametrize("requested", [True, False], ids=["requested", "periodic"])
async def test_a_round_goes_anyway_after_a_bounded_wait_for_a_gap_in_delivery(
    manager: SocketManager, auth: MemoryAuth, monkeypatch: pytest.MonkeyPatch, requested: bool
) -> None:
    monkeypatch.setattr(manager_module, "BEHIND_DELIVERY", 0.05)
    (socket,) = await open_sockets(manager, 1)
    manager.dispatcher.ensure_running()
    auth.audience_gate.closed.set()
    publish(manager, 3)
    await auth.audience_gate.reached()
    if requested:
        manager.request_recheck([socket.user_id])
    else:
        socket.next_recheck = 0.0
    await asyncio.wait_for(manager.recheck_due(), WAIT)
    assert auth.calls == ["bearers", "scopes"]
    auth.audience_gate.opened.set()
    await heard(socket, 3)


async def test_a_recheck_asked_during_a_round_is_not_answered_by_that_round(
    manager: SocketManager, auth: MemoryAuth
) -> None:
    """A round under way may have read the memberships before the write that asks for a
    recheck committed: its answer does not release the frames held since; the next round's
    does."""
    sockets, round_ = await round_held_at_its_first_step(manager, auth)
    asked = sockets[0]
    manager.request_recheck([asked.user_id])  # the write that asks committed meanwhile
    publish(manager, 1)
    await heard(sockets[1], 1)
    auth.rounds.opened.set()
    await asyncio.wait_for(round_, WAIT)

    assert asked.held is not None
    assert [json.loads(frame)["data"]["id"] for frame in asked._send.frames] == []  # type: ignore[attr-defined]
    auth.rounds.closed.clear()
    await asyncio.wait_for(manager.recheck_due(), WAIT)
    await heard(asked, 1)


class FailingScopes(MemoryAuth):
    """The scopes hook raises until ``works`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.works = False

    def scopes_of_many(self, questions: Sequence[ScopeQuestion]) -> list[list[Scope]]:
        if not self.works:
            raise RuntimeError("the memberships cannot be read")
        return super().scopes_of_many(questions)


async def test_a_requested_recheck_whose_hooks_fail_keeps_the_frames_held_until_one_answers(
    manager: SocketManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Errors inside a recheck are retried next round; a socket whose recheck was asked for
    (a membership removed, say) does not get the frames held meanwhile on the strength of a
    failure: they wait for an answer."""
    failing = FailingScopes()
    monkeypatch.setattr(auth_module, "_auth", failing)
    socket, beside = await open_sockets(manager, 2)
    manager.dispatcher.ensure_running()
    manager.request_recheck([socket.user_id])
    publish(manager, 1)
    await heard(beside, 1)  # carried: held for the socket rechecked
    await asyncio.wait_for(manager.recheck_due(), WAIT)

    assert socket.held is not None
    assert socket._send.frames == []  # type: ignore[attr-defined]
    failing.works = True
    await asyncio.wait_for(manager.recheck_due(), WAIT)
    await heard(socket, 1)


async def test_a_recheck_asked_while_a_handshake_read_the_account_holds_the_socket_s_frames(
    manager: SocketManager, auth: MemoryAuth
) -> None:
    """A recheck asked for an account whose socket is still in its handshake (its account
    and memberships read, the socket not registered yet) is owed to that socket: its frames
    stay held until a recheck answers, as for a socket asked about while live."""
    (beside,) = await open_sockets(manager, 1)
    manager.dispatcher.ensure_running()
    socket = Socket(
        consumer=None,
        send=TellingSend(),
        user=Account(7),
        token="t7",
        ask=protocol.read_scopes({}),
        scopes={SCOPE: f"scope-{SCOPE}"},
        read_from=time.monotonic(),  # its handshake reads the account now...
    )
    manager.request_recheck([socket.user_id])  # ...a membership of it is removed...
    await manager.register(socket, ["contact"])  # ...and it registers with what it read
    await manager.go_live(socket)
    publish(manager, 1)
    await heard(beside, 1)

    assert socket.held is not None
    assert socket._send.frames == []  # type: ignore[attr-defined]
    await asyncio.wait_for(manager.recheck_due(), WAIT)
    await heard(socket, 1)


@pytest.mark.parametrize("others", [0, 1], ids=["first-socket-here", "beside-others"])
async def test_a_recheck_message_for_an_account_with_no_socket_here_yet_is_owed_to_its_handshake(
    manager: SocketManager, auth: MemoryAuth, others: int
) -> None:
    """The request as the transport hands it: a worker holding no socket of the account yet
    (its first socket still in its handshake), and maybe none at all, still remembers the
    recheck, so the socket registering with what its handshake read holds its frames until
    a recheck answers (a membership removed meanwhile never lets a frame of that scope out)."""
    await open_sockets(manager, others)
    manager.dispatcher.ensure_running()
    socket = Socket(
        consumer=None,
        send=TellingSend(),
        user=Account(7),
        token="t7",
        ask=protocol.read_scopes({}),
        scopes={SCOPE: f"scope-{SCOPE}"},
        read_from=time.monotonic(),  # its handshake reads the account now...
    )
    for channel, payload in recheck_messages([socket.user_id], None):
        manager.on_message(channel, payload)  # ...a membership of it is removed...
    await asyncio.wait_for(manager.dispatcher.quiet(), WAIT)  # (the request is carried out)
    await manager.register(socket, ["contact"])  # ...and it registers with what it read
    await manager.go_live(socket)
    publish(manager, 1)
    await asyncio.wait_for(manager.dispatcher.quiet(), WAIT)

    assert socket.held is not None
    assert socket._send.frames == []  # type: ignore[attr-defined]
    await asyncio.wait_for(manager.recheck_due(), WAIT)
    await heard(socket, 1)


class LosingAuth(MemoryAuth):
    """``MemoryAuth`` whose accounts no longer read the scopes in ``lost``."""

    def __init__(self) -> None:
        super().__init__()
        self.lost: set[int] = set()

    def scopes_of_many(self, questions: Sequence[ScopeQuestion]) -> list[list[Scope]]:
        kept = super().scopes_of_many(questions)
        return [[scope for scope in scopes if scope.id not in self.lost] for scopes in kept]


class GatedSend(TellingSend):
    """The ``send`` of a server that writes in place (``Link.buffered``: realtime awaits each
    frame): while ``closed``, each send waits for ``opened``; ``entered`` tells that one is
    waiting."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = False
        self.entered = asyncio.Event()
        self.opened = asyncio.Event()

    async def __call__(self, message: Message) -> None:
        if self.closed:
            self.entered.set()
            await asyncio.wait_for(self.opened.wait(), WAIT)
        await super().__call__(message)


def publish_in(manager: SocketManager, scope_id: int, number: int) -> None:
    """Hand the manager an event of scope ``scope_id`` as its transport would."""
    message = scope_event(scope_id, data={"model": "contact", "id": number}, channels=["contact"])
    manager.on_message(f"scope-{scope_id}", json.dumps(message).encode())


async def test_a_recheck_asked_while_held_frames_go_out_holds_the_frames_after_it_until_it_answers(
    manager: SocketManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recheck asked while a socket's held frames (its handshake's, its resume's backlog)
    are going out stops them there: a frame published after the request, of a scope the
    recheck then finds the account lost, never reaches the socket."""
    auth = LosingAuth()
    monkeypatch.setattr(auth_module, "_auth", auth)
    manager.dispatcher.ensure_running()
    send = GatedSend()
    socket = Socket(
        consumer=None,
        send=send,
        user=Account(7),
        token="t7",
        ask=protocol.read_scopes({}),
        scopes={1: "scope-1", 2: "scope-2"},
        link=Link(buffered=True),
    )
    await manager.register(socket, ["contact"])
    publish_in(manager, 1, 1)  # held: its handshake is not over
    await asyncio.wait_for(manager.dispatcher.quiet(), WAIT)
    send.closed = True
    going_live = asyncio.get_running_loop().create_task(manager.go_live(socket))
    await asyncio.wait_for(send.entered.wait(), WAIT)  # frame 1 is going out...
    auth.lost.add(1)  # ...a membership of scope 1 is removed...
    manager.request_recheck([socket.user_id])
    publish_in(manager, 1, 2)  # ...and scope 1 says something more
    await asyncio.wait_for(manager.dispatcher.quiet(), WAIT)
    send.opened.set()
    await asyncio.wait_for(going_live, WAIT)

    assert socket.held is not None
    await asyncio.wait_for(manager.recheck_due(), WAIT)
    assert list(socket.scopes) == [2]
    publish_in(manager, 2, 3)  # a marker, in the scope it still reads
    await heard(socket, 3)
    assert [json.loads(frame)["data"]["id"] for frame in send.frames] == [1, 3]
