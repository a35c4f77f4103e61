"""``realtime.compat.django``: what realtime relies on that Django does not document, each use
checked by a self-test the first time a process uses it, with a sound fallback where it fails.

Every use runs against this Django and the real test database. A self-test that fails is
simulated by a probe that raises (as on a Django that changed): one ERROR line, once, and
realtime goes on the documented way, which is checked against the database too.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from django.contrib.auth import get_user_model
from django.db import (
    DEFAULT_DB_ALIAS,
    DatabaseError,
    connection,
    connections,
    models,
    transaction,
)
from django.db.models.signals import post_init
from django.dispatch import Signal
from django.test.utils import CaptureQueriesContext

from realtime.auth import RealtimeAuth, Scope, issue_token
from realtime.compat import django as django_compat
from realtime.compat.django import (
    atomic_block,
    callbacks_released,
    driver_connection,
    driver_errors,
    has_receivers,
    in_atomic_block,
    in_transaction,
    live_receivers,
    plain_instances,
    socket_of,
    sync_connection,
)
from realtime.encoding import normal_id
from realtime.signals import send_robustly
from realtime.sockets import access, standing
from realtime.sockets.protocol import read_scopes
from realtime.transports.bounds import Bounds, bounded_connection
from realtime.transports.table_store import MessageStore, channel_hash
from tests.helpers import Inbox, off_loop, only_on, vendor
from tests.testapp.models import Membership, Workspace

pytestmark = pytest.mark.django_db(transaction=True)

T = TypeVar("T")
User = get_user_model()
BOUNDS = Bounds(statement_timeout=0.5, keepidle=7, keepintvl=3, keepcnt=2)
networked = only_on("postgresql", "mysql")


@pytest.fixture(autouse=True)
def unchecked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each use's self-test runs again in the test (the verdicts from before come back after).

    A test reads the verdict of its own use only: realtime's threads left running by earlier
    tests (pollers, trims) may check other uses meanwhile."""
    monkeypatch.setattr(django_compat, "_verdicts", {})


def failing(monkeypatch: pytest.MonkeyPatch, probe: str) -> None:
    """Make the self-test ``probe`` fail, as on a Django where its use no longer fits."""

    def changed(*args: Any) -> None:
        raise TypeError("this Django changed")

    # Under the self-tests' lock, and their verdicts forgotten again: a thread of an earlier
    # test (a poller) may have run the real probe since the test began.
    with django_compat._lock:
        monkeypatch.setattr(django_compat, probe, changed)
        monkeypatch.setattr(django_compat, "_verdicts", {})


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("realtime") and r.levelno >= logging.ERROR
    ]


def said_once(caplog: pytest.LogCaptureFixture, *words: str) -> None:
    """Realtime logged one ERROR line, holding each of ``words``."""
    lines = errors(caplog)
    assert len(lines) == 1, lines
    for word in words:
        assert word in lines[0]


def on_a_thread(function: Callable[[], T]) -> T:
    """Run ``function`` on a thread of its own (its own connections, closed after)."""
    result: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(function())
        except BaseException as exc:
            failure.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


def opened() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def accounts(count: int) -> tuple[list[Any], list[str]]:
    users = [User.objects.create_user(username=f"seam{index}") for index in range(count)]
    return users, [issue_token(user) for user in users]


# What each use tells, on this Django -----------------------------------------------------


