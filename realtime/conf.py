"""Typed access to the ``REALTIME_*`` settings.

Every value is read from ``django.conf.settings`` the first time it is asked for, never at
import time, and kept until ``setting_changed`` says a ``REALTIME_*`` setting changed (as
``override_settings`` and pytest-django's ``settings`` do): reading an unset setting through
Django's lazy settings raises and catches an ``AttributeError`` each time, and a handshake asks
for a dozen. Objects built from settings (the transport, the auth service) are cached elsewhere
and dropped on the same signal. ``realtime.checks`` validates each value.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from typing import Any, Final, Generic, TypeVar

from django.conf import settings as django_settings
from django.core.signals import setting_changed

PREFIX: Final = "REALTIME_"

T = TypeVar("T")


def _optional_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _as_given(value: Any) -> Any:
    """Read as written: a URL string, or a list of node URLs (``realtime.checks`` says
    which are valid)."""
    return value


class Setting(Generic[T]):
    """One ``REALTIME_<NAME>`` setting: its default and the type it is read as."""

    def __init__(self, default: Any, kind: Callable[[Any], T]) -> None:
        self.default = default
        self.kind = kind
        self.mutable = kind in (dict, list)
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, instance: object, owner: type | None = None) -> T:
        try:
            value: T = _values[self.name]
        except KeyError:
            value = _values[self.name] = self.kind(
                getattr(django_settings, PREFIX + self.name, self.default)
            )
        # A dict or a list is handed out as a copy: a caller changing it changes no setting.
        return copy.copy(value) if self.mutable else value


#: Each setting's value as last read (see the module docstring).
_values: dict[str, Any] = {}


def _forget(*, setting: str, **kwargs: Any) -> None:
    global _validated
    if setting.startswith(PREFIX):
        _values.clear()
        _validated = False


setting_changed.connect(_forget, dispatch_uid="realtime.conf")


class RealtimeSettings:
    """The settings of ``settings.md``, as typed attributes."""

    TRANSPORT = Setting("table", str)
    AUTH = Setting("realtime.auth.RealtimeAuth", str)
    SCOPE_MODEL = Setting(None, _optional_str)
    SCOPE_SLUG_FIELD = Setting("slug", str)
    SCOPE_MEMBERS = Setting("members", str)
    RECHECK_MODELS: Setting[dict[str, str]] = Setting({}, dict)
    TOKEN_MAX_AGE = Setting(3600, float)
    REVOKE_ON_PASSWORD_CHANGE = Setting(False, bool)
    CHANNEL = Setting("realtime", str)
    AUTH_TIMEOUT = Setting(30.0, float)
    SEND_TIMEOUT = Setting(5.0, float)
    RECHECK_INTERVAL = Setting(60.0, float)
    MAX_CHANNELS = Setting(1000, int)
    MAX_FRAME_SIZE = Setting(65536, int)
    FRAME_LIMIT = Setting(200, int)
    MAX_SOCKETS_PER_USER = Setting(20, int)
    CASCADE_LIMIT = Setting(1000, int)
    BULK_LIMIT = Setting(1000, int)
    MAX_PAYLOAD = Setting(1048576, int)
    POLLING_INTERVAL = Setting(0.1, float)
    COMMIT_GRACE = Setting(5.0, float)
    MESSAGE_RETENTION = Setting(86400.0, float)
    AUTO_TRIM = Setting(True, bool)
    TRIM_BATCH_SIZE = Setting(100, int)
    LISTEN_DATABASE = Setting(None, _optional_str)
    CONSUMER_POOL_SIZE = Setting(4, int)
    NOTIFY_QUEUE_SIZE = Setting(10000, int)
    HEARTBEAT_INTERVAL = Setting(30.0, float)
    HEARTBEAT_TIMEOUT = Setting(10.0, float)
    RECONNECT_BACKOFF_START = Setting(1.0, float)
    RECONNECT_BACKOFF_MAX = Setting(30.0, float)
    SUPERVISE_INTERVAL = Setting(15.0, float)
    TCP_KEEPIDLE = Setting(30, int)
    TCP_KEEPINTVL = Setting(10, int)
    TCP_KEEPCNT = Setting(3, int)
    RESUME_WINDOW = Setting(300.0, float)
    RESUME_MAX_FRAMES = Setting(1000, int)
    PG_NOTIFY_LOG = Setting(True, bool)
    REDIS_URL: Setting[Any] = Setting(None, _as_given)
    ALLOWED_ORIGINS: Setting[list[str]] = Setting([], list)
    MAX_UNAUTHENTICATED_PER_ADDRESS = Setting(None, _optional_int)
    MAX_QUERIES = Setting(20, int)
    QUERY_MAX_ROWS = Setting(200, int)


def defaults() -> dict[str, Any]:
    """Map every known setting's full name to its default."""
    return {
        PREFIX + name: attribute.default
        for name, attribute in vars(RealtimeSettings).items()
        if isinstance(attribute, Setting)
    }


def raw(name: str) -> Any:
    """Return the project's value of ``REALTIME_<name>`` as written, or its default."""
    attribute = vars(RealtimeSettings)[name]
    assert isinstance(attribute, Setting)
    return getattr(django_settings, PREFIX + name, attribute.default)


conf: Final = RealtimeSettings()


# Validation at first use -----------------------------------------------------------------------

logger = logging.getLogger(__name__)

#: What validates every setting: ``realtime.checks``' system check, registered by the app once
#: its apps are ready (``validate_with``).
_validator: list[Callable[[], Sequence[Any]]] = []
_validated = False


def validate_with(check: Callable[[], Sequence[Any]]) -> None:
    """Have ``validate_once`` run ``check`` (a system check function)."""
    _validator[:] = [check]


def validate_once() -> None:
    """Log what the settings' system check finds, once per process (again after a setting
    changes): ASGI servers (daphne, uvicorn) run no system checks, so the socket side asks
    at its first use. Each error is one ERROR line naming the check's id, the setting and the
    fix (a warning: one WARNING line); realtime then runs with the values as given."""
    global _validated
    if _validated or not _validator:
        return
    _validated = True
    try:
        found = list(_validator[0]())
    except Exception:
        logger.exception("realtime: the check of the REALTIME_* settings failed")
        return
    for message in found:
        level = logging.ERROR if message.is_serious() else logging.WARNING
        logger.log(level, "realtime: %s (%s) %s", message.msg, message.id, message.hint or "")
