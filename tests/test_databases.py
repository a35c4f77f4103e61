"""Several databases: a decorated model written on another alias is announced once *that*
alias commits, whatever happens to a transaction open on ``default``, and realtime's publish
never runs inside the application's transaction (so it never changes its settings nor holds
the publish lock there). Who may read a row written on another alias than its model's
(``using=``) is decided on the alias it was written on, by the writer and by the worker; a
save to another alias than its instance was read from knows nothing of the row there; and
routers that keep realtime's log off the database the transport writes it on are an error
(``realtime.E026``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.checks import run_checks
from django.db import connection, connections, transaction

from realtime import announce
from realtime.auth import get_auth, issue_token
from realtime.broadcast import broadcast_to_scope
from realtime.checks.database import check_log_database
from realtime.readers import readers_now, row_of
from realtime.registry import options_for
from realtime.sockets.live_queries import UNREAD, change_of
from tests.helpers import events, forget_messages, off_loop, only_on
from tests.live import Clients, LiveServers
from tests.test_live_queries import marker_for
from tests.testapp.models import Case, Membership, Notification, Ticket, Workspace

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "other"])


class RolledBackError(Exception):
    pass


def rolled_back(work: Callable[[], Any], using: str = "default") -> None:
    """Run ``work`` in an atomic block on ``using`` that then rolls back."""
    try:
        with transaction.atomic(using=using):
            work()
            raise RolledBackError
    except RolledBackError:
        pass


def settled(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait, at most ``timeout`` seconds, for ``condition()`` (a publish from realtime's own
    thread has no event to wait on here)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not settled in time"
        time.sleep(0.01)


@pytest.fixture
def acme() -> Workspace:
    """The scope, on both databases (same id): rows on ``other`` point at it there."""
    workspace = Workspace.objects.create(name="Acme", slug="acme")
    Workspace.objects.using("other").create(pk=workspace.pk, name="Acme", slug="acme")
    forget_messages()
    return workspace


def titles() -> list[Any]:
    return [(e["event_type"], (e["data"] or {}).get("title")) for e in events()]


def test_a_write_on_another_database_is_announced_after_its_commit(acme: Workspace) -> None:
    with transaction.atomic(using="other"):
        Ticket.objects.using("other").create(workspace_id=acme.pk, title="there")
        assert events() == []

    assert titles() == [("ticket.created", "there")]


def test_a_write_on_another_database_rolled_back_announces_nothing(acme: Workspace) -> None:
    rolled_back(
        lambda: Ticket.objects.using("other").create(workspace_id=acme.pk, title="gone"), "other"
    )

    Ticket.objects.create(workspace=acme, title="marker")
    assert titles() == [("ticket.created", "marker")]


def test_a_write_committed_on_another_database_stays_announced_when_default_rolls_back(
    acme: Workspace,
) -> None:
    def both() -> None:
        Ticket.objects.create(workspace=acme, title="rolled back")
        with transaction.atomic(using="other"):
            Ticket.objects.using("other").create(workspace_id=acme.pk, title="committed")

    rolled_back(both)

    settled(lambda: titles() == [("ticket.created", "committed")])


def test_bulk_writes_on_another_database_announce_after_its_commit(acme: Workspace) -> None:
    Ticket.objects.using("other").create(workspace_id=acme.pk, title="t")
    forget_messages()

    with transaction.atomic():
        Ticket.objects.create(workspace=acme, title="here")
        Ticket.objects.using("other").update(points=3)
    settled(lambda: len(events()) == 2)

    assert sorted(titles()) == [("ticket.created", "here"), ("ticket.updated", "t")]


@only_on("postgresql")
def test_the_publish_never_runs_inside_the_applications_transaction(acme: Workspace) -> None:
    with transaction.atomic():
        Ticket.objects.create(workspace=acme, title="here")
        with transaction.atomic(using="other"):
            Ticket.objects.using("other").create(workspace_id=acme.pk, title="there")
        with connection.cursor() as cursor:
            cursor.execute("SHOW synchronous_commit")
            assert cursor.fetchone() == ("on",)
        # The application's session holds no publish lock (realtime's own connection takes it
        # for a moment, while it publishes).
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                "AND pid = pg_backend_pid()"
            )
            assert cursor.fetchone() == (0,)
        # Published already, by realtime's own connection, before this transaction ends.
        settled(lambda: _published_elsewhere() == 1)


def test_under_manual_transaction_management_the_publish_is_not_the_applications(
    acme: Workspace,
) -> None:
    # Autocommit off and no atomic block: no commit to wait for, so the announcement goes at
    # once, in a transaction of realtime's own. Inside the application's, it would change its
    # settings (PostgreSQL), hold the log's lock until it ends (MariaDB), take an id that
    # commits late, and go with its rollback (proven here).
    transaction.set_autocommit(False)
    try:
        Ticket.objects.create(workspace=acme, title="manual")
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SHOW synchronous_commit")
                assert cursor.fetchone() == ("on",)
        transaction.rollback()
    finally:
        transaction.set_autocommit(True)

    settled(lambda: titles() == [("ticket.created", "manual")])


def _published_elsewhere() -> int:
    session = connections.create_connection("default")
    try:
        with session.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM firm_channel_messages")
            return int(cursor.fetchone()[0])
    finally:
        session.close()


def test_broadcasts_and_announce_take_the_database_they_follow(acme: Workspace) -> None:
    ticket = Ticket.objects.using("other").create(workspace_id=acme.pk, title="t")
    forget_messages()

    def told() -> None:
        broadcast_to_scope(acme.pk, "custom.gone", {"n": 1}, using="other")
        announce(ticket, "updated", changed=["title"], using="other")

    rolled_back(told, "other")
    with transaction.atomic(using="other"):
        broadcast_to_scope(acme.pk, "custom.kept", {"n": 2}, using="other")
        announce(ticket, "updated", changed=["title"])  # the database it was read from
        assert events() == []

    assert [e["event_type"] for e in events()] == ["custom.kept", "ticket.updated"]


# Rows written on another database than their model's --------------------------------------


def members_on_both(workspace: Workspace, *names: str) -> list[Any]:
    """Accounts of these names, members of ``workspace``, the same on both databases."""
    accounts = []
    for name in names:
        user = get_user_model().objects.create_user(username=name)
        get_user_model().objects.using("other").create(pk=user.pk, username=name)
        Membership.objects.create(workspace=workspace, user=user)
        Membership.objects.using("other").create(workspace_id=workspace.pk, user_id=user.pk)
        accounts.append(user)
    forget_messages()
    return accounts


def worker_audience(message: dict[str, Any], asked: list[Any]) -> list[Any]:
    """What a worker holding sockets of ``asked`` decides for a scope message of a guarded
    row: the accounts its ``only`` names, else ``auth.audience`` asked about its ``about``."""
    if message.get("only") is not None:
        return [user_id for user_id in asked if user_id in message["only"]]
    about = message.get("about")
    auth = get_auth()
    return list(auth.audience(message["scope_id"], message["event_type"], None, asked, about))


def test_a_guarded_row_written_on_another_database_reaches_its_readers_there(
    acme: Workspace,
) -> None:
    ann, bob = members_on_both(acme, "ann", "bob")
    with transaction.atomic(using="other"):
        Case.objects.using("other").create(
            workspace_id=acme.pk, title="ann's", private=True, assignee_id=ann.pk
        )
    Case.objects.create(workspace=acme, title="here", private=True, assignee=ann)

    there, here = events()
    assert there["about"] == {"model": "case", "id": there["data"]["id"], "using": "other"}
    assert worker_audience(there, [ann.pk, bob.pk]) == [ann.pk]
    # A write where the model's writes go names no database: its message is as it was.
    assert here["about"] == {"model": "case", "id": here["data"]["id"]}
    assert worker_audience(here, [ann.pk, bob.pk]) == [ann.pk]


def test_a_queryable_row_written_on_another_database_makes_live_queries_read_their_rows_again(
    acme: Workspace,
) -> None:
    """Live queries list the rows of the database their model's writes go to: the message of
    a row written on another carries no filters values, and a query it may change reads its
    rows again (where that row is not) instead of listing it."""
    with transaction.atomic(using="other"):
        Case.objects.using("other").create(workspace_id=acme.pk, title="there", status="open")
    Case.objects.create(workspace=acme, title="here", status="open")

    there, here = events()
    options = options_for(Case)
    assert options is not None
    assert there["meta"]["filters"] is None
    assert change_of(options, there["data"], there["meta"], "row") is UNREAD
    assert here["meta"]["filters"]["status"] == "open"
    assert change_of(options, here["data"], here["meta"], "row") is not UNREAD


def test_a_row_of_the_same_key_on_the_models_database_never_decides_for_one_written_elsewhere(
    acme: Workspace,
) -> None:
    ann, bob = members_on_both(acme, "ann", "bob")
    public = Case.objects.create(workspace=acme, title="public here", private=False)
    forget_messages()
    with transaction.atomic(using="other"):
        Case.objects.using("other").create(
            pk=public.pk, workspace_id=acme.pk, title="ann's", private=True, assignee_id=ann.pk
        )

    [message] = events()
    assert worker_audience(message, [ann.pk, bob.pk]) == [ann.pk]


def test_an_update_on_another_database_taking_a_guarded_row_from_a_reader_tells_them_alone(
    acme: Workspace,
) -> None:
    # Who reads the row after the update is read where it was written: on ``default`` the row
    # of that key stays public, and read there bob would keep hearing ann's row.
    ann, bob = members_on_both(acme, "ann", "bob")
    public = Case.objects.create(workspace=acme, title="public here", private=False)
    Case.objects.using("other").create(pk=public.pk, workspace_id=acme.pk, title="there")
    forget_messages()
    case = Case.objects.using("other").get(pk=public.pk)
    case.private, case.assignee_id, case.title = True, ann.pk, "ann's now"
    with transaction.atomic(using="other"):
        case.save()

    told = {tuple(message["only"]): message for message in events()}
    assert sorted(told) == sorted([(ann.pk,), (bob.pk,)])
    left, kept = told[(bob.pk,)], told[(ann.pk,)]
    assert left["event_type"] == "case.deleted"
    assert left["data"] == {"model": "case", "id": public.pk}
    assert (kept["event_type"], kept["data"]["title"]) == ("case.updated", "ann's now")


def test_a_resume_replays_an_account_event_written_on_another_database_to_its_account(
    acme: Workspace,
) -> None:
    (ann,) = members_on_both(acme, "ann")
    with transaction.atomic(using="other"):
        Notification.objects.using("other").create(user_id=ann.pk, text="for ann")

    [message] = events()
    assert message["using"] == "other"
    row = row_of(message)
    assert row is not None
    # What a resume asks before replaying it (``realtime.sockets.resume``).
    assert readers_now(row, message["event_type"], message["data"], [ann.pk]) == [ann.pk]


SERVER_KEYS = ("ENGINE", "NAME", "USER", "PASSWORD", "HOST", "PORT", "OPTIONS")


def both_test_databases() -> dict[str, Any]:
    """``DATABASES`` for a server subprocess: this test's ``default`` and ``other``."""
    return {
        alias: {
            key: value
            for key, value in connections[alias].settings_dict.items()
            if key in SERVER_KEYS
        }
        for alias in ("default", "other")
    }


