"""System checks for the ``REALTIME_*`` settings (``realtime.E0xx`` / ``realtime.W0xx``).

Daphne runs no system checks, so ``manage.py check`` (and ``migrate``, ``runserver``) is where
a project hears about a bad value, each with a hint. Ids are stable; each has its own test.
"""

from __future__ import annotations

import difflib
import re
import sys
from collections.abc import Iterable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from django.apps import apps
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, models
from django.utils.module_loading import import_string

from realtime import limits
from realtime.conf import PREFIX, defaults, raw
from realtime.origins import parse_origin
from realtime.paths import path_target
from realtime.transports.redis_client import UrlError, parse_url

POSITIVE_NUMBERS = (
    "TOKEN_MAX_AGE",
    "AUTH_TIMEOUT",
    "SEND_TIMEOUT",
    "RECHECK_INTERVAL",
    "POLLING_INTERVAL",
    "COMMIT_GRACE",
    "MESSAGE_RETENTION",
    "HEARTBEAT_INTERVAL",
    "HEARTBEAT_TIMEOUT",
    "RECONNECT_BACKOFF_START",
    "RECONNECT_BACKOFF_MAX",
    "SUPERVISE_INTERVAL",
    "RESUME_WINDOW",
)
POSITIVE_INTEGERS = (
    "MAX_CHANNELS",
    "MAX_FRAME_SIZE",
    "FRAME_LIMIT",
    "MAX_SOCKETS_PER_USER",
    "CASCADE_LIMIT",
    "BULK_LIMIT",
    "MAX_PAYLOAD",
    "TRIM_BATCH_SIZE",
    "CONSUMER_POOL_SIZE",
    "NOTIFY_QUEUE_SIZE",
    "TCP_KEEPIDLE",
    "TCP_KEEPINTVL",
    "TCP_KEEPCNT",
    "RESUME_MAX_FRAMES",
    "MAX_QUERIES",
    "QUERY_MAX_ROWS",
)
#: The settings with a maximum below any duration's (``limits.MAX_SECONDS``) or integer's, and
#: why: what the connections realtime holds open take (``realtime.transports.bounds``), which
#: could not be opened past it. PostgreSQL reads the heartbeat timeout in milliseconds, as a
#: 32-bit integer (``tcp_user_timeout``, ``statement_timeout``); Linux takes keepalive seconds
#: up to 32767 and probes up to 127.
MAXIMA: dict[str, tuple[int, str]] = {
    "HEARTBEAT_TIMEOUT": (2_147_483, "PostgreSQL's longest timeout, 2^31-1 ms"),
    "TCP_KEEPIDLE": (32_767, "the most Linux takes"),
    "TCP_KEEPINTVL": (32_767, "the most Linux takes"),
    "TCP_KEEPCNT": (127, "the most Linux takes"),
}
BOOLEANS = ("REVOKE_ON_PASSWORD_CHANGE", "AUTO_TRIM", "PG_NOTIFY_LOG")
#: The redis-py the Redis transport is built on (the ``[redis]`` extra).
REDIS_PY = ">=8.0,<9"
REDIS_PY_MAJOR = 8
CHANNEL_NAME = re.compile(r"[A-Za-z0-9_]{1,40}")
MODEL_LABEL = re.compile(r"\w+\.\w+")


def _error(id_: int, setting: str, message: str, hint: str) -> checks.Error:
    return checks.Error(f"{PREFIX}{setting} {message}", hint=hint, id=f"realtime.E{id_:03d}")


@checks.register()
def check_settings(app_configs: Iterable[Any] | None = None, **kwargs: Any) -> list[Any]:
    """Validate every ``REALTIME_*`` setting; see the module docstring."""
    return [
        *_check_transport(),
        *_check_auth(),
        *_check_account_model(),
        *_check_scope(),
        *_check_recheck_models(),
        *_check_numbers(),
        *_check_booleans(),
        *_check_channel(),
        *_check_listen_database(),
        *_check_redis_url(),
        *_check_resume_window(),
        *_check_allowed_origins(),
        *_check_address_cap(),
        *_check_unknown_names(),
    ]


