"""``{% realtime_script %}``: connect a server-rendered page to realtime in one tag.

``{% load realtime %}{% realtime_script "contact" "company" scope=workspace.slug %}`` renders
what a page needs to hear the writes its account may read: the JavaScript client
(``realtime.js``, from the static files), a token fetched from realtime's token view with the
page's own session (at every connection attempt, so a token never outlives the page's need),
the scope and the channels. The client dispatches each frame on ``document`` as
``realtime:<type>``: htmx's ``hx-trigger="realtime:contact.updated from:document"`` re-fetches
a partial with the user's session, which is permission-exact by construction (docs/htmx.md).

The page's values go in a JSON ``<script>`` element (``json_script``), and the module script
that reads them is the same text on every page that uses the same ``element_id``: a Content
Security Policy can allow it by its hash, or by the request's nonce (``_csp_nonce``).
"""

from __future__ import annotations

import json
from typing import Any

from django import template
from django.core.exceptions import ImproperlyConfigured
from django.templatetags.static import static
from django.urls import NoReverseMatch, get_script_prefix, reverse
from django.utils.html import format_html, json_script
from django.utils.safestring import SafeString, mark_safe

register = template.Library()

#: Where ``realtime.routing.websocket_urlpatterns`` serves the socket, under the site's script
#: prefix (``SOCKET_ROUTE``: the path a page opens on a site served at the root).
SOCKET_ROUTE = "api/ws"

#: The module script: its text never changes (its values come from the JSON element before it).
#: One client per page and element id, kept on ``globalThis``: htmx runs the script again on each
#: boosted visit and history restore, where a client of its own each time would add a socket
#: (never closed) and dispatch each frame once more. The same values reuse the running client;
#: other values close it and start anew; and it is closed when its element leaves the page (a
#: boosted visit to a page without the tag), with or without htmx.
CONNECT = """
const id = %s;
const clients = (globalThis[Symbol.for("realtime.pageClients")] ??= new Map());
const text = document.getElementById(id).textContent;
const running = clients.get(id);
if (running?.text === text) {
  running.started.then((client) => client.connect());
} else {
  running?.stop();
  const config = JSON.parse(text);
  const started = import(config.module).then(({ RealtimeClient }) => {
    const url = new URL(config.path, location.href);
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    const client = new RealtimeClient({
      url: url.href,
      getToken: async () => {
        const answer = await fetch(config.token, { credentials: "same-origin" });
        if (!answer.ok) throw new Error(`realtime: ${config.token} answered ${answer.status}`);
        return (await answer.json()).token;
      },
      ...(config.scopes ? { scopes: config.scopes } : { scope: config.scope }),
    });
    client.subscribe(config.channels);
    return client;
  });
  const left = new MutationObserver(() => {
    if (document.getElementById(id)?.textContent !== text) entry.stop();
  });
  const entry = {
    text,
    started,
    stop() {
      left.disconnect();
      if (clients.get(id) === entry) clients.delete(id);
      started.then((client) => client.close());
    },
  };
  clients.set(id, entry);
  left.observe(document, { childList: true, subtree: true });
  started.then((client) => clients.get(id) === entry && client.connect());
}
"""


@register.simple_tag(takes_context=True)
def realtime_script(
    context: template.Context,
    *channels: str,
    scope: str | None = None,
    scopes: Any = None,
    path: str | None = None,
    element_id: str = "realtime-config",
) -> SafeString:
    """The page's client, connected to ``scope`` (one slug) or ``scopes`` (several), hearing
    ``channels``; ``path`` is where the socket is routed (by default ``api/ws`` under the
    site's script prefix), ``element_id`` the id of the JSON element (two tags on one page
    need two)."""
    config = {
        "module": static("realtime/realtime.js"),
        "token": _token_url(),
        "path": _socket_path() if path is None else path,
        "scope": scope,
        "scopes": None if scopes is None else [str(slug) for slug in scopes],
        "channels": [str(channel) for channel in channels],
    }
    # The script's one value, the element's id, is a JavaScript literal that cannot end it.
    script = mark_safe(CONNECT % _js_string(element_id))  # noqa: S308
    nonce = _csp_nonce(context)
    if nonce:
        tag = format_html('<script type="module" nonce="{}">{}</script>', nonce, script)
    else:
        tag = format_html('<script type="module">{}</script>', script)
    return format_html("{}\n{}", json_script(config, element_id), tag)


def _csp_nonce(context: Any) -> Any:
    """The request's Content Security Policy nonce, as the project's CSP puts it in the
    context: ``csp_nonce`` (Django's own, from 6.0), ``CSP_NONCE`` (django-csp's context
    processor), or on the request (django-csp's middleware, with no context processor)."""
    for name in ("csp_nonce", "CSP_NONCE"):
        nonce = context.get(name)
        if nonce:
            return nonce
    return getattr(context.get("request"), "csp_nonce", None)


def _socket_path() -> str:
    """``api/ws`` under the site's script prefix, as ``reverse()`` builds the token view's URL:
    a site a proxy serves under ``/app/`` (uvicorn's ``--root-path``, ``FORCE_SCRIPT_NAME``)
    routes only what is under it, and ``/api/ws`` beside it would be answered 404."""
    return get_script_prefix() + SOCKET_ROUTE


def _token_url() -> str:
    try:
        return reverse("realtime:token")
    except NoReverseMatch:
        raise ImproperlyConfigured(
            "{% realtime_script %} fetches tokens from realtime's token view: add "
            'path("realtime/", include("realtime.urls")) to your URLconf.'
        ) from None


def _js_string(value: str) -> str:
    """``value`` as a JavaScript string literal safe inside a ``<script>`` element."""
    return json.dumps(value).replace("<", "\\u003c").replace(">", "\\u003e")
