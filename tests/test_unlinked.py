"""Rows a delete sets to NULL or to their default are announced as updates of that key, and
deletes made without signals are announced with the readers asked before the rows went."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models.signals import pre_delete
from django.test import override_settings

from realtime import deleting
from tests.helpers import events, forget_messages
from tests.testapp.models import (
    Attachment,
    Briefing,
    Contact,
    Deal,
    Department,
    Lead,
    Memo,
    Notification,
    PrivateNote,
    Project,
    Sketch,
    Squad,
    Task,
    Vendor,
    Workspace,
)

pytestmark = pytest.mark.django_db(transaction=True)

MakeUser = Callable[..., Any]


def delete_raw(model: Any, pks: list[Any]) -> None:
    """Delete rows with raw SQL: no signal is sent."""
    placeholders = ", ".join(["%s"] * len(pks))
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {model._meta.db_table} WHERE id IN ({placeholders})", pks)


def unlinked() -> list[dict[str, Any]]:
    """The messages announced, but the deleted vendors' own."""
    return [m for m in events() if not m["event_type"].startswith("vendor.")]


def updates() -> list[tuple[str, Any, Any, list[str] | None, list[str] | None]]:
    return [
        (
            m["event_type"],
            (m["data"] or {}).get("id"),
            (m["data"] or {}).get("vendor"),
            m["meta"].get("changed"),
            m["channels"],
        )
        for m in unlinked()
    ]


def test_rows_set_to_null_by_a_delete_are_announced_as_updates(workspace: Workspace) -> None:
    vendor = Vendor.objects.create(workspace=workspace, name="Acme supplies")
    lead = Lead.objects.create(workspace=workspace, vendor=vendor, name="Lead")
    channels = ["lead", f"lead:{lead.pk}", f"vendor:{vendor.pk}"]
    forget_messages()
    vendor.delete()
    assert updates() == [("lead.updated", lead.pk, None, ["vendor"], channels)]


def test_rows_set_to_their_default_by_a_delete_are_announced_as_updates(
    workspace: Workspace,
) -> None:
    vendor = Vendor.objects.create(workspace=workspace, name="Acme supplies")
    deal = Deal.objects.create(workspace=workspace, vendor=vendor, name="Deal")
    forget_messages()
    vendor.delete()
    assert updates() == [("deal.updated", deal.pk, None, ["vendor"], ["deal", f"deal:{deal.pk}"])]


def test_a_queryset_delete_of_targets_announces_their_unlinked_rows(workspace: Workspace) -> None:
    first = Vendor.objects.create(workspace=workspace, name="one")
    second = Vendor.objects.create(workspace=workspace, name="two")
    leads = [
        Lead.objects.create(workspace=workspace, vendor=v, name=v.name) for v in (first, second)
    ]
    forget_messages()
    Vendor.objects.filter(workspace=workspace).delete()
    assert sorted(m["data"]["id"] for m in unlinked()) == sorted(lead.pk for lead in leads)
    assert {m["event_type"] for m in unlinked()} == {"lead.updated"}


def test_unlinked_rows_past_the_cascade_limit_fold_into_one_truncated_update(
    workspace: Workspace,
) -> None:
    vendor = Vendor.objects.create(workspace=workspace, name="Acme supplies")
    for number in range(5):
        Lead.objects.create(workspace=workspace, vendor=vendor, name=f"lead {number}")
    forget_messages()
    with override_settings(REALTIME_CASCADE_LIMIT=2):
        vendor.delete()
    announced = unlinked()
    assert [m["event_type"] for m in announced] == ["lead.updated"] * 3
    folded = announced[-1]
    assert folded["data"] is None
    assert folded["meta"] == {"truncated": True}
    assert folded["channels"] == ["lead"]


def test_a_rolled_back_delete_announces_no_unlinked_row(workspace: Workspace) -> None:
    vendor = Vendor.objects.create(workspace=workspace, name="Acme supplies")
    Lead.objects.create(workspace=workspace, vendor=vendor, name="Lead")
    forget_messages()
    try:
        with transaction.atomic():
            vendor.delete()
            raise LookupError
    except LookupError:
        pass
    assert events() == []


