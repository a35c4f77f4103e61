"""Each system check id of ``realtime.checks``, triggered by the setting it guards.

The checks read settings only (models and database vendors included), so no test here needs
the database.
"""

from __future__ import annotations

import io
import logging
from importlib.metadata import PackageNotFoundError
from typing import Any

import pytest
from django.core.checks import CheckMessage
from django.core.exceptions import FieldError
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from realtime import limits
from realtime.checks import settings as checks
from realtime.checks.settings import check_settings
from realtime.paths import to_lookup
from realtime.transports.pg_notify import PgNotifyTransport
from tests.helpers import vendor
from tests.testapp.models import Workspace

NOT_POSITIVE_NUMBERS: list[Any] = [0, 0.0, -1, -0.5, "1", True, None, float("nan")]
NOT_POSITIVE_INTEGERS: list[Any] = [0, -1, 1.5, 2.0, "3", True, None]
#: The settings of the connections realtime holds open, and the most their drivers take.
CONNECTION_MAXIMA = {
    "HEARTBEAT_TIMEOUT": 2_147_483,
    "TCP_KEEPIDLE": 32_767,
    "TCP_KEEPINTVL": 32_767,
    "TCP_KEEPCNT": 127,
}


def run_checks(**overrides: Any) -> list[CheckMessage]:
    """Run ``check_settings`` with ``overrides``; every message it returns must carry a hint."""
    with override_settings(**overrides):
        messages: list[CheckMessage] = check_settings()
    for message in messages:
        assert isinstance(message.hint, str), message
        assert message.hint.strip(), message
    return messages


def ids(**overrides: Any) -> list[str | None]:
    return [message.id for message in run_checks(**overrides)]


def test_default_settings_give_no_errors_or_warnings() -> None:
    assert check_settings() == []


# Django 6.1 runs the model checks against every alias, and a JSONField's
# check asks SQLite's features, which opens a connection.
@pytest.mark.django_db(databases=["default", "other"])
def test_manage_py_check_fails_on_a_bad_realtime_setting() -> None:
    with (
        override_settings(REALTIME_POLLING_INTERVAL=0),
        pytest.raises(SystemCheckError, match=r"realtime\.E007"),
    ):
        call_command("check")


# E001: REALTIME_TRANSPORT


@pytest.mark.parametrize("value", [42, None, b"table", ["table"]])
def test_non_string_transport_is_error_e001(value: Any) -> None:
    assert ids(REALTIME_TRANSPORT=value) == ["realtime.E001"]


@pytest.mark.parametrize("value", ["nope.Transport", "realtime.transports.Nope", "tabel", ""])
def test_unimportable_transport_is_error_e001(value: str) -> None:
    assert ids(REALTIME_TRANSPORT=value) == ["realtime.E001"]


@pytest.mark.parametrize(
    "value",
    [
        "realtime.conf.RealtimeSettings",  # a class, not a Transport
        "django.db.models.Model",  # a class, not a Transport
        "realtime.conf.conf",  # not a class at all
        "realtime.transports.get_transport",  # a function
    ],
)
def test_transport_that_is_not_a_transport_subclass_is_error_e001(value: str) -> None:
    assert ids(REALTIME_TRANSPORT=value) == ["realtime.E001"]


@pytest.mark.parametrize("value", ["table", "realtime.transports.table.TableTransport"])
def test_table_transport_by_name_or_dotted_path_passes(value: str) -> None:
    assert ids(REALTIME_TRANSPORT=value) == []


# E020: REALTIME_TRANSPORT = "pg_notify" off PostgreSQL


def test_pg_notify_transport_without_postgresql_is_error_e020() -> None:
    if vendor() == "postgresql":
        pytest.skip("the default database is PostgreSQL, where pg_notify is allowed")
    assert ids(REALTIME_TRANSPORT="pg_notify") == ["realtime.E020"]


class OwnPgNotify(PgNotifyTransport):
    """A project's subclass of the pg_notify transport."""


