"""``find_link``: the server connection behind a socket's ``send``, through known shapes only.

The servers' parts are real: daphne's ``Server.handle_reply`` bound to a real
``daphne.ws_protocol.WebSocketProtocol`` over a real Twisted TCP transport (on Twisted's
in-memory reactor: what is written stays in its buffer), and uvicorn's
``WebSocketsSansIOProtocol`` over a real asyncio connection to a peer in this process. So are
the wrappers: Channels' ``AuthMiddlewareStack``, ``SocketOriginValidator``, and a middleware
of the test's own. The self-tests are run against the installed versions, and against classes
monkeypatched to lack what a seam reads. Each test starts as a new process would: no self-test
run yet, nothing reported (``fresh_seams``). The servers end to end, with real clients, are in
``test_socket_stacks`` and ``test_socket_slow``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import logging
import socket
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from channels.auth import AuthMiddlewareStack
from prometheus_client import REGISTRY

from realtime.compat import channels, daphne, kernel, uvicorn
from realtime.origins import SocketOriginValidator
from realtime.sockets import link, protocol
from realtime.sockets.connection import STALL_BYTES, SURELY_UNDER, Socket
from realtime.sockets.link import AsyncioLink, DaphneLink, Link, Send, find_link
from tests.asgi import PassThrough

Message = dict[str, Any]
Scope = dict[str, Any]

SCOPE: Scope = {"type": "websocket", "path": "/api/ws", "headers": []}
#: What the ERROR line about a send realtime does not look inside says.
NOT_LOOKED_INSIDE = "slow-socket protection is off for sockets behind an ASGI send"
CURE = "Wrap the socket route in realtime.origins.SocketOriginValidator, outermost"


@pytest.fixture(autouse=True)
def fresh_seams(monkeypatch: pytest.MonkeyPatch) -> None:
    """No self-test has run and nothing was reported, as in a new process."""
    monkeypatch.setattr(link, "_verdicts", {})
    monkeypatch.setattr(link, "_unknown_reported", False)
    for seam in (daphne, uvicorn, channels, kernel):
        monkeypatch.setattr(seam, "_verdict", None)
    monkeypatch.setattr(daphne, "_unmeasured_reported", False)
    monkeypatch.setattr(uvicorn, "_unknown_reported", False)


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def unprotected(reason: str) -> float:
    return REGISTRY.get_sample_value("realtime_unprotected_sockets_total", {"reason": reason}) or 0


def protection(library: str) -> float | None:
    return REGISTRY.get_sample_value("realtime_slow_socket_protection", {"library": library})


# Real servers' parts -------------------------------------------------------------------------


@dataclass
class Daphne:
    """One of daphne's connections, as daphne makes it."""

    protocol: Any
    transport: Any
    send: Send


@pytest.fixture
def daphne_connection() -> Iterator[Daphne]:
    """daphne's ``send``: a real ``Server``'s ``handle_reply`` bound with ``functools.partial``
    to a real ``WebSocketProtocol``, over a Twisted TCP transport on one end of a socket pair.
    The transport's reactor is Twisted's in-memory one: what is written stays in the
    transport's buffer, as it does for a client that stops reading."""
    from daphne.server import Server
    from daphne.ws_protocol import WebSocketProtocol
    from twisted.internet import tcp
    from twisted.internet.testing import MemoryReactor

    server = Server(application=None, endpoints=["tcp:port=0:interface=127.0.0.1"])
    protocol = WebSocketProtocol()
    ours, theirs = socket.socketpair()
    no_port: Any = None  # the listening port, which a connection only names in its repr
    reactor: Any = MemoryReactor()  # type: ignore[no-untyped-call]
    transport = tcp.Server(ours, protocol, ("127.0.0.1", 1), no_port, 1, reactor)
    protocol.transport = transport
    protocol.state = protocol.STATE_OPEN
    yield Daphne(protocol, transport, functools.partial(server.handle_reply, protocol))
    transport.stopWriting()  # type: ignore[no-untyped-call]
    ours.close()
    theirs.close()


@dataclass
class Peer:
    """A TCP listener in this process whose connections are held open and never read."""

    port: int
    server: asyncio.Server
    held: list[asyncio.StreamWriter] = field(default_factory=list)

    async def connect(self) -> asyncio.StreamWriter:
        _, writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.held.append(writer)
        return writer


