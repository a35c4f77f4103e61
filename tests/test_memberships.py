"""Memberships of every shape: however the links that lead to an account change — the
many-to-many manager, the rows of a ``through`` model saved, deleted or written in bulk, a
reverse foreign key to membership rows — the accounts that gain a row hear it ``created``,
those that lose it hear it ``deleted``, and nobody else hears anything."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction

from realtime.auth import issue_token
from realtime.broadcast import broadcast_to_user
from tests.helpers import events, forget_messages, off_loop, only_on
from tests.live import Clients, LiveServers
from tests.testapp.models import (
    Berth,
    Board,
    Chat,
    ChatLine,
    ChatPin,
    Crew,
    Desk,
    DeskNote,
    GuardedTask,
    Logbook,
    Membership,
    Message,
    Project,
    Room,
    Seat,
    Task,
    Thread,
    Workspace,
)

pytestmark = pytest.mark.django_db(transaction=True)

User = get_user_model()


def heard() -> list[tuple[str, tuple[Any, ...], Any, bool]]:
    """(event type, accounts, id, moved) of each account message published."""
    return [
        (
            m["event_type"],
            tuple(m["user_ids"]),
            (m["data"] or {}).get("id"),
            m["meta"].get("moved", False),
        )
        for m in events("users")
    ]


@pytest.fixture
def ann() -> Any:
    return User.objects.create_user(username="ann")


@pytest.fixture
def bob() -> Any:
    return User.objects.create_user(username="bob")


# A direct many-to-many (auto-created through table) ----------------------------------------


def test_an_account_added_to_a_room_hears_it_created_and_one_removed_hears_it_deleted(
    ann: Any, bob: Any
) -> None:
    room = Room.objects.create(name="r")
    room.participants.add(ann)
    forget_messages()

    room.participants.add(bob)
    # The reader who stays hears the room's links changed.
    assert sorted(heard()) == [
        ("room.created", (bob.pk,), room.pk, True),
        ("room.updated", (ann.pk,), room.pk, False),
    ]
    (updated,) = [m for m in events("users") if m["event_type"] == "room.updated"]
    assert updated["meta"]["changed"] == ["participants"]
    forget_messages()

    room.participants.remove(ann)
    assert sorted(heard()) == [
        ("room.deleted", (ann.pk,), room.pk, True),
        ("room.updated", (bob.pk,), room.pk, False),
    ]


def test_a_room_changed_from_the_accounts_side_tells_the_same(ann: Any, bob: Any) -> None:
    room = Room.objects.create(name="r")
    forget_messages()

    ann.rooms.add(room)
    bob.rooms.add(room)
    ann.rooms.remove(room)

    assert heard() == [
        ("room.created", (ann.pk,), room.pk, True),
        ("room.created", (bob.pk,), room.pk, True),
        ("room.updated", (ann.pk,), room.pk, False),
        ("room.deleted", (ann.pk,), room.pk, True),
        ("room.updated", (bob.pk,), room.pk, False),
    ]


def test_clear_and_set_tell_exactly_who_left_and_who_came(ann: Any, bob: Any) -> None:
    room = Room.objects.create(name="r")
    room.participants.set([ann])
    forget_messages()

    room.participants.set([bob])
    assert sorted(heard()) == [
        ("room.created", (bob.pk,), room.pk, True),
        ("room.deleted", (ann.pk,), room.pk, True),
    ]
    forget_messages()

    room.participants.clear()
    assert heard() == [("room.deleted", (bob.pk,), room.pk, True)]


def data_heard() -> list[tuple[str, tuple[Any, ...], Any]]:
    """(event type, accounts, data) of each account message published."""
    return [(m["event_type"], tuple(m["user_ids"]), m["data"]) for m in events("users")]


def test_an_account_removed_in_the_transaction_of_an_edit_hears_only_that_it_left(
    ann: Any, bob: Any
) -> None:
    room = Room.objects.create(name="old")
    room.participants.set([ann])
    forget_messages()

    with transaction.atomic():  # as the admin saves a form: the row, then its links
        room.name = "new"
        room.save()
        room.participants.set([bob])

    told = data_heard()
    assert [(kind, who) for kind, who, _ in told if ann.pk in who] == [("room.deleted", (ann.pk,))]
    assert ("room.created", (bob.pk,), {"model": "room", "id": room.pk, "name": "new"}) in told


def test_a_member_removed_from_a_thread_after_an_edit_of_its_message_hears_only_it_left(
    ann: Any, bob: Any
) -> None:
    thread = Thread.objects.create(title="t")
    thread.members.set([ann, bob])
    message = Message.objects.create(thread=thread, text="old")
    forget_messages()

    with transaction.atomic():
        message.text = "new"
        message.save()
        thread.members.remove(ann)

    told = data_heard()
    assert [(kind, who) for kind, who, _ in told if ann.pk in who] == [
        ("message.deleted", (ann.pk,))
    ]
    assert ("message.updated", (bob.pk,)) in [(kind, who) for kind, who, _ in told]


def test_links_selected_for_update_and_deleted_in_autocommit_tell_their_accounts(
    ann: Any, bob: Any
) -> None:
    room = Room.objects.create(name="r")
    room.participants.add(ann, bob)
    forget_messages()

    # Django's delete takes no select_for_update(): neither does the read of the links before
    # it (on PostgreSQL, outside a transaction, it raised and nobody was told).
    links = Room.participants.through.objects.select_for_update().filter(user=bob)
    assert links.delete()[0] == 1

    assert heard() == [("room.deleted", (bob.pk,), room.pk, True)]


def test_a_link_added_in_a_rolled_back_transaction_tells_nobody(ann: Any) -> None:
    room = Room.objects.create(name="r")
    forget_messages()

    try:
        with transaction.atomic():
            room.participants.add(ann)
            raise LookupError
    except LookupError:
        pass

    assert heard() == []


def test_an_account_given_a_row_in_the_transaction_that_deletes_it_hears_nothing(
    ann: Any, bob: Any
) -> None:
    """What an account gains and loses within one transaction was never its to read as
    committed: joined to a thread whose message is then deleted, or to a room then deleted,
    it hears neither the row's creation (with its data) nor its deletion; the readers who
    had it hear it deleted."""
    thread = Thread.objects.create(title="t")
    thread.members.add(bob)
    message = Message.objects.create(thread=thread, text="secret")
    room = Room.objects.create(name="secret room")
    room.participants.add(bob)
    forget_messages()

    with transaction.atomic():
        thread.members.add(ann)
        message.delete()
        room.participants.add(ann)
        room.delete()

    assert [(kind, who) for kind, who, _ in data_heard()] == [
        ("message.deleted", (bob.pk,)),
        ("room.deleted", (bob.pk,)),
    ]


def test_an_account_given_and_taken_a_row_in_one_transaction_hears_nothing(
    ann: Any, bob: Any
) -> None:
    room = Room.objects.create(name="r")
    room.participants.add(bob)
    thread = Thread.objects.create(title="t")
    thread.members.add(ann, bob)
    forget_messages()

    with transaction.atomic():
        room.participants.add(ann)
        room.participants.remove(ann)
        Message.objects.create(thread=thread, text="new")  # created, then ann leaves
        thread.members.remove(ann)

    # bob, who stays in the room, hears its links changed (they came back as they were).
    assert [(kind, who) for kind, who, _ in data_heard()] == [
        ("room.updated", (bob.pk,)),
        ("message.created", (bob.pk,)),
    ]


def test_a_reader_who_left_and_came_back_in_one_transaction_hears_the_row_as_it_is(
    ann: Any,
) -> None:
    room = Room.objects.create(name="r")
    room.participants.add(ann)
    forget_messages()

    with transaction.atomic():
        room.participants.remove(ann)
        room.participants.add(ann)

    # She ends with the room, as the database does (told it left, then came back).
    assert [kind for kind, _, _, _ in heard()] == ["room.deleted", "room.created"]


def test_a_root_shared_in_the_transaction_that_deletes_its_record_tells_the_new_readers_nothing(
    ann: Any, bob: Any
) -> None:
    acme = Workspace.objects.create(name="Acme", slug="acme")
    other = Workspace.objects.create(name="Other", slug="other")
    Membership.objects.create(workspace=acme, user=ann)
    Membership.objects.create(workspace=other, user=bob)
    project = Project.objects.create(workspace=acme, name="p")
    task = Task.objects.create(workspace=acme, project=project, title="secret")
    forget_messages()

    with transaction.atomic():
        project.shared_with.add(other)
        task.delete()

    assert [bob.pk in m.get("user_ids", ()) for m in events()] == [False]
    assert [(m["target"], m["event_type"]) for m in events()] == [("scope", "task.deleted")]


def test_a_guarded_rows_new_reader_in_the_transaction_that_deletes_it_hears_nothing(
    ann: Any, bob: Any
) -> None:
    workspace = Workspace.objects.create(name="Acme", slug="acme")
    for account in (ann, bob):
        Membership.objects.create(workspace=workspace, user=account)
    board = Board.objects.create(workspace=workspace, name="secret")
    board.members.add(bob)
    forget_messages()

    with transaction.atomic():
        board.members.add(ann)
        board.delete()

    (deleted,) = [m for m in events() if m["event_type"] == "board.deleted"]
    assert deleted["only"] == [bob.pk]


# A through model of the application's own --------------------------------------------------------


@pytest.fixture
def chat() -> Chat:
    chat = Chat.objects.create(title="c")
    ChatLine.objects.create(chat=chat, text="line")
    ChatPin.objects.create(chat=chat, text="pin")
    forget_messages()
    return chat


def lines_and_pins(event_type: str, account: Any, chat: Chat) -> list[tuple[str, Any, Any, bool]]:
    line = ChatLine.objects.get(chat=chat)
    pin = ChatPin.objects.get(chat=chat)
    kind = event_type.split(".")[1]
    return [
        (f"chat_line.{kind}", (account.pk,), line.pk, True),
        (f"chat_pin.{kind}", (account.pk,), pin.pk, True),
    ]


def test_a_seat_created_and_deleted_tells_its_account(chat: Chat, ann: Any) -> None:
    seat = Seat.objects.create(chat=chat, user=ann)
    assert sorted(heard()) == lines_and_pins(".created", ann, chat)
    forget_messages()

    seat.delete()
    assert sorted(heard()) == lines_and_pins(".deleted", ann, chat)


def test_a_seat_handed_to_another_account_leaves_one_and_enters_the_other(
    chat: Chat, ann: Any, bob: Any
) -> None:
    seat = Seat.objects.create(chat=chat, user=ann)
    forget_messages()

    seat.user = bob
    seat.save()

    assert sorted(heard()) == sorted(
        lines_and_pins(".deleted", ann, chat) + lines_and_pins(".created", bob, chat)
    )


def test_an_account_losing_two_seats_of_a_chat_at_once_hears_each_row_leave_once(
    chat: Chat, ann: Any
) -> None:
    Seat.objects.create(chat=chat, user=ann)
    Seat.objects.create(chat=chat, user=ann)
    forget_messages()
    Seat.objects.filter(chat=chat).delete()
    assert sorted(heard()) == sorted(lines_and_pins(".deleted", ann, chat))


def test_a_seat_saved_over_another_with_its_key_leaves_the_old_account_and_enters_the_new(
    chat: Chat, ann: Any, bob: Any
) -> None:
    """A row built with the key of one that exists is saved over it (Django updates it):
    the account the row held hears the chat's rows leave, the new one hears them come."""
    seat = Seat.objects.create(chat=chat, user=ann)
    forget_messages()
    Seat(pk=seat.pk, chat=chat, user=bob).save()
    assert list(Seat.objects.values_list("user", flat=True)) == [bob.pk]
    assert sorted(heard()) == sorted(
        lines_and_pins(".deleted", ann, chat) + lines_and_pins(".created", bob, chat)
    )


