"""Redis losing history under a real worker: loud, never silent.

A Redis flushed or restarted without persistence has lost what its streams held, and would
hand out offsets it already gave. The first publish or read after it gives each stream a new
epoch: the worker closes the sockets of those streams 1012, and a cursor of the old epoch is
answered ``resumed: false`` — the client reads the current state, nothing is skipped. (A
flush is seen stream by stream, as each is next written or read; a restart at once, when the
worker's connection comes back.)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from realtime.auth import issue_token
from realtime.broadcast import broadcast_to_user
from tests.helpers import off_loop
from tests.live import Clients, LiveServers
from tests.redis_server import RedisServer
from tests.test_resume_e2e import heard, kinds, resuming
from tests.testapp.models import Company, Membership, Workspace

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def own_redis(sockets_redis: RedisServer) -> Iterator[RedisServer]:
    """A redis-server of this test alone (the one of the other socket tests is never
    flushed nor restarted)."""
    del sockets_redis  # skips alike when redis-server or redis-py is missing
    server = RedisServer()
    server.start()
    yield server
    server.close()


def member() -> tuple[Workspace, Any, str]:
    workspace = Workspace.objects.create(name="Acme", slug="acme")
    user = get_user_model().objects.create_user(username="ann")
    Membership.objects.create(workspace=workspace, user=user)
    return workspace, user, issue_token(user)


@pytest.mark.parametrize("loss", ["flush", "restart"])
async def test_lost_history_closes_live_sockets_1012_and_old_cursors_start_afresh(
    live_servers: LiveServers, ws: Clients, settings: Any, own_redis: RedisServer, loss: str
) -> None:
    settings.REALTIME_TRANSPORT = "redis"
    settings.REALTIME_REDIS_URL = own_redis.url
    server = live_servers.get(
        f"redis-epochs-{own_redis.port}",
        REALTIME_TRANSPORT="redis",
        REALTIME_REDIS_URL=own_redis.url,
        REALTIME_RECONNECT_BACKOFF_START=0.05,
        REALTIME_RECONNECT_BACKOFF_MAX=0.2,
    )
    try:
        workspace, ann, token = await off_loop(member)
        client, _ = await resuming(ws, server, token, scope="acme")
        first = await off_loop(Company.objects.create, workspace=workspace, name="first")
        frame = await client.wait_for(lambda f: f["type"] == "company.created")
        assert frame["data"]["id"] == first.pk
        cursor = frame["cursor"]

        await off_loop(own_redis.flush if loss == "flush" else own_redis.restart)
        # Both streams of the socket learn of it: its scope's, and its account's (base).
        await off_loop(Company.objects.create, workspace=workspace, name="after")
        await off_loop(broadcast_to_user, ann.pk, "user.notice", {"text": "after"})

        assert await client.closed_with(timeout=30) == 1012
        assert [f for f in client.received if f["type"] == "company.created"] == [frame]
        back, answer = await resuming(ws, server, token, cursor, scope="acme")
        assert answer["data"]["resumed"] is False
        assert await heard(back, ann) == []
        live = await off_loop(Company.objects.create, workspace=workspace, name="live")
        assert kinds(await heard(back, ann)) == [("company.created", live.pk)]
    finally:
        server.stop()
