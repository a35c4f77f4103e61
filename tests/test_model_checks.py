"""Each check id of ``realtime.checks.declarations``, and what ``@realtime_model`` refuses at once.

Throwaway models live in an app registry of their own (``isolate_apps``) and are unregistered
from ``realtime`` after each test, so no other test sees them. Their relations point at the
project's models by class: in an isolated registry a relation named by string never resolves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
from django.apps import apps as django_apps
from django.apps.registry import Apps
from django.contrib.auth import get_user_model
from django.core import checks
from django.core.checks import CheckMessage
from django.db import models
from django.db.models import Q
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_delete
from django.test import override_settings
from django.test.utils import isolate_apps

from realtime import RealtimeManager, RealtimeQuerySet, realtime_model
from realtime.checks.declarations import check_models
from realtime.registry import all_options, options_for, options_named
from realtime.writes import memberships, querysets
from realtime.writes.decorator import unregister
from tests.testapp.models import Company, Contact, Plain, Tag, Workspace


def everyone(user: Any) -> Q:
    return Q()


class Record(models.Model):
    """The columns and relations every throwaway model starts from."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    owner = models.ForeignKey(
        get_user_model(), on_delete=models.CASCADE, null=True, related_name="+"
    )
    company = models.ForeignKey(Company, on_delete=models.CASCADE, null=True, related_name="+")
    plain = models.ForeignKey(Plain, on_delete=models.CASCADE, null=True, related_name="+")
    title = models.CharField(max_length=100)
    tags = models.ManyToManyField(Tag, related_name="+")

    class Meta:
        abstract = True
        app_label = "testapp"

    def __str__(self) -> str:
        return self.title


@pytest.fixture(autouse=True)
def isolated() -> Iterator[Apps]:
    """An app registry for this test's models; every one is unregistered from realtime after."""
    with isolate_apps("tests.testapp") as apps:
        assert apps is not None
        try:
            yield apps
        finally:
            for model in apps.get_models(include_auto_created=True):
                unregister(model)
    assert [options for options in all_options() if options.model._meta.apps is apps] == []


def messages() -> list[CheckMessage]:
    """Run ``check_models``; every message it returns must carry a hint."""
    found: list[CheckMessage] = check_models()
    for message in found:
        assert isinstance(message.hint, str), message
        assert message.hint.strip(), message
    return found


def ids() -> list[str | None]:
    return [message.id for message in messages()]


def ids_about(model: type[models.Model]) -> list[str | None]:
    return [message.id for message in messages() if message.obj is model]


def declare(**options: Any) -> type[models.Model]:
    """Declare and decorate a throwaway model with ``options``."""

    @realtime_model(**options)
    class Throwaway(Record):
        pass

    return Throwaway


def test_unregister_forgets_a_model_and_disconnects_its_receivers() -> None:
    model = declare(name="passing")
    tags = model._meta.get_field("tags")
    assert isinstance(tags, models.ManyToManyField)
    through = tags.remote_field.through
    signals = [post_save, pre_delete, post_delete]
    assert [signal.has_listeners(model) for signal in signals] == [True, True, True]
    assert m2m_changed.has_listeners(through)

    unregister(model)

    assert options_for(model) is None
    assert options_named("passing") is None
    assert [signal.has_listeners(model) for signal in signals] == [False, False, False]
    assert not m2m_changed.has_listeners(through)


def test_project_models_give_no_error_or_warning() -> None:
    assert messages() == []


def test_a_well_declared_model_gives_no_error_or_warning() -> None:
    model = declare(
        fields=["title", "company_id"],
        relations=["company", "tags"],
        shared_via="company",
        cascade=["company"],
        guard=everyone,
    )

    assert options_for(model) is not None
    assert messages() == []


# E030: wire names


def test_two_models_announcing_under_one_name_is_error_e030() -> None:
    @realtime_model(name="clash")
    class First(Record):
        pass

    @realtime_model(name="clash")
    class Second(Record):
        pass

    [message] = messages()
    assert isinstance(message, checks.Error)
    assert message.id == "realtime.E030"
    assert message.obj is Second
    assert "testapp.First, testapp.Second" in message.msg