def _check_transport() -> list[checks.CheckMessage]:
    from realtime.transports import transport_class

    value = raw("TRANSPORT")
    if not isinstance(value, str):
        return [_error(1, "TRANSPORT", "must be a string.", 'Use "table", "pg_notify" or "redis".')]
    if value == "redis" and not _redis_py_installed():
        return [
            _error(
                23,
                "TRANSPORT",
                f'"redis" needs redis-py {REDIS_PY}, which is not installed.',
                'Install it with pip install "django-realtime-models[redis]".',
            )
        ]
    vendor = connections["default"].vendor
    if value == "pg_notify" and vendor != "postgresql":
        return [
            _error(
                20,
                "TRANSPORT",
                f'"pg_notify" needs PostgreSQL, but the default database is {vendor}.',
                'Use REALTIME_TRANSPORT = "table", which works on every database.',
            )
        ]
    try:
        chosen = transport_class(value)
    except ImproperlyConfigured as exc:
        return [
            _error(
                1,
                "TRANSPORT",
                f"is invalid: {exc}.",
                'Use "table", "pg_notify", "redis" or the dotted path of a Transport subclass.',
            )
        ]
    if vendor != "postgresql" and _is_builtin(chosen, "pg_notify", "PgNotifyTransport"):
        return [
            _error(
                20,
                "TRANSPORT",
                f"{value!r} is a pg_notify transport, which needs PostgreSQL, but the default "
                f"database is {vendor}.",
                'Use REALTIME_TRANSPORT = "table", which works on every database.',
            )
        ]
    return []


def _chosen_transport() -> type[Any] | None:
    """The class ``REALTIME_TRANSPORT`` names; ``None`` when it names none
    (``realtime.E001`` says why)."""
    from realtime.transports import transport_class

    value = raw("TRANSPORT")
    try:
        return transport_class(value) if isinstance(value, str) else None
    except ImproperlyConfigured:
        return None


def _is_builtin(chosen: type[Any] | None, module: str, name: str) -> bool:
    """Whether ``chosen`` is the built-in transport ``name`` of ``module``, or a subclass of
    it, named by its short name or a dotted path. Never imports the module (each needs its
    driver): a subclass of it has imported it already."""
    loaded = sys.modules.get(f"realtime.transports.{module}")
    return chosen is not None and loaded is not None and issubclass(chosen, getattr(loaded, name))


def _redis_py_installed() -> bool:
    """Whether a redis-py the Redis transport supports (8.x) is installed."""
    try:
        major = int(version("redis").split(".", 1)[0])
    except (PackageNotFoundError, ValueError):
        return False
    return major == REDIS_PY_MAJOR


def _check_redis_url() -> list[checks.CheckMessage]:
    """``REALTIME_REDIS_URL`` when the Redis transport is selected, or when it is set."""
    value = raw("REDIS_URL")
    if value is None and not _is_builtin(_chosen_transport(), "redis", "RedisTransport"):
        return []
    hint = (
        'Give the URL of a Redis server, e.g. "redis://127.0.0.1:6379/0" ("rediss://" for '
        'TLS, "unix:///path/to/redis.sock" for a local socket), or of a Redis Cluster\'s '
        'nodes: "redis+cluster://10.0.0.1:6379,10.0.0.2:6379" ("rediss+cluster://" for TLS) '
        'or a list of "redis://host:port" URLs.'
    )
    try:
        parse_url(value)
    except UrlError as exc:
        return [_error(24, "REDIS_URL", f"{exc}.", hint)]
    return []


def _check_auth() -> list[checks.CheckMessage]:
    value = raw("AUTH")
    hint = 'The default is "realtime.auth.RealtimeAuth"; subclass it to change a hook.'
    if not isinstance(value, str) or "." not in value:
        return [_error(2, "AUTH", "must be the dotted path of a RealtimeAuth class.", hint)]
    try:
        cls = import_string(value)
    except ImportError:
        return [_error(2, "AUTH", f"{value!r} cannot be imported.", hint)]
    if not isinstance(cls, type):
        return [_error(2, "AUTH", f"{value!r} is not a class.", hint)]
    return []


