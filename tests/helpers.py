"""Helpers for tests: waiting for messages with a bound, running code off the event loop,
and starting Django subprocesses on the test database."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from django.db import connection, connections

from realtime.positions import StreamPos

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent
WAIT = 10.0


class Inbox:
    """A transport listener that records what it hears and lets a test wait for it."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, bytes]] = []
        #: The position of each message heard, in the same order (``None`` without a history).
        self.places: list[StreamPos | None] = []
        self._arrived = asyncio.Event()

    def __call__(self, channel: str, payload: bytes, position: StreamPos | None = None) -> None:
        self.messages.append((channel, payload))
        self.places.append(position)
        self._arrived.set()

    @property
    def positions(self) -> list[int | None]:
        """The offset of each message heard (a global log's: its id)."""
        return [None if place is None else place.seq for place in self.places]

    def heard_at(self) -> list[StreamPos]:
        """The position of each message heard, from a transport that keeps a history."""
        assert None not in self.places, self.places
        return [place for place in self.places if place is not None]

    def payloads(self, channel: str | None = None) -> list[bytes]:
        return [p for c, p in self.messages if channel is None or c == channel]

    async def wait_for(self, channel: str, payload: bytes, timeout: float = WAIT) -> None:
        """Wait, at most ``timeout`` seconds, until ``payload`` was heard on ``channel``."""
        async with asyncio.timeout(timeout):
            while (channel, payload) not in self.messages:
                self._arrived.clear()
                await self._arrived.wait()


class SmallQueue:
    """A listener with a queue of ``size`` messages that drains ``per_tick`` at a time, as a
    delivery queue whose sockets are slower than the database."""

    def __init__(self, size: int, per_tick: int) -> None:
        self.size = size
        self.per_tick = per_tick
        self.queued: list[tuple[str, bytes]] = []
        self.heard: list[bytes] = []
        self.overflowed = 0

    def __call__(self, channel: str, payload: bytes, position: StreamPos | None = None) -> None:
        if len(self.queued) >= self.size:
            self.overflowed += 1
            return
        self.queued.append((channel, payload))

    def room(self) -> int:
        return self.size - len(self.queued)

    async def drain(self) -> None:
        while True:
            await asyncio.sleep(0.01)
            taken, self.queued = self.queued[: self.per_tick], self.queued[self.per_tick :]
            self.heard += [payload for _, payload in taken]