def test_seats_moved_in_bulk_tell_both_accounts(chat: Chat, ann: Any, bob: Any) -> None:
    Seat.objects.create(chat=chat, user=ann)
    forget_messages()

    Seat.objects.filter(user=ann).update(user=bob)

    assert sorted(heard()) == sorted(
        lines_and_pins(".deleted", ann, chat) + lines_and_pins(".created", bob, chat)
    )


def test_seats_selected_for_update_and_moved_in_autocommit_tell_both_accounts(
    chat: Chat, ann: Any, bob: Any
) -> None:
    Seat.objects.create(chat=chat, user=ann)
    forget_messages()

    # Django's UPDATE takes no select_for_update(): neither does the read of the seats before
    # it (on PostgreSQL, outside a transaction, it raised and nobody was told).
    assert Seat.objects.select_for_update().filter(user=ann).update(user=bob) == 1

    assert sorted(heard()) == sorted(
        lines_and_pins(".deleted", ann, chat) + lines_and_pins(".created", bob, chat)
    )


def test_seats_created_and_updated_in_bulk_tell_their_accounts(
    chat: Chat, ann: Any, bob: Any
) -> None:
    (seat,) = Seat.objects.bulk_create([Seat(chat=chat, user=ann)])
    assert sorted(heard()) == lines_and_pins(".created", ann, chat)
    forget_messages()

    seat = Seat.objects.get(chat=chat, user=ann)
    seat.user = bob
    Seat.objects.bulk_update([seat], ["user"])

    assert sorted(heard()) == sorted(
        lines_and_pins(".deleted", ann, chat) + lines_and_pins(".created", bob, chat)
    )


