"""Log budgets end to end: what a client can cause never hides realtime's own lines, and one
failing application hook never hides another's.

A hostile client flooding bad frames spends the budget of lines clients cause; the worker
must still say that its database went away. A hook failing on every frame is logged with its
traceback, within a budget of its own place. Waits are bounded; the server's lines are read
from its output.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from realtime import logs
from realtime.auth import issue_token
from realtime.signals import frame_received, socket_disconnected
from realtime.testing import in_thread, realtime_client
from tests.helpers import eventually, off_loop, only_on
from tests.live import Clients, LiveServers, Server
from tests.proxy import Proxy, databases_through
from tests.testapp.models import Membership, Workspace

pytestmark = pytest.mark.django_db(transaction=True)

#: More lines than the budget of lines clients cause holds in a minute.
FLOOD = logs.CLIENT_LINES_PER_MINUTE + 10


def member() -> Any:
    workspace = Workspace.objects.create(name="Acme", slug="acme")
    user = get_user_model().objects.create_user(username="ann")
    Membership.objects.create(workspace=workspace, user=user)
    return user


async def printed(server: Server, text: str) -> None:
    """Wait, bounded, until the server has printed ``text``."""
    await eventually(lambda: text in server.log_text())


@only_on("postgresql", "mysql")
async def test_a_flood_of_bad_frames_does_not_hide_the_database_going_away(
    live_servers: LiveServers, ws: Clients, proxy: Proxy
) -> None:
    # Every connection of the worker goes through the relay; it rechecks its sockets often.
    server = live_servers.get(
        "log-budgets", DATABASES=databases_through(proxy), REALTIME_RECHECK_INTERVAL=0.5
    )
    user = await off_loop(member)
    # A socket in: the worker polls the log and rechecks that socket from then on.
    await ws.authenticated(server, await off_loop(issue_token, user), scope="acme")
    for _ in range(FLOOD):
        client = await ws.connect(server)
        await client.send_raw("not a frame")
        assert await client.closed_with() == 1008
    await proxy.close()  # the database goes away
    # The table poller's outage, and the recheck that failed with it, are still told.
    await printed(server, "realtime: polling firm_channel_messages failed (attempt 1")
    await printed(server, "realtime: rechecking 1 sockets failed")


async def test_a_failing_hook_is_logged_with_its_traceback_and_never_hides_another_hook_s(
    caplog: pytest.LogCaptureFixture,
) -> None:
    user = await in_thread(member)

    def on_every_frame(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("a receiver failing on every frame")

    def on_disconnect(sender: Any, **kwargs: Any) -> None:
        raise LookupError("a receiver failing once")

    def lines_of(error: type[Exception]) -> list[logging.LogRecord]:
        return [
            record
            for record in caplog.records
            if record.exc_info is not None and isinstance(record.exc_info[1], error)
        ]

    frame_received.connect(on_every_frame)
    socket_disconnected.connect(on_disconnect)
    try:
        with caplog.at_level(logging.DEBUG, logger="realtime"):
            async with realtime_client(user, scope="acme") as client:
                for number in range(FLOOD):
                    await client.send("app.ping", {"n": number})
                await client.watch(scope="acme")  # handled once every ping before it was
            # The socket is closed: its disconnect receiver fails too, at another place.
            await eventually(lambda: bool(lines_of(LookupError)))
    finally:
        frame_received.disconnect(on_every_frame)
        socket_disconnected.disconnect(on_disconnect)
    assert len(lines_of(RuntimeError)) == logs.PLACE_LINES_PER_MINUTE
    (line,) = lines_of(LookupError)
    assert line.levelno == logging.ERROR
    assert "signal receiver" in line.getMessage()
    assert line.exc_info is not None
    assert line.exc_info[2] is not None  # the traceback
