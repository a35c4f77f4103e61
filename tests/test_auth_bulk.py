"""The bulk auth hooks: many sockets answered in a few statements, exactly as one by one.

Recheck rounds and handshakes that arrive together ask ``users_of_tokens`` and
``scopes_of_many``; a custom auth class that implements only the single forms is asked those,
socket by socket. Every answer is read from the real test database, and statements are counted.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import UserManager
from django.core import signing
from django.db import connection, models
from django.db.models.signals import post_init
from django.test import override_settings
from django.test.utils import CaptureQueriesContext, isolate_apps

from realtime import tokens as tokens_module
from realtime.auth import RealtimeAuth, Scope, ScopeQuestion, issue_token
from realtime.encoding import normal_id
from realtime.limits import MAX_IDS_PER_MESSAGE
from realtime.sockets import access, standing
from realtime.sockets.protocol import read_scopes
from realtime.tokens import TOKEN_SALT, forget_checked_tokens, token_fingerprint
from tests.testapp.models import Membership, Workspace

pytestmark = pytest.mark.django_db

User = get_user_model()


def workspaces(*slugs: str) -> list[Workspace]:
    return [Workspace.objects.create(name=slug, slug=slug) for slug in slugs]


def members(count: int, *of: Workspace, prefix: str = "m") -> list[Any]:
    """``count`` accounts, each a member of every workspace in ``of`` (in bulk)."""
    users = User.objects.bulk_create(
        [
            User(username=f"{prefix}{index:05d}", email=f"{prefix}{index}@x.test")
            for index in range(count)
        ]
    )
    users = list(User.objects.filter(username__startswith=prefix).order_by("username"))
    Membership.objects.bulk_create([Membership(workspace=w, user=u) for u in users for w in of])
    return users


def statements(captured: CaptureQueriesContext) -> list[str]:
    return [query["sql"] for query in captured.captured_queries]


def params_in(sql: str) -> int:
    """How many values an ``IN (...)`` list of a logged statement holds, at most."""
    widest = 0
    for part in sql.split(" IN (")[1:]:
        widest = max(widest, part.split(")")[0].count(",") + 1)
    return widest


# Accounts of many tokens -----------------------------------------------------------------------


def test_users_of_tokens_answers_each_token_as_user_of_token_does() -> None:
    auth = RealtimeAuth()
    ann, bob, cid, dan = members(4, prefix="who")
    tokens = [issue_token(user) for user in (ann, bob, cid, dan)]
    bob.is_active = False
    bob.save()
    cid.email = "changed@x.test"
    cid.save()
    dan.delete()
    asked = [tokens[0], "garbage", tokens[1], tokens[2], tokens[3], tokens[0], ""]
    bulk = auth.users_of_tokens(asked)
    single = [auth.user_of_token(token) for token in asked]
    assert [getattr(user, "pk", None) for user in bulk] == [
        getattr(user, "pk", None) for user in single
    ]
    assert [getattr(user, "pk", None) for user in bulk] == [
        ann.pk,
        None,
        None,
        None,
        None,
        ann.pk,
        None,
    ]


def test_users_of_tokens_reads_at_most_200_accounts_per_statement() -> None:
    users = members(450, prefix="many")
    tokens = [issue_token(user) for user in users]
    with CaptureQueriesContext(connection) as captured:
        found = RealtimeAuth().users_of_tokens(tokens)
    assert [getattr(user, "pk", None) for user in found] == [user.pk for user in users]
    assert len(captured) == math.ceil(450 / MAX_IDS_PER_MESSAGE)
    assert max(params_in(sql) for sql in statements(captured)) <= MAX_IDS_PER_MESSAGE


# A recheck's accounts, read as bare columns ---------------------------------------------------


def standing_ids(tokens: Sequence[str]) -> list[Any]:
    answers = standing.accounts_of_tokens(tokens)
    assert answers is not None, "the test user model is read as columns"
    return [None if account is None else account.pk for account in answers]


def hook_ids(tokens: Sequence[str]) -> list[Any]:
    return [getattr(user, "pk", None) for user in RealtimeAuth().users_of_tokens(tokens)]


def test_a_recheck_reads_each_token_s_account_as_users_of_tokens_does() -> None:
    ann, bob, cid, dan, eve, fay = members(6, prefix="col")
    tokens = [issue_token(user) for user in (ann, bob, cid, dan, eve, fay)]
    bob.is_active = False
    bob.save()
    cid.email = "changed@x.test"
    cid.save()
    dan.delete()
    eve.username = "eve-renamed"
    eve.save()
    fay.set_password("a new one")
    fay.save()
    asked = [tokens[0], "garbage", *tokens[1:], tokens[0], "", tokens[0][:-1] + "x"]
    assert standing_ids(asked) == hook_ids(asked)
    assert standing_ids(asked) == [ann.pk, None, None, None, None, None, fay.pk, ann.pk, None, None]


def test_a_recheck_reads_a_password_change_as_the_hook_does_when_it_revokes() -> None:
    ann, bob = members(2, prefix="pw")
    with override_settings(REALTIME_REVOKE_ON_PASSWORD_CHANGE=True):
        tokens = [issue_token(ann), issue_token(bob)]
        bob.set_password("a new one")
        bob.save()
        assert standing_ids(tokens) == hook_ids(tokens) == [ann.pk, None]


def test_a_recheck_keeps_a_token_issued_before_the_key_was_rotated_as_the_hook_does() -> None:
    (ann,) = members(1, prefix="rot")
    with override_settings(SECRET_KEY="the old key " * 4):
        old = issue_token(ann)
    forget_checked_tokens()
    rotated = {"SECRET_KEY": "the new key " * 4, "SECRET_KEY_FALLBACKS": ["the old key " * 4]}
    with override_settings(**rotated):
        assert standing_ids([old]) == hook_ids([old]) == [ann.pk]
    with override_settings(SECRET_KEY="the new key " * 4, SECRET_KEY_FALLBACKS=[]):
        assert standing_ids([old]) == hook_ids([old]) == [None]


def test_a_recheck_compares_the_fingerprint_under_each_fallback_key_as_the_hook_does() -> None:
    (ann,) = members(1, prefix="fp")
    # Well signed with the current key, but remembering ann under another key.
    stray = "a stray key " * 4
    token = signing.dumps({"u": ann.pk, "f": token_fingerprint(ann, stray)}, salt=TOKEN_SALT)
    assert standing_ids([token]) == hook_ids([token]) == [None]
    with override_settings(SECRET_KEY_FALLBACKS=[stray]):
        assert standing_ids([token]) == hook_ids([token]) == [ann.pk]


def test_a_recheck_round_of_the_default_auth_builds_no_account_instance() -> None:
    (acme,) = workspaces("acme")
    users = members(250, acme, prefix="lean")
    auth, asked = RealtimeAuth(), []

    def users_of_tokens(tokens: Sequence[str]) -> list[Any]:
        asked.append(len(tokens))
        return RealtimeAuth.users_of_tokens(auth, tokens)

    auth.users_of_tokens = users_of_tokens  # type: ignore[method-assign]
    answers = access.recheck(auth, recheck_questions(users, "acme", [acme.pk]))
    assert answers == [[Scope(acme.pk, "acme")]] * 250
    assert asked == []
    # A handshake keeps its account: it asks the hook, which builds the instances.
    access.authenticate_many(auth, [(issue_token(users[0]), read_scopes({"scope": "acme"}))])
    assert asked == [1]


def test_a_recheck_of_a_user_model_whose_instances_may_change_asks_for_instances() -> None:
    (acme,) = workspaces("acme")
    ann, bob = members(2, acme, prefix="own")
    bob.is_active = False
    bob.save()
    auth, asked = RealtimeAuth(), []

    def users_of_tokens(tokens: Sequence[str]) -> list[Any]:
        asked.append(len(tokens))
        return RealtimeAuth.users_of_tokens(auth, tokens)

    auth.users_of_tokens = users_of_tokens  # type: ignore[method-assign]

    def tidy(sender: Any, instance: Any, **kwargs: Any) -> None:
        """A receiver that could change what an instance holds."""

    post_init.connect(tidy, sender=User)
    try:
        answers = access.recheck(auth, recheck_questions([ann, bob], "acme", [acme.pk]))
    finally:
        post_init.disconnect(tidy, sender=User)
    assert answers == [[Scope(acme.pk, "acme")], None]
    assert asked == [2]


@isolate_apps("tests.testapp")
def test_user_models_whose_instances_may_hold_other_values_are_read_as_instances() -> None:
    class NamedByEmail(User):  # type: ignore[misc,valid-type]
        """The username is worked out by the model, not read from its column."""

        class Meta:
            proxy = True
            app_label = "testapp"

        def get_username(self) -> str:
            return str(self.email)

    class ActiveByRule(User):  # type: ignore[misc,valid-type]
        """``is_active`` is a rule of the model's, shadowing the column."""

        class Meta:
            proxy = True
            app_label = "testapp"

        @property
        def is_active(self) -> bool:
            return not self.username.startswith("x")

    class Banning(UserManager[Any]):
        def get_queryset(self) -> Any:
            return super().get_queryset().annotate(banned=models.Value(False))

    class Annotated(User):  # type: ignore[misc,valid-type]
        """Its default manager adds a value of its own to every instance."""

        objects = Banning()

        class Meta:
            proxy = True
            app_label = "testapp"

    assert standing.columns_of(User) == standing.Columns(
        "username", "email", "is_active", "password"
    )
    assert standing.columns_of(NamedByEmail) is None
    assert standing.columns_of(ActiveByRule) is None
    assert standing.columns_of(Annotated) is not None  # its columns are plain...
    assert standing._loads_its_own_way(Annotated)  # ...but its manager changes instances
    assert not standing._loads_its_own_way(User)


