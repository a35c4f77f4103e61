"""Model writes announce the exact internal messages, after commit, to the right audience."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import decimal
import json
import logging
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.db import connection, models, transaction
from django.db.models import F
from django.db.models.deletion import Collector
from django.db.models.signals import post_save
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory, override_settings
from django.test.utils import CaptureQueriesContext, isolate_apps
from django.utils.dateparse import parse_duration

from realtime import announce, limits, realtime_model
from realtime.auth import RealtimeAuth
from realtime.middleware import OriginMiddleware
from realtime.paths import target_pks
from realtime.writes import receivers
from realtime.writes.decorator import unregister
from tests.helpers import events, forget_messages, only_on, published
from tests.testapp.models import (
    Animal,
    Attachment,
    Badge,
    Comment,
    Company,
    Contact,
    Crew,
    Dog,
    Folder,
    GuardedTask,
    Invoice,
    Item,
    Locker,
    Message,
    Notification,
    Parcel,
    Plain,
    Point,
    Preference,
    Preview,
    PrivateNote,
    Project,
    Room,
    Sighting,
    Tag,
    Task,
    Thread,
    Ticket,
    VipContact,
    Workspace,
    WorkspaceView,
)

Capture = Callable[..., Any]


def scope_event(
    event_type: str,
    data: Any,
    channels: list[str] | None,
    scope_id: Any,
    meta: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "target": "scope",
        "scope_id": scope_id,
        "event_type": event_type,
        "data": data,
        "channels": channels,
        "meta": meta or {},
        **extra,
    }


def contact_data(contact: Contact, **changes: Any) -> dict[str, Any]:
    data = {
        "model": "contact",
        "id": contact.pk,
        "name": contact.name,
        "company": contact.company_id,
        "born": None,
        "score": None,
    }
    return {**data, **changes}


def contact_channels(contact: Contact) -> list[str]:
    channels = ["contact", f"contact:{contact.pk}"]
    if contact.company_id is not None:
        channels.append(f"company:{contact.company_id}")
    return channels


@pytest.fixture
def company(workspace: Workspace) -> Company:
    return Company.objects.create(workspace=workspace, name="Initech")


class TestCreateUpdateDelete:
    def test_create_announces_the_exact_message_after_commit(
        self, workspace: Workspace, company: Company, django_capture_on_commit_callbacks: Capture
    ) -> None:
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            contact = Contact.objects.create(workspace=workspace, company=company, name="Ann")
            assert published() == []
        assert events() == [
            scope_event(
                "contact.created", contact_data(contact), contact_channels(contact), workspace.pk
            )
        ]
        channel, _ = published()[0]
        assert channel == f"realtime_{workspace.pk}"

    def test_update_says_which_fields_changed(
        self, workspace: Workspace, company: Company, django_capture_on_commit_callbacks: Capture
    ) -> None:
        contact = Contact.objects.create(workspace=workspace, company=company, name="Ann")
        loaded = Contact.objects.get(pk=contact.pk)
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            loaded.name = "Anna"
            loaded.notes = "met at the fair"
            loaded.save()
        assert events() == [
            scope_event(
                "contact.updated",
                contact_data(loaded),
                contact_channels(loaded),
                workspace.pk,
                meta={"changed": ["name", "notes"]},
            )
        ]

    def test_update_names_foreign_keys_by_field_name(
        self, workspace: Workspace, company: Company, django_capture_on_commit_callbacks: Capture
    ) -> None:
        contact = Contact.objects.create(workspace=workspace, name="Ann")
        loaded = Contact.objects.get(pk=contact.pk)
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            loaded.company = company
            loaded.save()
        (message,) = events()
        assert message["meta"] == {"changed": ["company"]}

    def test_update_fields_are_the_changed_fields(
        self, workspace: Workspace, django_capture_on_commit_callbacks: Capture
    ) -> None:
        contact = Contact.objects.create(workspace=workspace, name="Ann")
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            contact.save(update_fields=["email", "name"])
        (message,) = events()
        assert message["meta"] == {"changed": ["email", "name"]}

    def test_a_save_that_changed_nothing_announces_nothing(
        self, workspace: Workspace, django_capture_on_commit_callbacks: Capture
    ) -> None:
        contact = Contact.objects.create(workspace=workspace, name="Ann")
        loaded = Contact.objects.get(pk=contact.pk)
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            loaded.save()
            contact.save()  # saved right after its create: nothing differs either
        assert events() == []

    def test_an_instance_built_by_hand_counts_every_column_as_written(
        self, workspace: Workspace, django_capture_on_commit_callbacks: Capture
    ) -> None:
        contact = Contact.objects.create(workspace=workspace, name="Ann")
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            Contact(pk=contact.pk, workspace=workspace, name="Bea").save()
        (message,) = events()
        assert message["meta"] == {
            "changed": ["born", "company", "email", "name", "notes", "score", "workspace"]
        }

    def test_refresh_from_db_resets_what_counts_as_changed(
        self, workspace: Workspace, django_capture_on_commit_callbacks: Capture
    ) -> None:
        contact = Contact.objects.create(workspace=workspace, name="Ann")
        loaded = Contact.objects.get(pk=contact.pk)
        Contact.objects.filter(pk=contact.pk).update(name="Changed elsewhere")
        loaded.refresh_from_db()
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            loaded.notes = "only this"
            loaded.save()
        (message,) = events()
        assert message["meta"] == {"changed": ["notes"]}

    def test_deferred_fields_are_announced_as_the_row_holds_them_and_stay_deferred(
        self, workspace: Workspace, company: Company, django_capture_on_commit_callbacks: Capture
    ) -> None:
        born = datetime.datetime(2001, 2, 3, 4, 5, tzinfo=datetime.UTC)
        contact = Contact.objects.create(
            workspace=workspace, company=company, name="a", born=born, notes="long"
        )
        deferred = Contact.objects.only("id", "workspace", "score").get(pk=contact.pk)
        left_out = deferred.get_deferred_fields()
        forget_messages()
        with (
            django_capture_on_commit_callbacks(execute=True),
            CaptureQueriesContext(connection) as queries,
        ):
            deferred.score = 3
            deferred.save()
        (message,) = events()
        assert message["data"] == contact_data(
            contact, born="2001-02-03T04:05:00+00:00", score=message["data"]["score"]
        )
        assert decimal.Decimal(str(message["data"]["score"])) == 3
        # Django's save still writes only what the instance loaded; the instance still
        # defers what it deferred; realtime read the three columns its event carries.
        statements = [q["sql"] for q in queries.captured_queries]
        (update,) = [sql for sql in statements if sql.startswith("UPDATE")]
        assert '"score"' in update.split("WHERE")[0] or "`score`" in update
        assert "name" not in update.split("WHERE")[0]
        table = Contact._meta.db_table
        (read,) = [sql for sql in statements if sql.startswith("SELECT") and "JOIN" not in sql]
        assert table in read.split("FROM")[1]
        assert all(column in read for column in ("name", "company_id", "born"))
        assert "notes" not in read
        assert "email" not in read
        assert deferred.get_deferred_fields() == left_out

    def test_a_deferred_instance_saved_tells_the_fields_it_changed_and_nothing_unchanged(
        self, workspace: Workspace, django_capture_on_commit_callbacks: Capture
    ) -> None:
        """Django saves an instance loaded with ``only()`` with ``update_fields`` of its own
        (every column loaded): ``changed`` is still what differs from the snapshot, and a
        save that changed nothing announces nothing, as for an instance loaded whole."""
        contact = Contact.objects.create(workspace=workspace, name="Ann", notes="n")
        deferred = Contact.objects.only("id", "workspace", "name", "notes").get(pk=contact.pk)
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            deferred.save()
        assert events() == []
        with django_capture_on_commit_callbacks(execute=True):
            deferred.notes = "m"
            deferred.save()
        assert [m["meta"] for m in events()] == [{"changed": ["notes"]}]

    def test_update_fields_the_caller_names_are_told_even_when_unchanged(
        self, workspace: Workspace, django_capture_on_commit_callbacks: Capture
    ) -> None:
        contact = Contact.objects.create(workspace=workspace, name="Ann", notes="n")
        deferred = Contact.objects.only("id", "workspace", "name", "notes").get(pk=contact.pk)
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            deferred.save(update_fields=["name", "notes"])
        assert [m["meta"] for m in events()] == [{"changed": ["name", "notes"]}]

    def test_a_deferred_scope_is_read_and_the_save_announced_in_it(
        self, workspace: Workspace, django_capture_on_commit_callbacks: Capture
    ) -> None:
        contact = Contact.objects.create(workspace=workspace, name="Ann")
        deferred = Contact.objects.only("id", "name").get(pk=contact.pk)
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            deferred.name = "Bea"
            deferred.save()
        assert [(m["event_type"], m["scope_id"], m["data"]["name"]) for m in events()] == [
            ("contact.updated", workspace.pk, "Bea")
        ]

    def test_a_deferred_instance_deleted_announces_the_row_as_it_was(
        self, workspace: Workspace, company: Company, django_capture_on_commit_callbacks: Capture
    ) -> None:
        contact = Contact.objects.create(workspace=workspace, company=company, name="Ann")
        expected = scope_event(
            "contact.deleted", contact_data(contact), contact_channels(contact), workspace.pk
        )
        deferred = Contact.objects.only("id").get(pk=contact.pk)
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            deferred.delete()
        assert events() == [expected]

    def test_delete_announces_the_row_as_it_was(
        self, workspace: Workspace, company: Company, django_capture_on_commit_callbacks: Capture
    ) -> None:
        contact = Contact.objects.create(workspace=workspace, company=company, name="Ann")
        expected = scope_event(
            "contact.deleted", contact_data(contact), contact_channels(contact), workspace.pk
        )
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            contact.delete()
        assert events() == [expected]

    def test_dates_and_decimals_travel_as_iso_8601_and_text(
        self, workspace: Workspace, django_capture_on_commit_callbacks: Capture
    ) -> None:
        born = datetime.datetime(
            2026, 9, 15, 14, 30, 0, 120000, tzinfo=datetime.timezone(datetime.timedelta(hours=2))
        )
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            Contact.objects.create(
                workspace=workspace, name="Ann", born=born, score=decimal.Decimal("12.50")
            )
        (message,) = events()
        assert message["data"]["born"] == "2026-09-15T12:30:00.120000+00:00"
        assert message["data"]["score"] == "12.50"

    def test_durations_travel_in_iso_8601_as_django_writes_them(
        self, workspace: Workspace, django_capture_on_commit_callbacks: Capture
    ) -> None:
        spans = [
            datetime.timedelta(days=1, hours=2),
            datetime.timedelta(seconds=-1.5),
            datetime.timedelta(0),
        ]
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            for span in spans:
                Parcel.objects.create(workspace=workspace, span=span)
        sent = [message["data"]["span"] for message in events()]
        assert sent == ["P1DT02H00M00S", "-P0DT00H00M01.500000S", "P0DT00H00M00S"]
        assert [parse_duration(text) for text in sent] == spans

    def test_a_json_field_with_an_encoder_of_its_own_travels_as_the_row_holds_it(
        self, workspace: Workspace, django_capture_on_commit_callbacks: Capture
    ) -> None:
        when = datetime.datetime(2020, 1, 1, 10, 0, 0, 123456, tzinfo=datetime.UTC)
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            parcel = Parcel.objects.create(
                workspace=workspace, shape={"p": Point(1, 2), "s": {3, 1}, "when": when}
            )
        loaded = Parcel.objects.get(pk=parcel.pk)  # its decoder reads the point back
        assert loaded.shape is not None
        assert loaded.shape["p"] == Point(1, 2)
        with django_capture_on_commit_callbacks(execute=True):
            loaded.rank = 2
            loaded.save()
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT shape FROM {Parcel._meta.db_table}")
            (raw,) = cursor.fetchone()
        stored = json.loads(raw) if isinstance(raw, str) else raw
        assert stored == {"p": {"x": 1, "y": 2}, "s": [1, 3], "when": "2020-01-01T10:00:00.123Z"}
        assert [message["data"]["shape"] for message in events()] == [stored, stored]

    def test_disabled_actions_announce_nothing(
        self, workspace: Workspace, django_capture_on_commit_callbacks: Capture
    ) -> None:
        view = WorkspaceView.objects.get(pk=workspace.pk)
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            view.name = "Acme Inc"
            view.save()
            WorkspaceView.objects.create(name="Other", slug="other")
        assert [m["event_type"] for m in events()] == ["workspace_view.updated"]
        assert events()[0]["scope_id"] == workspace.pk

    def test_an_update_announces_the_generated_columns_as_the_database_computed_them(
        self, workspace: Workspace, django_capture_on_commit_callbacks: Capture
    ) -> None:
        # Django 5.2 leaves the instance's total as it was loaded (6); Django 6 reads it back
        # (or defers it, on MariaDB). The event tells the row's, every time.
        invoice = Invoice.objects.get(
            pk=Invoice.objects.create(workspace=workspace, price=3, quantity=2).pk
        )

        def totals_told(write: Callable[[], None]) -> list[Any]:
            forget_messages()
            with django_capture_on_commit_callbacks(execute=True):
                write()
            return [m["data"]["total"] for m in events()]

        invoice.price = 10
        assert totals_told(invoice.save) == [20]
        invoice.quantity = 4
        assert totals_told(lambda: invoice.save(update_fields=["quantity"])) == [40]
        assert Invoice.objects.values_list("total", flat=True).get(pk=invoice.pk) == 40

    def test_an_update_that_changes_a_generated_column_lists_it_as_changed(
        self, workspace: Workspace, django_capture_on_commit_callbacks: Capture
    ) -> None:
        invoice = Invoice.objects.get(
            pk=Invoice.objects.create(workspace=workspace, price=3, quantity=2).pk
        )

        def changed_told(write: Callable[[], None]) -> list[Any]:
            forget_messages()
            with django_capture_on_commit_callbacks(execute=True):
                write()
            return [m["meta"]["changed"] for m in events()]

        invoice.price = 10
        assert changed_told(invoice.save) == [["price", "total"]]
        invoice.quantity = 4
        assert changed_told(lambda: invoice.save(update_fields=["quantity"])) == [
            ["quantity", "total"]
        ]

    def test_a_proxy_of_a_decorated_model_announces_like_it(
        self, workspace: Workspace, django_capture_on_commit_callbacks: Capture
    ) -> None:
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            vip = VipContact.objects.create(workspace=workspace, name="Vera")
        assert [m["event_type"] for m in events()] == ["contact.created"]
        assert events()[0]["data"]["id"] == vip.pk

    def test_a_row_without_a_scope_announces_nothing(
        self, django_capture_on_commit_callbacks: Capture, db: None
    ) -> None:
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            contact = Contact.objects.create(workspace=None, name="Nobody's")
            contact.name = "Still nobody's"
            contact.save()
            contact.delete()
        assert events() == []

    def test_an_undecorated_model_announces_nothing_and_keeps_fast_delete(
        self, workspace: Workspace, django_capture_on_commit_callbacks: Capture
    ) -> None:
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            Plain.objects.create(workspace=workspace, name="plain")
        assert events() == []
        assert Collector(using="default").can_fast_delete(Plain.objects.all())
        assert not Collector(using="default").can_fast_delete(Contact.objects.all())


class TestTransactions:
    @pytest.mark.django_db(transaction=True)
    def test_a_rolled_back_transaction_announces_nothing(self, workspace: Workspace) -> None:
        def write_then_fail() -> None:
            with transaction.atomic():
                Contact.objects.create(workspace=workspace, name="Ghost")
                raise RuntimeError("roll back")

        forget_messages()
        with pytest.raises(RuntimeError):
            write_then_fail()
        assert events() == []

    @pytest.mark.django_db(transaction=True)
    def test_a_rolled_back_savepoint_announces_nothing_while_the_rest_does(
        self, workspace: Workspace
    ) -> None:
        def write_then_fail(kept: Contact) -> None:
            with transaction.atomic():
                Contact.objects.create(workspace=workspace, name="Ghost")
                kept.name = "Renamed in the lost savepoint"
                kept.save()
                raise RuntimeError("roll back the savepoint")

        forget_messages()
        with transaction.atomic():
            kept = Contact.objects.create(workspace=workspace, name="Kept")
            with pytest.raises(RuntimeError):
                write_then_fail(kept)
            after = Contact.objects.create(workspace=workspace, name="After")
            assert events() == []
        assert [(m["event_type"], m["data"]["name"]) for m in events()] == [
            ("contact.created", "Kept"),
            ("contact.created", "After"),
        ]
        assert after.pk is not None

    @pytest.mark.django_db(transaction=True)
    def test_messages_of_one_transaction_are_published_in_write_order_in_one_insert(
        self, workspace: Workspace
    ) -> None:
        forget_messages()
        with transaction.atomic():
            first = Contact.objects.create(workspace=workspace, name="First")
            with transaction.atomic():
                Company.objects.create(workspace=workspace, name="Nested")
            Tag.objects.create(workspace=workspace, name="Last")
        assert [m["event_type"] for m in events()] == [
            "contact.created",
            "company.created",
            "tag.created",
        ]
        with connection.cursor() as cursor:
            cursor.execute("SELECT DISTINCT created_at FROM firm_channel_messages")
            assert len(cursor.fetchall()) == 1  # one INSERT stamps one time
        assert first.pk is not None

    @pytest.mark.django_db(transaction=True)
    def test_several_writes_of_one_row_are_coalesced(self, workspace: Workspace) -> None:
        forget_messages()
        with transaction.atomic():
            created = Contact.objects.create(workspace=workspace, name="v1")
            created.name = "v2"
            created.save()
        with transaction.atomic():
            loaded = Contact.objects.get(pk=created.pk)
            loaded.name = "v3"
            loaded.save()
            loaded.notes = "n"
            loaded.save()
        with transaction.atomic():
            gone = Contact.objects.create(workspace=workspace, name="short-lived")
            gone.delete()
        with transaction.atomic():
            loaded.email = "a@b.c"
            loaded.save()
            loaded.delete()
        assert [(m["event_type"], m["data"]["name"], m["meta"]) for m in events()] == [
            ("contact.created", "v2", {}),
            ("contact.updated", "v3", {"changed": ["name", "notes"]}),
            ("contact.deleted", "v3", {}),
        ]

    @pytest.mark.django_db(transaction=True)
    def test_a_failing_transport_never_fails_the_write(
        self, workspace: Workspace, caplog: pytest.LogCaptureFixture
    ) -> None:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE firm_channel_messages RENAME TO firm_channel_away")
        try:
            with caplog.at_level(logging.ERROR, logger="realtime"), transaction.atomic():
                contact = Contact.objects.create(workspace=workspace, name="Saved anyway")
        finally:
            with connection.cursor() as cursor:
                cursor.execute("ALTER TABLE firm_channel_away RENAME TO firm_channel_messages")
        assert Contact.objects.filter(pk=contact.pk).exists()
        assert any("publishing" in record.getMessage() for record in caplog.records)


@pytest.fixture
def resaved_first() -> Iterator[None]:
    """A ``post_save`` receiver of the application's, run before realtime's (connected
    before it, as one of an app listed before ``realtime`` is), that saves the instance again
    once: a name given with spaces is stored without them, by the whole row or its column."""

    def resave(sender: type[Company], instance: Company, **kwargs: Any) -> None:
        if instance.name != instance.name.strip():
            instance.name = instance.name.strip()
            instance.save(update_fields=["name"] if instance.name == "by column" else None)

    receivers.disconnect(Company)
    post_save.connect(resave, sender=Company, weak=False)
    receivers.connect(Company)
    try:
        yield
    finally:
        post_save.disconnect(resave, sender=Company)


class TestNestedSaves:
    @pytest.mark.django_db(transaction=True)
    @pytest.mark.parametrize("atomic", [True, False], ids=["atomic", "autocommit"])
    @pytest.mark.parametrize("name", ["  by column  ", "  by row  "])
    def test_a_move_saved_again_by_an_earlier_receiver_leaves_the_old_scope_and_enters_the_new(
        self, resaved_first: None, atomic: bool, name: str
    ) -> None:
        before = Workspace.objects.create(name="Before", slug="before")
        after = Workspace.objects.create(name="After", slug="after")
        company = Company.objects.get(pk=Company.objects.create(workspace=before, name="Co").pk)
        forget_messages()
        company.workspace, company.name = after, name
        with transaction.atomic() if atomic else contextlib.nullcontext():
            company.save()
        told = [(m["scope_id"], m["event_type"]) for _, m in published()]
        assert (before.pk, "company.deleted") in told
        assert (after.pk, "company.created") in told
        assert all(scope == after.pk for scope, event in told if event != "company.deleted")
        assert {event for scope, event in told if scope == before.pk} == {"company.deleted"}


class TestDeletes:
    @pytest.mark.django_db(transaction=True)
    def test_a_delete_is_published_only_once_the_row_is_gone(self, workspace: Workspace) -> None:
        from realtime.transports.table import TableTransport

        seen: list[bool] = []

        class Watching(TableTransport):
            # Written before ``txn`` existed: it is passed only when there is one.
            def publish(self, messages: Any) -> None:  # type: ignore[override]
                seen.append(Contact.objects.filter(name="Doomed").exists())
                super().publish(messages)

        contact = Contact.objects.create(workspace=workspace, name="Doomed")
        with override_settings(REALTIME_TRANSPORT=f"{__name__}.WATCHING"):
            globals()["WATCHING"] = Watching
            try:
                with transaction.atomic():
                    contact.delete()
            finally:
                del globals()["WATCHING"]
        assert seen == [False]

    @pytest.mark.parametrize("model", [Contact, Animal, Dog])
    @pytest.mark.parametrize("moved_by", ["update", "another_instance", "nobody_known"])
    def test_a_delete_is_told_to_the_scope_that_holds_the_row_now(
        self,
        workspace: Workspace,
        model: type[Contact | Animal],
        moved_by: str,
        django_capture_on_commit_callbacks: Capture,
    ) -> None:
        """The instance deleted may hold a scope its row has left since it was loaded: the
        delete is told where the row is, read from it while it exists."""
        beta = Workspace.objects.create(name="Beta", slug="beta")
        row = model._default_manager.create(workspace=workspace, name="Moved")
        stale = model._default_manager.get(pk=row.pk)
        if moved_by == "update":
            model._default_manager.filter(pk=row.pk).update(workspace=beta)
        elif moved_by == "another_instance":
            other = model._default_manager.get(pk=row.pk)
            other.workspace = beta
            other.save()
        else:  # built by hand, as the application thinks the row is: nothing is known of it
            model._default_manager.filter(pk=row.pk).update(workspace=beta)
            columns = {f.attname: getattr(row, f.attname) for f in model._meta.concrete_fields}
            stale = model(**{**columns, "workspace_id": workspace.pk})
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            stale.delete()
        assert [(e["event_type"], e["scope_id"]) for e in events("scope")] == [
            ("contact.deleted" if model is Contact else "animal.deleted", beta.pk)
        ]
        assert stale.workspace_id == workspace.pk  # the application's instance is left as it was

    @pytest.mark.django_db(transaction=True)
    @pytest.mark.parametrize("atomic", [False, True])
    def test_a_child_deleted_keeping_its_parent_tells_the_parent_row_updated_not_deleted(
        self, workspace: Workspace, atomic: bool
    ) -> None:
        """``delete(keep_parents=True)`` of a multi-table child removes the child's own row
        only: the row its parent's table keeps is still read as the parent, so it is told
        updated, as it is now, naming the child's columns that went."""
        dog = Dog.objects.create(workspace=workspace, name="Rex", breed="lab")
        pk = dog.pk
        forget_messages()

        with transaction.atomic() if atomic else contextlib.nullcontext():
            dog.delete(keep_parents=True)

        assert Animal.objects.filter(pk=pk).exists()
        assert [
            (e["event_type"], e["data"], e["meta"], e["scope_id"]) for e in events("scope")
        ] == [
            (
                "animal.updated",
                {"model": "animal", "id": pk, "name": "Rex"},
                {"changed": ["breed"]},
                workspace.pk,
            )
        ]

    @pytest.mark.django_db(transaction=True)
    def test_a_child_deleted_with_its_parent_is_told_deleted_once(
        self, workspace: Workspace
    ) -> None:
        dog = Dog.objects.create(workspace=workspace, name="Rex", breed="lab")
        pk = dog.pk
        forget_messages()

        dog.delete()

        assert [(e["event_type"], e["data"]["id"]) for e in events("scope")] == [
            ("animal.deleted", pk)
        ]

    def test_a_delete_is_told_to_the_account_that_holds_the_row_now(
        self, make_user: Callable[..., Any], django_capture_on_commit_callbacks: Capture
    ) -> None:
        ann, bob = make_user("ann"), make_user("bob")
        note = Notification.objects.create(user=ann, text="hi")
        stale = Notification.objects.get(pk=note.pk)
        Notification.objects.filter(pk=note.pk).update(user=bob)
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            stale.delete()
        assert [(e["event_type"], e["user_ids"]) for e in events("users")] == [
            ("notification.deleted", [bob.pk])
        ]

    @pytest.mark.parametrize("model", [Company, Notification])
    def test_a_delete_of_a_loaded_instance_reads_its_audience_in_one_statement(
        self,
        workspace: Workspace,
        make_user: Callable[..., Any],
        model: type[Company | Notification],
        django_assert_num_queries: Callable[..., Any],
    ) -> None:
        """Another process may have moved the row since it was loaded: the delete reads the
        columns that address it (its scope or account), one ``SELECT`` of those alone, and
        nothing more."""
        if model is Company:
            made: Any = Company.objects.create(workspace=workspace, name="Gone")
        else:
            made = Notification.objects.create(user=make_user("ann"), text="gone")
        loaded = model._default_manager.get(pk=made.pk)
        with CaptureQueriesContext(connection) as queries, transaction.atomic():
            loaded.delete()
        own = f"FROM {connection.ops.quote_name(model._meta.db_table)}"
        (read,) = [q["sql"] for q in queries if q["sql"].startswith("SELECT") and own in q["sql"]]
        column = "workspace_id" if model is Company else "user_id"
        assert column in read
        assert '"name"' not in read
        assert '"text"' not in read
        assert not model._default_manager.filter(pk=made.pk).exists()

    def test_account_audience_is_read_while_the_links_exist(
        self, make_user: Callable[..., Any], django_capture_on_commit_callbacks: Capture
    ) -> None:
        ann, bob = make_user("ann"), make_user("bob")
        thread = Thread.objects.create(title="t")
        thread.members.add(ann, bob)
        message = Message.objects.create(thread=thread, text="hello")
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            thread.delete()  # takes the links and the message with it
        assert events("users") == [
            {
                "target": "users",
                "event_type": "message.deleted",
                "data": {"model": "message", "id": message.pk, "text": "hello"},
                "channels": ["message", f"message:{message.pk}"],
                "meta": {},
                "row": True,  # a model's event: a resume re-decides it
                "user_ids": sorted([ann.pk, bob.pk]),
            }
        ]


