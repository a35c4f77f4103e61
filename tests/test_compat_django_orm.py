"""``realtime.compat.django_orm``: what realtime's querysets and managers rely on that Django
does not document, each use checked by a self-test, with a sound fallback where it fails.

Each use runs against this Django and the test database; a self-test that fails is simulated
by a probe that raises (as on a Django that changed): one ERROR line naming the use, and
realtime goes on the public way, which is checked too.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, models
from django.test.utils import CaptureQueriesContext, isolate_apps

from realtime import RealtimeManager, realtime_model
from realtime.audience import readers
from realtime.compat import django as django_compat
from realtime.compat import django_orm
from realtime.registry import options_for
from realtime.writes.decorator import unregister
from tests.helpers import events, forget_messages, returns_rows
from tests.testapp.models import Contact, Document, PrivateNote, Tag, Twin, Workspace

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def unchecked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each use's self-test runs again in the test (the verdicts from before come back)."""
    monkeypatch.setattr(django_compat, "_verdicts", {})


def failing(monkeypatch: pytest.MonkeyPatch, probe: str) -> None:
    """Make the self-test ``probe`` fail, as on a Django where its use no longer fits."""

    def changed(*args: Any) -> None:
        raise TypeError("this Django changed")

    monkeypatch.setattr(django_orm, probe, changed)


class _Collected(logging.Handler):
    def __init__(self, found: list[str]) -> None:
        super().__init__(logging.ERROR)
        self.found = found

    def emit(self, record: logging.LogRecord) -> None:
        self.found.append(record.getMessage())


@pytest.fixture
def errors() -> Iterator[list[str]]:
    """The ERROR lines realtime logs during the test, as they are logged."""
    found: list[str] = []
    handler = _Collected(found)
    realtime_logger = logging.getLogger("realtime")
    realtime_logger.addHandler(handler)
    try:
        yield found
    finally:
        realtime_logger.removeHandler(handler)


def changed_of_a_save(workspace: Workspace) -> list[str]:
    contact = Contact.objects.create(workspace=workspace, name="v1")
    loaded = Contact.objects.get(pk=contact.pk)
    forget_messages()
    loaded.name = "v2"
    loaded.save()
    (message,) = events()
    changed: list[str] = message["meta"]["changed"]
    return changed


def test_a_fetch_keeps_what_rows_were_loaded_with(workspace: Workspace) -> None:
    assert changed_of_a_save(workspace) == ["name"]
    assert django_compat._verdicts[django_orm.FETCH] is True
    assert django_compat._verdicts[django_orm.STATE] is True


@pytest.mark.parametrize("probe", ["_probe_fetch", "_probe_state"])
def test_without_the_fetch_or_the_state_a_save_lists_every_column(
    probe: str, monkeypatch: pytest.MonkeyPatch, errors: list[str], workspace: Workspace
) -> None:
    failing(monkeypatch, probe)
    everything = ["born", "company", "email", "name", "notes", "score", "workspace"]
    assert changed_of_a_save(workspace) == everything
    assert len([e for e in errors if "does not fit" in e]) == 1


@contextlib.contextmanager
def decorated_shelf(**attrs: Any) -> Iterator[Any]:
    """An isolated ``Shelf`` model (``attrs`` added to its class), decorated for the block."""
    with isolate_apps("tests.testapp"):
        meta = type("Meta", (), {"app_label": "testapp"})
        body = {"__module__": __name__, "Meta": meta, "__str__": lambda self: "shelf", **attrs}
        shelf = type("Shelf", (models.Model,), body)
        realtime_model(scope_field=None, name="compat_shelf")(shelf)
        try:
            yield shelf
        finally:
            unregister(shelf)


def test_django_managers_of_a_decorated_model_become_realtimes() -> None:
    with decorated_shelf(objects=models.Manager()) as shelf:
        assert type(shelf._default_manager) is RealtimeManager
        assert type(shelf._base_manager) is RealtimeManager
    assert django_compat._verdicts[django_orm.REPLACE] is True