async def test_a_worker_judges_a_guarded_row_on_the_database_it_was_written_on(
    acme: Workspace, live_servers: LiveServers, ws: Clients
) -> None:
    server = live_servers.get("two-databases", DATABASES=both_test_databases())
    ann, bob = await off_loop(members_on_both, acme, "ann", "bob")
    public = await off_loop(Case.objects.create, workspace=acme, title="public here")
    clients = {}
    for user in (ann, bob):
        client = await ws.authenticated(server, issue_token(user), scope="acme")
        await client.send("subscribe", {"channels": ["case"]})
        await marker_for(client, user.pk)
        clients[user.pk] = client

    def write() -> None:
        with transaction.atomic(using="other"):
            Case.objects.using("other").create(
                pk=public.pk,
                workspace_id=acme.pk,
                title="ann's",
                private=True,
                assignee_id=ann.pk,
            )

    await off_loop(write)
    heard = {}
    for user in (ann, bob):
        frames = await marker_for(clients[user.pk], user.pk)
        heard[user.username] = [f for f in frames if f["type"].startswith("case.")]
    assert [(f["type"], f["data"]["title"]) for f in heard["ann"]] == [("case.created", "ann's")]
    assert heard["bob"] == []
    # The database is the worker's to know, not the client's.
    [frame] = heard["ann"]
    assert "using" not in frame["data"]
    assert "using" not in frame.get("meta", {})
    assert set(frame) <= {"type", "data", "meta", "scope_id"}


