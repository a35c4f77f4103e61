"""MySQL/MariaDB's publish lock is checked: a publish the lock was not granted to is refused
loudly (an ERROR naming the answer), never written out of commit order, and the write it
announces stays committed; a session already holding the lock keeps its own hold."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.db import connection, connections

from realtime.transports import table_store
from realtime.transports.table_store import MYSQL_LOCK, PUBLISH_LOCK_NAME
from tests.helpers import events, forget_messages, only_on
from tests.testapp.models import Ticket, Workspace

pytestmark = [pytest.mark.django_db(transaction=True), only_on("mysql")]


def the_lock(using: Any = connection) -> str:
    """The name of the publish lock of the log in the database ``using`` is connected to."""
    with using.cursor() as cursor:
        cursor.execute(f"SELECT {MYSQL_LOCK}", [PUBLISH_LOCK_NAME])
        return str(cursor.fetchone()[0])


def titles() -> list[Any]:
    return [(e["event_type"], (e["data"] or {}).get("title")) for e in events()]


def test_a_publish_not_granted_the_lock_is_refused_loudly_and_the_write_stays_committed(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(table_store, "PUBLISH_LOCK_WAIT", 0.2)
    forget_messages()
    holder = connections.create_connection("default")
    try:
        with holder.cursor() as cursor:
            cursor.execute("SELECT GET_LOCK(%s, 0)", [the_lock()])
            assert cursor.fetchone() == (1,)
        with caplog.at_level(logging.ERROR, logger="realtime"):
            Ticket.objects.create(workspace=workspace, title="refused")

        refusals = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(refusals) == 1
        assert refusals[0].exc_info is not None
        assert "GET_LOCK answered 0" in str(refusals[0].exc_info[1])
        assert PUBLISH_LOCK_NAME in str(refusals[0].exc_info[1])
        assert events() == []
        # Committed: another session reads the row.
        with holder.cursor() as cursor:
            cursor.execute(
                f"SELECT COUNT(*) FROM {Ticket._meta.db_table} WHERE title = %s", ["refused"]
            )
            assert cursor.fetchone() == (1,)
            cursor.execute("SELECT RELEASE_LOCK(%s)", [the_lock()])
            assert cursor.fetchone() == (1,)
    finally:
        holder.close()

    # The lock free again, the next write is published, and alone: nothing came late.
    Ticket.objects.create(workspace=workspace, title="marker")
    assert titles() == [("ticket.created", "marker")]


def test_a_session_holding_the_lock_already_publishes_and_keeps_its_own_hold(
    workspace: Workspace,
) -> None:
    forget_messages()
    with connection.cursor() as cursor:
        cursor.execute("SELECT GET_LOCK(%s, 0)", [the_lock()])
        assert cursor.fetchone() == (1,)
    try:
        Ticket.objects.create(workspace=workspace, title="nested")
        assert titles() == [("ticket.created", "nested")]
        with connection.cursor() as cursor:
            cursor.execute("SELECT IS_USED_LOCK(%s) = CONNECTION_ID()", [the_lock()])
            assert cursor.fetchone() == (1,)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT RELEASE_LOCK(%s)", [the_lock()])
            assert cursor.fetchone() == (1,)
            cursor.execute("SELECT IS_USED_LOCK(%s)", [the_lock()])
            assert cursor.fetchone() == (None,)


def test_the_publish_lock_of_another_database_on_the_server_holds_nothing_back(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Named locks are the server's: a publisher of another deployment, its log in another
    database of the same server, holding its lock does not make this one wait or refuse."""
    monkeypatch.setattr(table_store, "PUBLISH_LOCK_WAIT", 0.2)
    forget_messages()
    # Another deployment's session: the same server, another database every server has.
    other = connections.create_connection("default")
    other.settings_dict = {**other.settings_dict, "NAME": "information_schema"}

    class OtherDeployment(table_store.MessageStore):
        @property
        def connection(self) -> Any:
            return other

    try:
        with OtherDeployment()._serialized():
            Ticket.objects.create(workspace=workspace, title="published")
        assert titles() == [("ticket.created", "published")]
    finally:
        other.close()
