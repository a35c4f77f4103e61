"""``realtime.chunks``: the one slicer of lists too long for one statement, on both sides.

The limit it slices ids by is read at each call, so a lowered ``MAX_IDS_PER_MESSAGE`` reaches
every reader of many ids: the auth hooks, the recheck's column read and the audience check,
counted here statement by statement on the real test database.
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext

from realtime import limits
from realtime.auth import RealtimeAuth, issue_token
from realtime.chunks import chunked, grouped_chunks, id_chunks, weighed_chunks
from realtime.sockets import standing


def test_chunked_keeps_every_value_in_order_in_slices_of_at_most_size() -> None:
    assert [list(chunk) for chunk in chunked(range(7), 3)] == [[0, 1, 2], [3, 4, 5], [6]]
    assert [list(chunk) for chunk in chunked(range(6), 3)] == [[0, 1, 2], [3, 4, 5]]
    assert list(chunked([], 3)) == []


def test_weighed_chunks_keep_every_value_in_order_within_a_count_and_a_weight() -> None:
    def sliced(values: list[int], size: int, most: int) -> list[list[int]]:
        return [list(chunk) for chunk in weighed_chunks(values, size, most, lambda v: v)]

    assert sliced([1, 1, 1, 1, 1], 2, 10) == [[1, 1], [1, 1], [1]]  # by count
    assert sliced([4, 4, 4, 1], 10, 8) == [[4, 4], [4, 1]]  # by weight
    assert sliced([3, 20, 3], 10, 8) == [[3], [20], [3]]  # a heavy one alone
    assert sliced([], 3, 8) == []


def test_grouped_chunks_never_part_a_group_and_keep_the_order_within_a_slice() -> None:
    def slices(values: str, size: int) -> list[str]:
        return ["".join(chunk) for chunk in grouped_chunks(values, size, str.lower)]

    assert slices("aAbB", 4) == ["aAbB"]  # fits: as it is
    assert slices("abAcBaC", 4) == ["aAa", "bcBC"]  # whole groups, their items in order
    assert slices("abABBB", 3) == ["aA", "bBBB"]  # a group over the size goes alone
    # Made again from fewer items, each group is still whole in one slice.
    assert slices("abAcBC", 4) == ["abAB", "cC"]
    assert grouped_chunks([], 3, str) == []


def test_id_chunks_follow_the_id_limit_in_force_at_each_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(limits, "MAX_IDS_PER_MESSAGE", 2)
    assert [list(chunk) for chunk in id_chunks([1, 2, 3])] == [[1, 2], [3]]


@pytest.mark.django_db
def test_accounts_of_many_tokens_are_read_in_statements_of_the_id_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    users = [get_user_model().objects.create_user(username=f"c{index}") for index in range(5)]
    tokens = [issue_token(user) for user in users]
    monkeypatch.setattr(limits, "MAX_IDS_PER_MESSAGE", 2)
    with CaptureQueriesContext(connection) as by_instances:
        found = RealtimeAuth().users_of_tokens(tokens)
    with CaptureQueriesContext(connection) as by_columns:
        accounts = standing.accounts_of_tokens(tokens)
    assert [getattr(user, "pk", None) for user in found] == [user.pk for user in users]
    assert accounts is not None
    assert [getattr(account, "pk", None) for account in accounts] == [user.pk for user in users]
    assert len(by_instances) == len(by_columns) == 3
