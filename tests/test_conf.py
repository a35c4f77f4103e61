"""``realtime.conf``: every documented setting, its default, read anew on each access; and the
transport built from settings, dropped when a ``REALTIME_*`` setting changes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from realtime import transports
from realtime.conf import PREFIX, conf, defaults, raw
from realtime.transports import TRANSPORT_SETTINGS, get_transport, reset_transport
from realtime.transports.table import TableTransport

DOCUMENTED: dict[str, Any] = {
    "TRANSPORT": "table",
    "AUTH": "realtime.auth.RealtimeAuth",
    "SCOPE_MODEL": None,
    "SCOPE_SLUG_FIELD": "slug",
    "SCOPE_MEMBERS": "members",
    "RECHECK_MODELS": {},
    "TOKEN_MAX_AGE": 3600,
    "REVOKE_ON_PASSWORD_CHANGE": False,
    "CHANNEL": "realtime",
    "AUTH_TIMEOUT": 30.0,
    "SEND_TIMEOUT": 5.0,
    "RECHECK_INTERVAL": 60.0,
    "MAX_CHANNELS": 1000,
    "MAX_FRAME_SIZE": 65536,
    "FRAME_LIMIT": 200,
    "MAX_SOCKETS_PER_USER": 20,
    "CASCADE_LIMIT": 1000,
    "BULK_LIMIT": 1000,
    "MAX_PAYLOAD": 1048576,
    "POLLING_INTERVAL": 0.1,
    "COMMIT_GRACE": 5.0,
    "MESSAGE_RETENTION": 86400.0,
    "AUTO_TRIM": True,
    "TRIM_BATCH_SIZE": 100,
    "LISTEN_DATABASE": None,
    "CONSUMER_POOL_SIZE": 4,
    "NOTIFY_QUEUE_SIZE": 10000,
    "HEARTBEAT_INTERVAL": 30.0,
    "HEARTBEAT_TIMEOUT": 10.0,
    "RECONNECT_BACKOFF_START": 1.0,
    "RECONNECT_BACKOFF_MAX": 30.0,
    "SUPERVISE_INTERVAL": 15.0,
    "TCP_KEEPIDLE": 30,
    "TCP_KEEPINTVL": 10,
    "TCP_KEEPCNT": 3,
    "RESUME_WINDOW": 300.0,
    "RESUME_MAX_FRAMES": 1000,
    "PG_NOTIFY_LOG": True,
    "REDIS_URL": None,
    "ALLOWED_ORIGINS": [],
    "MAX_UNAUTHENTICATED_PER_ADDRESS": None,
    "MAX_QUERIES": 20,
    "QUERY_MAX_ROWS": 200,
}
# tests/settings.py sets this one; every other setting is left at its default there.
SET_BY_TEST_SETTINGS = {"SCOPE_MODEL": "testapp.Workspace"}


@pytest.fixture
def fresh_transport() -> Iterator[None]:
    """Start and end without a cached transport, so no test sees another's."""
    reset_transport()
    yield
    reset_transport()


def test_every_documented_setting_and_no_other_exists() -> None:
    assert set(defaults()) == {PREFIX + name for name in DOCUMENTED}


@pytest.mark.parametrize(("name", "default"), DOCUMENTED.items())
def test_documented_default_is_the_default(name: str, default: Any) -> None:
    assert defaults()[PREFIX + name] == default
    assert type(defaults()[PREFIX + name]) is type(default)


@pytest.mark.parametrize(("name", "default"), DOCUMENTED.items())
def test_conf_without_override_reads_the_default(name: str, default: Any) -> None:
    expected = SET_BY_TEST_SETTINGS.get(name, default)
    assert getattr(conf, name) == expected
    assert raw(name) == expected


def test_scope_model_of_test_settings_is_read_instead_of_its_default() -> None:
    assert conf.SCOPE_MODEL == "testapp.Workspace"
    assert defaults()["REALTIME_SCOPE_MODEL"] is None


def test_conf_reads_an_overridden_setting_at_call_time() -> None:
    assert conf.POLLING_INTERVAL == 0.1
    with override_settings(REALTIME_POLLING_INTERVAL=0.5):
        assert conf.POLLING_INTERVAL == 0.5
        with override_settings(REALTIME_POLLING_INTERVAL=2):
            assert conf.POLLING_INTERVAL == 2.0
        assert conf.POLLING_INTERVAL == 0.5
    assert conf.POLLING_INTERVAL == 0.1


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("TRANSPORT", "realtime.transports.table.TableTransport", None),
        ("SCOPE_MODEL", None, None),
        ("CHANNEL", "feed", None),
        ("TOKEN_MAX_AGE", 60, 60.0),
        ("MAX_CHANNELS", 5, None),
        ("AUTO_TRIM", False, None),
        ("RECHECK_MODELS", {"testapp.Membership": "user"}, None),
        ("LISTEN_DATABASE", "host=x dbname=y", None),
    ],
)
def test_conf_reads_every_kind_of_overridden_setting(name: str, value: Any, expected: Any) -> None:
    with override_settings(**{PREFIX + name: value}):
        assert getattr(conf, name) == (value if expected is None else expected)
        assert raw(name) == value