class TestManyToMany:
    @pytest.mark.django_db(transaction=True)
    def test_a_fixture_setting_links_and_memberships_announces_nothing(
        self, workspace: Workspace, make_user: Callable[..., Any], tmp_path: Any
    ) -> None:
        """Fixtures announce nothing: Django's deserializer saves each row raw, then sets its
        many-to-many links through the manager, over links the rows had before too."""
        kept, left = make_user("kept"), make_user("left")
        old, new = (
            Tag.objects.create(workspace=workspace, name="old"),
            Tag.objects.create(workspace=workspace, name="new"),
        )
        contact = Contact.objects.create(workspace=workspace, name="Ann")
        contact.tags.add(old)
        room = Room.objects.create(name="Lobby")
        room.participants.add(left)
        rows = [
            {"model": "testapp.contact", "pk": contact.pk,
             "fields": {"workspace": workspace.pk, "name": "Ann", "tags": [new.pk]}},
            {"model": "testapp.room", "pk": room.pk,
             "fields": {"name": "Lobby", "participants": [kept.pk]}},
            {"model": "testapp.room", "pk": room.pk + 1,
             "fields": {"name": "Hall", "participants": [kept.pk, left.pk]}},
        ]  # fmt: skip
        fixture = tmp_path / "links.json"
        fixture.write_text(json.dumps(rows))
        forget_messages()
        call_command("loaddata", str(fixture), verbosity=0)
        assert list(Room.objects.get(pk=room.pk).participants.all()) == [kept]
        assert list(Contact.objects.get(pk=contact.pk).tags.all()) == [new]
        assert published() == []
        Contact.objects.get(pk=contact.pk).tags.add(old)  # the links of saved rows announce
        assert [m["event_type"] for _, m in published()] == ["contact.updated"]

    def test_adding_links_announces_the_owner_once_per_transaction(
        self, workspace: Workspace, django_capture_on_commit_callbacks: Capture
    ) -> None:
        contact = Contact.objects.create(workspace=workspace, name="Ann")
        red, blue = (Tag.objects.create(workspace=workspace, name=n) for n in ("red", "blue"))
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
            contact.tags.add(red)
            contact.tags.add(blue)
            contact.tags.remove(red)
        (message,) = events()
        assert message["event_type"] == "contact.updated"
        assert message["meta"] == {"changed": ["tags"]}
        assert message["channels"] == ["contact", f"contact:{contact.pk}", f"tag:{blue.pk}"]
        # The row was not written: its fields as this instance holds them may be older than
        # a write of it told before (see tests.test_record_order).
        assert message["data"] == {"model": "contact", "id": contact.pk}
        ((_, raw),) = published()
        assert raw["meta"]["order"][2:] == ["links"]

    def test_a_link_change_tells_the_links_it_names_and_not_the_rows_other_fields(
        self,
    ) -> None:
        from realtime.registry import options_for
        from realtime.writes.events import Event

        options = options_for(Contact)
        assert options is not None
        data = {"model": "contact", "id": 1, "name": "as the instance held it", "tags": [2, 3]}
        event = Event(options, "updated", 1, data, ["contact"], changed=["tags"])
        assert event.kept == data
        event.links_only = True
        assert event.kept == {"model": "contact", "id": 1, "tags": [2, 3]}

    def test_links_changed_where_their_row_is_written_are_told_with_the_write(
        self, workspace: Workspace, django_capture_on_commit_callbacks: Capture
    ) -> None:
        contact = Contact.objects.create(workspace=workspace, name="Ann")
        red = Tag.objects.create(workspace=workspace, name="red")
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
            contact.name = "Ann B."
            contact.save()  # holds the row: its order stands for the links too
            contact.tags.add(red)
        ((_, raw),) = published()
        assert raw["meta"]["changed"] == ["name", "tags"]
        assert raw["data"]["name"] == "Ann B."
        assert len(raw["meta"]["order"]) == 2
        assert raw["channels"] == ["contact", f"contact:{contact.pk}", f"tag:{red.pk}"]

    def test_links_added_from_the_other_side_announce_each_owner(
        self, workspace: Workspace, django_capture_on_commit_callbacks: Capture
    ) -> None:
        ann = Contact.objects.create(workspace=workspace, name="Ann")
        bob = Contact.objects.create(workspace=workspace, name="Bob")
        tag = Tag.objects.create(workspace=workspace, name="red")
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            tag.contacts.add(ann, bob)
        assert sorted((m["event_type"], m["data"]["id"]) for m in events()) == [
            ("contact.updated", ann.pk),
            ("contact.updated", bob.pk),
        ]

    def test_clear_announces_owners_that_had_links_and_nothing_else(
        self, workspace: Workspace, django_capture_on_commit_callbacks: Capture
    ) -> None:
        linked = Contact.objects.create(workspace=workspace, name="Linked")
        alone = Contact.objects.create(workspace=workspace, name="Alone")
        tag = Tag.objects.create(workspace=workspace, name="red")
        linked.tags.add(tag)
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            linked.tags.clear()
            alone.tags.clear()
            alone.tags.add()  # an empty add changes nothing
        assert [(m["event_type"], m["data"]["id"]) for m in events()] == [
            ("contact.updated", linked.pk)
        ]

    def test_clear_from_the_other_side_announces_the_owners_it_unlinks(
        self, workspace: Workspace, django_capture_on_commit_callbacks: Capture
    ) -> None:
        ann = Contact.objects.create(workspace=workspace, name="Ann")
        tag = Tag.objects.create(workspace=workspace, name="red")
        ann.tags.add(tag)
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            tag.contacts.clear()
        assert [(m["event_type"], m["data"]["id"]) for m in events()] == [
            ("contact.updated", ann.pk)
        ]


