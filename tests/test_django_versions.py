"""What newer Django versions ask of realtime's hooks into models (run by the tox cells)."""

from __future__ import annotations

from typing import Any

import django
import pytest

from realtime.auth import get_auth, issue_token
from tests.testapp.models import Company

pytestmark = pytest.mark.django_db


@pytest.mark.skipif(django.VERSION < (6, 1), reason="fetch modes came with Django 6.1")
def test_a_tracked_model_keeps_the_fetch_mode_it_was_loaded_with() -> None:
    from django.db.models import FETCH_PEERS  # type: ignore[attr-defined,unused-ignore]

    Company.objects.create(name="Initech")
    loaded = Company.objects.fetch_mode(FETCH_PEERS).get(name="Initech")  # type: ignore[attr-defined,unused-ignore]
    assert loaded._state.fetch_mode is FETCH_PEERS  # type: ignore[attr-defined,unused-ignore]


def test_issuing_and_reading_a_token_warns_of_nothing_deprecated(django_user_model: Any) -> None:
    # Warnings are errors in this suite: Django 6.1 warns about an implicit salted_hmac algorithm.
    user = django_user_model.objects.create_user("ann")
    assert get_auth().user_of_token(issue_token(user)) == user
