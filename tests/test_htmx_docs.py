"""The partial's view of ``docs/htmx.md`` runs as printed.

The page's only ``python`` block is written as the ``views`` module of a throwaway package
whose ``models`` are the test app's (the block imports its app's ``Contact`` and
``Workspace``), imported, and asked as a signed-in member, by htmx without a session, and as
a plain request without one.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.test import RequestFactory, override_settings

from tests.helpers import ROOT
from tests.testapp.models import Contact, Membership, Workspace

HTMX = ROOT / "docs" / "htmx.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)
ROWS = "{% for contact in contacts %}<tr><td>{{ contact.name }}</td></tr>{% endfor %}"

pytestmark = pytest.mark.django_db


@pytest.fixture
def views(tmp_path: Path) -> Iterator[ModuleType]:
    (block,) = [code for language, code in FENCE.findall(HTMX.read_text()) if language == "python"]
    package = tmp_path / "htmx_docs_app"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text("from tests.testapp.models import Contact, Workspace\n")
    (package / "views.py").write_text(block)
    sys.path.insert(0, str(tmp_path))
    try:
        yield importlib.import_module("htmx_docs_app.views")
    finally:
        sys.path.remove(str(tmp_path))
        for name in [name for name in sys.modules if name.startswith("htmx_docs_app")]:
            del sys.modules[name]


def rows_template() -> override_settings:
    return override_settings(
        TEMPLATES=[
            {
                "BACKEND": "django.template.backends.django.DjangoTemplates",
                "OPTIONS": {
                    "loaders": [
                        ("django.template.loaders.locmem.Loader", {"contact_rows.html": ROWS})
                    ]
                },
            }
        ]
    )


def test_the_partial_renders_the_rows_of_a_members_workspace(views: ModuleType) -> None:
    workspace = Workspace.objects.create(name="Acme", slug="acme")
    user = get_user_model().objects.create_user(username="ann")
    Membership.objects.create(workspace=workspace, user=user)
    Contact.objects.create(workspace=workspace, name="Bea")
    request = RequestFactory().get("/rows", headers={"HX-Request": "true"})
    request.user = user

    with rows_template():
        response = views.contact_rows(request, "acme")

    assert response.status_code == 200
    assert response.content.decode() == "<tr><td>Bea</td></tr>"


def test_an_htmx_request_without_a_session_is_told_to_reload_the_page(views: ModuleType) -> None:
    request = RequestFactory().get("/rows", headers={"HX-Request": "true"})
    request.user = AnonymousUser()

    response = views.contact_rows(request, "acme")

    assert (response.status_code, response["HX-Refresh"]) == (200, "true")


def test_a_plain_request_without_a_session_is_sent_to_sign_in(views: ModuleType) -> None:
    request = RequestFactory().get("/rows")
    request.user = AnonymousUser()

    response = views.contact_rows(request, "acme")

    assert response.status_code == 302
