"""Why a token is refused, told apart for the server's log (``token_refusal_cause``); the
client is told the protocol's one reason whatever the cause."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core import signing

from realtime.auth import RealtimeAuth, issue_token, reset_auth, token_refusal_cause
from realtime.tokens import TOKEN_SALT, token_fingerprint

pytestmark = pytest.mark.django_db


@pytest.fixture
def ann() -> Any:
    return get_user_model().objects.create_user("ann", password="secret")


def signed(user: Any, age: float = 0, **options: Any) -> str:
    claims = {"u": user.pk, "f": token_fingerprint(user), "t": int(time.time() - age)}
    return signing.dumps(claims, salt=TOKEN_SALT, **options)


def test_a_token_that_is_no_signed_value_is_malformed() -> None:
    assert token_refusal_cause("garbage") == "malformed: not a token issue_token made"


def test_a_token_signed_under_another_key_names_the_secret_key_and_its_fallbacks(ann: Any) -> None:
    cause = token_refusal_cause(signed(ann, key="another project's key"))
    assert cause.startswith("its signature is not this project's: signed under another SECRET_KEY")
    assert "SECRET_KEY_FALLBACKS" in cause


def test_an_altered_token_is_told_by_its_signature(ann: Any) -> None:
    payload, stamp, signature = issue_token(ann).split(":")
    altered = f"{payload}:{stamp}:{signature[::-1]}"
    assert token_refusal_cause(altered).startswith("its signature is not this project's")


def test_a_compressed_signed_value_is_told_by_its_signature_too(ann: Any) -> None:
    claims = {"u": ann.pk, "f": "x" * 400, "t": int(time.time())}
    token = signing.dumps(claims, salt=TOKEN_SALT, key="another", compress=True)
    assert token.startswith(".")
    assert token_refusal_cause(token).startswith("its signature is not this project's")


def test_an_expired_token_says_its_age_and_the_setting(ann: Any, settings: Any) -> None:
    settings.REALTIME_TOKEN_MAX_AGE = 3600
    cause = token_refusal_cause(signed(ann, age=7200))
    assert re.fullmatch(
        r"expired: issued 720\d s ago, older than REALTIME_TOKEN_MAX_AGE \(3600 s\)", cause
    ), cause


def test_the_token_of_a_deleted_account_says_so(ann: Any) -> None:
    token = issue_token(ann)
    pk = ann.pk
    ann.delete()
    assert token_refusal_cause(token) == f"account {pk!r} no longer exists"


def test_the_token_of_an_inactive_account_says_so(ann: Any) -> None:
    token = issue_token(ann)
    ann.is_active = False
    ann.save()
    assert token_refusal_cause(token) == f"account {ann.pk!r} is inactive"


def test_the_token_of_a_renamed_account_says_a_new_token_stands(ann: Any) -> None:
    token = issue_token(ann)
    ann.username = "anne"
    ann.save()
    assert token_refusal_cause(token) == (
        f"account {ann.pk!r} changed its username or email since the token was issued: "
        "a new token stands"
    )


def test_an_applications_own_token_reader_is_named_as_the_one_that_refused(
    settings: Any,
) -> None:
    settings.REALTIME_AUTH = f"{__name__}.OwnTokens"
    reset_auth()
    try:
        assert token_refusal_cause("anything") == "OwnTokens.user_of_token named no account"
    finally:
        reset_auth()


class OwnTokens(RealtimeAuth):
    def user_of_token(self, token: str) -> Any | None:
        return None
