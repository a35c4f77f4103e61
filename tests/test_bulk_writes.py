"""Bulk writes of decorated models announce themselves: ``update()``, ``bulk_create`` and
``bulk_update``, through every manager and queryset, in a bounded number of statements."""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from contextlib import nullcontext
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.db import DatabaseError, connection, models, transaction
from django.db.models import F, Value
from django.db.models.functions import Concat
from django.test.utils import CaptureQueriesContext

from realtime import RealtimeQuerySet, silent
from realtime.compat.django_orm import can_return_rows
from realtime.encoding import jsonable
from tests.helpers import events, forget_messages, returns_rows
from tests.testapp.models import (
    Attachment,
    Board,
    Charter,
    Chat,
    ChatLine,
    Company,
    Contact,
    Dog,
    Draft,
    Lead,
    Membership,
    Notification,
    Plain,
    Preference,
    PrivateNote,
    Room,
    Seat,
    Ticket,
    Twin,
    Vendor,
    Workspace,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def acme() -> Workspace:
    return Workspace.objects.create(name="Acme", slug="acme")


@pytest.fixture
def beta() -> Workspace:
    return Workspace.objects.create(name="Beta", slug="beta")


def tickets(workspace: Workspace, count: int, **values: Any) -> list[Ticket]:
    made = [
        Ticket.objects.create(workspace=workspace, title=f"{workspace.slug}-{i}", **values)
        for i in range(count)
    ]
    forget_messages()
    return made


def ticket_data(ticket: Ticket, **changes: Any) -> dict[str, Any]:
    data = {
        "model": "ticket",
        "id": ticket.pk,
        "title": ticket.title,
        "done": ticket.done,
        "points": ticket.points,
    }
    return {**data, **changes}


def kinds() -> list[tuple[str, Any, Any]]:
    """(event type, scope, id) of each published scope event, in order."""
    return [
        (e["event_type"], e.get("scope_id"), (e["data"] or {}).get("id")) for e in events("scope")
    ]


# update() ------------------------------------------------------------------------------------


def test_an_update_announces_each_row_it_changed_with_the_values_written(
    acme: Workspace,
) -> None:
    first, second, _ = tickets(acme, 3)

    changed = Ticket.objects.filter(pk__in=[first.pk, second.pk]).update(
        points=F("points") + 5, done=True
    )

    assert changed == 2
    assert events() == [
        {
            "target": "scope",
            "scope_id": acme.pk,
            "event_type": "ticket.updated",
            "data": ticket_data(ticket, points=5, done=True),
            "channels": ["ticket", f"ticket:{ticket.pk}"],
            "meta": {"changed": ["done", "points"]},
        }
        for ticket in (first, second)
    ]


def test_an_update_through_an_expression_announces_its_result(acme: Workspace) -> None:
    (ticket,) = tickets(acme, 1)

    Ticket.objects.update(title=Concat(F("title"), Value("!")))

    (event,) = events()
    assert event["data"]["title"] == f"{ticket.title}!"
    assert event["meta"] == {"changed": ["title"]}


def reads_after_the_update(queries: CaptureQueriesContext, table: str) -> int:
    """The statements reading ``table`` after the first UPDATE of the captured ones."""
    sqls = [q["sql"] for q in queries.captured_queries]
    update = next(i for i, sql in enumerate(sqls) if sql.startswith("UPDATE"))
    return sum(sql.startswith("SELECT") and table in sql for sql in sqls[update:])


def test_an_update_writing_every_column_its_events_carry_reads_no_row_after(
    acme: Workspace,
) -> None:
    first, _ = tickets(acme, 2)

    with CaptureQueriesContext(connection) as queries:
        Ticket.objects.filter(pk=first.pk).update(title="renamed", done=True, points="7")

    assert reads_after_the_update(queries, "testapp_ticket") == 0
    (event,) = events()
    assert event["data"] == ticket_data(first, title="renamed", done=True, points=7)
    assert event["meta"] == {"changed": ["done", "points", "title"]}
    stored = Ticket.objects.get(pk=first.pk)
    assert (stored.title, stored.done, stored.points) == ("renamed", True, 7)


@pytest.mark.parametrize(
    ("values", "why"),
    [
        ({"points": 3}, "title and done are not written"),
        ({"title": "t", "done": True, "points": F("points") + 1}, "an expression"),
    ],
)
def test_an_update_whose_events_carry_what_it_does_not_write_reads_its_rows_after(
    acme: Workspace, values: dict[str, Any], why: str
) -> None:
    (ticket,) = tickets(acme, 1)

    with CaptureQueriesContext(connection) as queries:
        Ticket.objects.filter(pk=ticket.pk).update(**values)

    # Where the UPDATE returns its rows, it is the read.
    expected = 0 if can_return_rows(connection.alias) else 1
    assert reads_after_the_update(queries, "testapp_ticket") == expected, why
    (event,) = events()
    stored = Ticket.objects.get(pk=ticket.pk)
    assert event["data"] == ticket_data(stored)


@returns_rows()
@pytest.mark.parametrize("in_transaction", [False, True])
def test_an_update_where_the_database_returns_rows_sends_its_own_statement_alone(
    acme: Workspace, in_transaction: bool
) -> None:
    first, second, _ = tickets(acme, 3)
    block = transaction.atomic() if in_transaction else contextlib.nullcontext()

    with CaptureQueriesContext(connection) as queries, block:
        changed = Ticket.objects.filter(pk__in=[first.pk, second.pk]).update(points=F("points") + 2)
        during = [q["sql"] for q in queries.captured_queries]

    assert changed == 2
    touching = [sql for sql in during if "testapp_ticket" in sql]
    assert [sql.split()[0] for sql in touching] == ["UPDATE"], during
    assert not any(sql.startswith(("SAVEPOINT", "SELECT")) for sql in during), during
    assert [e["data"] for e in events()] == [
        ticket_data(first, points=2),
        ticket_data(second, points=2),
    ]


@returns_rows()
def test_a_bulk_delete_where_the_database_returns_rows_sends_its_own_statement_alone(
    acme: Workspace, beta: Workspace, settings: Any
) -> None:
    settings.REALTIME_BULK_LIMIT = 2
    made = [*tickets(acme, 3), *tickets(beta, 2)]

    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        deleted = Ticket.objects.all().delete()
        during = [q["sql"] for q in queries.captured_queries]

    assert deleted == (5, {"testapp.Ticket": 5})
    touching = [sql for sql in during if "testapp_ticket" in sql]
    assert [sql.split()[0] for sql in touching] == ["DELETE"], during
    assert not any(sql.startswith(("SAVEPOINT", "SELECT")) for sql in during), during
    heard = events()
    detailed = [e["data"]["id"] for e in heard if e["data"] is not None]
    assert len(detailed) == 2
    assert all(e["event_type"] == "ticket.deleted" for e in heard)
    rest = {t.workspace_id for t in made if t.pk not in detailed and t.workspace_id is not None}
    assert [(e["scope_id"], e["meta"]) for e in heard if e["data"] is None] == [
        (scope, {"truncated": True}) for scope in sorted(rest)
    ]


def test_values_the_database_converts_are_announced_as_it_stores_them(acme: Workspace) -> None:
    company = Company.objects.create(workspace=acme, name="Initech")
    contact = Contact.objects.create(workspace=acme, name="Ann")
    forget_messages()

    Contact.objects.filter(pk=contact.pk).update(
        name="Bea", company=company, born="2024-05-06T07:08:09+02:00", score="1.5"
    )

    (event,) = events()
    stored = Contact.objects.get(pk=contact.pk)
    assert event["data"]["company"] == company.pk
    assert event["data"]["score"] == jsonable(stored.score)
    assert event["data"]["born"] == jsonable(stored.born)
    assert f"company:{company.pk}" in event["channels"]


def test_an_update_matching_nothing_announces_nothing(acme: Workspace) -> None:
    tickets(acme, 2)

    assert Ticket.objects.filter(title="nobody").update(points=1) == 0

    assert events() == []


def test_an_update_rolled_back_announces_nothing(acme: Workspace) -> None:
    tickets(acme, 2)

    def rolled_back() -> None:
        with transaction.atomic():
            Ticket.objects.update(points=7)
            raise RuntimeError

    with pytest.raises(RuntimeError):
        rolled_back()

    assert events() == []
    assert not Ticket.objects.filter(points=7).exists()


def test_an_update_in_a_transaction_is_announced_after_its_commit(acme: Workspace) -> None:
    (ticket,) = tickets(acme, 1)

    with transaction.atomic():
        Ticket.objects.update(points=3)
        assert events() == []
        ticket.refresh_from_db()
        ticket.title = "renamed"
        ticket.save(update_fields=["title"])

    # One row, two writes in one transaction: one event, the union of what changed.
    (event,) = events()
    assert event["data"] == ticket_data(ticket, title="renamed", points=3)
    assert event["meta"] == {"changed": ["points", "title"]}


def test_an_update_moving_rows_to_another_scope_leaves_one_and_enters_the_other(
    acme: Workspace, beta: Workspace
) -> None:
    first, second = tickets(acme, 2)

    Ticket.objects.filter(workspace=acme).update(workspace=beta)

    assert kinds() == [
        ("ticket.deleted", acme.pk, first.pk),
        ("ticket.created", beta.pk, first.pk),
        ("ticket.deleted", acme.pk, second.pk),
        ("ticket.created", beta.pk, second.pk),
    ]
    left = events()[0]
    assert left["data"] == {"model": "ticket", "id": first.pk}
    assert left["meta"] == {"moved": True}


def test_rows_moved_by_their_one_to_one_scope_key_leave_one_scope_and_enter_the_other(
    acme: Workspace, beta: Workspace
) -> None:
    charter = Charter.objects.create(workspace=acme, text="ours")
    forget_messages()

    Charter.objects.filter(pk=charter.pk).update(workspace=beta)
    charter.refresh_from_db()
    charter.workspace = acme
    charter.save()

    assert kinds() == [
        ("charter.deleted", acme.pk, charter.pk),
        ("charter.created", beta.pk, charter.pk),
        ("charter.deleted", beta.pk, charter.pk),
        ("charter.created", acme.pk, charter.pk),
    ]


def test_an_update_taking_rows_out_of_every_scope_tells_the_old_one(acme: Workspace) -> None:
    (ticket,) = tickets(acme, 1)

    Ticket.objects.update(workspace=None)

    assert kinds() == [("ticket.deleted", acme.pk, ticket.pk)]


def test_an_update_of_an_account_path_leaves_and_enters_accounts() -> None:
    ann = get_user_model().objects.create(username="ann")
    bob = get_user_model().objects.create(username="bob")
    note = Notification.objects.create(user=ann, text="hi")
    forget_messages()

    Notification.objects.filter(pk=note.pk).update(user=bob)

    heard = [(e["event_type"], e["user_ids"], e["data"]) for e in events("users")]
    assert heard == [
        ("notification.deleted", [ann.pk], {"model": "notification", "id": note.pk}),
        ("notification.created", [bob.pk], {"model": "notification", "id": note.pk, "text": "hi"}),
    ]


def test_an_update_of_a_one_to_one_account_key_leaves_and_enters_accounts() -> None:
    ann = get_user_model().objects.create(username="ann")
    bob = get_user_model().objects.create(username="bob")
    preference = Preference.objects.create(user=ann, theme="dark")
    forget_messages()

    Preference.objects.filter(pk=preference.pk).update(user=bob)

    heard = [(e["event_type"], e["user_ids"], e["data"]) for e in events("users")]
    assert heard == [
        ("preference.deleted", [ann.pk], {"model": "preference", "id": preference.pk}),
        (
            "preference.created",
            [bob.pk],
            {"model": "preference", "id": preference.pk, "theme": "dark"},
        ),
    ]


def test_an_update_of_a_guarded_column_tells_those_who_lose_sight(acme: Workspace) -> None:
    from tests.testapp.models import Membership

    ann = get_user_model().objects.create(username="ann")
    bob = get_user_model().objects.create(username="bob")
    for user in (ann, bob):
        Membership.objects.create(workspace=acme, user=user)
    note = PrivateNote.objects.create(workspace=acme, author=ann, title="t", public=True)
    forget_messages()

    PrivateNote.objects.update(public=False)

    heard = [(e["event_type"], e.get("only"), e["data"]) for e in events("scope")]
    assert heard == [
        ("private_note.deleted", [bob.pk], {"model": "private_note", "id": note.pk}),
        ("private_note.updated", [ann.pk], {"model": "private_note", "id": note.pk, "title": "t"}),
    ]


def test_an_update_of_an_undecorated_model_announces_nothing(acme: Workspace) -> None:
    Plain.objects.create(workspace=acme, name="p")
    forget_messages()

    Plain.objects.update(name="q")

    assert events() == []


def test_an_update_of_a_model_that_announces_no_updates_announces_nothing() -> None:
    from tests.testapp.models import WorkspaceView

    Workspace.objects.create(name="A", slug="a")
    forget_messages()

    assert WorkspaceView.objects.update(name="B") == 1

    assert [e["event_type"] for e in events()] == ["workspace_view.updated"]


# Every manager -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "manager",
    [
        "objects (from_queryset)",
        "as_manager",
        "open_tickets (get_queryset narrowed)",
        "everything (inherited)",
        "_base_manager",
        "_default_manager",
        "workspace.tickets (related)",
    ],
)
def test_an_update_through_any_manager_is_announced(acme: Workspace, manager: str) -> None:
    (ticket,) = tickets(acme, 1)
    name = manager.split(" ")[0]
    through: Any = acme.tickets if name == "workspace.tickets" else getattr(Ticket, name)

    assert through.filter(pk=ticket.pk).update(points=9) == 1

    assert kinds() == [("ticket.updated", acme.pk, ticket.pk)]