def test_a_name_a_project_model_announces_under_is_error_e030() -> None:
    @realtime_model(name="contact")
    class Person(Record):
        pass

    [message] = messages()
    assert message.id == "realtime.E030"
    assert message.obj is Person
    assert "testapp.Contact, testapp.Person" in message.msg
    # The project's model keeps its name meanwhile.
    found = options_named("contact")
    assert found is not None
    assert found.model is Contact


# E031: user_field


@pytest.mark.parametrize(
    "user_field", ["title", "nope", "workspace", "company.name", "owner.nope", "owner..id", ""]
)
def test_user_field_not_leading_to_the_user_model_is_error_e031(user_field: str) -> None:
    model = declare(user_field=user_field)

    assert ids() == ["realtime.E031"]
    assert ids_about(model) == ["realtime.E031"]


@pytest.mark.parametrize("user_field", ["owner", "workspace.members", "workspace__members"])
def test_user_field_leading_to_the_user_model_is_accepted(user_field: str) -> None:
    declare(user_field=user_field)

    assert messages() == []


# E032: shared_via


@pytest.mark.parametrize("shared_via", ["title", "nope", "company.nope", "company.name", ""])
def test_shared_via_not_leading_to_a_model_is_error_e032(shared_via: str) -> None:
    model = declare(shared_via=shared_via)

    assert ids() == ["realtime.E032"]
    assert ids_about(model) == ["realtime.E032"]


# E033: user_field combined with a scope option


@pytest.mark.parametrize(
    "options",
    [{"guard": everyone}, {"shared_via": "company"}, {"scope_field": "company"}],
    ids=["guard", "shared_via", "scope_field"],
)
def test_user_field_combined_with_a_scope_option_is_error_e033(options: dict[str, Any]) -> None:
    model = declare(user_field="owner", **options)

    assert ids() == ["realtime.E033"]
    assert ids_about(model) == ["realtime.E033"]


# E034: cascade


@pytest.mark.parametrize("cascade", ["title", "id", "tags"])
def test_cascade_naming_no_foreign_key_is_error_e034(cascade: str) -> None:
    model = declare(cascade=[cascade])

    assert ids() == ["realtime.E034"]
    assert ids_about(model) == ["realtime.E034"]


def test_cascade_naming_the_primary_key_by_pk_is_error_e034() -> None:
    # The decorator accepts "pk" like "id"; the check must report it, not raise.
    model = declare(cascade=["pk"])

    assert ids() == ["realtime.E034"]
    assert ids_about(model) == ["realtime.E034"]


def test_cascade_naming_a_one_to_one_key_is_accepted() -> None:
    @realtime_model(cascade=["successor"])
    class Succeeded(Record):
        successor = models.OneToOneField(
            Company, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
        )

    assert ids_about(Succeeded) == []


# E035: a scope without REALTIME_SCOPE_MODEL


@override_settings(REALTIME_SCOPE_MODEL=None)
def test_scoped_model_without_a_scope_model_setting_is_error_e035() -> None:
    model = declare()

    assert ids_about(model) == ["realtime.E035"]


@override_settings(REALTIME_SCOPE_MODEL=None)
def test_account_addressed_model_needs_no_scope_model_setting() -> None:
    model = declare(user_field="owner")

    assert ids_about(model) == []


# E036: scope_field


@pytest.mark.parametrize("scope_field", ["company", "owner", "title", "tags", "id", "pk"])
def test_scope_field_not_a_foreign_key_to_the_scope_model_is_error_e036(scope_field: str) -> None:
    model = declare(scope_field=scope_field)

    assert ids() == ["realtime.E036"]
    assert ids_about(model) == ["realtime.E036"]
    (message,) = messages()
    assert 'scope_field="<its name>"' in (message.hint or "")  # the fix, not a pointer