@pytest.fixture
async def peer() -> AsyncIterator[Peer]:
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    found = Peer(server.sockets[0].getsockname()[1], server)
    yield found
    for writer in [*held, *found.held]:
        writer.transport.abort()
    server.close()
    await server.wait_closed()


async def _no_app(scope: Scope, receive: Any, send: Any) -> None:
    return None


@pytest.fixture
async def uvicorn_protocol(peer: Peer) -> AsyncIterator[Any]:
    """uvicorn's WebSocket protocol (its default implementation), connected over a real
    asyncio transport; its ``send`` is what uvicorn hands an application."""
    from uvicorn.config import Config
    from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
    from uvicorn.server import ServerState

    config = Config(app=_no_app, lifespan="off", log_config=None)
    protocol = WebSocketsSansIOProtocol(config=config, server_state=ServerState(), app_state={})
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_connection(lambda: protocol, "127.0.0.1", peer.port)
    yield protocol
    transport.abort()


# Wrappers ------------------------------------------------------------------------------------


async def handed_on(
    wrap: Callable[[Any], Any], send: Send, scope: Scope | None = None
) -> tuple[Send, Scope]:
    """Run ``wrap(inner)`` with ``send``; return the ``send`` and scope ``inner`` was given."""
    kept: list[tuple[Send, Scope]] = []

    async def inner(inner_scope: Scope, receive: Any, inner_send: Send) -> None:
        kept.append((inner_send, inner_scope))

    await wrap(inner)(dict(scope or SCOPE), None, send)
    return kept[0]


class Auditing:
    """A middleware's ``send``: a method of an object that keeps an asyncio transport of its
    own (to, say, an audit service) beside the ``send`` it wraps."""

    def __init__(self, transport: asyncio.WriteTransport, inner: Send) -> None:
        self.transport = transport
        self.inner = inner

    async def send(self, message: Message) -> None:
        await self.inner(message)


class AuditingMiddleware:
    """Hand the application ``Auditing(transport, send).send``."""

    def __init__(self, inner: Any, transport: asyncio.WriteTransport) -> None:
        self.inner = inner
        self.transport = transport

    async def __call__(self, scope: Scope, receive: Any, send: Send) -> None:
        await self.inner(scope, receive, Auditing(self.transport, send).send)


# The known shapes ----------------------------------------------------------------------------


def test_daphnes_send_is_found_bare_and_its_buffer_is_the_backlog(
    daphne_connection: Daphne, caplog: pytest.LogCaptureFixture
) -> None:
    found = find_link(daphne_connection.send)

    assert isinstance(found, DaphneLink)
    assert found.connection.protocol is daphne_connection.protocol
    assert found.buffered  # daphne's send never waits: frames are handed over in place
    assert found.pending() == 0
    daphne_connection.transport.write(b"x" * 70_000)
    daphne_connection.transport.write(b"y" * 5)
    assert found.pending() == 70_005
    assert found.open()
    assert errors(caplog) == []
    assert protection("daphne") == 1


def test_daphnes_backlog_counts_what_the_kernel_holds_unsent_under_its_buffer(
    daphne_connection: Daphne,
) -> None:
    found = find_link(daphne_connection.send)
    assert found.pending() == 0
    # What Twisted already wrote to the socket, and its peer never read, waits in the
    # kernel's queue: the backlog still holds it. (The peer of this socket pair is a Unix
    # socket: the kernel counts what its buffers take, a little more than what they hold.)
    written = daphne_connection.transport.socket.send(b"x" * 100_000)
    assert written > 0
    assert written <= found.pending() <= 4 * written
    assert protection("kernel") == 1


def test_the_kernels_queue_is_read_only_when_what_was_handed_since_could_fill_it(
    daphne_connection: Daphne,
) -> None:
    found = find_link(daphne_connection.send)
    assert found.pending() == 0  # read
    written = daphne_connection.transport.socket.send(b"x" * 100_000)
    assert written > 0
    # Written to the kernel behind the link's back: its bound knows nothing of it, and
    # nothing is read.
    assert found.most() == 0
    found.handed(written)
    assert found.most() == written
    # A reading starts the count again from what it found.
    read = found.pending()
    assert written <= read == found.most()
    found.handed(10)
    assert found.most() == read + 10
    # What the server's buffer holds now is counted as well (it is read for free).
    daphne_connection.transport.write(b"y" * 70_000)
    assert found.most() == read + 10 + 70_000


