"""Rows that enter or leave a reader's view are announced to that reader: the messages an
update publishes when it changes who may read the row, and what it costs."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from realtime import logs, silent
from realtime.auth import RealtimeAuth
from realtime.registry import options_for
from tests.helpers import events, forget_messages
from tests.testapp.models import (
    Board,
    Company,
    Contact,
    GuardedTask,
    Message,
    Notification,
    PrivateNote,
    Project,
    Task,
    Thread,
    Workspace,
    may_read_note,
)

pytestmark = pytest.mark.django_db(transaction=True)

MakeUser = Callable[..., Any]


def summary() -> list[tuple[Any, ...]]:
    """(event type, scope or accounts, data, moved) of each message published."""
    out = []
    for m in events():
        whom = m.get("scope_id") if m["target"] == "scope" else tuple(m["user_ids"])
        only = tuple(m["only"]) if "only" in m else None
        out.append((m["event_type"], whom, only, m["data"], m["meta"].get("moved", False)))
    return out


def identity(model: str, pk: Any) -> dict[str, Any]:
    return {"model": model, "id": pk}


# Scope moves ---------------------------------------------------------------------------------


def test_a_row_moved_to_another_scope_leaves_the_old_one_and_enters_the_new(
    workspace: Workspace,
) -> None:
    other = Workspace.objects.create(name="Beta", slug="beta")
    company = Company.objects.create(workspace=workspace, name="Old co")
    contact = Contact.objects.create(workspace=workspace, name="Ann", company=company)
    forget_messages()
    contact.workspace = other
    contact.company = None
    contact.save()
    left, entered = events()
    assert left["event_type"] == "contact.deleted"
    assert left["scope_id"] == workspace.pk
    # The leave frame carries no declared field, and reaches the channels the row was on.
    assert left["data"] == identity("contact", contact.pk)
    assert left["meta"] == {"moved": True}
    assert left["channels"] == ["contact", f"contact:{contact.pk}", f"company:{company.pk}"]
    assert entered["event_type"] == "contact.created"
    assert entered["scope_id"] == other.pk
    assert entered["data"]["name"] == "Ann"
    assert entered["meta"] == {"moved": True}
    assert "changed" not in entered["meta"]


def test_a_row_created_and_moved_in_one_transaction_is_one_create_in_its_final_scope(
    workspace: Workspace,
) -> None:
    other = Workspace.objects.create(name="Beta", slug="beta")
    forget_messages()
    with transaction.atomic():
        contact = Contact.objects.create(workspace=workspace, name="Ann")
        contact.workspace = other
        contact.save()
    assert summary() == [
        ("contact.created", other.pk, None, events()[0]["data"], False),
    ]


def test_a_row_moved_and_moved_back_in_one_transaction_is_one_update(
    workspace: Workspace,
) -> None:
    other = Workspace.objects.create(name="Beta", slug="beta")
    contact = Contact.objects.create(workspace=workspace, name="Ann")
    forget_messages()
    with transaction.atomic():
        contact.workspace = other
        contact.save()
        contact.workspace = workspace
        contact.name = "Ann B."
        contact.save()
    (updated,) = events()
    assert updated["event_type"] == "contact.updated"
    assert updated["scope_id"] == workspace.pk
    assert updated["meta"] == {"changed": ["name", "workspace"]}


def in_another_thread(write: Callable[[], Any]) -> None:
    """Run ``write`` on another thread's connection, as another process would: what this
    thread knows of the rows it writes is not told."""
    done: list[Any] = []

    def run() -> None:
        try:
            with silent():
                done.append(write())
        finally:
            connection.close()  # this thread's

    other = threading.Thread(target=run)
    other.start()
    other.join(10)
    assert done


@pytest.mark.parametrize("partial", [True, False])
def test_a_save_of_a_row_another_process_moved_is_told_where_the_row_is(
    workspace: Workspace, partial: bool
) -> None:
    """A partial save leaves the row's scope as it is stored: its event goes where the row
    is, not where the instance was loaded (whose readers may no longer read it)."""
    beta = Workspace.objects.create(name="Beta", slug="beta")
    contact = Contact.objects.create(workspace=workspace, name="Ann")
    in_another_thread(lambda: Contact.objects.filter(pk=contact.pk).update(workspace=beta))
    forget_messages()
    contact.name = "Ann B."
    contact.save(update_fields=["name"] if partial else None)
    # A full save writes the instance's scope back: the row is where the instance says.
    where = beta.pk if partial else workspace.pk
    assert [(e["event_type"], e["scope_id"]) for e in events() if e["data"].get("name")] == [
        ("contact.updated", where)
    ]


def test_a_partial_save_of_a_row_another_process_gave_to_another_account_is_told_to_it(
    make_user: MakeUser,
) -> None:
    ann, bob = make_user("ann"), make_user("bob")
    note = Notification.objects.create(user=ann, text="for ann")
    in_another_thread(lambda: Notification.objects.filter(pk=note.pk).update(user=bob))
    forget_messages()
    note.text = "for bob only"
    note.save(update_fields=["text"])
    assert [(e["event_type"], e["user_ids"]) for e in events()] == [
        ("notification.updated", [bob.pk])
    ]


def test_a_delete_of_a_row_another_process_moved_is_told_where_the_row_was(
    workspace: Workspace,
) -> None:
    beta = Workspace.objects.create(name="Beta", slug="beta")
    contact = Contact.objects.create(workspace=workspace, name="Ann")
    in_another_thread(lambda: Contact.objects.filter(pk=contact.pk).update(workspace=beta))
    forget_messages()
    contact.delete()
    assert [(e["event_type"], e["scope_id"]) for e in events()] == [("contact.deleted", beta.pk)]


def test_a_move_that_rolls_back_announces_nothing(workspace: Workspace) -> None:
    other = Workspace.objects.create(name="Beta", slug="beta")
    contact = Contact.objects.create(workspace=workspace, name="Ann")
    forget_messages()
    try:
        with transaction.atomic():
            contact.workspace = other
            contact.save()
            raise LookupError
    except LookupError:
        pass
    assert events() == []


def test_a_row_taken_out_of_every_scope_leaves_its_scope(workspace: Workspace) -> None:
    contact = Contact.objects.create(workspace=workspace, name="Ann")
    forget_messages()
    contact.workspace = None
    contact.save()
    assert summary() == [
        ("contact.deleted", workspace.pk, None, identity("contact", contact.pk), True)
    ]


def test_an_update_that_moves_nothing_costs_no_query_in_the_transaction(
    workspace: Workspace,
) -> None:
    company = Company.objects.get(pk=Company.objects.create(workspace=workspace, name="A").pk)
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        company.name = "B"
        company.save()
        inside = [q["sql"] for q in queries.captured_queries]
    assert len([sql for sql in inside if not sql.startswith(("BEGIN", "SAVEPOINT"))]) == 1


# Guarded rows ---------------------------------------------------------------------------------


def test_a_guarded_row_given_to_another_author_leaves_the_old_and_enters_the_new(
    workspace: Workspace, make_user: MakeUser
) -> None:
    ann = make_user("ann", member_of=workspace)
    bob = make_user("bob", member_of=workspace)
    make_user("carol", member_of=workspace)
    note = PrivateNote.objects.create(workspace=workspace, author=ann, title="mine")
    forget_messages()
    note.author = bob
    note.save()
    about = {"model": "private_note", "id": note.pk}
    assert [(m["event_type"], m["only"], m.get("about")) for m in events()] == [
        ("private_note.deleted", [ann.pk], None),
        ("private_note.created", [bob.pk], about),
    ]
    assert events()[0]["data"] == identity("private_note", note.pk)


def test_a_guarded_row_made_private_leaves_the_others_and_stays_with_its_author(
    workspace: Workspace, make_user: MakeUser
) -> None:
    ann = make_user("ann", member_of=workspace)
    bob = make_user("bob", member_of=workspace)
    note = PrivateNote.objects.create(workspace=workspace, author=ann, title="x", public=True)
    forget_messages()
    note.public = False
    note.save()
    assert [(m["event_type"], m["only"], m["meta"]) for m in events()] == [
        ("private_note.deleted", [bob.pk], {"moved": True}),
        ("private_note.updated", [ann.pk], {"changed": ["public"]}),
    ]


class NoGuestReadsNotes(RealtimeAuth):
    """An audience narrower than the guard: no account named ``guest…`` hears of a note."""

    def audience(
        self, scope_id: Any, event_type: str, data: Any, user_ids: Iterable[Any], about: Any
    ) -> Iterable[Any]:
        admitted = list(super().audience(scope_id, event_type, data, user_ids, about))
        if about is None or about.get("model") != "private_note":
            return admitted
        guests = set(
            get_user_model()
            ._default_manager.filter(username__startswith="guest")
            .values_list("pk", flat=True)
        )
        return [account for account in admitted if account not in guests]


def made_private(workspace: Workspace, author: Any, write: str) -> list[tuple[str, Any]]:
    """(event type, ``only``) of each message of a public note of ``author`` made private by
    ``write`` (``save`` or ``update``)."""
    note = PrivateNote.objects.create(workspace=workspace, author=author, title="x", public=True)
    forget_messages()
    if write == "save":
        note.public = False
        note.save()
    else:
        PrivateNote._default_manager.filter(pk=note.pk).update(public=False)
    return [(m["event_type"], m["only"]) for m in events()]


@pytest.mark.parametrize("write", ["save", "update"])
def test_a_guarded_row_leaves_only_the_readers_the_audience_admitted(
    workspace: Workspace, make_user: MakeUser, settings: Any, write: str
) -> None:
    settings.REALTIME_AUTH = f"{__name__}.NoGuestReadsNotes"
    ann = make_user("ann", member_of=workspace)
    bob = make_user("bob", member_of=workspace)
    make_user("guest", member_of=workspace)
    assert made_private(workspace, ann, write) == [
        ("private_note.deleted", [bob.pk]),
        ("private_note.updated", [ann.pk]),
    ]


@pytest.mark.parametrize("write", ["save", "update"])
def test_an_inactive_account_is_told_no_guarded_row_left_its_view(
    workspace: Workspace, make_user: MakeUser, write: str
) -> None:
    ann = make_user("ann", member_of=workspace)
    bob = make_user("bob", member_of=workspace)
    away = make_user("away", member_of=workspace)
    get_user_model()._default_manager.filter(pk=away.pk).update(is_active=False)
    assert made_private(workspace, ann, write) == [
        ("private_note.deleted", [bob.pk]),
        ("private_note.updated", [ann.pk]),
    ]


def test_a_guard_whose_shape_depends_on_the_account_tells_every_reader_who_leaves(
    workspace: Workspace, make_user: MakeUser
) -> None:
    from tests.testapp.models import Report

    ann = make_user("ann", member_of=workspace)  # in team "red": reads its reports
    ann.last_name = "red"
    ann.save()
    bob = make_user("bob", member_of=workspace)  # in no team: reads his own
    report = Report.objects.create(workspace=workspace, owner=bob, team="red", title="q3")
    forget_messages()

    report.team = "blue"  # without guard_fields, the readers before are taken all the same
    report.save()

    assert summary() == [
        ("report.deleted", workspace.pk, (ann.pk,), identity("report", report.pk), True),
        (
            "report.updated",
            workspace.pk,
            (bob.pk,),
            {"model": "report", "id": report.pk, "title": "q3", "team": "blue"},
            False,
        ),
    ]


def test_a_guarded_update_of_a_field_the_guard_does_not_read_takes_no_readers(
    workspace: Workspace, make_user: MakeUser
) -> None:
    ann = make_user("ann", member_of=workspace)
    note = PrivateNote.objects.get(
        pk=PrivateNote.objects.create(workspace=workspace, author=ann, title="x").pk
    )
    forget_messages()
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        note.title = "y"
        note.save()
        inside = [q["sql"] for q in queries.captured_queries]
    assert len([sql for sql in inside if not sql.startswith(("BEGIN", "SAVEPOINT"))]) == 1
    (updated,) = events()
    assert updated["about"] == {"model": "private_note", "id": note.pk}
    assert "only" not in updated


# Account paths ---------------------------------------------------------------------------------


def test_an_account_event_handed_to_another_account_leaves_one_and_enters_the_other(
    make_user: MakeUser,
) -> None:
    ann, bob = make_user("ann"), make_user("bob")
    notification = Notification.objects.create(user=ann, text="hello")
    forget_messages()
    notification.user = bob
    notification.save()
    assert summary() == [
        ("notification.deleted", (ann.pk,), None, identity("notification", notification.pk), True),
        ("notification.created", (bob.pk,), None, events()[1]["data"], True),
    ]


def test_a_message_moved_to_another_thread_reaches_leavers_enterers_and_stayers(
    make_user: MakeUser,
) -> None:
    ann, bob, carol = make_user("ann"), make_user("bob"), make_user("carol")
    first, second = Thread.objects.create(title="1"), Thread.objects.create(title="2")
    first.members.set([ann, bob])
    second.members.set([bob, carol])
    message = Message.objects.create(thread=first, text="hi")
    forget_messages()
    message.thread = second
    message.save()
    assert [(m["event_type"], m["user_ids"], m["meta"].get("moved")) for m in events()] == [
        ("message.deleted", [ann.pk], True),
        ("message.created", [carol.pk], True),
        ("message.updated", [bob.pk], None),
    ]


# Shared records --------------------------------------------------------------------------------


def test_a_shared_record_moved_to_another_root_changes_its_outside_readers(
    workspace: Workspace, make_user: MakeUser
) -> None:
    beta = Workspace.objects.create(name="Beta", slug="beta")
    gamma = Workspace.objects.create(name="Gamma", slug="gamma")
    reader_b = make_user("bee", member_of=beta)
    reader_g = make_user("gee", member_of=gamma)
    shared_with_beta = Project.objects.create(workspace=workspace, name="P1")
    shared_with_beta.shared_with.set([beta])
    shared_with_gamma = Project.objects.create(workspace=workspace, name="P2")
    shared_with_gamma.shared_with.set([gamma])
    task = Task.objects.create(workspace=workspace, project=shared_with_beta, title="t")
    forget_messages()
    task.project = shared_with_gamma
    task.save()
    assert [
        (m["event_type"], m.get("scope_id"), m.get("user_ids"), m["meta"].get("moved"))
        for m in events()
    ] == [
        ("task.updated", workspace.pk, None, None),
        ("task.deleted", None, [reader_b.pk], True),
        ("task.created", None, [reader_g.pk], True),
    ]


@pytest.mark.parametrize("write", ["save", "update"])
def test_a_reader_of_the_root_who_is_a_member_of_the_new_scope_keeps_a_moved_row(
    workspace: Workspace, make_user: MakeUser, write: str
) -> None:
    """Bee reads the task as an outside reader of its project, and is a member of beta: moved
    to beta, the task enters bee's view with beta's ``created``, and no leave frame to bee's
    account follows it (it would take the row from a reader)."""
    beta = Workspace.objects.create(name="Beta", slug="beta")
    bee = make_user("bee", member_of=beta)
    gamma = Workspace.objects.create(name="Gamma", slug="gamma")
    gee = make_user("gee", member_of=gamma)
    project = Project.objects.create(workspace=workspace, name="P")
    project.shared_with.add(beta, gamma)
    task = Task.objects.create(workspace=workspace, project=project, title="t")
    forget_messages()
    if write == "save":
        task.workspace = beta
        task.save()
    else:
        Task._default_manager.filter(pk=task.pk).update(workspace=beta)
    sent = [(m["event_type"], m.get("scope_id"), m.get("user_ids")) for m in events()]
    assert ("task.created", beta.pk, None) in sent
    assert not [whom for _, _, whom in sent if whom and bee.pk in whom]
    assert ("task.updated", None, [gee.pk]) in sent  # an outside reader still


@pytest.mark.parametrize("secret", [True, False], ids=["refused", "admitted"])
def test_a_reader_of_the_root_in_the_new_scope_keeps_the_row_where_its_guard_admits_it(
    workspace: Workspace, make_user: MakeUser, secret: bool
) -> None:
    """Bee, a member of beta who read the task as an outside reader of its project, keeps it
    when it moves to beta if the guard admits bee there (beta's ``created`` brings it), and
    hears it leave if not."""
    bee, task = a_shared_guarded_task(workspace, make_user)
    beta = Workspace.objects.get(slug="beta")
    forget_messages()
    task.workspace = beta
    task.secret = secret
    task.save()
    left = [("guarded_task.deleted", identity("guarded_task", task.pk), True)]
    assert outside(bee) == (left if secret else [])
    assert ("guarded_task.created", beta.pk) in [
        (m["event_type"], m["scope_id"]) for m in events("scope")
    ]


def a_shared_guarded_task(workspace: Workspace, make_user: MakeUser) -> tuple[Any, GuardedTask]:
    """A task of the workspace's project, which is shared with beta, whose member bee may
    read it (it is not secret)."""
    beta = Workspace.objects.create(name="Beta", slug="beta")
    bee = make_user("bee", member_of=beta)
    project = Project.objects.create(workspace=workspace, name="P")
    project.shared_with.add(beta)
    return bee, GuardedTask.objects.create(workspace=workspace, project=project, title="t")


def outside(bee: Any) -> list[tuple[Any, ...]]:
    """(event type, data, moved) of each message to ``bee``'s account."""
    return [
        (m["event_type"], m["data"], m["meta"].get("moved", False))
        for m in events("users")
        if m["user_ids"] == [bee.pk]
    ]


def test_a_shared_row_its_guard_stops_admitting_by_save_leaves_its_outside_readers(
    workspace: Workspace, make_user: MakeUser
) -> None:
    bee, task = a_shared_guarded_task(workspace, make_user)
    forget_messages()
    task.secret = True
    task.save()
    assert outside(bee) == [("guarded_task.deleted", identity("guarded_task", task.pk), True)]


def test_a_shared_row_its_guard_admits_again_by_save_enters_its_outside_readers(
    workspace: Workspace, make_user: MakeUser
) -> None:
    bee, task = a_shared_guarded_task(workspace, make_user)
    task.secret = True
    task.save()
    forget_messages()
    task.secret = False
    task.save()
    assert outside(bee) == [("guarded_task.created", events("users")[0]["data"], True)]
    assert events("users")[0]["data"]["title"] == "t"


def test_a_shared_row_its_guard_stops_admitting_by_update_leaves_its_outside_readers(
    workspace: Workspace, make_user: MakeUser
) -> None:
    bee, task = a_shared_guarded_task(workspace, make_user)
    forget_messages()
    GuardedTask.objects.filter(pk=task.pk).update(secret=True)
    assert outside(bee) == [("guarded_task.deleted", identity("guarded_task", task.pk), True)]


# Links that change who reads rows they do not write -------------------------------------------


def test_an_account_added_to_a_thread_enters_its_messages_and_one_removed_leaves_them(
    make_user: MakeUser,
) -> None:
    ann, bob = make_user("ann"), make_user("bob")
    thread = Thread.objects.create(title="t")
    thread.members.set([ann])
    message = Message.objects.create(thread=thread, text="hi")
    forget_messages()
    thread.members.add(bob)
    assert summary() == [("message.created", (bob.pk,), None, events()[0]["data"], True)]
    assert events()[0]["data"]["text"] == "hi"
    forget_messages()
    bob.threads.remove(thread)
    assert summary() == [
        ("message.deleted", (bob.pk,), None, identity("message", message.pk), True)
    ]
    forget_messages()
    thread.members.clear()
    assert summary() == [
        ("message.deleted", (ann.pk,), None, identity("message", message.pk), True)
    ]


def test_links_past_the_cascade_limit_fold_into_one_truncated_event(
    make_user: MakeUser, settings: Any
) -> None:
    ann = make_user("ann")
    thread = Thread.objects.create(title="t")
    for number in range(3):
        Message.objects.create(thread=thread, text=str(number))
    settings.REALTIME_CASCADE_LIMIT = 2
    forget_messages()
    thread.members.add(ann)
    kinds = [(m["event_type"], m["data"] is None, m["meta"]) for m in events()]
    assert kinds == [
        ("message.created", False, {"moved": True}),
        ("message.created", False, {"moved": True}),
        ("message.created", True, {"truncated": True}),
    ]


def test_a_project_shared_with_another_scope_enters_its_tasks_and_unsharing_leaves_them(
    workspace: Workspace, make_user: MakeUser
) -> None:
    beta = Workspace.objects.create(name="Beta", slug="beta")
    reader = make_user("bee", member_of=beta)
    make_user("ann", member_of=workspace)
    project = Project.objects.create(workspace=workspace, name="P")
    task = Task.objects.create(workspace=workspace, project=project, title="t")
    forget_messages()
    project.shared_with.add(beta)
    assert summary() == [("task.created", (reader.pk,), None, events()[0]["data"], True)]
    forget_messages()
    beta.shared_projects.remove(project)
    assert summary() == [("task.deleted", (reader.pk,), None, identity("task", task.pk), True)]


def test_a_link_change_rolled_back_announces_nothing(make_user: MakeUser) -> None:
    ann = make_user("ann")
    thread = Thread.objects.create(title="t")
    Message.objects.create(thread=thread, text="hi")
    forget_messages()
    try:
        with transaction.atomic():
            thread.members.add(ann)
            raise LookupError
    except LookupError:
        pass
    assert events() == []


# A row an earlier write of its transaction took from readers, then deleted ---------------------


def test_a_board_member_removed_and_the_board_deleted_in_one_transaction_hears_it_go(
    workspace: Workspace, make_user: MakeUser
) -> None:
    ann = make_user("ann", member_of=workspace)
    board = Board.objects.create(workspace=workspace, name="b")
    board.members.add(ann)
    forget_messages()
    with transaction.atomic():  # a "delete board" view that clears its members first
        board.members.remove(ann)
        pk = board.pk
        board.delete()
    # Nobody may read the board at its delete; ann showed it before the transaction.
    assert summary() == [("board.deleted", workspace.pk, (ann.pk,), identity("board", pk), False)]


def test_a_note_made_private_and_deleted_in_one_transaction_is_told_gone_to_its_readers_before(
    workspace: Workspace, make_user: MakeUser
) -> None:
    ann = make_user("ann", member_of=workspace)
    bob = make_user("bob", member_of=workspace)
    note = PrivateNote.objects.create(workspace=workspace, author=ann, title="n", public=True)
    forget_messages()
    with transaction.atomic():
        note.public = False
        note.title = "mine alone"
        note.save()
        pk = note.pk
        note.delete()
    # Each reader hears it once: bob, who read it before, its identity alone.
    assert summary() == [
        ("private_note.deleted", workspace.pk, (bob.pk,), identity("private_note", pk), False),
        ("private_note.deleted", workspace.pk, (ann.pk,), events()[1]["data"], False),
    ]
    assert events()[1]["data"]["title"] == "mine alone"


def test_a_note_updated_private_and_deleted_in_one_transaction_is_told_gone_to_its_readers_before(
    workspace: Workspace, make_user: MakeUser
) -> None:
    ann = make_user("ann", member_of=workspace)
    bob = make_user("bob", member_of=workspace)
    note = PrivateNote.objects.create(workspace=workspace, author=ann, title="n", public=True)
    forget_messages()
    with transaction.atomic():
        PrivateNote.objects.filter(pk=note.pk).update(public=False)
        PrivateNote.objects.filter(pk=note.pk).delete()
    assert [(kind, only) for kind, _, only, _, _ in summary()] == [
        ("private_note.deleted", (bob.pk,)),
        ("private_note.deleted", (ann.pk,)),
    ]


def test_a_message_moved_to_another_thread_and_deleted_is_told_gone_to_the_old_members_only(
    make_user: MakeUser,
) -> None:
    ann, bob = make_user("ann"), make_user("bob")
    old, new = Thread.objects.create(title="old"), Thread.objects.create(title="new")
    old.members.set([ann])
    new.members.set([bob])
    message = Message.objects.create(thread=old, text="x")
    forget_messages()
    with transaction.atomic():
        message.thread = new
        message.save()
        pk = message.pk
        message.delete()
    # The new thread's members never read it as committed: they are told nothing of it.
    assert summary() == [("message.deleted", (ann.pk,), None, identity("message", pk), False)]


def test_a_contact_moved_to_another_workspace_and_deleted_is_told_gone_to_the_old_one_only(
    workspace: Workspace,
) -> None:
    other = Workspace.objects.create(name="Beta", slug="beta")
    company = Company.objects.create(workspace=workspace, name="Old co")
    contact = Contact.objects.create(workspace=workspace, name="Ann", company=company)
    forget_messages()
    with transaction.atomic():
        contact.workspace = other
        contact.company = None
        contact.save()
        pk = contact.pk
        contact.delete()
    # The workspace it moved to never read it as committed: it is told nothing of it.
    (gone,) = events()
    assert summary() == [("contact.deleted", workspace.pk, None, identity("contact", pk), False)]
    # The old workspace hears it on the channels the row was on there.
    assert gone["channels"] == ["contact", f"contact:{pk}", f"company:{company.pk}"]


def test_a_shared_record_moved_to_another_root_and_deleted_is_told_gone_to_old_readers_only(
    workspace: Workspace, make_user: MakeUser
) -> None:
    beta = Workspace.objects.create(name="Beta", slug="beta")
    gamma = Workspace.objects.create(name="Gamma", slug="gamma")
    reader_b = make_user("bee", member_of=beta)
    reader_g = make_user("gee", member_of=gamma)
    shared_with_beta = Project.objects.create(workspace=workspace, name="P1")
    shared_with_beta.shared_with.set([beta])
    shared_with_gamma = Project.objects.create(workspace=workspace, name="P2")
    shared_with_gamma.shared_with.set([gamma])
    task = Task.objects.create(workspace=workspace, project=shared_with_beta, title="t")
    forget_messages()
    with transaction.atomic():
        task.project = shared_with_gamma
        task.save()
        pk = task.pk
        task.delete()
    # The new root's readers never read it as committed: they are told nothing of it.
    heard = [(m["event_type"], m.get("scope_id"), m.get("user_ids")) for m in events()]
    assert heard == [("task.deleted", None, [reader_b.pk]), ("task.deleted", workspace.pk, None)]
    assert all(reader_g.pk not in (m.get("user_ids") or ()) for m in events())
    assert events()[0]["data"] == identity("task", pk)


def test_a_guard_failing_for_an_account_is_logged_within_its_budget_and_the_others_hear(
    workspace: Workspace,
    make_user: MakeUser,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A guard is application code: what it raises for an account is logged at ERROR with its
    traceback within its place's budget of lines, that account reads none of the rows, and
    the write and everyone else's frames go on (a failing guard is no failure to prepare:
    it raises in no test either)."""
    ann = make_user("ann", member_of=workspace)
    make_user("bob", member_of=workspace)
    note = PrivateNote.objects.create(workspace=workspace, author=ann, title="x", public=True)
    options = options_for(PrivateNote)
    assert options is not None

    def failing_for_bob(user: Any) -> Any:
        if user.username == "bob":
            raise RuntimeError("the guard cannot read bob")
        return may_read_note(user)

    forget_messages()
    writes = 2 * logs.PLACE_LINES_PER_MINUTE
    object.__setattr__(options, "guard", failing_for_bob)  # the declaration is frozen
    try:
        with caplog.at_level(logging.ERROR, "realtime"):
            for number in range(writes):
                note.public = number % 2 == 1
                note.save()
    finally:
        object.__setattr__(options, "guard", may_read_note)
    failed = [r for r in caplog.records if "the guard of private_note failed" in r.message]
    assert len(failed) == logs.PLACE_LINES_PER_MINUTE
    assert all(r.exc_info for r in failed)
    assert [m["only"] for m in events()] == [[ann.pk]] * writes