def test_a_custom_queryset_method_keeps_working_and_announces(acme: Workspace) -> None:
    first, second = tickets(acme, 2)
    Ticket.objects.filter(pk=second.pk).update(done=True)
    forget_messages()

    assert Ticket.objects.still_open().update(points=1) == 1

    assert kinds() == [("ticket.updated", acme.pk, first.pk)]


def test_adding_rows_to_a_reverse_foreign_key_moves_them(acme: Workspace, beta: Workspace) -> None:
    (ticket,) = tickets(acme, 1)

    beta.tickets.add(ticket)  # Django updates the rows with the base manager

    assert kinds() == [
        ("ticket.deleted", acme.pk, ticket.pk),
        ("ticket.created", beta.pk, ticket.pk),
    ]


# A queryset of the application's own deciding what its writes are ------------------------------

#: The managers of ``Draft``: realtime's queryset first among the bases of its class, last, and
#: the related manager Django derives from the default one (first).
DRAFTS = ["objects (realtime first)", "realtime_last", "workspace.drafts (related)"]


def drafts(workspace: Workspace, manager: str) -> Any:
    name = manager.split(" ")[0]
    return workspace.drafts if name == "workspace.drafts" else getattr(Draft, name)


def draft_events() -> list[tuple[str, Any, Any]]:
    """(event type, changed, data) of each published scope event, in order."""
    return [
        (e["event_type"], e["meta"].get("changed"), e["data"] and e["data"]["removed"])
        for e in events("scope")
    ]


