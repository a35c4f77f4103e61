"""What an update says it changed follows what the database holds: values changed in place,
saves retried after a rollback, reads inside rolled-back transactions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import transaction

from tests.helpers import events, forget_messages
from tests.testapp.models import Contact, Document, Workspace

pytestmark = pytest.mark.django_db(transaction=True)


class RollBackError(Exception):
    """Raised to roll back an atomic block, the way a deadlock would."""


def rolled_back(work: Callable[[], Any]) -> None:
    """Run ``work`` in an atomic block that then rolls back."""
    try:
        with transaction.atomic():
            work()
            raise RollBackError
    except RollBackError:
        pass


def changes() -> list[tuple[str, list[str] | None]]:
    return [(m["event_type"], m["meta"].get("changed")) for m in events()]


def test_a_dict_changed_in_place_is_announced(workspace: Workspace) -> None:
    document = Document.objects.create(workspace=workspace, title="Doc", meta={"status": "draft"})
    loaded = Document.objects.get(pk=document.pk)
    forget_messages()
    loaded.meta["status"] = "published"
    loaded.save()
    assert changes() == [("document.updated", ["meta"])]
    assert events()[0]["data"]["meta"] == {"status": "published"}


def test_a_list_changed_in_place_is_announced(workspace: Workspace) -> None:
    document = Document.objects.create(workspace=workspace, title="Doc", labels=["a"])
    forget_messages()
    document.labels.append("b")
    document.save()
    assert changes() == [("document.updated", ["labels"])]


def test_a_nested_value_changed_in_place_after_a_save_is_announced_again(
    workspace: Workspace,
) -> None:
    document = Document.objects.create(workspace=workspace, title="Doc", meta={"a": {"b": 1}})
    document.meta["a"]["b"] = 2
    document.save()
    forget_messages()
    document.meta["a"]["b"] = 3
    document.save()
    assert changes() == [("document.updated", ["meta"])]


def test_a_save_of_an_unchanged_mutable_value_announces_nothing(workspace: Workspace) -> None:
    document = Document.objects.create(workspace=workspace, title="Doc", meta={"a": [1, 2]})
    loaded = Document.objects.get(pk=document.pk)
    forget_messages()
    loaded.save()
    assert changes() == []


def test_a_save_retried_after_a_rollback_is_announced(workspace: Workspace) -> None:
    contact = Contact.objects.create(workspace=workspace, name="v1")
    loaded = Contact.objects.get(pk=contact.pk)
    forget_messages()
    loaded.name = "v2"
    rolled_back(loaded.save)
    assert changes() == []
    with transaction.atomic():
        loaded.save()
    assert changes() == [("contact.updated", ["name"])]
    assert Contact.objects.get(pk=contact.pk).name == "v2"


def test_a_save_retried_after_a_rolled_back_savepoint_is_announced(workspace: Workspace) -> None:
    contact = Contact.objects.create(workspace=workspace, name="v1")
    loaded = Contact.objects.get(pk=contact.pk)
    forget_messages()
    with transaction.atomic():
        loaded.name = "v2"
        rolled_back(loaded.save)
        loaded.save()
    assert changes() == [("contact.updated", ["name"])]


def test_a_save_retried_outside_a_transaction_after_a_rollback_is_announced(
    workspace: Workspace,
) -> None:
    contact = Contact.objects.create(workspace=workspace, name="v1", email="a@x")
    loaded = Contact.objects.get(pk=contact.pk)
    forget_messages()
    loaded.email = "b@x"
    rolled_back(loaded.save)
    loaded.save()
    assert changes() == [("contact.updated", ["email"])]


def test_a_row_read_inside_a_rolled_back_transaction_counts_as_changed(
    workspace: Workspace,
) -> None:
    contact = Contact.objects.create(workspace=workspace, name="v1")
    seen: list[Contact] = []

    def write_then_read() -> None:
        Contact.objects.filter(pk=contact.pk).update(name="v2")
        seen.append(Contact.objects.get(pk=contact.pk))

    rolled_back(write_then_read)
    (stale,) = seen
    forget_messages()
    # The database holds "v1"; the instance read "v2" inside the lost transaction, so nothing
    # it read is known to be stored: every column it holds counts as written.
    stale.save()
    everything = ["born", "company", "email", "name", "notes", "score", "workspace"]
    assert changes() == [("contact.updated", everything)]


def test_saves_committed_in_a_released_savepoint_are_the_new_baseline(
    workspace: Workspace,
) -> None:
    contact = Contact.objects.create(workspace=workspace, name="v1")
    with transaction.atomic(), transaction.atomic():
        contact.name = "v2"
        contact.save()
    forget_messages()
    contact.save()
    assert changes() == []
