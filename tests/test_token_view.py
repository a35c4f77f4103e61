"""``realtime.views.token`` through ``realtime.urls``, as a project includes it, behind
Django's session and authentication middleware (signed-cookie sessions: no table needed)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import include, path, reverse

from realtime.auth import get_auth

urlpatterns = [path("realtime/", include("realtime.urls"))]

pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__)]


@pytest.fixture(autouse=True)
def _sessions(settings: Any) -> None:
    settings.SESSION_ENGINE = "django.contrib.sessions.backends.signed_cookies"
    settings.MIDDLEWARE = [
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
    ]


@pytest.fixture
def ann() -> Any:
    return get_user_model().objects.create_user("ann", password="secret")


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_include_serves_the_token_view_at_realtime_token() -> None:
    assert reverse("realtime:token") == "/realtime/token"


def test_a_signed_in_account_gets_a_token_that_stands_for_it(ann: Any) -> None:
    response = signed_in(ann).get("/realtime/token")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert set(body) == {"token"}
    assert get_auth().user_of_token(body["token"]) == ann


def test_an_anonymous_request_gets_a_json_403_and_no_token() -> None:
    response = Client().get("/realtime/token")
    assert response.status_code == 403
    assert response.json() == {"detail": "Authentication required."}


def test_an_account_made_inactive_gets_no_token(ann: Any, settings: Any) -> None:
    # A backend that lets inactive accounts sign in must still not get them a token.
    settings.AUTHENTICATION_BACKENDS = ["django.contrib.auth.backends.AllowAllUsersModelBackend"]
    client = signed_in(ann)
    ann.is_active = False
    ann.save()
    assert client.get("/realtime/token").status_code == 403


def test_the_token_answer_is_never_cached(ann: Any) -> None:
    response = signed_in(ann).get("/realtime/token")
    assert "no-store" in response["Cache-Control"]


def test_a_post_is_refused_with_405(ann: Any) -> None:
    assert signed_in(ann).post("/realtime/token").status_code == 405