class TestRelationChannels:
    def test_a_generic_relation_reaches_its_target_channel(
        self, workspace: Workspace, company: Company, django_capture_on_commit_callbacks: Capture
    ) -> None:
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            remark = Comment.objects.create(
                workspace=workspace,
                text="nice",
                target_type=ContentType.objects.get_for_model(Company),
                target_id=company.pk,
            )
        (message,) = events()
        assert message["event_type"] == "remark.created"
        assert message["data"] == {"model": "remark", "id": remark.pk, "body": "nice"}
        assert message["channels"] == ["remark", f"remark:{remark.pk}", f"company:{company.pk}"]

    @pytest.mark.parametrize(("tags", "expected"), [(50, 50), (51, 0)])
    def test_more_than_fifty_relation_channels_drop_them_all(
        self,
        workspace: Workspace,
        django_capture_on_commit_callbacks: Capture,
        tags: int,
        expected: int,
    ) -> None:
        contact = Contact.objects.create(workspace=workspace, name="Popular")
        contact.tags.set(
            [Tag.objects.create(workspace=workspace, name=f"t{n}") for n in range(tags)]
        )
        loaded = Contact.objects.get(pk=contact.pk)
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            loaded.name = "Still popular"
            loaded.save()
        (message,) = events()
        assert message["channels"][:2] == ["contact", f"contact:{contact.pk}"]
        assert len([c for c in message["channels"] if c.startswith("tag:")]) == expected
        assert limits.MAX_RELATION_CHANNELS == 50

    def test_a_plain_scoped_model_reads_without_a_query(
        self,
        workspace: Workspace,
        company: Company,
        django_assert_num_queries: Callable[..., Any],
    ) -> None:
        # One query, the INSERT itself: publication happens after the commit.
        with django_assert_num_queries(1), transaction.atomic(savepoint=False):
            Company.objects.create(workspace=workspace, name="Quick")


