"""The outbox: exactly what committed is published, once per transaction, whatever savepoints did.

Each test writes through the ORM on the real test database and reads what reached
``firm_channel_messages``; "one publish" is one call writing to it (``MessageStore.insert``:
one ``INSERT``, or on PostgreSQL from 100 messages a ``COPY``), counted around the transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import IntegrityError, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.test import TestCase

from realtime.compat import django as django_seam
from tests.helpers import events, forget_messages, log_writes
from tests.testapp.models import Company, Contact, Workspace

pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def publishes() -> Iterator[list[int]]:
    """Count the calls writing to ``firm_channel_messages`` made inside the block (the count is
    in the list once the block is left)."""
    count: list[int] = []
    with log_writes() as writes:
        yield count
    count.append(len(writes))


def announced() -> list[tuple[str, Any]]:
    return [(m["event_type"], m["data"]["name"]) for m in events()]


class RollBackError(Exception):
    """Raised to roll back an atomic block."""


def in_rolled_back_savepoint(work: Callable[[], Any]) -> None:
    """Run ``work`` in an atomic block that then rolls back."""
    try:
        with transaction.atomic():
            work()
            raise RollBackError
    except RollBackError:
        pass


def fail_a_savepoint(workspace: Workspace) -> None:
    """What a lost ``get_or_create`` race does: an INSERT that fails in a savepoint."""
    try:
        with transaction.atomic():
            Workspace.objects.create(name="Duplicate", slug=workspace.slug)
    except IntegrityError:
        return
    raise AssertionError("the duplicate slug was accepted")


def test_a_rolled_back_savepoint_between_two_writes_of_a_row_keeps_them_coalesced(
    workspace: Workspace,
) -> None:
    forget_messages()
    with publishes() as count, transaction.atomic():
        contact = Contact.objects.create(workspace=workspace, name="v1")
        fail_a_savepoint(workspace)
        contact.name = "v2"
        contact.save()
    assert announced() == [("contact.created", "v2")]
    assert count == [1]


def test_a_rolled_back_savepoint_after_the_last_write_still_publishes_once(
    workspace: Workspace,
) -> None:
    forget_messages()
    with publishes() as count, transaction.atomic():
        contact = Contact.objects.create(workspace=workspace, name="v1")
        contact.name = "v2"
        contact.save()
        Company.objects.create(workspace=workspace, name="Co")
        fail_a_savepoint(workspace)
    assert announced() == [("contact.created", "v2"), ("company.created", "Co")]
    assert count == [1]


def test_writes_in_a_released_savepoint_are_coalesced_with_the_rest(
    workspace: Workspace,
) -> None:
    forget_messages()
    with publishes() as count, transaction.atomic():
        contact = Contact.objects.create(workspace=workspace, name="v1")
        with transaction.atomic():
            contact.name = "v2"
            contact.save()
    assert announced() == [("contact.created", "v2")]
    assert count == [1]


def test_the_last_writes_in_a_rolled_back_savepoint_are_not_published(
    workspace: Workspace,
) -> None:
    forget_messages()
    with publishes() as count, transaction.atomic():
        Contact.objects.create(workspace=workspace, name="kept")
        in_rolled_back_savepoint(lambda: Company.objects.create(workspace=workspace, name="lost"))
    assert announced() == [("contact.created", "kept")]
    assert count == [1]


def test_an_update_rolled_back_in_a_savepoint_leaves_the_create_as_it_was(
    workspace: Workspace,
) -> None:
    forget_messages()
    with publishes() as count, transaction.atomic():
        contact = Contact.objects.create(workspace=workspace, name="v1")

        def rename() -> None:
            contact.name = "rolled back"
            contact.save()

        in_rolled_back_savepoint(rename)
        Company.objects.create(workspace=workspace, name="after")
    assert announced() == [("contact.created", "v1"), ("company.created", "after")]
    assert count == [1]


def test_writes_in_sibling_savepoints_one_released_one_rolled_back_are_exact(
    workspace: Workspace,
) -> None:
    forget_messages()
    with transaction.atomic():
        with transaction.atomic():
            kept = Contact.objects.create(workspace=workspace, name="kept")
        in_rolled_back_savepoint(lambda: Company.objects.create(workspace=workspace, name="lost"))
    assert announced() == [("contact.created", "kept")]
    assert kept.pk is not None


def test_a_foreign_callback_that_raises_loses_nothing_the_transaction_announced(
    workspace: Workspace,
) -> None:
    def fail() -> None:
        raise RollBackError

    def write() -> None:
        with transaction.atomic():
            Contact.objects.create(workspace=workspace, name="before")
            transaction.on_commit(fail)
            Company.objects.create(workspace=workspace, name="after")

    forget_messages()
    with pytest.raises(RollBackError):
        write()
    # Django stops at the raising callback, after the commit: the rest is published too.
    assert announced() == [("contact.created", "before"), ("company.created", "after")]
    assert Company.objects.filter(name="after").exists()


def test_a_foreign_callback_that_raises_first_loses_nothing_the_transaction_announced(
    workspace: Workspace,
) -> None:
    def fail() -> None:
        raise RollBackError

    def write() -> None:
        with transaction.atomic():
            transaction.on_commit(fail)
            Contact.objects.create(workspace=workspace, name="one")
            Company.objects.create(workspace=workspace, name="two")

    forget_messages()
    with pytest.raises(RollBackError):
        write()
    assert announced() == [("contact.created", "one"), ("company.created", "two")]


def test_a_row_set_back_after_a_foreign_callback_stopped_the_commit_callbacks_is_announced(
    workspace: Workspace,
) -> None:
    company = Company.objects.get(pk=Company.objects.create(workspace=workspace, name="A").pk)

    def fail() -> None:
        raise RollBackError

    def write() -> None:
        with transaction.atomic():
            transaction.on_commit(fail)
            company.name = "B"
            company.save()

    with pytest.raises(RollBackError):
        write()
    forget_messages()
    # The B committed: setting A back is a change.
    company.name = "A"
    company.save()
    assert announced() == [("company.updated", "A")]
    assert events()[0]["meta"]["changed"] == ["name"]


def test_a_write_by_a_foreign_callback_in_autocommit_is_published_after_the_transaction(
    workspace: Workspace,
) -> None:
    company = Company.objects.create(workspace=workspace, name="A")

    def update_later() -> None:
        Company.objects.filter(pk=company.pk).update(name="final")

    def save_later() -> None:
        again = Company.objects.get(pk=company.pk)
        again.name = "saved"
        again.save()

    for later, last in ((update_later, "final"), (save_later, "saved")):
        forget_messages()
        with transaction.atomic():
            company.name = "B"
            company.save()
            transaction.on_commit(later)
            company.name = "C"
            company.save()
        # Written in that order: the sockets end on what the row holds.
        assert [name for _, name in announced()] == ["C", last]


def test_a_transaction_committed_by_a_foreign_callback_publishes_after_the_one_it_ran_in(
    workspace: Workspace,
) -> None:
    def write_later() -> None:
        with transaction.atomic():
            Company.objects.create(workspace=workspace, name="from the callback")

    forget_messages()
    with transaction.atomic():
        Contact.objects.create(workspace=workspace, name="first")
        transaction.on_commit(write_later)
        Contact.objects.create(workspace=workspace, name="second")
    assert announced() == [
        ("contact.created", "first"),
        ("contact.created", "second"),
        ("company.created", "from the callback"),
    ]


def test_a_rolled_back_transaction_publishes_nothing_and_the_next_one_publishes(
    workspace: Workspace,
) -> None:
    forget_messages()
    in_rolled_back_savepoint(lambda: Contact.objects.create(workspace=workspace, name="lost"))
    with transaction.atomic():
        Contact.objects.create(workspace=workspace, name="next")
    assert announced() == [("contact.created", "next")]


def test_a_write_made_by_an_on_commit_callback_is_published_too(workspace: Workspace) -> None:
    def write_later() -> None:
        with transaction.atomic():
            Company.objects.create(workspace=workspace, name="from the callback")

    forget_messages()
    with transaction.atomic():
        Contact.objects.create(workspace=workspace, name="first")
        transaction.on_commit(write_later)
        Contact.objects.create(workspace=workspace, name="second")
    assert sorted(announced()) == [
        ("company.created", "from the callback"),
        ("contact.created", "first"),
        ("contact.created", "second"),
    ]


def test_outside_a_transaction_each_write_publishes_at_once(workspace: Workspace) -> None:
    forget_messages()
    with publishes() as count:
        Contact.objects.create(workspace=workspace, name="one")
        Contact.objects.create(workspace=workspace, name="two")
    assert announced() == [("contact.created", "one"), ("contact.created", "two")]
    assert count == [2]


def test_four_hundred_writes_in_savepoints_publish_once(workspace: Workspace) -> None:
    forget_messages()
    with publishes() as count, transaction.atomic():
        for number in range(400):
            with transaction.atomic():
                Company.objects.create(workspace=workspace, name=f"co{number}")
    assert len(announced()) == 400
    assert count == [1]


class TestCaptureOnCommitCallbacks(TestCase):
    """Django's test helper runs the callbacks inside the test's transaction."""

    def test_executed_callbacks_publish_once_and_coalesce(self) -> None:
        workspace = Workspace.objects.create(name="Acme", slug="acme")
        forget_messages()
        run: Callable[..., Any] = self.captureOnCommitCallbacks
        with publishes() as count, run(execute=True) as callbacks:
            contact = Contact.objects.create(workspace=workspace, name="v1")
            contact.name = "v2"
            contact.save()
        assert callbacks
        assert announced() == [("contact.created", "v2")]
        assert count == [1]

    def test_a_save_registers_one_callback_and_a_bulk_update_two(self) -> None:
        workspace = Workspace.objects.create(name="Acme", slug="acme")
        contacts = [Contact.objects.create(workspace=workspace, name=f"c{n}") for n in range(3)]
        run: Callable[..., Any] = self.captureOnCommitCallbacks
        with run() as saved:
            contacts[0].name = "renamed"
            contacts[0].save()
        with run() as unchanged:
            contacts[0].save()  # announces nothing: the note of what committed alone
        for contact in contacts:
            contact.name = f"bulk {contact.pk}"
        with run() as bulk:
            Contact.objects.bulk_update(contacts, ["name"])
        assert (len(saved), len(unchanged), len(bulk)) == (1, 1, 2)


def test_no_error_is_logged_by_a_normal_transaction(
    workspace: Workspace, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="realtime"), transaction.atomic():
        Contact.objects.create(workspace=workspace, name="quiet")
    assert [r for r in caplog.records if r.name.startswith("realtime")] == []


@pytest.fixture
def django_keeping_discarded_callbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Django that keeps the callbacks of rolled-back savepoints alive (none does today):
    realtime's check of that behaviour runs again and must notice."""
    kept: list[Any] = []
    rollback = BaseDatabaseWrapper.savepoint_rollback

    def keeping(self: BaseDatabaseWrapper, sid: str) -> None:
        kept.append(list(self.run_on_commit))
        rollback(self, sid)

    monkeypatch.setattr(BaseDatabaseWrapper, "savepoint_rollback", keeping)
    monkeypatch.setattr(django_seam, "_verdicts", {})
    monkeypatch.setattr(django_seam, "_next_try", 0.0)


@pytest.mark.usefixtures("django_keeping_discarded_callbacks")
def test_where_django_keeps_discarded_callbacks_each_announcement_publishes_itself(
    workspace: Workspace, caplog: pytest.LogCaptureFixture
) -> None:
    forget_messages()
    with (
        caplog.at_level(logging.ERROR, logger="realtime"),
        publishes() as count,
        transaction.atomic(),
    ):
        contact = Contact.objects.create(workspace=workspace, name="v1")
        contact.name = "v2"
        contact.save()
    # Not coalesced, and published by each callback: never lost, never out of order.
    assert [event for event, _ in announced()] == ["contact.created", "contact.updated"]
    assert count == [2]
    noticed = [r for r in caplog.records if django_seam.CALLBACKS in r.getMessage()]
    assert len(noticed) == 1