@pytest.mark.skipif(
    "not __import__('django.db').db.connection.features.supports_update_conflicts_with_target",
    reason="needs update_conflicts with unique_fields",
)
def test_a_seat_upserted_onto_another_account_tells_both(chat: Chat, ann: Any, bob: Any) -> None:
    seat = Seat.objects.create(chat=chat, user=ann)
    forget_messages()

    Seat.objects.bulk_create(
        [Seat(pk=seat.pk, chat=chat, user=bob)],
        update_conflicts=True,
        unique_fields=["id"],
        update_fields=["user"],
    )

    assert Seat.objects.get(pk=seat.pk).user == bob
    assert sorted(heard()) == sorted(
        lines_and_pins(".deleted", ann, chat) + lines_and_pins(".created", bob, chat)
    )


@pytest.mark.skipif(
    "not __import__('django.db').db.connection.features.supports_update_conflicts_with_target",
    reason="needs update_conflicts with unique_fields",
)
def test_an_upsert_that_swaps_two_seats_accounts_tells_nobody(
    chat: Chat, ann: Any, bob: Any
) -> None:
    first = Seat.objects.create(chat=chat, user=ann)
    second = Seat.objects.create(chat=chat, user=bob)
    forget_messages()

    Seat.objects.bulk_create(
        [Seat(pk=first.pk, chat=chat, user=bob), Seat(pk=second.pk, chat=chat, user=ann)],
        update_conflicts=True,
        unique_fields=["id"],
        update_fields=["user"],
    )

    assert heard() == []


