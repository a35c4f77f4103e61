"""No realtime failure fails the user's write: receivers catch what they raise, and every query
realtime adds inside the user's transaction runs in a savepoint.

On PostgreSQL a failed statement aborts the whole transaction even when the exception is
caught, so these tests make realtime's own queries fail for real: another connection holds a
table realtime reads (and the user's statements do not) in ``ACCESS EXCLUSIVE`` mode, and the
user's transaction sets a short ``lock_timeout``. The user's transaction must go on and commit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction
from django.test import override_settings

from realtime.auth import RealtimeAuth
from tests.helpers import only_on
from tests.testapp.models import (
    ApiKey,
    Contact,
    Membership,
    PrivateNote,
    Profile,
    Workspace,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("quiet_preparation_failures"),
]

MakeUser = Callable[..., Any]


class UnbuildableAuth(RealtimeAuth):
    """An auth service whose constructor fails (a bad setting of the application, say)."""

    def __init__(self) -> None:
        raise RuntimeError("this auth service cannot be built")


def realtime_errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("realtime") and r.levelno >= 40]


@contextmanager
def table_held(table: str) -> Iterator[None]:
    """Hold ``table`` in ACCESS EXCLUSIVE mode from another connection until the block ends."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params) as other:
        other.execute(f'LOCK TABLE "{table}" IN ACCESS EXCLUSIVE MODE')
        yield
        other.rollback()


def short_lock_timeout() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL lock_timeout = '100ms'")


def test_an_auth_service_that_cannot_be_built_never_fails_a_delete(
    workspace: Workspace, make_user: MakeUser, caplog: pytest.LogCaptureFixture
) -> None:
    author = make_user("ann", member_of=workspace)
    note = PrivateNote.objects.create(workspace=workspace, author=author, title="mine")
    contact = Contact.objects.create(workspace=workspace, name="Ann")
    unbuildable = override_settings(REALTIME_AUTH="tests.test_failsafe.UnbuildableAuth")
    with unbuildable, caplog.at_level(logging.ERROR, logger="realtime"), transaction.atomic():
        note.delete()
        contact.delete()
    assert not PrivateNote.objects.filter(pk=note.pk).exists()
    assert not Contact.objects.filter(pk=contact.pk).exists()
    assert realtime_errors(caplog)


@only_on("postgresql")
@override_settings(REALTIME_RECHECK_MODELS={"testapp.ApiKey": "profile.user"})
def test_a_failing_recheck_path_query_never_aborts_the_users_transaction(
    make_user: MakeUser, caplog: pytest.LogCaptureFixture
) -> None:
    profile = Profile.objects.create(user=make_user("ann"))
    key = ApiKey.objects.create(profile=profile, label="ci")
    held = table_held(Profile._meta.db_table)
    with held, caplog.at_level(logging.ERROR, logger="realtime"), transaction.atomic():
        short_lock_timeout()
        key.label = "deploy"
        key.save()
        # The transaction is still usable: a failed statement outside a savepoint would have
        # aborted it ("current transaction is aborted").
        assert ApiKey.objects.filter(label="deploy").count() == 1
    assert ApiKey.objects.get(pk=key.pk).label == "deploy"
    assert realtime_errors(caplog)


@only_on("postgresql")
def test_a_failing_query_before_members_are_cleared_never_aborts_the_users_transaction(
    workspace: Workspace, make_user: MakeUser, caplog: pytest.LogCaptureFixture
) -> None:
    make_user("ann", member_of=workspace)
    make_user("bob", member_of=workspace)
    held = table_held(Workspace._meta.db_table)
    with held, caplog.at_level(logging.ERROR, logger="realtime"), transaction.atomic():
        short_lock_timeout()
        workspace.members.clear()
        assert Membership.objects.filter(workspace_id=workspace.pk).count() == 0
    assert not Membership.objects.filter(workspace_id=workspace.pk).exists()
    assert realtime_errors(caplog)


@only_on("postgresql")
def test_nested_blocks_take_nested_savepoints_and_an_inner_failure_spares_the_outer(
    workspace: Workspace,
) -> None:
    """realtime's reads around a model's ``payload=`` that queries: each block takes its own
    savepoint at its first statement; a statement that fails in the inner one is rolled back
    to the inner savepoint, and the outer block's statements stand."""
    from django.db import DatabaseError

    from realtime.writes.failsafe import savepoint_from_first_query

    with transaction.atomic():
        with savepoint_from_first_query("default"):
            with savepoint_from_first_query("default"):
                try:
                    with connection.cursor() as cursor:
                        cursor.execute("SELECT no_such_column FROM testapp_workspace")
                except DatabaseError:
                    pass
            Contact.objects.create(workspace=workspace, name="outer")
            with savepoint_from_first_query("default"):
                Contact.objects.create(workspace=workspace, name="inner")
        assert Contact.objects.filter(workspace=workspace).count() == 2
    assert sorted(Contact.objects.values_list("name", flat=True)) == ["inner", "outer"]


