"""``realtime.auth``: who a bearer is, which scopes it reads, and who hears an event.

Every hook runs against the real test database; the guarded audience is checked statement by
statement, because its promise is a bounded number of queries however many accounts listen.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core import signing
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils.crypto import salted_hmac
from pytest_django import DjangoAssertNumQueries

from realtime import limits
from realtime import tokens as tokens_module
from realtime.auth import RealtimeAuth, Scope, get_auth, issue_token, member_ids
from realtime.sockets import standing
from realtime.tokens import TOKEN_SALT, token_fingerprint
from tests.testapp.models import (
    Board,
    Company,
    Contact,
    Membership,
    PrivateNote,
    Project,
    Workspace,
)

MakeUser = Callable[..., Any]
EXISTS = re.compile(r"\bEXISTS\s*\(", re.IGNORECASE)


@pytest.fixture
def auth() -> RealtimeAuth:
    return RealtimeAuth()


@pytest.fixture
def acme(db: None) -> Workspace:
    return Workspace.objects.create(name="Acme", slug="acme")


@pytest.fixture
def beta(db: None) -> Workspace:
    return Workspace.objects.create(name="Beta", slug="beta")


@pytest.fixture
def gamma(db: None) -> Workspace:
    return Workspace.objects.create(name="Gamma", slug="gamma")


def exists_columns(captured: CaptureQueriesContext, index: int) -> int:
    return len(EXISTS.findall(captured.captured_queries[index]["sql"]))


# Who a bearer is ------------------------------------------------------------------------------


def test_fresh_token_stands_for_its_account(auth: RealtimeAuth, make_user: MakeUser) -> None:
    alice = make_user("alice")
    bob = make_user("bob")

    assert auth.user_of_token(issue_token(alice)) == alice
    assert auth.user_of_token(issue_token(bob)) == bob


@pytest.mark.parametrize(
    "token",
    ["garbage", "", ":", "a:b:c", "eyJ1IjoxfQ:1uAbCd:notasignature"],
)
def test_unreadable_token_stands_for_nobody(
    auth: RealtimeAuth, make_user: MakeUser, token: str
) -> None:
    make_user("alice")

    assert auth.user_of_token(token) is None


def test_token_signed_with_another_salt_stands_for_nobody(
    auth: RealtimeAuth, make_user: MakeUser
) -> None:
    alice = make_user("alice")
    claims = {"u": alice.pk, "f": token_fingerprint(alice)}

    assert auth.user_of_token(signing.dumps(claims, salt="another.salt")) is None
    # The control: the same claims under the realtime salt are accepted.
    assert auth.user_of_token(signing.dumps(claims, salt=TOKEN_SALT)) == alice


def test_token_signed_with_another_key_stands_for_nobody(
    auth: RealtimeAuth, make_user: MakeUser
) -> None:
    alice = make_user("alice")
    claims = {"u": alice.pk, "f": token_fingerprint(alice)}

    assert auth.user_of_token(signing.dumps(claims, key="not-the-secret", salt=TOKEN_SALT)) is None


def test_token_whose_claims_were_swapped_for_another_account_stands_for_nobody(
    auth: RealtimeAuth, make_user: MakeUser
) -> None:
    alice = make_user("alice")
    bob = make_user("bob")
    _, timestamp, signature = issue_token(alice).split(":")
    bob_claims = issue_token(bob).split(":")[0]

    assert auth.user_of_token(f"{bob_claims}:{timestamp}:{signature}") is None


def test_token_with_an_altered_signature_stands_for_nobody(
    auth: RealtimeAuth, make_user: MakeUser
) -> None:
    alice = make_user("alice")
    token = issue_token(alice)
    altered = token[:-1] + ("A" if token[-1] != "A" else "B")

    assert auth.user_of_token(altered) is None


@pytest.mark.parametrize(
    "claims",
    [[1, "f"], {"u": 1}, {"f": "x"}, "alice", None, {"u": 1, "f": "x", "t": "now"}],
)
def test_validly_signed_token_of_another_shape_stands_for_nobody(
    auth: RealtimeAuth, make_user: MakeUser, claims: Any
) -> None:
    make_user("alice")

    assert auth.user_of_token(signing.dumps(claims, salt=TOKEN_SALT)) is None


def test_token_older_than_max_age_stands_for_nobody(
    auth: RealtimeAuth, make_user: MakeUser
) -> None:
    alice = make_user("alice")
    token = issue_token(alice)
    # Honest expiry: a real token from issue_token and the real clock, no forged timestamp and
    # no patched time.time. Signed timestamps are whole seconds and a token expires once its
    # age exceeds REALTIME_TOKEN_MAX_AGE, so with a one-second max age it is expired as soon
    # as the clock passes its signed second plus one: wait exactly that long (at most ~1 s).
    issued = signing.loads(token, salt=TOKEN_SALT)["t"]
    time.sleep(max(0.0, issued + 1 - time.time()) + 0.05)

    with override_settings(REALTIME_TOKEN_MAX_AGE=1):
        assert auth.user_of_token(token) is None
    # The same token under a longer max age still stands for alice: its age alone refused it.
    with override_settings(REALTIME_TOKEN_MAX_AGE=3600):
        assert auth.user_of_token(token) == alice


def test_a_token_read_before_is_still_refused_once_it_expires(
    auth: RealtimeAuth, make_user: MakeUser
) -> None:
    alice = make_user("alice")
    token = issue_token(alice)
    # Read once while it stands (its signature is then checked, and kept).
    assert auth.user_of_token(token) == alice
    issued = signing.loads(token, salt=TOKEN_SALT)["t"]
    time.sleep(max(0.0, issued + 1 - time.time()) + 0.05)

    with override_settings(REALTIME_TOKEN_MAX_AGE=1):
        assert auth.user_of_token(token) is None
        assert auth.users_of_tokens([token]) == [None]


def legacy_token(user: Any) -> str:
    """A token as ``issue_token`` signed them before it held the issue time in its payload."""
    return signing.dumps({"u": user.pk, "f": token_fingerprint(user)}, salt=TOKEN_SALT)


def test_a_token_holds_the_second_it_was_issued_in_its_signed_payload(
    make_user: MakeUser,
) -> None:
    before = int(time.time())
    claims = signing.loads(issue_token(make_user("alice")), salt=TOKEN_SALT)
    assert before <= claims["t"] <= time.time()


def test_a_token_issue_token_signs_for_an_account_names_no_session(make_user: MakeUser) -> None:
    # Tokens of FastEdgy-style clients and of tests: as before, no sign-out ends their sockets.
    token = issue_token(make_user("alice"))
    assert "s" not in signing.loads(token, salt=TOKEN_SALT)
    assert tokens_module.session_claim(token) is None


def test_a_token_issued_to_a_session_names_it_by_a_keyed_hash_never_its_key(
    auth: RealtimeAuth, make_user: MakeUser
) -> None:
    alice = make_user("alice")
    key = "k" * 32
    token = issue_token(alice, session_key=key)
    claimed = tokens_module.session_claim(token)
    assert claimed == tokens_module.session_hash(key)
    assert claimed in tokens_module.session_hashes(key)
    assert len(claimed) == 16
    assert key not in signing.loads(token, salt=TOKEN_SALT).values()
    assert auth.user_of_token(token) == alice


def test_a_token_issued_before_the_issue_time_was_in_its_payload_still_stands(
    auth: RealtimeAuth, make_user: MakeUser
) -> None:
    alice = make_user("alice")
    token = legacy_token(alice)

    assert auth.user_of_token(token) == alice
    assert auth.users_of_tokens([token, token]) == [alice, alice]
    assert standing.accounts_of_tokens([token]) == [standing.Account(alice.pk)]
    # Read again (its signature kept): it still stands until it expires.
    assert auth.user_of_token(token) == alice
    with override_settings(SECRET_KEY="another-key-" + "z" * 40):
        assert auth.user_of_token(token) is None


def test_a_token_issued_before_the_issue_time_was_in_its_payload_expires_on_time(
    auth: RealtimeAuth, make_user: MakeUser
) -> None:
    alice = make_user("alice")
    token = legacy_token(alice)
    signed_by = time.time()  # its signed second is at most this
    assert auth.user_of_token(token) == alice  # read once while it stands: its claims kept
    time.sleep(max(0.0, signed_by + 1 - time.time()) + 0.05)

    with override_settings(REALTIME_TOKEN_MAX_AGE=1):
        assert auth.user_of_token(token) is None
        assert auth.users_of_tokens([token]) == [None]
    with override_settings(REALTIME_TOKEN_MAX_AGE=3600):
        assert auth.user_of_token(token) == alice


@pytest.mark.parametrize("revoke_on_password", [False, True])
def test_a_token_whose_fingerprint_django_made_still_stands(
    auth: RealtimeAuth, make_user: MakeUser, revoke_on_password: bool
) -> None:
    """Earlier releases made the fingerprint with Django's ``salted_hmac``; it is made with
    the standard library now, the same for the same account."""
    alice = make_user("alice", email="alice@example.com", password="pw")
    parts = [alice.get_username(), alice.email, *([alice.password] if revoke_on_password else [])]
    with override_settings(
        REALTIME_REVOKE_ON_PASSWORD_CHANGE=revoke_on_password,
        SECRET_KEY="the-new-key-" + "y" * 40,
        SECRET_KEY_FALLBACKS=["the-old-key-" + "x" * 40],
    ):
        for key in ("the-new-key-" + "y" * 40, "the-old-key-" + "x" * 40):
            made = salted_hmac(TOKEN_SALT, "\0".join(parts), key, algorithm="sha256")
            claims = {"u": alice.pk, "f": made.hexdigest()[:20]}
            assert auth.user_of_token(signing.dumps(claims, salt=TOKEN_SALT)) == alice
            assert token_fingerprint(alice, key) == claims["f"]


def test_a_token_read_before_stands_for_nobody_once_the_secret_key_changes(
    auth: RealtimeAuth, make_user: MakeUser
) -> None:
    alice = make_user("alice")
    with override_settings(SECRET_KEY="the-old-key-" + "x" * 40):
        token = issue_token(alice)
        assert auth.user_of_token(token) == alice
        with override_settings(SECRET_KEY="the-new-key-" + "y" * 40):
            assert auth.user_of_token(token) is None
            assert auth.users_of_tokens([token]) == [None]
            # Still accepted while the old key is a fallback, as Django's signing does.
            with override_settings(SECRET_KEY_FALLBACKS=["the-old-key-" + "x" * 40]):
                assert auth.user_of_token(token) == alice
            assert auth.user_of_token(token) is None


def test_tokens_that_fail_their_signature_check_are_not_kept(
    auth: RealtimeAuth, make_user: MakeUser
) -> None:
    token = issue_token(make_user("alice"))
    kept = tokens_module._signed.cache_info().currsize
    for index in range(100):
        assert auth.user_of_token(f"{token}{index}") is None  # a signature that does not match
        assert auth.user_of_token("x" * 10_000 + str(index)) is None
    assert tokens_module._signed.cache_info().currsize == kept


@pytest.mark.parametrize(
    ("field", "value"),
    [("username", "alicia"), ("email", "alicia@example.com")],
)
def test_changing_username_or_email_invalidates_earlier_tokens(
    auth: RealtimeAuth, make_user: MakeUser, field: str, value: str
) -> None:
    alice = make_user("alice", email="alice@example.com")
    token = issue_token(alice)

    setattr(alice, field, value)
    alice.save()

    assert auth.user_of_token(token) is None
    assert auth.user_of_token(issue_token(alice)) == alice


def test_changing_first_name_keeps_earlier_tokens(auth: RealtimeAuth, make_user: MakeUser) -> None:
    alice = make_user("alice", email="alice@example.com")
    token = issue_token(alice)

    alice.first_name = "Alice"
    alice.save()

    assert auth.user_of_token(token) == alice


def test_changing_password_keeps_earlier_tokens_by_default(
    auth: RealtimeAuth, make_user: MakeUser
) -> None:
    alice = make_user("alice", password=secrets.token_hex(8))
    token = issue_token(alice)

    alice.set_password(secrets.token_hex(8))
    alice.save()

    assert auth.user_of_token(token) == alice


@override_settings(REALTIME_REVOKE_ON_PASSWORD_CHANGE=True)
def test_changing_password_invalidates_earlier_tokens_when_revoking_on_password_change(
    auth: RealtimeAuth, make_user: MakeUser
) -> None:
    alice = make_user("alice", password=secrets.token_hex(8))
    token = issue_token(alice)
    assert auth.user_of_token(token) == alice

    alice.set_password(secrets.token_hex(8))
    alice.save()

    assert auth.user_of_token(token) is None
    assert auth.user_of_token(issue_token(alice)) == alice


def test_token_of_an_inactive_account_stands_for_nobody(
    auth: RealtimeAuth, make_user: MakeUser
) -> None:
    alice = make_user("alice")
    token = issue_token(alice)

    alice.is_active = False
    alice.save()

    assert auth.user_of_token(token) is None


def test_token_of_a_deleted_account_stands_for_nobody(
    auth: RealtimeAuth, make_user: MakeUser
) -> None:
    alice = make_user("alice")
    token = issue_token(alice)

    alice.delete()

    assert auth.user_of_token(token) is None


# Which scopes -------------------------------------------------------------------------------


def test_scope_of_gives_the_scope_a_member_names(
    auth: RealtimeAuth, make_user: MakeUser, acme: Workspace
) -> None:
    alice = make_user("alice", member_of=acme)

    assert auth.scope_of(alice, "acme") == Scope(acme.pk, "acme")


def test_scope_of_gives_nothing_to_a_non_member(
    auth: RealtimeAuth, make_user: MakeUser, acme: Workspace, beta: Workspace
) -> None:
    alice = make_user("alice", member_of=beta)

    assert auth.scope_of(alice, "acme") is None


def test_scope_of_no_slug_is_nothing_and_costs_no_query(
    auth: RealtimeAuth,
    make_user: MakeUser,
    acme: Workspace,
    django_assert_num_queries: DjangoAssertNumQueries,
) -> None:
    alice = make_user("alice", member_of=acme)

    with django_assert_num_queries(0):
        assert auth.scope_of(alice, None) is None


@pytest.mark.parametrize("slug", ["nope", "ACME ", 5, ["acme"]])
def test_scope_of_an_unknown_or_non_string_slug_is_nothing(
    auth: RealtimeAuth, make_user: MakeUser, acme: Workspace, slug: Any
) -> None:
    alice = make_user("alice", member_of=acme)

    assert auth.scope_of(alice, slug) is None


def test_scopes_of_gives_member_scopes_in_asked_order_once_in_one_query(
    auth: RealtimeAuth,
    make_user: MakeUser,
    acme: Workspace,
    beta: Workspace,
    gamma: Workspace,
    django_assert_num_queries: DjangoAssertNumQueries,
) -> None:
    alice = make_user("alice", member_of=[acme, gamma])
    asked: list[Any] = ["gamma", 5, "beta", None, "acme", "gamma", ["acme"], "nope", "acme"]

    with django_assert_num_queries(1):
        found = auth.scopes_of(alice, asked)

    assert found == [Scope(gamma.pk, "gamma"), Scope(acme.pk, "acme")]


@pytest.mark.parametrize("asked", [[], [5, None, ["acme"], {"slug": "acme"}]])
def test_scopes_of_nothing_readable_asked_is_empty_and_costs_no_query(
    auth: RealtimeAuth,
    make_user: MakeUser,
    acme: Workspace,
    django_assert_num_queries: DjangoAssertNumQueries,
    asked: list[Any],
) -> None:
    alice = make_user("alice", member_of=acme)

    with django_assert_num_queries(0):
        assert auth.scopes_of(alice, asked) == []


def test_held_scopes_keeps_the_ids_still_held_in_one_query(
    auth: RealtimeAuth,
    make_user: MakeUser,
    acme: Workspace,
    beta: Workspace,
    gamma: Workspace,
    django_assert_num_queries: DjangoAssertNumQueries,
) -> None:
    alice = make_user("alice", member_of=[acme, gamma])
    gone = Workspace.objects.create(name="Gone", slug="gone")
    gone_id = gone.pk
    gone.delete()

    with django_assert_num_queries(1):
        held = auth.held_scopes(alice, [gamma.pk, beta.pk, gone_id, acme.pk])

    assert held == [Scope(gamma.pk, "gamma"), Scope(acme.pk, "acme")]


def test_held_scopes_keeps_a_scope_whose_slug_was_renamed(
    auth: RealtimeAuth, make_user: MakeUser, acme: Workspace
) -> None:
    alice = make_user("alice", member_of=acme)

    acme.slug = "acme-renamed"
    acme.save()

    assert auth.held_scopes(alice, [acme.pk]) == [Scope(acme.pk, "acme-renamed")]


def test_held_scopes_drops_a_scope_whose_membership_ended(
    auth: RealtimeAuth, make_user: MakeUser, acme: Workspace, beta: Workspace
) -> None:
    alice = make_user("alice", member_of=[acme, beta])

    Membership.objects.filter(user=alice, workspace=acme).delete()

    assert auth.held_scopes(alice, [acme.pk, beta.pk]) == [Scope(beta.pk, "beta")]


def test_held_scopes_of_no_ids_is_empty_and_costs_no_query(
    auth: RealtimeAuth,
    make_user: MakeUser,
    acme: Workspace,
    django_assert_num_queries: DjangoAssertNumQueries,
) -> None:
    alice = make_user("alice", member_of=acme)

    with django_assert_num_queries(0):
        assert auth.held_scopes(alice, iter([])) == []


def test_reached_scopes_reaches_every_scope_by_default(
    auth: RealtimeAuth, db: None, django_assert_num_queries: DjangoAssertNumQueries
) -> None:
    with django_assert_num_queries(0):
        assert auth.reached_scopes("any token", iter([3, 1, 2])) == [3, 1, 2]
        assert auth.reached_scopes("any token", []) == []


# Who hears an event ---------------------------------------------------------------------------


def test_audience_of_an_event_about_nothing_is_every_account_asked(
    auth: RealtimeAuth,
    acme: Workspace,
    django_assert_num_queries: DjangoAssertNumQueries,
) -> None:
    with django_assert_num_queries(0):
        heard = list(auth.audience(acme.pk, "report.ready", None, [3, 1, 2], None))

    assert heard == [3, 1, 2]


@pytest.mark.parametrize(
    "about",
    [{"model": "plain", "id": 1}, {"model": "nobody", "id": 1}, {"id": 1}, {}],
)
def test_audience_of_an_event_about_an_undeclared_model_is_nobody(
    auth: RealtimeAuth, make_user: MakeUser, acme: Workspace, about: dict[str, Any]
) -> None:
    alice = make_user("alice", member_of=acme)

    assert list(auth.audience(acme.pk, "plain.updated", None, [alice.pk], about)) == []


def test_audience_of_an_event_about_an_unguarded_model_is_every_account_asked(
    auth: RealtimeAuth,
    make_user: MakeUser,
    acme: Workspace,
    django_assert_num_queries: DjangoAssertNumQueries,
) -> None:
    alice = make_user("alice", member_of=acme)
    bob = make_user("bob", member_of=acme)
    contact = Contact.objects.create(workspace=acme, name="Ann")
    about = {"model": "contact", "id": contact.pk}

    with django_assert_num_queries(0):
        heard = list(auth.audience(acme.pk, "contact.updated", None, [alice.pk, bob.pk], about))

    assert heard == [alice.pk, bob.pk]


def test_audience_of_a_private_note_is_its_author_only(
    auth: RealtimeAuth, make_user: MakeUser, acme: Workspace
) -> None:
    alice = make_user("alice", member_of=acme)
    bob = make_user("bob", member_of=acme)
    carol = make_user("carol", member_of=acme)
    note = PrivateNote.objects.create(workspace=acme, author=bob, title="Mine")
    about = {"model": "private_note", "id": note.pk}

    heard = auth.audience(
        acme.pk, "private_note.updated", None, [alice.pk, bob.pk, carol.pk], about
    )

    assert list(heard) == [bob.pk]


def test_audience_of_a_public_note_is_every_account_asked(
    auth: RealtimeAuth, make_user: MakeUser, acme: Workspace
) -> None:
    alice = make_user("alice", member_of=acme)
    bob = make_user("bob", member_of=acme)
    note = PrivateNote.objects.create(workspace=acme, author=bob, title="Ours", public=True)
    about = {"model": "private_note", "id": note.pk}

    heard = auth.audience(acme.pk, "private_note.updated", None, [alice.pk, bob.pk], about)

    assert sorted(heard) == sorted([alice.pk, bob.pk])


def test_audience_of_a_guarded_row_accepts_the_scope_members_as_a_lazy_query(
    auth: RealtimeAuth,
    make_user: MakeUser,
    acme: Workspace,
    beta: Workspace,
    django_assert_num_queries: DjangoAssertNumQueries,
) -> None:
    make_user("alice", member_of=acme)
    bob = make_user("bob", member_of=acme)
    make_user("outsider", member_of=beta)
    note = PrivateNote.objects.create(workspace=acme, author=bob, title="Mine", public=True)
    about = {"model": "private_note", "id": note.pk}
    members = member_ids(acme.pk)

    with django_assert_num_queries(2):
        heard = list(auth.audience(acme.pk, "private_note.updated", None, members, about))

    assert sorted(heard) == sorted(
        Membership.objects.filter(workspace=acme).values_list("user_id", flat=True)
    )


def make_accounts(count: int) -> list[Any]:
    """Create ``count`` accounts in one statement; return their ids in ascending order."""
    user_model = get_user_model()
    user_model.objects.bulk_create(user_model(username=f"reader{i:03d}") for i in range(count))
    return list(
        user_model.objects.filter(username__startswith="reader")
        .order_by("pk")
        .values_list("pk", flat=True)
    )


@pytest.mark.parametrize("accounts", [1, 10, limits.MAX_IDS_PER_MESSAGE + 1])
def test_a_guard_of_column_lookups_costs_two_statements_and_no_subquery_however_many_accounts(
    auth: RealtimeAuth,
    acme: Workspace,
    django_assert_num_queries: DjangoAssertNumQueries,
    accounts: int,
) -> None:
    user_ids = make_accounts(accounts)
    author = get_user_model().objects.get(pk=user_ids[-1])
    note = PrivateNote.objects.create(workspace=acme, author=author, title="Mine")
    about = {"model": "private_note", "id": note.pk}

    # ``Q(author=user) | Q(public=True)`` is decided in process: one statement for the
    # accounts, one for the row's columns.
    with django_assert_num_queries(2) as captured:
        heard = list(auth.audience(acme.pk, "private_note.updated", None, user_ids, about))

    assert heard == [author.pk]
    assert [exists_columns(captured, index) for index in range(2)] == [0, 0]

    note.public = True
    note.save()
    with django_assert_num_queries(2):
        heard = list(auth.audience(acme.pk, "private_note.updated", None, user_ids, about))

    assert heard == user_ids


def board_of(workspace: Workspace, member: Any) -> tuple[Board, dict[str, Any]]:
    """A board (guarded by a relation: ``Q(members=user)``) whose one member is ``member``,
    and what an event about it names."""
    board = Board.objects.create(workspace=workspace, name="Plans")
    board.members.add(member)
    return board, {"model": "board", "id": board.pk}


@pytest.mark.parametrize("accounts", [1, 10, limits.MAX_IDS_PER_MESSAGE])
def test_a_guard_the_database_decides_costs_two_statements_up_to_200_accounts(
    auth: RealtimeAuth,
    acme: Workspace,
    django_assert_num_queries: DjangoAssertNumQueries,
    accounts: int,
) -> None:
    user_ids = make_accounts(accounts)
    _, about = board_of(acme, user_ids[-1])

    # ``Q(members=user)`` crosses a relation: the database decides, one statement for the
    # accounts, then one SELECT of the row's id and EXISTS(...), EXISTS(...), ... for all.
    with django_assert_num_queries(2) as captured:
        heard = list(auth.audience(acme.pk, "board.updated", None, user_ids, about))

    assert heard == [user_ids[-1]]
    assert exists_columns(captured, 0) == 0
    assert captured.captured_queries[1]["sql"].startswith("SELECT ")
    assert exists_columns(captured, 1) == accounts


def test_a_guard_the_database_decides_takes_one_more_statement_past_200_accounts(
    auth: RealtimeAuth,
    acme: Workspace,
    django_assert_num_queries: DjangoAssertNumQueries,
) -> None:
    user_ids = make_accounts(limits.MAX_IDS_PER_MESSAGE + 1)
    # The last account: only the second statement can name it.
    board, about = board_of(acme, user_ids[-1])

    with django_assert_num_queries(3) as captured:
        heard = list(auth.audience(acme.pk, "board.updated", None, user_ids, about))

    assert heard == [user_ids[-1]]
    assert [exists_columns(captured, index) for index in range(3)] == [0, 200, 1]

    board.members.add(*user_ids[:-1])
    with django_assert_num_queries(3):
        heard = list(auth.audience(acme.pk, "board.updated", None, user_ids, about))

    assert heard == user_ids


def test_audience_of_a_guarded_row_that_no_longer_exists_is_nobody(
    auth: RealtimeAuth, make_user: MakeUser, acme: Workspace
) -> None:
    alice = make_user("alice", member_of=acme)
    note = PrivateNote.objects.create(workspace=acme, author=alice, title="Gone", public=True)
    about = {"model": "private_note", "id": note.pk}
    note.delete()

    assert list(auth.audience(acme.pk, "private_note.deleted", None, [alice.pk], about)) == []


def test_recipients_are_the_accounts_asked_by_default(auth: RealtimeAuth) -> None:
    data = {"model": "notification", "id": 1}

    assert list(auth.recipients("notification.created", data, [3, 1, 2])) == [3, 1, 2]


def test_shared_readers_are_those_the_root_names(
    auth: RealtimeAuth,
    make_user: MakeUser,
    acme: Workspace,
    beta: Workspace,
    gamma: Workspace,
) -> None:
    make_user("alice", member_of=acme)
    bob = make_user("bob", member_of=beta)
    make_user("carol", member_of=gamma)
    project = Project.objects.create(workspace=acme, name="Launch")
    project.shared_with.add(beta)

    assert list(auth.shared_readers(project, acme.pk)) == [bob.pk]


class RootWithReadersAttribute:
    realtime_readers: Iterable[Any] = [1, 2]


@pytest.mark.parametrize("root_kind", ["model without the method", "non-callable attribute"])
def test_shared_readers_of_a_root_without_a_readers_method_are_nobody(
    auth: RealtimeAuth, acme: Workspace, root_kind: str
) -> None:
    root: Any = (
        Company.objects.create(workspace=acme, name="Initech")
        if root_kind == "model without the method"
        else RootWithReadersAttribute()
    )

    assert list(auth.shared_readers(root, acme.pk)) == []


def test_outside_recipients_are_nobody_by_default(auth: RealtimeAuth, acme: Workspace) -> None:
    data = {"model": "contact", "id": 1}

    assert list(auth.outside_recipients(acme.pk, "contact.created", data)) == []


# The service named by REALTIME_AUTH ---------------------------------------------------------


class ScopelessAuth(RealtimeAuth):
    """An application's auth: bearers reach no scope at all."""

    def reached_scopes(self, token: str, ids: Iterable[Any]) -> list[Any]:
        return []


def test_get_auth_builds_the_service_named_by_the_setting_once() -> None:
    assert type(get_auth()) is RealtimeAuth
    assert get_auth() is get_auth()


def test_get_auth_is_rebuilt_when_the_setting_changes() -> None:
    default = get_auth()

    with override_settings(REALTIME_AUTH="tests.test_auth.ScopelessAuth"):
        custom = get_auth()
        assert type(custom) is ScopelessAuth
        assert get_auth() is custom
        assert custom.reached_scopes("token", [1]) == []

    assert type(get_auth()) is RealtimeAuth
    assert get_auth() is not default
