"""``manage.py realtime_token``: a token for one account on standard output, and nothing else,
so that ``export REALTIME_TOKEN="$(python manage.py realtime_token alice)"`` holds a token."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError

from realtime.auth import get_auth
from tests.helpers import ROOT, subprocess_env


def token_of(*args: str) -> str:
    out = io.StringIO()
    call_command("realtime_token", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_the_token_printed_for_a_username_is_one_line_that_the_auth_reads_as_the_account() -> None:
    ann = get_user_model().objects.create_user("ann", password="secret")
    printed = token_of("ann")
    assert printed.endswith("\n")
    assert printed.count("\n") == 1
    assert get_auth().user_of_token(printed.strip()) == ann


@pytest.mark.django_db
def test_id_names_the_account_by_its_primary_key() -> None:
    ann = get_user_model().objects.create_user("ann", password="secret")
    assert get_auth().user_of_token(token_of(str(ann.pk), "--id").strip()) == ann


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["nobody"], "No account has username 'nobody' (give --id to name it by its primary key)"),
        (["999999", "--id"], "No account has pk '999999'"),
        (["not-a-number", "--id"], "No account has pk 'not-a-number'"),
    ],
)
def test_an_account_that_does_not_exist_is_a_command_error_naming_it(
    args: list[str], error: str
) -> None:
    get_user_model().objects.create_user("ann", password="secret")
    with pytest.raises(CommandError, match=re.escape(error)):
        token_of(*args)


@pytest.mark.django_db
def test_an_inactive_account_gets_no_token_its_refusal_says_why() -> None:
    get_user_model().objects.create_user("ann", password="secret", is_active=False)
    with pytest.raises(CommandError, match="Account 'ann' is inactive: its token would be refused"):
        token_of("ann")


@pytest.mark.django_db(transaction=True)
def test_from_the_command_line_standard_output_holds_the_token_alone() -> None:
    ann: Any = get_user_model().objects.create_user("ann", password="secret")
    result = subprocess.run(
        [sys.executable, "manage.py", "realtime_token", "ann"],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert get_auth().user_of_token(result.stdout.removesuffix("\n")) == ann
