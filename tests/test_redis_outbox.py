"""The Redis transport with the outbox: a writer that dies around its relay loses nothing,
and no socket hears an announcement twice; a write on another database keeps its outbox rows
in that database, where a sweep finds them when Redis was away.

A writer process commits a Company in an atomic block and dies (``os._exit``) either before
relaying it to Redis or right after, before deleting its outbox rows. A daphne worker on the
same database and Redis sweeps the outbox: in the first case it relays the announcement; in
the second, it relays it again under the writer's key, and Redis drops that second relay.
Either way the socket hears the Company exactly once (absence proven with a marker after).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from decimal import Decimal
from typing import Any

import pytest
import redis as redis_client
from django.contrib.auth import get_user_model
from django.db import connection, connections, transaction

from realtime import limits
from realtime.auth import issue_token
from realtime.broadcast import broadcast_to_scope, broadcast_to_user
from realtime.exceptions import ChannelTooLongError, PublishError
from realtime.messages import scope_channel
from realtime.models import OutboxItem
from realtime.transports import redis as redis_transport
from realtime.transports.redis_calls import call_each
from realtime.transports.redis_keys import stream_key
from realtime.writes import on_commit
from realtime.writes.items import ScopeBroadcast
from realtime.writes.relay import Sweeper
from tests.helpers import ROOT, WAIT, off_loop, subprocess_env
from tests.live import Clients, LiveServers
from tests.redis_server import RedisServer
from tests.testapp.models import Company, Contact, Membership, Ticket, Workspace

pytestmark = pytest.mark.django_db(transaction=True)


def member() -> tuple[Workspace, Any]:
    workspace = Workspace.objects.create(name="Acme", slug="acme")
    user = get_user_model().objects.create_user(username="ann")
    Membership.objects.create(workspace=workspace, user=user)
    return workspace, user


def write_and_die(
    workspace: Workspace, settings: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    """Run a writer process committing a Company named "orphan" with these settings."""
    env = {**subprocess_env(), "REALTIME_TEST_SETTINGS": json.dumps(settings)}
    return subprocess.run(
        [sys.executable, "-m", "tests.worker", "durable-write", str(workspace.pk), "orphan"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT,
    )


def outbox_rows(using: str) -> int:
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM realtime_outbox")
        return int(cursor.fetchone()[0])


def outbox_drained(timeout: float = 30.0) -> bool:
    """Wait (bounded) until the outbox holds no row: the sweeper relayed and deleted them."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM realtime_outbox")
            if cursor.fetchone()[0] == 0:
                return True
        time.sleep(0.05)
    return False


@pytest.fixture
def redis_alone(live_servers: LiveServers, redis_server: RedisServer, settings: Any) -> RedisServer:
    """Writes announced through the test's Redis, and no daphne worker of an earlier test
    left running to sweep their outbox rows before the test does."""
    live_servers.stop_all()
    settings.REALTIME_TRANSPORT = "redis"
    settings.REALTIME_REDIS_URL = redis_server.url
    return redis_server


def said(redis_server: RedisServer, acme: Workspace) -> list[tuple[str, str]]:
    """(event type, title) of each message in the stream of ``acme``'s scope."""
    entries = redis_server.entries(stream_key(scope_channel(acme.pk)))
    told = [json.loads(fields[b"p"]) for _, fields in entries]
    return [(m["event_type"], m["data"]["title"]) for m in told]


def titles(redis_server: RedisServer, acme: Workspace) -> list[str]:
    return [title for _, title in said(redis_server, acme)]