@isolate_apps("tests.testapp")
def test_a_user_model_that_builds_or_reads_its_instances_its_own_way_is_read_as_instances() -> None:
    class OwnLoader(User):  # type: ignore[misc,valid-type]
        """Builds its instances with a ``from_db`` of its own (Django's documented hook)."""

        class Meta:
            proxy = True
            app_label = "testapp"

        @classmethod
        def from_db(cls, db: Any, field_names: Any, values: Any) -> Any:
            return super().from_db(db, field_names, values)

    class Upper:
        """A descriptor reading a field's value in capitals."""

        def __init__(self, field: Any) -> None:
            self.field = field

        def __get__(self, instance: Any, owner: Any = None) -> Any:
            if instance is None:
                return self
            return str(instance.__dict__[self.field.attname]).upper()

        def __set__(self, instance: Any, value: Any) -> None:
            instance.__dict__[self.field.attname] = value

    class UpperField(models.CharField):  # type: ignore[type-arg]
        descriptor_class = Upper

    class Shouting(AbstractBaseUser):
        """Its username field reads its column through a descriptor of its own."""

        name = UpperField(max_length=50, unique=True)
        USERNAME_FIELD = "name"

        class Meta:
            app_label = "testapp"

    class Plain(AbstractBaseUser):
        name = models.CharField(max_length=50, unique=True)
        USERNAME_FIELD = "name"

        class Meta:
            app_label = "testapp"

    assert standing.columns_of(OwnLoader) is None
    assert standing.columns_of(Shouting) is None
    assert standing.columns_of(Plain) == standing.Columns("name", None, None, "password")