def test_a_one_to_one_key_to_the_scope_model_is_a_scope_field() -> None:
    @realtime_model(fields=["title"])
    class Statute(Record):
        workspace = models.OneToOneField(Workspace, on_delete=models.CASCADE, related_name="+")

    assert ids_about(Statute) == []


# E039: a scope key declared with to_field


@pytest.mark.parametrize("kind", [models.ForeignKey, models.OneToOneField])
def test_a_scope_key_declared_with_to_field_is_error_e039(kind: Any) -> None:
    @realtime_model(fields=["title"], scope_field="space")
    class Jotting(models.Model):
        space = kind(Workspace, to_field="slug", on_delete=models.CASCADE, related_name="+")
        title = models.CharField(max_length=100)

        class Meta:
            app_label = "testapp"

        def __str__(self) -> str:
            return self.title

    found = [m for m in messages() if m.obj is Jotting]
    assert [m.id for m in found] == ["realtime.E039"]
    assert "to_field='slug'" in found[0].msg
    assert "remove to_field" in (found[0].hint or "")


def test_a_scope_key_naming_the_primary_key_with_to_field_is_accepted() -> None:
    @realtime_model(fields=["title"], scope_field="space")
    class Jotting(models.Model):
        space = models.ForeignKey(
            Workspace, to_field="id", on_delete=models.CASCADE, related_name="+"
        )
        title = models.CharField(max_length=100)

        class Meta:
            app_label = "testapp"

        def __str__(self) -> str:
            return self.title

    assert ids_about(Jotting) == []


def test_scope_field_id_on_a_child_of_the_scope_model_is_accepted() -> None:
    @realtime_model(scope_field="id", fields=["name"])
    class Department(Workspace):
        class Meta:
            app_label = "testapp"

    # Only the warning that writes through Workspace itself are not its announcements.
    assert ids() == ["realtime.W034"]


# E037 and W030: relations


@pytest.mark.parametrize("relation", ["nope", "company.name", "tag"])
def test_relation_the_model_does_not_have_is_error_e037(relation: str) -> None:
    model = declare(relations=[relation])

    assert ids() == ["realtime.E037"]
    assert ids_about(model) == ["realtime.E037"]


def test_relation_naming_a_plain_column_is_error_e037() -> None:
    # "title" exists but is no relation: it can never name a record channel.
    model = declare(relations=["title"])

    assert ids() == ["realtime.E037"]
    assert ids_about(model) == ["realtime.E037"]


def test_relation_pointing_at_an_undecorated_model_is_warning_w030() -> None:
    model = declare(relations=["plain"])

    [message] = messages()
    assert isinstance(message, checks.Warning)
    assert message.id == "realtime.W030"
    assert message.obj is model


# W032: membership paths


def test_an_account_path_with_a_many_to_many_before_its_membership_is_warning_w032() -> None:
    model = declare(user_field="tags.workspace.members")

    [message] = messages()
    assert message.id == "realtime.W032"
    assert message.obj is model
    assert "tags.workspace.members" in message.msg


@pytest.mark.parametrize("path", ["company.workspace.members", "company.workspace.membership.user"])
def test_an_account_path_with_a_second_foreign_key_before_its_membership_is_warning_w032(
    path: str,
) -> None:
    model = declare(user_field=path)

    [message] = messages()
    assert message.id == "realtime.W032"
    assert message.obj is model
    assert f"{path!r}" in message.msg
    assert "not the foreign keys between them" in message.msg


@pytest.mark.parametrize("path", ["owner", "workspace.members", "workspace.membership.user"])
def test_account_paths_realtime_follows_give_no_warning(path: str) -> None:
    declare(user_field=path)

    assert messages() == []


@pytest.mark.parametrize("path", ["account", "home.members", "home.membership.user"])
def test_account_paths_through_a_one_to_one_key_give_no_warning(path: str) -> None:
    @realtime_model(user_field=path)
    class Keyed(Record):
        account = models.OneToOneField(get_user_model(), on_delete=models.CASCADE, related_name="+")
        home = models.OneToOneField(Workspace, on_delete=models.CASCADE, related_name="+")

    assert messages() == []


