"""Which ``Origin`` headers ``realtime.origins`` admits, and the check of
``REALTIME_ALLOWED_ORIGINS`` (``realtime.E012``).

The rules are pure functions of the header and the two settings; the handshake itself (HTTP
403 for a refused origin) is tested over real daphne servers in ``test_native_clients.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from realtime.checks.settings import check_settings
from realtime.origins import Origin, origin_admitted, parse_origin

HOSTS = ["api.example.com", ".example.org", "[::1]", "127.0.0.1"]


def test_a_handshake_without_origin_is_admitted_whatever_the_settings() -> None:
    assert origin_admitted(None, [], [])


@pytest.mark.parametrize(
    "header",
    [
        "https://api.example.com",
        "http://api.example.com:8000",
        "https://API.Example.com",
        "https://example.org",
        "https://www.example.org",
        "http://[::1]:8000",
        "http://127.0.0.1:5173",
    ],
)
def test_an_origin_whose_host_is_in_allowed_hosts_is_admitted_on_any_scheme_and_port(
    header: str,
) -> None:
    assert origin_admitted(header, HOSTS, [])


@pytest.mark.parametrize(
    "header",
    [
        "https://evil.example.net",
        "https://api.example.com.evil.net",
        "https://notexample.org",
        "null",
        "",
        "api.example.com",
        "https://api.example.com:port",
    ],
)
def test_a_foreign_null_or_unreadable_origin_is_refused(header: str) -> None:
    assert not origin_admitted(header, HOSTS, ["https://app.example.net"])


def test_a_star_in_allowed_hosts_admits_every_origin() -> None:
    assert origin_admitted("https://anything.example.net", ["*"], [])


def test_an_allowed_hosts_entry_with_a_port_matches_the_host() -> None:
    assert origin_admitted("https://api.example.com", ["api.example.com:8443"], [])


@pytest.mark.parametrize(
    "header",
    ["https://app.example.net", "https://app.example.net:443", "HTTPS://APP.example.net"],
)
def test_an_origin_listed_in_realtime_allowed_origins_is_admitted(header: str) -> None:
    assert origin_admitted(header, HOSTS, ["https://app.example.net"])


@pytest.mark.parametrize(
    "header",
    ["http://app.example.net", "https://app.example.net:8443", "https://www.app.example.net"],
)
def test_a_listed_origin_admits_only_its_own_scheme_host_and_port(header: str) -> None:
    assert not origin_admitted(header, HOSTS, ["https://app.example.net"])


def test_an_unreadable_listed_origin_admits_nothing() -> None:
    assert not origin_admitted("https://app.example.net", [], ["app.example.net", 42])


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("https://app.example.com", Origin("https", "app.example.com", 443)),
        ("http://localhost:5173", Origin("http", "localhost", 5173)),
        ("capacitor://localhost", Origin("capacitor", "localhost", None)),
    ],
)
def test_an_origin_is_read_with_its_default_port(value: str, expected: Origin) -> None:
    assert parse_origin(value) == expected


def e012(value: Any) -> list[str | None]:
    with override_settings(REALTIME_ALLOWED_ORIGINS=value):
        messages = check_settings()
    assert all(message.hint for message in messages)
    return [message.id for message in messages]


@pytest.mark.parametrize(
    "value",
    [
        "https://app.example.com",
        None,
        {"https://app.example.com"},
        ["app.example.com"],
        ["https://app.example.com/"],
        ["https://app.example.com/path"],
        ["https://app.example.com:port"],
        [42],
        ["*"],
    ],
)
def test_allowed_origins_that_are_not_a_list_of_origins_are_error_e012(value: Any) -> None:
    assert e012(value) == ["realtime.E012"]


def test_each_bad_allowed_origin_is_its_own_e012() -> None:
    assert e012(["https://ok.example.com", "bad", "https://x.example.com/p"]) == [
        "realtime.E012",
        "realtime.E012",
    ]


@pytest.mark.parametrize(
    "value",
    [[], (), ["https://app.example.com", "http://localhost:5173", "capacitor://localhost"]],
)
def test_allowed_origins_of_scheme_host_and_port_pass(value: Any) -> None:
    assert e012(value) == []