class TestToFieldRelationChannels:
    """A relation through a foreign key declared with ``to_field`` (a crew by its code) is
    heard on the record channel of the target's primary key, as a page showing the target
    subscribes to it, whichever write announces the row."""

    @pytest.fixture
    def crews(self, db: None) -> tuple[Crew, Crew]:
        return Crew.objects.create(code="blue", name="Blue"), Crew.objects.create(
            code="red", name="Red"
        )

    @staticmethod
    def crew_channels() -> list[list[str]]:
        return [[c for c in e["channels"] if c.startswith("crew:")] for e in events("scope")]

    def test_a_created_row_is_heard_on_its_targets_primary_key_channel(
        self,
        workspace: Workspace,
        crews: tuple[Crew, Crew],
        django_capture_on_commit_callbacks: Capture,
    ) -> None:
        blue, _ = crews
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            sighting = Sighting.objects.create(workspace=workspace, crew=blue, text="hi")
        (message,) = events("scope")
        assert message["channels"] == ["sighting", f"sighting:{sighting.pk}", f"crew:{blue.pk}"]

    def test_saves_updates_bulk_writes_and_deletes_name_the_targets_primary_key(
        self,
        workspace: Workspace,
        crews: tuple[Crew, Crew],
        django_capture_on_commit_callbacks: Capture,
    ) -> None:
        blue, red = crews
        heard = []

        def channels_of(write: Callable[[], Any]) -> None:
            forget_messages()
            with django_capture_on_commit_callbacks(execute=True):
                write()
            heard.append(self.crew_channels())

        rows = [Sighting(workspace=workspace, crew=blue, text=str(n)) for n in range(2)]
        channels_of(lambda: Sighting.objects.bulk_create(rows))
        first = Sighting.objects.get(pk=rows[0].pk)
        first.crew_id = "red"  # the column alone, holding the code
        channels_of(first.save)
        channels_of(lambda: Sighting.objects.filter(pk=first.pk).update(text="changed"))
        first.crew = blue
        channels_of(lambda: Sighting.objects.bulk_update([first], ["crew"]))
        channels_of(lambda: Sighting.objects.filter(pk=rows[1].pk).delete())
        channels_of(first.delete)
        blue_channel, red_channel = f"crew:{blue.pk}", f"crew:{red.pk}"
        assert heard == [
            [[blue_channel], [blue_channel]],  # bulk_create()
            [[red_channel]],  # save()
            [[red_channel]],  # update()
            [[blue_channel]],  # bulk_update()
            [[blue_channel]],  # QuerySet.delete()
            [[blue_channel]],  # delete()
        ]

    def test_a_row_leaving_its_scope_leaves_its_targets_primary_key_channel(
        self,
        workspace: Workspace,
        crews: tuple[Crew, Crew],
        django_capture_on_commit_callbacks: Capture,
    ) -> None:
        blue, _ = crews
        elsewhere = Workspace.objects.create(name="Elsewhere", slug="elsewhere")
        sighting = Sighting.objects.create(workspace=workspace, crew=blue, text="hi")
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            sighting.workspace = elsewhere
            sighting.save()
        heard = [(e["scope_id"], e["event_type"], e["channels"]) for e in events("scope")]
        assert (
            workspace.pk,
            "sighting.deleted",
            ["sighting", f"sighting:{sighting.pk}", f"crew:{blue.pk}"],
        ) in heard, heard

    @only_on("mysql")  # its collation takes "BLUE" for "blue"; elsewhere the key is refused
    def test_a_key_written_in_another_form_than_its_target_holds_is_heard_on_that_targets_channel(
        self,
        workspace: Workspace,
        crews: tuple[Crew, Crew],
        django_capture_on_commit_callbacks: Capture,
    ) -> None:
        blue, _ = crews
        held = Sighting.objects.create(workspace=workspace, crew_id="Blue ", text="held")
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            Sighting.objects.create(workspace=workspace, crew_id="BLUE", text="hi")
            held.text = "again"
            held.save()
        assert self.crew_channels() == [[f"crew:{blue.pk}"], [f"crew:{blue.pk}"]]

    def test_the_targets_of_keys_are_the_rows_the_database_matched_them_to(
        self, crews: tuple[Crew, Crew], django_assert_num_queries: Callable[..., Any]
    ) -> None:
        blue, red = crews
        ab, a_b = (Crew.objects.create(code=code, name=code) for code in ("ab", "a-b"))
        crew = Sighting._meta.get_field("crew")
        with django_assert_num_queries(1):  # every key as its target holds it: one statement
            assert target_pks(crew, ["blue", "red"]) == {"blue": blue.pk, "red": red.pk}
        given = ["BLUE", "Red ", "ab", "A-B", "green"]
        if connection.vendor == "mysql":  # "A-B" shares its loose key with "ab" and "a-b"
            expected = {"BLUE": blue.pk, "Red ": red.pk, "ab": ab.pk, "A-B": a_b.pk}
        else:  # text compared as Python does: a key names the row holding it exactly
            expected = {"ab": ab.pk}
        assert target_pks(crew, given) == expected

    def test_a_key_holding_the_targets_primary_key_reads_no_row(
        self,
        workspace: Workspace,
        company: Company,
        django_assert_num_queries: Callable[..., Any],
    ) -> None:
        # A contact's company (relations=["company"]): the INSERT alone, as before.
        with django_assert_num_queries(1), transaction.atomic(savepoint=False):
            Contact.objects.create(workspace=workspace, company=company, name="Quick")


