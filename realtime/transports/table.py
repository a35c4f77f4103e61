"""The table transport: pub/sub over ``firm_channel_messages``, on any Django database.

Publishing inserts one row per message in one transaction; listening is ``Poller``'s thread
(see ``table_poller`` for why it keeps a floor rather than a watermark). The table is also the
log resumable delivery reads (``log_bounds``, ``log_marks``, ``read_log``): publishers
serialize, so ids grow in commit order (see ``MessageStore.insert``). Expired rows are
trimmed beside publishing (see ``trimming``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Sequence
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError

from realtime.conf import conf
from realtime.exceptions import PublishError
from realtime.transports.base import LogEntry, Transport, or_setting
from realtime.transports.table_poller import Poller
from realtime.transports.table_store import MessageStore, encode_channel
from realtime.transports.trimming import Trimmer

logger = logging.getLogger(__name__)
#: Whether the warning about an in-memory SQLite database was given (once per process).
_memory_warned = False


def in_memory_sqlite(database: dict[str, Any]) -> bool:
    """Whether ``database`` (an entry of ``DATABASES``) is an in-memory SQLite database: the
    test database Django makes for SQLite unless ``TEST["NAME"]`` names a file."""
    name = str(database.get("NAME") or "")
    in_memory = name == ":memory:" or "mode=memory" in name
    return "sqlite" in str(database.get("ENGINE", "")) and in_memory


def _warn_in_memory(using: str) -> None:
    global _memory_warned
    if _memory_warned or not in_memory_sqlite(settings.DATABASES.get(using, {})):
        return
    _memory_warned = True
    logger.warning(
        "realtime: the table transport polls an in-memory SQLite database (%r): its poller "
        'thread shares it with the writers, and publishes may fail with "database table is '
        'locked". Give the tests a database file: DATABASES[%r]["TEST"] = '
        '{"NAME": BASE_DIR / "test_db.sqlite3"}.',
        settings.DATABASES[using].get("NAME"),
        using,
    )


class TableTransport(Transport):
    """Publish by INSERT, listen by polling. Arguments left ``None`` come from settings."""

    def __init__(
        self,
        *,
        using: str = "default",
        polling_interval: float | None = None,
        commit_grace: float | None = None,
        retention: float | None = None,
        auto_trim: bool | None = None,
        trim_batch_size: int | None = None,
        max_payload: int | None = None,
    ) -> None:
        super().__init__()
        self.store = MessageStore(using)
        self.publishes_on = using
        self.polling_interval = or_setting(polling_interval, conf.POLLING_INTERVAL)
        self.commit_grace = or_setting(commit_grace, conf.COMMIT_GRACE)
        self.max_message_bytes: int = or_setting(max_payload, conf.MAX_PAYLOAD)
        self._validate()
        self.trimmer = Trimmer(
            self.store,
            or_setting(retention, conf.MESSAGE_RETENTION),
            or_setting(trim_batch_size, conf.TRIM_BATCH_SIZE),
            or_setting(auto_trim, conf.AUTO_TRIM),
            "table transport",
        )
        self._poller = Poller(self.store, self.polling_interval, self.commit_grace)
        self._poller.room = self._room

    def _validate(self) -> None:
        if not self.polling_interval > 0:
            raise ImproperlyConfigured("table transport: the polling interval must be > 0")
        if not self.commit_grace > 0:
            raise ImproperlyConfigured("table transport: the commit grace must be > 0")
        if self.max_message_bytes < 1:
            raise ImproperlyConfigured("table transport: the payload cap must be >= 1")

    def publish(self, messages: Sequence[tuple[str, bytes]], *, txn: str | None = None) -> None:
        rows = [(encode_channel(channel), payload) for channel, payload in messages]
        if not rows:
            return
        try:
            self.store.insert(rows)
        except DatabaseError as exc:
            raise PublishError(f"could not insert {len(rows)} message(s)") from exc
        self.trimmer.published(len(rows))

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self._poller.running and self._poller.loop is not loop:
            # Started on a loop that is gone (a test's): begin again on this one.
            await asyncio.to_thread(self._poller.stop)
        if not self._poller.running:
            _warn_in_memory(self.store.using)
            self._poller.start(loop, self._deliver)

    async def stop(self) -> None:
        await asyncio.to_thread(self._poller.stop)

    async def follow(self, channel: str) -> None:
        encoded = encode_channel(channel)
        await self.start()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._poller.follow(encoded, future)
        await future

    async def unfollow(self, channel: str) -> None:
        self._poller.unfollow(encode_channel(channel))

    def watch(self) -> None:
        self._poller.watch()
        self.trimmer.watch()

    def _room(self) -> int | None:
        # Read on the poller's thread: the listeners' queue only drains meanwhile (the
        # poller is its only producer, and waits for its last batch), so this is a floor.
        return self.room()

    def _deliver(self, rows: list[tuple[str, bytes, int]]) -> None:
        # On the event loop, where unfollow runs too: a poll that read a channel just before
        # it was unfollowed delivers nothing of it.
        for channel, payload, position in rows:
            if self._poller.follows(channel.encode("utf-8")):
                self.dispatch(channel, payload, position)

    def log_bounds(self) -> tuple[int | None, int] | None:
        return self.store.bounds()

    def marked_log_bounds(self) -> tuple[int | None, int, str] | None:
        return self.store.marked_bounds()

    def log_marks(self, positions: Collection[int]) -> dict[int, str]:
        return self.store.marks(positions)

    def read_log(self, channels: Sequence[str], after: int, limit: int) -> list[LogEntry]:
        return self.store.read_log(channels, after, limit)

    def trim(self, retention: float | None = None, batch_size: int | None = None) -> int:
        """Delete one batch of expired rows now, in this thread; return how many went."""
        return self.trimmer.trim(retention, batch_size)

    def wait_for_trims(self, timeout: float | None = None) -> None:
        """Block until the trims submitted so far have run (for tests and benchmarks)."""
        self.trimmer.wait(timeout)

    def close(self) -> None:
        """Finish pending trims, release the trimming thread, ask the poller to stop."""
        self._poller.request_stop()
        self.trimmer.close()