def _locking(thread_id: int) -> bool:
    """Whether the MySQL connection ``thread_id`` runs a locking read (a connection sees its
    own user's in the process list)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COUNT(*) FROM information_schema.processlist WHERE id = %s AND info LIKE %s",
            [thread_id, "%FOR UPDATE%"],
        )
        return bool(cursor.fetchone()[0])


@only_on("mysql")
def test_a_deadlock_in_realtimes_lock_read_fails_the_write_as_djangos_own_would(
    workspace: Workspace,
) -> None:
    """InnoDB ends a deadlock by rolling back the victim's whole transaction. When the victim
    is realtime's lock read before a moving ``update()``, the write must fail with the
    deadlock, as the update itself would have: caught, the update would run in a fresh
    transaction and ``atomic()`` commit without the block's earlier writes."""
    import threading
    import time

    from django.db import OperationalError, connections

    from tests.helpers import events, forget_messages
    from tests.testapp.models import Plain, Ticket

    beta = Workspace.objects.create(name="Beta", slug="beta")
    mine = Plain.objects.create(workspace=workspace, name="mine")
    theirs = Ticket.objects.create(workspace=workspace, title="theirs")
    # The other transaction writes more rows: InnoDB picks the lighter one as its victim.
    Plain.objects.bulk_create([Plain(workspace=workspace, name=f"f{i}") for i in range(30)])
    first_holds, second_holds = threading.Event(), threading.Event()
    waiter: dict[str, Any] = {}

    def second() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("UPDATE testapp_ticket SET points = 1 WHERE id = %s", [theirs.pk])
                cursor.execute("UPDATE testapp_plain SET name = 'x' WHERE id <> %s", [mine.pk])
                second_holds.set()
                assert first_holds.wait(10)
                deadline = time.monotonic() + 10
                while not _locking(waiter["thread"]) and time.monotonic() < deadline:
                    time.sleep(0.02)
                cursor.execute("UPDATE testapp_plain SET name = 'second' WHERE id = %s", [mine.pk])
            waiter["second"] = "committed"
        finally:
            connections.close_all()

    def first() -> None:
        with transaction.atomic():
            Ticket.objects.create(workspace=workspace, title="made before")
            Plain.objects.filter(pk=mine.pk).update(name="first")
            with connection.cursor() as cursor:
                cursor.execute("SELECT CONNECTION_ID()")
                waiter["thread"] = cursor.fetchone()[0]
            first_holds.set()
            assert second_holds.wait(10)
            Ticket.objects.filter(pk=theirs.pk).update(workspace=beta)  # locks `theirs` first

    thread = threading.Thread(target=second)
    thread.start()
    forget_messages()
    try:
        with pytest.raises(OperationalError) as raised:
            first()
    finally:
        first_holds.set()
        thread.join(20)
    assert not thread.is_alive()
    assert waiter.get("second") == "committed"
    assert raised.value.args[0] == 1213
    assert not Ticket.objects.filter(title="made before").exists()
    assert Ticket.objects.get(pk=theirs.pk).workspace_id == workspace.pk
    assert Plain.objects.get(pk=mine.pk).name == "second"
    assert events("scope") == []


@pytest.mark.parametrize(
    "declared",
    [{"relations": ["nope"]}, {"user_field": "nope"}, {"shared_via": "nope"}],
    ids=["relations", "user_field", "shared_via"],
)
def test_a_path_naming_nothing_fails_no_write(
    workspace: Workspace, declared: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """A path the system checks refuse (E031, E032, E037), deployed all the same: its writes
    succeed, and each says in an ERROR what realtime could not read."""
    from django.db import models
    from django.test.utils import isolate_apps

    from realtime import realtime_model
    from realtime.writes.decorator import unregister

    with isolate_apps("tests.testapp"):

        @realtime_model(fields=["name"], **declared)
        class Misnamed(models.Model):
            workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
            name = models.CharField(max_length=100)

            class Meta:
                app_label = "testapp"
                db_table = "testapp_plain"

            def __str__(self) -> str:
                return self.name

    try:
        with caplog.at_level(logging.ERROR, "realtime"):
            row = Misnamed._default_manager.create(workspace=workspace, name="x")
            row.name = "y"
            row.save()
            row.delete()
        assert not Misnamed._default_manager.exists()
        assert realtime_errors(caplog)
    finally:
        unregister(Misnamed)