@pytest.mark.parametrize(
    "path",
    ["realtime.transports.pg_notify.PgNotifyTransport", f"{__name__}.OwnPgNotify"],
)
def test_pg_notify_transport_named_by_its_path_without_postgresql_is_error_e020(
    path: str,
) -> None:
    if vendor() == "postgresql":
        pytest.skip("the default database is PostgreSQL, where pg_notify is allowed")
    assert ids(REALTIME_TRANSPORT=path) == ["realtime.E020"]


# E023, E024: the Redis transport (redis-py installed, REALTIME_REDIS_URL)


def _redis_py_importable() -> bool:
    try:
        import redis  # noqa: F401
    except ImportError:
        return False
    return True


#: The transport itself imports redis-py: without it, E023 comes with any other message.
needs_redis_py = pytest.mark.skipif(not _redis_py_importable(), reason="redis-py not installed")


@needs_redis_py
def test_redis_transport_named_by_its_path_without_a_url_is_error_e024() -> None:
    assert ids(REALTIME_TRANSPORT="realtime.transports.redis.RedisTransport") == ["realtime.E024"]


@needs_redis_py
def test_redis_transport_with_a_valid_url_passes() -> None:
    assert ids(REALTIME_TRANSPORT="redis", REALTIME_REDIS_URL="redis://127.0.0.1:6379/0") == []