def test_a_backlog_not_counted_is_seen_by_the_sweep_and_its_run_followed_exactly(
    daphne_connection: Daphne,
) -> None:
    ours = daphne_connection.transport.socket
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
    found = find_link(daphne_connection.send)
    watched = Socket(
        consumer=None,
        send=daphne_connection.send,
        user=SimpleNamespace(pk=1),
        token="t",
        ask=protocol.read_scopes({}),
        scopes={},
        link=found,
    )
    # Written by the server of its own accord (a client's pings answered, say): over the
    # bound, and not counted.
    ours.setblocking(False)
    written = 0
    with contextlib.suppress(BlockingIOError):
        while written <= STALL_BYTES:
            written += ours.send(b"x" * 65_536)
    assert written > STALL_BYTES
    assert found.most() <= SURELY_UNDER
    assert not watched.stalled(5.0, now=100.0)  # the count says surely under: not read
    assert not watched.stalled(5.0, now=101.0, exact=True)  # the sweep reads it: a run starts
    assert not watched.stalled(5.0, now=103.0)  # during a run, every observation reads it
    assert watched.stalled(5.0, now=106.0)


@pytest.mark.django_db
async def test_daphnes_send_is_found_behind_auth_middleware_stack(
    daphne_connection: Daphne,
) -> None:
    wrapped, scope = await handed_on(AuthMiddlewareStack, daphne_connection.send)
    assert wrapped is not daphne_connection.send

    found = find_link(wrapped, scope)

    assert isinstance(found, DaphneLink)
    assert found.connection.protocol is daphne_connection.protocol
    assert found.buffered  # the session middleware's send waits for nothing either
    assert protection("channels") == 1


async def test_uvicorns_send_is_found_bare_and_its_transport_is_the_backlog(
    uvicorn_protocol: Any, caplog: pytest.LogCaptureFixture
) -> None:
    found = find_link(uvicorn_protocol.send)

    assert isinstance(found, AsyncioLink)
    assert found.transport is uvicorn_protocol.transport
    assert not found.buffered  # uvicorn's send waits while its buffer is full
    assert found.pending() == uvicorn_protocol.transport.get_write_buffer_size()
    # What the transport wrote to its socket, and the peer (which never reads) did not take,
    # waits in the kernel's queue: the backlog holds it.
    transport: Any = uvicorn_protocol.transport
    transport.write(b"x" * 8_000_000)
    in_server = transport.get_write_buffer_size()
    assert in_server < 7_000_000  # the kernel took megabytes (its send buffer)
    # All of it but what the peer's receive buffer took.
    assert 7_000_000 < found.pending() <= 8_000_000
    assert found.open()
    found.abort()
    assert uvicorn_protocol.transport.is_closing()
    assert errors(caplog) == []
    assert protection("uvicorn") == 1


@pytest.mark.django_db
async def test_uvicorns_send_is_found_behind_auth_middleware_stack(uvicorn_protocol: Any) -> None:
    wrapped, scope = await handed_on(AuthMiddlewareStack, uvicorn_protocol.send)

    found = find_link(wrapped, scope)

    assert isinstance(found, AsyncioLink)
    assert found.transport is uvicorn_protocol.transport


async def test_the_validator_outermost_hands_on_daphnes_send_through_any_middleware(
    daphne_connection: Daphne, caplog: pytest.LogCaptureFixture
) -> None:
    send, scope = await handed_on(
        lambda inner: SocketOriginValidator(PassThrough(inner)), daphne_connection.send
    )
    assert send is not daphne_connection.send

    found = find_link(send, scope)

    assert isinstance(found, DaphneLink)
    assert found.connection.protocol is daphne_connection.protocol
    # The middleware's send may wait: frames go through a writer task of their own.
    assert not found.buffered
    assert errors(caplog) == []


async def test_the_validator_outermost_hands_on_uvicorns_send_through_any_middleware(
    uvicorn_protocol: Any, caplog: pytest.LogCaptureFixture
) -> None:
    send, scope = await handed_on(
        lambda inner: SocketOriginValidator(PassThrough(inner)), uvicorn_protocol.send
    )

    found = find_link(send, scope)

    assert isinstance(found, AsyncioLink)
    assert found.transport is uvicorn_protocol.transport
    assert errors(caplog) == []


