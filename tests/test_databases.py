"""Several databases: a decorated model written on another alias is announced once *that*
alias commits, whatever happens to a transaction open on ``default``, and realtime's publish
never runs inside the application's transaction (so it never changes its settings nor holds
the publish lock there)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, connections, transaction

from realtime import announce
from realtime.broadcast import broadcast_to_scope
from tests.helpers import events, forget_messages, only_on
from tests.testapp.models import Ticket, Workspace

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