class TestAccountEvents:
    def test_a_row_handed_to_another_account_by_a_to_field_key_leaves_the_account_that_held_it(
        self, make_user: Callable[..., Any], django_capture_on_commit_callbacks: Capture
    ) -> None:
        ann, bob = make_user("ann"), make_user("bob")
        locker = Locker.objects.create(owner=ann, title="hers")
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            locker.owner = bob
            locker.save()
        heard = [(e["event_type"], e["user_ids"]) for e in events("users")]
        assert heard == [("locker.deleted", [ann.pk]), ("locker.created", [bob.pk])]
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            locker.owner = None
            locker.save()
        heard = [(e["event_type"], e["user_ids"]) for e in events("users")]
        assert heard == [("locker.deleted", [bob.pk])]

    def test_a_bulk_update_handing_rows_by_a_to_field_key_leaves_the_accounts_that_held_them(
        self, make_user: Callable[..., Any], django_capture_on_commit_callbacks: Capture
    ) -> None:
        ann, bob = make_user("ann"), make_user("bob")
        lockers = [Locker.objects.create(owner=ann, title=str(n)) for n in range(3)]
        forget_messages()
        with (
            django_capture_on_commit_callbacks(execute=True),
            CaptureQueriesContext(connection) as queries,
        ):
            for locker in lockers:
                locker.owner = bob
            Locker.objects.bulk_update(lockers, ["owner"])
        heard = sorted((e["event_type"], e["user_ids"]) for e in events("users"))
        assert heard == [
            *[("locker.created", [bob.pk])] * 3,
            *[("locker.deleted", [ann.pk])] * 3,
        ]
        # The accounts the rows held, looked up by username for all of them at once.
        by_name = [q["sql"] for q in queries if "username" in q["sql"] and " IN " in q["sql"]]
        assert len(by_name) == 1, by_name

    @only_on("mysql")  # its collation takes "ANN" for "ann"; elsewhere the key is refused
    def test_rows_whose_to_field_key_names_their_account_in_another_form_leave_and_enter_it(
        self, make_user: Callable[..., Any], django_capture_on_commit_callbacks: Capture
    ) -> None:
        ann, bob = make_user("ann"), make_user("bob")
        locker = Locker.objects.create(owner_id="ANN", title="hers")
        others = [Locker.objects.create(owner_id="Ann ", title=str(n)) for n in range(2)]

        def heard_of(write: Callable[[], Any]) -> list[tuple[str, list[Any]]]:
            forget_messages()
            with django_capture_on_commit_callbacks(execute=True):
                write()
            return sorted((e["event_type"], e["user_ids"]) for e in events("users"))

        locker.owner = bob
        assert heard_of(locker.save) == [("locker.created", [bob.pk]), ("locker.deleted", [ann.pk])]
        for other in others:
            other.owner = bob
        assert heard_of(lambda: Locker.objects.bulk_update(others, ["owner"])) == [
            *[("locker.created", [bob.pk])] * 2,
            *[("locker.deleted", [ann.pk])] * 2,
        ]
        assert heard_of(lambda: Locker.objects.filter(pk=locker.pk).update(owner="ANN")) == [
            ("locker.created", [ann.pk]),
            ("locker.deleted", [bob.pk]),
        ]

    @override_settings(REALTIME_BULK_LIMIT=1)
    def test_an_update_writing_a_to_field_key_folds_its_surplus_rows_to_the_accounts_pk(
        self, make_user: Callable[..., Any], django_capture_on_commit_callbacks: Capture
    ) -> None:
        ann, bob = make_user("ann"), make_user("bob")
        for n in range(3):
            Locker.objects.create(owner=ann, title=str(n))
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            Locker.objects.update(owner="bob")
        folded = [e["user_ids"] for e in events("users") if e["meta"].get("truncated")]
        assert folded == [sorted([ann.pk, bob.pk])], events("users")

    def test_a_one_hop_account_event_reaches_that_account(
        self, make_user: Callable[..., Any], django_capture_on_commit_callbacks: Capture
    ) -> None:
        ann = make_user("ann")
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            note = Notification.objects.create(user=ann, text="hi")
        assert events() == [
            {
                "target": "users",
                "event_type": "notification.created",
                "data": {"model": "notification", "id": note.pk, "text": "hi"},
                "channels": ["notification", f"notification:{note.pk}"],
                "meta": {},
                "row": True,  # a model's event: a resume re-decides it
                "user_ids": [ann.pk],
            }
        ]
        assert published()[0][0] == "realtime"

    def test_an_empty_hop_reaches_nobody(
        self, django_capture_on_commit_callbacks: Capture, db: None
    ) -> None:
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            Notification.objects.create(user=None, text="to nobody")
            Message.objects.create(thread=Thread.objects.create(title="empty"), text="echo")
        assert events() == []

    def test_a_multi_hop_account_event_reaches_every_account_on_the_path(
        self, make_user: Callable[..., Any], django_capture_on_commit_callbacks: Capture
    ) -> None:
        users = [make_user(f"u{n}") for n in range(3)]
        thread = Thread.objects.create(title="t")
        thread.members.add(*users)
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            Message.objects.create(thread=thread, text="all of you")
        (message,) = events()
        assert message["user_ids"] == sorted(user.pk for user in users)

    def test_a_row_handed_to_another_account_by_its_one_to_one_key_leaves_one_and_enters_the_other(
        self, make_user: Callable[..., Any], django_capture_on_commit_callbacks: Capture
    ) -> None:
        ann, bob = make_user("ann"), make_user("bob")
        preference = Preference.objects.create(user=ann, theme="dark")
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            preference.user = bob
            preference.save()
        heard = [(e["event_type"], e["user_ids"], e["data"]) for e in events("users")]
        assert heard == [
            ("preference.deleted", [ann.pk], {"model": "preference", "id": preference.pk}),
            (
                "preference.created",
                [bob.pk],
                {"model": "preference", "id": preference.pk, "theme": "dark"},
            ),
        ]