async def test_the_outermost_validator_records_the_send_an_inner_one_does_not_replace(
    uvicorn_protocol: Any,
) -> None:
    _, scope = await handed_on(
        lambda inner: SocketOriginValidator(PassThrough(SocketOriginValidator(inner))),
        uvicorn_protocol.send,
    )
    assert scope[link.SERVER_SEND] == uvicorn_protocol.send


# Nothing else --------------------------------------------------------------------------------


async def test_a_middleware_holding_an_asyncio_transport_of_its_own_is_never_measured_nor_cut(
    uvicorn_protocol: Any, peer: Peer, caplog: pytest.LogCaptureFixture
) -> None:
    own = (await peer.connect()).transport
    send, _ = await handed_on(lambda inner: AuditingMiddleware(inner, own), uvicorn_protocol.send)

    found = find_link(send)

    assert type(found) is Link
    own.write(b"x" * 1000)  # whatever its backlog, it is not this socket's
    assert found.pending() == 0
    found.abort()
    assert not own.is_closing()
    assert NOT_LOOKED_INSIDE in errors(caplog)[0]

    # With the validator outermost: the server's transport, never the middleware's.
    send, scope = await handed_on(
        lambda inner: SocketOriginValidator(AuditingMiddleware(inner, own)),
        uvicorn_protocol.send,
    )
    found = find_link(send, scope)
    assert isinstance(found, AsyncioLink)
    assert found.transport is uvicorn_protocol.transport
    found.abort()
    assert uvicorn_protocol.transport.is_closing()
    assert not own.is_closing()


async def test_an_unknown_send_is_reported_once_in_an_error_and_counted_for_each_socket(
    daphne_connection: Daphne, caplog: pytest.LogCaptureFixture
) -> None:
    before = unprotected("unknown_send")
    first, _ = await handed_on(PassThrough, daphne_connection.send)
    second, _ = await handed_on(PassThrough, daphne_connection.send)

    links = [find_link(first), find_link(second)]

    assert [type(found) for found in links] == [Link, Link]
    assert unprotected("unknown_send") == before + 2
    (line,) = errors(caplog)
    assert NOT_LOOKED_INSIDE in line
    assert "function tests.asgi.PassThrough.__call__.<locals>.send_through" in line
    assert CURE in line


def test_a_server_realtime_does_not_know_is_reported_without_the_cure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def other_servers_send(message: Message) -> None:
        return None

    scope = link.record_server_send(SCOPE, other_servers_send)
    found = find_link(other_servers_send, scope)

    assert type(found) is Link
    (line,) = errors(caplog)
    assert "the server's own ASGI send" in line
    assert "is neither daphne's nor uvicorn's" in line
    assert CURE not in line


@pytest.mark.django_db
async def test_a_test_communicators_send_has_no_server_behind_it_and_is_not_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import asgiref.testing  # noqa: F401 - Channels' WebsocketCommunicator loads it

    before = unprotected("unknown_send")
    put = asyncio.Queue[Message]().put
    wrapped, scope = await handed_on(AuthMiddlewareStack, put)
    validated, validated_scope = await handed_on(
        lambda inner: SocketOriginValidator(PassThrough(inner)), put
    )

    found = [find_link(put), find_link(wrapped, scope), find_link(validated, validated_scope)]

    assert [type(each) for each in found] == [Link, Link, Link]
    assert all(each.codes for each in found)
    assert errors(caplog) == []
    assert unprotected("unknown_send") == before


def test_daphne_over_a_transport_it_cannot_measure_keeps_its_close_codes_and_says_so(
    daphne_connection: Daphne, caplog: pytest.LogCaptureFixture
) -> None:
    from twisted.internet.testing import StringTransport

    daphne_connection.protocol.transport = StringTransport()  # type: ignore[no-untyped-call]
    before = unprotected("daphne")

    found = find_link(daphne_connection.send)
    find_link(daphne_connection.send)

    assert isinstance(found, DaphneLink)
    assert found.pending() == 0
    assert unprotected("daphne") == before + 2
    (line,) = errors(caplog)
    assert "over a transport of type StringTransport" in line
    assert "daphne 4." in line


# The self-tests ------------------------------------------------------------------------------


async def test_every_seam_passes_its_self_test_under_the_installed_versions(
    daphne_connection: Daphne, uvicorn_protocol: Any
) -> None:
    assert daphne.loaded()
    assert uvicorn.loaded()
    assert channels.loaded()
    assert daphne.missing() == []
    assert uvicorn.missing() == []
    assert channels.missing() == []
    assert kernel.missing() is None