@pytest.mark.parametrize(
    "dying",
    ["DyingRedisTransport", "RelayingThenDyingRedisTransport"],
    ids=["before-relaying", "after-relaying"],
)
async def test_a_writer_dying_around_its_relay_is_heard_exactly_once(
    live_servers: LiveServers,
    ws: Clients,
    redis_server: RedisServer,
    settings: Any,
    dying: str,
) -> None:
    on_redis = {"REALTIME_TRANSPORT": "redis", "REALTIME_REDIS_URL": redis_server.url}
    for name, value in on_redis.items():
        setattr(settings, name, value)  # this process's marker goes through Redis too
    workspace, user = await off_loop(member)
    # A worker an earlier test left running on another Redis would sweep the orphan there.
    live_servers.stop_all()
    server = live_servers.get("redis-sweeper", **on_redis, REALTIME_COMMIT_GRACE=0.2)
    token = await off_loop(issue_token, user)
    client = await ws.authenticated(server, token, scope="acme", channels=["company"])
    writer = await off_loop(
        write_and_die,
        workspace,
        {**on_redis, "REALTIME_TRANSPORT": f"tests.durable_transport.{dying}"},
    )
    assert writer.returncode == 1  # died in its relay
    assert "committed" not in writer.stdout

    frame = await client.wait_for(lambda f: f["type"] == "company.created", timeout=30)
    assert frame["data"]["name"] == "orphan"
    # The sweeper is done once the rows are gone; anything it sent is before the marker.
    assert await off_loop(outbox_drained)
    await off_loop(broadcast_to_user, user.pk, "test.marker", None)
    after = await client.frames_until("test.marker")
    assert [f for f in after if f["type"] == "company.created"] == []
    assert await off_loop(lambda: Company.objects.filter(name="orphan").count()) == 1


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_a_write_on_another_database_keeps_its_outbox_there_and_is_relayed_from_it(
    redis_alone: RedisServer,
) -> None:
    acme = Workspace.objects.create(name="Acme", slug="acme")
    Workspace.objects.using("other").create(pk=acme.pk, name="Acme", slug="acme")

    with transaction.atomic(using="other"):
        Ticket.objects.using("other").create(workspace_id=acme.pk, title="there")
        assert (outbox_rows("other"), outbox_rows("default")) == (1, 0)
        assert titles(redis_alone, acme) == []
    assert outbox_rows("other") == 0
    assert titles(redis_alone, acme) == ["there"]

    redis_alone.stop()  # the writer's relay fails: the row stays where it was written
    try:
        with transaction.atomic(using="other"):
            Ticket.objects.using("other").create(workspace_id=acme.pk, title="late")
        assert outbox_rows("other") == 1
    finally:
        redis_alone.start()
    assert Sweeper(grace=0.0).sweep() == 1
    assert outbox_rows("other") == 0
    assert titles(redis_alone, acme) == ["late"]  # a new server: its streams begin again


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_a_write_in_autocommit_whose_publish_fails_is_kept_and_relayed_when_redis_is_back(
    redis_alone: RedisServer,
) -> None:
    acme = Workspace.objects.create(name="Acme", slug="acme")

    redis_alone.stop()  # no transaction to write a row in: the failed publish writes it
    try:
        Ticket.objects.create(workspace=acme, title="kept")
        assert outbox_rows("default") == 1
    finally:
        redis_alone.start()
    Ticket.objects.create(workspace=acme, title="direct")  # published at once, no row
    assert outbox_rows("default") == 1
    assert Sweeper(grace=0.0).sweep() == 1
    assert outbox_rows("default") == 0
    assert sorted(titles(redis_alone, acme)) == ["direct", "kept"]


def late_relay_setup(redis_server: RedisServer) -> tuple[Workspace, Ticket]:
    acme = Workspace.objects.create(name="Acme", slug="acme")
    ticket = Ticket.objects.create(workspace=acme, title="v0")
    redis_server.stop()  # the writer's relay of v1 fails: its row stays in the outbox
    try:
        with transaction.atomic():
            ticket.title = "v1"
            ticket.save()
        assert outbox_rows("default") == 1
    finally:
        redis_server.start()
    return acme, ticket


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_a_late_relay_of_a_row_unchanged_since_keeps_the_order_of_its_outbox_row(
    redis_alone: RedisServer,
) -> None:
    acme, _ = late_relay_setup(redis_alone)
    (row_id,) = OutboxItem.objects.values_list("id", flat=True)
    assert Sweeper(grace=0.0).sweep() == 1
    entries = redis_alone.entries(stream_key(scope_channel(acme.pk)))
    (told,) = [json.loads(fields[b"p"]) for _, fields in entries]
    assert (told["event_type"], told["data"]["title"]) == ("ticket.updated", "v1")
    assert told["meta"]["order"] == ["default:outbox", row_id]


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_a_late_relay_of_a_row_written_since_is_not_announced(
    redis_alone: RedisServer,
) -> None:
    acme, ticket = late_relay_setup(redis_alone)
    with transaction.atomic():
        ticket.title = "v2"
        ticket.save()  # published at once, before the late relay of v1
    assert Sweeper(grace=0.0).sweep() == 1
    assert outbox_rows("default") == 0
    # Relayed as written, v1 would come last: sockets would end showing the older version.
    assert said(redis_alone, acme) == [("ticket.updated", "v2")]


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_a_late_relay_of_a_row_deleted_since_announces_nothing(
    redis_alone: RedisServer,
) -> None:
    acme, ticket = late_relay_setup(redis_alone)
    Ticket.objects.filter(pk=ticket.pk).delete()  # published at once
    assert Sweeper(grace=0.0).sweep() == 1
    assert outbox_rows("default") == 0
    # Relayed as written, the update would show a deleted row again.
    assert said(redis_alone, acme) == [("ticket.deleted", "v1")]


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_a_late_relay_of_a_row_moved_then_deleted_tells_its_earlier_scope_it_went(
    redis_alone: RedisServer,
) -> None:
    """One transaction moves a ticket to another scope, then deletes it; its publish fails.
    Relayed late, the move is read again and found gone: it must still be merged into the
    delete, as a publish on time merges them, for the scope it left to hear it go."""
    acme = Workspace.objects.create(name="Acme", slug="acme")
    beta = Workspace.objects.create(name="Beta", slug="beta")
    ticket = Ticket.objects.create(workspace=acme, title="v0")
    redis_alone.stop()  # the writer's relay fails: its rows stay in the outbox
    try:
        with transaction.atomic():
            ticket.workspace = beta
            ticket.save()
            Ticket.objects.get(pk=ticket.pk).delete()
        assert outbox_rows("default") == 2
    finally:
        redis_alone.start()
    assert Sweeper(grace=0.0).sweep() == 2
    assert outbox_rows("default") == 0
    entries = redis_alone.entries(stream_key(scope_channel(acme.pk)))  # a new server's
    told = [json.loads(fields[b"p"]) for _, fields in entries]
    assert [(m["event_type"], m["data"]["id"]) for m in told] == [("ticket.deleted", ticket.pk)]