def test_the_many_to_many_manager_over_a_through_model_tells_the_same(chat: Chat, ann: Any) -> None:
    chat.members.add(ann)
    assert sorted(heard()) == lines_and_pins(".created", ann, chat)
    forget_messages()

    chat.members.remove(ann)
    assert sorted(heard()) == lines_and_pins(".deleted", ann, chat)


def test_an_account_with_two_seats_keeps_the_chat_when_one_goes(chat: Chat, ann: Any) -> None:
    first = Seat.objects.create(chat=chat, user=ann)
    Seat.objects.create(chat=chat, user=ann)
    forget_messages()

    first.delete()

    ChatLine.objects.create(chat=chat, text="marker")
    assert [kind for kind, *_ in heard()] == ["chat_line.created"]


def test_a_seat_saved_without_a_change_of_account_tells_nobody(chat: Chat, ann: Any) -> None:
    seat = Seat.objects.create(chat=chat, user=ann)
    forget_messages()

    seat.save()

    assert heard() == []


def test_seats_deleted_through_a_queryset_with_only_tell_their_account(
    chat: Chat, ann: Any
) -> None:
    Seat.objects.create(chat=chat, user=ann)
    forget_messages()

    Seat.objects.filter(chat=chat, user=ann).only("pk").delete()

    assert sorted(heard()) == lines_and_pins(".deleted", ann, chat)


def test_a_seat_loaded_without_its_chat_and_handed_over_tells_both_accounts(
    chat: Chat, ann: Any, bob: Any
) -> None:
    Seat.objects.create(chat=chat, user=ann)
    seat = Seat.objects.only("pk", "user").get(chat=chat, user=ann)
    forget_messages()

    seat.user = bob
    seat.save()

    assert sorted(heard()) == sorted(
        lines_and_pins(".deleted", ann, chat) + lines_and_pins(".created", bob, chat)
    )
    assert "chat_id" in seat.get_deferred_fields()  # the application's instance left as it was