# W033: links that decide who reads, kept in a through model of the application's own


def test_a_guard_that_may_read_links_of_an_own_through_model_is_warning_w033() -> None:
    from tests.testapp.models import Membership

    @realtime_model(guard=everyone)
    class Guarded(Record):
        members = models.ManyToManyField(get_user_model(), through=Membership, related_name="+")

    [message] = messages()
    assert message.id == "realtime.W033"
    assert message.obj is Guarded


def test_a_guard_whose_fields_leave_such_links_out_gives_no_warning() -> None:
    @realtime_model(guard=everyone, guard_fields=["title"])
    class Guarded(Record):
        members = models.ManyToManyField(get_user_model(), related_name="+")

    assert messages() == []


def test_a_shared_root_whose_links_are_rows_of_an_own_through_model_is_warning_w033() -> None:
    class Partner(models.Model):
        hub = models.ForeignKey("Hub", on_delete=models.CASCADE, related_name="+")
        workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")

        class Meta:
            app_label = "testapp"

        def __str__(self) -> str:
            return str(self.pk)

    class Hub(models.Model):
        shared_with = models.ManyToManyField(Workspace, through=Partner, related_name="+")

        class Meta:
            app_label = "testapp"

        def __str__(self) -> str:
            return str(self.pk)

    @realtime_model(shared_via="hub")
    class Spoke(Record):
        hub = models.ForeignKey(Hub, on_delete=models.CASCADE, related_name="+")

    [message] = messages()
    assert message.id == "realtime.W033"
    assert message.obj is Spoke
    assert "testapp.Partner" in message.msg


def test_a_shared_root_whose_links_are_an_auto_created_table_gives_no_warning() -> None:
    class Hub(models.Model):
        shared_with = models.ManyToManyField(Workspace, related_name="+")

        class Meta:
            app_label = "testapp"

        def __str__(self) -> str:
            return str(self.pk)

    @realtime_model(shared_via="hub")
    class Spoke(Record):
        hub = models.ForeignKey(Hub, on_delete=models.CASCADE, related_name="+")

    assert messages() == []


# W034: a decorated multi-table child of a parent that is not decorated


def test_a_decorated_child_of_a_parent_not_decorated_is_warning_w034() -> None:
    class Place(Record):
        pass

    @realtime_model(fields=["title"])
    class Shop(Place):
        kind = models.CharField(max_length=20)

    [message] = messages()
    assert message.id == "realtime.W034"
    assert message.obj is Shop
    assert "testapp.Place" in message.msg


def test_a_decorated_child_of_a_decorated_parent_is_warning_w044() -> None:
    @realtime_model(fields=["title"])
    class Place(Record):
        pass

    @realtime_model(fields=["title"], name="shop")
    class Shop(Place):
        kind = models.CharField(max_length=20)

    [message] = messages()
    assert message.id == "realtime.W044"
    assert message.obj is Shop
    assert "testapp.Place" in message.msg
    assert "Decorate testapp.Place alone" in (message.hint or "")


def test_an_undecorated_child_of_a_decorated_parent_gives_no_warning() -> None:
    @realtime_model(fields=["title"])
    class Place(Record):
        pass

    class Shop(Place):
        kind = models.CharField(max_length=20)

    assert messages() == []


# W031: managers


class NotAQuerySet:
    """What a manager's get_queryset() should never return, but might."""

    def update(self, **values: Any) -> int:
        return 0


class Odd(models.Manager[Any]):
    def get_queryset(self) -> Any:
        return NotAQuerySet()


def test_a_manager_whose_queryset_realtime_cannot_extend_is_warning_w031() -> None:
    @realtime_model()
    class Odd_(Record):  # noqa: N801
        objects = models.Manager()
        odd = Odd()

    [message] = messages()
    assert isinstance(message, checks.Warning)
    assert message.id == "realtime.W031"
    assert message.obj is Odd_
    assert "testapp.Odd_.odd" in message.msg
    assert isinstance(Odd_._meta.managers_map["odd"].get_queryset(), NotAQuerySet)


