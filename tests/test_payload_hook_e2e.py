"""Over real sockets on a real daphne: a model's ``payload=`` adds its keys to the data of
every frame of its writes — saves, deletes, bulk writes, rows entering a view — but never to
the frame of a reader losing sight of a row; a payload that fails costs its announcement
alone, never the write, and never a removal: deletes and leave frames still go out (each
absence proved by a marker sent afterwards)."""

from __future__ import annotations

import datetime
import decimal
import logging
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, transaction

from realtime.auth import issue_token
from realtime.broadcast import broadcast_to_user
from tests.helpers import off_loop
from tests.live import Client, Clients, LiveServers
from tests.testapp.models import Card, Company, Membership, Workspace

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("each_transport")]

LOGGER = "realtime.writes.events"


def member(username: str, *workspaces: Workspace) -> tuple[Any, str]:
    user = get_user_model().objects.create_user(username=username)
    for workspace in workspaces:
        Membership.objects.create(workspace=workspace, user=user)
    return user, issue_token(user)


async def heard(client: Client, user: Any) -> list[dict[str, Any]]:
    """What the client received before a marker sent to its account now."""
    await off_loop(broadcast_to_user, user.pk, "test.marker", None)
    return await client.frames_until("test.marker")


async def readers(
    ws: Clients, live_servers: LiveServers, *slugs: str
) -> tuple[dict[str, tuple[Any, Client]], dict[str, Workspace]]:
    """One workspace per slug and one reader of each, subscribed to cards."""
    places = {
        slug: await off_loop(Workspace.objects.create, name=slug.title(), slug=slug)
        for slug in slugs
    }
    clients = {}
    for slug, place in places.items():
        user, token = await off_loop(member, f"{slug}-reader", place)
        # Subscribed before auth_success: a separate subscribe has no answer to wait for.
        client = await ws.authenticated(live_servers.get(), token, scope=slug, channels=["card"])
        clients[slug] = (user, client)
    return clients, places


def card_data(card: Card, company: str | None = None, **changes: Any) -> dict[str, Any]:
    """The data of a card's frames: declared fields first, then its payload's keys."""
    label = changes.get("label", card.label)
    return {
        "model": "card",
        "id": card.pk,
        "label": label,
        "company_name": company,
        "shout": label.upper(),
        "due": card.due.isoformat() if card.due else None,
        "price": None if card.price is None else str(card.price),
    }


def payload_errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.ERROR]


async def test_created_updated_and_deleted_frames_carry_the_payloads_keys(
    live_servers: LiveServers, ws: Clients
) -> None:
    clients, places = await readers(ws, live_servers, "acme")
    user, client = clients["acme"]
    acme = places["acme"]
    initech = await off_loop(Company.objects.create, workspace=acme, name="Initech")
    await heard(client, user)

    card = await off_loop(
        Card.objects.create,
        workspace=acme,
        company=initech,
        label="todo",
        due=datetime.date(2026, 9, 15),
        price=decimal.Decimal("12.50"),
    )
    (created,) = await heard(client, user)
    assert created["type"] == "card.created"
    assert created["data"] == card_data(card, "Initech")
    assert list(created["data"]) == list(card_data(card))  # declared fields first
    assert (created["data"]["due"], created["data"]["price"]) == ("2026-09-15", "12.50")

    card.label = "done"
    await off_loop(card.save)
    (updated,) = await heard(client, user)
    assert (updated["type"], updated["data"]) == ("card.updated", card_data(card, "Initech"))

    pk = card.pk
    await off_loop(card.delete)
    (deleted,) = await heard(client, user)
    assert deleted["type"] == "card.deleted"
    assert deleted["data"] == {**card_data(card, "Initech"), "id": pk}


async def test_bulk_writes_carry_the_payloads_keys(live_servers: LiveServers, ws: Clients) -> None:
    clients, places = await readers(ws, live_servers, "acme")
    user, client = clients["acme"]
    acme = places["acme"]
    initech = await off_loop(Company.objects.create, workspace=acme, name="Initech")
    made = await off_loop(
        Card.objects.bulk_create,
        [Card(workspace=acme, company=initech, label=f"c{i}") for i in range(2)],
    )
    frames = await heard(client, user)
    # MySQL's features ask the server: off the event loop.
    if await off_loop(lambda: connection.features.can_return_rows_from_bulk_insert):
        assert [(f["type"], f["data"]) for f in frames] == [
            ("card.created", card_data(card, "Initech")) for card in made
        ]
    else:  # which rows went in is not known: one truncated event, no data
        assert [(f["type"], f["data"]) for f in frames] == [("card.created", None)]

    await off_loop(Card.objects.filter(workspace=acme).update, label="bulk")
    stored = await off_loop(lambda: list(Card.objects.order_by("pk")))
    assert [(f["type"], f["data"]) for f in await heard(client, user)] == [
        ("card.updated", card_data(card, "Initech")) for card in stored
    ]

    stored[1].label = "renamed"
    await off_loop(Card.objects.bulk_update, stored, ["label"])
    (frame,) = await heard(client, user)
    assert (frame["type"], frame["data"]) == ("card.updated", card_data(stored[1], "Initech"))


