"""Resume cursors: positions signed for one account, readable on any worker, unforgeable."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.test import override_settings

from realtime.positions import GLOBAL, Vector, global_position, mark_of
from realtime.sockets.cursors import MAX_LENGTH, cursor_for, position_of, read_cursor


def at(offset: int) -> Vector:
    """Where a socket is at log id ``offset`` of a global log."""
    return Vector({GLOBAL: ("", offset)})


def test_a_cursor_reads_back_as_its_position_for_its_account() -> None:
    cursor = cursor_for(5, at(123_456))
    assert position_of(5, cursor) == 123_456
    assert cursor.isascii()
    assert len(cursor) <= 256


def test_a_cursor_of_another_account_reads_as_nothing() -> None:
    assert position_of(6, cursor_for(5, at(10))) is None
    assert position_of("5", cursor_for("6f1c", at(10))) is None


def test_uuid_and_text_account_ids_sign_their_cursors_too() -> None:
    cursor = cursor_for("6f1c0a2e-0000-4000-8000-000000000000", at(7))
    assert position_of("6f1c0a2e-0000-4000-8000-000000000000", cursor) == 7


@pytest.mark.parametrize(
    "cursor",
    ["", "x", "1.2", "1.2.3.4", "a" * 300, "é.1.x", None, 42, ["1", "2", "3"], "zz.zz.zz"],
    ids=repr,
)
def test_garbage_reads_as_nothing(cursor: Any) -> None:
    assert position_of(5, cursor) is None


def test_a_forged_position_or_time_reads_as_nothing() -> None:
    position, stamp, signature = cursor_for(5, at(100)).split(".")
    assert position_of(5, f"{position}0.{stamp}.{signature}") is None
    assert position_of(5, f"{position}.{stamp}1.{signature}") is None
    flipped = ("A" if signature[0] != "A" else "B") + signature[1:]
    assert position_of(5, f"{position}.{stamp}.{flipped}") is None


@override_settings(REALTIME_RESUME_WINDOW=300)
def test_a_cursor_older_than_the_resume_window_reads_as_nothing() -> None:
    handed_out = time.time() - 301
    assert position_of(5, cursor_for(5, at(9), now=handed_out)) is None
    assert position_of(5, cursor_for(5, at(9), now=time.time() - 299)) == 9


def test_a_cursor_from_far_in_the_future_reads_as_nothing() -> None:
    assert position_of(5, cursor_for(5, at(9), now=time.time() + 3600)) is None


def test_a_cursor_without_a_position_reads_as_nothing() -> None:
    assert position_of(5, cursor_for(5, None)) is None


def test_cursors_signed_with_a_rotated_secret_still_read() -> None:
    with override_settings(SECRET_KEY="the-old-secret-of-this-test-suite"):
        cursor = cursor_for(5, at(77))
    with override_settings(SECRET_KEY_FALLBACKS=["the-old-secret-of-this-test-suite"]):
        assert position_of(5, cursor) == 77
    assert position_of(5, cursor) is None


def test_a_global_log_cursor_is_the_log_id_in_base_36_then_the_time_then_the_signature() -> None:
    where, stamp, signature = cursor_for(5, at(46_656), now=36).split(".")
    assert (where, stamp, len(signature)) == ("1000", "10", 22)
    assert cursor_for(5, None, now=36).split(".")[:2] == ["-", "10"]


def test_a_global_log_cursor_names_the_message_at_its_position_by_its_mark() -> None:
    marked = Vector({GLOBAL: ("8badf00d", 46_656)})
    cursor = cursor_for(5, marked, now=time.time(), heard=["realtime_12"])
    assert cursor.split(".")[0].split("~")[0] == "1000_8badf00d"
    assert read_cursor(5, cursor, heard=["realtime_12"]) == marked
    assert position_of(5, cursor) == 46_656
    # The form of cursors made before marks were reads as a position bound to no message.
    assert read_cursor(5, cursor_for(5, at(46_656))) == at(46_656)


def test_a_global_log_cursor_with_its_mark_names_up_to_42_scopes() -> None:
    widest = Vector({GLOBAL: (mark_of(b"\x00\x00\x00\x02"), 36**4)})  # 8 characters of mark
    assert len(widest[GLOBAL][0]) == 8
    heard = [f"realtime_{n}" for n in range(43)]
    assert read_cursor(5, cursor_for(5, widest, heard=heard[:42]), heard=heard[:42]) == widest
    assert cursor_for(5, widest, heard=heard).startswith("-.")


def test_a_global_position_is_reached_by_its_offset_whatever_their_marks() -> None:
    # A mark is no epoch: another mark at a lower offset is not a log made anew.
    where = Vector({GLOBAL: ("abc", 10)})
    assert where.reached(global_position(10, "xyz"))
    assert where.reached(global_position(9, "xyz"))
    assert not where.reached(global_position(11, "xyz"))
    assert not Vector().reached(global_position(1, "xyz"))


def test_a_global_position_covers_another_by_its_offset_whatever_their_marks() -> None:
    where = Vector({GLOBAL: ("abc", 10)})
    assert where.covers(global_position(10, "xyz"))
    assert where.covers(global_position(9))
    assert not where.covers(global_position(11, "abc"))
    assert where.advanced(global_position(9, "xyz")) == where
    assert where.advanced(global_position(11, "xyz")) == Vector({GLOBAL: ("xyz", 11)})
    assert at(10).advanced(global_position(10, "xyz")) == Vector({GLOBAL: ("xyz", 10)})
    assert where.merged(at(10)) == where


STREAMS = ["realtime", "realtime_12", "realtime_13"]


def test_a_stream_cursor_reads_back_among_the_streams_the_socket_hears() -> None:
    where = Vector({"realtime": ("AbCdEfGhIjKl", 7), "realtime_12": ("zz-_0123abcd", 1_000_000)})
    cursor = cursor_for(5, where)
    assert cursor.startswith("2.")
    # Epochs come back as the cursor keeps them: their first characters.
    assert read_cursor(5, cursor, STREAMS) == Vector(
        {"realtime": ("AbCdEf", 7), "realtime_12": ("zz-_01", 1_000_000)}
    )
    # A stream the socket no longer hears is left out.
    assert read_cursor(5, cursor, ["realtime_12"]) == Vector({"realtime_12": ("zz-_01", 1_000_000)})
    assert read_cursor(6, cursor, STREAMS) is None
    assert position_of(5, cursor) is None


def test_a_stream_cursor_too_long_for_the_limit_names_no_position() -> None:
    wide = Vector({f"realtime_{n}": ("AbCdEfGhIjKl", 10_000 + n) for n in range(40)})
    cursor = cursor_for(5, wide)
    assert len(cursor) <= MAX_LENGTH
    assert cursor.startswith("-.")
    assert read_cursor(5, cursor, list(wide)) is None


def test_a_forged_stream_entry_reads_as_nothing() -> None:
    cursor = cursor_for(5, Vector({"realtime_12": ("AbCdEfGhIjKl", 7)}))
    kind, entries, stamp, signature = cursor.split(".")
    assert read_cursor(5, f"{kind}.{entries}0.{stamp}.{signature}", STREAMS) is None


def test_a_global_log_cursor_names_the_scopes_its_socket_heard() -> None:
    cursor = cursor_for(5, at(46_656), now=time.time(), heard=["realtime_12", "realtime_13"])
    where = cursor.split(".")[0]
    assert where.split("~")[0] == "1000"
    assert len(where.split("~")) == 3
    # Read back by a socket hearing those scopes or fewer (a scope lost while away).
    assert read_cursor(5, cursor, heard=["realtime_12", "realtime_13"]) == at(46_656)
    assert read_cursor(5, cursor, heard=["realtime_13"]) == at(46_656)
    assert read_cursor(5, cursor) == at(46_656)
    # Not by one hearing a scope the cursor does not name (joined while away, asked for now).
    assert read_cursor(5, cursor, heard=["realtime_12", "realtime_14"]) is None
    assert read_cursor(5, cursor_for(5, at(7)), heard=["realtime_12"]) is None


def test_a_forged_scope_of_a_global_log_cursor_reads_as_nothing() -> None:
    cursor = cursor_for(5, at(7), heard=["realtime_12"])
    where, stamp, signature = cursor.split(".")
    added = cursor_for(5, at(7), heard=["realtime_12", "realtime_14"]).split(".")[0]
    assert read_cursor(5, f"{added}.{stamp}.{signature}", heard=["realtime_14"]) is None
    assert read_cursor(5, f"{where}~abc.{stamp}.{signature}") is None


def test_a_global_log_cursor_naming_too_many_scopes_for_the_limit_names_no_position() -> None:
    heard = [f"realtime_{n}" for n in range(60)]
    cursor = cursor_for(5, at(7), heard=heard)
    assert len(cursor) <= MAX_LENGTH
    assert cursor.startswith("-.")
    assert read_cursor(5, cursor, heard=heard) is None