def _resolve_model(label: Any) -> type[models.Model] | None:
    if not isinstance(label, str) or not MODEL_LABEL.fullmatch(label):
        return None
    try:
        return apps.get_model(label)
    except LookupError:
        return None


def _check_scope() -> list[checks.CheckMessage]:
    label = raw("SCOPE_MODEL")
    if label is None:
        return []
    model = _resolve_model(label)
    if model is None:
        return [
            _error(
                3,
                "SCOPE_MODEL",
                f"{label!r} names no installed model.",
                'Write it as "app_label.ModelName", e.g. "crm.Workspace".',
            )
        ]
    errors: list[checks.CheckMessage] = []
    slug = raw("SCOPE_SLUG_FIELD")
    field_names = {field.name for field in model._meta.get_fields()}
    if not isinstance(slug, str) or slug not in field_names:
        errors.append(
            _error(
                4,
                "SCOPE_SLUG_FIELD",
                f"{slug!r} is not a field of {model._meta.label}.",
                'Name the column clients use to name a scope, e.g. "slug".',
            )
        )
    elif not _is_unique(model, slug):
        errors.append(
            checks.Warning(
                f"{PREFIX}SCOPE_SLUG_FIELD {slug!r} is not unique in {model._meta.label}: an "
                "account that is a member of two scopes of one slug reads only one of them "
                "when a socket names it.",
                hint=f"Make {model._meta.label}.{slug} unique (unique=True), or name a unique "
                "field.",
                id="realtime.W004",
            )
        )
    members = raw("SCOPE_MEMBERS")
    if not _leads_to_user(model, members):
        errors.append(
            _error(
                5,
                "SCOPE_MEMBERS",
                f"{members!r} is not a path from {model._meta.label} to "
                f"{settings.AUTH_USER_MODEL}.",
                _members_hint(model, members),
            )
        )
    return errors


def _is_unique(model: type[models.Model], name: str) -> bool:
    """Whether the database keeps ``name`` unique: the field itself, or a constraint (or
    ``unique_together``) on it alone, with no condition."""
    field = model._meta.get_field(name)
    if getattr(field, "unique", False):
        return True
    alone = [tuple(fields) for fields in model._meta.unique_together]
    alone += [
        tuple(constraint.fields)
        for constraint in model._meta.constraints
        if isinstance(constraint, models.UniqueConstraint) and constraint.condition is None
    ]
    return (name,) in alone


def _members_hint(model: type[models.Model], path: Any) -> str:
    """The hint of ``realtime.E005``: the path with its first unknown hop replaced by the
    closest name, where that leads to the user model (a reverse foreign key is named as in
    ``filter()``, ``membership``, not ``membership_set``)."""
    example = (
        'Name the relations from the scope to its members, e.g. "members" or "memberships.user".'
    )
    if not isinstance(path, str):
        return example
    hops = path.replace("__", ".").split(".")
    current: Any = model
    for index, hop in enumerate(hops):
        names = [field.name for field in current._meta.get_fields()]
        if hop not in names:
            for close in difflib.get_close_matches(hop.removesuffix("_set"), names, n=3):
                fixed = ".".join([*hops[:index], close, *hops[index + 1 :]])
                if _leads_to_user(model, fixed):
                    return f'Did you mean "{fixed}"? ' + example
            return example
        current = current._meta.get_field(hop).related_model
        if not isinstance(current, type):
            return example
    return example


def _leads_to_user(model: type[models.Model], path: Any) -> bool:
    """Whether ``path`` leads from ``model`` to the account model; taken to, when
    ``AUTH_USER_MODEL`` names no installed model (``realtime.E027`` says so instead)."""
    account = account_model()
    if account is None:
        return True
    if not isinstance(path, str):
        return False
    try:
        return path_target(model, path) is account
    except ValueError:
        return False