def test_managers_of_every_kind_give_no_warning() -> None:
    from tests.testapp.models import OpenTickets, TicketQuerySet

    @realtime_model()
    class Kinds(Record):
        done = models.BooleanField(default=False)
        objects = TicketQuerySet.as_manager()
        made = models.Manager.from_queryset(TicketQuerySet)()
        narrowed = OpenTickets()

        class Meta:
            app_label = "testapp"
            base_manager_name = "objects"

    assert messages() == []


def test_a_model_of_plain_managers_gets_realtimes_and_gives_no_warning() -> None:
    @realtime_model()
    class Plain_(Record):  # noqa: N801
        objects = models.Manager()
        also = models.Manager()

    assert messages() == []
    assert type(Plain_._meta.managers_map["objects"]) is RealtimeManager
    assert type(Plain_._meta.managers_map["also"]) is RealtimeManager
    assert type(Plain_._base_manager) is RealtimeManager


def test_a_manager_of_the_applications_own_is_named_with_its_one_line_w031() -> None:
    class Mine(models.Manager["Own_"]):
        pass

    @realtime_model()
    class Own_(Record):  # noqa: N801
        objects = Mine()

    (message,) = messages()
    assert message.id == "realtime.W031"
    assert message.msg.startswith("testapp.Own_.objects:")
    assert "`class Mine(RealtimeManager, ...)`" in (message.hint or "")
    # The base manager Django makes is realtime's: only the application's own is named.
    assert type(Own_._base_manager) is RealtimeManager
    assert Own_._base_manager.name == "_base_manager"


def test_a_queryset_of_the_applications_own_is_named_with_realtimes_after_it_w031() -> None:
    class SoftBase(models.QuerySet[Any, Any]):
        pass

    class SoftQuerySet(SoftBase):
        pass

    @realtime_model()
    class Soft_(Record):  # noqa: N801
        objects = SoftQuerySet.as_manager()

    (message,) = messages()
    assert message.id == "realtime.W031"
    # After: its methods (a soft delete's delete()) run first, realtime's then see Django's
    # arguments.
    assert "`class SoftQuerySet(..., RealtimeQuerySet)`" in (message.hint or "")


def test_a_queryset_extending_djangos_own_is_told_to_put_realtimes_in_its_place_w031() -> None:
    """Beside Django's ``QuerySet`` no order of the two bases is consistent (Python refuses
    the class): the hint names the class as it must be written, and written so it passes."""

    class NoteQuerySet(models.QuerySet[Any, Any]):
        pass

    @realtime_model()
    class Note_(Record):  # noqa: N801
        objects = NoteQuerySet.as_manager()

    (message,) = messages()
    assert message.id == "realtime.W031"
    assert "`class NoteQuerySet(RealtimeQuerySet)`" in (message.hint or "")
    with pytest.raises(TypeError):  # what the other form of the hint would have given
        type("NoteQuerySet", (models.QuerySet, RealtimeQuerySet), {})

    class FixedQuerySet(RealtimeQuerySet[Any, Any]):
        pass

    @realtime_model()
    class Fixed_(Record):  # noqa: N801
        objects = FixedQuerySet.as_manager()

    assert [m for m in messages() if m.obj is Fixed_] == []


@pytest.fixture
def watching() -> Iterator[None]:
    """Membership rows watched as ``apps.ready`` watches them, for the paths a test declares;
    those of the project's models alone again after it."""
    yield
    for options in list(all_options()):
        if options.model._meta.apps is not django_apps:
            unregister(options.model)
    memberships.connect()