def deleted_once_each(chat: Chat, accounts: tuple[Any, ...]) -> list[tuple[str, Any, Any, bool]]:
    """Each line and pin of ``chat`` told deleted once, by its own delete, to ``accounts``."""
    lines = [("chat_line.deleted", line.pk) for line in ChatLine.objects.filter(chat=chat)]
    pins = [("chat_pin.deleted", pin.pk) for pin in ChatPin.objects.filter(chat=chat)]
    ids = tuple(sorted(account.pk for account in accounts))
    return sorted((kind, ids, pk, False) for kind, pk in lines + pins)


@pytest.mark.parametrize("how", ["instance", "queryset"])
def test_a_chat_deleted_with_its_seats_tells_each_member_of_each_line_and_pin_once(
    chat: Chat, ann: Any, bob: Any, how: str
) -> None:
    Seat.objects.create(chat=chat, user=ann)
    Seat.objects.create(chat=chat, user=bob)
    ChatLine.objects.create(chat=chat, text="second")
    expected = deleted_once_each(chat, (ann, bob))
    forget_messages()

    if how == "instance":
        chat.delete()
    else:
        Chat.objects.filter(pk=chat.pk).delete()

    # The seats going with the chat leave no one: the lines and pins go too, and say so.
    assert sorted(heard()) == expected


# A one-to-one key before the membership ------------------------------------------------------


def test_an_account_added_to_a_desk_hears_its_note_created_and_one_removed_hears_it_deleted(
    ann: Any, bob: Any
) -> None:
    desk = Desk.objects.create(name="front")
    desk.members.add(ann)
    note = DeskNote.objects.create(desk=desk, text="open at nine")
    forget_messages()

    desk.members.add(bob)
    assert heard() == [("desk_note.created", (bob.pk,), note.pk, True)]
    forget_messages()

    desk.members.remove(ann)
    assert heard() == [("desk_note.deleted", (ann.pk,), note.pk, True)]


def test_a_note_moved_to_another_desk_leaves_its_members_and_enters_the_others(
    ann: Any, bob: Any
) -> None:
    front, back = Desk.objects.create(name="front"), Desk.objects.create(name="back")
    front.members.add(ann)
    back.members.add(bob)
    note = DeskNote.objects.create(desk=front, text="open at nine")
    forget_messages()

    note.desk = back
    note.save()
    DeskNote.objects.filter(pk=note.pk).update(desk=front)

    assert heard() == [
        ("desk_note.deleted", (ann.pk,), note.pk, True),
        ("desk_note.created", (bob.pk,), note.pk, True),
        ("desk_note.deleted", (bob.pk,), note.pk, True),
        ("desk_note.created", (ann.pk,), note.pk, True),
    ]


# A guard that reads links ---------------------------------------------------------------------


def ann_s_board(ann: Any, bob: Any, name: str) -> Board:
    """A guarded board of a workspace ann and bob are members of, ann among its members."""
    workspace = Workspace.objects.create(name="Acme", slug="acme")
    for user in (ann, bob):
        Membership.objects.create(workspace=workspace, user=user)
    board = Board.objects.create(workspace=workspace, name=name)
    board.members.add(ann)
    return board


def test_an_account_added_to_a_guarded_boards_links_enters_it_and_one_removed_leaves(
    ann: Any, bob: Any
) -> None:
    board = ann_s_board(ann, bob, "b")
    forget_messages()

    board.members.add(bob)
    added = [(m["event_type"], m.get("only")) for m in events("scope")]
    assert added == [("board.created", [bob.pk]), ("board.updated", [ann.pk])]
    forget_messages()

    board.members.remove(ann)
    removed = [(m["event_type"], m.get("only"), m["data"]) for m in events("scope")]
    assert removed == [
        ("board.deleted", [ann.pk], {"model": "board", "id": board.pk}),
        # Its links changed, not the row: who keeps it hears its identity alone (the fields
        # this instance holds may be older than a write of the row told before).
        ("board.updated", [bob.pk], {"model": "board", "id": board.pk}),
    ]


