"""The contract every transport honours, as one suite each transport's tests run.

A subclass provides the fixtures ``transport`` (built with fast test timings) and
``idle_transport`` (one whose listener waits a long time between reads), and implements
``publish_from_another_process``. Waits are bounded;
absence is proven by a marker published afterwards, never by sleeping.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from realtime.exceptions import ChannelTooLongError
from realtime.positions import StreamPos
from realtime.transports.base import Transport
from tests.helpers import Inbox, off_loop

MARKER = b"marker"


class TransportContract:
    """Mix into a test class that defines the ``transport`` fixture."""

    async def publish(self, transport: Transport, *messages: tuple[str, bytes]) -> None:
        await off_loop(transport.publish, list(messages))

    def publish_from_another_process(self, channel: str, payload: str) -> None:
        raise NotImplementedError

    async def test_round_trip_delivers_channel_and_payload(
        self, transport: Transport, inbox: Inbox
    ) -> None:
        transport.add_listener(inbox)
        await transport.follow("room:42")
        await self.publish(transport, ("room:42", '{"hello": "wörld"}'.encode()))
        await inbox.wait_for("room:42", '{"hello": "wörld"}'.encode())
        assert inbox.messages == [("room:42", '{"hello": "wörld"}'.encode())]

    async def test_only_followed_channels_are_heard(
        self, transport: Transport, inbox: Inbox
    ) -> None:
        transport.add_listener(inbox)
        await transport.follow("followed")
        await self.publish(transport, ("other", b"not for us"), ("followed", MARKER))
        await inbox.wait_for("followed", MARKER)
        assert inbox.messages == [("followed", MARKER)]

    async def test_every_listener_hears_each_message(self, transport: Transport) -> None:
        first, second = Inbox(), Inbox()
        transport.add_listener(first)
        transport.add_listener(second)
        await transport.follow("c")
        await self.publish(transport, ("c", b"one"))
        await first.wait_for("c", b"one")
        await second.wait_for("c", b"one")
        assert first.messages == second.messages == [("c", b"one")]

    async def test_unfollowed_channel_is_no_longer_heard(
        self, transport: Transport, inbox: Inbox
    ) -> None:
        transport.add_listener(inbox)
        await transport.follow("left")
        await transport.follow("stays")
        await transport.unfollow("left")
        await self.publish(transport, ("left", b"after unfollow"), ("stays", MARKER))
        await inbox.wait_for("stays", MARKER)
        assert inbox.payloads("left") == []

    async def test_nothing_published_before_a_follow_is_delivered(
        self, transport: Transport, inbox: Inbox
    ) -> None:
        transport.add_listener(inbox)
        await transport.follow("warm-up")
        await self.publish(transport, ("late", b"before follow"))
        await transport.follow("late")
        await self.publish(transport, ("late", b"after follow"))
        await inbox.wait_for("late", b"after follow")
        assert inbox.payloads("late") == [b"after follow"]

    async def test_messages_of_one_publish_arrive_in_order(
        self, transport: Transport, inbox: Inbox
    ) -> None:
        transport.add_listener(inbox)
        await transport.follow("a")
        await transport.follow("b")
        messages = [("a" if n % 2 else "b", str(n).encode()) for n in range(20)]
        await self.publish(transport, *messages)
        await inbox.wait_for("b", b"18")
        await inbox.wait_for("a", b"19")
        assert inbox.messages == messages

    async def test_a_failing_listener_does_not_stop_the_others(
        self, transport: Transport, inbox: Inbox, caplog: pytest.LogCaptureFixture
    ) -> None:
        def broken(channel: str, payload: bytes, position: StreamPos | None) -> None:
            raise RuntimeError("listener bug")

        transport.add_listener(broken)
        transport.add_listener(inbox)
        await transport.follow("c")
        with caplog.at_level(logging.ERROR, logger="realtime"):
            await self.publish(transport, ("c", b"first"), ("c", b"second"))
            await inbox.wait_for("c", b"second")
        assert inbox.payloads("c") == [b"first", b"second"]
        failures = [r for r in caplog.records if "listener" in r.getMessage()]
        assert len(failures) == 2
        assert all(r.exc_info and r.exc_info[0] is RuntimeError for r in failures)

    async def test_long_channel_names_round_trip(self, transport: Transport, inbox: Inbox) -> None:
        transport.add_listener(inbox)
        longest = "é" * 512  # 1,024 bytes in UTF-8: the most a channel may take
        near_twin = "é" * 511 + "e"
        await transport.follow(longest)
        await transport.follow(near_twin)
        await self.publish(transport, (longest, b"long"), (near_twin, b"twin"))
        await inbox.wait_for(near_twin, b"twin")
        assert inbox.messages == [(longest, b"long"), (near_twin, b"twin")]

    async def test_a_channel_over_1024_bytes_is_refused_and_nothing_is_published(
        self, transport: Transport, inbox: Inbox
    ) -> None:
        transport.add_listener(inbox)
        await transport.follow("ok")
        too_long = "x" * 1025
        with pytest.raises(ChannelTooLongError, match="1025 bytes"):
            await self.publish(transport, ("ok", b"same batch"), (too_long, b"refused"))
        with pytest.raises(ChannelTooLongError):
            await transport.follow(too_long)
        await self.publish(transport, ("ok", MARKER))
        await inbox.wait_for("ok", MARKER)
        assert inbox.messages == [("ok", MARKER)]

    async def test_a_publish_from_another_process_is_heard(
        self, transport: Transport, inbox: Inbox
    ) -> None:
        transport.add_listener(inbox)
        await transport.follow("cross")
        await off_loop(self.publish_from_another_process, "cross", "from afar")
        await inbox.wait_for("cross", b"from afar")
        assert inbox.messages == [("cross", b"from afar")]

    async def test_start_and_stop_are_idempotent(self, transport: Transport, inbox: Inbox) -> None:
        transport.add_listener(inbox)
        await transport.start()
        await transport.start()
        await transport.stop()
        await transport.stop()
        await transport.follow("again")
        await self.publish(transport, ("again", b"after restart"))
        await inbox.wait_for("again", b"after restart")

    async def test_stop_returns_promptly_while_idle(self, idle_transport: Transport) -> None:
        # ``idle_transport`` waits a minute between polls (or for a notification): stop must
        # interrupt that wait. The bound is a safety net far below the wait, not a timing.
        await idle_transport.follow("idle")
        await asyncio.wait_for(idle_transport.stop(), timeout=10)