@pytest.mark.parametrize("manager", DRAFTS)
def test_the_applications_own_delete_keeps_the_rows_and_announces_its_update(
    acme: Workspace, manager: str
) -> None:
    kept = Draft.objects.create(workspace=acme, name="a")
    forget_messages()

    assert drafts(acme, manager).filter(name="a").delete() == 1

    assert Draft.objects.get(pk=kept.pk).removed is True
    assert draft_events() == [("draft.updated", ["removed"], True)]


@pytest.mark.parametrize("manager", DRAFTS)
def test_the_applications_own_delete_taking_an_argument_deletes_and_announces(
    acme: Workspace, manager: str
) -> None:
    Draft.objects.create(workspace=acme, name="a")
    forget_messages()

    assert drafts(acme, manager).all().delete(hard=True) == (1, {"testapp.Draft": 1})

    assert not Draft.objects.exists()
    assert [kind for kind, _, _ in draft_events()] == ["draft.deleted"]


@pytest.mark.parametrize("manager", DRAFTS)
def test_an_update_taking_an_argument_of_the_applications_own_is_announced(
    acme: Workspace, manager: str
) -> None:
    Draft.objects.create(workspace=acme, name="a")
    forget_messages()

    assert drafts(acme, manager).all().update(name="b", reason="typo") == 1

    assert draft_events() == [("draft.updated", ["name"], False)]


@pytest.mark.parametrize("manager", DRAFTS[:2])
def test_a_bulk_create_taking_an_argument_of_the_applications_own_is_announced(
    acme: Workspace, manager: str
) -> None:
    made = drafts(acme, manager).bulk_create(
        [Draft(workspace=acme, name="a")], batch_size=10, removed=True
    )

    assert Draft.objects.get(pk=made[0].pk).removed is True
    assert draft_events() == [("draft.created", None, True)]


