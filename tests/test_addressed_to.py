"""Reading an account message's ``user_ids`` from its end, without decoding the rest: every
worker hears every account's events, and decodes only those of accounts it holds."""

from __future__ import annotations

import json

import pytest

from realtime.messages import addressed_to, asks_recheck
from realtime.writes.packing import recheck_messages, users_messages


def test_realtimes_account_messages_are_read_from_their_end() -> None:
    tricky = {"user_ids": [9], "text": '"user_ids":[7]}', "nested": {"user_ids": [8]}}
    for _, payload in users_messages(
        [3, 1, 2], "note.created", tricky, channels=None, meta={}, budget=None, row=True
    ):
        assert addressed_to(payload) == [1, 2, 3]
        assert json.loads(payload)["user_ids"] == [1, 2, 3]
    (_, recheck), *_ = recheck_messages(["b", "a"], budget=None)
    assert addressed_to(recheck) == ["a", "b"]


@pytest.mark.parametrize(
    "message",
    [
        {"user_ids": [1], "data": {"user_ids": [5]}},  # a nested key comes last
        {"data": {"user_ids": [5]}},  # only a nested one
        {"target": "scope", "scope_id": 1, "data": {"x": "user_ids"}},
        {"user_ids": "not a list"},
    ],
)
def test_another_layout_is_left_to_a_whole_decoding(message: dict[str, object]) -> None:
    assert addressed_to(json.dumps(message).encode()) is None


def test_a_top_level_key_before_others_is_still_read() -> None:
    assert addressed_to(json.dumps({"user_ids": [1], "exclude": [2]}).encode()) == [1]


def test_a_recheck_is_read_by_every_worker() -> None:
    # Its user_ids are still read, but a worker holding none of them decodes it too: it
    # remembers the request for the sockets in their handshake, and the sessions it names
    # for the sockets still to come with their tokens.
    (_, ended), *_ = recheck_messages(["a"], budget=None, ended_sessions=["0123abcd"])
    assert asks_recheck(ended)
    assert json.loads(ended)["ended_sessions"] == ["0123abcd"]
    (_, plain), *_ = recheck_messages(["a"], budget=None)
    assert asks_recheck(plain)
    assert "ended_sessions" not in json.loads(plain)
    (_, event), *_ = users_messages(
        ["a"], "note.created", {}, channels=None, meta={}, budget=None, row=True
    )
    assert not asks_recheck(event)
