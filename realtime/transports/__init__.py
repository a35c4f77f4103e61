"""The transport of this process, built from ``REALTIME_TRANSPORT`` on first use.

``"table"``, ``"pg_notify"`` and ``"redis"`` name the built-in transports; anything else is
the dotted path of a ``Transport`` subclass. The instance is dropped when a setting the
transports read changes (``TRANSPORT_SETTINGS``; ``realtime.apps`` wires that), so tests can
switch transports with ``override_settings``. Other ``REALTIME_*`` settings leave it, and the
sockets hearing it, as they are.
"""

from __future__ import annotations

import threading

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from realtime.conf import conf
from realtime.transports.base import Transport

BUILTIN = {
    "table": "realtime.transports.table.TableTransport",
    "pg_notify": "realtime.transports.pg_notify.PgNotifyTransport",
    "redis": "realtime.transports.redis.RedisTransport",
}

#: The settings the transports read (without ``REALTIME_``): a change drops the transport.
TRANSPORT_SETTINGS = frozenset(
    {
        "AUTO_TRIM",
        "COMMIT_GRACE",
        "HEARTBEAT_INTERVAL",
        "HEARTBEAT_TIMEOUT",
        "LISTEN_DATABASE",
        "MAX_PAYLOAD",
        "MESSAGE_RETENTION",
        "NOTIFY_QUEUE_SIZE",
        "PG_NOTIFY_LOG",
        "POLLING_INTERVAL",
        "RECONNECT_BACKOFF_MAX",
        "RECONNECT_BACKOFF_START",
        "REDIS_URL",
        "RESUME_MAX_FRAMES",
        "RESUME_WINDOW",
        "SUPERVISE_INTERVAL",
        "TCP_KEEPCNT",
        "TCP_KEEPIDLE",
        "TCP_KEEPINTVL",
        "TRANSPORT",
        "TRIM_BATCH_SIZE",
    }
)

_lock = threading.Lock()
_transport: Transport | None = None


def transport_class(name: str) -> type[Transport]:
    """Resolve a ``REALTIME_TRANSPORT`` value to its class."""
    try:
        cls = import_string(BUILTIN.get(name, name))
    except ImportError as exc:
        raise ImproperlyConfigured(f"REALTIME_TRANSPORT {name!r} cannot be imported") from exc
    if not (isinstance(cls, type) and issubclass(cls, Transport)):
        raise ImproperlyConfigured(f"REALTIME_TRANSPORT {name!r} is not a Transport subclass")
    return cls


def get_transport() -> Transport:
    """Return this process's transport, building it on first use."""
    global _transport
    with _lock:
        if _transport is None:
            _transport = transport_class(conf.TRANSPORT)()
        return _transport


def current_transport() -> Transport | None:
    """This process's transport if it is built (never builds one)."""
    return _transport


def reset_transport() -> None:
    """Forget the transport so the next ``get_transport`` builds it from current settings."""
    global _transport
    with _lock:
        transport, _transport = _transport, None
    if transport is not None:
        transport.close()