def test_the_base_manager_django_makes_becomes_realtimes_for_a_model_and_its_proxy() -> None:
    with decorated_shelf() as shelf:

        class Narrow(shelf):  # type: ignore[misc,valid-type]
            objects: models.Manager[Any] = models.Manager()

            class Meta:
                app_label = "testapp"
                proxy = True

        for model in (shelf, Narrow):
            made = model._base_manager
            assert type(made) is RealtimeManager
            assert (made.name, made.auto_created, made.model) == ("_base_manager", True, model)
        shelf._meta.apps.clear_cache()  # Django makes the base manager again
        assert type(shelf._base_manager) is RealtimeManager
    assert django_compat._verdicts[django_orm.BASE] is True


def test_without_the_base_manager_it_stays_djangos_and_is_named(
    monkeypatch: pytest.MonkeyPatch, errors: list[str]
) -> None:
    failing(monkeypatch, "_probe_base")
    with decorated_shelf() as shelf:
        assert type(shelf._base_manager) is models.Manager
        assert type(shelf._default_manager) is RealtimeManager
        from realtime.checks.declarations import check_models

        (named,) = [m for m in check_models() if m.obj is shelf]
        assert named.msg.startswith("testapp.Shelf._base_manager:")
        assert 'base_manager_name = "objects"' in (named.hint or "")
    assert [e for e in errors if "does not fit" in e] != []


def test_without_replacing_managers_they_stay_djangos_and_are_named(
    monkeypatch: pytest.MonkeyPatch, errors: list[str]
) -> None:
    failing(monkeypatch, "_probe_replace")
    with decorated_shelf() as shelf:
        assert type(shelf._default_manager) is models.Manager
        from realtime.checks.declarations import check_models

        named = [m.msg.split(":")[0] for m in check_models() if m.obj is shelf]
        assert "testapp.Shelf.objects" in named
    assert [e for e in errors if "does not fit" in e] != []


def count_sql(workspace: Workspace) -> str:
    contact = Contact.objects.create(workspace=workspace, name="Ann")
    contact.tags.add(Tag.objects.create(workspace=workspace, name="vip"))
    with CaptureQueriesContext(connection) as queries:
        assert contact.tags.count() == 1
    (query,) = queries.captured_queries
    return query["sql"]


def test_a_many_to_many_counts_through_its_table(workspace: Workspace) -> None:
    assert "JOIN" not in count_sql(workspace)
    assert django_compat._verdicts[django_orm.THROUGH] is True


def test_without_the_shortcut_a_many_to_many_counts_with_a_join(
    monkeypatch: pytest.MonkeyPatch, workspace: Workspace, errors: list[str]
) -> None:
    failing(monkeypatch, "_probe_through")
    assert "JOIN" in count_sql(workspace)
    assert len([e for e in errors if "does not fit" in e]) == 1


def deletes_of_a_queryset_delete(workspace: Workspace) -> list[str]:
    """The DELETE statements of deleting five documents by their workspace."""
    for n in range(5):
        Document.objects.create(workspace=workspace, title=f"d{n}")
    forget_messages()
    with CaptureQueriesContext(connection) as queries:
        assert Document.objects.filter(workspace=workspace).delete()[0] == 5
    assert [m["event_type"] for m in events()] == ["document.deleted"] * 5
    return [q["sql"] for q in queries.captured_queries if q["sql"].startswith("DELETE")]


def test_a_queryset_delete_is_one_statement_with_the_callers_filter(
    workspace: Workspace,
) -> None:
    (delete,) = deletes_of_a_queryset_delete(workspace)
    assert "workspace_id" in delete  # the caller's filter, not a collected delete's keys alone
    if django_orm.can_return_rows("default"):  # else narrowed to the rows read before it
        assert " IN (" not in delete
    assert django_compat._verdicts[django_orm.FAST_DELETE] is True


def test_without_the_fast_path_a_queryset_delete_collects_and_announces_each_row(
    monkeypatch: pytest.MonkeyPatch, workspace: Workspace, errors: list[str]
) -> None:
    failing(monkeypatch, "_probe_fast_delete")
    (delete,) = deletes_of_a_queryset_delete(workspace)
    assert " IN (" in delete
    assert len([e for e in errors if "does not fit" in e]) == 1


def test_without_the_write_alias_a_write_reads_where_the_router_writes(
    monkeypatch: pytest.MonkeyPatch, workspace: Workspace, errors: list[str]
) -> None:
    failing(monkeypatch, "_probe_write_alias")
    Contact.objects.create(workspace=workspace, name="Ann")
    forget_messages()
    assert Contact.objects.filter(name="Ann").update(name="Bea") == 1
    assert [m["data"]["name"] for m in events()] == ["Bea"]
    assert len([e for e in errors if "does not fit" in e]) == 1


