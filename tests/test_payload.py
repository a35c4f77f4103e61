"""``realtime.writes.packing``: the JSON of internal messages, their shapes and channels, and how a
message is shrunk, split or dropped to fit a transport's budget."""

from __future__ import annotations

import datetime
import decimal
import json
import logging
import uuid
import zoneinfo
from typing import Any

import pytest
from django.test import override_settings

from realtime import limits
from realtime.encoding import encode
from realtime.sockets.protocol import encode as encode_frame
from realtime.writes.packing import fit, recheck_messages, scope_messages, users_messages
from tests.helpers import without_mid

DATA = {"model": "contact", "id": 7, "name": "Zoë", "notes": "n" * 300}
META = {"origin": "tab-1", "changed": ["name", "notes"]}


def scope_message(**changes: Any) -> dict[str, Any]:
    """A scope message as ``scope_messages`` builds it, with a fixed ``mid``."""
    message: dict[str, Any] = {
        "target": "scope",
        "scope_id": 3,
        "event_type": "contact.updated",
        "data": dict(DATA),
        "channels": ["contact", "contact:7"],
        "meta": dict(META),
        "mid": uuid.uuid4().hex,
    }
    return {**message, **changes}


def decoded(messages: list[tuple[str, bytes]]) -> list[dict[str, Any]]:
    return [json.loads(body) for _, body in messages]


def records_at(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == level and r.name.startswith("realtime")]


# Encoding -----------------------------------------------------------------------------------


def test_encoding_is_compact() -> None:
    assert encode({"a": 1, "b": [1, 2], "c": {"d": None}}) == b'{"a":1,"b":[1,2],"c":{"d":null}}'


def test_encoding_keeps_non_ascii_as_utf8() -> None:
    assert encode({"name": "Zoë 東京 🚀"}) == '{"name":"Zoë 東京 🚀"}'.encode()


def test_aware_datetime_is_written_in_utc_with_microseconds() -> None:
    value = datetime.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=datetime.UTC)
    assert encode({"at": value}) == b'{"at":"2024-05-06T07:08:09.123456+00:00"}'


@pytest.mark.parametrize(
    "zone",
    [zoneinfo.ZoneInfo("Europe/Paris"), datetime.timezone(datetime.timedelta(hours=2))],
    ids=["paris", "fixed_offset"],
)
def test_datetime_in_another_zone_is_converted_to_utc(zone: datetime.tzinfo) -> None:
    value = datetime.datetime(2024, 5, 6, 9, 8, 9, 123456, tzinfo=zone)
    assert encode({"at": value}) == b'{"at":"2024-05-06T07:08:09.123456+00:00"}'


def test_naive_datetime_is_written_as_is() -> None:
    value = datetime.datetime(2024, 5, 6, 7, 8, 9, 500)
    assert encode({"at": value}) == b'{"at":"2024-05-06T07:08:09.000500"}'


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (datetime.date(2024, 2, 29), "2024-02-29"),
        (datetime.time(7, 8, 9, 123), "07:08:09.000123"),
        (decimal.Decimal("12.50"), "12.50"),
        (uuid.UUID("12345678-1234-5678-1234-567812345678"), "12345678-1234-5678-1234-567812345678"),
    ],
    ids=["date", "time", "decimal", "uuid"],
)
def test_dates_times_decimals_and_uuids_are_written_as_strings(value: Any, text: str) -> None:
    assert encode({"v": value, "nested": [value]}) == json.dumps(
        {"v": text, "nested": [text]}, separators=(",", ":")
    ).encode("utf-8")


def test_floats_json_cannot_hold_are_written_null_as_javascript_writes_them() -> None:
    # Python writes NaN and Infinity as bare words no JSON parser reads: a client would drop
    # the whole frame. A float column, or a JSONField on SQLite, can hold them.
    message = {"ratio": float("inf"), "meta": {"x": [float("nan"), 1.5, (float("-inf"),)]}}
    assert encode(message) == b'{"ratio":null,"meta":{"x":[null,1.5,[null]]}}'


def test_frames_to_sockets_write_floats_json_cannot_hold_null() -> None:
    frame = {"type": "query.rows", "rows": [{"id": 1, "ratio": float("nan")}]}
    assert json.loads(encode_frame(frame)) == {
        "type": "query.rows",
        "rows": [{"id": 1, "ratio": None}],
    }


@pytest.mark.parametrize("value", [b"xy", bytearray(b"xy"), memoryview(b"xy")])
def test_bytes_in_any_form_django_stores_are_written_as_base64(value: Any) -> None:
    assert encode({"blob": value}) == b'{"blob":"eHk="}'


# fit(): shrinking in two steps ----------------------------------------------------------------