def test_plain_instances_tells_a_queryset_that_builds_instances_its_own_way(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert plain_instances(User.objects.all())
    assert plain_instances(User.objects.filter(is_active=True).order_by("pk"))
    assert not plain_instances(User.objects.annotate(realtime_banned=models.Value(False)))
    assert not plain_instances(User.objects.extra(select={"realtime_banned": "0"}))
    assert not plain_instances(User.objects.values("pk"))
    assert not plain_instances(User.objects.values_list("pk"))
    assert django_compat._verdicts[django_compat.QUERYSETS] is True
    assert not errors(caplog)


def test_has_receivers_sees_receivers_of_the_sender_and_of_every_sender() -> None:
    def tidy(**kwargs: Any) -> None:
        """A receiver that could change what an instance holds."""

    assert not has_receivers(post_init, User)
    for sender in (User, None):
        post_init.connect(tidy, sender=sender)
        try:
            assert has_receivers(post_init, User)
        finally:
            post_init.disconnect(tidy, sender=sender)
        assert not has_receivers(post_init, User)
    assert django_compat._verdicts[django_compat.RECEIVERS] is True


def test_live_receivers_are_the_sender_s_and_every_sender_s_sync_apart_from_async() -> None:
    signal = Signal()

    def mine(**kwargs: Any) -> None:
        """A synchronous receiver of one sender."""

    async def everyone_s(**kwargs: Any) -> None:
        """An asynchronous receiver of every sender."""

    signal.connect(mine, sender=User, weak=False)
    signal.connect(everyone_s, weak=False)
    assert live_receivers(signal, User) == ([mine], [everyone_s])
    assert live_receivers(signal, Workspace) == ([], [everyone_s])
    assert django_compat._verdicts[django_compat.LIVE_RECEIVERS] is True


async def test_signals_whose_receivers_cannot_be_told_are_sent_robustly_and_said_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    failing(monkeypatch, "_probe_live_receivers")
    signal = Signal()
    heard: list[Any] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        heard.append(kwargs["n"])

    signal.connect(receiver, weak=False)
    with caplog.at_level(logging.ERROR, logger="realtime"):
        await send_robustly(signal, User, n=1)
        await send_robustly(signal, User, n=2)
    assert heard == [1, 2]
    said_once(caplog, "does not fit", "asend_robust")


def test_the_driver_connection_is_the_open_one_and_none_once_closed() -> None:
    def look() -> tuple[bool, int | None, bool]:
        opened()
        raw = driver_connection(connection)
        assert raw is not None
        cursor = raw.cursor()
        cursor.execute("SELECT 2")
        answered = cursor.fetchone()[0] == 2
        cursor.close()
        fd = socket_of(connection)
        connection.close()
        return answered, fd, driver_connection(connection) is None

    answered, fd, closed = on_a_thread(look)
    assert answered
    assert closed
    if vendor() == "sqlite":
        assert fd is None  # no network: nothing to cut
    else:
        assert fd is not None
    assert all(django_compat._verdicts.values())


@networked
def test_the_socket_of_a_networked_connection_is_its_own() -> None:
    def look() -> tuple[bool, bool]:
        opened()
        fd = socket_of(connection)
        assert fd is not None
        was_socket = stat.S_ISSOCK(os.fstat(fd).st_mode)
        connection.close()
        return was_socket, socket_of(connection) is None

    assert on_a_thread(look) == (True, True)
    assert django_compat._verdicts[django_compat.SOCKET] is True


def test_driver_errors_are_raised_as_djangos() -> None:
    def fail() -> None:
        opened()
        raw, errors = driver_connection(connection), driver_errors(connection)
        assert raw is not None
        assert errors is not None
        with errors:
            cursor = raw.cursor()
            try:
                cursor.execute("SELECT * FROM realtime_no_such_table")
            finally:
                cursor.close()

    with pytest.raises(DatabaseError):
        on_a_thread(fail)


def test_a_poll_reads_its_window_on_the_drivers_cursor() -> None:
    store = MessageStore()
    store.insert([(b"c", b"one")])
    with CaptureQueriesContext(connection) as captured:
        read = store.poll({channel_hash(b"c")}, 0, 0.0, set())
    assert [row.payload for row in read.rows] == [b"one"]
    assert not [q for q in captured.captured_queries if "channel_hash IN" in q["sql"]]


@networked
def test_driver_options_reach_only_the_connection_of_the_thread_that_asked() -> None:
    def bounded() -> tuple[Any, Any]:
        wrapper = bounded_connection("default", BOUNDS)
        return statement_limit(wrapper), keepalive_idle(wrapper)

    limit, idle = on_a_thread(bounded)
    opened()
    assert (statement_limit(connection), keepalive_idle(connection)) != (limit, idle)
    if vendor() == "postgresql":
        assert (limit, idle) == ("500ms", "7")
    else:
        assert float(limit) == 0.5
    assert django_compat._verdicts[django_compat.OPTIONS] is True


def statement_limit(wrapper: Any) -> Any:
    with wrapper.cursor() as cursor:
        if wrapper.vendor == "postgresql":
            cursor.execute("SHOW statement_timeout")
        else:
            cursor.execute("SELECT @@SESSION.max_statement_time")
        return cursor.fetchone()[0]


def keepalive_idle(wrapper: Any) -> Any:
    """PostgreSQL's client keepalive setting of ``wrapper``'s connection (psycopg reports it)."""
    if wrapper.vendor != "postgresql":
        return None
    raw = driver_connection(wrapper)
    assert raw is not None
    return raw.info.get_parameters().get("keepalives_idle")


# A self-test that fails: one ERROR line, and the documented way ---------------------------


def recheck_answers(users: list[Any], workspace: Workspace) -> list[Any]:
    ask = read_scopes({"scope": workspace.slug})
    questions = [(normal_id(user.pk), issue_token(user), ask, [workspace.pk]) for user in users]
    return access.recheck(RealtimeAuth(), questions)


@pytest.mark.parametrize("probe", ["_probe_querysets", "_probe_receivers"])
def test_a_recheck_whose_column_checks_cannot_be_told_reads_instances(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, probe: str
) -> None:
    failing(monkeypatch, probe)
    users, tokens = accounts(2)
    acme = Workspace.objects.create(name="Acme", slug="acme")
    Membership.objects.create(workspace=acme, user=users[0])
    User.objects.filter(pk=users[1].pk).update(is_active=False)
    with caplog.at_level(logging.ERROR, logger="realtime"):
        assert standing.accounts_of_tokens(tokens) is None
        assert standing.accounts_of_tokens(tokens) is None
        assert recheck_answers(users, acme) == [[Scope(acme.pk, "acme")], None]
    said_once(caplog, "does not fit", "rechecks read accounts as instances")


@networked
def test_a_socket_that_cannot_be_told_is_not_cut_and_said_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    failing(monkeypatch, "_probe_socket")

    def twice() -> list[int | None]:
        opened()
        return [socket_of(connection), socket_of(connection)]

    with caplog.at_level(logging.ERROR, logger="realtime"):
        assert on_a_thread(twice) == [None, None]
    said_once(caplog, "are not cut")


def test_a_poll_whose_driver_errors_cannot_be_translated_reads_on_djangos_cursor(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    failing(monkeypatch, "_probe_errors")
    store = MessageStore()
    store.insert([(b"c", b"one"), (b"c", b"two")])
    with (
        caplog.at_level(logging.ERROR, logger="realtime"),
        CaptureQueriesContext(connection) as captured,
    ):
        first = store.poll({channel_hash(b"c")}, 0, 0.0, set())
        again = store.poll({channel_hash(b"c")}, 0, 0.0, {row.id for row in first.rows})
    assert [row.payload for row in first.rows] == [b"one", b"two"]
    assert again.rows == []
    assert len([q for q in captured.captured_queries if "channel_hash IN" in q["sql"]]) == 2
    said_once(caplog, "polls use Django's cursor")


async def test_a_poller_whose_driver_connection_cannot_be_had_still_delivers(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    make_table_transport: Callable[..., Any],
    inbox: Inbox,
) -> None:
    failing(monkeypatch, "_probe_connection")
    with caplog.at_level(logging.ERROR, logger="realtime"):
        transport = make_table_transport()
        transport.add_listener(inbox)
        await transport.follow("c")
        for payload in (b"one", b"two"):
            await off_loop(transport.publish, [("c", payload)])
            await inbox.wait_for("c", payload)
    assert inbox.payloads("c") == [b"one", b"two"]
    said_once(caplog, "polls use Django's cursor")


@networked
def test_driver_options_that_cannot_be_given_leave_the_projects_and_the_statement_limit(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    failing(monkeypatch, "_probe_options")

    def bounded_twice() -> tuple[Any, Any]:
        wrapper = bounded_connection("default", BOUNDS)
        wrapper.close()
        wrapper = bounded_connection("default", BOUNDS)
        return statement_limit(wrapper), keepalive_idle(wrapper)

    with caplog.at_level(logging.ERROR, logger="realtime"):
        limit, idle = on_a_thread(bounded_twice)
    assert idle is None  # the project's options alone
    if vendor() == "postgresql":
        assert limit == "500ms"
    else:
        assert float(limit) == 0.5
    said_once(caplog, "with the project's OPTIONS only")


# Transactions: the open-block flag, and the release of discarded callbacks ------------------


def test_in_transaction_tells_an_atomic_block_without_connecting() -> None:
    connection.close()
    assert in_transaction(connection) is False
    assert connection.connection is None  # asked without connecting (an instance built by hand)
    with transaction.atomic():
        assert in_transaction(connection) is True
        with transaction.atomic():
            assert in_transaction(connection) is True
    assert in_transaction(connection) is False


def test_in_transaction_that_cannot_be_told_asks_autocommit(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    failing(monkeypatch, "_probe_transaction")
    with caplog.at_level(logging.ERROR, logger="realtime"):
        assert in_transaction(connection) is False
        with transaction.atomic():
            assert in_transaction(connection) is True
    said_once(caplog, "in_atomic_block", "get_autocommit")


def test_a_loop_on_a_thread_reads_the_connection_the_thread_s_sync_code_holds() -> None:
    """``asyncio.run`` inside ``atomic()``: on the loop, ``connections`` answers a connection
    of the loop's own, outside the block; ``sync_connection`` answers the thread's."""
    held = connections[DEFAULT_DB_ALIAS]

    async def ask() -> tuple[Any, Any, bool]:
        mine = sync_connection(DEFAULT_DB_ALIAS)
        loops = connections[DEFAULT_DB_ALIAS]
        return mine, loops, mine is not None and in_atomic_block(mine)

    with transaction.atomic():
        mine, loops, in_block = asyncio.run(ask())
    assert mine is held
    assert in_block is True
    assert loops is not held
    assert in_atomic_block(loops) is False
    assert django_compat._verdicts[django_compat.SYNC_CONNECTION] is True


def test_a_thread_s_connection_that_cannot_be_read_from_its_loop_is_none(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    failing(monkeypatch, "_probe_sync_connection")

    async def ask() -> Any:
        return sync_connection(DEFAULT_DB_ALIAS)

    with caplog.at_level(logging.ERROR, logger="realtime"), transaction.atomic():
        assert asyncio.run(ask()) is None
        assert asyncio.run(ask()) is None
    said_once(caplog, "_connections", "async_to_sync keeps them in it")


def test_atomic_block_tells_the_innermost_open_block_apart() -> None:
    assert atomic_block(connection) is None
    with transaction.atomic():
        outer = atomic_block(connection)
        assert outer is not None
        with transaction.atomic(savepoint=False):
            inner = atomic_block(connection)
            assert inner is not None
            assert inner is not outer
        assert atomic_block(connection) is outer
        with transaction.atomic():
            assert atomic_block(connection) not in (None, outer, inner)
    assert atomic_block(connection) is None


def test_atomic_block_that_cannot_be_told_is_none(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    failing(monkeypatch, "_probe_atomic_blocks")
    with caplog.at_level(logging.ERROR, logger="realtime"), transaction.atomic():
        assert atomic_block(connection) is None
    said_once(caplog, "atomic_blocks", "unannounced in its thread")


def test_this_django_releases_the_callbacks_it_discards(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(django_compat, "_next_try", 0.0)
    with transaction.atomic():
        # Not checked inside a transaction of the application's: assumed, and asked again.
        assert callbacks_released(connection) is True
        assert django_compat.CALLBACKS not in django_compat._verdicts
    with CaptureQueriesContext(connection) as queries:
        assert callbacks_released(connection) is True
    assert django_compat._verdicts[django_compat.CALLBACKS] is True
    written = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].lstrip().upper()[:6] in ("INSERT", "UPDATE", "DELETE")
    ]
    assert written == []