def test_a_kernel_whose_send_queue_cannot_be_read_fails_the_self_test_and_counts_nothing(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kernel, "SIOCOUTQNSD", 0x7FFF)  # a request no kernel answers
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        peer, _ = server.accept()
        with client, peer:
            client.sendall(b"x" * 1000)
            link.check_loaded()
            assert kernel.unsent(client) == 0
    assert protection("kernel") == 0
    (line,) = errors(caplog)
    assert "the kernel's send queue of a socket cannot be read" in line


def test_daphne_without_autobahns_close_frame_is_reported_and_closes_with_1000(
    daphne_connection: Daphne, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autobahn.websocket.protocol import WebSocketProtocol

    monkeypatch.delattr(WebSocketProtocol, "sendCloseFrame")
    before = unprotected("daphne")

    found = find_link(daphne_connection.send)

    assert type(found) is Link
    assert not found.codes  # daphne's relay through sendClose refuses the protocol's codes
    assert protection("daphne") == 0
    assert unprotected("daphne") == before + 1
    (line,) = errors(caplog)
    assert "slow-socket protection is off under daphne 4." in line
    assert "Twisted 2" in line
    assert "autobahn's sendCloseFrame(code=..., isReply=...) is not there" in line


def test_twisted_whose_buffer_is_elsewhere_fails_the_self_test(
    daphne_connection: Daphne, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from twisted.internet.abstract import FileDescriptor

    def write_elsewhere(self: Any, data: bytes) -> None:
        self.__dict__.setdefault("elsewhere", []).append(data)

    monkeypatch.setattr(FileDescriptor, "write", write_elsewhere)

    assert type(find_link(daphne_connection.send)) is Link
    assert protection("daphne") == 0
    (line,) = errors(caplog)
    assert "Twisted's FileDescriptor buffer reads 0 bytes where 9 were written" in line


async def test_uvicorn_whose_send_is_not_a_coroutine_fails_the_self_test(
    uvicorn_protocol: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

    def send(self: Any, message: Message) -> None:
        return None

    monkeypatch.setattr(WebSocketsSansIOProtocol, "send", send)
    before = unprotected("uvicorn")

    found = find_link(uvicorn_protocol.send)

    assert type(found) is Link
    assert found.codes  # uvicorn closes with any code it is given
    assert protection("uvicorn") == 0
    assert unprotected("uvicorn") == before + 1
    (line,) = errors(caplog)
    assert "slow-socket protection is off under uvicorn 0." in line
    assert "WebSocketsSansIOProtocol.send is not a coroutine function" in line


@pytest.mark.django_db
async def test_channels_without_real_send_fails_the_self_test_and_its_wrapper_is_unknown(
    daphne_connection: Daphne, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from channels.sessions import InstanceSessionWrapper

    wrapped, scope = await handed_on(AuthMiddlewareStack, daphne_connection.send)

    async def send(self: Any, message: Message) -> None:
        return None

    monkeypatch.setattr(InstanceSessionWrapper, "send", send)
    wrapped = wrapped.__self__.send  # type: ignore[attr-defined]  # the patched method

    assert type(find_link(wrapped, scope)) is Link
    assert protection("channels") == 0
    channels_line, unknown_line = errors(caplog)
    assert "routed inside Channels' AuthMiddlewareStack (or SessionMiddleware) under" in (
        channels_line
    )
    assert "InstanceSessionWrapper.send does not use real_send" in channels_line
    assert NOT_LOOKED_INSIDE in unknown_line


def test_the_self_test_runs_once_per_process(
    daphne_connection: Daphne, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autobahn.websocket.protocol import WebSocketProtocol

    monkeypatch.delattr(WebSocketProtocol, "sendCloseFrame")
    for _ in range(3):
        find_link(daphne_connection.send)
    assert len(errors(caplog)) == 1


async def test_daphne_starting_runs_its_self_test_before_any_socket(
    daphne_connection: Daphne, uvicorn_protocol: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(sys.modules, "daphne.cli", raising=False)
    link.check_starting_server()
    # daphne is loaded wherever it is installed, and starts a server only from its command
    # line; uvicorn loads its WebSocket protocol after the application (checked at the first
    # socket).
    assert link._verdicts == {}

    importlib.import_module("daphne.cli")
    link.check_starting_server()
    assert link._verdicts == {"daphne": True}
    assert protection("daphne") == 1