def test_message_exactly_at_the_budget_is_unchanged() -> None:
    message = scope_message()
    expected = encode(message)
    assert fit(dict(message), len(expected)) == expected


def test_message_without_budget_is_never_shrunk() -> None:
    message = scope_message()
    assert fit(dict(message), None) == encode(message)


def test_message_one_byte_over_loses_its_data_but_keeps_identity_origin_and_changed() -> None:
    message = scope_message()
    fitted = fit(dict(message), len(encode(message)) - 1)
    assert fitted is not None
    assert json.loads(fitted) == {
        **message,
        "data": {"model": "contact", "id": 7},
        "meta": {"origin": "tab-1", "changed": ["name", "notes"], "truncated": True},
    }


@pytest.mark.parametrize(
    "data",
    [{"text": "t" * 300}, {"model": "contact", "text": "t" * 300}, "t" * 300, ["t" * 300]],
    ids=["no_identity", "model_without_id", "text", "list"],
)
def test_truncated_data_without_model_and_id_becomes_null(data: Any) -> None:
    message = scope_message(data=data)
    fitted = fit(dict(message), len(encode(message)) - 1)
    assert fitted is not None
    assert json.loads(fitted)["data"] is None
    assert json.loads(fitted)["meta"]["truncated"] is True


def test_scope_message_still_too_big_loses_its_channels() -> None:
    channels = [f"contact:{n}" for n in range(100)]
    message = scope_message(channels=channels)
    truncated = scope_message(
        channels=channels,
        data={"model": "contact", "id": 7},
        meta={**META, "truncated": True},
        mid=message["mid"],
    )
    fitted = fit(dict(message), len(encode(truncated)) - 1)
    assert fitted is not None
    assert json.loads(fitted) == {**truncated, "channels": None}