async def off_loop(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run blocking (database) code in a thread, closing that thread's connections after."""

    def run() -> T:
        try:
            return function(*args, **kwargs)
        finally:
            connections.close_all()

    return await asyncio.to_thread(run)


@contextlib.asynccontextmanager
async def calling_every(tick: float, function: Callable[[], Any]) -> AsyncIterator[None]:
    """Call ``function`` every ``tick`` seconds on the loop while the block runs, as a
    worker's housekeeping calls its watchdogs."""

    async def run() -> None:
        while True:
            await asyncio.sleep(tick)
            function()

    task = asyncio.ensure_future(run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def eventually(condition: Callable[[], bool], timeout: float = WAIT) -> None:
    """Wait, at most ``timeout`` seconds, until ``condition()`` holds: for state that has no
    event to wait on (a poller's counters, a listener's connection), polled."""
    async with asyncio.timeout(timeout):
        while True:
            if condition():
                return
            await asyncio.sleep(0.01)


def db_datetime(value: datetime.datetime) -> Any:
    """A naive UTC datetime as the test database's driver stores it in ``created_at``:
    PostgreSQL takes the datetime, SQLite and MySQL the text Django would write."""
    if connection.vendor == "postgresql":
        return value
    return value.strftime("%Y-%m-%d %H:%M:%S.%f")


def vendor() -> str:
    return connection.vendor


def only_on(*vendors: str) -> pytest.MarkDecorator:
    """Skip a test unless the suite runs on one of ``vendors`` (Django's vendor names)."""
    return pytest.mark.skipif(
        connection.vendor not in vendors, reason=f"needs {' or '.join(vendors)}"
    )


def subprocess_env() -> dict[str, str]:
    """The environment a child needs to use the same (test) database as this process."""
    env = dict(os.environ)
    # Not ``settings.SETTINGS_MODULE``: under ``override_settings`` it reads None.
    env.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    env["REALTIME_TEST_DATABASE_NAME"] = str(connection.settings_dict["NAME"])
    env["PYTHONPATH"] = str(ROOT)
    return env


def start_worker(*args: str) -> subprocess.Popen[str]:
    """Start ``python -m tests.worker ARGS`` on the test database, with pipes to talk to it
    (publishing on Redis when this test does: the others share the table's log)."""
    from realtime.conf import conf

    env = subprocess_env()
    if conf.TRANSPORT == "redis":
        chosen = {"REALTIME_TRANSPORT": "redis", "REALTIME_REDIS_URL": conf.REDIS_URL}
        env["REALTIME_TEST_SETTINGS"] = json.dumps(chosen)
    return subprocess.Popen(
        [sys.executable, "-m", "tests.worker", *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def go_together(processes: list[subprocess.Popen[str]]) -> None:
    """Wait until each child of ``tests.worker`` said ``ready``, then tell them all ``go``: a
    race between them starts once every one has paid for its start-up."""
    for process in processes:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "ready"
    for process in processes:
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()


@contextlib.contextmanager
def log_writes() -> Iterator[list[int]]:
    """The calls writing ``firm_channel_messages`` (``MessageStore.insert``: one ``INSERT``,
    or on PostgreSQL from 100 messages a ``COPY``) made inside the block, each as its number
    of messages: "one publish" is one call, whatever statement it sends."""
    from realtime.transports.table_store import MessageStore

    writes: list[int] = []
    insert = MessageStore.insert

    def counted(store: MessageStore, messages: Any) -> None:
        writes.append(len(messages))
        insert(store, messages)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(MessageStore, "insert", counted)
        yield writes


def returns_rows() -> pytest.MarkDecorator:
    """Skip a test unless the default database's ``UPDATE`` and ``DELETE`` return their rows."""
    from realtime.compat.django_orm import can_return_rows

    return pytest.mark.skipif(
        not can_return_rows("default"), reason="the database returns no rows from writes"
    )


def published() -> list[tuple[str, dict[str, Any]]]:
    """Every message in ``firm_channel_messages``, oldest first, as (channel, decoded JSON)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT channel, payload FROM firm_channel_messages ORDER BY id")
        rows = cursor.fetchall()
    return [(bytes(channel).decode(), json.loads(bytes(payload))) for channel, payload in rows]


def without_mid(message: dict[str, Any]) -> dict[str, Any]:
    """A message without its random ``mid`` (after checking it is there), its place in its
    publication (``pub``, random too: tested in ``tests.test_publications``) and its row's
    order number (``meta.order``, a time or an id: checked well formed; what it orders is
    tested in ``tests.test_record_order``), for comparisons."""
    assert isinstance(message.get("mid"), str)
    assert message["mid"]
    if "pub" in message:
        publication, rest, channels = message["pub"]
        assert isinstance(publication, str)
        assert rest >= 0
        assert channels >= 1
    stripped = {key: value for key, value in message.items() if key not in ("mid", "pub")}
    meta = message.get("meta")
    if isinstance(meta, dict) and "order" in meta:
        source, number, *links = meta["order"]
        assert links in ([], ["links"])
        assert isinstance(source, str)
        assert isinstance(number, int)
        stripped["meta"] = {key: value for key, value in meta.items() if key != "order"}
    return stripped


def events(target: str | None = None) -> list[dict[str, Any]]:
    """The published messages (``mid`` checked and removed), optionally of one target."""
    return [
        without_mid(message)
        for _, message in published()
        if target is None or message.get("target") == target
    ]


def forget_messages() -> None:
    """Empty ``firm_channel_messages`` (a test's own setup announces too)."""
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM firm_channel_messages")


def running_task(transport: Any, name: str) -> asyncio.Task[None]:
    """The task ``name`` (``"listener"``, ``"supervisor"``) a started transport runs."""
    tasks = transport._tasks
    assert tasks is not None, "the transport is not started"
    task = tasks.get(name)
    assert task is not None, f"the transport runs no {name} task"
    return task  # type: ignore[no-any-return]