class TestGuardedAndShared:
    def test_a_guarded_create_carries_what_it_is_about(
        self,
        workspace: Workspace,
        make_user: Callable[..., Any],
        django_capture_on_commit_callbacks: Capture,
    ) -> None:
        ann = make_user("ann", member_of=workspace)
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            note = PrivateNote.objects.create(workspace=workspace, author=ann, title="mine")
        (message,) = events()
        assert message["about"] == {"model": "private_note", "id": note.pk}
        assert "only" not in message

    def test_a_guarded_delete_travels_with_the_readers_decided_before_the_row_went(
        self,
        workspace: Workspace,
        make_user: Callable[..., Any],
        django_capture_on_commit_callbacks: Capture,
    ) -> None:
        ann = make_user("ann", member_of=workspace)
        make_user("bob", member_of=workspace)
        note = PrivateNote.objects.create(workspace=workspace, author=ann, title="mine")
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            note.delete()
        (message,) = events()
        assert message["event_type"] == "private_note.deleted"
        assert message["only"] == [ann.pk]
        assert "about" not in message

    def test_a_guarded_delete_nobody_may_read_publishes_nothing(
        self,
        workspace: Workspace,
        make_user: Callable[..., Any],
        django_capture_on_commit_callbacks: Capture,
    ) -> None:
        outsider = make_user("out")
        make_user("bob", member_of=workspace)
        note = PrivateNote.objects.create(workspace=workspace, author=outsider, title="x")
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            note.delete()
        assert events() == []

    def test_shared_readers_outside_the_scope_hear_it_as_an_account_event(
        self,
        workspace: Workspace,
        make_user: Callable[..., Any],
        django_capture_on_commit_callbacks: Capture,
    ) -> None:
        partner = Workspace.objects.create(name="Partner", slug="partner")
        member = make_user("member", member_of=workspace)
        both = make_user("both", member_of=[workspace, partner])
        guest = make_user("guest", member_of=partner)
        project = Project.objects.create(workspace=workspace, name="P")
        project.shared_with.add(partner)
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            task = Task.objects.create(workspace=workspace, project=project, title="do it")
        scope_message, users_message = events()
        assert scope_message["target"] == "scope"
        assert users_message == {
            "target": "users",
            "event_type": "task.created",
            "data": {"model": "task", "id": task.pk, "title": "do it"},
            "channels": ["task", f"task:{task.pk}"],
            "meta": {},
            "row": True,  # a model's event: a resume re-decides it
            "user_ids": [guest.pk],
        }
        assert member.pk != both.pk

    def test_shared_readers_of_a_guarded_record_are_checked_with_its_guard(
        self,
        workspace: Workspace,
        make_user: Callable[..., Any],
        django_capture_on_commit_callbacks: Capture,
    ) -> None:
        partner = Workspace.objects.create(name="Partner", slug="partner")
        make_user("guest", member_of=partner)
        project = Project.objects.create(workspace=workspace, name="P")
        project.shared_with.add(partner)
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            GuardedTask.objects.create(workspace=workspace, project=project, title="s", secret=True)
        assert [m["target"] for m in events()] == ["scope"]