def account_model() -> type[models.Model] | None:
    """The model ``AUTH_USER_MODEL`` names; ``None`` when it names no installed model (a test's
    ``override_settings``): the checks of paths to accounts then wait for ``realtime.E027``."""
    try:
        return get_user_model()
    except (ImproperlyConfigured, LookupError, ValueError):
        return None


def _check_account_model() -> list[checks.CheckMessage]:
    if account_model() is not None:
        return []
    return [
        checks.Error(
            f"AUTH_USER_MODEL {settings.AUTH_USER_MODEL!r} names no installed model: realtime "
            "cannot tell which paths lead to accounts.",
            hint='Name the account model as "app_label.ModelName", of an installed app.',
            id="realtime.E027",
        )
    ]


def _check_recheck_models() -> list[checks.CheckMessage]:
    value = raw("RECHECK_MODELS")
    hint = 'Map "app_label.Model" to the path from it to its account, e.g. {"api.Key": "owner"}.'
    if not isinstance(value, dict):
        return [_error(6, "RECHECK_MODELS", "must be a dict.", hint)]
    errors: list[checks.CheckMessage] = []
    for label, path in value.items():
        model = _resolve_model(label)
        if model is None:
            errors.append(_error(6, "RECHECK_MODELS", f"names no model {label!r}.", hint))
        elif not _leads_to_user(model, path):
            errors.append(
                _error(
                    6,
                    "RECHECK_MODELS",
                    f"{path!r} is not a path from {label} to {settings.AUTH_USER_MODEL}.",
                    hint,
                )
            )
    return errors


def _check_numbers() -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    for name in POSITIVE_NUMBERS:
        value = raw(name)
        most, why = MAXIMA.get(name, (limits.MAX_SECONDS, "100 years"))
        if not _positive_number(value, most):
            errors.append(
                _error(
                    7,
                    name,
                    f"must be a number above 0 and at most {most} ({why}), not {value!r}.",
                    _default_hint(name),
                )
            )
    for name in POSITIVE_INTEGERS:
        value = raw(name)
        maximum = MAXIMA.get(name)
        bad = isinstance(value, bool) or not isinstance(value, int) or value < 1
        if bad or (maximum is not None and value > maximum[0]):
            bound = "of at least 1" if maximum is None else f"from 1 to {maximum[0]} ({maximum[1]})"
            errors.append(
                _error(8, name, f"must be an integer {bound}, not {value!r}.", _default_hint(name))
            )
    start, cap = raw("RECONNECT_BACKOFF_START"), raw("RECONNECT_BACKOFF_MAX")
    if _positive_number(start) and _positive_number(cap) and start > cap:
        errors.append(
            _error(
                11,
                "RECONNECT_BACKOFF_MAX",
                f"({cap}) is below REALTIME_RECONNECT_BACKOFF_START ({start}).",
                "The delay doubles from the start value up to the cap; raise the cap.",
            )
        )
    return errors


def _default_hint(name: str) -> str:
    return f"The default is {defaults()[PREFIX + name]!r}."


def _check_booleans() -> list[checks.CheckMessage]:
    return [
        _error(9, name, f"must be True or False, not {raw(name)!r}.", _default_hint(name))
        for name in BOOLEANS
        if not isinstance(raw(name), bool)
    ]


def _check_channel() -> list[checks.CheckMessage]:
    value = raw("CHANNEL")
    if isinstance(value, str) and CHANNEL_NAME.fullmatch(value):
        return []
    return [
        _error(
            10,
            "CHANNEL",
            f"must be 1 to 40 letters, digits or underscores, not {value!r}.",
            'Scope channels are "<REALTIME_CHANNEL>_<scope id>"; the default is "realtime".',
        )
    ]


def _check_listen_database() -> list[checks.CheckMessage]:
    value = raw("LISTEN_DATABASE")
    if value is None:
        return []
    hint = "Name an alias of DATABASES, or give a PostgreSQL DSN (postgresql://... or key=value)."
    if not isinstance(value, str) or not value:
        return [_error(21, "LISTEN_DATABASE", "must be a string.", hint)]
    if value in settings.DATABASES:
        if connections[value].vendor != "postgresql":
            return [
                _error(
                    21,
                    "LISTEN_DATABASE",
                    f"names the alias {value!r}, which is not PostgreSQL.",
                    hint,
                )
            ]
        return []
    if value.startswith(("postgresql://", "postgres://")) or "=" in value:
        return []
    return [_error(21, "LISTEN_DATABASE", f"{value!r} is neither an alias nor a DSN.", hint)]