def statements_of_a_rename_and_a_delete(workspace: Workspace) -> list[str]:
    """The statements on the table of an ``update()`` and of a ``delete()`` of two rows, once
    both are announced as written."""
    for name in ("Ann", "Bea"):
        Twin.objects.create(workspace=workspace, name=name)
    forget_messages()
    with CaptureQueriesContext(connection) as queries:
        assert Twin.objects.filter(workspace=workspace).update(name="Cy") == 2
        assert Twin.objects.filter(workspace=workspace).delete()[0] == 2
    heard = [(m["event_type"], m["data"].get("name")) for m in events()]
    assert heard == [("twin.updated", "Cy")] * 2 + [("twin.deleted", "Cy")] * 2
    return [
        q["sql"].split("*/")[-1].split()[0]
        for q in queries.captured_queries
        if "testapp_twin" in q["sql"]
    ]


@returns_rows()
def test_an_update_and_a_delete_read_their_rows_from_their_own_statements(
    workspace: Workspace,
) -> None:
    assert statements_of_a_rename_and_a_delete(workspace) == ["UPDATE", "DELETE"]
    assert django_compat._verdicts[django_orm.RETURNING] is True


@returns_rows()
def test_without_returning_an_update_and_a_delete_read_their_rows_first(
    monkeypatch: pytest.MonkeyPatch, workspace: Workspace, errors: list[str]
) -> None:
    failing(monkeypatch, "_probe_returning")
    assert statements_of_a_rename_and_a_delete(workspace) == [
        "SELECT", "UPDATE", "SELECT", "DELETE",
    ]  # fmt: skip
    assert len([e for e in errors if "does not fit" in e]) == 1


@returns_rows()
@pytest.mark.usefixtures("quiet_preparation_failures")
def test_a_write_whose_statement_goes_by_unrecognised_is_not_announced_and_says_so(
    monkeypatch: pytest.MonkeyPatch, workspace: Workspace, caplog: pytest.LogCaptureFixture
) -> None:
    Twin.objects.create(workspace=workspace, name="Ann")
    forget_messages()
    monkeypatch.setattr(django_orm.Returning, "_fits", lambda self, sql: False)

    assert Twin.objects.filter(workspace=workspace).update(name="Bea") == 1

    assert Twin.objects.get(workspace=workspace).name == "Bea"
    assert events() == []
    (failed,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert failed.exc_info is not None
    assert "did not recognise as Django's UPDATE or DELETE" in str(failed.exc_info[1])


def tagged(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
    """An application's execute wrapper that tags each statement with a leading comment."""
    return execute(f"/* app='tests' */ {sql}", params, many, context)


@returns_rows()
def test_statements_an_applications_wrapper_tags_still_return_their_rows(
    workspace: Workspace,
) -> None:
    with connection.execute_wrapper(tagged):
        assert statements_of_a_rename_and_a_delete(workspace) == ["UPDATE", "DELETE"]


def readers_statements(workspace: Workspace) -> list[str]:
    """The statements of asking which of two accounts may read a guarded note."""
    user_model = get_user_model()
    author, other = (user_model.objects.create_user(username=name) for name in ("ann", "bob"))
    note = PrivateNote.objects.create(workspace=workspace, author=author, title="mine")
    options = options_for(PrivateNote)
    assert options is not None
    with CaptureQueriesContext(connection) as queries:
        assert readers(options, note.pk, [author.pk, other.pk]) == [author.pk]
    return [q["sql"] for q in queries.captured_queries]


def test_a_guard_of_column_lookups_is_decided_in_process(workspace: Workspace) -> None:
    assert not any("EXISTS" in sql for sql in readers_statements(workspace))
    assert django_compat._verdicts[django_orm.Q_TREE] is True


def test_without_reading_a_q_every_guard_is_decided_by_the_database(
    monkeypatch: pytest.MonkeyPatch, workspace: Workspace, errors: list[str]
) -> None:
    failing(monkeypatch, "_probe_q_tree")
    assert any("EXISTS" in sql for sql in readers_statements(workspace))
    assert len([e for e in errors if "does not fit" in e]) == 1