def test_an_exclude_list_is_dropped_before_the_data_or_channels(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``exclude`` is a courtesy, not a permission: a message that fits whole without it
    goes whole, without it (and a warning), rather than keeping it and losing its record."""
    channels = [f"contact:{n}" for n in range(60)]
    (whole,) = scope_messages(
        3, "contact.updated", dict(DATA), channels=channels, meta=META, budget=None
    )
    for excluded in (50, 300):
        with caplog.at_level(logging.WARNING, "realtime"):
            (sent,) = scope_messages(
                3,
                "contact.updated",
                dict(DATA),
                channels=channels,
                meta=META,
                exclude=list(range(10_000, 10_000 + excluded)),
                budget=len(whole[1]),
            )
        assert without_mid(json.loads(sent[1])) == without_mid(json.loads(whole[1]))
    assert caplog.text.count("dropping the exclude list") == 2


def test_users_message_still_too_big_keeps_its_channels_and_is_dropped() -> None:
    channels = [f"contact:{n}" for n in range(100)]
    message = {**scope_message(channels=channels), "target": "users", "user_ids": [1]}
    del message["scope_id"]
    truncated = {
        **message,
        "data": {"model": "contact", "id": 7},
        "meta": {**META, "truncated": True},
    }
    assert fit(dict(message), len(encode(truncated))) == encode(truncated)
    assert fit(dict(message), len(encode(truncated)) - 1) is None


def test_message_that_cannot_fit_even_without_data_and_channels_is_dropped() -> None:
    assert fit(scope_message(), 20) is None


def test_recheck_message_over_the_budget_is_dropped() -> None:
    assert fit({"target": "recheck", "user_ids": [1, 2, 3], "mid": uuid.uuid4().hex}, 20) is None


# Message shapes and channels -----------------------------------------------------------------


def test_scope_message_has_exactly_the_documented_keys() -> None:
    messages = scope_messages(
        3, "deal.won", {"amount": 5}, channels=None, meta={"origin": "o"}, budget=None
    )
    assert len(messages) == 1
    message = decoded(messages)[0]
    assert set(message) == {
        "target",
        "scope_id",
        "event_type",
        "data",
        "channels",
        "meta",
        "mid",
    }
    assert message["channels"] is None


def test_scope_message_sorts_and_deduplicates_exclude_and_only() -> None:
    messages = scope_messages(
        3,
        "deal.won",
        None,
        channels=["deal"],
        meta={},
        exclude=[9, 4, 9],
        about={"model": "contact", "id": 7},
        only=[8, 2, 8, 5],
        budget=None,
    )
    message = decoded(messages)[0]
    assert message["exclude"] == [4, 9]
    assert message["only"] == [2, 5, 8]
    assert message["about"] == {"model": "contact", "id": 7}
    assert message["channels"] == ["deal"]


def test_user_ids_are_deduplicated_sorted_and_sliced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "MAX_IDS_PER_MESSAGE", 2)
    messages = users_messages(
        [5, 1, 4, 2, 3, 1], "note.sent", {"x": 1}, channels=None, meta={}, budget=None
    )
    assert [m["user_ids"] for m in decoded(messages)] == [[1, 2], [3, 4], [5]]


def test_audience_of_scope_message_is_sliced_like_user_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "MAX_IDS_PER_MESSAGE", 2)
    messages = scope_messages(
        3, "deal.won", None, channels=None, meta={}, only=[5, 1, 4, 2, 3, 1], budget=None
    )
    assert [m["only"] for m in decoded(messages)] == [[1, 2], [3, 4], [5]]


def test_recheck_ids_are_deduplicated_sorted_and_sliced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "MAX_IDS_PER_MESSAGE", 2)
    messages = recheck_messages([5, 1, 4, 2, 3, 1], budget=None)
    assert [without_mid(m) for m in decoded(messages)] == [
        {"target": "recheck", "user_ids": [1, 2]},
        {"target": "recheck", "user_ids": [3, 4]},
        {"target": "recheck", "user_ids": [5]},
    ]


def test_every_message_has_its_own_mid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "MAX_IDS_PER_MESSAGE", 2)
    messages = [
        *scope_messages(3, "a", None, channels=None, meta={}, only=[1, 2, 3], budget=None),
        *scope_messages(3, "a", None, channels=None, meta={}, budget=None),
        *users_messages([1, 2, 3], "a", None, channels=None, meta={}, budget=None),
        *recheck_messages([1, 2, 3], budget=None),
    ]
    mids = [m["mid"] for m in decoded(messages)]
    assert len(messages) == 7
    assert len(set(mids)) == len(mids)
    assert all(len(mid) == 32 and int(mid, 16) >= 0 for mid in mids)


@override_settings(REALTIME_CHANNEL="rt")
def test_scope_message_goes_to_the_scope_channel() -> None:
    messages = scope_messages(42, "a", None, channels=None, meta={}, budget=None)
    assert [channel for channel, _ in messages] == ["rt_42"]


@override_settings(REALTIME_CHANNEL="rt")
def test_users_and_recheck_messages_go_to_the_base_channel() -> None:
    messages = [
        *users_messages([1], "a", None, channels=None, meta={}, skip_scope=42, budget=None),
        *recheck_messages([1], budget=None),
    ]
    assert [channel for channel, _ in messages] == ["rt", "rt"]


# Fitting lists of messages ---------------------------------------------------------------------


def test_scope_message_that_cannot_fit_is_logged_at_error_and_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    messages = scope_messages(3, "deal.won", DATA, channels=["deal"], meta=META, budget=20)
    assert messages == []
    errors = records_at(caplog, logging.ERROR)
    assert len(errors) == 1
    assert "deal.won" in errors[0].getMessage()


def test_users_message_that_cannot_fit_is_logged_at_error_and_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    messages = users_messages([1], "note.sent", DATA, channels=None, meta=META, budget=20)
    assert messages == []
    errors = records_at(caplog, logging.ERROR)
    assert len(errors) == 1
    assert "note.sent" in errors[0].getMessage()


def test_exclude_that_alone_makes_the_message_too_big_is_dropped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    identity = {"model": "contact", "id": 7}
    without = scope_messages(3, "deal.won", identity, channels=None, meta={}, budget=None)
    budget = len(without[0][1])
    messages = scope_messages(
        3,
        "deal.won",
        identity,
        channels=None,
        meta={},
        exclude=range(1000),
        budget=budget,
    )
    assert [without_mid(m) for m in decoded(messages)] == [without_mid(decoded(without)[0])]
    warnings = records_at(caplog, logging.WARNING)
    assert len(warnings) == 1
    assert "exclude" in warnings[0].getMessage()
    assert records_at(caplog, logging.ERROR) == []


def test_exclude_that_fits_is_kept() -> None:
    messages = scope_messages(
        3, "deal.won", None, channels=None, meta={}, exclude=[2, 1], budget=1000
    )
    assert decoded(messages)[0]["exclude"] == [1, 2]


def test_user_ids_are_split_further_until_each_message_fits() -> None:
    identity = {"model": "note", "id": 1}
    two = users_messages([1, 2], "note.sent", identity, channels=None, meta={}, budget=None)
    messages = users_messages(
        [4, 3, 2, 1], "note.sent", identity, channels=None, meta={}, budget=len(two[0][1])
    )
    assert [m["user_ids"] for m in decoded(messages)] == [[1, 2], [3, 4]]
    assert all(m["data"] == identity and m["meta"] == {} for m in decoded(messages))