# An instance written on another database than the one it was read from --------------------


def told() -> list[Any]:
    return [
        (e["event_type"], e["data"].get("title"), e["data"].get("points"), e["meta"].get("changed"))
        for e in events()
    ]


def test_save_using_another_database_tells_what_changed_there(acme: Workspace) -> None:
    # Django's way of copying a row to another database: the row there held other values,
    # and what was read from ``default`` says nothing of it.
    here = Ticket.objects.create(workspace=acme, title="A", points=1)
    Ticket.objects.using("other").create(pk=here.pk, workspace_id=acme.pk, title="B", points=5)
    forget_messages()
    loaded = Ticket.objects.get(pk=here.pk)
    with transaction.atomic(using="other"):
        loaded.save(using="other")
    edited = Ticket.objects.get(pk=here.pk)
    edited.points = 2
    edited.save(using="other")

    [(kind, title, points, changed), (kind_after, _, points_after, changed_after)] = told()
    assert (kind, title, points) == ("ticket.updated", "A", 1)
    assert {"title", "points"} <= set(changed)
    assert (kind_after, points_after) == ("ticket.updated", 2)
    assert {"title", "points"} <= set(changed_after)


def test_bulk_update_on_another_database_of_instances_read_from_default_is_told(
    acme: Workspace,
) -> None:
    here = Ticket.objects.create(workspace=acme, title="A", points=1)
    Ticket.objects.using("other").create(pk=here.pk, workspace_id=acme.pk, title="B", points=1)
    forget_messages()
    loaded = Ticket.objects.get(pk=here.pk)
    Ticket.objects.using("other").bulk_update([loaded], ["title"])

    assert told() == [("ticket.updated", "A", 1, ["title"])]


