"""The table transport: pub/sub over ``firm_channel_messages``, on any Django database.

Publishing inserts one row per message in one transaction; listening is ``Poller``'s thread
(see ``table_poller`` for why it keeps a floor rather than a watermark). The table is a buffer,
not a log: each published message has a ``2 / trim_batch_size`` chance of submitting a trim of
expired rows to one background thread, so trimming keeps pace with publishing on average.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError

from realtime.conf import conf
from realtime.exceptions import PublishError
from realtime.transports.base import Transport
from realtime.transports.table_poller import Poller, close_connection
from realtime.transports.table_store import MessageStore, encode_channel

logger = logging.getLogger(__name__)

T = TypeVar("T")


def _or(value: T | None, default: T) -> T:
    return default if value is None else value


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
        self.polling_interval = _or(polling_interval, conf.POLLING_INTERVAL)
        self.commit_grace = _or(commit_grace, conf.COMMIT_GRACE)
        self.retention = _or(retention, conf.MESSAGE_RETENTION)
        self.auto_trim = _or(auto_trim, conf.AUTO_TRIM)
        self.trim_batch_size = _or(trim_batch_size, conf.TRIM_BATCH_SIZE)
        self.max_message_bytes: int = _or(max_payload, conf.MAX_PAYLOAD)
        self._validate()
        self._poller = Poller(self.store, self.polling_interval, self.commit_grace)
        self._trimmer: ThreadPoolExecutor | None = None
        self._last_trim: Future[int] | None = None

    def _validate(self) -> None:
        if not self.polling_interval > 0:
            raise ImproperlyConfigured("table transport: the polling interval must be > 0")
        if not self.commit_grace > 0:
            raise ImproperlyConfigured("table transport: the commit grace must be > 0")
        if not self.retention >= 0:
            raise ImproperlyConfigured("table transport: the retention must be >= 0")
        if self.trim_batch_size < 1:
            raise ImproperlyConfigured("table transport: the trim batch size must be >= 1")
        if self.max_message_bytes < 1:
            raise ImproperlyConfigured("table transport: the payload cap must be >= 1")

    def publish(self, messages: Sequence[tuple[str, bytes]]) -> None:
        rows = [(encode_channel(channel), payload) for channel, payload in messages]
        if not rows:
            return
        try:
            self.store.insert(rows)
        except DatabaseError as exc:
            raise PublishError(f"could not insert {len(rows)} message(s)") from exc
        if self.auto_trim:
            expected = len(rows) * 2 / self.trim_batch_size
            for _ in range(int(expected) + (random.random() < expected % 1)):
                self._submit_trim()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self._poller.running and self._poller.loop is not loop:
            # Started on a loop that is gone (a test's): begin again on this one.
            await asyncio.to_thread(self._poller.stop)
        if not self._poller.running:
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

    def _deliver(self, rows: list[tuple[str, bytes]]) -> None:
        # On the event loop, where unfollow runs too: a poll that read a channel just before
        # it was unfollowed delivers nothing of it.
        for channel, payload in rows:
            if self._poller.follows(channel.encode("utf-8")):
                self.dispatch(channel, payload)

    def trim(self, retention: float | None = None, batch_size: int | None = None) -> int:
        """Delete one batch of expired rows now, in this thread; return how many went."""
        retention = _or(retention, self.retention)
        return len(self.store.trim_batch(retention, _or(batch_size, self.trim_batch_size)))

    def wait_for_trims(self, timeout: float | None = None) -> None:
        """Block until the trims submitted so far have run (for tests and benchmarks)."""
        if self._last_trim is not None:
            self._last_trim.result(timeout)

    def close(self) -> None:
        """Finish pending trims, release the trimming thread, ask the poller to stop."""
        self._poller.request_stop()
        trimmer, self._trimmer = self._trimmer, None
        if trimmer is not None:
            trimmer.submit(close_connection, self.store.using)
            trimmer.shutdown(wait=True)

    def _submit_trim(self) -> None:
        if self._trimmer is None:
            self._trimmer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="realtime-trim")
        self._last_trim = self._trimmer.submit(self._trim_in_background)

    def _trim_in_background(self) -> int:
        try:
            return self.trim()
        except Exception:
            logger.exception("realtime: trimming firm_channel_messages failed")
            close_connection(self.store.using)
            return 0
