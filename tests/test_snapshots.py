"""What an update says it changed follows what the database holds: values changed in place,
saves retried after a rollback, reads inside rolled-back transactions, saves through another
instance of the row, refreshes and deferred fields — with the application's classes left
as they are."""

from __future__ import annotations

import gc
import json
import pickle
import tracemalloc
from collections.abc import Callable
from typing import Any

import django
import pytest
from django.contrib.auth import get_user_model
from django.db import models, transaction

from realtime.compat.django_orm import kept_on_state
from realtime.writes import tracking
from tests.helpers import events, forget_messages
from tests.testapp.models import (
    Address,
    Animal,
    Contact,
    Document,
    Dog,
    Parcel,
    Workspace,
    each_as_it_is,
)

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


@pytest.mark.parametrize(
    ("before", "after"),
    [(1, True), (0, False), ({"on": [1, 0]}, {"on": [True, False]}), (True, 1)],
)
def test_a_json_number_changed_to_a_boolean_or_back_is_announced(
    workspace: Workspace, before: Any, after: Any
) -> None:
    """Python's ``True == 1``; JSON's ``true`` is not its ``1``."""
    document = Document.objects.create(workspace=workspace, title="Doc", meta=before)
    loaded = Document.objects.get(pk=document.pk)
    forget_messages()
    loaded.meta = after
    loaded.save()
    assert changes() == [("document.updated", ["meta"])]
    assert json.dumps(events()[0]["data"]["meta"]) == json.dumps(after)
    forget_messages()
    Document.objects.get(pk=document.pk).save()
    assert changes() == []


def test_a_value_of_a_text_field_of_the_applications_own_changed_in_place_is_announced(
    workspace: Workspace,
) -> None:
    """A ``TextField`` whose value is an object, a ``CharField`` whose value is a list
    (django-multiselectfield's): their kind is text, their values change in place."""
    Parcel.objects.create(  # type: ignore[misc] # the stubs take the fields' kinds for theirs
        workspace=workspace, address=Address("Main St", "Paris"), picks=["a"]
    )
    loaded = Parcel.objects.get()
    forget_messages()
    loaded.address.city = "Lyon"
    loaded.save()
    loaded.picks.append("b")
    loaded.save()
    assert changes() == [("parcel.updated", ["address"]), ("parcel.updated", ["picks"])]
    stored = Parcel.objects.get()
    assert (stored.address, stored.picks) == (Address("Main St", "Lyon"), ["a", "b"])
    forget_messages()
    stored.save()
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


def test_a_value_read_from_a_write_that_rolled_back_counts_as_changed(
    workspace: Workspace,
) -> None:
    # Nothing else of the row is known in this thread: the instance made by create() is gone.
    pk = Contact.objects.create(workspace=workspace, name="v1").pk
    seen: list[Contact] = []

    def write_then_read() -> None:
        Contact.objects.filter(pk=pk).update(name="v2")
        seen.append(Contact.objects.get(pk=pk))

    rolled_back(write_then_read)
    (stale,) = seen
    forget_messages()
    # The database holds "v1"; the instance read "v2", which the lost transaction wrote: that
    # column is not known to be stored, and counts as changed. The others were read as the
    # database holds them.
    stale.save()
    assert changes() == [("contact.updated", ["name"])]
    assert Contact.objects.get(pk=pk).name == "v2"