def test_an_account_a_link_lets_in_hears_the_row_as_stored_not_as_the_instance_held_it(
    ann: Any, bob: Any
) -> None:
    board = ann_s_board(ann, bob, "old")
    renamed = Board.objects.get(pk=board.pk)
    renamed.name = "new"
    renamed.save()
    forget_messages()

    board.members.add(bob)  # this instance still holds "old"

    heard = [(m["event_type"], m.get("only"), m["data"]) for m in events("scope")]
    as_stored = {"model": "board", "id": board.pk, "name": "new"}
    assert heard[0] == ("board.created", [bob.pk], as_stored)


def scope_heard() -> list[tuple[str, Any, Any]]:
    """(event type, accounts told, data) of each scope message published."""
    return [(m["event_type"], m.get("only"), m["data"]) for m in events("scope")]


def test_a_guarded_rows_links_deleted_through_their_table_leave_it(ann: Any, bob: Any) -> None:
    board = ann_s_board(ann, bob, "b")
    board.members.add(bob)
    forget_messages()

    assert Board.members.through.objects.filter(board=board, user=ann).delete()[0] == 1

    assert scope_heard() == [
        ("board.deleted", [ann.pk], {"model": "board", "id": board.pk}),
        ("board.updated", [bob.pk], {"model": "board", "id": board.pk}),
    ]


def test_a_guarded_rows_links_created_in_bulk_through_their_table_enter_it_once(
    ann: Any, bob: Any
) -> None:
    board = ann_s_board(ann, bob, "b")
    forget_messages()
    through = Board.members.through

    through.objects.bulk_create([through(board=board, user=bob)])
    assert [(kind, only) for kind, only, _ in scope_heard()] == [
        ("board.created", [bob.pk]),
        ("board.updated", [ann.pk]),
    ]
    forget_messages()

    # A link that exists already gives nobody anything.
    through.objects.bulk_create([through(board=board, user=bob)], ignore_conflicts=True)
    assert scope_heard() == []


def test_a_guarded_rows_link_handed_to_another_account_by_update_leaves_one_and_enters_the_other(
    ann: Any, bob: Any
) -> None:
    board = ann_s_board(ann, bob, "b")
    forget_messages()

    Board.members.through.objects.filter(board=board, user=ann).update(user=bob)

    assert [(kind, only) for kind, only, _ in scope_heard()] == [
        ("board.deleted", [ann.pk]),
        ("board.created", [bob.pk]),
    ]


def test_an_account_deleted_with_its_links_leaves_the_guarded_rows_they_gave_it(
    ann: Any, bob: Any
) -> None:
    board = ann_s_board(ann, bob, "b")
    board.members.add(bob)
    forget_messages()
    ann_pk = ann.pk

    ann.delete()  # Django deletes ann's links with her (its cascade, no QuerySet.delete())

    assert scope_heard() == [
        ("board.deleted", [ann_pk], {"model": "board", "id": board.pk}),
        ("board.updated", [bob.pk], {"model": "board", "id": board.pk}),
    ]


# The links of a shared root ------------------------------------------------------------------


@pytest.fixture
def acme_s_project(ann: Any, bob: Any) -> Project:
    """A project of acme (ann a member), and another workspace, bob a member, to share it with."""
    acme = Workspace.objects.create(name="Acme", slug="acme")
    other = Workspace.objects.create(name="Other", slug="other")
    Membership.objects.create(workspace=acme, user=ann)
    Membership.objects.create(workspace=other, user=bob)
    return Project.objects.create(workspace=acme, name="p")


def test_a_guarded_row_an_outside_reader_never_could_read_is_not_named_to_him_when_unshared(
    acme_s_project: Project, bob: Any
) -> None:
    project, other = acme_s_project, Workspace.objects.get(slug="other")
    acme = project.workspace
    GuardedTask.objects.create(workspace=acme, project=project, title="s", secret=True)
    plain = GuardedTask.objects.create(workspace=acme, project=project, title="p")
    project.shared_with.add(other)
    assert heard() == [("guarded_task.created", (bob.pk,), plain.pk, True)]
    forget_messages()

    project.shared_with.remove(other)
    assert heard() == [("guarded_task.deleted", (bob.pk,), plain.pk, True)]


def test_projects_shared_from_the_workspaces_side_enter_the_tasks_of_each(
    acme_s_project: Project, bob: Any
) -> None:
    one, other = acme_s_project, Workspace.objects.get(slug="other")
    two = Project.objects.create(workspace=one.workspace, name="two")
    tasks = [Task.objects.create(workspace=p.workspace, project=p, title="t") for p in (one, two)]
    forget_messages()

    other.shared_projects.add(one, two)
    assert sorted(heard()) == [("task.created", (bob.pk,), task.pk, True) for task in tasks]


