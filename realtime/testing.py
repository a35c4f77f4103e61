"""Helpers for an application's own tests of what its sockets hear.

``RealtimeClient`` is a socket on the consumer in the test's own process (Channels'
``WebsocketCommunicator``), authenticated like a browser would be, fed by the real transport.
Announcements go out after commit, so use it from transactional tests
(``TransactionTestCase``, or ``@pytest.mark.django_db(transaction=True)``)::

    async def test_new_contacts_are_announced(user, workspace):
        async with realtime_client(user, scope=workspace.slug) as client:
            await client.subscribe("contact")
            await in_thread(Contact.objects.create, workspace=workspace, name="Ann")
            frame = await client.receive("contact.created")
            assert frame["data"]["name"] == "Ann"
            assert await client.frames_before_marker() == []   # nothing else came

Waits are bounded (``timeout`` seconds). Absence is proven with a marker: an account event
sent after the fact arrives after anything published before it, so what arrived before the
marker is everything that was going to arrive.

``raise_preparation_failures()`` makes a failure to prepare an announcement raise in the
write that met it, instead of being logged: call it once for the whole test run (in a
``conftest.py``, or a test runner's setup) so that a systematic failure fails tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connections

from realtime.auth import issue_token
from realtime.blocking import close_connections
from realtime.broadcast import broadcast_to_user
from realtime.consumers import RealtimeConsumer
from realtime.signals import frame_received
from realtime.transports import reset_transport
from realtime.writes.failsafe import raise_failures

MARKER = "realtime.test_marker"
SETTLE = "realtime.test_settle"
Frame = dict[str, Any]
T = TypeVar("T")


_settled: dict[str, asyncio.Event] = {}


async def _on_frame(sender: Any, event_type: str, data: Any, **kwargs: Any) -> None:
    if event_type == SETTLE and isinstance(data, dict):
        handled = _settled.get(str(data.get("key")))
        if handled is not None:
            handled.set()


frame_received.connect(_on_frame, dispatch_uid="realtime.testing.settle")


def raise_preparation_failures(on: bool = True) -> None:
    """Raise, in the write that met it, any failure to prepare an announcement (realtime logs
    it and lets the write go on otherwise). What your own hooks raise (``payload=``, the auth
    hooks) is still logged where they are called, as in production."""
    raise_failures(on)


async def in_thread(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run database code from a test's event loop, closing the thread's connections after
    (a connection left open would keep PostgreSQL from dropping the test database)."""

    def run() -> T:
        try:
            return function(*args, **kwargs)
        finally:
            connections.close_all()

    return await asyncio.to_thread(run)


