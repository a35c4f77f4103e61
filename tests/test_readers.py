"""Who may still read a row, asked for a resume's page of account events at once: the rows of
one model are read in one query, and each event is decided as ``readers_now`` would."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext

from realtime.encoding import normal_id
from realtime.readers import Row, readers_now, readers_now_many
from realtime.registry import options_named
from tests.testapp.models import Notification

pytestmark = pytest.mark.django_db


def users(*names: str) -> list[Any]:
    return [get_user_model().objects.create_user(username=name) for name in names]


def ask(note: Any, *accounts: Any) -> Any:
    options = options_named("notification")
    assert options is not None
    data = {"model": "notification", "id": normal_id(note.pk), "text": note.text}
    row = Row(options, normal_id(note.pk))
    return (row, "notification.updated", data, [a.pk for a in accounts])


def test_a_page_of_rows_is_read_in_one_query_and_each_decided_alone() -> None:
    ann, bob = users("ann", "bob")
    for_ann = [Notification.objects.create(user=ann, text=f"a{n}") for n in range(3)]
    for_bob = Notification.objects.create(user=bob, text="b")
    gone = Notification.objects.create(user=ann, text="gone")
    asks = [*(ask(note, ann, bob) for note in for_ann), ask(for_bob, ann, bob), ask(gone, ann)]
    gone.delete()
    with CaptureQueriesContext(connection) as queries:
        answers = readers_now_many(asks)
    assert answers == [[normal_id(ann.pk)]] * 3 + [[normal_id(bob.pk)], []]
    assert len(queries.captured_queries) == 1
    # The same answers, one at a time.
    assert [readers_now(*a) for a in asks] == answers


def test_an_ask_without_accounts_reads_nothing() -> None:
    (ann,) = users("ann")
    note = Notification.objects.create(user=ann, text="a")
    with CaptureQueriesContext(connection) as queries:
        assert readers_now_many([ask(note)]) == [[]]
    assert queries.captured_queries == []
