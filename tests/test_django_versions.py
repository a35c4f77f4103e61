"""What newer Django versions ask of realtime's hooks into models (run by the tox cells)."""

from __future__ import annotations

import django
import pytest

from tests.testapp.models import Company

pytestmark = pytest.mark.django_db


@pytest.mark.skipif(django.VERSION < (6, 1), reason="fetch modes came with Django 6.1")
def test_a_tracked_model_keeps_the_fetch_mode_it_was_loaded_with() -> None:
    from django.db.models import FETCH_PEERS  # type: ignore[attr-defined,unused-ignore]

    Company.objects.create(name="Initech")
    loaded = Company.objects.fetch_mode(FETCH_PEERS).get(name="Initech")  # type: ignore[attr-defined,unused-ignore]
    assert loaded._state.fetch_mode is FETCH_PEERS  # type: ignore[attr-defined,unused-ignore]
