"""``{% realtime_script %}``: what it renders for a page, and what it says when it cannot."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.template import Context, Engine
from django.urls import include, path

from tests.helpers import ROOT

urlpatterns = [path("realtime/", include("realtime.urls"))]
ENGINE = Engine(libraries={"realtime": "realtime.templatetags.realtime"})


def render(source: str, **context: Any) -> str:
    return ENGINE.from_string("{% load realtime %}" + source).render(Context(context))


def config_of(html: str, element_id: str = "realtime-config") -> dict[str, Any]:
    found = re.search(rf'<script id="{element_id}" type="application/json">(.*?)</script>', html)
    assert found, html
    loaded: dict[str, Any] = json.loads(found[1])
    return loaded


@pytest.fixture(autouse=True)
def _static(settings: Any) -> None:
    settings.STATIC_URL = "/static/"


@pytest.mark.urls(__name__)
def test_the_page_is_given_the_client_the_token_view_the_scope_and_the_channels() -> None:
    html = render('{% realtime_script "contact" "company" scope=slug %}', slug="acme")
    assert config_of(html) == {
        "module": "/static/realtime/realtime.js",
        "token": "/realtime/token",
        "path": "/api/ws",
        "scope": "acme",
        "scopes": None,
        "channels": ["contact", "company"],
    }
    module = re.search(r'<script type="module">(.*?)</script>', html, re.DOTALL)
    assert module, html
    assert 'const id = "realtime-config";' in module[1]
    assert "getToken" in module[1]


@pytest.mark.urls(__name__)
def test_several_scopes_a_socket_path_and_an_element_id_of_the_pages_own() -> None:
    html = render(
        '{% realtime_script "ticket" scopes=slugs path="/ws/realtime" element_id="tickets" %}',
        slugs=["acme", "globex"],
    )
    config = config_of(html, "tickets")
    assert config["scopes"] == ["acme", "globex"]
    assert config["path"] == "/ws/realtime"
    assert 'const id = "tickets";' in html


@pytest.mark.urls(__name__)
def test_values_cannot_end_the_script_elements() -> None:
    hostile = "</script><script>alert(1)</script>"
    html = render(
        "{% realtime_script channel scope=slug element_id=eid %}",
        channel=hostile,
        slug=hostile,
        eid='x"</script>',
    )
    assert "<script>alert(1)" not in html
    assert html.count("</script>") == 2


class CspRequest:
    """A request as django-csp's middleware leaves it."""

    csp_nonce = "n0nce"


@pytest.mark.urls(__name__)
@pytest.mark.parametrize(
    "context",
    [{"csp_nonce": "n0nce"}, {"CSP_NONCE": "n0nce"}, {"request": CspRequest()}],
    ids=["django", "django-csp context processor", "django-csp middleware"],
)
def test_the_request_s_csp_nonce_is_put_on_the_module_script(context: dict[str, Any]) -> None:
    html = render('{% realtime_script "contact" %}', **context)
    assert '<script type="module" nonce="n0nce">' in html


@pytest.mark.urls("tests.urls")
def test_without_realtime_s_urls_the_error_says_what_to_include() -> None:
    with pytest.raises(ImproperlyConfigured, match=r'include\("realtime.urls"\)'):
        render('{% realtime_script "contact" %}')


@pytest.mark.urls(__name__)
def test_the_module_script_is_the_same_text_on_every_page() -> None:
    """A CSP allows it by its hash, and a page swapped in by htmx reuses the running client."""

    def module_of(html: str) -> str:
        found = re.search(r'<script type="module">(.*?)</script>', html, re.DOTALL)
        assert found, html
        return found[1]

    acme = render('{% realtime_script "contact" scope="acme" %}')
    globex = render('{% realtime_script "contact" "company" scopes=slugs %}', slugs=["globex"])
    assert module_of(acme) == module_of(globex)
    assert "realtime.pageClients" in module_of(acme)


def test_the_htmx_page_warns_against_throttle_which_drops_writes() -> None:
    """htmx's ``throttle:`` drops the events within its window with no fetch after it: a write
    made then is never shown, so docs/htmx.md names it only to say not to use it."""
    paragraphs = (ROOT / "docs" / "htmx.md").read_text().split("\n\n")
    naming = [paragraph for paragraph in paragraphs if "throttle" in paragraph]
    assert naming
    for paragraph in naming:
        assert "Do not add `throttle:" in paragraph, paragraph
        assert "queue last" in paragraph, paragraph
