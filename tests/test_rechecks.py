"""``realtime.writes.rechecks``: the writes that may change what let an account in publish a recheck
of that account after commit, merged per transaction; the others publish none."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction
from django.test import override_settings
from django.utils import timezone
from pytest_django import DjangoCaptureOnCommitCallbacks

from realtime.broadcast import recheck_users
from tests.helpers import events, forget_messages, published
from tests.testapp.models import ApiKey, Membership, Notification, Profile, Workspace

User = get_user_model()
MakeUser = Callable[..., Any]
#: An account id no test creates: a recheck of it proves the pipeline ran.
MARKER = 10**9
FIRST_PHRASE = "correct horse battery"


@pytest.fixture(autouse=True)
def no_background_trims() -> Iterator[None]:
    """Keep the transport's trimming thread (and its own connection) out of these tests."""
    with override_settings(REALTIME_AUTO_TRIM=False):
        yield


def rechecks() -> list[dict[str, Any]]:
    return events("recheck")


def recheck_of(*user_ids: Any) -> list[dict[str, Any]]:
    return [{"target": "recheck", "user_ids": sorted(user_ids)}]


def fresh(user: Any) -> Any:
    """The account as loaded from the database (change detection compares with that)."""
    return User.objects.get(pk=user.pk)


# Memberships ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_membership_created_rechecks_its_user_after_commit(
    workspace: Workspace,
    make_user: MakeUser,
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    user = make_user("ann")
    forget_messages()
    with django_capture_on_commit_callbacks(execute=True):
        Membership.objects.create(workspace=workspace, user=user)
        assert published() == []
    assert rechecks() == recheck_of(user.pk)