def membership_rows_behind(manager: models.Manager[Any]) -> type[models.Model]:
    """A record read through membership rows (``hall.pews.user``) whose model, not decorated,
    declares ``manager``: watched, its managers made realtime's, as ``apps.ready`` does."""

    class Hall(Record):
        pass

    class Pew(models.Model):
        hall = models.ForeignKey(Hall, on_delete=models.CASCADE, related_name="pews")
        user = models.ForeignKey(get_user_model(), on_delete=models.CASCADE, related_name="+")
        objects = manager

        class Meta:
            app_label = "testapp"

        def __str__(self) -> str:
            return f"pew {self.pk}"

    @realtime_model(user_field="hall.pews.user")
    class Sermon(Record):
        hall = models.ForeignKey(Hall, on_delete=models.CASCADE, related_name="+")

    memberships.connect()
    querysets.install(Pew)
    return Pew


@pytest.mark.usefixtures("watching")
def test_a_membership_model_with_a_manager_of_its_own_is_named_with_its_one_line_w031() -> None:
    class PewManager(models.Manager[Any]):
        pass

    pew = membership_rows_behind(PewManager())

    (message,) = messages()
    assert message.id == "realtime.W031"
    assert message.obj is pew
    assert message.msg.startswith("testapp.Pew.objects: bulk writes of membership rows")
    assert "`class PewManager(RealtimeManager, ...)`" in (message.hint or "")
    assert "save(), delete()" in (message.hint or "")


@pytest.mark.usefixtures("watching")
@pytest.mark.parametrize("manager", [models.Manager, RealtimeManager], ids=["django", "realtime"])
def test_a_membership_model_whose_managers_realtime_extends_gives_no_warning(
    manager: type[models.Manager[Any]],
) -> None:
    membership_rows_behind(manager())

    assert messages() == []


# At decoration time


def bare_model() -> type[models.Model]:
    class Bare(models.Model):
        name = models.CharField(max_length=100)

        class Meta:
            app_label = "testapp"

        def __str__(self) -> str:
            return self.name

    return Bare


def undecorated() -> type[models.Model]:
    class Undecorated(Record):
        pass

    return Undecorated


@pytest.mark.parametrize(
    "fields",
    [["nope"], {"wire": "nope"}, ["title", "titel"], ["tags"]],
    ids=["list", "mapping", "typo", "to-many"],
)
def test_fields_naming_no_column_raise_value_error(fields: Any) -> None:
    model = undecorated()

    with pytest.raises(ValueError, match="has no column"):
        realtime_model(fields=fields)(model)
    assert options_for(model) is None


@pytest.mark.parametrize("fields", [{"model": "title"}, {"id": "title"}], ids=["model", "id"])
def test_fields_may_not_announce_a_column_as_the_records_identity(fields: Any) -> None:
    model = undecorated()

    with pytest.raises(ValueError, match="names its record with 'model' and 'id'"):
        realtime_model(fields=fields)(model)
    assert options_for(model) is None


def test_fields_may_name_the_key_as_id() -> None:
    model = undecorated()
    realtime_model(fields=["id", "title"])(model)
    assert options_for(model) is not None


def test_a_typo_in_fields_names_the_closest_column_and_every_column() -> None:
    model = undecorated()

    with pytest.raises(ValueError, match="has no column 'titel'") as raised:
        realtime_model(fields=["titel"])(model)
    assert str(raised.value) == (
        "testapp.Undecorated has no column 'titel' to announce. Did you mean 'title'? Choices "
        "are: company, company_id, id, owner, owner_id, plain, plain_id, title, workspace, "
        "workspace_id."
    )


def test_a_name_close_to_no_column_names_every_column_and_guesses_none() -> None:
    model = undecorated()

    with pytest.raises(ValueError, match=r"has no column 'zzz' to announce\. Choices are: "):
        realtime_model(fields=["zzz"])(model)


def test_a_typo_in_cascade_names_the_closest_field() -> None:
    model = undecorated()

    with pytest.raises(ValueError, match=r"no foreign key 'compnay' to cascade from\. Did you "):
        realtime_model(cascade=["compnay"])(model)


