"""The signals an application listens to, received in the process serving the socket."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from realtime.consumers import RealtimeConsumer
from realtime.signals import frame_received, socket_disconnected
from realtime.testing import in_thread, realtime_client
from tests.testapp.models import Membership, Workspace

pytestmark = pytest.mark.django_db(transaction=True)


def member() -> Any:
    workspace = Workspace.objects.create(name="Acme", slug="acme")
    user = get_user_model().objects.create_user(username="ann")
    Membership.objects.create(workspace=workspace, user=user)
    return user


async def test_frames_of_other_types_reach_frame_received() -> None:
    user = await in_thread(member)
    heard: list[dict[str, Any]] = []
    arrived = asyncio.Event()

    async def receiver(sender: Any, **kwargs: Any) -> None:
        if kwargs["event_type"] == "app.ping":
            heard.append({"sender": sender, **kwargs})
            arrived.set()

    frame_received.connect(receiver)
    try:
        async with realtime_client(user, scope="acme") as client:
            await client.send("app.ping", {"x": 1})
            await asyncio.wait_for(arrived.wait(), 5)
    finally:
        frame_received.disconnect(receiver)
    (call,) = heard
    assert call["sender"] is RealtimeConsumer
    assert isinstance(call["consumer"], RealtimeConsumer)
    assert call["user"].pk == user.pk
    assert call["data"] == {"x": 1}


async def test_frame_received_reads_a_data_that_is_not_an_object_as_empty() -> None:
    user = await in_thread(member)
    heard: list[Any] = []
    arrived = asyncio.Event()

    async def receiver(sender: Any, **kwargs: Any) -> None:
        heard.append(kwargs["data"])
        if len(heard) == 3:
            arrived.set()

    frame_received.connect(receiver)
    try:
        async with realtime_client(user, scope="acme") as client:
            for data in ([1, 2], "text", None):
                await client.send("app.ping", data)
            await asyncio.wait_for(arrived.wait(), 5)
    finally:
        frame_received.disconnect(receiver)
    assert heard == [{}, {}, {}]


async def test_a_failing_receiver_is_logged_and_the_socket_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    user = await in_thread(member)

    def broken(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("receiver bug")

    frame_received.connect(broken)
    try:
        async with realtime_client(user, scope="acme") as client:
            await client.send("app.ping", None)
            assert await client.frames_before_marker() == []
    finally:
        frame_received.disconnect(broken)
    assert any("signal receiver" in record.getMessage() for record in caplog.records)


async def test_socket_disconnected_is_sent_on_every_exit_path() -> None:
    user = await in_thread(member)
    codes: list[Any] = []
    users: list[Any] = []
    ended = asyncio.Event()

    async def receiver(sender: Any, consumer: Any, user: Any, code: Any, **kwargs: Any) -> None:
        codes.append(code)
        users.append(user)
        ended.set()

    socket_disconnected.connect(receiver)
    try:
        async with realtime_client(user, scope="acme"):
            pass  # the client leaves
        await asyncio.wait_for(ended.wait(), 5)
        ended.clear()
        with pytest.raises(AssertionError, match="Invalid authentication token"):
            async with realtime_client(user, token="refused"):
                pass
        await asyncio.wait_for(ended.wait(), 5)
    finally:
        socket_disconnected.disconnect(receiver)
    assert [getattr(u, "pk", None) for u in users] == [user.pk, None]
    assert codes[1] == 1008
