"""``realtime.broadcast``: the exact messages each call publishes through the table transport,
when they are published (after commit, at once, from async code), and what a failure costs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connection, connections, transaction
from django.http import HttpRequest, HttpResponse
from django.test import AsyncClient, override_settings
from django.urls import path
from pytest_django import DjangoCaptureOnCommitCallbacks

from realtime.broadcast import (
    broadcast_to_scope,
    broadcast_to_user,
    broadcast_to_users,
    recheck_users,
)
from realtime.encoding import encode
from realtime.writes import from_async
from tests.helpers import (
    ROOT,
    WAIT,
    events,
    forget_messages,
    off_loop,
    published,
    subprocess_env,
    without_mid,
)
from tests.testapp.models import Contact, VipContact, Workspace

TABLE = "firm_channel_messages"
DATA = {"model": "contact", "id": 7, "name": "Zoë", "notes": "n" * 300}
META = {"origin": "tab-1", "changed": ["name", "notes"]}


@pytest.fixture(autouse=True)
def no_background_trims() -> Iterator[None]:
    """Keep the transport's trimming thread (and its own connection) out of these tests."""
    with override_settings(REALTIME_AUTO_TRIM=False):
        yield


def scope_event(scope_id: Any, event_type: str, data: Any, **extra: Any) -> dict[str, Any]:
    return {
        "target": "scope",
        "scope_id": scope_id,
        "event_type": event_type,
        "data": data,
        "channels": None,
        "meta": {},
        **extra,
    }


def rename_table(old: str, new: str) -> None:
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {quote(old)} RENAME TO {quote(new)}")


def wait_for_rows(count: int, timeout: float = WAIT) -> list[tuple[str, dict[str, Any]]]:
    """Poll the table (in this thread) until ``count`` rows are there, at most ``timeout`` s."""
    deadline = time.monotonic() + timeout
    try:
        while True:
            rows = published()
            if len(rows) >= count or time.monotonic() > deadline:
                return rows
            time.sleep(0.01)
    finally:
        connections.close_all()


# broadcast_to_scope ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_scope_broadcast_publishes_the_exact_message_on_the_scope_channel(
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        broadcast_to_scope(7, "deal.won", {"amount": 5, "who": "Zoë"}, meta={"origin": "tab-1"})
        assert published() == []
    assert [channel for channel, _ in published()] == ["realtime_7"]
    assert events() == [
        scope_event(7, "deal.won", {"amount": 5, "who": "Zoë"}, meta={"origin": "tab-1"})
    ]