class ByAuthor(models.QuerySet[Any, Any]):
    """A ``bulk_create`` taking an argument of its own before Django's."""

    def bulk_create(self, objs: Any, author: str, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        return super().bulk_create(objs, *args, **kwargs)


class ByAuthorFirst(RealtimeQuerySet[Any, Any], ByAuthor):  # type: ignore[override]
    pass


@pytest.mark.usefixtures("quiet_preparation_failures")
def test_a_bulk_create_whose_arguments_cannot_be_told_inserts_and_logs_that_it_is_unannounced(
    acme: Workspace, caplog: pytest.LogCaptureFixture
) -> None:
    ByAuthorFirst(Draft).bulk_create([Draft(workspace=acme, name="a")], "ann", batch_size=5)

    assert Draft.objects.filter(name="a").exists()
    assert draft_events() == []
    (record,) = [r for r in caplog.records if r.levelname == "ERROR"]
    assert "ByAuthorFirst.bulk_create() do not bind" in str(record.exc_text)
    assert "class ByAuthorFirst(..., RealtimeQuerySet)" in str(record.exc_text)


def test_a_bulk_create_whose_arguments_cannot_be_told_fails_the_test_that_met_it(
    acme: Workspace,
) -> None:
    with pytest.raises(TypeError, match=r"ByAuthorFirst\.bulk_create\(\) do not bind"):
        ByAuthorFirst(Draft).bulk_create([Draft(workspace=acme, name="a")], "ann", batch_size=5)

    assert Draft.objects.filter(name="a").exists()


def test_a_proxy_updated_in_bulk_announces_as_its_model(acme: Workspace) -> None:
    from tests.testapp.models import VipContact

    contact = Contact.objects.create(workspace=acme, name="Ann")
    forget_messages()

    VipContact.objects.filter(pk=contact.pk).update(name="Bea")

    (event,) = events()
    assert event["event_type"] == "contact.updated"
    assert event["data"]["name"] == "Bea"


def dog(workspace: Workspace) -> Dog:
    made = Dog.objects.create(workspace=workspace, name="Rex", breed="lab")
    forget_messages()
    return made


def test_a_multi_table_child_moved_by_update_is_written_and_announced(
    acme: Workspace, beta: Workspace
) -> None:
    rex = dog(acme)

    # In autocommit: realtime's transaction around the move takes SQLite's write lock
    # with a statement of its own, which must name a column of the child's own table.
    assert Dog.objects.filter(pk=rex.pk).update(workspace=beta) == 1

    assert Dog.objects.get(pk=rex.pk).workspace == beta
    assert kinds() == [
        ("animal.deleted", acme.pk, rex.pk),
        ("animal.created", beta.pk, rex.pk),
    ]


@pytest.mark.parametrize(
    "values",
    [{"breed": "pug"}, {"name": "Max", "breed": "pug"}, {"name": "Max"}],
    ids=["own column", "own and parent's", "parent's column"],
)
def test_an_update_of_a_multi_table_child_is_announced_as_its_save_is(
    acme: Workspace, values: dict[str, Any]
) -> None:
    rex = dog(acme)
    for name, value in values.items():
        setattr(rex, name, value)
    rex.save()
    saved = events()
    with silent():
        Dog.objects.filter(pk=rex.pk).update(name="Rex", breed="lab")
    forget_messages()

    assert Dog.objects.filter(pk=rex.pk).update(**values) == 1

    assert saved[0]["event_type"] == "animal.updated"
    assert events() == saved


# bulk_create ---------------------------------------------------------------------------------


def test_bulk_create_announces_each_row_created(acme: Workspace) -> None:
    made = Ticket.objects.bulk_create(
        [Ticket(workspace=acme, title="a"), Ticket(workspace=acme, title="b", points=2)]
    )

    if connection.features.can_return_rows_from_bulk_insert:
        assert events() == [
            {
                "target": "scope",
                "scope_id": acme.pk,
                "event_type": "ticket.created",
                "data": ticket_data(ticket),
                "channels": ["ticket", f"ticket:{ticket.pk}"],
                "meta": {},
            }
            for ticket in made
        ]
    else:
        assert kinds() == [("ticket.created", acme.pk, None)]


def test_bulk_create_ignoring_conflicts_tells_each_scope_to_read_again(
    acme: Workspace, beta: Workspace
) -> None:
    tickets(acme, 1)

    Ticket.objects.bulk_create(
        [
            Ticket(workspace=acme, title="acme-0"),
            Ticket(workspace=beta, title="new"),
            Ticket(workspace=beta, title="newer"),
        ],
        ignore_conflicts=True,
    )

    folded = events()
    assert [(e["event_type"], e["scope_id"], e["data"]) for e in folded] == [
        ("ticket.created", acme.pk, None),
        ("ticket.created", beta.pk, None),
    ]
    assert all(e["meta"] == {"truncated": True} for e in folded)


def test_folded_scopes_are_announced_in_the_order_of_their_ids_not_their_text() -> None:
    nine = Workspace.objects.create(pk=9, name="Nine", slug="nine")
    ten = Workspace.objects.create(pk=10, name="Ten", slug="ten")
    forget_messages()

    Ticket.objects.bulk_create(
        [Ticket(workspace=ten, title="ten"), Ticket(workspace=nine, title="nine")],
        ignore_conflicts=True,
    )

    assert [e["scope_id"] for e in events()] == [9, 10]


@pytest.mark.skipif(
    "not __import__('django.db').db.connection.features.supports_update_conflicts",
    reason="needs update_conflicts",
)
def test_bulk_create_updating_conflicts_announces_updates(acme: Workspace) -> None:
    (ticket,) = tickets(acme, 1)
    target: dict[str, Any] = {"unique_fields": ["title"]}
    if not connection.features.supports_update_conflicts_with_target:
        target = {}  # MySQL and MariaDB update on any unique key

    Ticket.objects.bulk_create(
        [Ticket(workspace=acme, title=ticket.title, points=4)],
        update_conflicts=True,
        update_fields=["points"],
        **target,
    )

    (event,) = events()
    assert event["event_type"] == "ticket.updated"
    assert event["meta"] == {"changed": ["points"]}


@pytest.mark.skipif(
    "not __import__('django.db').db.connection.features.supports_update_conflicts",
    reason="needs update_conflicts",
)
def test_an_upsert_announces_the_row_as_stored_where_it_is_heard(
    acme: Workspace, beta: Workspace
) -> None:
    (ticket,) = tickets(acme, 1, done=True)
    target: dict[str, Any] = {"unique_fields": ["title"]}
    if not connection.features.supports_update_conflicts_with_target:
        target = {}  # MySQL and MariaDB update on any unique key
    stranger = Ticket(workspace=beta, title=ticket.title, points=7, done=False)

    Ticket.objects.bulk_create(
        [stranger], update_conflicts=True, update_fields=["points"], **target
    )

    heard = [(e["event_type"], e["scope_id"], e["data"]) for e in events()]
    assert heard == [("ticket.updated", acme.pk, ticket_data(ticket, points=7))]
    forget_messages()
    stranger.save()  # the object's own values, every column: the row moves to beta
    assert [(e["event_type"], e["scope_id"]) for e in events()] == [
        ("ticket.deleted", acme.pk),
        ("ticket.created", beta.pk),
    ]


@pytest.mark.skipif(
    "not __import__('django.db').db.connection.features.supports_update_conflicts_with_target",
    reason="needs update_conflicts with unique_fields",
)
def test_an_upsert_moving_a_row_tells_the_scope_it_left(acme: Workspace, beta: Workspace) -> None:
    (ticket,) = tickets(acme, 1)

    Ticket.objects.bulk_create(
        [Ticket(workspace=beta, title=ticket.title)],
        update_conflicts=True,
        unique_fields=["title"],
        update_fields=["workspace"],
    )

    assert [(e["event_type"], e["scope_id"]) for e in events()] == [
        ("ticket.deleted", acme.pk),
        ("ticket.created", beta.pk),
    ]


@pytest.mark.skipif(
    "not __import__('django.db').db.connection.features.supports_update_conflicts",
    reason="needs update_conflicts",
)
def test_an_upsert_announces_the_rows_it_inserted_as_created_and_those_there_as_updated(
    acme: Workspace,
) -> None:
    """Where the rows can be matched before the write (``unique_fields``), a row the upsert
    inserted is ``created`` (a client that applies ``updated`` only to rows it holds would
    never show it); without them (MySQL and MariaDB match on any unique key), the database
    does not tell which went in, and every row is ``updated``."""
    (there,) = tickets(acme, 1)
    target: dict[str, Any] = {"unique_fields": ["title"]}
    if not connection.features.supports_update_conflicts_with_target:
        target = {}

    Ticket.objects.bulk_create(
        [Ticket(workspace=acme, title=there.title, points=4), Ticket(workspace=acme, title="new")],
        update_conflicts=True,
        update_fields=["points"],
        **target,
    )

    heard = {e["data"]["title"]: (e["event_type"], e["meta"]) for e in events()}
    if target:
        assert heard == {
            "new": ("ticket.created", {}),
            there.title: ("ticket.updated", {"changed": ["points"]}),
        }
    else:
        assert {title: kind for title, (kind, _) in heard.items()} == {
            "new": "ticket.updated",
            there.title: "ticket.updated",
        }


def test_bulk_create_with_positional_batch_size_is_announced(acme: Workspace) -> None:
    Ticket.objects.bulk_create([Ticket(workspace=acme, title=f"t{i}") for i in range(3)], 2)

    assert {kind for kind, _, _ in kinds()} == {"ticket.created"}


# bulk_update ---------------------------------------------------------------------------------


def test_bulk_update_announces_the_objects_whose_fields_changed(acme: Workspace) -> None:
    first, second, third = tickets(acme, 3)
    first.points = 10
    second.title = "renamed"
    second.points = 0  # unchanged

    assert Ticket.objects.bulk_update([first, second, third], ["points", "title"]) == 3

    heard = [(e["data"]["id"], e["meta"]) for e in events()]
    assert heard == [
        (first.pk, {"changed": ["points"]}),
        (second.pk, {"changed": ["title"]}),
    ]


def test_bulk_update_of_objects_without_snapshot_lists_every_field(acme: Workspace) -> None:
    (ticket,) = tickets(acme, 1)
    stranger = Ticket(pk=ticket.pk, workspace=acme, title=ticket.title, points=3)

    Ticket.objects.bulk_update([stranger], ["points", "done"])

    (event,) = events()
    assert event["meta"] == {"changed": ["done", "points"]}


def test_bulk_update_moving_objects_leaves_and_enters(acme: Workspace, beta: Workspace) -> None:
    (ticket,) = tickets(acme, 1)
    ticket.workspace = beta

    Ticket.objects.bulk_update([ticket], ["workspace"])

    assert kinds() == [
        ("ticket.deleted", acme.pk, ticket.pk),
        ("ticket.created", beta.pk, ticket.pk),
    ]


def test_bulk_update_moving_objects_built_by_hand_reads_their_rows_together(
    acme: Workspace, beta: Workspace
) -> None:
    # Objects with no snapshot (built by hand, from iterator(), a cache): who could read each
    # row is read for all of them at once, not one statement per object.
    def moved(count: int, source: Workspace, target: Workspace) -> tuple[int, list[Any]]:
        made = tickets(source, count)
        strangers = [Ticket(pk=t.pk, workspace=target, title=t.title, points=0) for t in made]
        forget_messages()
        with CaptureQueriesContext(connection) as queries:
            Ticket.objects.bulk_update(strangers, ["workspace"])
        return len(queries.captured_queries), kinds()

    few, many = moved(2, acme, beta), moved(40, beta, acme)
    assert few[0] == many[0]
    assert len(many[1]) == 80
    assert {kind for kind, _, _ in many[1]} == {"ticket.deleted", "ticket.created"}


def test_bulk_update_announces_once_though_django_runs_updates_inside(acme: Workspace) -> None:
    made = tickets(acme, 4)
    for ticket in made:
        ticket.points = 1

    Ticket.objects.bulk_update(made, ["points"], batch_size=2)

    assert sorted(e["data"]["id"] for e in events()) == sorted(t.pk for t in made)


def test_a_partial_write_is_heard_where_the_row_is_not_where_its_object_says(
    acme: Workspace, beta: Workspace
) -> None:
    (saved, bulk) = tickets(acme, 2)
    for ticket in (saved, bulk):
        ticket.workspace = beta  # set, never written: the rows stay in acme
        ticket.title = f"acme's own {ticket.pk}"
    saved.save(update_fields=["title"])
    Ticket.objects.bulk_update([bulk], ["title"])
    hand_built = Ticket(pk=saved.pk, workspace=beta, title="by hand", points=0)
    hand_built.save(update_fields=["title"])

    heard = [(e["event_type"], e["scope_id"], e["data"]["title"]) for e in events()]
    assert heard == [
        ("ticket.updated", acme.pk, f"acme's own {saved.pk}"),
        ("ticket.updated", acme.pk, f"acme's own {bulk.pk}"),
        ("ticket.updated", acme.pk, "by hand"),
    ]


def test_a_partial_write_of_a_loaded_row_reads_its_scope_and_nothing_more(
    acme: Workspace,
) -> None:
    """The row's scope, left alone by the write, is read from the row (another process may
    have moved it since it was loaded): one ``SELECT`` of that column, besides the UPDATE."""
    (ticket,) = tickets(acme, 1)
    ticket = Ticket.objects.get(pk=ticket.pk)
    ticket.title = "renamed"
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        ticket.save(update_fields=["title"])
    statements = [q["sql"] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]
    update, read = statements
    assert update.startswith("UPDATE")
    assert read.startswith("SELECT")
    assert "workspace_id" in read
    assert "title" not in read


# The limit -----------------------------------------------------------------------------------


def test_a_bulk_update_moving_rows_past_the_limit_tells_the_scope_they_left(
    acme: Workspace, beta: Workspace, settings: Any
) -> None:
    settings.REALTIME_BULK_LIMIT = 1
    made = tickets(acme, 3)
    for ticket in made:
        ticket.workspace = beta

    Ticket.objects.bulk_update(made, ["workspace"])

    folded = [(e["scope_id"], e["meta"].get("truncated")) for e in events() if e["data"] is None]
    assert sorted(folded) == sorted([(acme.pk, True), (beta.pk, True)])


def test_a_delete_through_a_to_many_filter_counts_each_row_once_against_the_limit(
    acme: Workspace, settings: Any
) -> None:
    from tests.testapp.models import Membership

    settings.REALTIME_BULK_LIMIT = 3
    ann = get_user_model().objects.create(username="ann")
    Membership.objects.create(workspace=acme, user=ann)
    notes = [
        PrivateNote.objects.create(workspace=acme, author=ann, title=f"n{n}", public=True)
        for n in range(3)
    ]
    forget_messages()

    # Each note matches once per public note of its workspace: three times.
    PrivateNote.objects.filter(workspace__privatenote__public=True).delete()

    heard = [(e["event_type"], e["data"]["id"], e["meta"].get("truncated")) for e in events()]
    assert heard == [("private_note.deleted", note.pk, None) for note in notes]


def committing_before_the_delete(make: Any, verb: str = "DELETE") -> Any:
    """A statement wrapper that, right before the first ``DELETE`` (``verb``; on SQLite,
    before the ``BEGIN IMMEDIATE`` that takes the write lock for it), has another connection
    (another thread's) make and commit a write with ``make()``."""
    made: list[Any] = []

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if not made and sql.lstrip().upper().startswith((verb, "BEGIN")):
            other = threading.Thread(target=made_and_closed, args=(make, made))
            other.start()
            other.join(10)
        return execute(sql, params, many, context)

    return wrapper, made


def made_and_closed(make: Any, made: list[Any]) -> None:
    try:
        made.append(make())
    finally:
        connection.close()  # this thread's


@pytest.mark.parametrize("atomic", [False, True])
def test_a_row_committed_between_a_bulk_deletes_read_and_its_statement_is_not_deleted_unheard(
    acme: Workspace, atomic: bool
) -> None:
    """A guarded model's rows are read before the one-statement delete (their readers); a row
    another transaction commits in between is left, as if it came just after the delete,
    rather than deleted with nobody told."""
    if atomic and connection.vendor == "sqlite":
        pytest.skip("SQLite refuses a write after another connection's commit in a transaction")
    ann = get_user_model().objects.create(username="ann")
    Membership.objects.create(workspace=acme, user=ann)
    PrivateNote.objects.create(workspace=acme, author=ann, title="old")
    forget_messages()
    wrapper, made = committing_before_the_delete(
        lambda: PrivateNote.objects.create(workspace=acme, author=ann, title="new")
    )
    with connection.execute_wrapper(wrapper), transaction.atomic() if atomic else nullcontext():
        count, _ = PrivateNote.objects.filter(workspace=acme).delete()

    assert made
    assert count == 1
    heard = [(e["event_type"], e["data"]["title"]) for e in events()]
    assert heard == [("private_note.created", "new"), ("private_note.deleted", "old")]
    assert list(PrivateNote.objects.values_list("title", flat=True)) == ["new"]


@pytest.mark.parametrize("atomic", [False, True])
def test_a_row_another_transaction_takes_out_of_a_bulk_deletes_filter_is_not_told_deleted(
    acme: Workspace, atomic: bool
) -> None:
    """A row read before the one-statement delete, that another transaction changes so that
    it no longer matches before the statement reaches it, stays: nobody is told it was
    deleted (its readers would drop a row that is there)."""
    if atomic and connection.vendor == "sqlite":
        pytest.skip("SQLite refuses a write after another connection's commit in a transaction")
    ann = get_user_model().objects.create(username="ann")
    Membership.objects.create(workspace=acme, user=ann)
    gone, kept = (PrivateNote.objects.create(workspace=acme, author=ann, title="a") for _ in "ab")
    forget_messages()

    def retitle() -> bool:
        with silent():
            return bool(PrivateNote.objects.filter(pk=kept.pk).update(title="b"))

    wrapper, made = committing_before_the_delete(retitle)
    with connection.execute_wrapper(wrapper), transaction.atomic() if atomic else nullcontext():
        count, _ = PrivateNote.objects.filter(title="a").delete()

    assert made
    assert count == 1
    assert [(e["event_type"], e["data"]["id"]) for e in events()] == [
        ("private_note.deleted", gone.pk)
    ]
    assert list(PrivateNote.objects.values_list("pk", "title")) == [(kept.pk, "b")]


@pytest.mark.parametrize("atomic", [False, True])
def test_an_update_racing_another_transaction_never_tells_a_row_with_values_it_does_not_hold(
    acme: Workspace, atomic: bool
) -> None:
    """An ``update()`` whose rows are read before its statement (MySQL and MariaDB: no
    ``RETURNING``): a row read that another transaction takes out of its filter before the
    statement reaches it is not written. Whatever is told of it is what it holds, never the
    values the update wrote to the others."""
    if atomic and connection.vendor == "sqlite":
        pytest.skip("SQLite refuses a write after another connection's commit in a transaction")
    ann = get_user_model().objects.create(username="ann")
    Membership.objects.create(workspace=acme, user=ann)
    written, other = (
        PrivateNote.objects.create(workspace=acme, author=ann, title="a") for _ in "ab"
    )
    forget_messages()

    def retitle() -> bool:
        with silent():
            return bool(PrivateNote.objects.filter(pk=other.pk).update(title="b"))

    wrapper, made = committing_before_the_delete(retitle, verb="UPDATE")
    with connection.execute_wrapper(wrapper), transaction.atomic() if atomic else nullcontext():
        count = PrivateNote.objects.filter(title="a").update(title="retitled")

    assert made
    assert count == 1
    stored = dict(PrivateNote.objects.values_list("pk", "title"))
    assert stored == {written.pk: "retitled", other.pk: "b"}
    told = [(e["data"]["id"], e["data"]["title"]) for e in events()]
    assert (written.pk, "retitled") in told
    assert all(stored[pk] == title for pk, title in told)


def holding_a_row_lock(model: type[models.Model], pk: Any) -> Any:
    """Another connection (another thread's) holding ``FOR UPDATE`` on the row ``pk`` until
    the returned event is set."""
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                list(model._default_manager.select_for_update().filter(pk=pk).values("pk"))
                locked.set()
                release.wait(30)
        finally:
            connection.close()  # this thread's

    holder = threading.Thread(target=hold)
    holder.start()
    assert locked.wait(10)
    return holder, release


def short_lock_waits(seconds: int = 2) -> None:
    """A statement waiting for a row lock fails after ``seconds``, in this transaction."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"SET LOCAL lock_timeout = '{seconds}s'")
        else:
            cursor.execute(f"SET SESSION innodb_lock_wait_timeout = {seconds}")


@pytest.mark.parametrize("moving", [False, True])
def test_select_for_update_skip_locked_writes_and_tells_only_the_rows_it_could_lock(
    acme: Workspace, beta: Workspace, moving: bool
) -> None:
    """``select_for_update(skip_locked=True).update()`` leaves out the rows another
    transaction holds, as Django does: realtime's own lock of the rows skips them too
    (it neither waits for them nor writes them), and only the rows written are told."""
    if not connection.features.has_select_for_update_skip_locked:
        pytest.skip("the database has no SKIP LOCKED")
    company = Company.objects.create(workspace=acme, name="Initech")
    held, free = (Contact.objects.create(workspace=acme, company=company) for _ in "ab")
    forget_messages()
    holder, release = holding_a_row_lock(Contact, held.pk)
    try:
        with transaction.atomic():
            short_lock_waits()
            rows = Contact.objects.select_for_update(skip_locked=True)
            values: dict[str, Any] = {"workspace": beta} if moving else {"name": "edited"}
            count = rows.filter(company__name="Initech").update(**values)
    finally:
        release.set()
        holder.join(10)

    assert count == 1
    assert {e["data"]["id"] for e in events() if e["data"]} == {free.pk}
    stored = dict(Contact.objects.values_list("pk", "workspace"))
    assert stored == {held.pk: acme.pk, free.pk: beta.pk if moving else acme.pk}


@pytest.mark.parametrize("moving", [False, True])
def test_select_for_update_nowait_fails_as_djangos_own_when_a_row_is_held(
    acme: Workspace, beta: Workspace, moving: bool
) -> None:
    """``select_for_update(nowait=True).update()`` of rows another transaction holds fails at
    once with the database's error, as Django's own does: nothing written, nothing told."""
    if not connection.features.has_select_for_update_nowait:
        pytest.skip("the database has no NOWAIT")
    company = Company.objects.create(workspace=acme, name="Initech")
    held, _ = (Contact.objects.create(workspace=acme, company=company) for _ in "ab")
    forget_messages()
    holder, release = holding_a_row_lock(Contact, held.pk)
    try:
        values: dict[str, Any] = {"workspace": beta} if moving else {"name": "edited"}

        def write() -> None:
            with transaction.atomic():
                short_lock_waits(10)
                rows = Contact.objects.select_for_update(nowait=True)
                rows.filter(company__name="Initech").update(**values)

        started = time.monotonic()
        with pytest.raises(DatabaseError):
            write()
        # Refused at once, not after waiting for the lock (10 s: realtime's own lock waited).
        assert time.monotonic() - started < 5
    finally:
        release.set()
        holder.join(10)

    assert events() == []
    assert set(Contact.objects.values_list("workspace", "name")) == {(acme.pk, "")}


def test_past_the_limit_a_row_committed_meanwhile_goes_only_in_a_scope_told_to_read_again(
    acme: Workspace, beta: Workspace, settings: Any
) -> None:
    settings.REALTIME_BULK_LIMIT = 1
    ann = get_user_model().objects.create(username="ann")
    Membership.objects.create(workspace=acme, user=ann)
    for title in ("n1", "n2"):
        PrivateNote.objects.create(workspace=acme, author=ann, title=title)
    forget_messages()

    def make() -> list[PrivateNote]:
        return [
            PrivateNote.objects.create(workspace=workspace, author=ann, title="n3")
            for workspace in (acme, beta)
        ]

    wrapper, _ = committing_before_the_delete(make)
    with connection.execute_wrapper(wrapper):
        count, _ = PrivateNote.objects.filter(title__startswith="n").delete()

    assert count == 3  # n1, n2 and acme's n3, whose scope hears a truncated event
    deleted = [e for e in events() if e["event_type"] == "private_note.deleted"]
    assert [(e["scope_id"], e["meta"].get("truncated")) for e in deleted] == [
        (acme.pk, None),
        (acme.pk, True),
    ]
    assert list(PrivateNote.objects.values_list("workspace", "title")) == [(beta.pk, "n3")]


def test_past_the_bulk_limit_the_rest_folds_into_one_event_per_scope(
    acme: Workspace, beta: Workspace, settings: Any
) -> None:
    settings.REALTIME_BULK_LIMIT = 2
    made = {ticket.pk: ticket for ticket in [*tickets(acme, 3), *tickets(beta, 2)]}

    Ticket.objects.update(points=1)

    heard = events()
    assert [e["event_type"] for e in heard] == ["ticket.updated"] * len(heard)
    detailed = [e["data"] for e in heard[:2]]
    assert detailed == [ticket_data(made[data["id"]], points=1) for data in detailed]
    rest = sorted(
        {
            t.workspace_id
            for pk, t in made.items()
            if pk not in [d["id"] for d in detailed] and t.workspace_id is not None
        }
    )
    assert [(e["scope_id"], e["data"], e["meta"]) for e in heard[2:]] == [
        (scope, None, {"truncated": True}) for scope in rest
    ]


def test_past_the_limit_rows_moved_fold_into_both_scopes(
    acme: Workspace, beta: Workspace, settings: Any
) -> None:
    settings.REALTIME_BULK_LIMIT = 1
    tickets(acme, 3)

    Ticket.objects.update(workspace=beta)

    folded = [(e["scope_id"], e["meta"]) for e in events() if e["data"] is None]
    assert folded == [(acme.pk, {"truncated": True}), (beta.pk, {"truncated": True})]


def test_past_the_limit_bulk_create_folds_the_rest(acme: Workspace, settings: Any) -> None:
    settings.REALTIME_BULK_LIMIT = 1

    Ticket.objects.bulk_create([Ticket(workspace=acme, title=f"t{i}") for i in range(3)])

    assert [(kind, scope) for kind, scope, _ in kinds()][-1] == ("ticket.created", acme.pk)
    assert events()[-1]["meta"] == {"truncated": True}


@pytest.mark.parametrize("write", ["update", "delete"])
def test_account_models_past_the_limit_fold_into_one_event_to_their_accounts(
    settings: Any, write: str
) -> None:
    settings.REALTIME_BULK_LIMIT = 1
    ann = get_user_model().objects.create(username="ann")
    bob = get_user_model().objects.create(username="bob")
    for user in (ann, bob, bob):
        Notification.objects.create(user=user, text="x")
    forget_messages()

    if write == "update":
        Notification.objects.update(text="y")
    else:  # on PostgreSQL and SQLite, one statement that returns the rows it deleted
        Notification.objects.all().delete()

    heard = events("users")
    assert [message["data"] is None for message in heard] == [False, True]
    assert heard[1]["user_ids"] == [bob.pk]
    assert heard[1]["meta"] == {"truncated": True}


# Statements ----------------------------------------------------------------------------------


def statements(run: Any) -> int:
    """The statements ``run`` sends in its transaction (the publication after commit, one
    INSERT per slice of messages, left out)."""
    with transaction.atomic(), CaptureQueriesContext(connection) as captured:
        run()
    return len(captured.captured_queries)


@pytest.mark.parametrize("write", ["update", "move", "bulk_create", "bulk_update"])
def test_a_bulk_write_costs_the_same_statements_for_10_rows_as_for_300(
    acme: Workspace, beta: Workspace, write: str, settings: Any
) -> None:
    settings.REALTIME_TRANSPORT = "table"

    def run(count: int, tag: str) -> int:
        """The statements realtime adds to the write of ``count`` rows."""
        added = 0
        for quiet in (False, True):
            made = tickets(acme, count) if write != "bulk_create" else []

            def bulk(made: list[Ticket] = made) -> None:
                if write == "update":
                    Ticket.objects.filter(workspace=acme).update(points=F("points") + 1)
                elif write == "move":
                    Ticket.objects.filter(workspace=acme).update(workspace=beta)
                elif write == "bulk_create":
                    Ticket.objects.bulk_create(
                        [Ticket(workspace=acme, title=f"{tag}{i}") for i in range(count)]
                    )
                else:
                    for ticket in made:
                        ticket.points += 1
                    Ticket.objects.bulk_update(made, ["points"], batch_size=1000)

            with silent() if quiet else contextlib.nullcontext():
                used = statements(bulk)
            added += -used if quiet else used
            Ticket.objects.all().delete()
        return added

    assert run(10, "a") == run(300, "b")


def test_a_guarded_bulk_delete_costs_the_same_statements_for_3_rows_as_for_30(
    acme: Workspace, make_user: Any
) -> None:
    """The readers of a guarded model's rows a delete removes are asked for the rows of a
    scope together: the statements do not grow with the rows."""
    for name in ("ann", "bob"):
        make_user(name, member_of=acme)
    ann = get_user_model().objects.get(username="ann")

    def run(count: int) -> int:
        for number in range(count):
            PrivateNote.objects.create(workspace=acme, author=ann, title=f"n{number}")
        forget_messages()
        used = statements(lambda: PrivateNote.objects.filter(workspace=acme).delete())
        assert len(events()) == count
        return used

    assert run(3) == run(30)


@pytest.mark.parametrize("write", ["update", "bulk_create", "delete"])
def test_a_bulk_write_along_an_account_path_costs_the_same_statements_for_3_rows_as_for_30(
    write: str,
) -> None:
    """Each row's accounts along ``thread.members`` are read for all the rows together."""
    from tests.testapp.models import Message, Thread

    thread = Thread.objects.create(title="t")
    thread.members.set([get_user_model().objects.create(username=name) for name in "ab"])

    def run(count: int) -> int:
        made = [Message(thread=thread, text=f"m{n}") for n in range(count)]
        if write != "bulk_create":
            Message.objects.bulk_create(made)
        forget_messages()

        def bulk() -> None:
            if write == "update":
                Message.objects.update(text="again")
            elif write == "bulk_create":
                Message.objects.bulk_create(made)
            else:
                Message.objects.all().delete()

        used = statements(bulk)
        assert [m["user_ids"] for m in events("users")] == [
            sorted(thread.members.values_list("pk", flat=True))
        ] * count
        Message.objects.all().delete()
        return used

    assert run(3) == run(30)


@pytest.mark.parametrize("moving", [False, True])
def test_an_update_of_rows_sharing_a_root_asks_its_outside_readers_once(
    acme: Workspace, beta: Workspace, make_user: Any, moving: bool
) -> None:
    """The readers of a shared root outside the scope (its load, the ``shared_readers``
    hook, the scope's members) are asked once for the rows of a write that share it, before
    the write (a move) and after: the statements, publication included, do not grow with
    the rows."""
    from tests.testapp.models import Project, Task

    make_user("bee", member_of=beta)
    project = Project.objects.create(workspace=acme, name="P")
    project.shared_with.add(beta)
    gamma = Workspace.objects.create(name="Gamma", slug="gamma")

    def run(count: int) -> int:
        for number in range(count):
            Task.objects.create(workspace=acme, project=project, title=f"t{number}")
        forget_messages()
        with CaptureQueriesContext(connection) as captured, transaction.atomic():
            if moving:
                Task.objects.filter(workspace=acme).update(workspace=gamma)
            else:
                Task.objects.filter(workspace=acme).update(title="again")
        assert len(events("users")) == count
        Task.objects.all().delete()
        return len(captured.captured_queries)

    assert run(3) == run(30)


# silent() and the async forms ----------------------------------------------------------------


def test_silent_turns_bulk_announcements_off_but_not_saves(acme: Workspace) -> None:
    ticket, doomed, deleted_loudly = tickets(acme, 3)

    with silent():
        Ticket.objects.update(points=2)
        Ticket.objects.bulk_create([Ticket(workspace=acme, title="quiet")])
        ticket.points = 3
        Ticket.objects.bulk_update([ticket], ["points"])
        Ticket.objects.filter(pk=doomed.pk).delete()
        Company.objects.create(workspace=acme, name="loud")
        deleted_loudly.delete()

    assert [e["event_type"] for e in events()] == ["company.created", "ticket.deleted"]


def test_silent_quiets_what_a_queryset_delete_cascades_to_but_not_an_instance_delete(
    acme: Workspace,
) -> None:
    # Rows the database deletes (cascade=[...]), rows set to NULL, and the accounts a
    # membership row deleted by Django's cascade leaves: each is part of the QuerySet.delete().
    ann = get_user_model().objects.create(username="ann")
    quiet, loud = (Contact.objects.create(workspace=acme, name=name) for name in ("q", "l"))
    Attachment.objects.create(workspace=acme, contact=quiet, name="quiet")
    heard = Attachment.objects.create(workspace=acme, contact=loud, name="loud")
    vendor = Vendor.objects.create(workspace=acme, name="v")
    Lead.objects.create(workspace=acme, vendor=vendor, name="l")
    chat = Chat.objects.create(title="c")
    Seat.objects.create(chat=chat, user=ann)
    ChatLine.objects.create(chat=chat, text="line")
    loud_pk = loud.pk
    forget_messages()

    with silent():
        Contact.objects.filter(pk=quiet.pk).delete()
        Vendor.objects.filter(pk=vendor.pk).delete()
        Chat.objects.filter(pk=chat.pk).delete()
        loud.delete()

    told = sorted((e["event_type"], (e["data"] or {}).get("id")) for e in events())
    assert told == [("attachment.deleted", heard.pk), ("contact.deleted", loud_pk)]


def test_a_silent_queryset_delete_is_one_statement_where_django_makes_it_one(
    acme: Workspace,
) -> None:
    def statements(model: type[models.Model]) -> int:
        model._default_manager.bulk_create([model(workspace=acme, name=f"{n}") for n in range(300)])
        forget_messages()
        with silent(), CaptureQueriesContext(connection) as queries:
            model._default_manager.filter(workspace=acme).delete()
        assert not model._default_manager.filter(workspace=acme).exists()
        return len(queries.captured_queries)

    assert statements(Twin) == statements(Plain)
    assert events() == []


def test_silent_leaves_the_links_a_decorated_models_manager_changes_announced(
    acme: Workspace,
) -> None:
    # add()/remove() send m2m_changed, as save() sends post_save: silent() keeps quiet the
    # bulk writes of the link table alone, not its related managers'.
    ann, bob = (get_user_model().objects.create(username=name) for name in ("ann", "bob"))
    Membership.objects.create(workspace=acme, user=ann)  # the board's guard narrows them
    room = Room.objects.create(name="r")
    board = Board.objects.create(workspace=acme, name="b")
    forget_messages()

    with silent():
        room.participants.add(bob)
        board.members.add(ann)
        Room.participants.through.objects.bulk_create(
            [Room.participants.through(room=room, user=ann)]
        )
        board.members.remove(ann)

    told = [(e["event_type"], e.get("user_ids")) for e in events()]
    assert ("room.created", [bob.pk]) in told
    assert [t for t, _ in told if t.startswith("board.")] == ["board.created", "board.deleted"]
    assert ("room.created", [ann.pk]) not in told  # the link table's own bulk write


def test_the_async_forms_announce_as_the_sync_ones(acme: Workspace) -> None:
    (ticket,) = tickets(acme, 1)

    async def writes() -> None:
        await Ticket.objects.filter(pk=ticket.pk).aupdate(points=5)
        await Ticket.objects.abulk_create([Ticket(workspace=acme, title="async")])
        ticket.points = 6
        await Ticket.objects.abulk_update([ticket], ["points"])

    async_to_sync(writes)()

    assert [kind for kind, _, _ in kinds()] == [
        "ticket.updated",
        "ticket.created",
        "ticket.updated",
    ]


def test_every_async_form_announces_as_its_sync_form(acme: Workspace) -> None:
    async def writes() -> None:
        ticket = await Ticket.objects.acreate(workspace=acme, title="a")
        ticket.points = 1
        await ticket.asave()
        await Ticket.objects.aget_or_create(title="b", defaults={"workspace": acme})
        await Ticket.objects.aupdate_or_create(title="b", defaults={"points": 2})
        await ticket.adelete()

    async_to_sync(writes)()

    assert [(e["event_type"], e["data"]["title"]) for e in events()] == [
        ("ticket.created", "a"),
        ("ticket.updated", "a"),
        ("ticket.created", "b"),
        ("ticket.updated", "b"),
        ("ticket.deleted", "a"),
    ]


@pytest.mark.parametrize("write", ["guarded", "account"])
def test_a_bulk_move_of_guarded_or_account_rows_costs_the_same_for_10_rows_as_for_300(
    acme: Workspace, write: str
) -> None:
    from tests.testapp.models import Membership

    ann = get_user_model().objects.create(username="ann")
    bob = get_user_model().objects.create(username="bob")
    for user in (ann, bob):
        Membership.objects.create(workspace=acme, user=user)

    def run(count: int) -> int:
        added = 0
        for quiet in (False, True):
            if write == "guarded":
                PrivateNote.objects.bulk_create(
                    PrivateNote(workspace=acme, author=ann, title=f"n{n}") for n in range(count)
                )
                rows: Any = PrivateNote.objects.all()
                values: dict[str, Any] = {"public": True}
            else:
                Notification.objects.bulk_create(
                    Notification(user=ann, text=f"n{n}") for n in range(count)
                )
                rows, values = Notification.objects.all(), {"user": bob}
            with silent() if quiet else contextlib.nullcontext():
                used = statements(functools.partial(rows.update, **values))
            added += -used if quiet else used
            rows.model.objects.all().delete()
        return added

    assert run(10) == run(300)


def test_to_many_channels_of_a_bulk_update_are_read_for_all_rows_at_once(
    acme: Workspace,
) -> None:
    from tests.testapp.models import Tag

    tag = Tag.objects.create(workspace=acme, name="vip")

    def run(count: int) -> int:
        added = 0
        for quiet in (False, True):
            contacts = Contact.objects.bulk_create(
                Contact(workspace=acme, name=f"c{n}") for n in range(count)
            )
            for contact in contacts[:3]:
                contact.tags.add(tag)
            forget_messages()
            rows = Contact.objects.filter(workspace=acme)
            with silent() if quiet else contextlib.nullcontext():
                used = statements(functools.partial(rows.update, name="renamed"))
            if not quiet:
                channels = {e["data"]["id"]: e["channels"] for e in events()}
                assert channels[contacts[0].pk][-1] == f"tag:{tag.pk}"
                assert channels[contacts[-1].pk] == ["contact", f"contact:{contacts[-1].pk}"]
            added += -used if quiet else used
            Contact.objects.all().delete()
        return added

    assert run(10) == run(300)


# Objects loaded with only() or defer() --------------------------------------------------------


def test_bulk_update_of_deferred_objects_announces_their_rows_with_one_read(
    acme: Workspace,
) -> None:
    for n in range(20):
        Ticket.objects.create(workspace=acme, title=f"t{n}", done=bool(n % 2))
    loaded = list(Ticket.objects.only("id", "points").order_by("pk"))
    for obj in loaded:
        obj.points = 5
    forget_messages()
    with CaptureQueriesContext(connection) as queries:
        Ticket.objects.bulk_update(loaded, ["points"])
    table = Ticket._meta.db_table
    selects = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].startswith("SELECT") and table in q["sql"]  # not MySQL's publish lock
    ]
    assert len(selects) == 1  # the columns the events carry, of every object at once
    sent = sorted(events(), key=lambda message: message["data"]["id"])
    assert [(m["data"]["title"], m["data"]["done"], m["data"]["points"]) for m in sent] == [
        (f"t{n}", bool(n % 2), 5) for n in range(20)
    ]
    assert all(obj.get_deferred_fields() == {"title", "done", "workspace_id"} for obj in loaded)


