"""The pg_notify transport: PostgreSQL LISTEN/NOTIFY, for the lowest latency on PostgreSQL.

Publishing is ``SELECT pg_notify(channel, payload), ...`` in one statement, in a transaction
of its own on the default database, so the notifications of one call are delivered together
at its commit; the publishing process needs no listener. Listening is one dedicated
connection per worker (see ``pg_listener``), opened with the first follow, on the DSN of the
default database or of ``REALTIME_LISTEN_DATABASE`` (LISTEN needs a session of its own, so it
must bypass a transaction-pooling PgBouncer). A supervisor restarts the listener task if it
ever stops and has the listener check, against the server, what it LISTENs to.

PostgreSQL caps a notification below 8,000 bytes: messages get a 7,000-byte budget and are
shrunk by the publisher before that. Channel names over 63 bytes are shortened the same way on
both sides (a hash suffix) and mapped back on receipt. Nothing is replayed: what is sent while
the connection is down is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Sequence
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections, transaction

from realtime import limits
from realtime.conf import conf
from realtime.exceptions import PublishError
from realtime.transports.base import Transport
from realtime.transports.pg_listener import ListenerOptions, PgListener
from realtime.transports.table_store import encode_channel

logger = logging.getLogger(__name__)

#: Longest PostgreSQL identifier, in bytes.
MAX_IDENTIFIER_BYTES = 63
#: Notifications per SELECT when one publish carries many.
NOTIFY_CHUNK = 100
# Connection settings Django keeps in OPTIONS that are not libpq parameters.
NOT_LIBPQ = {
    "isolation_level",
    "assume_role",
    "pool",
    "server_side_binding",
    "context",
    "cursor_factory",
    "prepare_threshold",
}


def pg_channel(channel: str) -> str:
    """The PostgreSQL name of a channel: itself, or shortened with a hash when over 63 bytes."""
    encoded = channel.encode("utf-8")
    if len(encoded) <= MAX_IDENTIFIER_BYTES:
        return channel
    digest = hashlib.sha256(encoded).hexdigest()[:12]
    head = encoded[: MAX_IDENTIFIER_BYTES - len(digest) - 1].decode("utf-8", "ignore")
    return f"{head}_{digest}"


def conninfo_of(target: str | None) -> dict[str, Any]:
    """libpq parameters for a ``DATABASES`` alias (default: ``default``) or a DSN."""
    from psycopg.conninfo import conninfo_to_dict

    if target is not None and target not in connections.settings:
        return dict(conninfo_to_dict(target))
    settings_dict = connections[target or "default"].settings_dict
    if connections[target or "default"].vendor != "postgresql":
        raise ImproperlyConfigured("the pg_notify transport needs a PostgreSQL database")
    params: dict[str, Any] = {
        key: value
        for key, value in settings_dict.get("OPTIONS", {}).items()
        if key not in NOT_LIBPQ
    }
    for key, name in (
        ("NAME", "dbname"),
        ("USER", "user"),
        ("PASSWORD", "password"),
        ("HOST", "host"),
        ("PORT", "port"),
    ):
        if settings_dict.get(key):
            params[name] = settings_dict[key]
    return params


class PgNotifyTransport(Transport):
    """Publish with ``pg_notify``, listen on one LISTEN connection per worker."""

    def __init__(
        self,
        *,
        using: str = "default",
        listen_database: str | None = None,
        heartbeat_interval: float | None = None,
        heartbeat_timeout: float | None = None,
        backoff_start: float | None = None,
        backoff_max: float | None = None,
        supervise_interval: float | None = None,
    ) -> None:
        super().__init__()
        self.using = using
        self.max_message_bytes = limits.PG_NOTIFY_BUDGET
        self.listen_database = (
            listen_database if listen_database is not None else conf.LISTEN_DATABASE
        )
        self.options = ListenerOptions(
            heartbeat_interval=_or(heartbeat_interval, conf.HEARTBEAT_INTERVAL),
            heartbeat_timeout=_or(heartbeat_timeout, conf.HEARTBEAT_TIMEOUT),
            backoff_start=_or(backoff_start, conf.RECONNECT_BACKOFF_START),
            backoff_max=_or(backoff_max, conf.RECONNECT_BACKOFF_MAX),
            keepidle=conf.TCP_KEEPIDLE,
            keepintvl=conf.TCP_KEEPINTVL,
            keepcnt=conf.TCP_KEEPCNT,
        )
        self.supervise_interval = _or(supervise_interval, conf.SUPERVISE_INTERVAL)
        for name in ("heartbeat_interval", "heartbeat_timeout", "backoff_start", "backoff_max"):
            if not getattr(self.options, name) > 0:
                raise ImproperlyConfigured(f"pg_notify transport: {name} must be > 0")
        self.listener: PgListener | None = None
        self._names: dict[str, str] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    # Publishing ---------------------------------------------------------------------------

    def publish(self, messages: Sequence[tuple[str, bytes]]) -> None:
        pairs = [
            (pg_channel(_checked(channel)), payload.decode("utf-8"))
            for channel, payload in messages
        ]
        if not pairs:
            return
        # One statement is atomic by itself; several go in one transaction, so that all the
        # notifications are delivered together at its commit.
        several = len(pairs) > NOTIFY_CHUNK
        atomic = transaction.atomic(using=self.using) if several else contextlib.nullcontext()
        try:
            with atomic, connections[self.using].cursor() as cursor:
                for start in range(0, len(pairs), NOTIFY_CHUNK):
                    chunk = pairs[start : start + NOTIFY_CHUNK]
                    calls = ", ".join(["pg_notify(%s, %s)"] * len(chunk))
                    cursor.execute(f"SELECT {calls}", [value for pair in chunk for value in pair])
        except DatabaseError as exc:
            raise PublishError(f"could not notify {len(pairs)} message(s)") from exc

    # Listening ----------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            # First start, or a start on a new loop (a test's): begin from scratch.
            self._loop = loop
            self._tasks = {}
            wanted = self.listener.wanted if self.listener is not None else set()
            self.listener = PgListener(
                conninfo_of(self.listen_database), self.options, self._received, _database_answers
            )
            self.listener.wanted |= wanted
        self._ensure_tasks()

    def _ensure_tasks(self) -> None:
        listener, loop = self.listener, self._loop
        if listener is None or loop is None:
            return
        for name, work in (("listener", listener.run), ("supervisor", self._supervise)):
            task = self._tasks.get(name)
            if task is None or task.done():
                if task is not None and not task.cancelled():
                    error = task.exception()
                    logger.error(
                        "realtime: the pg_notify %s stopped; restarting it", name, exc_info=error
                    )
                self._tasks[name] = loop.create_task(work())

    async def _supervise(self) -> None:
        while True:
            await asyncio.sleep(self.supervise_interval)
            try:
                self._ensure_tasks()
                if self.listener is not None and self.listener.connected.is_set():
                    self.listener.verify()
            except Exception:
                logger.exception("realtime: a pg_notify supervisor round failed")

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, {}
        for task in tasks.values():
            task.cancel()
        for task in tasks.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._loop = None
        self.listener = None
        self._names.clear()

    async def follow(self, channel: str) -> None:
        name = pg_channel(_checked(channel))
        self._names[name] = channel
        await self.start()
        if self.listener is not None:
            await self.listener.listen(name)

    async def unfollow(self, channel: str) -> None:
        name = pg_channel(_checked(channel))
        self._names.pop(name, None)
        if self.listener is not None:
            self.listener.unlisten(name)

    def _received(self, name: str, payload: str) -> None:
        channel = self._names.get(name)
        if channel is not None:
            self.dispatch(channel, payload.encode("utf-8"))


def _checked(channel: str) -> str:
    encode_channel(channel)  # the same 1,024-byte limit as the table transport
    return channel


async def _database_answers() -> bool:
    """Whether the default database answers a query right now (through Django)."""
    from realtime.blocking import run_blocking

    def ask() -> bool:
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT 1")
        return True

    try:
        return await asyncio.wait_for(run_blocking(ask), 5.0)
    except Exception:
        return False


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value