def test_guard_fields_naming_no_field_raise_value_error() -> None:
    model = undecorated()

    with pytest.raises(ValueError, match="no field 'titel' for guard_fields"):
        realtime_model(guard=everyone, guard_fields=["titel"])(model)
    assert options_for(model) is None


def test_guard_fields_without_a_guard_raise_value_error() -> None:
    with pytest.raises(ValueError, match="give a guard too"):
        realtime_model(guard_fields=["title"])


def test_guard_fields_name_columns_and_links() -> None:
    model = declare(guard=everyone, guard_fields=["owner", "title", "tags"])

    options = options_for(model)
    assert options is not None
    assert options.guard_attnames == frozenset({"owner_id", "title", "tags"})


@pytest.mark.parametrize("option", ["fields", "relations", "cascade", "guard_fields"])
def test_a_string_instead_of_a_list_raises_value_error(option: str) -> None:
    options: dict[str, Any] = {option: "company"}

    with pytest.raises(ValueError, match="not a string"):
        realtime_model(**options)


def test_an_unknown_scope_field_raises_value_error() -> None:
    model = undecorated()

    with pytest.raises(ValueError, match="no scope field 'nope'"):
        realtime_model(scope_field="nope")(model)
    assert options_for(model) is None


def test_the_default_scope_field_missing_from_the_model_raises_value_error() -> None:
    model = bare_model()

    with pytest.raises(ValueError, match="no scope field 'workspace'"):
        realtime_model()(model)
    assert options_for(model) is None


def test_a_cascade_naming_no_field_raises_value_error() -> None:
    model = undecorated()

    with pytest.raises(ValueError, match="no foreign key 'nope'"):
        realtime_model(cascade=["nope"])(model)
    assert options_for(model) is None


@pytest.mark.parametrize("guard", ["author", Q(public=True), True])
def test_a_guard_that_is_not_callable_raises_value_error(guard: Any) -> None:
    with pytest.raises(ValueError, match="guard must be a callable"):
        realtime_model(guard=guard)


@pytest.mark.parametrize(
    "name", ["Contact", "my-model", "my model", "", "9lives", "_hidden", "note\n", "café"]
)
def test_a_bad_name_raises_value_error(name: str) -> None:
    with pytest.raises(ValueError, match="lowercase letters, digits and underscores"):
        realtime_model(name=name)


@pytest.mark.parametrize("option", ["scope", "field", "guards", "exclude"])
def test_an_unknown_option_raises_value_error(option: str) -> None:
    options: dict[str, Any] = {option: "x"}

    with pytest.raises(ValueError, match=option):
        realtime_model(**options)


class NotAModel:
    pass


def not_a_model() -> None:
    pass


@pytest.mark.parametrize(
    "target",
    [NotAModel, not_a_model, "testapp.Contact", Workspace(name="Acme", slug="acme")],
    ids=["class", "function", "label", "instance"],
)
def test_decorating_something_that_is_not_a_model_raises_type_error(target: Any) -> None:
    decorate = cast(Callable[[Any], Any], realtime_model())

    with pytest.raises(TypeError, match="decorates Django model classes"):
        decorate(target)


def test_decorating_an_abstract_model_raises_type_error_naming_the_fix() -> None:
    """An abstract model has no table and no managers, and its children would share its one
    wire name: the decorator refuses it at import, and its children are decorated instead."""

    class NoteBase(models.Model):
        title = models.CharField(max_length=100)

        class Meta:
            abstract = True
            app_label = "testapp"

    with pytest.raises(TypeError, match=r"testapp\.NoteBase is abstract.*inherits from NoteBase"):
        realtime_model(scope_field=None)(NoteBase)

    assert options_for(NoteBase) is None


def test_the_checks_report_no_manager_of_an_abstract_model() -> None:
    """An abstract model has no default manager: the check of managers (``realtime.W031``,
    ``querysets.unextended``) has nothing to report for it, and does not fail."""
    from realtime.writes.querysets import unextended

    assert unextended(Record) == []