@pytest.mark.django_db
def test_scope_broadcast_carries_channels_exclude_about_and_only(
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        broadcast_to_scope(
            7,
            "deal.won",
            None,
            channels=["deal", "deal:3"],
            exclude_user_ids=[9, 4, 9],
            about=(Contact, 3),
            audience=[8, 2, 8],
        )
    assert events() == [
        scope_event(
            7,
            "deal.won",
            None,
            channels=["deal", "deal:3"],
            exclude=[4, 9],
            about={"model": "contact", "id": 3},
            only=[2, 8],
        )
    ]


@pytest.mark.django_db
@pytest.mark.parametrize("model", [Contact, VipContact, "contact"], ids=["model", "proxy", "name"])
def test_scope_broadcast_about_a_model_or_a_name_names_it_by_wire_name(
    model: type[Contact] | str,
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        broadcast_to_scope(7, "contact.flagged", None, about=(model, 7))
    assert events() == [
        scope_event(7, "contact.flagged", None, about={"model": "contact", "id": 7})
    ]


@pytest.mark.django_db
def test_scope_broadcast_to_an_empty_audience_publishes_nothing(
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        broadcast_to_scope(7, "deal.won", None, audience=[])
        broadcast_to_scope(7, "marker", None)
    assert len(callbacks) == 1
    assert events() == [scope_event(7, "marker", None)]


@pytest.mark.django_db
def test_scope_broadcast_to_450_accounts_is_sliced_in_200s(
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        broadcast_to_scope(7, "deal.won", None, audience=range(450, 0, -1))
    sent = events()
    assert [message["only"] for message in sent] == [
        list(range(1, 201)),
        list(range(201, 401)),
        list(range(401, 451)),
    ]
    assert [{**m, "only": None} for m in sent] == [scope_event(7, "deal.won", None, only=None)] * 3
    assert len({message["mid"] for _, message in published()}) == 3


# broadcast_to_users, broadcast_to_user, recheck_users -----------------------------------------


@pytest.mark.django_db
def test_users_broadcast_publishes_one_message_on_the_base_channel(
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        broadcast_to_users(
            [5, 3, 5], "note.sent", {"n": 1}, channels=["note"], meta={"origin": "o"}, skip_scope=7
        )
    assert [channel for channel, _ in published()] == ["realtime"]
    assert events() == [
        {
            "target": "users",
            "event_type": "note.sent",
            "data": {"n": 1},
            "channels": ["note"],
            "meta": {"origin": "o"},
            "skip_scope": 7,
            "user_ids": [3, 5],
        }
    ]


@pytest.mark.django_db
def test_user_broadcast_reaches_one_account_without_skipping_a_scope(
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        broadcast_to_user(5, "note.sent", {"n": 1}, meta={"origin": "o"})
    assert [channel for channel, _ in published()] == ["realtime"]
    assert events() == [
        {
            "target": "users",
            "event_type": "note.sent",
            "data": {"n": 1},
            "channels": None,
            "meta": {"origin": "o"},
            "user_ids": [5],
        }
    ]


@pytest.mark.django_db
def test_users_broadcast_to_nobody_publishes_nothing(
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        broadcast_to_users([], "note.sent", None)
        broadcast_to_user(1, "marker", None)
    assert [message["event_type"] for message in events()] == ["marker"]


@pytest.mark.django_db
def test_recheck_users_publishes_a_recheck_on_the_base_channel(
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        recheck_users([4, 2, 4])
        assert published() == []
    assert [channel for channel, _ in published()] == ["realtime"]
    assert events() == [{"target": "recheck", "user_ids": [2, 4]}]


@pytest.mark.django_db
@override_settings(REALTIME_CHANNEL="rt")
def test_broadcasts_follow_the_configured_channel(
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        broadcast_to_scope(7, "a", None)
        broadcast_to_user(5, "b", None)
        recheck_users([5])
    # A transaction's rechecks go first (none of its events may reach an account it cut off).
    assert [channel for channel, _ in published()] == ["rt", "rt_7", "rt"]


# When it is published --------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_broadcast_in_a_transaction_is_published_only_after_commit() -> None:
    with transaction.atomic():
        broadcast_to_scope(7, "deal.won", None)
        broadcast_to_user(5, "note.sent", None)
        recheck_users([5])
        assert published() == []
    # Its rechecks first: none of its events may reach an account it cut off.
    assert [message["target"] for message in events()] == ["recheck", "scope", "users"]


@pytest.mark.django_db(transaction=True)
def test_broadcast_in_a_rolled_back_transaction_publishes_nothing() -> None:
    with transaction.atomic():
        broadcast_to_scope(7, "deal.won", None)
        broadcast_to_user(5, "note.sent", None)
        recheck_users([5])
        transaction.set_rollback(True)
    broadcast_to_scope(7, "marker", None)
    assert events() == [scope_event(7, "marker", None)]


@pytest.mark.django_db(transaction=True)
def test_broadcast_in_a_rolled_back_savepoint_publishes_only_the_rest() -> None:
    with transaction.atomic():
        broadcast_to_scope(7, "kept.before", None)
        with transaction.atomic():
            broadcast_to_scope(7, "lost", None)
            transaction.set_rollback(True)
        broadcast_to_scope(7, "kept.after", None)
    assert [message["event_type"] for message in events()] == ["kept.before", "kept.after"]


@pytest.mark.django_db(transaction=True)
def test_broadcast_outside_a_transaction_is_published_at_once() -> None:
    broadcast_to_scope(7, "deal.won", {"amount": 5})
    assert events() == [scope_event(7, "deal.won", {"amount": 5})]
    recheck_users([3])
    assert events("recheck") == [{"target": "recheck", "user_ids": [3]}]


@pytest.mark.django_db(transaction=True)
async def test_broadcast_from_async_code_publishes_from_a_thread(
    caplog: pytest.LogCaptureFixture,
) -> None:
    earlier = set(from_async._tasks)
    broadcast_to_scope(7, "deal.won", {"amount": 5})
    pending = set(from_async._tasks) - earlier
    # The work runs in asgiref's thread for thread-sensitive code; its task is kept referenced
    # until it is done.
    assert len(pending) == 1
    rows = await asyncio.to_thread(wait_for_rows, 1)
    # Done callbacks run in the order they were added, so once this one has run, broadcast's
    # own has too (awaiting the task alone may resume first when it is already done).
    (task,) = pending
    finished = asyncio.get_running_loop().create_future()
    task.add_done_callback(lambda _: finished.set_result(None))
    await asyncio.wait_for(finished, WAIT)
    assert pending.isdisjoint(from_async._tasks)
    assert [channel for channel, _ in rows] == ["realtime_7"]
    assert [without_mid(message) for _, message in rows] == [
        scope_event(7, "deal.won", {"amount": 5})
    ]
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


@pytest.mark.django_db(transaction=True)
async def test_every_broadcast_kind_works_from_async_code() -> None:
    earlier = set(from_async._tasks)
    broadcast_to_users([2, 1], "note.sent", None)
    recheck_users([3])
    pending = set(from_async._tasks) - earlier
    assert len(pending) == 2
    await asyncio.wait_for(asyncio.gather(*pending), WAIT)
    rows = await asyncio.to_thread(wait_for_rows, 2)
    assert sorted(message["target"] for _, message in rows) == ["recheck", "users"]


class RollbackError(Exception):
    pass


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("commits", [True, False], ids=["commits", "rolls-back"])
def test_broadcasts_of_an_async_helper_under_async_to_sync_follow_the_caller_s_transaction(
    commits: bool,
) -> None:
    """Sync code in a transaction (a task in ``atomic()``, a sync view under
    ``ATOMIC_REQUESTS``) calling an async helper through ``async_to_sync``: the helper's
    broadcasts are published when that transaction commits, never before, nothing after a
    rollback. They are its last statements: the caller's thread takes no more work once the
    helper has returned."""

    async def helper() -> None:
        broadcast_to_scope(7, "deal.won", None)
        recheck_users([5])

    with contextlib.suppress(RollbackError), transaction.atomic():
        async_to_sync(helper)()
        assert published() == []
        if not commits:
            raise RollbackError
    broadcast_to_scope(7, "marker", None)
    told = [message.get("event_type", message["target"]) for message in events()]
    assert told == (["recheck", "deal.won", "marker"] if commits else ["marker"])


async def close_the_thread_s_connections() -> None:
    """Run on asgiref's shared thread after what was queued there: once it returned, that
    work has run."""
    await sync_to_async(connections.close_all)()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("commits", [True, False], ids=["commits", "rolls-back"])
@pytest.mark.parametrize("write", ["before", "after"], ids=["write-before", "write-after"])
def test_broadcasts_of_an_async_helper_under_asyncio_run_follow_the_caller_s_transaction(
    commits: bool, write: str
) -> None:
    """A task in ``atomic()`` running its async helper with ``asyncio.run`` rather than
    ``async_to_sync``: the loop runs on the task's own thread, in its block, and asgiref's
    shared thread is outside it. The helper's broadcasts are published when the block
    commits, in their place among the block's own announcements, nothing if it rolls back."""

    workspace = Workspace.objects.create(name="Acme", slug="acme")
    forget_messages()

    async def helper() -> None:
        broadcast_to_scope(7, "deal.won", None)
        recheck_users([5])

    with contextlib.suppress(RollbackError), transaction.atomic():
        if write == "before":
            Contact.objects.create(workspace=workspace, name="written")
        asyncio.run(helper())
        if write == "after":
            Contact.objects.create(workspace=workspace, name="written")
        assert published() == []
        if not commits:
            raise RollbackError
    asyncio.run(close_the_thread_s_connections())
    broadcast_to_scope(7, "marker", None)
    told = [message.get("event_type", message["target"]) for message in events()]
    helper_s = ["deal.won", "recheck"]
    if not commits:
        assert told == ["marker"]
    elif write == "before":
        assert told == ["contact.created", *helper_s, "marker"]
    else:
        assert told == [*helper_s, "contact.created", "marker"]


@pytest.mark.django_db(transaction=True)
def test_the_last_broadcast_of_a_coroutine_run_by_asyncio_run_is_published() -> None:
    """A script's or a command's ``asyncio.run`` whose coroutine broadcasts and returns at once:
    asyncio.run then cancels what is left, which must not withdraw the work (queued on
    asgiref's thread for thread-sensitive code, in autocommit there)."""

    async def notify(number: int) -> None:
        broadcast_to_scope(7, "note", {"n": number})

    def command() -> None:
        for number in range(20):
            asyncio.run(notify(number))
        asyncio.run(close_the_thread_s_connections())

    thread = threading.Thread(target=command)
    thread.start()
    thread.join(WAIT)
    assert sorted(message["data"]["n"] for _, message in wait_for_rows(20)) == list(range(20))


@pytest.mark.django_db(transaction=True)
def test_a_script_s_last_broadcasts_are_published_without_an_error_as_it_exits() -> None:
    """A script whose ``asyncio.run`` broadcasts and returns, then exits: the work runs on
    asgiref's thread while the interpreter shuts down, when no executor takes new work. A
    trim asked for then (on every message at a batch size of 2) is skipped; the publish did
    not fail."""
    env = {**subprocess_env(), "REALTIME_TEST_SETTINGS": '{"REALTIME_TRIM_BATCH_SIZE": 2}'}
    done = subprocess.run(
        [sys.executable, "-m", "tests.worker", "broadcast-and-exit", "7", "3"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "failed" not in done.stderr, done.stderr
    assert sorted(message["data"]["n"] for message in events()) == [0, 1, 2]


def a_sync_view_with_an_async_helper(request: HttpRequest) -> HttpResponse:
    """A sync view, run in the request's transaction under ``ATOMIC_REQUESTS``, whose async
    helper broadcasts; ``?fail`` makes it raise after, so that the transaction rolls back."""

    async def helper() -> None:
        broadcast_to_scope(7, "deal.won", {"request": request.GET["n"]})

    Contact.objects.create(name=request.GET["n"])
    async_to_sync(helper)()
    if "fail" in request.GET:
        raise ValueError("the view failed")
    return HttpResponse("ok")


async def an_async_view_that_broadcasts(request: HttpRequest) -> HttpResponse:
    """An async view whose broadcasts must be out before it returns: it awaits a
    thread-sensitive ``sync_to_async`` call after them (``?wait=call``, or a query of the
    async ORM: ``?wait=orm``), which runs after their work, queued on the request's thread
    before it."""
    for number in range(int(request.GET["count"])):
        broadcast_to_scope(7, "note", {"n": number})
    if request.GET.get("wait") == "call":
        await sync_to_async(lambda: None)()
    elif request.GET.get("wait") == "orm":
        await Contact.objects.filter(pk=0).aexists()
    return HttpResponse("ok")


urlpatterns = [
    path("helper/", a_sync_view_with_an_async_helper),
    path("async/", an_async_view_that_broadcasts),
]


@pytest.fixture
def atomic_requests(settings: Any) -> Iterator[None]:
    """``ATOMIC_REQUESTS`` on the default database, as a project sets it, with this module's
    view."""
    settings.ROOT_URLCONF = __name__
    database = connections["default"].settings_dict
    database["ATOMIC_REQUESTS"] = True
    try:
        yield
    finally:
        database["ATOMIC_REQUESTS"] = False


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("atomic_requests")
async def test_a_broadcast_of_a_sync_view_s_async_helper_follows_atomic_requests() -> None:
    """Through Django's request handler: the broadcast of a request that failed is not
    published (its transaction rolled back), the next request's is."""
    client = AsyncClient(raise_request_exception=False)
    assert (await client.get("/helper/", {"n": "failed", "fail": "1"})).status_code == 500
    assert (await client.get("/helper/", {"n": "served"})).status_code == 200
    names = await off_loop(lambda: list(Contact.objects.values_list("name", flat=True)))
    assert names == ["served"]
    told = await off_loop(lambda: [message["data"] for message in events("scope")])
    assert told == [{"request": "served"}]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("wait", ["call", "orm"])
async def test_an_async_view_s_broadcasts_are_published_before_its_response_once_it_awaits(
    settings: Any, wait: str
) -> None:
    """docs/concepts.md: from an async view the publish may follow the response; a view
    awaiting any thread-sensitive ``sync_to_async`` call after its broadcasts returns once
    they are published."""
    settings.ROOT_URLCONF = __name__
    client = AsyncClient()
    for _ in range(5):
        await off_loop(forget_messages)
        response = await client.get("/async/", {"count": "20", "wait": wait})
        assert response.status_code == 200
        told = await off_loop(lambda: [message["data"]["n"] for message in events("scope")])
        assert told == list(range(20))


# Failures --------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_failing_transport_outside_a_transaction_logs_an_error_and_does_not_raise(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rename_table(TABLE, f"{TABLE}_away")
    try:
        broadcast_to_scope(7, "lost", None)
    finally:
        rename_table(f"{TABLE}_away", TABLE)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert errors[0].name.startswith("realtime")
    assert errors[0].exc_info is not None
    broadcast_to_scope(7, "marker", None)
    assert events() == [scope_event(7, "marker", None)]


@pytest.mark.django_db(transaction=True)
def test_failing_transport_after_commit_logs_an_error_and_does_not_raise(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rename_table(TABLE, f"{TABLE}_away")
    try:
        with transaction.atomic():
            broadcast_to_scope(7, "lost", None)
            recheck_users([5])
    finally:
        rename_table(f"{TABLE}_away", TABLE)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert errors[0].name.startswith("realtime")
    assert errors[0].exc_info is not None
    assert published() == []


PROTOCOL_TYPES = ["auth_success", "auth_error", "cursor", "query.rows", "query.diff", "query.error"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("event_type", PROTOCOL_TYPES)
def test_a_broadcast_under_a_frame_type_of_the_protocol_is_refused_with_an_error_naming_it(
    event_type: str, caplog: pytest.LogCaptureFixture
) -> None:
    with transaction.atomic():
        broadcast_to_scope(7, event_type, {"message": "note"})
        broadcast_to_users([5], event_type, {"user_id": 5})
        broadcast_to_user(5, event_type, None)
    broadcast_to_scope(7, event_type, None)  # outside a transaction: refused at once too
    broadcast_to_user(5, "marker", None)
    assert [message["event_type"] for message in events()] == ["marker"]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in errors] == ["realtime: broadcasting failed"] * 4
    for record in errors:
        assert record.exc_info is not None
        refusal = record.exc_info[1]
        assert isinstance(refusal, ValueError)
        assert f"{event_type!r} is a frame type of the socket protocol" in str(refusal)
        assert f"'app.{event_type}'" in str(refusal)


def test_the_types_refused_are_those_of_the_frames_the_socket_protocol_sends() -> None:
    from realtime.messages import PROTOCOL_FRAME_TYPES
    from realtime.sockets import live_queries, protocol

    sent = {protocol.AUTH_SUCCESS, protocol.AUTH_ERROR, protocol.CURSOR}
    sent |= {live_queries.ROWS, live_queries.DIFF, live_queries.ERROR}
    assert PROTOCOL_FRAME_TYPES == sent == set(PROTOCOL_TYPES)


@pytest.mark.django_db(transaction=True)
async def test_a_broadcast_from_async_code_under_a_frame_type_of_the_protocol_is_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    earlier = set(from_async._tasks)
    broadcast_to_scope(7, "auth_success", {"user_id": 5})
    broadcast_to_user(5, "marker", None)
    await asyncio.wait_for(asyncio.gather(*(set(from_async._tasks) - earlier)), WAIT)
    rows = await asyncio.to_thread(wait_for_rows, 1)
    assert [message["event_type"] for _, message in rows] == ["marker"]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert errors[0].exc_info is not None
    assert isinstance(errors[0].exc_info[1], ValueError)


# Truncation at REALTIME_MAX_PAYLOAD ------------------------------------------------------------


def broadcast_big(capture: DjangoCaptureOnCommitCallbacks) -> list[dict[str, Any]]:
    forget_messages()
    with capture(execute=True):
        broadcast_to_scope(7, "contact.noted", DATA, channels=["contact"], meta=META)
    return [message for _, message in published()]


@pytest.mark.django_db
def test_broadcast_at_exactly_max_payload_is_unchanged_and_one_byte_less_is_truncated(
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    (first,) = broadcast_big(django_capture_on_commit_callbacks)
    # The mid is a uuid4 hex: every message of these arguments encodes to this size.
    size = len(encode(first))
    full = scope_event(7, "contact.noted", DATA, channels=["contact"], meta=META)
    assert without_mid(first) == full

    with override_settings(REALTIME_MAX_PAYLOAD=size):
        (at_budget,) = broadcast_big(django_capture_on_commit_callbacks)
    assert len(encode(at_budget)) == size
    assert without_mid(at_budget) == full

    with override_settings(REALTIME_MAX_PAYLOAD=size - 1):
        (over,) = broadcast_big(django_capture_on_commit_callbacks)
    assert without_mid(over) == {
        **full,
        "data": {"model": "contact", "id": 7},
        "meta": {**META, "truncated": True},
    }


@pytest.mark.django_db
def test_broadcast_that_cannot_fit_max_payload_is_dropped_with_an_error(
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with override_settings(REALTIME_MAX_PAYLOAD=20):
        assert broadcast_big(django_capture_on_commit_callbacks) == []
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "contact.noted" in errors[0].getMessage()