class RealtimeClient:
    """An authenticated socket in the test's process, with bounded waits."""

    def __init__(self, communicator: WebsocketCommunicator, user_id: Any) -> None:
        self.communicator = communicator
        self.user_id = user_id
        self.auth_answer: Frame | None = None
        self._buffer: list[Frame] = []

    @classmethod
    async def connect(
        cls,
        user: Any,
        *,
        token: str | None = None,
        timeout: float = 5.0,
        application: Any = None,
        **ask: Any,
    ) -> RealtimeClient:
        """Open a socket and authenticate as ``user`` (``scope=``/``scopes=`` as the protocol)."""
        if token is None:
            token = await in_thread(issue_token, user)
        communicator = WebsocketCommunicator(application or RealtimeConsumer.as_asgi(), "/api/ws")
        connected, _ = await communicator.connect(timeout)
        if not connected:
            raise AssertionError("the consumer refused the connection")
        client = cls(communicator, user.pk)
        await client.send("authenticate", {"token": token, **ask})
        client.auth_answer = await client.next_frame(timeout)
        if client.auth_answer.get("type") != "auth_success":
            # Let the consumer finish (it closes the socket and says so) before failing.
            with contextlib.suppress(Exception):
                await communicator.wait(timeout)
            raise AssertionError(f"authentication failed: {client.auth_answer}")
        return client

    async def send(self, type_: str, data: Any = None) -> None:
        await self.communicator.send_json_to({"type": type_, "data": data})

    async def subscribe(self, *channels: str) -> None:
        """Subscribe, and return once the server has taken it into account."""
        await self.send("subscribe", {"channels": list(channels)})
        await self._settle()

    async def unsubscribe(self, *channels: str) -> None:
        await self.send("unsubscribe", {"channels": list(channels)})
        await self._settle()

    async def watch(self, **ask: Any) -> None:
        await self.send("watch", ask)
        await self._settle()

    async def _settle(self, timeout: float = 5.0) -> None:
        # The consumer handles frames in order: once a frame of ours sent afterwards has
        # reached ``frame_received`` (in this very process), the one before was handled.
        key = uuid.uuid4().hex
        handled = _settled[key] = asyncio.Event()
        try:
            await self.send(SETTLE, {"key": key})
            await asyncio.wait_for(handled.wait(), timeout)
        finally:
            _settled.pop(key, None)

    async def next_frame(self, timeout: float = 5.0) -> Frame:
        """The next frame the server sends; fails after ``timeout`` seconds."""
        if self._buffer:
            return self._buffer.pop(0)
        frame: Frame = json.loads(await self.communicator.receive_from(timeout))
        return frame

    async def receive(self, event: str | Callable[[Frame], bool], timeout: float = 5.0) -> Frame:
        """Wait for a frame of type ``event`` (or matching it); skip the others. After
        ``timeout`` seconds, fail with an ``AssertionError`` naming what was awaited and
        the frames skipped meanwhile."""
        matches = event if callable(event) else (lambda frame: frame.get("type") == event)
        skipped: list[Frame] = []
        try:
            async with asyncio.timeout(timeout):
                while True:
                    frame = await self.next_frame(timeout)
                    if matches(frame):
                        return frame
                    skipped.append(frame)
        except TimeoutError:
            awaited = getattr(event, "__name__", "a frame") if callable(event) else repr(event)
            raise AssertionError(
                f"no {awaited} frame within {timeout} s; received meanwhile: {skipped}"
            ) from None

    async def frames_before_marker(self, timeout: float = 5.0) -> list[Frame]:
        """Send a marker to this account; return every frame received before it arrived.
        Each call's marker is its own: the markers of another client of the same account
        (which reach every socket of it) are neither taken for it nor returned."""
        key = uuid.uuid4().hex
        await in_thread(broadcast_to_user, self.user_id, MARKER, {"key": key})
        before, self._buffer = self._buffer, []
        async with asyncio.timeout(timeout):
            while True:
                frame: Frame = json.loads(await self.communicator.receive_from(timeout))
                if frame.get("type") == MARKER:
                    if frame.get("data") == {"key": key}:
                        return before
                    continue  # another client's, or an earlier call's that timed out
                before.append(frame)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.communicator.disconnect()


#: The ``realtime_client`` blocks open in this process.
_open_clients = 0


@contextlib.asynccontextmanager
async def realtime_client(user: Any, **options: Any) -> AsyncIterator[RealtimeClient]:
    """``async with realtime_client(user, scope="acme") as client``: connected, then closed.
    When the last one open closes, the process's transport stops and the database
    connections realtime's threads (and asgiref's) keep are closed: a test database cannot
    be dropped while they are open."""
    global _open_clients
    _open_clients += 1
    try:
        client = await RealtimeClient.connect(user, **options)
        try:
            yield client
        finally:
            await client.close()
    finally:
        _open_clients -= 1
        if not _open_clients:
            await asyncio.to_thread(_stop_transport)
            await sync_to_async(connections.close_all)()  # asgiref's thread's


def _stop_transport() -> None:
    reset_transport()
    close_connections()


def release() -> None:
    """Stop this process's transport and close the database connections realtime's threads
    and asgiref's thread keep. Call it once your tests are done (a session fixture's
    teardown) when they drive the consumer other than through ``realtime_client``, or
    broadcast from async code: PostgreSQL refuses to drop a test database while a connection
    to it is open. Call it outside an event loop."""
    _stop_transport()
    asyncio.run(sync_to_async(connections.close_all)())