@isolate_apps("tests.testapp")
def test_a_user_model_without_email_or_active_columns_is_read_as_its_instances_answer() -> None:
    class Key(AbstractBaseUser):
        """An account with a name and a password only: no email, always active."""

        name = models.CharField(max_length=50, unique=True)
        USERNAME_FIELD = "name"

        class Meta:
            app_label = "testapp"

    columns = standing.columns_of(Key)
    assert columns == standing.Columns("name", None, None, "password")
    key = Key(pk=7, name="k-7", password="!")
    fingerprint = token_fingerprint(key)
    row = {"pk": 7, "name": "k-7", "password": "!"}
    assert standing._row_stands(row, columns, fingerprint)
    assert not standing._row_stands({**row, "name": "k-8"}, columns, fingerprint)


def test_the_instance_and_column_paths_ask_the_one_standing_rule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ann, bob = members(2, prefix="rule")
    tokens = [issue_token(ann), issue_token(bob)]
    assert standing_ids(tokens) == [ann.pk, bob.pk]
    asked: list[str] = []

    def all_but_bob(fingerprint: str, active: Any, username: Any, email: Any, pw: Any) -> bool:
        asked.append(username)
        return bool(username != bob.username)

    monkeypatch.setattr(tokens_module, "stands", all_but_bob)
    by_instances = RealtimeAuth().users_of_tokens(tokens)
    assert [getattr(user, "pk", None) for user in by_instances] == [ann.pk, None]
    assert standing_ids(tokens) == [ann.pk, None]
    assert RealtimeAuth().user_of_token(tokens[1]) is None
    assert asked == [ann.username, bob.username, ann.username, bob.username, bob.username]


def test_a_recheck_of_an_auth_that_replaces_a_hook_asks_the_hooks_for_instances() -> None:
    class Staff(RealtimeAuth):
        """Reads scopes for staff only: needs the account instance, not its id."""

        def scopes_of_many(self, questions: Sequence[ScopeQuestion]) -> list[list[Scope]]:
            found = super().scopes_of_many(questions)
            return [f if q.user.is_staff else [] for q, f in zip(questions, found, strict=True)]

    (acme,) = workspaces("acme")
    ann, bob = members(2, acme, prefix="stf")
    User.objects.filter(pk=ann.pk).update(is_staff=True)
    answers = access.recheck(Staff(), recheck_questions([ann, bob], "acme", [acme.pk]))
    assert answers == [[Scope(acme.pk, "acme")], []]