class TestCascades:
    def test_rows_the_database_deletes_are_announced(
        self, workspace: Workspace, django_capture_on_commit_callbacks: Capture
    ) -> None:
        contact = Contact.objects.create(workspace=workspace, name="Ann")
        files = [
            Attachment.objects.create(workspace=workspace, contact=contact, name=f"f{n}")
            for n in range(2)
        ]
        contact_pk = contact.pk
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            contact.delete()
        assert not Attachment.objects.filter(pk__in=[f.pk for f in files]).exists()
        assert sorted((m["event_type"], m["data"]["id"]) for m in events()) == sorted(
            [("attachment.deleted", f.pk) for f in files] + [("contact.deleted", contact_pk)]
        )

    def test_rows_the_database_deletes_with_rows_it_deletes_are_announced(
        self, workspace: Workspace, django_capture_on_commit_callbacks: Capture
    ) -> None:
        # contact -> attachments -> previews, both removed by the database's cascade.
        contact, other = (Contact.objects.create(workspace=workspace, name=n) for n in "ab")
        files = [
            Attachment.objects.create(workspace=workspace, contact=contact, name=f"f{n}")
            for n in range(2)
        ]
        previews = [
            Preview.objects.create(workspace=workspace, attachment=f, name=f"p{n}")
            for f in files
            for n in range(2)
        ]
        kept = Preview.objects.create(
            workspace=workspace,
            attachment=Attachment.objects.create(workspace=workspace, contact=other, name="o"),
            name="kept",
        )
        contact_pk = contact.pk
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            contact.delete()
        assert not Preview.objects.filter(pk__in=[p.pk for p in previews]).exists()
        assert Preview.objects.filter(pk=kept.pk).exists()
        assert sorted((m["event_type"], m["data"]["id"]) for m in events()) == sorted(
            [("attachment.deleted", f.pk) for f in files]
            + [("preview.deleted", p.pk) for p in previews]
            + [("contact.deleted", contact_pk)]
        )

    @override_settings(REALTIME_CASCADE_LIMIT=2)
    def test_rows_the_database_deletes_a_level_down_past_the_limit_fold_into_one_event(
        self, workspace: Workspace, django_capture_on_commit_callbacks: Capture
    ) -> None:
        # Three attachments (one past the limit), each with a preview: the preview of the
        # attachment past the limit is one of the previews too.
        contact = Contact.objects.create(workspace=workspace, name="Ann")
        for n in range(3):
            attachment = Attachment.objects.create(workspace=workspace, contact=contact, name="f")
            Preview.objects.create(workspace=workspace, attachment=attachment, name=f"p{n}")
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            contact.delete()
        previews = [m for m in events() if m["event_type"] == "preview.deleted"]
        assert len([m for m in previews if m["data"] is not None]) == 2
        assert [m for m in previews if m["data"] is None] == [
            scope_event(
                "preview.deleted", None, ["preview"], workspace.pk, meta={"truncated": True}
            )
        ]

    @pytest.mark.parametrize("how", ["instance", "queryset"])
    def test_rows_the_database_deletes_are_announced_when_a_proxy_deletes_their_parent(
        self, workspace: Workspace, django_capture_on_commit_callbacks: Capture, how: str
    ) -> None:
        contact = Contact.objects.create(workspace=workspace, name="Ann")
        files = [
            Attachment.objects.create(workspace=workspace, contact=contact, name=f"f{n}")
            for n in range(2)
        ]
        contact_pk = contact.pk
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            if how == "instance":
                VipContact.objects.get(pk=contact_pk).delete()
            else:
                VipContact.objects.filter(pk=contact_pk).delete()
        assert not Attachment.objects.filter(pk__in=[f.pk for f in files]).exists()
        assert sorted((m["event_type"], m["data"]["id"]) for m in events()) == sorted(
            [("attachment.deleted", f.pk) for f in files] + [("contact.deleted", contact_pk)]
        )

    def test_rows_the_database_deletes_by_a_to_field_key_are_those_announced(
        self, db: None, django_capture_on_commit_callbacks: Capture
    ) -> None:
        # Badges link their crew by its code: the other crew's code is the doomed one's
        # primary key, so its badges are what comparing the key with the pk would find.
        doomed = Crew.objects.create(code="doomed", name="Doomed")
        other = Crew.objects.create(code=str(doomed.pk), name="Other")
        badges = [Badge.objects.create(crew=doomed, name=f"b{n}") for n in range(2)]
        kept = Badge.objects.create(crew=other, name="kept")
        doomed_pk = doomed.pk
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            doomed.delete()
        assert not Badge.objects.filter(pk__in=[b.pk for b in badges]).exists()
        assert Badge.objects.filter(pk=kept.pk).exists()
        assert sorted((m["event_type"], m["data"]["id"]) for m in events()) == sorted(
            [("badge.deleted", b.pk) for b in badges] + [("crew.deleted", doomed_pk)]
        )

    @override_settings(REALTIME_CASCADE_LIMIT=2)
    def test_database_cascades_past_the_limit_fold_into_one_truncated_event(
        self, workspace: Workspace, django_capture_on_commit_callbacks: Capture
    ) -> None:
        contact = Contact.objects.create(workspace=workspace, name="Ann")
        for n in range(5):
            Attachment.objects.create(workspace=workspace, contact=contact, name=f"f{n}")
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            contact.delete()
        attachments = [m for m in events() if m["event_type"] == "attachment.deleted"]
        assert len(attachments) == 3
        folded = [m for m in attachments if m["data"] is None]
        assert folded == [
            scope_event(
                "attachment.deleted", None, ["attachment"], workspace.pk, meta={"truncated": True}
            )
        ]

    @override_settings(REALTIME_CASCADE_LIMIT=2)
    def test_django_cascades_past_the_limit_fold_into_one_truncated_event(
        self, workspace: Workspace, django_capture_on_commit_callbacks: Capture
    ) -> None:
        folder = Folder.objects.create(workspace=workspace)
        items = [
            Item.objects.create(workspace=workspace, folder=folder, label=f"i{n}") for n in range(4)
        ]
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            folder.delete()
        announced = events()
        # The first two children (by pk, the order Django collects them in) are announced one
        # by one; the two past the limit fold into one event for their scope.
        assert sorted(m["data"]["id"] for m in announced if m["data"] is not None) == [
            item.pk for item in items[:2]
        ]
        (folded,) = [m for m in announced if m["data"] is None]
        assert folded == scope_event(
            "item.deleted", None, ["item"], workspace.pk, meta={"truncated": True}
        )

    @override_settings(REALTIME_CASCADE_LIMIT=2)
    def test_django_cascades_of_an_account_model_past_the_limit_fold_to_their_accounts(
        self, db: None, django_capture_on_commit_callbacks: Capture
    ) -> None:
        ann = get_user_model().objects.create(username="ann")
        bob = get_user_model().objects.create(username="bob")
        thread = Thread.objects.create(title="t")
        thread.members.add(ann, bob)
        for n in range(5):
            Message.objects.create(thread=thread, text=f"m{n}")
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            thread.delete()
        told = [m for m in events("users") if m["event_type"] == "message.deleted"]
        assert len(told) == 3
        (folded,) = [m for m in told if m["data"] is None]
        assert folded["user_ids"] == sorted([ann.pk, bob.pk])
        assert folded["meta"] == {"truncated": True}

    @override_settings(REALTIME_CASCADE_LIMIT=2)
    def test_django_cascades_of_an_account_model_fold_into_one_event_to_all_their_accounts(
        self, transactional_db: None
    ) -> None:
        # A path whose first step is a many-to-many: each row past the limit has accounts of
        # its own, all told in one event. (An isolated registry cannot link to the real user
        # model: the accounts here are rows of a model of its own.)
        with isolate_apps("tests.testapp"):

            class Person(models.Model):  # noqa: DJ008 - never shown
                class Meta:
                    app_label = "testapp"
                    db_table = "announcements_person"

            class Hall(models.Model):  # noqa: DJ008 - never shown
                class Meta:
                    app_label = "testapp"
                    db_table = "announcements_hall"

            class Booth(models.Model):  # noqa: DJ008 - never shown
                hall = models.ForeignKey(Hall, models.CASCADE)
                people = models.ManyToManyField(Person, db_table="announcements_booth_people")

                class Meta:
                    app_label = "testapp"
                    db_table = "announcements_booth"

            realtime_model(user_field="people", name="announcements_booth")(Booth)
        tables = [Person, Hall, Booth]
        with connection.schema_editor() as editor:
            for table in tables:
                editor.create_model(table)
        try:
            hall = Hall._default_manager.create()
            people = [Person._default_manager.create() for _ in range(5)]
            for person in people:
                Booth._default_manager.create(hall=hall).people.add(person)
            forget_messages()
            hall.delete()
            told = [m for m in events("users") if m["event_type"] == "announcements_booth.deleted"]
            assert len(told) == 3
            (folded,) = [m for m in told if m["data"] is None]
            one_by_one = {user for m in told if m["data"] is not None for user in m["user_ids"]}
            assert sorted(folded["user_ids"]) == sorted({p.pk for p in people} - one_by_one)
        finally:
            unregister(Booth)
            with connection.schema_editor() as editor:
                for table in reversed(tables):
                    editor.delete_model(table)


class TestOrigin:
    @pytest.mark.parametrize(
        ("header", "expected"),
        [("tab-1.7", "tab-1.7"), ("x" * 64, "x" * 64), ("x" * 65, None), ("", None), (None, None)],
    )
    def test_the_request_origin_travels_with_its_writes(
        self,
        workspace: Workspace,
        django_capture_on_commit_callbacks: Capture,
        header: str | None,
        expected: str | None,
    ) -> None:
        def view(request: HttpRequest) -> HttpResponse:
            Contact.objects.create(workspace=workspace, name="from a request")
            return HttpResponse("ok")

        headers = {} if header is None else {"X-Origin-Id": header}
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            OriginMiddleware(view)(RequestFactory().post("/", headers=headers))
            Contact.objects.create(workspace=workspace, name="outside a request")
        inside, outside = events()
        assert inside["meta"].get("origin") == expected
        assert "origin" not in outside["meta"]


