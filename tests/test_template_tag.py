"""``{% realtime_script %}``: what it renders for a page, and what it says when it cannot.

A site served under a prefix (a proxy passing ``/app/`` on with the prefix stripped) is served
by real daphne and uvicorn servers behind such a proxy: the socket the page opens is under the
prefix, as its token view and its script are.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import urllib.request
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urljoin

import pytest
import websockets
from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured
from django.template import Context, Engine
from django.urls import include, path, set_script_prefix

from realtime.auth import issue_token
from tests.helpers import ROOT, WAIT, off_loop
from tests.live import Client, LiveServers, each_server, start_server  # noqa: F401

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
def test_a_socket_path_given_is_left_as_given_under_a_script_prefix() -> None:
    set_script_prefix("/app/")
    try:
        prefixed = config_of(render('{% realtime_script "contact" %}'))
        given = config_of(render('{% realtime_script "contact" path="/ws/realtime" %}'))
    finally:
        set_script_prefix("/")
    assert prefixed["path"] == "/app/api/ws"
    assert prefixed["token"] == "/app/realtime/token"
    assert given["path"] == "/ws/realtime"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("each_server")
async def test_the_pages_socket_is_under_the_script_prefix_of_a_site_served_under_one(
    live_servers: LiveServers,
) -> None:
    # The prefix as each server is told of it: uvicorn's --root-path; under daphne (whose
    # --root-path Channels' URLRouter does not route with), FORCE_SCRIPT_NAME.
    settings: dict[str, Any] = {"ROOT_URLCONF": "tests.tagged_page", "STATIC_URL": "static/"}
    if live_servers.kind == "uvicorn":
        args: tuple[str, ...] = ("--root-path", "/app")
    else:
        args, settings["FORCE_SCRIPT_NAME"] = (), "/app"
    server = await asyncio.to_thread(start_server, settings, live_servers.kind, args=args)
    try:
        user = await off_loop(get_user_model().objects.create_user, username="prefixed")
        token = await off_loop(issue_token, user)
        async with serving_under("/app", server.port) as port:
            page = f"http://127.0.0.1:{port}/app/page"
            config = config_of(await asyncio.to_thread(read, port, "/app/page"))
            assert config["token"] == "/app/realtime/token"
            assert config["module"] == "/app/static/realtime/realtime.js"
            # Where the page's script connects: new URL(config.path, location.href), ws:.
            socket_url = urljoin(page, config["path"]).replace("http:", "ws:", 1)
            client = Client(await websockets.connect(socket_url, open_timeout=WAIT))
            try:
                assert (await client.authenticate(token))["type"] == "auth_success"
            finally:
                await client.close()
    finally:
        await asyncio.to_thread(server.stop)


def read(port: int, target: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{target}", timeout=WAIT) as response:
        return str(response.read().decode())


@contextlib.asynccontextmanager
async def serving_under(prefix: str, upstream: int) -> AsyncIterator[int]:
    """A reverse proxy (its port) passing what is under ``prefix`` on to ``upstream`` with
    the prefix stripped, as ``location /app/ { proxy_pass http://workers/; }`` does, and
    answering anything else 404."""

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        method, target, rest = head.split(b" ", 2)
        if not target.startswith(prefix.encode() + b"/"):
            writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream)
        up_writer.write(b" ".join([method, target[len(prefix) :], rest]))
        await asyncio.gather(relay(reader, up_writer), relay(up_reader, writer))

    proxy = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield int(proxy.sockets[0].getsockname()[1])
    finally:
        proxy.close()


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