def test_a_workspace_cleared_of_its_shared_projects_leaves_their_tasks(
    acme_s_project: Project, bob: Any
) -> None:
    project, other = acme_s_project, Workspace.objects.get(slug="other")
    task = Task.objects.create(workspace=project.workspace, project=project, title="t")
    project.shared_with.add(other)
    forget_messages()

    other.shared_projects.clear()  # Django names no project: those linked before it are read
    assert heard() == [("task.deleted", (bob.pk,), task.pk, True)]


def test_links_of_a_shared_root_deleted_through_their_table_leave_its_rows(
    acme_s_project: Project, bob: Any
) -> None:
    project, other = acme_s_project, Workspace.objects.get(slug="other")
    task = Task.objects.create(workspace=project.workspace, project=project, title="t")
    GuardedTask.objects.create(workspace=project.workspace, project=project, title="s", secret=True)
    plain = GuardedTask.objects.create(workspace=project.workspace, project=project, title="p")
    project.shared_with.add(other)
    forget_messages()

    links = Project.shared_with.through.objects.filter(project=project, workspace=other)
    assert links.delete()[0] == 1

    assert sorted(heard()) == [  # not the secret task, which bob never could read
        ("guarded_task.deleted", (bob.pk,), plain.pk, True),
        ("task.deleted", (bob.pk,), task.pk, True),
    ]


def test_links_of_a_shared_root_created_in_bulk_through_their_table_enter_its_rows_once(
    acme_s_project: Project, bob: Any
) -> None:
    project, other = acme_s_project, Workspace.objects.get(slug="other")
    task = Task.objects.create(workspace=project.workspace, project=project, title="t")
    forget_messages()
    through = Project.shared_with.through

    through.objects.bulk_create([through(project=project, workspace=other)])
    assert heard() == [("task.created", (bob.pk,), task.pk, True)]
    forget_messages()

    # A link that exists already gives nobody anything.
    through.objects.bulk_create([through(project=project, workspace=other)], ignore_conflicts=True)
    assert heard() == []


def test_links_of_a_shared_root_moved_by_update_leave_one_workspace_and_enter_the_other(
    acme_s_project: Project, bob: Any
) -> None:
    project, other = acme_s_project, Workspace.objects.get(slug="other")
    carl = User.objects.create_user(username="carl")
    third = Workspace.objects.create(name="Third", slug="third")
    Membership.objects.create(workspace=third, user=carl)
    task = Task.objects.create(workspace=project.workspace, project=project, title="t")
    project.shared_with.add(other)
    forget_messages()

    Project.shared_with.through.objects.filter(project=project).update(workspace=third)

    assert heard() == [
        ("task.deleted", (bob.pk,), task.pk, True),
        ("task.created", (carl.pk,), task.pk, True),
    ]


def test_links_of_a_shared_root_moved_by_bulk_update_leave_one_workspace_and_enter_the_other(
    acme_s_project: Project, bob: Any
) -> None:
    project, other = acme_s_project, Workspace.objects.get(slug="other")
    carl = User.objects.create_user(username="carl")
    third = Workspace.objects.create(name="Third", slug="third")
    Membership.objects.create(workspace=third, user=carl)
    task = Task.objects.create(workspace=project.workspace, project=project, title="t")
    project.shared_with.add(other)
    forget_messages()
    through = Project.shared_with.through
    links = list(through.objects.filter(project=project))
    for link in links:
        link.workspace = third

    through.objects.bulk_update(links, ["workspace"])

    assert heard() == [
        ("task.deleted", (bob.pk,), task.pk, True),
        ("task.created", (carl.pk,), task.pk, True),
    ]