def test_save_using_another_database_that_hides_a_guarded_row_tells_its_readers_there(
    acme: Workspace,
) -> None:
    ann, bob = members_on_both(acme, "ann", "bob")
    here = Case.objects.create(workspace=acme, title="secret", private=True, assignee=ann)
    Case.objects.using("other").create(pk=here.pk, workspace_id=acme.pk, title="secret")
    forget_messages()
    loaded = Case.objects.get(pk=here.pk)
    with transaction.atomic(using="other"):
        loaded.save(using="other")

    assert Case.objects.using("other").get(pk=here.pk).private
    left = [m for m in events() if m["event_type"] == "case.deleted"]
    assert [(m["only"], m["data"]) for m in left] == [([bob.pk], {"model": "case", "id": here.pk})]


def test_a_delete_on_another_database_tells_the_account_holding_the_row_there(
    acme: Workspace,
) -> None:
    ann, bob = members_on_both(acme, "ann", "bob")
    note = Notification.objects.create(user=ann, text="ann's")
    Notification.objects.using("other").create(pk=note.pk, user_id=bob.pk, text="bob's")
    forget_messages()
    loaded = Notification.objects.get(pk=note.pk)
    with transaction.atomic(using="other"):
        loaded.delete(using="other")

    assert [(m["event_type"], m["user_ids"]) for m in events()] == [
        ("notification.deleted", [bob.pk])
    ]


# Realtime's log where the transport writes it -----------------------------------------------


class RealtimeElsewhere:
    """A project's router keeping realtime's tables on ``other`` alone, as it keeps its
    infrastructure apps together (never on the replica)."""

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        if db == "replica":
            return False
        if app_label == "realtime":
            return db == "other"
        return None


def test_routers_keeping_realtimes_log_off_the_database_the_transport_writes_on_are_an_error(
    settings: Any,
) -> None:
    settings.DATABASE_ROUTERS = [f"{__name__}.RealtimeElsewhere"]
    settings.REALTIME_TRANSPORT = "table"
    (error,) = check_log_database()
    assert error.id == "realtime.E026"
    assert "firm_channel_messages" in error.msg
    assert "'default'" in error.msg
    assert "'realtime'" in str(error.hint)
    assert "realtime.E026" in [m.id for m in run_checks(include_deployment_checks=True)]
    settings.REALTIME_TRANSPORT = "pg_notify"
    assert [e.id for e in check_log_database()] == ["realtime.E026"]
    # Transports that keep no log there.
    settings.REALTIME_PG_NOTIFY_LOG = False
    assert check_log_database() == []
    settings.REALTIME_TRANSPORT = "redis"
    assert check_log_database() == []
    # The log allowed where the transport writes it.
    settings.REALTIME_TRANSPORT = "table"
    settings.DATABASE_ROUTERS = ["tests.routers.NoMigrationsOnTheReplica"]
    assert check_log_database() == []