class RefusedError(Exception):
    """Raised by an application's ``pre_delete`` receiver that forbids a delete."""


def refuse(sender: Any, instance: Vendor, **kwargs: Any) -> None:
    raise RefusedError(f"{instance.name} may not be deleted")


def test_an_update_after_a_delete_refused_by_a_pre_delete_receiver_is_announced(
    workspace: Workspace,
) -> None:
    locked = Vendor.objects.create(workspace=workspace, name="locked")
    other = Vendor.objects.create(workspace=workspace, name="other")
    lead = Lead.objects.create(workspace=workspace, vendor=locked, name="Lead")
    forget_messages()
    pre_delete.connect(refuse, sender=Vendor, dispatch_uid="test-refuse")
    try:
        with pytest.raises(RefusedError):
            locked.delete()  # refused after realtime's own pre_delete noted the unlinking
        with transaction.atomic():
            Lead.objects.filter(pk=lead.pk).update(vendor=other)
        with transaction.atomic():
            with pytest.raises(RefusedError), transaction.atomic():
                other.delete()  # the same, in a savepoint of a transaction that goes on
            Lead.objects.filter(pk=lead.pk).update(vendor=locked)
    finally:
        pre_delete.disconnect(sender=Vendor, dispatch_uid="test-refuse")
    assert Lead.objects.get(pk=lead.pk).vendor_id == locked.pk
    assert [(kind, pk, vendor) for kind, pk, vendor, *_ in updates()] == [
        ("lead.updated", lead.pk, other.pk),
        ("lead.updated", lead.pk, locked.pk),
    ]


def test_a_delete_that_unlinks_nothing_announces_nothing(workspace: Workspace) -> None:
    vendor = Vendor.objects.create(workspace=workspace, name="Acme supplies")
    forget_messages()
    vendor.delete()
    assert unlinked() == []


# Readers a delete moves ------------------------------------------------------------------------


def told(name: str) -> list[tuple[str, list[Any] | None, list[Any] | None]]:
    """(event type, ``only``, ``user_ids``) of each message about the model ``name``."""
    return sorted(
        (m["event_type"], m.get("only"), m.get("user_ids"))
        for m in events()
        if m["event_type"].startswith(f"{name}.")
    )


def test_a_guarded_row_set_to_null_by_a_delete_leaves_the_readers_its_guard_no_longer_admits(
    workspace: Workspace, make_user: MakeUser
) -> None:
    owner = make_user("owner", member_of=workspace)
    seller = make_user("seller", member_of=workspace)
    sales = Department.objects.create(workspace=workspace, name="sales")
    sales.members.add(seller)
    memo = Memo.objects.create(workspace=workspace, department=sales, owner=owner, title="q3")
    forget_messages()
    sales.delete()  # no "general" department: SET(...) leaves the memo to its owner alone
    assert Memo.objects.get(pk=memo.pk).department_id is None
    assert told("memo") == [("memo.deleted", [seller.pk], None), ("memo.updated", [owner.pk], None)]


def test_readers_a_delete_gives_a_guarded_row_hear_it_created(
    workspace: Workspace, make_user: MakeUser
) -> None:
    owner = make_user("owner", member_of=workspace)
    seller = make_user("seller", member_of=workspace)
    clerk = make_user("clerk", member_of=workspace)
    sales = Department.objects.create(workspace=workspace, name="sales")
    sales.members.add(seller)
    general = Department.objects.create(workspace=workspace, name="general")
    general.members.add(clerk)
    memo = Memo.objects.create(workspace=workspace, department=sales, owner=owner, title="q3")
    forget_messages()
    sales.delete()  # SET(general_department): the memo moves to "general"
    assert Memo.objects.get(pk=memo.pk).department_id == general.pk
    assert told("memo") == [
        ("memo.created", [clerk.pk], None),
        ("memo.deleted", [seller.pk], None),
        ("memo.updated", [owner.pk], None),
    ]


def test_a_row_whose_account_path_a_delete_cuts_leaves_its_accounts(make_user: MakeUser) -> None:
    ann = make_user("ann")
    squad = Squad.objects.create(name="red")
    squad.members.add(ann)
    briefing = Briefing.objects.create(squad=squad, text="plan")
    forget_messages()
    squad.delete()
    assert Briefing.objects.get(pk=briefing.pk).squad_id is None
    assert told("briefing") == [("briefing.deleted", None, [ann.pk])]