def test_number_setting_given_as_int_is_read_as_float() -> None:
    with override_settings(REALTIME_TOKEN_MAX_AGE=60):
        value = conf.TOKEN_MAX_AGE
    assert value == 60.0
    assert isinstance(value, float)
    assert isinstance(conf.TOKEN_MAX_AGE, float)


def test_raw_returns_the_value_as_written() -> None:
    with override_settings(REALTIME_POLLING_INTERVAL="fast"):
        assert raw("POLLING_INTERVAL") == "fast"


def test_mutating_read_recheck_models_leaves_the_default_alone() -> None:
    conf.RECHECK_MODELS["testapp.Membership"] = "user"
    assert conf.RECHECK_MODELS == {}
    assert defaults()["REALTIME_RECHECK_MODELS"] == {}


@pytest.mark.usefixtures("fresh_transport")
def test_default_transport_is_a_table_transport_built_once() -> None:
    transport = get_transport()
    assert isinstance(transport, TableTransport)
    assert get_transport() is transport


@pytest.mark.usefixtures("fresh_transport")
def test_transport_is_rebuilt_after_a_realtime_setting_changes() -> None:
    before = get_transport()
    assert isinstance(before, TableTransport)
    assert before.polling_interval == 0.1
    with override_settings(REALTIME_POLLING_INTERVAL=0.5):
        during = get_transport()
        assert during is not before
        assert isinstance(during, TableTransport)
        assert during.polling_interval == 0.5
        assert get_transport() is during
    after = get_transport()
    assert after is not during
    assert isinstance(after, TableTransport)
    assert after.polling_interval == 0.1


@pytest.mark.usefixtures("fresh_transport")
def test_transport_is_kept_when_a_non_realtime_setting_changes() -> None:
    before = get_transport()
    with override_settings(USE_I18N=False):
        assert get_transport() is before
    assert get_transport() is before


@pytest.mark.usefixtures("fresh_transport")
def test_transport_and_its_sockets_are_kept_when_a_setting_it_does_not_read_changes() -> None:
    before = get_transport()
    with override_settings(REALTIME_CASCADE_LIMIT=5, REALTIME_MAX_SOCKETS_PER_USER=3):
        assert get_transport() is before
    assert get_transport() is before


def test_every_setting_the_transports_read_drops_the_transport_when_it_changes() -> None:
    read: set[str] = set()
    for source in (Path(transports.__file__).parent).glob("*.py"):
        read |= set(re.findall(r"\bconf\.([A-Z_]+)", source.read_text()))
    assert read == TRANSPORT_SETTINGS


@pytest.mark.usefixtures("fresh_transport")
def test_unimportable_transport_setting_fails_get_transport() -> None:
    with (
        override_settings(REALTIME_TRANSPORT="nope.Transport"),
        pytest.raises(ImproperlyConfigured, match="cannot be imported"),
    ):
        get_transport()


def test_table_transport_takes_its_options_from_settings() -> None:
    with override_settings(
        REALTIME_POLLING_INTERVAL=0.25,
        REALTIME_COMMIT_GRACE=2,
        REALTIME_MESSAGE_RETENTION=60,
        REALTIME_AUTO_TRIM=False,
        REALTIME_TRIM_BATCH_SIZE=7,
        REALTIME_MAX_PAYLOAD=1000,
    ):
        transport = TableTransport()
    assert transport.polling_interval == 0.25
    assert transport.commit_grace == 2.0
    assert transport.trimmer.retention == 60.0
    assert transport.trimmer.auto is False
    assert transport.trimmer.batch_size == 7
    assert transport.max_message_bytes == 1000


def test_table_transport_arguments_win_over_settings() -> None:
    transport = TableTransport(
        polling_interval=0.5, commit_grace=1.0, retention=0, trim_batch_size=3, max_payload=10
    )
    assert transport.polling_interval == 0.5
    assert transport.commit_grace == 1.0
    assert transport.trimmer.retention == 0
    assert transport.trimmer.batch_size == 3
    assert transport.max_message_bytes == 10


@pytest.mark.parametrize(
    "options",
    [
        {"polling_interval": 0},
        {"polling_interval": -0.1},
        {"commit_grace": -1},
        {"commit_grace": 0},
        {"retention": -1},
        {"trim_batch_size": 0},
        {"max_payload": 0},
    ],
    ids=repr,
)
def test_table_transport_with_out_of_range_option_is_improperly_configured(
    options: dict[str, Any],
) -> None:
    with pytest.raises(ImproperlyConfigured, match="table transport"):
        TableTransport(**options)
