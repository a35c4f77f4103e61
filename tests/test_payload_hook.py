"""``@realtime_model(payload=...)`` in the writing process: refused at decoration unless
callable, its values in the JSON forms of declared fields or refused, its failures logged
within their place's budget, and a payload that does not query costs a bulk write no
statement (what readers hear over sockets: ``test_payload_hook_e2e``)."""

from __future__ import annotations

import contextlib
import datetime
import decimal
import logging
import math
import uuid
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils.functional import lazy
from psycopg.types.range import Range

from realtime import announce, realtime_model, silent
from realtime.encoding import jsonable, strict_jsonable
from realtime.logs import PLACE_LINES_PER_MINUTE
from tests.helpers import events, forget_messages
from tests.testapp.models import Card, Company, Workspace

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def acme() -> Workspace:
    return Workspace.objects.create(name="Acme", slug="acme")


@pytest.mark.parametrize("payload", ["company_name", {"a": 1}, 3])
def test_a_payload_that_is_not_callable_raises_value_error(payload: Any) -> None:
    with pytest.raises(ValueError, match="payload must be a callable"):
        realtime_model(payload=payload)


def test_a_payloads_values_take_the_json_forms_of_declared_fields() -> None:
    key = uuid.UUID("6f1c2d3e-0000-4000-8000-000000000001")
    value = {
        "when": datetime.datetime(2026, 9, 15, 12, 30, tzinfo=datetime.UTC),
        "day": datetime.date(2026, 9, 15),
        "nested": [{"price": decimal.Decimal("1.50"), "key": key}, ("a", 2, None, True, 0.5)],
        "lazy": lazy(lambda: "text", str)(),
    }

    assert strict_jsonable(value) == {
        "when": "2026-09-15T12:30:00+00:00",
        "day": "2026-09-15",
        "nested": [{"price": "1.50", "key": str(key)}, ["a", 2, None, True, 0.5]],
        "lazy": "text",
    }


def test_durations_and_ranges_take_one_json_form_in_a_payload_and_in_declared_fields() -> None:
    """A duration in ISO 8601 as Django writes it; a range (what PostgreSQL's range fields
    hold) as its bounds, as Django's serializers write it, or ``{"empty": true}``."""
    when = datetime.datetime(
        2026, 9, 15, 14, 30, tzinfo=datetime.timezone(datetime.timedelta(hours=2))
    )
    value = {
        "span": datetime.timedelta(days=1, hours=2, microseconds=5),
        "ints": Range(1, 5, "[]"),
        "open": Range(None, when),
        "none": Range(empty=True),
    }
    expected = {
        "span": "P1DT02H00M00.000005S",
        "ints": {"lower": 1, "upper": 5, "bounds": "[]"},
        "open": {"lower": None, "upper": "2026-09-15T12:30:00+00:00", "bounds": "()"},
        "none": {"empty": True},
    }
    assert strict_jsonable(value) == expected
    assert {name: jsonable(item) for name, item in value.items()} == expected


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ({"thing": object()}, "thing: a object"),
        ({"tags": {"a", "b"}}, "tags: a set"),
        ({"rows": [1, {"row": Workspace()}]}, r"rows\[1\].row: a Workspace"),
        ({1: "one"}, "a key that is not text"),
        ({"ratio": math.nan}, "ratio: nan has no JSON form"),
    ],
)
def test_a_value_with_no_json_form_is_refused_not_sent_as_text(value: Any, where: str) -> None:
    with pytest.raises(TypeError, match=where):
        strict_jsonable(value)


def test_announce_carries_the_payloads_keys(acme: Workspace) -> None:
    card = Card.objects.create(workspace=acme, label="raw")
    forget_messages()

    announce(card, "updated", changed=["label"])

    (event,) = events()
    assert event["data"] == {
        "model": "card",
        "id": card.pk,
        "label": "raw",
        "company_name": None,
        "shout": "RAW",
        "due": None,
        "price": None,
    }


@pytest.mark.parametrize("write", ["create", "delete"])
def test_a_payload_catching_its_failed_query_leaves_the_writes_transaction_usable(
    acme: Workspace, write: str
) -> None:
    # On PostgreSQL the failed statement aborts the transaction, caught or not: realtime rolls
    # back to the savepoint it opened before the payload's first query.
    if write == "delete":
        card = Card.objects.create(workspace=acme, label="swallows")
    forget_messages()

    with transaction.atomic():
        if write == "create":
            card = Card.objects.create(workspace=acme, label="swallows")
        else:
            Card.objects.filter(pk=card.pk).delete()
        beta = Workspace.objects.create(name="Beta", slug="beta")  # the write goes on

    assert Card.objects.filter(pk=card.pk).exists() == (write == "create")
    assert Workspace.objects.filter(pk=beta.pk).exists()
    # What the payload returned after catching its error is announced.
    data = {"model": "card", "id": card.pk, "label": "swallows", "company_name": None}
    data |= {"shout": "SWALLOWS", "due": None, "price": None}
    assert [(e["event_type"], e["data"]) for e in events() if e["data"]["model"] == "card"] == [
        (f"card.{write}d", data)
    ]


def test_a_payload_failing_on_every_row_of_a_bulk_write_logs_within_its_places_budget(
    acme: Workspace, caplog: pytest.LogCaptureFixture
) -> None:
    Card.objects.bulk_create([Card(workspace=acme, label=f"c{i}") for i in range(12)])
    forget_messages()

    assert Card.objects.update(label="raises") == 12

    assert events() == []
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == PLACE_LINES_PER_MINUTE
    assert all(r.exc_info is not None for r in errors)
    # Another model's failures have a budget of their own: a company's announcements go on.
    Company.objects.create(workspace=acme, name="Initech")
    assert [e["event_type"] for e in events()] == ["company.created"]


def statements(run: Any) -> int:
    """The statements ``run`` sends in its transaction (the publication after commit, one
    INSERT per slice of messages, left out)."""
    with transaction.atomic(), CaptureQueriesContext(connection) as captured:
        run()
    return len(captured.captured_queries)


@pytest.mark.parametrize("write", ["update", "bulk_create", "bulk_update"])
def test_a_payload_that_does_not_query_costs_a_bulk_write_no_statement(
    acme: Workspace, write: str, settings: Any
) -> None:
    settings.REALTIME_TRANSPORT = "table"

    def run(count: int) -> int:
        """The statements realtime adds to the write of ``count`` cards."""
        added = 0
        for quiet in (False, True):
            made = Card.objects.bulk_create(
                [Card(workspace=acme, label=f"c{i}") for i in range(count)]
            )

            def bulk(made: list[Card] = made) -> None:
                if write == "update":
                    Card.objects.filter(workspace=acme).update(label="renamed")
                elif write == "bulk_create":
                    Card.objects.bulk_create(
                        [Card(workspace=acme, label=f"n{i}") for i in range(count)]
                    )
                else:
                    for card in made:
                        card.label += "!"
                    Card.objects.bulk_update(made, ["label"], batch_size=1000)

            with silent() if quiet else contextlib.nullcontext():
                used = statements(bulk)
            added += -used if quiet else used
            Card.objects.all().delete()
        return added

    assert run(10) == run(300)
