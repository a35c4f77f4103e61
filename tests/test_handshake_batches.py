"""Handshakes that arrive together share their statements, and each still gets its own answer.

``Batcher`` is tested on its own with plain coroutines; the manager's handshakes ask the real
auth service on the real test database; the end-to-end test opens real sockets on a real
daphne server, all at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from realtime import auth as auth_module
from realtime.auth import RealtimeAuth, Scope, issue_token
from realtime.sockets.batcher import Batcher
from realtime.sockets.manager import SocketManager
from realtime.sockets.protocol import read_scopes
from tests.helpers import WAIT, off_loop
from tests.live import Clients, LiveServers
from tests.testapp.models import Membership, Workspace

User = get_user_model()


class Answers:
    """``answer_all`` for a ``Batcher``: records each batch; answers ``n -> n * 10``, an
    exception for a negative question; can be held until released."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.release.set()

    async def __call__(self, questions: list[int]) -> list[Any]:
        self.batches.append(list(questions))
        self.started.set()
        await self.release.wait()
        if 0 in questions:
            raise RuntimeError("the whole batch failed")
        return [ValueError(q) if q < 0 else q * 10 for q in questions]


async def test_questions_asked_together_are_answered_in_one_batch() -> None:
    answers = Answers()
    batcher: Batcher[int] = Batcher(answers, size=200, lanes=2)
    got = await asyncio.gather(*(batcher.ask(n) for n in range(1, 51)))
    assert got == [n * 10 for n in range(1, 51)]
    assert answers.batches == [list(range(1, 51))]


async def test_a_lone_question_is_answered_in_a_batch_of_its_own() -> None:
    answers = Answers()
    batcher: Batcher[int] = Batcher(answers, size=200, lanes=2)
    assert await batcher.ask(4) == 40
    assert await batcher.ask(5) == 50
    assert answers.batches == [[4], [5]]


async def test_questions_asked_while_every_lane_is_busy_go_together_in_the_next_batch() -> None:
    answers = Answers()
    answers.release.clear()
    batcher: Batcher[int] = Batcher(answers, size=3, lanes=1)
    first = asyncio.ensure_future(batcher.ask(1))
    await asyncio.wait_for(answers.started.wait(), WAIT)
    later = [asyncio.ensure_future(batcher.ask(n)) for n in range(2, 7)]
    await asyncio.sleep(0)
    answers.release.set()
    assert await asyncio.wait_for(asyncio.gather(first, *later), WAIT) == [10, 20, 30, 40, 50, 60]
    assert answers.batches == [[1], [2, 3, 4], [5, 6]]


async def test_a_failed_answer_reaches_its_asker_alone_and_a_failed_batch_only_its_own() -> None:
    answers = Answers()
    batcher: Batcher[int] = Batcher(answers, size=200, lanes=1)
    got = await asyncio.gather(batcher.ask(1), batcher.ask(-2), return_exceptions=True)
    assert got[0] == 10
    assert isinstance(got[1], ValueError)
    failed = await asyncio.gather(batcher.ask(0), batcher.ask(3), return_exceptions=True)
    assert [type(answer) for answer in failed] == [RuntimeError, RuntimeError]
    assert await batcher.ask(4) == 40


async def test_an_asker_that_gave_up_leaves_the_others_their_answers() -> None:
    answers = Answers()
    answers.release.clear()
    batcher: Batcher[int] = Batcher(answers, size=200, lanes=1)
    gone = asyncio.ensure_future(batcher.ask(1))
    kept = asyncio.ensure_future(batcher.ask(2))
    await asyncio.wait_for(answers.started.wait(), WAIT)
    gone.cancel()
    answers.release.set()
    assert await asyncio.wait_for(kept, WAIT) == 20
    assert gone.cancelled()


# The manager's handshakes ------------------------------------------------------------------


class CountingAuth(RealtimeAuth):
    """The default auth service, counting the bulk asks (from realtime's threads)."""

    def __init__(self) -> None:
        self.bearer_batches: list[int] = []

    def users_of_tokens(self, tokens: Sequence[str]) -> list[Any | None]:
        self.bearer_batches.append(len(tokens))
        return super().users_of_tokens(tokens)


def make_members(count: int) -> tuple[Workspace, list[Any]]:
    workspace = Workspace.objects.create(name="Acme", slug="acme")
    users = [User.objects.create(username=f"hs{index}") for index in range(count)]
    Membership.objects.bulk_create([Membership(workspace=workspace, user=u) for u in users])
    return workspace, users


@pytest.mark.django_db(transaction=True)
async def test_handshakes_resolved_at_the_same_time_share_one_bulk_ask(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    service = CountingAuth()
    monkeypatch.setattr(auth_module, "_auth", service)
    workspace, users = await off_loop(make_members, 40)
    manager = SocketManager()
    ask = read_scopes({"scope": "acme"})
    answers = await asyncio.gather(
        *(manager.handshakes.ask((issue_token(user), ask)) for user in users),
        manager.handshakes.ask(("not a token", ask)),
    )
    assert [(getattr(user, "pk", None), scopes) for user, scopes in answers] == [
        (user.pk, [Scope(workspace.pk, "acme")]) for user in users
    ] + [(None, [])]
    assert service.bearer_batches == [41]


# End to end ---------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_sockets_authenticating_at_once_each_get_their_own_account_and_scope(
    live_servers: LiveServers, ws: Clients
) -> None:
    workspace, users = await off_loop(make_members, 30)
    server = live_servers.get()
    clients = await asyncio.gather(*(ws.connect(server) for _ in users))
    answers = await asyncio.gather(
        *(
            client.authenticate(issue_token(user), scope=workspace.slug)
            for client, user in zip(clients, users, strict=True)
        ),
        (await ws.connect(server)).authenticate("not a token", scope=workspace.slug),
    )
    assert answers == [
        {"type": "auth_success", "data": {"user_id": u.pk, "scope": "acme", "scopes": ["acme"]}}
        for u in users
    ] + [{"type": "auth_error", "data": {"message": "Invalid authentication token"}}]