# Scopes of many accounts ------------------------------------------------------------------------


def test_scopes_of_many_answers_each_question_as_the_single_forms_do() -> None:
    auth = RealtimeAuth()
    acme, beta, gamma = workspaces("acme", "beta", "gamma")
    ann, bob = members(2, acme, beta, prefix="sc")
    Membership.objects.create(workspace=gamma, user=bob)
    questions = [
        ScopeQuestion(ann, ["beta", "acme", "gamma", "nowhere"], []),
        ScopeQuestion(bob, ["gamma"], [acme.pk]),
        ScopeQuestion(ann, [], [gamma.pk, beta.pk]),
        ScopeQuestion(bob, ["a\x00b", "acme"], [acme.pk]),
        ScopeQuestion(ann, [], []),
    ]

    def one_by_one(question: ScopeQuestion) -> list[Scope]:
        found = auth.scopes_of(question.user, list(question.slugs))
        known = {scope.id for scope in found}
        missing = [i for i in question.held_ids if i not in known]
        return found + (auth.held_scopes(question.user, missing) if missing else [])

    assert auth.scopes_of_many(questions) == [one_by_one(q) for q in questions]
    assert auth.scopes_of_many(questions) == [
        [Scope(beta.pk, "beta"), Scope(acme.pk, "acme")],
        [Scope(gamma.pk, "gamma"), Scope(acme.pk, "acme")],
        [Scope(beta.pk, "beta")],
        [Scope(acme.pk, "acme")],
        [],
    ]


def test_scopes_of_many_finds_no_scope_for_slugs_no_database_could_store() -> None:
    (acme,) = workspaces("acme")
    (ann,) = members(1, acme, prefix="bad")
    questions = [ScopeQuestion(ann, ["\ud800", "a\x00b", 7, "acme"], [])]
    assert RealtimeAuth().scopes_of_many(questions) == [[Scope(acme.pk, "acme")]]


def test_scopes_of_many_keeps_a_renamed_scope_by_its_id() -> None:
    (acme,) = workspaces("acme")
    (ann,) = members(1, acme, prefix="rn")
    Workspace.objects.filter(pk=acme.pk).update(slug="acme-2")
    answer = RealtimeAuth().scopes_of_many([ScopeQuestion(ann, ["acme"], [acme.pk])])
    assert answer == [[Scope(acme.pk, "acme-2")]]


# Rounds and handshakes ----------------------------------------------------------------------


def recheck_questions(users: Sequence[Any], slug: str, held: list[Any]) -> list[Any]:
    ask = read_scopes({"scope": slug})
    return [(normal_id(u.pk), issue_token(u), ask, list(held)) for u in users]


def test_a_recheck_round_over_1000_sockets_of_the_default_auth_costs_constant_queries() -> None:
    acme, beta = workspaces("acme", "beta")
    users = members(1000, acme, beta, prefix="round")
    questions = recheck_questions(users, "acme", [acme.pk, beta.pk])
    with CaptureQueriesContext(connection) as captured:
        answers = access.recheck(RealtimeAuth(), questions)
    assert answers == [[Scope(acme.pk, "acme"), Scope(beta.pk, "beta")]] * 1000
    # One statement per 200 accounts for the bearers, one per 200 accounts for the scopes.
    assert len(captured) == 2 * math.ceil(1000 / MAX_IDS_PER_MESSAGE) == 10
    assert max(params_in(sql) for sql in statements(captured)) <= MAX_IDS_PER_MESSAGE


def test_a_recheck_round_answers_lost_bearers_and_lost_scopes_socket_by_socket() -> None:
    acme, beta = workspaces("acme", "beta")
    ann, bob, cid = members(3, acme, beta, prefix="lost")
    questions = recheck_questions([ann, bob, cid], "acme", [acme.pk, beta.pk])
    questions[2] = (normal_id(ann.pk), *questions[2][1:])  # cid's token, ann's socket
    Membership.objects.filter(user=bob, workspace=acme).delete()
    ann.email = "new@x.test"
    ann.save()
    assert access.recheck(RealtimeAuth(), questions) == [None, [Scope(beta.pk, "beta")], None]


def test_handshakes_resolved_together_cost_the_statements_of_a_few() -> None:
    (acme,) = workspaces("acme")
    users = members(1000, acme, prefix="hs")
    asks = [(issue_token(u), read_scopes({"scope": "acme"})) for u in users]
    asks.append(("garbage", read_scopes({"scope": "acme"})))
    with CaptureQueriesContext(connection) as captured:
        answers = access.authenticate_many(RealtimeAuth(), asks)
    assert [(getattr(u, "pk", None), scopes) for u, scopes in answers] == [
        (u.pk, [Scope(acme.pk, "acme")]) for u in users
    ] + [(None, [])]
    assert len(captured) == 2 * math.ceil(1000 / MAX_IDS_PER_MESSAGE)