@pytest.mark.django_db
def test_membership_role_changed_rechecks_its_user(
    workspace: Workspace,
    make_user: MakeUser,
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    user = make_user("ann", member_of=workspace)
    membership = Membership.objects.get(workspace=workspace, user=user)
    forget_messages()
    with django_capture_on_commit_callbacks(execute=True):
        membership.role = "admin"
        membership.save()
    assert rechecks() == recheck_of(user.pk)


@pytest.mark.django_db
def test_membership_deleted_rechecks_its_user(
    workspace: Workspace,
    make_user: MakeUser,
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    user = make_user("ann", member_of=workspace)
    membership = Membership.objects.get(workspace=workspace, user=user)
    forget_messages()
    with django_capture_on_commit_callbacks(execute=True):
        membership.delete()
    assert rechecks() == recheck_of(user.pk)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "delete",
    [
        lambda rows: rows.only("pk").delete(),
        lambda rows: rows.only("pk").get().delete(),
        lambda rows: rows.defer("user").get().delete(),
    ],
    ids=["queryset-only", "instance-only", "instance-defer"],
)
def test_membership_loaded_without_its_account_and_deleted_rechecks_its_user(
    workspace: Workspace,
    make_user: MakeUser,
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
    delete: Callable[[Any], Any],
) -> None:
    user = make_user("ann", member_of=workspace)
    forget_messages()
    with django_capture_on_commit_callbacks(execute=True):
        delete(Membership.objects.filter(workspace=workspace, user=user))
    assert rechecks() == recheck_of(user.pk)


@pytest.mark.django_db
def test_members_added_through_the_m2m_manager_are_rechecked(
    workspace: Workspace,
    make_user: MakeUser,
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    ann, bob = make_user("ann"), make_user("bob")
    forget_messages()
    with django_capture_on_commit_callbacks(execute=True):
        workspace.members.add(bob, ann)
    assert rechecks() == recheck_of(ann.pk, bob.pk)
    assert set(workspace.members.all()) == {ann, bob}


@pytest.mark.django_db
def test_scope_added_from_the_user_side_rechecks_the_user(
    workspace: Workspace,
    make_user: MakeUser,
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    ann = make_user("ann")
    forget_messages()
    with django_capture_on_commit_callbacks(execute=True):
        ann.workspaces.add(workspace)
    assert rechecks() == recheck_of(ann.pk)


@pytest.mark.django_db
def test_member_removed_through_the_m2m_manager_is_rechecked(
    workspace: Workspace,
    make_user: MakeUser,
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    ann = make_user("ann", member_of=workspace)
    make_user("bob", member_of=workspace)
    forget_messages()
    with django_capture_on_commit_callbacks(execute=True):
        workspace.members.remove(ann)
    assert rechecks() == recheck_of(ann.pk)


@pytest.mark.django_db
def test_members_cleared_through_the_m2m_manager_are_all_rechecked(
    workspace: Workspace,
    make_user: MakeUser,
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    ann = make_user("ann", member_of=workspace)
    bob = make_user("bob", member_of=workspace)
    other = Workspace.objects.create(name="Other", slug="other")
    make_user("cid", member_of=other)
    forget_messages()
    with django_capture_on_commit_callbacks(execute=True):
        workspace.members.clear()
    assert rechecks() == recheck_of(ann.pk, bob.pk)


@pytest.mark.django_db
def test_workspace_deleted_rechecks_its_members(
    workspace: Workspace,
    make_user: MakeUser,
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    ann = make_user("ann", member_of=workspace)
    bob = make_user("bob", member_of=workspace)
    other = Workspace.objects.create(name="Other", slug="other")
    make_user("cid", member_of=other)
    forget_messages()
    with django_capture_on_commit_callbacks(execute=True):
        workspace.delete()
    assert rechecks() == recheck_of(ann.pk, bob.pk)


# Accounts --------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_user_deleted_is_rechecked(
    workspace: Workspace,
    make_user: MakeUser,
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    ann = make_user("ann", member_of=workspace)
    ann_id = ann.pk
    forget_messages()
    with django_capture_on_commit_callbacks(execute=True):
        fresh(ann).delete()
    assert rechecks() == recheck_of(ann_id)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("field", "value"),
    [("username", "ann2"), ("email", "ann@example.com"), ("is_active", False)],
)
def test_user_whose_login_facts_change_is_rechecked(
    field: str,
    value: Any,
    make_user: MakeUser,
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    ann = make_user("ann", email="ann@example.org")
    forget_messages()
    with django_capture_on_commit_callbacks(execute=True):
        user = fresh(ann)
        setattr(user, field, value)
        user.save()
        assert published() == []
    assert rechecks() == recheck_of(ann.pk)


@pytest.mark.django_db
def test_user_built_by_hand_over_its_row_with_a_new_email_is_rechecked(
    make_user: MakeUser,
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    ann = make_user("ann", email="ann@example.org")
    by_hand = get_user_model()(
        pk=ann.pk, username=ann.username, email="ann@example.com", password=ann.password
    )
    forget_messages()
    with django_capture_on_commit_callbacks(execute=True):
        by_hand.save()
    # Compared with the stored row, not with a snapshot it never had.
    assert rechecks() == recheck_of(ann.pk)


@pytest.mark.django_db
@override_settings(REALTIME_REVOKE_ON_PASSWORD_CHANGE=True)
def test_password_changed_rechecks_the_user_when_it_revokes(
    make_user: MakeUser,
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    ann = make_user("ann", password=FIRST_PHRASE)
    forget_messages()
    with django_capture_on_commit_callbacks(execute=True):
        user = fresh(ann)
        user.set_password("new-password")
        user.save()
    assert rechecks() == recheck_of(ann.pk)


@pytest.mark.django_db
def test_password_changed_rechecks_nothing_by_default(
    make_user: MakeUser,
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    ann = make_user("ann", password=FIRST_PHRASE)
    forget_messages()
    with django_capture_on_commit_callbacks(execute=True):
        user = fresh(ann)
        user.set_password("new-password")
        user.save()
        recheck_users([MARKER])
    assert rechecks() == recheck_of(MARKER)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "change",
    [
        {"first_name": "Ann"},
        {"last_name": "Lee"},
        {"first_name": "Ann", "last_name": "Lee"},
        {},
    ],
    ids=["first_name", "last_name", "both", "nothing"],
)
def test_user_saved_without_login_fact_changes_rechecks_nothing(
    change: dict[str, Any],
    make_user: MakeUser,
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    ann = make_user("ann", email="ann@example.org")
    forget_messages()
    with django_capture_on_commit_callbacks(execute=True):
        user = fresh(ann)
        for field, value in change.items():
            setattr(user, field, value)
        user.save()
        recheck_users([MARKER])
    assert rechecks() == recheck_of(MARKER)


@pytest.mark.django_db
def test_last_login_saved_rechecks_nothing(
    make_user: MakeUser,
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    ann = make_user("ann")
    forget_messages()
    with django_capture_on_commit_callbacks(execute=True):
        user = fresh(ann)
        user.last_login = timezone.now()
        user.save(update_fields=["last_login"])
        recheck_users([MARKER])
    assert rechecks() == recheck_of(MARKER)


@pytest.mark.django_db
def test_last_login_saved_beside_an_unsaved_username_edit_rechecks_nothing(
    make_user: MakeUser,
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    ann = make_user("ann")
    forget_messages()
    with django_capture_on_commit_callbacks(execute=True):
        user = fresh(ann)
        user.username = "not-saved"
        user.last_login = timezone.now()
        user.save(update_fields=["last_login"])
        recheck_users([MARKER])
    assert fresh(ann).username == "ann"
    assert rechecks() == recheck_of(MARKER)


@pytest.mark.django_db
def test_second_save_of_an_unchanged_username_rechecks_once(
    make_user: MakeUser,
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    ann = make_user("ann")
    forget_messages()
    with django_capture_on_commit_callbacks(execute=True):
        user = fresh(ann)
        user.username = "ann2"
        user.save()
    assert rechecks() == recheck_of(ann.pk)
    forget_messages()
    with django_capture_on_commit_callbacks(execute=True):
        user.first_name = "Ann"
        user.save()
        recheck_users([MARKER])
    assert rechecks() == recheck_of(MARKER)


# REALTIME_RECHECK_MODELS ------------------------------------------------------------------------


@pytest.mark.django_db
@override_settings(REALTIME_RECHECK_MODELS={"testapp.Notification": "user"})
def test_recheck_model_saved_rechecks_its_user(
    make_user: MakeUser,
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    ann = make_user("ann")
    forget_messages()
    with django_capture_on_commit_callbacks(execute=True):
        Notification.objects.create(user=ann, text="key issued")
    assert rechecks() == recheck_of(ann.pk)


@pytest.mark.django_db
@override_settings(REALTIME_RECHECK_MODELS={"testapp.Notification": "user"})
def test_recheck_model_deleted_rechecks_its_user(
    make_user: MakeUser,
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    ann = make_user("ann")
    notification = Notification.objects.create(user=ann, text="key issued")
    forget_messages()
    with django_capture_on_commit_callbacks(execute=True):
        notification.delete()
    assert rechecks() == recheck_of(ann.pk)


@pytest.mark.django_db
@override_settings(REALTIME_RECHECK_MODELS={"testapp.Notification": "user"})
def test_recheck_model_loaded_without_its_account_and_deleted_rechecks_its_user(
    make_user: MakeUser,
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    ann = make_user("ann")
    Notification.objects.create(user=ann, text="key issued")
    forget_messages()
    with django_capture_on_commit_callbacks(execute=True):
        Notification.objects.filter(user=ann).only("pk").delete()
    assert rechecks() == recheck_of(ann.pk)


@pytest.mark.django_db
def test_model_not_named_in_recheck_models_rechecks_nothing(
    make_user: MakeUser,
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    ann = make_user("ann")
    forget_messages()
    with django_capture_on_commit_callbacks(execute=True):
        Notification.objects.create(user=ann, text="hello").delete()
        recheck_users([MARKER])
    assert rechecks() == recheck_of(MARKER)


# One transaction -------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_rechecks_of_one_transaction_are_merged_into_one_sorted_message(
    workspace: Workspace, make_user: MakeUser
) -> None:
    ann, bob, cid = make_user("ann"), make_user("bob"), make_user("cid")
    forget_messages()
    with transaction.atomic():
        Membership.objects.create(workspace=workspace, user=cid)
        user = fresh(ann)
        user.email = "ann@example.com"
        user.save()
        workspace.members.add(bob)
        recheck_users([cid.pk, ann.pk])
        Membership.objects.get(user=cid).delete()
        assert published() == []
    assert rechecks() == recheck_of(ann.pk, bob.pk, cid.pk)


@pytest.mark.django_db(transaction=True)
def test_rechecks_around_a_released_savepoint_are_merged_into_one_message(
    workspace: Workspace, make_user: MakeUser
) -> None:
    ann, bob = make_user("ann"), make_user("bob")
    forget_messages()
    with transaction.atomic():
        Membership.objects.create(workspace=workspace, user=bob)
        with transaction.atomic():
            Membership.objects.create(workspace=workspace, user=ann)
        assert published() == []
    assert rechecks() == recheck_of(ann.pk, bob.pk)


@pytest.mark.django_db(transaction=True)
def test_rolled_back_transaction_publishes_no_recheck(
    workspace: Workspace, make_user: MakeUser
) -> None:
    ann = make_user("ann", member_of=workspace)
    bob = make_user("bob")
    forget_messages()
    with transaction.atomic():
        Membership.objects.create(workspace=workspace, user=bob)
        user = fresh(ann)
        user.username = "ann2"
        user.save()
        workspace.delete()
        transaction.set_rollback(True)
    recheck_users([MARKER])
    assert rechecks() == recheck_of(MARKER)


@pytest.mark.django_db(transaction=True)
def test_write_outside_a_transaction_rechecks_at_once(
    workspace: Workspace, make_user: MakeUser
) -> None:
    ann = make_user("ann")
    forget_messages()
    Membership.objects.create(workspace=workspace, user=ann)
    assert rechecks() == recheck_of(ann.pk)


# Memberships handed to another account or moved ------------------------------------------------


@pytest.mark.django_db
def test_membership_handed_to_another_account_rechecks_both_accounts(
    workspace: Workspace,
    make_user: MakeUser,
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    former, successor = make_user("ann", member_of=workspace), make_user("bob")
    membership = Membership.objects.get(workspace=workspace, user=former)
    forget_messages()
    with django_capture_on_commit_callbacks(execute=True):
        membership.user = successor
        membership.save()
    assert rechecks() == recheck_of(former.pk, successor.pk)


@pytest.mark.django_db
def test_membership_built_by_hand_and_handed_over_rechecks_the_stored_account_too(
    workspace: Workspace,
    make_user: MakeUser,
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    former, successor = make_user("ann", member_of=workspace), make_user("bob")
    stored = Membership.objects.get(workspace=workspace, user=former)
    # No snapshot: the account the row named is read from the database before the save.
    by_hand = Membership(pk=stored.pk, workspace=workspace, user=successor)
    forget_messages()
    with django_capture_on_commit_callbacks(execute=True):
        by_hand.save()
    assert rechecks() == recheck_of(former.pk, successor.pk)


@pytest.mark.django_db
def test_membership_moved_to_another_scope_rechecks_its_account(
    workspace: Workspace,
    make_user: MakeUser,
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    other = Workspace.objects.create(name="Beta", slug="beta")
    user = make_user("ann", member_of=workspace)
    membership = Membership.objects.get(workspace=workspace, user=user)
    forget_messages()
    with django_capture_on_commit_callbacks(execute=True):
        membership.workspace = other
        membership.save()
    assert rechecks() == recheck_of(user.pk)


@pytest.mark.django_db
def test_membership_handed_over_through_update_fields_rechecks_both_accounts(
    workspace: Workspace,
    make_user: MakeUser,
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    former, successor = make_user("ann", member_of=workspace), make_user("bob")
    membership = Membership.objects.get(workspace=workspace, user=former)
    forget_messages()
    with django_capture_on_commit_callbacks(execute=True):
        membership.user = successor
        membership.save(update_fields=["user"])
    assert rechecks() == recheck_of(former.pk, successor.pk)


@pytest.mark.django_db
def test_members_set_through_the_m2m_manager_recheck_those_removed_and_added(
    workspace: Workspace,
    make_user: MakeUser,
    django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks,
) -> None:
    kept, dropped = make_user("ann", member_of=workspace), make_user("bob", member_of=workspace)
    joined = make_user("carol")
    forget_messages()
    with django_capture_on_commit_callbacks(execute=True):
        workspace.members.set([kept, joined])
    assert rechecks() == recheck_of(dropped.pk, joined.pk)


@pytest.mark.django_db(transaction=True)
@override_settings(REALTIME_RECHECK_MODELS={"testapp.ApiKey": "profile.user"})
def test_recheck_model_moved_along_a_multi_hop_path_rechecks_both_accounts(
    make_user: MakeUser,
) -> None:
    ann, bob = make_user("ann"), make_user("bob")
    ann_profile, bob_profile = Profile.objects.create(user=ann), Profile.objects.create(user=bob)
    key = ApiKey.objects.create(profile=ann_profile, label="ci")
    forget_messages()
    key.profile = bob_profile
    key.save()
    assert rechecks() == recheck_of(ann.pk, bob.pk)