class TestAnnounce:
    def test_announce_publishes_writes_no_signal_saw(
        self, workspace: Workspace, django_capture_on_commit_callbacks: Capture
    ) -> None:
        contact = Contact.objects.create(workspace=workspace, name="Ann")
        forget_messages()
        with django_capture_on_commit_callbacks(execute=True):
            Contact.objects.filter(pk=contact.pk).update(name="Bulk")
            announce(Contact.objects.filter(pk=contact.pk), "updated", changed=["name"])
        (message,) = events()
        assert message["event_type"] == "contact.updated"
        assert message["data"]["name"] == "Bulk"
        assert message["meta"] == {"changed": ["name"]}

    def test_announce_refuses_unknown_actions_and_undecorated_models(
        self, workspace: Workspace
    ) -> None:
        with pytest.raises(ValueError, match="action"):
            announce([], "renamed")
        with pytest.raises(TypeError, match="realtime_model"):
            announce(Plain(workspace=workspace, name="x"), "created")

    @pytest.mark.django_db(transaction=True)
    def test_announce_from_async_code_publishes_when_the_caller_s_transaction_commits(
        self, workspace: Workspace
    ) -> None:
        """An async helper run by ``async_to_sync`` from sync code in a transaction: the row is
        read and announced on the caller's thread, in its transaction."""
        contact = Contact.objects.create(workspace=workspace, name="Ann")
        forget_messages()

        async def helper() -> None:
            announce(Contact.objects.filter(pk=contact.pk), "updated", changed=["name"])

        with transaction.atomic():
            with connection.cursor() as cursor:  # a write no signal sees
                table = connection.ops.quote_name(Contact._meta.db_table)
                cursor.execute(f"UPDATE {table} SET name = %s", ["Raw"])
            async_to_sync(helper)()
            assert published() == []
        (message,) = events()
        assert (message["event_type"], message["data"]["name"]) == ("contact.updated", "Raw")

    @pytest.mark.django_db(transaction=True)
    @pytest.mark.parametrize("commits", [True, False], ids=["commits", "rolls-back"])
    def test_announce_from_a_coroutine_asyncio_run_runs_in_a_transaction_follows_it(
        self, workspace: Workspace, commits: bool
    ) -> None:
        """A task in ``atomic()`` running its async helper with ``asyncio.run``: the loop runs
        on the task's thread, in its block; the announcing waits for that block's commit (the
        row read then), and is dropped if it rolls back."""
        contact = Contact.objects.create(workspace=workspace, name="Ann")
        forget_messages()

        async def helper() -> None:
            announce(Contact.objects.filter(pk=contact.pk), "updated", changed=["name"])

        with contextlib.suppress(ZeroDivisionError), transaction.atomic():
            with connection.cursor() as cursor:  # a write no signal sees
                table = connection.ops.quote_name(Contact._meta.db_table)
                cursor.execute(f"UPDATE {table} SET name = %s", ["Raw"])
            asyncio.run(helper())
            assert published() == []
            if not commits:
                raise ZeroDivisionError
        announce(Contact.objects.get(pk=contact.pk), "updated", changed=["name"])  # a marker
        told = [(m["event_type"], m["data"]["name"]) for m in events()]
        marker = ("contact.updated", "Raw" if commits else "Ann")
        assert told == ([("contact.updated", "Raw")] if commits else []) + [marker]

    @pytest.mark.django_db(transaction=True)
    @pytest.mark.parametrize("action", ["updated", "deleted"])
    def test_announce_from_async_code_reads_the_accounts_of_a_path(self, action: str) -> None:
        ann = get_user_model().objects.create(username="ann")
        thread = Thread.objects.create(title="t")
        thread.members.add(ann)
        message = Message.objects.create(thread=thread, text="hi")
        forget_messages()

        async def helper() -> None:
            announce(message, action)

        async_to_sync(helper)()
        assert [(m["event_type"], m["user_ids"]) for m in events("users")] == [
            (f"message.{action}", [ann.pk])
        ]

    @pytest.mark.django_db(transaction=True)
    def test_announce_from_async_code_logs_what_it_cannot_announce(
        self, workspace: Workspace, caplog: pytest.LogCaptureFixture
    ) -> None:
        async def helper() -> None:
            with pytest.raises(ValueError, match="action"):
                announce([], "renamed")
            announce(Plain(workspace=workspace, name="x"), "created")

        async_to_sync(helper)()
        (error,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert error.getMessage() == "realtime: announcing failed"
        assert error.exc_info is not None
        assert isinstance(error.exc_info[1], TypeError)


class AddsAnAuditor(RealtimeAuth):
    def recipients(self, event_type: str, data: Any, user_ids: list[Any]) -> list[Any]:
        return [*user_ids, AUDITOR_ID]


class DropsEveryone(RealtimeAuth):
    def recipients(self, event_type: str, data: Any, user_ids: list[Any]) -> list[Any]:
        return []


class BrokenRecipients(RealtimeAuth):
    def recipients(self, event_type: str, data: Any, user_ids: list[Any]) -> list[Any]:
        raise RuntimeError("hook bug")


class NamesOutsiders(RealtimeAuth):
    def outside_recipients(self, scope_id: Any, event_type: str, data: Any) -> list[Any]:
        return [AUDITOR_ID, AUDITOR_ID + 1]


class BrokenOutsiders(RealtimeAuth):
    def outside_recipients(self, scope_id: Any, event_type: str, data: Any) -> list[Any]:
        raise RuntimeError("hook bug")


AUDITOR_ID = 9001


class TestAudienceHooks:
    @pytest.mark.parametrize(
        ("auth", "expected"),
        [
            ("AddsAnAuditor", "ann+auditor"),
            ("DropsEveryone", "nobody"),
            ("BrokenRecipients", "nobody"),
        ],
    )
    def test_recipients_hook_adds_removes_or_silences_an_account_event(
        self,
        make_user: Callable[..., Any],
        django_capture_on_commit_callbacks: Capture,
        caplog: pytest.LogCaptureFixture,
        auth: str,
        expected: str,
    ) -> None:
        ann = make_user("ann")
        forget_messages()
        with (
            override_settings(REALTIME_AUTH=f"{__name__}.{auth}"),
            django_capture_on_commit_callbacks(execute=True),
            caplog.at_level(logging.ERROR, logger="realtime"),
        ):
            Notification.objects.create(user=ann, text="hi")
        reached = [m["user_ids"] for m in events()]
        assert reached == {"ann+auditor": [[ann.pk, AUDITOR_ID]], "nobody": []}[expected]
        assert any("recipients" in r.getMessage() for r in caplog.records) == (
            auth == "BrokenRecipients"
        )

    def test_recipients_of_a_delete_are_asked_before_the_row_goes(
        self, make_user: Callable[..., Any], django_capture_on_commit_callbacks: Capture
    ) -> None:
        ann = make_user("ann")
        note = Notification.objects.create(user=ann, text="hi")
        forget_messages()
        with (
            override_settings(REALTIME_AUTH=f"{__name__}.AddsAnAuditor"),
            django_capture_on_commit_callbacks(execute=True),
        ):
            note.delete()
        assert [m["user_ids"] for m in events()] == [[ann.pk, AUDITOR_ID]]

    def test_outside_recipients_hear_it_everywhere_but_in_that_scope(
        self, workspace: Workspace, django_capture_on_commit_callbacks: Capture
    ) -> None:
        forget_messages()
        with (
            override_settings(REALTIME_AUTH=f"{__name__}.NamesOutsiders"),
            django_capture_on_commit_callbacks(execute=True),
        ):
            contact = Contact.objects.create(workspace=workspace, name="Ann")
        scope_message, outside = events()
        assert scope_message["target"] == "scope"
        assert outside == {
            "target": "users",
            "event_type": "contact.created",
            "data": contact_data(contact),
            "channels": contact_channels(contact),
            "meta": {},
            "skip_scope": workspace.pk,
            "row": True,  # a model's event: a resume re-decides it
            "user_ids": [AUDITOR_ID, AUDITOR_ID + 1],
        }

    def test_a_failing_outside_recipients_hook_still_lets_the_scope_event_out(
        self,
        workspace: Workspace,
        django_capture_on_commit_callbacks: Capture,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        forget_messages()
        with (
            override_settings(REALTIME_AUTH=f"{__name__}.BrokenOutsiders"),
            django_capture_on_commit_callbacks(execute=True),
            caplog.at_level(logging.ERROR, logger="realtime"),
        ):
            Contact.objects.create(workspace=workspace, name="Ann")
        assert [m["target"] for m in events()] == ["scope"]
        assert any("outside_recipients" in r.getMessage() for r in caplog.records)

    def test_shared_readers_are_not_told_twice_as_outside_recipients(
        self,
        workspace: Workspace,
        make_user: Callable[..., Any],
        django_capture_on_commit_callbacks: Capture,
    ) -> None:
        partner = Workspace.objects.create(name="Partner", slug="partner")
        guest = make_user("guest", member_of=partner)
        project = Project.objects.create(workspace=workspace, name="P")
        project.shared_with.add(partner)

        class AlsoNamesTheGuest(RealtimeAuth):
            def outside_recipients(self, scope_id: Any, event_type: str, data: Any) -> list[Any]:
                return [guest.pk, AUDITOR_ID]

        globals()["AlsoNamesTheGuest"] = AlsoNamesTheGuest
        forget_messages()
        try:
            with (
                override_settings(REALTIME_AUTH=f"{__name__}.AlsoNamesTheGuest"),
                django_capture_on_commit_callbacks(execute=True),
            ):
                Task.objects.create(workspace=workspace, project=project, title="t")
        finally:
            del globals()["AlsoNamesTheGuest"]
        _, shared, outside = events()
        assert shared["user_ids"] == [guest.pk]
        assert "skip_scope" not in shared
        assert outside["user_ids"] == [AUDITOR_ID]
        assert outside["skip_scope"] == workspace.pk


# An expression left on the instance ---------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("atomic", [False, True])
def test_an_expression_an_earlier_save_left_on_the_instance_is_told_as_the_row_holds_it(
    workspace: Workspace, atomic: bool
) -> None:
    """Django 5.2 leaves ``F("points") + 1`` on the instance after its save: a later save of
    other columns, and the delete, tell what the row holds, never the expression's text."""
    ticket = Ticket.objects.create(workspace=workspace, title="t", points=1)
    ticket.points = F("points") + 1
    ticket.save(update_fields=["points"])
    forget_messages()
    with transaction.atomic() if atomic else contextlib.nullcontext():
        ticket.title = "t2"
        ticket.save(update_fields=["title"])
        pk = ticket.pk
        ticket.delete()
    told = [(e["event_type"], e["data"]["points"]) for e in events()]
    # In one transaction the update and the delete are one deleted.
    expected = [("ticket.deleted", 2)] if atomic else [("ticket.updated", 2), ("ticket.deleted", 2)]
    assert told == expected
    assert not Ticket.objects.filter(pk=pk).exists()


# Values the database stores otherwise than assigned --------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_naive_datetime_is_told_as_the_instant_django_stores(
    workspace: Workspace, settings: Any
) -> None:
    """Under ``USE_TZ`` Django stores a naive datetime as that wall-clock time in the default
    time zone (warning): the event tells that instant, as reading the row gives it."""
    settings.TIME_ZONE = "America/New_York"
    contact = Contact.objects.create(workspace=workspace, name="Ann")
    forget_messages()
    contact.born = datetime.datetime(2024, 1, 2, 3, 4, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        contact.save()
    (told,) = events()
    stored = Contact.objects.get(pk=contact.pk).born
    assert stored is not None
    assert told["data"]["born"] == stored.isoformat() == "2024-01-02T08:04:05+00:00"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("given", "held"), [(decimal.Decimal("1.239"), "1.24"), ("1.5", "1.50")])
def test_a_decimal_is_told_with_the_places_its_column_holds(
    workspace: Workspace, given: Any, held: str
) -> None:
    contact = Contact.objects.create(workspace=workspace, name="Ann")
    forget_messages()
    contact.score = given
    contact.save()
    (told,) = events()
    assert told["data"]["score"] == held == str(Contact.objects.get(pk=contact.pk).score)
