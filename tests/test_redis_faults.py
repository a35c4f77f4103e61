"""The Redis transport under faults, against a real redis-server.

The worker reaches Redis through ``Proxy`` (a TCP relay in the test's event loop): closed,
Redis is unreachable for it (connections cut and refused); frozen, its established
connections go silent while new ones flow (half-open). Publishers reach Redis directly, so
that messages are published while the worker cannot hear them. A restart is a new server
process on the same port, without persistence: everything is gone, as after a crash.
Waits are bounded; absence is proven with a marker published afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from tests.helpers import Inbox, calling_every, eventually, off_loop, running_task
from tests.proxy import Proxy
from tests.redis_server import RedisServer
from tests.test_redis_transport import counted

pytest.importorskip("redis", reason='redis-py is not installed ("[redis]" extra)')

import redis

from realtime.transports import redis_keys
from realtime.transports.redis import LIVE_INLINE, RedisTransport
from realtime.transports.redis_listener import ListenerOptions, RedisListener

MakeTransport = Callable[..., RedisTransport]
MARKER = b"marker"


@pytest.fixture
async def redis_proxy(redis_server: RedisServer) -> AsyncIterator[Proxy]:
    """A relay to the test's redis-server, open; closed after the test (asked for before
    the transports, so that they stop before it closes)."""
    relay = Proxy("127.0.0.1", redis_server.port)
    await relay.open()
    yield relay
    await relay.close()


def through(relay: Proxy) -> str:
    return f"redis://127.0.0.1:{relay.port}/0"


async def publish(transport: RedisTransport, *messages: tuple[str, bytes]) -> None:
    await off_loop(transport.publish, list(messages))


def realtime_records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("realtime") and r.levelno >= level]


async def test_what_is_published_during_a_cut_is_delivered_once_in_order_when_it_ends(
    redis_proxy: Proxy,
    make_redis_transport: MakeTransport,
    inbox: Inbox,
    caplog: pytest.LogCaptureFixture,
) -> None:
    worker = make_redis_transport(url=through(redis_proxy))
    publisher = make_redis_transport()
    worker.add_listener(inbox)
    caught_up = counted("realtime_stream_catch_up_messages_total")
    with caplog.at_level(logging.WARNING, logger="realtime"):
        await worker.follow("c")
        await publish(publisher, ("c", b"before"))
        await inbox.wait_for("c", b"before")
        listener = worker.listener
        assert isinstance(listener, RedisListener)  # standalone: one connection
        await redis_proxy.close()  # the worker can no longer reach Redis
        during = [f"during {n}".encode() for n in range(5)]
        for payload in during:
            await publish(publisher, ("c", payload))
        await eventually(lambda: not listener.connected.is_set())
        await redis_proxy.open()
        await publish(publisher, ("c", MARKER))
        await inbox.wait_for("c", MARKER)
    assert inbox.payloads("c") == [b"before", *during, MARKER]
    assert [p.seq for p in inbox.heard_at()] == list(range(1, 8))
    assert listener.connections == 2
    # What was sent during the cut was read from the stream (the marker may be too).
    assert counted("realtime_stream_catch_up_messages_total") >= caught_up + len(during)
    warnings = [r.getMessage() for r in realtime_records(caplog, logging.WARNING)]
    assert len(warnings) == 2, warnings
    assert "Redis Pub/Sub connection is lost (attempt 1" in warnings[0]
    assert "Redis Pub/Sub connection is back after" in warnings[1]


async def test_a_half_open_connection_is_given_up_within_the_heartbeat_timeout_and_nothing_lost(
    redis_proxy: Proxy, make_redis_transport: MakeTransport, inbox: Inbox
) -> None:
    interval, timeout, backoff = 0.2, 0.3, 0.1
    worker = make_redis_transport(
        url=through(redis_proxy),
        heartbeat_interval=interval,
        heartbeat_timeout=timeout,
        backoff_start=backoff,
        backoff_max=backoff,
    )
    publisher = make_redis_transport()
    worker.add_listener(inbox)
    await worker.follow("h")
    await publish(publisher, ("h", b"before"))
    await inbox.wait_for("h", b"before")
    listener = worker.listener
    assert isinstance(listener, RedisListener)  # standalone: one connection
    # The flow goes silent (a NAT forgot it, the server hangs): nothing errors, nothing
    # answers; new connections are fine.
    redis_proxy.freeze()
    during = [f"during {n}".encode() for n in range(3)]
    for payload in during:
        await publish(publisher, ("h", payload))
    # A PING is due every interval and given up after the timeout; then one backoff and a
    # new connection, which 2 s of slack cover.
    await eventually(lambda: listener.connections == 2, timeout=interval + timeout + backoff + 2)
    await publish(publisher, ("h", MARKER))
    await inbox.wait_for("h", MARKER)
    assert inbox.payloads("h") == [b"before", *during, MARKER]
    assert [p.seq for p in inbox.heard_at()] == list(range(1, 6))


async def test_a_restarted_server_gives_its_streams_a_new_epoch_reported_missed(
    make_redis_transport: MakeTransport, redis_server: RedisServer, inbox: Inbox
) -> None:
    missed: list[frozenset[str]] = []
    worker = make_redis_transport()
    publisher = make_redis_transport()
    worker.add_listener(inbox, missed=missed.append)
    losses = counted("realtime_stream_losses_total")
    await worker.follow("r")
    await publish(publisher, ("r", b"before"))
    await inbox.wait_for("r", b"before")
    (before,) = inbox.heard_at()
    listener = worker.listener
    assert isinstance(listener, RedisListener)  # standalone: one connection
    await off_loop(redis_server.restart)  # nothing kept: the stream is gone
    await eventually(lambda: listener.connections == 2 and bool(missed))
    assert missed == [frozenset(["r"])]
    assert counted("realtime_stream_losses_total") == losses + 1
    # The publisher's pooled connection broke with the server: it goes on a fresh one.
    await publish(publisher, ("r", MARKER))
    await inbox.wait_for("r", MARKER)
    after = inbox.heard_at()[-1]
    assert after.epoch != before.epoch


async def test_a_connection_down_past_the_stall_bound_reports_its_channels_missed(
    redis_proxy: Proxy,
    make_redis_transport: MakeTransport,
    inbox: Inbox,
    caplog: pytest.LogCaptureFixture,
) -> None:
    missed: list[frozenset[str]] = []
    # The stall bound is the heartbeat interval plus its timeout: 0.3 s.
    worker = make_redis_transport(
        url=through(redis_proxy), heartbeat_interval=0.1, heartbeat_timeout=0.2
    )
    publisher = make_redis_transport()
    worker.add_listener(inbox, missed=missed.append)
    with caplog.at_level(logging.WARNING, logger="realtime"):
        await worker.follow("s1")
        await worker.follow("s2")
        await redis_proxy.close()
        await eventually(lambda: bool(missed))
        await redis_proxy.open()
        await publish(publisher, ("s1", MARKER))
        await inbox.wait_for("s1", MARKER)
    assert missed[0] == frozenset(["s1", "s2"])
    errors = [r.getMessage() for r in realtime_records(caplog, logging.ERROR)]
    assert len(errors) == 1, errors
    assert "Redis Pub/Sub connection is down for over 0.3 s" in errors[0]
    assert "closed 1012" in errors[0]


async def test_subscriptions_refused_on_each_new_connection_are_reported_missed_within_the_bound(
    redis_server: RedisServer,
    make_redis_transport: MakeTransport,
    inbox: Inbox,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The connection comes back each time, but the server refuses its subscriptions (here:
    # the worker's Redis account lost its channels). It is not back until they are
    # confirmed: the stall bound still closes the sockets owed.
    admin = redis.Redis.from_url(redis_server.url)
    admin.acl_setuser("deaf", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
                      commands=["+@all"])  # fmt: skip
    try:
        missed: list[frozenset[str]] = []
        # The stall bound is the heartbeat interval plus its timeout: 0.3 s.
        worker = make_redis_transport(
            url=f"redis://deaf:pw@127.0.0.1:{redis_server.port}/0",
            heartbeat_interval=0.1,
            heartbeat_timeout=0.2,
        )
        worker.add_listener(inbox, missed=missed.append)
        await worker.follow("d1")
        await worker.follow("d2")
        with caplog.at_level(logging.WARNING, logger="realtime"):
            admin.acl_setuser("deaf", enabled=True, reset_channels=True)
            admin.client_kill_filter(user="deaf")
            await eventually(lambda: bool(missed))
            assert missed[0] == frozenset(["d1", "d2"])
            assert not [r for r in caplog.records if "is back" in r.getMessage()]
            admin.acl_setuser("deaf", enabled=True, channels=["*"])
            await eventually(lambda: any("is back" in r.getMessage() for r in caplog.records))
            await publish(make_redis_transport(), ("d2", MARKER))
            await inbox.wait_for("d2", MARKER)
        errors = [r.getMessage() for r in realtime_records(caplog, logging.ERROR)]
        assert any("Redis Pub/Sub connection is down for over 0.3 s" in e for e in errors)
    finally:
        admin.acl_deluser("deaf")
        admin.close()


async def test_stream_reads_failing_past_the_stall_bound_are_one_error_and_report_missed(
    make_redis_transport: MakeTransport,
    inbox: Inbox,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    missed: list[frozenset[str]] = []
    # The stall bound is the heartbeat interval plus its timeout: 0.3 s.
    worker = make_redis_transport(heartbeat_interval=0.1, heartbeat_timeout=0.2)
    worker.add_listener(inbox, missed=missed.append)
    await worker.follow("big")
    reading = worker.sequencer.read
    failing = True

    async def read(*args: Any) -> Any:
        if failing:
            raise redis.ConnectionError("the test's reads fail")
        return await reading(*args)

    monkeypatch.setattr(worker.sequencer, "read", read)
    large = b"x" * (LIVE_INLINE + 1)  # sent live by its offset only: read from the stream
    with caplog.at_level(logging.WARNING, logger="realtime"):
        await publish(worker, ("big", large))
        await eventually(lambda: bool(missed))
        failing = False
        await inbox.wait_for("big", large)
    assert missed[0] == frozenset(["big"])
    lines = [r.getMessage() for r in realtime_records(caplog, logging.WARNING)]
    reads = [line for line in lines if "reading the Redis streams" in line]
    assert "failed (attempt 1" in reads[0]
    assert "keeps failing for over 0.3 s" in reads[1]
    assert "closed 1012" in reads[1]
    assert "works again" in reads[-1]
    assert [r.levelname for r in caplog.records if "keeps failing" in r.getMessage()] == ["ERROR"]


async def test_a_stream_trimmed_past_what_a_worker_had_is_reported_missed_and_goes_on(
    redis_proxy: Proxy,
    make_redis_transport: MakeTransport,
    redis_server: RedisServer,
    inbox: Inbox,
) -> None:
    missed: list[frozenset[str]] = []
    worker = make_redis_transport(url=through(redis_proxy))
    publisher = make_redis_transport()
    worker.add_listener(inbox, missed=missed.append)
    await worker.follow("t")
    await publish(publisher, ("t", b"1"))
    await inbox.wait_for("t", b"1")
    listener = worker.listener
    assert isinstance(listener, RedisListener)  # standalone: one connection
    await redis_proxy.close()
    for n in range(2, 6):
        await publish(publisher, ("t", str(n).encode()))
    fourth = redis_server.entries(redis_keys.stream_key("t"))[3][0]
    client = redis_server.client()
    client.xtrim(redis_keys.stream_key("t"), minid=fourth, approximate=False)  # 1-3 gone
    client.close()
    await eventually(lambda: not listener.connected.is_set())
    await redis_proxy.open()
    await inbox.wait_for("t", b"5")
    assert missed == [frozenset(["t"])]
    assert inbox.payloads("t") == [b"1", b"4", b"5"]


async def test_probes_keep_an_idle_connection_alive_on_the_same_connection(
    make_redis_transport: MakeTransport, inbox: Inbox
) -> None:
    worker = make_redis_transport(heartbeat_interval=0.05)
    worker.add_listener(inbox)
    await worker.follow("idle")
    listener = worker.listener
    assert isinstance(listener, RedisListener)  # standalone: one connection
    await eventually(lambda: listener.pings >= 3)
    await publish(worker, ("idle", MARKER))
    await inbox.wait_for("idle", MARKER)
    assert listener.connections == 1


async def test_watch_restarts_a_listener_task_that_stopped_and_reads_what_it_missed(
    make_redis_transport: MakeTransport, inbox: Inbox, caplog: pytest.LogCaptureFixture
) -> None:
    worker = make_redis_transport(supervise_interval=600.0)
    publisher = make_redis_transport()
    worker.add_listener(inbox)
    await worker.follow("w")
    listener = worker.listener
    assert isinstance(listener, RedisListener)  # standalone: one connection
    task = running_task(worker, "listener")
    task.cancel()
    await asyncio.wait({task})
    await publish(publisher, ("w", b"while stopped"))
    with caplog.at_level(logging.ERROR, logger="realtime"):
        async with calling_every(0.05, worker.watch):
            await inbox.wait_for("w", b"while stopped")
    assert listener.connections == 2
    assert inbox.payloads("w") == [b"while stopped"]


async def test_a_connection_that_cannot_come_back_while_redis_answers_others_is_an_error(
    redis_proxy: Proxy,
    make_redis_transport: MakeTransport,
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    worker = make_redis_transport(url=through(redis_proxy), backoff_start=0.05, backoff_max=0.1)
    await worker.follow("o")
    listener = worker.listener
    assert isinstance(listener, RedisListener)  # standalone: one connection

    async def answers_directly() -> bool:
        # Other clients reach Redis (not through this worker's relay).
        return await off_loop(redis_server.answers)

    listener.redis_answers = answers_directly
    with caplog.at_level(logging.WARNING, logger="realtime"):
        await redis_proxy.close()
        await eventually(lambda: bool(realtime_records(caplog, logging.ERROR)))
    lines = [r for r in realtime_records(caplog, logging.WARNING) if "Pub/Sub" in r.getMessage()]
    assert lines[0].levelno == logging.WARNING
    assert "attempt 1" in lines[0].getMessage()
    error = realtime_records(caplog, logging.ERROR)[0].getMessage()
    assert "Redis Pub/Sub connection cannot come back although Redis answers" in error
    assert "attempt 2" in error


async def test_a_listener_in_a_long_backoff_comes_back_as_soon_as_redis_answers_again(
    redis_proxy: Proxy, make_redis_transport: MakeTransport, inbox: Inbox
) -> None:
    worker = make_redis_transport(url=through(redis_proxy), backoff_start=0.2, backoff_max=60.0)
    worker.add_listener(inbox)
    await worker.follow("b")
    listener = worker.listener
    assert isinstance(listener, RedisListener)
    await redis_proxy.close()
    # The fifth failed attempt waits 3.2 s before the sixth; a look 0.2 s in finds Redis
    # silent.
    await eventually(lambda: listener.outage.attempts >= 5)
    await asyncio.sleep(0.5)
    await redis_proxy.open()
    await eventually(lambda: not listener.outage.down)
    assert listener.prompt_retries == 1
    await publish(make_redis_transport(), ("b", MARKER))
    await inbox.wait_for("b", MARKER)


async def test_a_follow_taken_back_while_redis_is_unreachable_returns(
    redis_proxy: Proxy, make_redis_transport: MakeTransport, inbox: Inbox
) -> None:
    worker = make_redis_transport(url=through(redis_proxy))
    worker.add_listener(inbox)
    await worker.follow("up")
    await redis_proxy.close()
    # A handshake's follow waits for a connection that is not there; its socket leaves.
    following = asyncio.ensure_future(worker.follow("gone"))
    await asyncio.sleep(0)
    await worker.unfollow("gone")
    await asyncio.wait_for(following, 5)
    assert "gone" not in worker.sequencer
    await redis_proxy.open()
    publisher = make_redis_transport()
    await publish(publisher, ("gone", b"not followed"), ("up", MARKER))
    await inbox.wait_for("up", MARKER)
    assert inbox.payloads("gone") == []


# A reply lost on its way ---------------------------------------------------------------------


class ReplyCutter:
    """A relay to Redis that, once armed, cuts the client's connection instead of passing on
    the reply to the next script call: the server ran it, the client never hears so."""

    def __init__(self, port: int) -> None:
        self.upstream = port
        self.listening = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listening.getsockname()[1])
        self.armed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self.listening.accept()
                upstream = socket.create_connection(("127.0.0.1", self.upstream))
                scripted = threading.Event()
                threading.Thread(
                    target=self._up, args=(client, upstream, scripted), daemon=True
                ).start()
                threading.Thread(
                    target=self._down, args=(upstream, client, scripted), daemon=True
                ).start()

    def _up(
        self, client: socket.socket, upstream: socket.socket, scripted: threading.Event
    ) -> None:
        try:
            with contextlib.suppress(OSError):
                while data := client.recv(65536):
                    if b"EVALSHA" in data.upper():
                        scripted.set()
                    upstream.sendall(data)
        finally:  # one end gone: the link is over (and no socket is left to the collector)
            client.close()
            upstream.close()

    def _down(
        self, upstream: socket.socket, client: socket.socket, scripted: threading.Event
    ) -> None:
        try:
            with contextlib.suppress(OSError):
                while data := upstream.recv(65536):
                    if self.armed.is_set() and scripted.is_set():
                        self.armed.clear()
                        client.shutdown(socket.SHUT_RDWR)  # the client reads an end of stream
                        return
                    scripted.clear()
                    client.sendall(data)
        finally:
            client.close()
            upstream.close()

    def close(self) -> None:
        self.listening.close()


def test_a_publish_whose_reply_was_lost_lands_once_though_the_client_sends_it_again(
    make_redis_transport: MakeTransport, redis_server: RedisServer
) -> None:
    cutter = ReplyCutter(redis_server.port)
    try:
        transport = make_redis_transport(url=f"redis://127.0.0.1:{cutter.port}/0")
        transport.publish([("c", b"warm")])
        cutter.armed.set()
        transport.publish([("c", b"once")])  # the client tries again on a fresh connection
        assert not cutter.armed.is_set()  # the first reply was cut
    finally:
        cutter.close()
    payloads = [fields[b"p"] for _, fields in redis_server.entries(redis_keys.stream_key("c"))]
    assert payloads == [b"warm", b"once"]


class SwallowingPubSub:
    """A Pub/Sub connection whose connect meets the task's cancellation and hands back a
    ``TimeoutError`` instead (as an ``asyncio.timeout`` expiring at that moment can)."""

    async def connect(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0)
        raise TimeoutError

    async def aclose(self) -> None:
        pass


class SwallowingClient:
    def pubsub(self) -> SwallowingPubSub:
        return SwallowingPubSub()

    async def aclose(self) -> None:
        pass


async def test_a_listener_stops_when_its_cancellation_reaches_it_as_a_timeout() -> None:
    async def answers() -> bool:
        return True

    options = ListenerOptions(
        heartbeat_interval=0.1,
        heartbeat_timeout=0.2,
        backoff_start=0.05,
        backoff_max=0.1,
        stall_bound=0.3,
    )
    listener = RedisListener(
        SwallowingClient, options, lambda *_: None, lambda _: None, lambda _: None, answers
    )
    task = asyncio.create_task(listener.run())
    done, _ = await asyncio.wait([task], timeout=2.0)
    if not done:  # without the check: retrying for ever, a stop that never ends
        task.cancel()
    assert done
    assert task.cancelled()
