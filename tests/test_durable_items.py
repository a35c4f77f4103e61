"""Announcements written to the outbox and loaded back build exactly the messages the
originals build: every kind of item the test app's writes make, bulk writes and views among
them, checked at each publish by ``RoundTripTransport`` (the rows the writer relays are loaded
and rebuilt, ``mid`` aside, against the messages it was given)."""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction

from realtime import announce
from realtime.broadcast import broadcast_to_scope, broadcast_to_users, recheck_users
from realtime.writes import outbox_form
from realtime.writes.events import Before, Event
from realtime.writes.items import Recheck, ScopeBroadcast, UsersBroadcast
from tests.durable_transport import RoundTripTransport
from tests.testapp.models import (
    Attachment,
    Card,
    Company,
    Contact,
    Line,
    Membership,
    Message,
    Notification,
    PrivateNote,
    Project,
    Room,
    Tag,
    Task,
    Thread,
    Workspace,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def round_trip(settings: Any) -> Iterator[None]:
    settings.REALTIME_TRANSPORT = "tests.durable_transport.RoundTripTransport"
    RoundTripTransport.checked.clear()
    RoundTripTransport.mismatches.clear()
    yield
    assert RoundTripTransport.mismatches == []


def member(username: str, *workspaces: Workspace, **fields: Any) -> Any:
    user = get_user_model().objects.create_user(username=username, **fields)
    for workspace in workspaces:
        Membership.objects.create(workspace=workspace, user=user)
    return user


def in_transactions(*steps: Callable[[], Any]) -> None:
    """Run each step in a transaction of its own; every one must have been relayed from
    rows of the outbox."""
    for step in steps:
        before = len(RoundTripTransport.checked)
        with transaction.atomic():
            step()
        assert len(RoundTripTransport.checked) > before, step


def test_model_events_of_every_shape_round_trip() -> None:
    acme = Workspace.objects.create(name="Acme", slug="acme")
    beta = Workspace.objects.create(name="Beta", slug="beta")
    ann = member("ann", acme)
    bob = member("bob", acme, beta, last_name="blue")
    member("carl", beta)  # reads acme's shared project, from outside
    company = Company.objects.create(workspace=acme, name="Co")
    tag = Tag.objects.create(workspace=acme, name="vip")
    contact = Contact.objects.create(workspace=acme, name="Zed", company=company)
    note = PrivateNote.objects.create(workspace=acme, author=ann, title="mine")
    thread = Thread.objects.create(title="t")
    thread.members.add(ann)
    other_thread = Thread.objects.create(title="u")
    other_thread.members.add(bob)
    project = Project.objects.create(workspace=acme, name="p")
    project.shared_with.add(beta)
    other_project = Project.objects.create(workspace=acme, name="q")
    room = Room.objects.create(name="r")

    def created_updated_deleted() -> None:
        c = Contact.objects.create(
            workspace=acme,
            name="Amy",
            born=datetime.datetime(1990, 1, 2, tzinfo=datetime.UTC),
            score=2,
        )
        c.name = "Amy B"
        c.save()
        Contact.objects.create(workspace=acme, name="gone").delete()

    def moved_to_another_scope() -> None:
        contact.workspace = beta
        contact.company = None
        contact.save()

    def guarded_given_to_another() -> None:
        note.author = bob
        note.save()

    def account_events() -> None:
        n = Notification.objects.create(user=ann, text="hi")
        n.user = bob
        n.save()

    def message_moved_to_another_thread() -> None:
        m = Message.objects.create(thread=thread, text="m")
        m.thread = other_thread
        m.save()

    def shared_record_rerooted() -> None:
        t = Task.objects.create(workspace=acme, project=project, title="x")
        t.project = other_project
        t.save()

    shared_task = Task.objects.create(workspace=acme, project=project, title="shared")

    def shared_deleted_then_unshared() -> None:
        # Its outside readers are taken before it goes: unsharing after does not change them.
        shared_task.delete()
        project.shared_with.remove(beta)

    in_transactions(
        created_updated_deleted,
        moved_to_another_scope,
        guarded_given_to_another,
        account_events,
        message_moved_to_another_thread,
        shared_record_rerooted,
        lambda: contact.tags.add(tag),
        lambda: room.participants.add(ann, bob),
        lambda: other_thread.members.add(ann),
        lambda: Membership.objects.filter(user=bob, workspace=beta).delete(),
        lambda: Line.objects.create(workspace=acme, order_no=7, position=2, quantity=3),
        lambda: Card.objects.create(
            workspace=acme, company=company, label="c", price=decimal.Decimal("9.99")
        ),
        lambda: Attachment.objects.create(workspace=acme, contact=contact, name="a"),
        shared_deleted_then_unshared,
    )


def test_bulk_writes_round_trip() -> None:
    acme = Workspace.objects.create(name="Acme", slug="acme")
    beta = Workspace.objects.create(name="Beta", slug="beta")
    member("ann", acme)
    companies = Company.objects.bulk_create(
        [Company(workspace=acme, name=f"c{i}") for i in range(5)]
    )

    def bulk_update() -> None:
        for company in companies:
            company.name += "!"
        Company.objects.bulk_update(companies, ["name"])

    in_transactions(
        lambda: Company.objects.bulk_create([Company(workspace=acme, name="n") for _ in range(3)]),
        bulk_update,
        lambda: Company.objects.filter(workspace=acme).update(name="same"),
        lambda: Company.objects.filter(pk=companies[0].pk).update(workspace=beta),
        lambda: Company.objects.filter(workspace=acme).delete(),
    )


def test_announcements_that_are_not_model_events_round_trip() -> None:
    acme = Workspace.objects.create(name="Acme", slug="acme")
    ann = member("ann", acme)
    bob = member("bob", acme)
    company = Company.objects.create(workspace=acme, name="Co")
    in_transactions(
        lambda: broadcast_to_scope(
            acme.pk,
            "app.note",
            {"at": datetime.datetime(2026, 1, 2, tzinfo=datetime.UTC), "n": decimal.Decimal(2)},
            channels=["company"],
            meta={"k": 1},
            exclude_user_ids=[str(bob.pk)],
            about=(Company, str(company.pk)),
        ),
        lambda: broadcast_to_scope(acme.slug and acme.pk, "app.only", [1, 2], audience=[ann.pk]),
        lambda: broadcast_to_users([ann.pk, bob.pk], "app.hello", None, skip_scope=acme.pk),
        lambda: recheck_users([ann.pk]),
        lambda: announce(company, "updated", changed=["name"]),
    )


def test_every_kind_of_item_survives_dump_and_load_as_data() -> None:
    acme = Workspace.objects.create(name="Acme", slug="acme")
    company = Company.objects.create(workspace=acme, name="Co")
    from realtime.registry import options_for

    options = options_for(Company)
    assert options is not None
    items: list[Any] = [
        Event(
            options,
            "updated",
            company.pk,
            {"model": "company", "id": company.pk, "name": "Co"},
            ["company", f"company:{company.pk}"],
            scope_id=acme.pk,
            changed=["name"],
            origin="tab-1",
            readers=[1, 2],
            before=Before(scope_id=acme.pk, readers=[3], channels=["company"]),
        ),
        Recheck([1, "2"]),
        ScopeBroadcast(acme.pk, "x", {"a": [1]}, None, {}, [], ("company", 1), None),
        UsersBroadcast([1], "y", "text", ["c"], {"m": True}, skip_scope=acme.pk),
    ]
    for item in items:
        assert outbox_form.load(outbox_form.dump(item)) == item


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b'{"v": 99, "k": "recheck", "user_ids": []}',
        b'{"v": 1, "k": "nothing"}',
        b'{"v": 1, "k": "event", "model": "testapp.Plain"}',
        b'{"v": 1, "k": "event", "model": "nowhere.Model"}',
        b'{"v": 1, "k": "scope"}',
    ],
)
def test_a_row_that_cannot_be_read_raises_unreadable(raw: bytes) -> None:
    with pytest.raises(outbox_form.UnreadableError):
        outbox_form.load(raw)
