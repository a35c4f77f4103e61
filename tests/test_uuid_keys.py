"""Accounts, scopes and records keyed by UUIDs and text work end to end, as integer keys do.

Ids compare in one normalised form everywhere (their JSON form), so a recheck keeps a
UUID account's socket, account and guarded events reach it, and the per-account cap counts
its sockets. These tests need ``tests.settings_uuid`` (a UUID user model cannot be swapped in
mid-run): ``pytest --ds=tests.settings_uuid tests/test_uuid_keys.py``; under the default
settings they are skipped.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.conf import settings

if settings.AUTH_USER_MODEL != "uuidapp.Account":
    pytest.skip("needs --ds=tests.settings_uuid", allow_module_level=True)

from django.contrib.auth import get_user_model

from realtime.auth import RealtimeAuth, Scope, issue_token
from realtime.broadcast import broadcast_to_scope, broadcast_to_user, recheck_users
from realtime.encoding import key_of, normal_id
from realtime.sockets import access, standing
from realtime.sockets.protocol import read_scopes
from tests.helpers import off_loop
from tests.live import Client, Clients, LiveServers
from tests.live_lists import apply_frames, orm_answer, same_rows
from tests.uuidapp.models import Alert, Chore, Memo, Seat, Secret, Team, Ticket

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("each_transport")]


def make_team(slug: str) -> Team:
    return Team._default_manager.create(name=slug.title(), slug=slug)


def make_member(username: str, *teams: Team) -> tuple[Any, str]:
    account = get_user_model().objects.create_user(username=username)
    for team in teams:
        Seat._default_manager.create(team=team, account=account)
    return account, issue_token(account)


async def marker_for(client: Client, account: Any) -> list[dict[str, Any]]:
    """Send a marker to the account; return what the client received before it."""
    await off_loop(broadcast_to_user, account.pk, "test.marker", None)
    return await client.frames_until("test.marker")


async def test_a_uuid_account_authenticates_with_its_id_in_json_form(
    live_servers: LiveServers, ws: Clients
) -> None:
    team = await off_loop(make_team, "acme")
    account, token = await off_loop(make_member, "ann", team)
    client = await ws.connect(live_servers.get())
    answer = await client.authenticate(token, scope="acme")
    assert answer == {
        "type": "auth_success",
        "data": {"user_id": str(account.pk), "scope": "acme", "scopes": ["acme"]},
    }


async def test_writes_of_uuid_and_text_keyed_records_reach_the_uuid_scope(
    live_servers: LiveServers, ws: Clients
) -> None:
    team = await off_loop(make_team, "acme")
    account, token = await off_loop(make_member, "ann", team)
    client = await ws.authenticated(live_servers.get(), token, scope="acme")
    await client.send("subscribe", {"channels": ["memo", "ticket:T-1"]})
    await marker_for(client, account)
    memo = await off_loop(Memo._default_manager.create, team=team, title="hello")
    await off_loop(Ticket._default_manager.create, code="T-1", team=team, title="broken")
    frames = await marker_for(client, account)
    assert frames == [
        {
            "type": "memo.created",
            "data": {"model": "memo", "id": str(memo.pk), "title": "hello"},
            "scope_id": str(team.pk),
        },
        {
            "type": "ticket.created",
            "data": {"model": "ticket", "id": "T-1", "title": "broken"},
            "scope_id": str(team.pk),
        },
    ]


async def test_a_recheck_keeps_a_uuid_account_connected_and_hearing(
    live_servers: LiveServers, ws: Clients
) -> None:
    team = await off_loop(make_team, "acme")
    account, token = await off_loop(make_member, "ann", team)
    server = live_servers.get("rechecks", REALTIME_RECHECK_INTERVAL=0.2)
    client = await ws.authenticated(server, token, scope="acme")
    await client.send("subscribe", {"channels": ["memo"]})
    await marker_for(client, account)
    await off_loop(recheck_users, [account.pk])
    # Several periodic rounds pass too, while the socket keeps hearing its scope.
    for number in range(3):
        await off_loop(Memo._default_manager.create, team=team, title=f"memo {number}")
        frames = await marker_for(client, account)
        assert [frame["type"] for frame in frames] == ["memo.created"]


def test_a_recheck_round_reads_uuid_accounts_as_the_hooks_do() -> None:
    team = make_team("acme")
    (ann, ann_token), (bob, bob_token) = make_member("ann", team), make_member("bob", team)
    bob.is_active = False
    bob.save()
    tokens = [ann_token, bob_token, "garbage"]
    read = standing.accounts_of_tokens(tokens)
    assert read is not None
    assert [None if a is None else a.pk for a in read] == [
        getattr(u, "pk", None) for u in RealtimeAuth().users_of_tokens(tokens)
    ]
    ask = read_scopes({"scope": "acme"})
    questions = [
        (normal_id(a.pk), t, ask, [team.pk]) for a, t in ((ann, ann_token), (bob, bob_token))
    ]
    assert access.recheck(RealtimeAuth(), questions) == [[Scope(str(team.pk), "acme")], None]


async def test_a_uuid_account_removed_from_a_uuid_scope_stops_hearing_it(
    live_servers: LiveServers, ws: Clients
) -> None:
    team = await off_loop(make_team, "acme")
    account, token = await off_loop(make_member, "ann", team)
    server = live_servers.get()
    client = await ws.authenticated(server, token, scope="acme")
    await client.send("subscribe", {"channels": ["memo"]})
    await marker_for(client, account)
    await off_loop(Seat._default_manager.filter(account=account).delete)
    await server.wait_for_state(lambda state: str(team.pk) not in state["by_scope"])
    await off_loop(Memo._default_manager.create, team=team, title="unheard")
    assert await marker_for(client, account) == []


async def test_account_events_reach_a_uuid_account(live_servers: LiveServers, ws: Clients) -> None:
    account, token = await off_loop(make_member, "ann")
    client = await ws.authenticated(live_servers.get(), token)
    await marker_for(client, account)
    alert = await off_loop(Alert._default_manager.create, account=account, text="hi")
    frames = await marker_for(client, account)
    assert frames == [
        {"type": "alert.created", "data": {"model": "alert", "id": str(alert.pk), "text": "hi"}}
    ]


async def test_guarded_events_reach_only_their_uuid_reader(
    live_servers: LiveServers, ws: Clients
) -> None:
    team = await off_loop(make_team, "acme")
    author, author_token = await off_loop(make_member, "ann", team)
    other, other_token = await off_loop(make_member, "bob", team)
    server = live_servers.get()
    clients = {
        author.pk: await ws.authenticated(server, author_token, scope="acme"),
        other.pk: await ws.authenticated(server, other_token, scope="acme"),
    }
    accounts = {author.pk: author, other.pk: other}
    for pk, client in clients.items():
        await client.send("subscribe", {"channels": ["secret"]})
        await marker_for(client, accounts[pk])
    secret = await off_loop(Secret._default_manager.create, team=team, author=author, title="mine")
    await clients[author.pk].wait_for(lambda frame: frame["type"] == "secret.created")
    await off_loop(secret.delete)
    heard = {
        pk: [f["type"] for f in await marker_for(client, accounts[pk])]
        for pk, client in clients.items()
    }
    assert heard == {author.pk: ["secret.deleted"], other.pk: []}


async def test_the_per_account_cap_counts_a_uuid_accounts_sockets(
    live_servers: LiveServers, ws: Clients
) -> None:
    team = await off_loop(make_team, "acme")
    _, token = await off_loop(make_member, "ann", team)
    server = live_servers.get("capped", REALTIME_MAX_SOCKETS_PER_USER=2)
    for _ in range(2):
        await ws.authenticated(server, token, scope="acme")
    refused = await ws.connect(server)
    answer = await refused.authenticate(token, scope="acme")
    assert answer == {"type": "auth_error", "data": {"message": "Too many connections"}}
    assert await refused.closed_with() == 1008


async def test_uuid_ids_given_in_capitals_or_as_uuids_name_the_same_scope_and_accounts(
    live_servers: LiveServers, ws: Clients
) -> None:
    team = await off_loop(make_team, "acme")
    (ann, ann_token), (bob, bob_token) = [
        await off_loop(make_member, name, team) for name in ("ann", "bob")
    ]
    server = live_servers.get()
    ann_s = await ws.authenticated(server, ann_token, scope="acme")
    bob_s = await ws.authenticated(server, bob_token, scope="acme")
    scope = str(team.pk).upper()  # text a UUID field reads as the same key
    await off_loop(broadcast_to_scope, scope, "test.said", 1, exclude_user_ids=[bob.pk])
    await off_loop(broadcast_to_scope, scope, "test.said", 2, audience=[str(bob.pk).upper()])
    for client, account, heard in ((ann_s, ann, [1]), (bob_s, bob, [2])):
        frames = await marker_for(client, account)
        assert [frame["data"] for frame in frames if frame["type"] == "test.said"] == heard


def test_ids_are_read_by_their_model_s_key_field_never_guessed() -> None:
    key = uuid.uuid4()
    assert key_of(Team, str(key).upper()) == key_of(Team, key) == str(key)
    assert key_of(Ticket, 3) == key_of(Ticket, "3") == "3"  # a text key stays text
    assert key_of(Team, "not a uuid") == "not a uuid"  # names no team: kept as given


def test_readers_of_uuid_keyed_rows_are_asked_a_page_at_once() -> None:
    # A resume's page: the rows' keys come from JSON (text), the rows' from the database
    # (UUIDs); they must meet.
    from realtime.readers import Row, readers_now_many
    from realtime.registry import options_named

    ann = get_user_model().objects.create_user(username="ann")
    bob = get_user_model().objects.create_user(username="bob")
    alerts = [Alert._default_manager.create(account=user, text="hi") for user in (ann, bob)]
    options = options_named("alert")
    assert options is not None
    asks = [
        (
            Row(options, normal_id(alert.pk)),
            "alert.updated",
            None,
            [normal_id(u.pk) for u in (ann, bob)],
        )
        for alert in alerts
    ]
    assert readers_now_many(asks) == [[normal_id(ann.pk)], [normal_id(bob.pk)]]


async def test_a_live_query_of_uuid_keys_filtered_by_a_uuid_account_stays_the_orm_answer(
    live_servers: LiveServers, ws: Clients
) -> None:
    team = await off_loop(make_team, "acme")
    ann, token = await off_loop(make_member, "ann", team)
    bob, _ = await off_loop(make_member, "bob", team)
    create = Chore._default_manager.create
    for n, owner in enumerate((ann, ann, bob, None)):
        await off_loop(create, team=team, owner=owner, title=f"c{n}", rank=n)
    client = await ws.authenticated(live_servers.get(), token, scope="acme")
    mine = {"model": "chore", "where": {"owner": str(ann.pk)}, "order_by": ["-rank"]}
    # Given in capitals, a UUID names the same account.
    theirs = {"model": "chore", "where": {"owner__in": [str(bob.pk).upper()]}}
    open_ = {"model": "chore", "where": {"done": False}, "order_by": ["rank"], "limit": 2}
    asks: dict[str, dict[str, Any]] = {"mine": mine, "theirs": theirs, "open": open_}
    lists: dict[str, list[dict[str, Any]]] = {}
    for name, ask in asks.items():
        await client.send("query", {"id": name, **ask})
        apply_frames(lists, [await client.wait_for(lambda f: f["type"] == "query.rows")])

    async def settled() -> None:
        apply_frames(lists, await marker_for(client, ann))
        for name, ask in asks.items():
            expected = await off_loop(orm_answer, ask, ann, [team.pk])
            assert same_rows(lists[name], expected), name

    await settled()
    assert sorted(row["title"] for row in lists["mine"]) == ["c0", "c1"]
    assert lists["theirs"] == []  # bob's chore: ann may not read it
    # Given to bob: it leaves ann's list, and still is not hers to see in his.
    await off_loop(Chore._default_manager.filter(title="c1").update, owner=bob)
    await settled()
    # Given to nobody: everyone reads it; the open list's first two change.
    chore = await off_loop(Chore._default_manager.get, title="c2")
    chore.owner, chore.rank = None, -1
    await off_loop(chore.save)
    await settled()
    assert [row["title"] for row in await off_loop(orm_answer, open_, ann, [team.pk])] == [
        "c2",
        "c0",
    ]
    # Done, then deleted: it leaves.
    await off_loop(Chore._default_manager.filter(title="c0").update, done=True)
    await settled()
    await off_loop(Chore._default_manager.filter(title="c2").delete)
    await settled()


#: UUID keys whose text order is not MariaDB's: its ``uuid`` type compares the last group
#: first, so there the last of these comes first.
ORDERED_KEYS = [
    "0a000000-0000-4000-8000-00000000000f",
    "0b000000-0000-4000-8000-00000000000e",
    "0c000000-0000-4000-8000-00000000000d",
    "0d000000-0000-4000-8000-00000000000c",
    "0e000000-0000-4000-8000-00000000000b",
    "0f000000-0000-4000-8000-00000000000a",
]


async def test_a_window_ordered_by_uuid_keys_is_the_databases_first_rows(
    live_servers: LiveServers, ws: Clients
) -> None:
    team = await off_loop(make_team, "acme")
    ann, token = await off_loop(make_member, "ann", team)

    def create(keys: list[str]) -> None:
        for key in keys:
            Chore._default_manager.create(id=uuid.UUID(key), team=team, title=key[:2])

    await off_loop(create, ORDERED_KEYS[:4])
    client = await ws.authenticated(live_servers.get(), token, scope="acme")
    ask = {"model": "chore", "where": {"done": False}, "limit": 2}  # by key, the default
    lists: dict[str, list[dict[str, Any]]] = {}
    await client.send("query", {"id": "first", **ask})
    apply_frames(lists, [await client.wait_for(lambda f: f["type"] == "query.rows")])
    await off_loop(create, ORDERED_KEYS[4:])
    first = (await off_loop(orm_answer, ask, ann, [team.pk]))[0]["id"]
    await off_loop(Chore._default_manager.filter(pk=first).update, done=True)

    apply_frames(lists, await marker_for(client, ann))

    expected = await off_loop(orm_answer, ask, ann, [team.pk])
    assert same_rows(lists["first"], expected)