@pytest.mark.parametrize("shape", ["guarded", "to-many"])
def test_a_deferred_querysets_delete_announces_the_rows_as_they_were(
    acme: Workspace, shape: str
) -> None:
    """Whatever the caller's ``only()`` left out, the events carry the rows as they were:
    where realtime reads the rows before they go (a guard's readers), it reads them whole,
    in as many statements as for rows loaded whole; where Django collects them one by one
    (a to-many relation), each row's missing columns cost one read."""
    ann = get_user_model().objects.create_user(username="ann")
    model: Any = PrivateNote if shape == "guarded" else Contact

    def rows(workspace: Workspace, prefix: str) -> Any:
        Membership.objects.create(workspace=workspace, user=ann)
        for n in range(20):
            if shape == "guarded":
                PrivateNote.objects.create(
                    workspace=workspace, author=ann, title=f"{prefix}{n}", public=True
                )
            else:
                Contact.objects.create(workspace=workspace, name=f"{prefix}{n}")
        return model.objects.filter(workspace=workspace)

    def delete(doomed: Any) -> tuple[int, list[str]]:
        forget_messages()
        with CaptureQueriesContext(connection) as queries:
            doomed.delete()
        said = sorted(
            m["data"].get("title") or m["data"].get("name")
            for m in events()
            if m["event_type"].endswith(".deleted")
        )
        return sum(q["sql"].startswith("SELECT") for q in queries.captured_queries), said

    whole = delete(rows(acme, "w"))
    globex = Workspace.objects.create(name="Globex", slug="globex")
    deferred = delete(rows(globex, "d").only("id"))
    assert whole[1] == sorted(f"w{n}" for n in range(20))
    assert deferred[1] == sorted(f"d{n}" for n in range(20))
    if shape == "guarded":  # read by realtime before the delete: whole, at once
        assert deferred[0] == whole[0]
    else:  # collected by Django row by row (its signals): one read per row (limits.md)
        assert deferred[0] == whole[0] + 20