def test_a_shared_row_whose_root_a_delete_unlinks_leaves_the_readers_outside_its_scope(
    workspace: Workspace, make_user: MakeUser
) -> None:
    partner = Workspace.objects.create(name="Partner", slug="partner")
    guest = make_user("guest", member_of=partner)
    project = Project.objects.create(workspace=workspace, name="shared")
    project.shared_with.add(partner)
    sketch = Sketch.objects.create(workspace=workspace, project=project, title="draft")
    forget_messages()
    project.delete()
    assert Sketch.objects.get(pk=sketch.pk).project_id is None
    assert ("sketch.deleted", None, [guest.pk]) in told("sketch")
    assert ("sketch.updated", None, None) in told("sketch")  # its own workspace still reads it


# Deletes without signals -----------------------------------------------------------------------


def test_a_queryset_delete_inside_deleting_reaches_a_guarded_rows_readers(
    workspace: Workspace, make_user: MakeUser
) -> None:
    author = make_user("ann", member_of=workspace)
    make_user("bob", member_of=workspace)
    note = PrivateNote.objects.create(workspace=workspace, author=author, title="mine")
    forget_messages()
    with deleting(PrivateNote.objects.filter(pk=note.pk)) as doomed:
        delete_raw(PrivateNote, [row.pk for row in doomed])
    (message,) = events()
    assert message["event_type"] == "private_note.deleted"
    assert message["only"] == [author.pk]
    assert not PrivateNote.objects.filter(pk=note.pk).exists()


def test_raw_sql_deletes_inside_deleting_reach_the_accounts_of_a_path(
    workspace: Workspace, make_user: MakeUser
) -> None:
    user = make_user("ann", member_of=workspace)
    notification = Notification.objects.create(user=user, text="hello")
    forget_messages()
    with deleting([notification]):
        delete_raw(Notification, [notification.pk])
    (message,) = events()
    assert message["event_type"] == "notification.deleted"
    assert message["user_ids"] == [user.pk]


def test_a_deleting_block_that_raises_announces_nothing(workspace: Workspace) -> None:
    vendor = Vendor.objects.create(workspace=workspace, name="Acme supplies")
    lead = Lead.objects.create(workspace=workspace, vendor=vendor, name="Lead")
    forget_messages()
    try:
        with deleting(Lead.objects.filter(pk=lead.pk)):
            delete_raw(Lead, [lead.pk])
            raise LookupError
    except LookupError:
        pass
    assert events() == []
    assert Lead.objects.filter(pk=lead.pk).exists()


def test_deleting_announces_after_the_outer_transaction_commits(workspace: Workspace) -> None:
    lead = Lead.objects.create(workspace=workspace, name="Lead")
    forget_messages()
    with transaction.atomic():
        with deleting(Lead.objects.filter(pk=lead.pk)):
            delete_raw(Lead, [lead.pk])
        assert events() == []
    assert [m["event_type"] for m in events()] == ["lead.deleted"]


# Past the limit, readers outside the scope are told to read again too -------------------------


def folded_to(account: Any, event_type: str) -> list[dict[str, Any]]:
    """The truncated account messages of ``event_type`` that reach ``account``."""
    return [
        m
        for m in events("users")
        if m["event_type"] == event_type
        and m["data"] is None
        and account.pk in m["user_ids"]
        and m["meta"] == {"truncated": True}
    ]


@override_settings(REALTIME_CASCADE_LIMIT=2)
def test_rows_an_account_path_loses_past_the_limit_tell_its_accounts_to_read_again(
    make_user: MakeUser,
) -> None:
    ann = make_user("ann")
    squad = Squad.objects.create(name="red")
    squad.members.add(ann)
    briefings = [Briefing.objects.create(squad=squad, text=f"b{n}") for n in range(4)]
    forget_messages()

    squad.delete()  # the four briefings leave ann's view; two of them one by one

    left = [m for m in events("users") if m["data"] is not None]
    assert sorted(m["data"]["id"] for m in left) == [b.pk for b in briefings[:2]]
    assert len(folded_to(ann, "briefing.updated")) == 1