def _check_resume_window() -> list[checks.CheckMessage]:
    """The log must keep a message at least as long as a cursor may ask for it (where there
    is one that ``REALTIME_MESSAGE_RETENTION`` trims: Redis keeps its streams by the window)."""
    retention, window = raw("MESSAGE_RETENTION"), raw("RESUME_WINDOW")
    if not (_positive_number(retention) and _positive_number(window)) or retention >= window:
        return []  # E007 reports a value that is no positive number
    if not _keeps_message_log():
        return []
    hint = (
        f"Keep messages at least as long as a resume may reach back: raise "
        f"{PREFIX}MESSAGE_RETENTION to {window} or more, or lower {PREFIX}RESUME_WINDOW."
    )
    return [
        _error(
            13,
            "MESSAGE_RETENTION",
            f"({retention} s) is shorter than {PREFIX}RESUME_WINDOW ({window} s).",
            hint,
        )
    ]


def _keeps_message_log() -> bool:
    """Whether the transport keeps its messages in ``firm_channel_messages``: the table
    transport, and pg_notify with its log (an unknown transport: ``realtime.E001`` says)."""
    from realtime.transports.table import TableTransport

    chosen = _chosen_transport()
    if chosen is None:
        return False
    if issubclass(chosen, TableTransport):
        return True
    if _is_builtin(chosen, "redis", "RedisTransport"):
        return False
    if _is_builtin(chosen, "pg_notify", "PgNotifyTransport"):
        return raw("PG_NOTIFY_LOG") is not False
    return True  # a transport of the application's: it may keep the table


def _positive_number(value: Any, most: float = limits.MAX_SECONDS) -> bool:
    """Whether ``value`` is a duration ``realtime.E007`` lets pass: above 0, and no more than
    ``most`` (which infinity and NaN are not)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= most


def _check_allowed_origins() -> list[checks.CheckMessage]:
    value = raw("ALLOWED_ORIGINS")
    hint = (
        "List origins as browsers send them, scheme://host[:port] without a path, "
        'e.g. ["https://app.example.com"].'
    )
    if isinstance(value, str) or not isinstance(value, list | tuple):
        return [_error(12, "ALLOWED_ORIGINS", f"must be a list, not {value!r}.", hint)]
    errors: list[checks.CheckMessage] = []
    for entry in value:
        try:
            parse_origin(entry)
        except ValueError as exc:
            errors.append(_error(12, "ALLOWED_ORIGINS", f"is invalid: {exc}.", hint))
    return errors


def _check_address_cap() -> list[checks.CheckMessage]:
    value = raw("MAX_UNAUTHENTICATED_PER_ADDRESS")
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return []
    return [
        _error(
            14,
            "MAX_UNAUTHENTICATED_PER_ADDRESS",
            f"must be None (no cap) or an integer of at least 1, not {value!r}.",
            "The default, None, sets no cap; a cap counts each worker's sockets that have not "
            "authenticated yet, by client address.",
        )
    ]


def _check_unknown_names() -> list[checks.CheckMessage]:
    known = set(defaults())
    # Compare what follows the prefix: every name shares it, which would make any two alike.
    suffixes = [name.removeprefix(PREFIX) for name in known]
    warnings: list[checks.CheckMessage] = []
    for name in dir(settings):
        if name.startswith(PREFIX) and name not in known:
            close = difflib.get_close_matches(name.removeprefix(PREFIX), suffixes, n=1)
            hint = (
                f"Did you mean {PREFIX}{close[0]}?" if close else "See the settings documentation."
            )
            warnings.append(
                checks.Warning(
                    f"{name} is not a realtime setting and is ignored.",
                    hint=hint,
                    id="realtime.W001",
                )
            )
    return warnings