@pytest.mark.parametrize("absent", ["not installed", "7.4.1"])
def test_redis_transport_without_redis_py_8_is_error_e023(
    absent: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def version(name: str) -> str:
        assert name == "redis"
        if absent == "not installed":
            raise PackageNotFoundError(name)
        return absent

    monkeypatch.setattr(checks, "version", version)
    messages = run_checks(REALTIME_TRANSPORT="redis", REALTIME_REDIS_URL="redis://h:6379/0")
    assert [m.id for m in messages] == ["realtime.E023"]
    assert "django-realtime-models[redis]" in str(messages[0].hint)


@needs_redis_py
@pytest.mark.parametrize(
    "value",
    [
        None,
        42,
        "",
        "127.0.0.1:6379",
        "http://h:6379/0",
        "redis://:6379/0",
        "redis://h:port/0",
        "redis://h:6379/zero",
        "unix://",
        [],
        ["redis://h:1", 7],
        "redis+cluster://h",
        "redis+cluster://h:1,:2",
        "redis+cluster://h:1,h:2/3",
        "rediss+cluster://h:x",
        ["redis://a:7000", "unix:///run/redis.sock"],
        ["redis://a:7000", "rediss://b:7001"],
        ["redis://a:7000/2"],
    ],
    ids=repr,
)
def test_redis_url_missing_or_malformed_is_error_e024(value: Any) -> None:
    assert ids(REALTIME_TRANSPORT="redis", REALTIME_REDIS_URL=value) == ["realtime.E024"]


@needs_redis_py
@pytest.mark.parametrize(
    "value",
    [
        "redis://127.0.0.1:6379/0",
        "redis://:secret@cache.internal",
        "rediss://user:pw@cache.example.com:6380/1?ssl_cert_reqs=required",
        "unix:///run/redis/redis.sock?db=2",
    ],
)
def test_redis_url_of_a_standalone_server_passes(value: str) -> None:
    assert ids(REALTIME_TRANSPORT="redis", REALTIME_REDIS_URL=value) == []


@needs_redis_py
@pytest.mark.parametrize(
    "value",
    [
        "redis+cluster://a:7000,b:7001",
        "redis+cluster://:secret@a:7000,b:7001/",
        "rediss+cluster://a:7000,b:7001?ssl_cert_reqs=required",
        ["redis://a:7000", "redis://b:7001/0"],
        ("rediss://a:7000",),
    ],
    ids=["url", "credentials", "tls", "list", "tuple"],
)
def test_redis_url_of_a_cluster_passes(value: Any) -> None:
    assert ids(REALTIME_TRANSPORT="redis", REALTIME_REDIS_URL=value) == []


def test_a_cluster_url_stands_for_one_url_per_node_with_its_credentials_and_options() -> None:
    from realtime.transports.redis_client import node_url, parse_url

    target = parse_url("rediss+cluster://u:pw@a:7000,b:7001?ssl_cert_reqs=none")
    assert target.url is None
    assert target.cluster == (
        "rediss://u:pw@a:7000?ssl_cert_reqs=none",
        "rediss://u:pw@b:7001?ssl_cert_reqs=none",
    )
    assert node_url(target.cluster[0], "10.0.0.9", 7005) == (
        "rediss://u:pw@10.0.0.9:7005?ssl_cert_reqs=none"
    )


def test_redis_url_is_not_required_by_other_transports_but_checked_when_set() -> None:
    assert ids(REALTIME_TRANSPORT="table", REALTIME_REDIS_URL=None) == []
    assert ids(REALTIME_TRANSPORT="table", REALTIME_REDIS_URL="nope") == ["realtime.E024"]


# E002: REALTIME_AUTH


@pytest.mark.parametrize("value", [42, None, "RealtimeAuth", "", ["realtime.auth.RealtimeAuth"]])
def test_auth_that_is_not_a_dotted_string_is_error_e002(value: Any) -> None:
    assert ids(REALTIME_AUTH=value) == ["realtime.E002"]


def test_importable_auth_class_passes() -> None:
    assert ids(REALTIME_AUTH="realtime.auth.RealtimeAuth") == []


@pytest.mark.parametrize("value", ["myproject.realtime.Auth", "realtime.auth.NoSuchAuth"])
def test_auth_path_that_cannot_be_imported_is_error_e002(value: str) -> None:
    assert ids(REALTIME_AUTH=value) == ["realtime.E002"]


def test_auth_path_naming_something_else_than_a_class_is_error_e002() -> None:
    assert ids(REALTIME_AUTH="realtime.auth.issue_token") == ["realtime.E002"]


# E003: REALTIME_SCOPE_MODEL


@pytest.mark.parametrize(
    "value", ["testapp.Nope", "nope.Workspace", "Workspace", "testapp.Workspace.slug", "", 42]
)
def test_unresolvable_scope_model_is_error_e003(value: Any) -> None:
    assert ids(REALTIME_SCOPE_MODEL=value) == ["realtime.E003"]


@pytest.mark.parametrize(
    ("value", "error"), [("nope.Workspace", LookupError), ("Workspace", ValueError)]
)
def test_at_run_time_an_unresolvable_scope_model_raises_naming_the_setting_and_the_check(
    settings: Any, value: str, error: type[Exception]
) -> None:
    from realtime.auth import scope_model

    settings.REALTIME_SCOPE_MODEL = value
    with pytest.raises(error, match=rf"^REALTIME_SCOPE_MODEL '{value}' names no installed model "):
        scope_model()


def test_no_scope_model_passes_whatever_the_slug_and_members() -> None:
    overrides = {"REALTIME_SCOPE_SLUG_FIELD": "x", "REALTIME_SCOPE_MEMBERS": 1}
    assert ids(REALTIME_SCOPE_MODEL=None, **overrides) == []


# E004: REALTIME_SCOPE_SLUG_FIELD


@pytest.mark.parametrize("value", ["handle", "", 42, None])
def test_slug_field_missing_from_scope_model_is_error_e004(value: Any) -> None:
    assert ids(REALTIME_SCOPE_SLUG_FIELD=value) == ["realtime.E004"]


@pytest.mark.parametrize("value", ["slug", "id"])
def test_slug_field_of_scope_model_passes(value: str) -> None:
    assert ids(REALTIME_SCOPE_SLUG_FIELD=value) == []


def test_a_slug_field_that_is_not_unique_is_warning_w004() -> None:
    # Two workspaces named alike: a member of both would read only one when naming it.
    [message] = run_checks(REALTIME_SCOPE_SLUG_FIELD="name")
    assert message.id == "realtime.W004"
    assert "testapp.Workspace.name unique" in str(message.hint)


# E005: REALTIME_SCOPE_MEMBERS


@pytest.mark.parametrize(
    "value",
    [
        "owners",  # no such field
        "name",  # a plain column
        "membership.role",  # ends on a plain column
        "membership.workspace",  # a path back to the scope, not to users
        "membership..user",  # an empty part
        "membership.user.",  # an empty last part
        "",
        42,
        None,
    ],
)
def test_scope_members_path_not_reaching_user_is_error_e005(value: Any) -> None:
    assert ids(REALTIME_SCOPE_MEMBERS=value) == ["realtime.E005"]


@pytest.mark.parametrize("value", ["members", "membership.user", "membership__user"])
def test_scope_members_path_reaching_user_passes(value: str) -> None:
    assert ids(REALTIME_SCOPE_MEMBERS=value) == []
    # What the check accepts works as the ORM lookup it will become.
    Workspace.objects.filter(**{to_lookup(value): 1})


@pytest.mark.parametrize("value", ["membership_set.user", "membership_set__user"])
def test_reverse_accessor_name_in_scope_members_is_error_e005(value: str) -> None:
    """``membership_set`` is the Python accessor; lookups name the reverse FK ``membership``.

    ``Membership.workspace`` has no ``related_name``, so the relation is queried as
    ``membership`` and the ORM refuses ``membership_set__user`` as well.
    """
    [message] = run_checks(REALTIME_SCOPE_MEMBERS=value)
    assert message.id == "realtime.E005"
    assert str(message.hint).startswith('Did you mean "membership.user"?')
    with pytest.raises(FieldError):
        Workspace.objects.filter(**{to_lookup(value): 1})


def test_bad_slug_field_and_bad_members_give_both_e004_and_e005() -> None:
    assert ids(REALTIME_SCOPE_SLUG_FIELD="handle", REALTIME_SCOPE_MEMBERS="owners") == [
        "realtime.E004",
        "realtime.E005",
    ]


# E006: REALTIME_RECHECK_MODELS


@pytest.mark.parametrize("value", [None, [], ["testapp.Membership"], "testapp.Membership"])
def test_recheck_models_that_is_not_a_dict_is_error_e006(value: Any) -> None:
    assert ids(REALTIME_RECHECK_MODELS=value) == ["realtime.E006"]


@pytest.mark.parametrize("label", ["testapp.Nope", "nope.Membership", "Membership", 42])
def test_recheck_models_naming_unknown_model_is_error_e006(label: Any) -> None:
    assert ids(REALTIME_RECHECK_MODELS={label: "user"}) == ["realtime.E006"]


@pytest.mark.parametrize("path", ["owner", "role", "workspace", "user.", "", 42, None])
def test_recheck_models_path_not_reaching_user_is_error_e006(path: Any) -> None:
    assert ids(REALTIME_RECHECK_MODELS={"testapp.Membership": path}) == ["realtime.E006"]


def test_recheck_models_reports_each_bad_entry_with_e006() -> None:
    value = {"testapp.Membership": "user", "testapp.Nope": "user", "testapp.Workspace": "slug"}
    assert ids(REALTIME_RECHECK_MODELS=value) == ["realtime.E006", "realtime.E006"]


@pytest.mark.parametrize(
    "value",
    [
        {},
        {"testapp.Membership": "user"},
        {"testapp.Workspace": "members"},
        {"testapp.Workspace": "membership__user"},
    ],
)
def test_recheck_models_with_paths_to_user_passes(value: dict[str, str]) -> None:
    assert ids(REALTIME_RECHECK_MODELS=value) == []


# E007: positive numbers


@pytest.mark.parametrize("value", NOT_POSITIVE_NUMBERS, ids=repr)
@pytest.mark.parametrize("name", checks.POSITIVE_NUMBERS)
def test_number_that_is_not_positive_is_error_e007(name: str, value: Any) -> None:
    messages = run_checks(**{f"REALTIME_{name}": value})
    assert [message.id for message in messages] == ["realtime.E007"]
    assert messages[0].msg.startswith(f"REALTIME_{name} ")


@pytest.mark.parametrize("value", [float("inf"), limits.MAX_SECONDS + 1, 1e13, 1e300], ids=repr)
@pytest.mark.parametrize("name", [n for n in checks.POSITIVE_NUMBERS if n not in CONNECTION_MAXIMA])
def test_a_duration_over_a_hundred_years_is_error_e007(name: str, value: float) -> None:
    """More than any database takes as an interval, or ``time.sleep`` as a wait."""
    messages = run_checks(**{f"REALTIME_{name}": value})
    assert [message.id for message in messages] == ["realtime.E007"]
    assert messages[0].msg == (
        f"REALTIME_{name} must be a number above 0 and at most 3153600000 (100 years), "
        f"not {value!r}."
    )


@pytest.mark.parametrize("value", [0.001, 1, 2.5, 10**6, limits.MAX_SECONDS])
@pytest.mark.parametrize("name", checks.POSITIVE_NUMBERS)
def test_positive_int_or_float_number_passes(name: str, value: float) -> None:
    # Settings that bound each other are set together: the backoff start never above its cap,
    # the retention never below the resume window.
    backoff = {"REALTIME_RECONNECT_BACKOFF_START": value, "REALTIME_RECONNECT_BACKOFF_MAX": value}
    kept = {"REALTIME_MESSAGE_RETENTION": value, "REALTIME_RESUME_WINDOW": value}
    overrides = {f"REALTIME_{name}": value}
    if name.startswith("RECONNECT_BACKOFF_"):
        overrides = backoff
    elif name in ("MESSAGE_RETENTION", "RESUME_WINDOW"):
        overrides = kept
    elif name in CONNECTION_MAXIMA:
        overrides = {f"REALTIME_{name}": min(value, CONNECTION_MAXIMA[name])}
    assert ids(**overrides) == []


# E007, E008: what the connections realtime holds open take


@pytest.mark.parametrize(
    ("name", "most", "error", "message"),
    [
        (
            "HEARTBEAT_TIMEOUT",
            2_147_483,
            "realtime.E007",
            "must be a number above 0 and at most 2147483 (PostgreSQL's longest timeout, "
            "2^31-1 ms)",
        ),
        ("TCP_KEEPIDLE", 32_767, "realtime.E008", "must be an integer from 1 to 32767"),
        ("TCP_KEEPINTVL", 32_767, "realtime.E008", "must be an integer from 1 to 32767"),
        ("TCP_KEEPCNT", 127, "realtime.E008", "must be an integer from 1 to 127"),
    ],
)
def test_a_connection_setting_past_what_the_connections_take_is_an_error(
    name: str, most: int, error: str, message: str
) -> None:
    """libpq refuses a tcp_user_timeout past 2^31-1 ms, Linux a keepalive past its maximum:
    the poller's and the trims' connections could not be opened."""
    assert ids(**{f"REALTIME_{name}": most}) == []
    for value in (most + 1, most * 100, float("inf")):
        messages = run_checks(**{f"REALTIME_{name}": value})
        assert [message.id for message in messages] == [error]
        assert messages[0].msg.startswith(f"REALTIME_{name} {message}")
        assert messages[0].msg.endswith(f", not {value!r}.")


# E013: the log keeps messages as long as a resume reaches back


def test_retention_shorter_than_the_resume_window_is_error_e013() -> None:
    messages = run_checks(REALTIME_MESSAGE_RETENTION=60, REALTIME_RESUME_WINDOW=300)
    assert [message.id for message in messages] == ["realtime.E013"]
    assert "REALTIME_RESUME_WINDOW" in (messages[0].hint or "")


def test_retention_as_long_as_the_resume_window_passes() -> None:
    assert ids(REALTIME_MESSAGE_RETENTION=300, REALTIME_RESUME_WINDOW=300) == []


def test_retention_is_not_checked_where_no_log_is_trimmed_by_it() -> None:
    short = {"REALTIME_MESSAGE_RETENTION": 60, "REALTIME_RESUME_WINDOW": 300}
    redis = {"REALTIME_TRANSPORT": "redis", "REALTIME_REDIS_URL": "redis://127.0.0.1:6379/0"}
    assert "realtime.E013" not in ids(**short, **redis)
    unlogged = {"REALTIME_TRANSPORT": "pg_notify", "REALTIME_PG_NOTIFY_LOG": False}
    assert "realtime.E013" not in ids(**short, **unlogged)
    assert "realtime.E013" in ids(**short, REALTIME_TRANSPORT="pg_notify")


# E014: the cap on unauthenticated sockets per address


@pytest.mark.parametrize("value", [0, -1, 2.5, "3", True, [1]], ids=repr)
def test_an_address_cap_that_is_not_none_or_a_positive_integer_is_error_e014(value: Any) -> None:
    messages = run_checks(REALTIME_MAX_UNAUTHENTICATED_PER_ADDRESS=value)
    assert [message.id for message in messages] == ["realtime.E014"]
    assert "None" in (messages[0].hint or "")


@pytest.mark.parametrize("value", [None, 1, 50])
def test_an_address_cap_of_none_or_a_positive_integer_passes(value: Any) -> None:
    assert ids(REALTIME_MAX_UNAUTHENTICATED_PER_ADDRESS=value) == []


# E008: positive integers


@pytest.mark.parametrize("value", NOT_POSITIVE_INTEGERS, ids=repr)
@pytest.mark.parametrize("name", checks.POSITIVE_INTEGERS)
def test_integer_that_is_not_positive_is_error_e008(name: str, value: Any) -> None:
    messages = run_checks(**{f"REALTIME_{name}": value})
    assert [message.id for message in messages] == ["realtime.E008"]
    assert messages[0].msg.startswith(f"REALTIME_{name} ")


@pytest.mark.parametrize("name", checks.POSITIVE_INTEGERS)
def test_integer_of_one_passes(name: str) -> None:
    assert ids(**{f"REALTIME_{name}": 1}) == []


# E009: booleans


@pytest.mark.parametrize("value", [0, 1, "True", "yes", None], ids=repr)
@pytest.mark.parametrize("name", checks.BOOLEANS)
def test_boolean_that_is_not_true_or_false_is_error_e009(name: str, value: Any) -> None:
    messages = run_checks(**{f"REALTIME_{name}": value})
    assert [message.id for message in messages] == ["realtime.E009"]
    assert messages[0].msg.startswith(f"REALTIME_{name} ")


@pytest.mark.parametrize("value", [True, False])
@pytest.mark.parametrize("name", checks.BOOLEANS)
def test_true_or_false_boolean_passes(name: str, value: bool) -> None:
    assert ids(**{f"REALTIME_{name}": value}) == []


# E010: REALTIME_CHANNEL


@pytest.mark.parametrize(
    "value",
    ["", "real time", "a" * 41, "real-time", "realtime\n", "réaltime", 42, None, b"realtime"],
    ids=repr,
)
def test_bad_channel_name_is_error_e010(value: Any) -> None:
    assert ids(REALTIME_CHANNEL=value) == ["realtime.E010"]


@pytest.mark.parametrize("value", ["a", "a" * 40, "Realtime_2"])
def test_channel_of_1_to_40_word_characters_passes(value: str) -> None:
    assert ids(REALTIME_CHANNEL=value) == []


# E011: REALTIME_RECONNECT_BACKOFF_MAX below REALTIME_RECONNECT_BACKOFF_START


def test_backoff_max_below_start_is_error_e011() -> None:
    messages = run_checks(REALTIME_RECONNECT_BACKOFF_START=10, REALTIME_RECONNECT_BACKOFF_MAX=5.0)
    assert [message.id for message in messages] == ["realtime.E011"]


def test_backoff_max_below_default_start_is_error_e011() -> None:
    assert ids(REALTIME_RECONNECT_BACKOFF_MAX=0.5) == ["realtime.E011"]


def test_backoff_max_below_start_is_error_e011_beside_another_settings_error() -> None:
    messages = run_checks(
        REALTIME_RECONNECT_BACKOFF_START=10,
        REALTIME_RECONNECT_BACKOFF_MAX=1.0,
        REALTIME_MAX_CHANNELS=0,
    )
    assert sorted(str(message.id) for message in messages) == ["realtime.E008", "realtime.E011"]


def test_backoff_max_equal_to_start_passes() -> None:
    assert ids(REALTIME_RECONNECT_BACKOFF_START=2, REALTIME_RECONNECT_BACKOFF_MAX=2.0) == []


# E021: REALTIME_LISTEN_DATABASE


@pytest.mark.parametrize("value", [42, "", b"default", ["default"]], ids=repr)
def test_listen_database_that_is_not_a_string_is_error_e021(value: Any) -> None:
    assert ids(REALTIME_LISTEN_DATABASE=value) == ["realtime.E021"]


@pytest.mark.parametrize("value", ["nope", "listen", "postgresql", "mysql://u@h/db"])
def test_listen_database_neither_alias_nor_dsn_is_error_e021(value: str) -> None:
    assert ids(REALTIME_LISTEN_DATABASE=value) == ["realtime.E021"]


@pytest.mark.parametrize(
    "value", ["postgresql://u@h/db", "postgres://u:p@h:5432/db", "host=x dbname=y"]
)
def test_listen_database_dsn_passes(value: str) -> None:
    assert ids(REALTIME_LISTEN_DATABASE=value) == []


def test_listen_database_unset_passes() -> None:
    assert ids(REALTIME_LISTEN_DATABASE=None) == []


def test_listen_database_alias_of_non_postgresql_database_is_error_e021() -> None:
    if vendor() == "postgresql":
        pytest.skip("the default database is PostgreSQL")
    assert ids(REALTIME_LISTEN_DATABASE="default") == ["realtime.E021"]


def test_listen_database_alias_of_postgresql_database_passes() -> None:
    if vendor() != "postgresql":
        pytest.skip("the default database is not PostgreSQL")
    assert ids(REALTIME_LISTEN_DATABASE="default") == []


# W001: unknown REALTIME_* names


def test_misspelt_setting_name_is_warning_w001_with_suggestion() -> None:
    messages = run_checks(REALTIME_POLING_INTERVAL=0.5)
    assert [message.id for message in messages] == ["realtime.W001"]
    assert messages[0].is_serious() is False
    assert "REALTIME_POLING_INTERVAL" in messages[0].msg
    assert messages[0].hint == "Did you mean REALTIME_POLLING_INTERVAL?"


@pytest.mark.parametrize("name", ["REALTIME_DEBUG", "REALTIME_XYZZY", "REALTIME_ENABLED"])
def test_unknown_setting_name_like_no_setting_is_warning_w001_without_suggestion(
    name: str,
) -> None:
    messages = run_checks(**{name: 1})
    assert [message.id for message in messages] == ["realtime.W001"]
    assert messages[0].hint == "See the settings documentation."


def test_long_unknown_setting_name_is_warning_w001_without_suggestion() -> None:
    messages = run_checks(REALTIME_SOMETHING_ENTIRELY_DIFFERENT=1)
    assert [message.id for message in messages] == ["realtime.W001"]
    assert messages[0].hint == "See the settings documentation."


# Django 6.1 runs the model checks against every alias, and a JSONField's
# check asks SQLite's features, which opens a connection.
@pytest.mark.django_db(databases=["default", "other"])
def test_only_a_warning_does_not_fail_manage_py_check() -> None:
    stdout, stderr = io.StringIO(), io.StringIO()
    with override_settings(REALTIME_POLING_INTERVAL=0.5):
        call_command("check", stdout=stdout, stderr=stderr)
    assert "realtime.W001" in stderr.getvalue()


# Servers run no system checks: the socket side checks the settings at its first use


async def test_a_settings_error_is_logged_once_at_a_servers_first_use(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from realtime.sockets.manager import get_manager

    settings.REALTIME_MAX_FRAME_SIZE = 0
    caplog.set_level(logging.WARNING, logger="realtime.conf")
    get_manager()
    get_manager()
    told = [r for r in caplog.records if r.name == "realtime.conf"]
    assert [r.levelno for r in told] == [logging.ERROR]
    assert "REALTIME_MAX_FRAME_SIZE" in told[0].getMessage()
    assert "(realtime.E008)" in told[0].getMessage()


async def test_valid_settings_log_nothing_at_a_servers_first_use(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from realtime.sockets.manager import get_manager

    settings.REALTIME_MAX_FRAME_SIZE = 1000  # a change: checked again
    caplog.set_level(logging.DEBUG, logger="realtime.conf")
    get_manager()
    assert [r for r in caplog.records if r.name == "realtime.conf"] == []
