"""``SocketOriginValidator``: which socket handshakes to admit by their ``Origin`` header.

A browser names the page that opens a socket in ``Origin``, and sends the site's cookies with
the handshake whatever that page is; refusing foreign origins stops another site's page from
riding them. realtime authenticates with a bearer sent in the first frame, which a foreign
page cannot read, so the check is defence in depth, and a handshake without ``Origin`` (a
phone app, a server-side client: they send none) is admitted.

An ``Origin`` is admitted when its host matches ``ALLOWED_HOSTS`` (Django's rules: a leading
dot matches subdomains, ``*`` matches anything, any scheme and port; with ``DEBUG`` and no
hosts, the local ones) or when it equals an entry of ``REALTIME_ALLOWED_ORIGINS`` (scheme, host
and port; ``https://app.example.com`` for a front end served from another host). Anything else
is refused as Channels' ``OriginValidator`` refuses: closed before it is accepted, which the
server answers with HTTP 403, and one WARNING (within the budget of lines clients can cause)
names the origin and the setting that would admit it. Both settings are read at each
handshake.

Outermost, the validator is handed the server's own ``send``: it records it in the scope it
passes on (``realtime.sockets.link.SERVER_SEND``), so that realtime reaches the server's
connection (to notice a socket that stops reading, and to close with the protocol's codes)
whatever middleware inside it wraps ``send``.
"""

from __future__ import annotations

from typing import Any, NamedTuple
from urllib.parse import SplitResult, urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.utils.http import is_same_domain

from realtime.conf import conf
from realtime.sockets.limits import log_warning
from realtime.sockets.link import record_server_send

#: Ports a scheme implies when an origin names none.
DEFAULT_PORTS = {"http": 80, "ws": 80, "https": 443, "wss": 443}
#: Hosts Django admits with ``DEBUG`` on and ``ALLOWED_HOSTS`` empty.
DEBUG_HOSTS = [".localhost", "127.0.0.1", "[::1]"]
#: Characters of a refused origin written to the log.
LOGGED_LENGTH = 100


class Origin(NamedTuple):
    """A web origin: scheme and host in lower case, and the port (a scheme's default if none)."""

    scheme: str
    host: str
    port: int | None


def parse_origin(value: object) -> Origin:
    """Read ``scheme://host[:port]``; raise ``ValueError`` for anything else (a path included)."""
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a string")
    try:
        parts: SplitResult = urlsplit(value.strip())
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"{value!r} is not an origin: {exc}") from exc
    if not parts.scheme or not parts.hostname:
        raise ValueError(f"{value!r} lacks a scheme or a host")
    if parts.path or parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(f"{value!r} holds more than scheme://host[:port]")
    scheme = parts.scheme.lower()
    return Origin(scheme, parts.hostname.lower(), port or DEFAULT_PORTS.get(scheme))


def origin_admitted(header: str | None, allowed_hosts: list[str], allowed: list[Any]) -> bool:
    """Whether a handshake whose ``Origin`` is ``header`` (``None``: no header) is admitted.

    ``allowed_hosts`` are ``ALLOWED_HOSTS`` patterns, ``allowed`` the entries of
    ``REALTIME_ALLOWED_ORIGINS`` (entries that cannot be read are skipped: a system check
    reports them).
    """
    if header is None:
        return True
    try:
        origin = parse_origin(header)
    except ValueError:
        return False  # "null" (sandboxed pages, files) and anything unreadable
    if any(_host_matches(origin.host, pattern) for pattern in allowed_hosts):
        return True
    return any(_same_origin(origin, entry) for entry in allowed)


def _host_matches(host: str, pattern: str) -> bool:
    if pattern == "*":
        return True
    # An ALLOWED_HOSTS entry may carry IPv6 brackets or a port; compare bare host names.
    pattern_host = urlsplit("//" + pattern).hostname or pattern
    return is_same_domain(host, pattern_host)


def _same_origin(origin: Origin, entry: object) -> bool:
    try:
        return parse_origin(entry) == origin
    except ValueError:
        return False


def _allowed_hosts() -> list[str]:
    hosts = list(settings.ALLOWED_HOSTS)
    return DEBUG_HOSTS if settings.DEBUG and not hosts else hosts


def _origin_header(scope: dict[str, Any]) -> str | None:
    found = None
    for name, value in scope.get("headers", []):
        if name.lower() == b"origin":
            found = value.decode("latin1")
    return found


class SocketOriginValidator:
    """Wrap a WebSocket ASGI application: admit or refuse each handshake by its ``Origin``.

    Use it where Channels' ``AllowedHostsOriginValidator`` would go, around the socket routes
    only (it refuses to serve anything but WebSockets, as Channels' does), outermost: the
    ``send`` it is given is recorded for realtime's consumer (see the module docstring).
    """

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] != "websocket":
            raise ValueError("SocketOriginValidator serves WebSocket connections only")
        header = _origin_header(scope)
        if origin_admitted(header, _allowed_hosts(), list(conf.ALLOWED_ORIGINS)):
            return await self.application(record_server_send(scope, send), receive, send)
        log_warning("realtime: refused a socket handshake (HTTP 403): %s", _refusal_cure(header))
        return await WebsocketDenier()(scope, receive, send)


def _refusal_cure(header: str | None) -> str:
    """The refused origin, and the setting that would admit it (for the log)."""
    shown = repr((header or "")[:LOGGED_LENGTH])
    try:
        origin = parse_origin(header)
    except ValueError:
        return (
            f"its origin {shown} is not scheme://host[:port] (a sandboxed page or a file sends "
            "'null'); no setting admits it"
        )
    port = "" if origin.port == DEFAULT_PORTS.get(origin.scheme) else f":{origin.port}"
    return (
        f"origin {shown} is not admitted: add {origin.host!r} to ALLOWED_HOSTS, or "
        f"'{origin.scheme}://{origin.host}{port}' to REALTIME_ALLOWED_ORIGINS"
    )