def test_a_workspace_deleted_leaves_the_rows_of_the_projects_shared_with_it(
    acme_s_project: Project, bob: Any
) -> None:
    project, other = acme_s_project, Workspace.objects.get(slug="other")
    task = Task.objects.create(workspace=project.workspace, project=project, title="t")
    project.shared_with.add(other)
    Membership.objects.create(workspace=Workspace.objects.create(name="B", slug="b"), user=bob)
    bob_s = Workspace.objects.get(slug="b")
    project.shared_with.add(bob_s)  # bob keeps the project through a second workspace
    carl = User.objects.create_user(username="carl")
    Membership.objects.create(workspace=other, user=carl)
    forget_messages()

    # Django deletes the links with the workspace (its cascade, no QuerySet.delete()).
    other.delete()

    assert heard() == [("task.deleted", (carl.pk,), task.pk, True)]
    assert list(project.shared_with.all()) == [bob_s]


# Over real sockets ----------------------------------------------------------------------------


@pytest.mark.usefixtures("each_transport")
async def test_over_sockets_a_participant_added_hears_the_room_and_one_removed_hears_it_go(
    live_servers: LiveServers, ws: Clients
) -> None:
    ann = await off_loop(User.objects.create_user, username="ann")
    bob = await off_loop(User.objects.create_user, username="bob")
    clients = {}
    for user in (ann, bob):
        token = await off_loop(issue_token, user)
        clients[user] = await ws.authenticated(
            live_servers.get(), token, channels=["room", "chat_line"]
        )
    room = await off_loop(Room.objects.create, name="r")
    await off_loop(room.participants.add, ann)

    await off_loop(room.participants.add, bob)
    await off_loop(room.participants.remove, ann)
    chat = await off_loop(Chat.objects.create, title="c")
    line = await off_loop(ChatLine.objects.create, chat=chat, text="hi")
    await off_loop(Seat.objects.create, chat=chat, user=bob)

    async def frames(user: Any) -> list[tuple[str, Any]]:
        await off_loop(broadcast_to_user, user.pk, "test.marker", None)
        got = await clients[user].frames_until("test.marker")
        return [(frame["type"], frame["data"]["id"]) for frame in got]

    # Each hears the room come and go, and, while in it, that its participants changed.
    assert await frames(ann) == [
        ("room.created", room.pk),
        ("room.updated", room.pk),
        ("room.deleted", room.pk),
    ]
    assert await frames(bob) == [
        ("room.created", room.pk),
        ("room.updated", room.pk),
        ("chat_line.created", line.pk),
    ]


@pytest.mark.usefixtures("each_transport")
async def test_over_sockets_a_chat_deleted_tells_its_member_once_per_line(
    live_servers: LiveServers, ws: Clients
) -> None:
    ann = await off_loop(User.objects.create_user, username="ann")
    token = await off_loop(issue_token, ann)
    client = await ws.authenticated(live_servers.get(), token, channels=["chat_line"])
    chat = await off_loop(Chat.objects.create, title="c")
    await off_loop(Seat.objects.create, chat=chat, user=ann)
    line = await off_loop(ChatLine.objects.create, chat=chat, text="hi")

    await off_loop(chat.delete)

    await off_loop(broadcast_to_user, ann.pk, "test.marker", None)
    got = await client.frames_until("test.marker")
    assert [(frame["type"], frame["data"]["id"]) for frame in got] == [
        ("chat_line.created", line.pk),
        ("chat_line.deleted", line.pk),
    ]


# Links by keys other than primary ones (``to_field``) ----------------------------------------


def test_a_crews_mate_linked_by_username_hears_its_logbook_created_and_deleted(ann: Any) -> None:
    crew = Crew.objects.create(code="blue", name="Blue")
    log = Logbook.objects.create(crew=crew, text="log")
    forget_messages()

    berth = Berth.objects.create(crew=crew, mate=ann)
    assert heard() == [("logbook.created", (ann.pk,), log.pk, True)]
    forget_messages()

    berth.delete()
    assert heard() == [("logbook.deleted", (ann.pk,), log.pk, True)]


@only_on("mysql")  # its collation takes "ANN" for "ann"; elsewhere the key is refused
def test_a_mate_linked_by_its_username_in_another_form_hears_the_logbook_created_and_deleted(
    ann: Any,
) -> None:
    crew = Crew.objects.create(code="blue", name="Blue")
    log = Logbook.objects.create(crew=crew, text="log")
    forget_messages()

    berth = Berth.objects.create(crew_id="BLUE", mate_id="Ann ")
    assert heard() == [("logbook.created", (ann.pk,), log.pk, True)]
    forget_messages()

    berth.delete()
    assert heard() == [("logbook.deleted", (ann.pk,), log.pk, True)]