@pytest.mark.parametrize(
    "written",
    [{"score": Decimal("9.9")}, {"score": 10}, {"company_id": "company"}],
    ids=["decimal-of-fewer-places", "integer-in-a-decimal", "foreign-key-as-text"],
)
@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_a_late_relay_of_a_row_written_in_another_form_than_stored_is_announced(
    redis_alone: RedisServer, written: dict[str, Any]
) -> None:
    """The announcement holds what the instance held: ``Decimal("9.9")`` stored ``9.90``,
    ``10`` read back ``10.00``, a foreign key set from a form's text. Nothing wrote the row
    since: equal in another form is the same value, and the row is announced."""
    acme = Workspace.objects.create(name="Acme", slug="acme")
    company = Company.objects.create(workspace=acme, name="Initech")
    if written.get("company_id") == "company":
        written = {"company_id": str(company.pk)}  # as request.POST gives it
    redis_alone.stop()  # the writer's relay fails: its row stays in the outbox
    try:
        with transaction.atomic():
            contact = Contact.objects.create(workspace=acme, name="Ann", **written)
        assert outbox_rows("default") == 1
    finally:
        redis_alone.start()
    assert Sweeper(grace=0.0).sweep() == 1
    assert outbox_rows("default") == 0
    entries = redis_alone.entries(stream_key(scope_channel(acme.pk)))  # a new server's
    (told,) = [json.loads(fields[b"p"]) for _, fields in entries]
    stored = Contact.objects.values("score", "company_id").get(pk=contact.pk)
    assert told["event_type"] == "contact.created"
    assert told["data"]["id"] == contact.pk
    # Announced as the row is now, in the forms the database gives.
    score = None if stored["score"] is None else str(stored["score"])
    assert (told["data"]["score"], told["data"]["company"]) == (score, stored["company_id"])


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_a_relay_cut_halfway_and_made_again_after_a_row_changed_loses_and_repeats_nothing(
    redis_alone: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One transaction announces 600 rows, more than one Redis call carries; the writer's
    second call is cut, so only the first part lands. Before the sweeper relays the rows
    again, a row of that first part is written again: relayed as it is now, its old version
    is left out, so the sweeper builds fewer messages than the writer did. The rows a call
    carries, not how many messages came before, decide what Redis already took: every other
    row is told once, none twice, none lost."""
    acme = Workspace.objects.create(name="Acme", slug="acme")
    tickets = Ticket.objects.bulk_create(
        [Ticket(workspace=acme, title=f"t{number}") for number in range(600)]
    )
    taken = len(said(redis_alone, acme))
    calls = 0

    def second_cut(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise redis_client.ConnectionError("cut")
        return call_each(*args, **kwargs)

    monkeypatch.setattr(redis_transport, "call_each", second_cut)
    with transaction.atomic():
        Ticket.objects.filter(workspace=acme).update(points=7)
    assert outbox_rows("default") == 600  # the relay failed: every row stays
    Ticket.objects.filter(pk=tickets[3].pk).update(points=8)  # published at once
    assert Sweeper(grace=0.0).sweep() == 600
    told: dict[int, list[int]] = {}
    for _, fields in redis_alone.entries(stream_key(scope_channel(acme.pk)))[taken:]:
        message = json.loads(fields[b"p"])
        told.setdefault(message["data"]["id"], []).append(message["data"]["points"])
    assert told[tickets[3].pk] == [7, 8]  # the writer's first call had told it
    rest = {pk: points for pk, points in told.items() if pk != tickets[3].pk}
    assert rest == {ticket.pk: [7] for ticket in tickets if ticket.pk != tickets[3].pk}


def test_a_broadcast_to_a_scope_whose_channel_no_transport_takes_is_refused_at_the_call(
    redis_alone: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    with transaction.atomic():
        broadcast_to_scope(int("9" * 1100), "test.far", {"x": 1})  # a channel of 1,109 bytes
    assert outbox_rows("default") == 0  # no row every relay would fail on
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in errors] == ["realtime: broadcasting failed"]
    assert errors[0].exc_info is not None
    assert isinstance(errors[0].exc_info[1], ChannelTooLongError)


def test_a_transaction_no_relay_can_publish_is_dropped_and_those_after_it_are_relayed(
    redis_alone: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    acme = Workspace.objects.create(name="Acme", slug="acme")
    # Held as the broadcast's check would not have held it: every publish of it is refused.
    far = ScopeBroadcast(int("9" * 1100), "test.far", {"x": 1}, None, {}, [], None, None)
    with transaction.atomic():
        on_commit.add(far, "default")
    assert outbox_rows("default") == 1  # the writer's publish failed: the row stays
    redis_alone.stop()  # this transaction's relay fails: its row stays behind the first
    try:
        with transaction.atomic():
            Ticket.objects.create(workspace=acme, title="after the outage")
        assert outbox_rows("default") == 2
    finally:
        redis_alone.start()
    assert Sweeper(grace=0.0).sweep_database("default") == 1
    assert outbox_rows("default") == 0
    assert titles(redis_alone, acme) == ["after the outage"]
    dropped = [r.getMessage() for r in caplog.records if "can never be relayed" in r.getMessage()]
    assert len(dropped) == 1
    assert "ChannelTooLongError" in dropped[0]
    assert "1109 bytes" in dropped[0]


def test_a_relay_the_transport_itself_fails_keeps_its_rows_for_a_later_sweep(
    redis_alone: RedisServer, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Only a value no transport takes (a channel too long, a payload that cannot be
    encoded) makes a relay hopeless: an error raised inside the transport, whatever its
    class, may be gone after a fix or a restart, and the rows stay."""
    acme = Workspace.objects.create(name="Acme", slug="acme")
    settings.REALTIME_TRANSPORT = "tests.durable_transport.ClientRefusingRedisTransport"
    with transaction.atomic():
        Ticket.objects.create(workspace=acme, title="kept")
    assert outbox_rows("default") == 1  # the writer's publish failed: the row stays
    with pytest.raises(PublishError, match="TypeError"):
        Sweeper(grace=0.0).sweep_database("default")
    assert outbox_rows("default") == 1
    assert not [r for r in caplog.records if "can never be relayed" in r.getMessage()]

    settings.REALTIME_TRANSPORT = "redis"  # the transport fixed
    assert Sweeper(grace=0.0).sweep_database("default") == 1
    assert outbox_rows("default") == 0
    assert titles(redis_alone, acme) == ["kept"]


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_a_sweep_that_leaves_ready_transactions_says_it_is_behind_until_they_are_relayed(
    redis_alone: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backlog after an outage is relayed sweep after sweep without waiting for the
    interval between them (workers sweep again at once while ``behind``)."""
    monkeypatch.setattr(limits, "OUTBOX_TXNS_PER_SWEEP", 2)
    acme = Workspace.objects.create(name="Acme", slug="acme")
    redis_alone.stop()
    try:
        for n in range(5):
            with transaction.atomic():
                Ticket.objects.create(workspace=acme, title=f"t{n}")
    finally:
        redis_alone.start()
    assert outbox_rows("default") == 5
    sweeper = Sweeper(grace=0.0)
    redis_alone.stop()  # a sweep that fails is not behind: the next waits for the interval
    try:
        assert (sweeper.sweep_logged(), sweeper.behind) == (0, False)
    finally:
        redis_alone.start()
    relays = []
    for _ in range(3):
        relays.append((sweeper.sweep_logged(), sweeper.behind))
    assert relays == [(2, True), (2, True), (1, False)]
    assert titles(redis_alone, acme) == [f"t{n}" for n in range(5)]