@pytest.mark.parametrize("write", ["save", "update"])
async def test_a_reader_losing_sight_of_a_card_hears_its_identity_alone(
    live_servers: LiveServers, ws: Clients, write: str
) -> None:
    clients, places = await readers(ws, live_servers, "acme", "beta")
    card = await off_loop(Card.objects.create, workspace=places["acme"], label="moving")
    for user, client in clients.values():
        await heard(client, user)

    if write == "save":
        card.workspace = places["beta"]
        await off_loop(card.save)
    else:
        await off_loop(Card.objects.filter(pk=card.pk).update, workspace=places["beta"])

    acme_user, acme_client = clients["acme"]
    (left,) = await heard(acme_client, acme_user)
    assert (left["type"], left["data"], left["moved"]) == (
        "card.deleted",
        {"model": "card", "id": card.pk},
        True,
    )
    beta_user, beta_client = clients["beta"]
    (entered,) = await heard(beta_client, beta_user)
    assert (entered["type"], entered["data"], entered["moved"]) == (
        "card.created",
        card_data(card),
        True,
    )


@pytest.mark.parametrize("label", ["raises", "opaque", "clashes", "bad query"])
async def test_a_failing_payload_costs_its_announcement_never_the_write(
    live_servers: LiveServers, ws: Clients, caplog: pytest.LogCaptureFixture, label: str
) -> None:
    clients, places = await readers(ws, live_servers, "acme")
    user, client = clients["acme"]
    acme = places["acme"]

    def write() -> tuple[Card, Card, Card]:
        with transaction.atomic():
            return (
                Card.objects.create(workspace=acme, label="first"),
                Card.objects.create(workspace=acme, label=label),
                Card.objects.create(workspace=acme, label="last"),
            )

    first, failing, last = await off_loop(write)

    assert await off_loop(Card.objects.filter(pk=failing.pk).exists)
    assert [(f["type"], f["data"]) for f in await heard(client, user)] == [
        ("card.created", card_data(first)),
        ("card.created", card_data(last)),
    ]
    (error,) = payload_errors(caplog)
    assert f"card:{failing.pk} is not announced" in error.getMessage()
    assert error.exc_info is not None

    # A delete is still heard — no reader keeps a row that is gone — without the payload's keys.
    pk = failing.pk
    await off_loop(failing.delete)
    assert not await off_loop(Card.objects.filter(pk=pk).exists)
    assert [(f["type"], f["data"]) for f in await heard(client, user)] == [
        ("card.deleted", {"model": "card", "id": pk, "label": label}),
    ]
    assert len(payload_errors(caplog)) == 2


@pytest.mark.parametrize("write", ["save", "update"])
async def test_a_payload_failing_on_a_move_still_tells_the_readers_losing_sight_of_the_row(
    live_servers: LiveServers, ws: Clients, caplog: pytest.LogCaptureFixture, write: str
) -> None:
    clients, places = await readers(ws, live_servers, "acme", "beta")
    card = await off_loop(Card.objects.create, workspace=places["acme"], label="moving")
    for user, client in clients.values():
        await heard(client, user)

    if write == "save":
        card.workspace, card.label = places["beta"], "raises"
        await off_loop(card.save)
    else:
        await off_loop(
            Card.objects.filter(pk=card.pk).update, workspace=places["beta"], label="raises"
        )

    acme_user, acme_client = clients["acme"]
    (left,) = await heard(acme_client, acme_user)
    assert (left["type"], left["data"], left["moved"]) == (
        "card.deleted",
        {"model": "card", "id": card.pk},
        True,
    )
    # The readers it entered would get a record without the payload's keys: nothing.
    beta_user, beta_client = clients["beta"]
    assert await heard(beta_client, beta_user) == []
    (error,) = payload_errors(caplog)
    assert error.exc_info is not None


async def test_a_payload_over_the_size_limit_shrinks_like_a_declared_field(
    live_servers: LiveServers, ws: Clients, settings: Any
) -> None:
    clients, places = await readers(ws, live_servers, "acme")
    user, client = clients["acme"]
    settings.REALTIME_MAX_PAYLOAD = 5000  # the writing process's; pg_notify caps at 7,000

    card = await off_loop(Card.objects.create, workspace=places["acme"], label="huge")

    (frame,) = await heard(client, user)
    assert (frame["type"], frame["data"], frame["truncated"]) == (
        "card.created",
        {"model": "card", "id": card.pk},
        True,
    )