def test_a_read_inside_a_rolled_back_transaction_gives_way_to_what_the_row_was_known_to_hold(
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
    # The create, committed, told what the row holds; the lost read does not count.
    stale.save()
    assert changes() == [("contact.updated", ["name"])]
    assert Contact.objects.get(pk=contact.pk).name == "v2"


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


def test_realtime_replaces_nothing_on_the_models_it_watches() -> None:
    # Snapshots come from Django's post_init signal: the application's classes keep their own
    # from_db and refresh_from_db (an override of its own, as Django's docs show, stays whole).
    for model in (Contact, Document, get_user_model()):
        assert "from_db" not in vars(model)
        assert "refresh_from_db" not in vars(model)


def test_a_save_through_another_instance_of_the_row_is_the_new_baseline(
    workspace: Workspace,
) -> None:
    contact = Contact.objects.create(workspace=workspace, name="v1")
    first = Contact.objects.get(pk=contact.pk)
    second = Contact.objects.get(pk=contact.pk)
    second.name = "v2"
    second.save()
    forget_messages()
    # The row holds "v2"; saving the first instance, unchanged since it read "v1", writes
    # "v1" back: that is a change of the row.
    first.save()
    assert changes() == [("contact.updated", ["name"])]


def test_a_value_set_back_after_a_refresh_is_announced(workspace: Workspace) -> None:
    contact = Contact.objects.create(workspace=workspace, name="v1")
    loaded = Contact.objects.get(pk=contact.pk)
    Contact.objects.filter(pk=contact.pk).update(name="elsewhere")
    loaded.refresh_from_db()
    forget_messages()
    loaded.name = "v1"
    loaded.save()
    assert changes() == [("contact.updated", ["name"])]


def test_an_instance_held_across_a_bulk_update_writes_its_value_back_as_a_change(
    workspace: Workspace,
) -> None:
    contact = Contact.objects.create(workspace=workspace, name="v1")
    Contact.objects.filter(pk=contact.pk).update(name="bulk")
    forget_messages()
    contact.save()  # writes "v1" over "bulk"
    assert changes() == [("contact.updated", ["name"])]


def test_a_bulk_update_rolled_back_leaves_what_was_known(workspace: Workspace) -> None:
    contact = Contact.objects.create(workspace=workspace, name="v1")
    rolled_back(lambda: Contact.objects.filter(pk=contact.pk).update(name="bulk"))
    forget_messages()
    contact.save()
    assert changes() == []


def test_a_deferred_field_loaded_later_counts_from_what_was_loaded(workspace: Workspace) -> None:
    contact = Contact.objects.create(workspace=workspace, name="v1", email="a@x")
    loaded = Contact.objects.defer("email").get(pk=contact.pk)
    assert loaded.email == "a@x"  # fetched now, through refresh_from_db(fields=["email"])
    forget_messages()
    loaded.email = "b@x"
    loaded.save(update_fields=None)
    assert changes() == [("contact.updated", ["email"])]


@pytest.mark.skipif(django.VERSION < (6, 1), reason="fetch modes are new in Django 6.1")
def test_a_field_fetched_for_peers_and_changed_is_announced(workspace: Workspace) -> None:
    for name in ("a", "b"):
        Contact.objects.create(workspace=workspace, name=name, email=f"{name}@x")
    every_column_but_email = [f.name for f in Contact._meta.concrete_fields if f.name != "email"]
    peers = list(
        Contact.objects.fetch_mode(models.FETCH_PEERS)  # type: ignore[attr-defined]
        .only(*every_column_but_email)
        .order_by("pk")
    )
    assert peers[0].email == "a@x"  # fetched for both, without building instances
    forget_messages()
    peers[1].email = "changed@x"
    peers[1].save()
    assert changes() == [("contact.updated", ["email"])]


def test_an_instance_loaded_in_a_transaction_can_be_pickled_and_saved(
    workspace: Workspace,
) -> None:
    contact = Contact.objects.create(workspace=workspace, name="v1")
    with transaction.atomic():
        cached = pickle.dumps(Contact.objects.get(pk=contact.pk))
    restored = pickle.loads(cached)  # noqa: S301 - our own bytes
    forget_messages()
    # Nothing known survives the pickle: every column counts as written.
    restored.save()
    everything = ["born", "company", "email", "name", "notes", "score", "workspace"]
    assert changes() == [("contact.updated", everything)]


def test_a_row_built_by_hand_over_a_loaded_one_counts_every_column(workspace: Workspace) -> None:
    contact = Contact.objects.create(workspace=workspace, name="v1")
    by_hand = Contact(pk=contact.pk, workspace=workspace, name="v1")
    forget_messages()
    by_hand.save()
    everything = ["born", "company", "email", "name", "notes", "score", "workspace"]
    assert changes() == [("contact.updated", everything)]
    forget_messages()
    # Once saved, what it wrote is what the row holds.
    by_hand.save()
    assert changes() == []


def test_the_rows_of_one_read_share_what_they_were_loaded_with(workspace: Workspace) -> None:
    for name in ("a", "b", "c"):
        Contact.objects.create(workspace=workspace, name=name)
    first, *rest = Contact.objects.order_by("pk")
    # One object for the whole read, none per row: a read barely notices.
    assert all(kept_on_state(r._state) is kept_on_state(first._state) for r in rest)
    forget_messages()
    rest[0].name = "b2"
    rest[0].save()
    assert changes() == [("contact.updated", ["name"])]


def test_rows_a_bulk_create_inserted_know_what_they_hold(workspace: Workspace) -> None:
    made = Contact.objects.bulk_create(
        [Contact(workspace=workspace, name=name) for name in ("a", "b", "c")]
    )
    # One snapshot for the rows inserted together, as for the rows of one read.
    assert all(kept_on_state(m._state) is kept_on_state(made[0]._state) for m in made)
    forget_messages()
    made[1].name = "b2"
    made[1].save()
    made[2].save()
    assert changes() == [("contact.updated", ["name"])]


def test_rows_an_upsert_wrote_are_new_values_to_the_instances_that_read_them(
    workspace: Workspace,
) -> None:
    if not django.db.connection.features.supports_update_conflicts_with_target:
        pytest.skip("the database does not update conflicting rows")
    first = Contact.objects.create(workspace=workspace, name="a", email="a@x")
    loaded = Contact.objects.get(pk=first.pk)
    Contact.objects.bulk_create(
        [Contact(pk=first.pk, workspace=workspace, name="b", email="a@x")],
        update_conflicts=True,
        unique_fields=["id"],
        update_fields=["name"],
    )
    forget_messages()
    loaded.save()  # writes "a" back over "b": a change
    assert changes() == [("contact.updated", ["name"])]


def test_a_thread_writing_past_its_log_knows_nothing_of_what_it_read_before(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    contact = Contact.objects.create(workspace=workspace, name="v1")
    loaded = Contact.objects.get(pk=contact.pk)
    monkeypatch.setattr(tracking, "LOG_ROWS", 3)
    for n in range(4):
        Contact.objects.create(workspace=workspace, name=f"other {n}")
    forget_messages()
    # The log started afresh: what was loaded before may have been written since.
    loaded.save()
    everything = ["born", "company", "email", "name", "notes", "score", "workspace"]
    assert changes() == [("contact.updated", everything)]


def test_a_thread_keeps_no_more_than_its_log_bound_of_the_large_values_it_wrote(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tracking, "LOG_BYTES", 1_000_000)
    Contact.objects.create(workspace=workspace, name="warm")
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        with transaction.atomic():
            for n in range(100):  # 10 MB of text, no instance kept
                Contact.objects.create(workspace=workspace, name=f"c{n}", notes=f"{n}" * 100_000)
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 3_000_000


def test_a_thread_writing_large_values_past_its_log_bound_knows_nothing_of_what_it_read_before(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    contact = Contact.objects.create(workspace=workspace, name="v1")
    loaded = Contact.objects.get(pk=contact.pk)
    monkeypatch.setattr(tracking, "LOG_BYTES", 1_000)
    Contact.objects.create(workspace=workspace, name="other", notes="n" * 1_001)
    forget_messages()
    loaded.save()
    everything = ["born", "company", "email", "name", "notes", "score", "workspace"]
    assert changes() == [("contact.updated", everything)]


def test_an_instance_knows_its_own_saves_whichever_thread_made_them(
    workspace: Workspace,
) -> None:
    contact = Contact.objects.create(workspace=workspace, name="v1", email="a@x")

    def in_another_thread(work: Callable[[], Any]) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from django.db import connections

        def run() -> None:
            try:
                work()
            finally:
                connections.close_all()

        with ThreadPoolExecutor(1) as pool:
            pool.submit(run).result()

    contact.email = "b@x"
    in_another_thread(contact.save)
    forget_messages()
    # The row holds "b@x" and "v1": only the name changes, whichever thread knew the email.
    contact.name = "v2"
    contact.save()
    assert changes() == [("contact.updated", ["name"])]
    forget_messages()
    contact.email = "a@x"
    in_another_thread(contact.save)
    assert changes() == [("contact.updated", ["email"])]


def test_a_read_of_rows_of_several_classes_knows_what_each_was_loaded_with(
    workspace: Workspace,
) -> None:
    # A child's row first, then a parent's alone: one fetch of two classes, each with columns
    # of its own (django-model-utils' select_subclasses(), django-polymorphic).
    Dog.objects.create(workspace=workspace, name="Rex", breed="lab")
    Animal.objects.create(workspace=workspace, name="Tom")

    rex, tom = each_as_it_is(Animal.objects.order_by("pk"))

    assert (type(rex), type(tom)) == (Dog, Animal)
    forget_messages()
    rex.save()  # unchanged: each knows what it was loaded with
    tom.name = "Tom2"
    tom.save()
    assert changes() == [("animal.updated", ["name"])]