def shared_with_a_guest(
    workspace: Workspace, make_user: MakeUser, rows: Any
) -> tuple[Any, Project]:
    """A project of ``workspace`` shared with a partner workspace whose member is the guest,
    with four ``rows`` of it; the messages of their creation forgotten."""
    partner = Workspace.objects.create(name="Partner", slug="partner")
    guest = make_user("guest", member_of=partner)
    project = Project.objects.create(workspace=workspace, name="shared")
    project.shared_with.add(partner)
    for n in range(4):
        rows.objects.create(workspace=workspace, project=project, title=f"r{n}")
    forget_messages()
    return guest, project


@override_settings(REALTIME_CASCADE_LIMIT=2)
def test_rows_a_shared_root_unlinks_past_the_limit_tell_its_outside_readers_to_read_again(
    workspace: Workspace, make_user: MakeUser
) -> None:
    guest, project = shared_with_a_guest(workspace, make_user, Sketch)

    project.delete()  # SET_NULL: the four sketches leave the guest's view

    assert len(folded_to(guest, "sketch.updated")) == 1


@override_settings(REALTIME_CASCADE_LIMIT=2)
def test_rows_cascaded_past_the_limit_tell_their_roots_outside_readers_to_read_again(
    workspace: Workspace, make_user: MakeUser
) -> None:
    guest, project = shared_with_a_guest(workspace, make_user, Task)

    project.delete()  # CASCADE: two tasks one by one, the rest folded

    assert len(folded_to(guest, "task.deleted")) == 1


# The limit counts per deletion, not per deleted row -------------------------------------------


def shapes(prefix: str) -> list[str]:
    """``one`` or ``folded`` for each message of ``prefix`` events."""
    return sorted(
        "folded" if m["data"] is None else "one"
        for m in events()
        if m["event_type"].startswith(prefix)
    )


def three_with_two_each(workspace: Workspace, parent: Any, child: Any, link: str) -> None:
    """Three ``parent`` rows of ``workspace``, each with two ``child`` rows linked by
    ``link``; the messages of their creation forgotten."""
    for n in range(3):
        made = parent.objects.create(workspace=workspace, name=f"p{n}")
        for m in range(2):
            child.objects.create(workspace=workspace, name=f"c{n}{m}", **{link: made})
    forget_messages()


@override_settings(REALTIME_CASCADE_LIMIT=2)
def test_rows_unlinked_by_one_deletion_of_several_targets_count_against_one_limit(
    workspace: Workspace,
) -> None:
    three_with_two_each(workspace, Vendor, Lead, "vendor")

    Vendor.objects.filter(workspace=workspace).delete()

    assert shapes("lead.") == ["folded", "one", "one"]


@override_settings(REALTIME_CASCADE_LIMIT=2)
def test_rows_the_database_deletes_with_several_parents_count_against_one_limit(
    workspace: Workspace,
) -> None:
    three_with_two_each(workspace, Contact, Attachment, "contact")

    Contact.objects.filter(workspace=workspace).delete()

    assert shapes("attachment.") == ["folded", "one", "one"]


@override_settings(REALTIME_CASCADE_LIMIT=1)
def test_rows_unlinked_past_the_limit_from_several_shared_roots_tell_each_roots_outside_readers(
    workspace: Workspace, make_user: MakeUser
) -> None:
    guests = []
    for n in range(2):
        partner = Workspace.objects.create(name=f"Partner {n}", slug=f"partner-{n}")
        guests.append(make_user(f"guest{n}", member_of=partner))
        project = Project.objects.create(workspace=workspace, name=f"shared {n}")
        project.shared_with.add(partner)
        for m in range(3):
            Sketch.objects.create(workspace=workspace, project=project, title=f"s{n}{m}")
    forget_messages()

    Project.objects.filter(workspace=workspace).delete()

    assert [len(folded_to(guest, "sketch.updated")) for guest in guests] == [1, 1]
    scope_folds = [m for m in events("scope") if m["data"] is None]
    assert [(m["event_type"], m["scope_id"]) for m in scope_folds] == [
        ("sketch.updated", workspace.pk)
    ]
