"""Overload and outages end to end: real daphne workers, real clients, this process writing.

A worker whose delivery queue is too small for one transaction, and a pg_notify worker whose
LISTEN connection is terminated or cut (through ``Proxy``), must leave no socket silently
stale: every socket hears every event once and in order, or — where nothing can make good
what was lost (pg_notify without its log) — is closed 1012 so that its client reconnects and
reads again. Waits are bounded; absence is proven with a marker sent afterwards.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, transaction

from realtime.auth import issue_token
from realtime.broadcast import broadcast_to_scope
from tests.helpers import WAIT, off_loop, only_on, vendor
from tests.live import Client, Clients, LiveServers
from tests.proxy import Proxy, databases_through
from tests.test_resume_e2e import heard, kinds, make_member, make_workspace, resuming, went_away
from tests.testapp.models import Company, Membership, Workspace

pytestmark = pytest.mark.django_db(transaction=True)

MARKER = "test.marker"
BURST = "test.burst"
#: A delivery queue far smaller than one transaction's announcements.
SMALL_QUEUE = 20
BURST_SIZE = 3 * SMALL_QUEUE
PG_NOTIFY = {"REALTIME_TRANSPORT": "pg_notify"}
WITHOUT_LOG = {"REALTIME_TRANSPORT": "pg_notify", "REALTIME_PG_NOTIFY_LOG": False}
#: A LISTEN connection that comes back fast.
FAST_BACK = {"REALTIME_RECONNECT_BACKOFF_START": 0.05, "REALTIME_RECONNECT_BACKOFF_MAX": 0.2}


def use(settings: Any, overrides: dict[str, Any]) -> None:
    """Have this process publish as the workers listen."""
    for name, value in overrides.items():
        setattr(settings, name, value)


def members(count: int) -> tuple[Workspace, list[str]]:
    """A workspace and the tokens of ``count`` members."""
    workspace = Workspace.objects.create(name="Acme", slug="acme")
    tokens = []
    for number in range(count):
        user = get_user_model().objects.create_user(username=f"member{number}")
        Membership.objects.create(workspace=workspace, user=user)
        tokens.append(issue_token(user))
    return workspace, tokens


def burst(workspace_id: int, first: int, count: int) -> None:
    """Announce ``count`` numbered events in one transaction."""
    with transaction.atomic():
        for number in range(first, first + count):
            broadcast_to_scope(workspace_id, BURST, {"n": number})


def marker(workspace_id: int) -> None:
    broadcast_to_scope(workspace_id, MARKER, {})


async def numbers_until_marker(client: Client) -> list[int]:
    frames = await client.frames_until(MARKER)
    return [frame["data"]["n"] for frame in frames if frame["type"] == BURST]


async def hears_one_event(client: Client, workspace_id: int) -> bool:
    """Whether ``client`` hears the one event said to the workspace now (then a marker)."""
    await off_loop(burst, workspace_id, 0, 1)
    await off_loop(marker, workspace_id)
    return await numbers_until_marker(client) == [0]


@pytest.mark.parametrize(
    "overrides",
    [pytest.param({}, id="table"), pytest.param(PG_NOTIFY, id="pg_notify")],
)
async def test_one_transaction_announcing_more_than_the_queue_holds_reaches_every_socket_whole(
    live_servers: LiveServers, ws: Clients, settings: Any, overrides: dict[str, Any]
) -> None:
    if overrides and vendor() != "postgresql":
        pytest.skip("pg_notify needs PostgreSQL")
    use(settings, overrides)
    server = live_servers.get("small-queue", REALTIME_NOTIFY_QUEUE_SIZE=SMALL_QUEUE, **overrides)
    workspace, tokens = await off_loop(members, 3)
    clients = [await ws.authenticated(server, token, scope="acme") for token in tokens]
    await off_loop(burst, workspace.pk, 0, BURST_SIZE)
    await off_loop(marker, workspace.pk)
    for client in clients:
        assert await numbers_until_marker(client) == list(range(BURST_SIZE))


@only_on("postgresql")
async def test_without_the_log_an_overflow_closes_the_sockets_that_missed_events_1012(
    live_servers: LiveServers, ws: Clients, settings: Any
) -> None:
    use(settings, WITHOUT_LOG)
    server = live_servers.get("small-queue", REALTIME_NOTIFY_QUEUE_SIZE=SMALL_QUEUE, **WITHOUT_LOG)
    workspace, tokens = await off_loop(members, 2)
    clients = [await ws.authenticated(server, token, scope="acme") for token in tokens]
    await off_loop(burst, workspace.pk, 0, BURST_SIZE)
    for client in clients:
        assert await client.closed_with() == 1012
    # The clients reconnect and hear what comes next.
    again = await ws.authenticated(server, tokens[0], scope="acme")
    await off_loop(burst, workspace.pk, 0, 3)
    await off_loop(marker, workspace.pk)
    assert await numbers_until_marker(again) == [0, 1, 2]


def listener_pid_of(state: dict[str, Any]) -> int:
    pid = state.get("listener_pid")
    assert isinstance(pid, int)
    return pid


def terminate(pid: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE pid = %s AND datname = current_database()",
            [pid],
        )


@only_on("postgresql")
async def test_without_the_log_a_listen_outage_closes_every_socket_1012(
    live_servers: LiveServers, ws: Clients, settings: Any
) -> None:
    use(settings, WITHOUT_LOG)
    server = live_servers.get("no-log", **WITHOUT_LOG, **FAST_BACK)
    workspace, tokens = await off_loop(members, 2)
    clients = [await ws.authenticated(server, token, scope="acme") for token in tokens]
    old = listener_pid_of(await asyncio.to_thread(server.state))
    await off_loop(terminate, old)
    for client in clients:
        assert await client.closed_with() == 1012
    await server.wait_for_state(lambda state: state.get("listener_pid") not in (None, old))
    again = await ws.authenticated(server, tokens[1], scope="acme")
    await off_loop(marker, workspace.pk)
    assert await numbers_until_marker(again) == []


@only_on("postgresql")
async def test_with_the_log_a_terminated_backend_and_a_cut_while_writes_flow_lose_and_repeat_nothing(  # noqa: E501
    live_servers: LiveServers, ws: Clients, settings: Any, proxy: Proxy
) -> None:
    use(settings, PG_NOTIFY)
    server = live_servers.get(
        "through-proxy",
        DATABASES=databases_through(proxy),
        REALTIME_HEARTBEAT_INTERVAL=0.5,
        REALTIME_HEARTBEAT_TIMEOUT=0.5,
        **PG_NOTIFY,
        **FAST_BACK,
    )
    workspace, tokens = await off_loop(members, 3)
    clients = [await ws.authenticated(server, token, scope="acme") for token in tokens]
    written = 0

    async def write(count: int) -> None:
        nonlocal written
        for _ in range(count):
            await off_loop(burst, workspace.pk, written, 1)
            written += 1

    await write(10)
    old = listener_pid_of(await asyncio.to_thread(server.state))
    await off_loop(terminate, old)  # the LISTEN backend goes
    await write(10)
    await server.wait_for_state(lambda state: state.get("listener_pid") not in (None, old))
    await write(10)
    await proxy.close()  # every connection of the worker is cut, and refused
    await write(10)
    await proxy.open()
    await write(10)
    await off_loop(marker, workspace.pk)
    for client in clients:
        assert await numbers_until_marker(client) == list(range(written))
    assert written == 50


@only_on("postgresql", "mysql")
async def test_a_handshake_after_the_worker_s_connections_went_silent_is_answered(
    live_servers: LiveServers, ws: Clients, proxy: Proxy
) -> None:
    # Every connection of the worker goes through the relay; frozen, the established ones go
    # silent (a NAT that forgot them) while new ones flow. The connection kept for handshakes
    # would hold the next handshake, and every one after it, for as long as the kernel waits.
    server = live_servers.get(
        "frozen-handshakes",
        DATABASES=databases_through(proxy),
        REALTIME_HEARTBEAT_TIMEOUT=0.5,
    )
    workspace, tokens = await off_loop(members, 2)
    first = await ws.authenticated(server, tokens[0], scope="acme")
    proxy.freeze()
    # Long enough for the kept connections to count as idle: they are checked before use.
    await asyncio.sleep(1.5)
    second = await ws.authenticated(server, tokens[1], scope="acme")
    await off_loop(burst, workspace.pk, 0, 1)
    await off_loop(marker, workspace.pk)
    for client in (first, second):
        assert await numbers_until_marker(client) == [0]
    assert "of a handshake, recheck or audience check had no answer" in server.log_text()


@only_on("postgresql")
async def test_a_handshake_the_database_cannot_answer_is_closed_1012_not_refused(
    live_servers: LiveServers, ws: Clients, proxy: Proxy
) -> None:
    # An outage says nothing of the token: refused as a bad one, a client would refresh it,
    # or stop for good; closed 1012, it comes back with the same token once the worker can
    # answer.
    server = live_servers.get("database-away", DATABASES=databases_through(proxy))
    workspace, tokens = await off_loop(members, 2)
    await ws.authenticated(server, tokens[0], scope="acme")  # the listener runs
    await proxy.close()
    away = await ws.connect(server)
    await away.send("authenticate", {"token": tokens[1], "scope": "acme"})
    assert await away.closed_with() == 1012
    assert away.received == []

    await proxy.open()
    back = await ws.authenticated(server, tokens[1], scope="acme")
    assert await hears_one_event(back, workspace.pk)


@only_on("postgresql")
async def test_a_watch_the_database_cannot_resolve_closes_the_socket_1012(
    live_servers: LiveServers, ws: Clients, proxy: Proxy
) -> None:
    # Reading no scope (what the socket had is not what it asks for) would leave it deaf to
    # the scope it asked for until the next recheck, with nothing said.
    server = live_servers.get("watch-database-away", DATABASES=databases_through(proxy))
    _, tokens = await off_loop(members, 1)
    beta = await off_loop(member_of_a_new_workspace, "member0")
    client = await ws.authenticated(server, tokens[0], scope="acme")
    await proxy.close()
    await client.send("watch", {"scope": "beta"})
    assert await client.closed_with() == 1012

    await proxy.open()
    back = await ws.authenticated(server, tokens[0], scope="beta")
    assert await hears_one_event(back, beta)


def member_of_a_new_workspace(username: str) -> int:
    """Make ``username`` a member of the workspace ``beta`` too; return its id."""
    beta = Workspace.objects.create(name="Beta", slug="beta")
    Membership.objects.create(workspace=beta, user=get_user_model().objects.get(username=username))
    return beta.pk


@only_on("postgresql")
async def test_a_socket_whose_scope_the_worker_cannot_start_hearing_in_time_is_closed_1012(
    live_servers: LiveServers, ws: Clients, settings: Any, proxy: Proxy
) -> None:
    # Only the LISTEN connection goes through the relay. Frozen, it takes no new LISTEN
    # until the worker gives up on that statement (after 8 s here) and replaces the
    # connection: a socket of a scope the worker did not hear yet would read it deaf
    # meanwhile.
    use(settings, PG_NOTIFY)
    server = live_servers.get(
        "late-listen",
        REALTIME_LISTEN_DATABASE=proxy.dsn(str(connection.settings_dict["NAME"])),
        REALTIME_HEARTBEAT_TIMEOUT=8.0,
        **PG_NOTIFY,
        **FAST_BACK,
    )
    _, tokens = await off_loop(members, 2)
    beta = await off_loop(member_of_a_new_workspace, "member1")
    await ws.authenticated(server, tokens[0], scope="acme")
    old = listener_pid_of(await asyncio.to_thread(server.state))
    proxy.freeze()

    late = await ws.connect(server)
    await late.send("authenticate", {"token": tokens[1], "scope": "beta"})
    assert await late.closed_with(timeout=2 * WAIT) == 1012
    assert late.received == []  # no auth_success: the client never thought it heard beta

    # Its client comes back once the worker hears again, and hears what is written.
    await server.wait_for_state(lambda state: state.get("listener_pid") not in (None, old), WAIT)
    again = await ws.authenticated(server, tokens[1], scope="beta")
    assert await hears_one_event(again, beta)
    assert f"following scope {beta} took over 5.0 s; closed its 1 socket(s) 1012" in (
        server.log_text()
    )


async def test_a_cursor_whose_history_cannot_be_read_is_closed_1012_and_resumes_later(
    live_servers: LiveServers, ws: Clients, tmp_path: Path
) -> None:
    # The history is away (its database, Redis) while the worker still follows scopes: a
    # client told `resumed: false` would reload for a blip; closed 1012, it comes back with
    # its cursor and hears exactly what it missed.
    flag = tmp_path / "history-away"
    server = live_servers.get(
        f"history-away-{flag}",
        REALTIME_TRANSPORT="tests.away_history.HistoryAwayTransport",
        TEST_HISTORY_AWAY=str(flag),
    )
    acme = await off_loop(make_workspace, "acme")
    ann, token = await off_loop(make_member, "ann", acme)
    cursor = await went_away(ws, server, token, ann, scope="acme")
    company = await off_loop(Company.objects.create, workspace=acme, name="Initech")
    flag.touch()

    away = await ws.connect(server)
    await away.send("authenticate", {"token": token, "scope": "acme", "resume": cursor})
    assert await away.closed_with() == 1012
    assert away.received == []  # no auth_success: nothing said that is not so

    flag.unlink()
    back, answer = await resuming(ws, server, token, cursor, scope="acme")
    assert answer["data"]["resumed"] is True
    assert kinds(await heard(back, ann)) == [("company.created", company.pk)]
    assert "reading the history to resume 1 socket(s) failed" in server.log_text()