def test_a_bulk_hook_that_raises_leaves_every_socket_of_the_round_as_it_is(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken(RealtimeAuth):
        def users_of_tokens(self, tokens: Sequence[str]) -> list[Any]:
            raise RuntimeError("the directory is down")

    (acme,) = workspaces("acme")
    users = members(3, acme, prefix="br")
    with caplog.at_level(logging.ERROR, logger="realtime"):
        answers = access.recheck(Broken(), recheck_questions(users, "acme", [acme.pk]))
    assert answers == [access.FAILED] * 3
    assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 1


# Custom auth classes ------------------------------------------------------------------------


class KeyAuth(RealtimeAuth):
    """API keys ``key-<username>``, reading only the scopes named ``team-*``: the single
    forms only, as an application written before the bulk forms existed."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def user_of_token(self, token: str) -> Any | None:
        self.calls.append("user_of_token")
        if not token.startswith("key-"):
            return None
        return User.objects.filter(username=token[4:]).first()

    def scopes_of(self, user: Any, slugs: Sequence[Any]) -> list[Scope]:
        self.calls.append("scopes_of")
        return [s for s in super().scopes_of(user, slugs) if s.slug.startswith("team-")]

    def held_scopes(self, user: Any, ids: Any) -> list[Scope]:
        self.calls.append("held_scopes")
        return [s for s in super().held_scopes(user, ids) if s.slug.startswith("team-")]


def test_a_custom_auth_with_only_the_single_forms_is_asked_them_for_every_socket() -> None:
    team, acme = workspaces("team-a", "acme")
    ann, bob = members(2, team, acme, prefix="key")
    auth = KeyAuth()
    ask = read_scopes({"scopes": ["team-a", "acme"]})
    questions = [
        (normal_id(ann.pk), f"key-{ann.username}", ask, [team.pk, acme.pk]),
        (normal_id(bob.pk), "issued-elsewhere", ask, [team.pk]),
    ]
    assert access.recheck(auth, questions) == [[Scope(team.pk, "team-a")], None]
    assert auth.calls == ["user_of_token", "scopes_of", "held_scopes", "user_of_token"]
    auth.calls.clear()
    answers = access.authenticate_many(auth, [(f"key-{bob.username}", ask), ("nope", ask)])
    assert [(getattr(u, "pk", None), s) for u, s in answers] == [
        (bob.pk, [Scope(team.pk, "team-a")]),
        (None, []),
    ]
    assert auth.calls == ["user_of_token", "scopes_of", "user_of_token"]


def test_a_custom_auth_overriding_a_single_form_gets_it_asked_by_the_default_bulk_forms() -> None:
    team, acme = workspaces("team-a", "acme")
    (ann,) = members(1, team, acme, prefix="dflt")
    auth = KeyAuth()
    assert [getattr(u, "pk", None) for u in auth.users_of_tokens([f"key-{ann.username}"])] == [
        ann.pk
    ]
    found = auth.scopes_of_many([ScopeQuestion(ann, ["team-a", "acme"], [acme.pk])])
    assert found == [[Scope(team.pk, "team-a")]]
    assert auth.calls == ["user_of_token", "scopes_of", "held_scopes"]


def test_a_custom_auth_with_bulk_forms_is_asked_once_per_round() -> None:
    class Counting(RealtimeAuth):
        def __init__(self) -> None:
            self.asked: list[tuple[str, int]] = []

        def users_of_tokens(self, tokens: Sequence[str]) -> list[Any | None]:
            self.asked.append(("users", len(tokens)))
            return super().users_of_tokens(tokens)

        def scopes_of_many(self, questions: Sequence[ScopeQuestion]) -> list[list[Scope]]:
            self.asked.append(("scopes", len(questions)))
            return super().scopes_of_many(questions)

        def __getattribute__(self, name: str) -> Any:
            assert name not in {"user_of_token", "scope_of", "scopes_of", "held_scopes"}
            return super().__getattribute__(name)

    (acme,) = workspaces("acme")
    users = members(30, acme, prefix="cnt")
    auth = Counting()
    answers = access.recheck(auth, recheck_questions(users, "acme", [acme.pk]))
    assert answers == [[Scope(acme.pk, "acme")]] * 30
    assert auth.asked == [("users", 30), ("scopes", 30)]
