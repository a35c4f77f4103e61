"""``find_link``: the server connection behind whatever middleware wrapped ``send``.

The servers' objects are stand-ins with the attributes realtime reads (daphne's autobahn
protocol over a Twisted transport, uvicorn's protocol over an asyncio transport); the wrappers
are real: Channels' ``AuthMiddlewareStack`` run around an application that keeps the ``send``
it is given, closures, ``functools.wraps`` and ``functools.partial``. Daphne and uvicorn
themselves are covered end to end (``tests.live``'s ``each_stack``).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from channels.auth import AuthMiddlewareStack
from django.utils.functional import LazyObject

from realtime.sockets import link
from realtime.sockets.link import AsyncioLink, Link, Send, TwistedLink, find_link

Message = dict[str, Any]


class TwistedTransport:
    dataBuffer = b""  # noqa: N815 - Twisted's name
    offset = 0
    _tempDataLen = 0  # noqa: N815 - Twisted's name


class AutobahnProtocol:
    STATE_OPEN = 3

    def __init__(self) -> None:
        self.state = self.STATE_OPEN
        self.transport = TwistedTransport()
        self.close_frames: list[int | None] = []

    def sendCloseFrame(self, code: int | None = None, isReply: bool = False) -> None:  # noqa: N802, N803
        self.close_frames.append(code)


async def handle_reply(protocol: AutobahnProtocol, message: Message) -> None:
    """Daphne's ``Server.handle_reply``, bound to the protocol with ``functools.partial``."""


def daphne_send() -> tuple[AutobahnProtocol, Send]:
    protocol = AutobahnProtocol()
    return protocol, functools.partial(handle_reply, protocol)


class AsyncioTransport:
    def __init__(self) -> None:
        self.buffered = 0
        self.aborted = False

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def is_closing(self) -> bool:
        return self.aborted

    def abort(self) -> None:
        self.aborted = True


class UvicornProtocol:
    """uvicorn's WebSocket protocol: ``send`` is its bound method."""

    def __init__(self) -> None:
        self.transport = AsyncioTransport()

    async def send(self, message: Message) -> None:
        return None


def closure_around(send: Send) -> Send:
    async def wrapped_send(message: Message) -> None:
        await send(message)

    return wrapped_send


def wraps_around(send: Send) -> Send:
    @functools.wraps(send)
    async def wrapped_send(message: Message) -> None:
        await send(message)

    return wrapped_send


class SlottedWrapper:
    __slots__ = ("inner",)

    def __init__(self, inner: Send) -> None:
        self.inner = inner

    async def __call__(self, message: Message) -> None:
        await self.inner(message)


async def send_as_auth_middleware_stack_hands_it_on(send: Send) -> Send:
    """Run Channels' ``AuthMiddlewareStack`` and return the ``send`` its inner app gets."""
    kept: list[Send] = []

    async def inner(scope: dict[str, Any], receive: Any, inner_send: Send) -> None:
        kept.append(inner_send)

    scope = {"type": "websocket", "path": "/api/ws", "headers": []}
    await AuthMiddlewareStack(inner)(scope, None, send)
    return kept[0]


@pytest.mark.django_db
async def test_daphne_is_found_behind_channels_auth_middleware_stack() -> None:
    protocol, send = daphne_send()
    wrapped = await send_as_auth_middleware_stack_hands_it_on(send)
    assert wrapped is not send

    found = find_link(wrapped)

    assert isinstance(found, TwistedLink)
    assert found.protocol is protocol


@pytest.mark.parametrize(
    "wrap",
    [
        pytest.param(lambda send: send, id="bare"),
        pytest.param(closure_around, id="closure"),
        pytest.param(wraps_around, id="functools-wraps"),
        pytest.param(lambda send: functools.partial(send), id="partial"),
        pytest.param(SlottedWrapper, id="object-with-slots"),
        pytest.param(
            lambda send: closure_around(SlottedWrapper(wraps_around(closure_around(send)))),
            id="four-layers",
        ),
    ],
)
def test_daphne_is_found_through_wrappers_of_every_kind(wrap: Callable[[Send], Send]) -> None:
    protocol, send = daphne_send()
    found = find_link(wrap(send))
    assert isinstance(found, TwistedLink)
    assert found.protocol is protocol


@pytest.mark.parametrize(
    "wrap",
    [
        pytest.param(lambda send: send, id="bare"),
        pytest.param(closure_around, id="closure"),
    ],
)
def test_an_asyncio_servers_transport_is_found_behind_its_protocols_send(
    wrap: Callable[[Send], Send],
) -> None:
    protocol = UvicornProtocol()
    found = find_link(wrap(protocol.send))
    assert isinstance(found, AsyncioLink)
    assert found.transport is protocol.transport
    protocol.transport.buffered = 1234
    assert found.pending() == 1234
    assert not found.buffered  # uvicorn's send waits while its buffer is full


class Exploding(LazyObject):  # type: ignore[type-arg]  # generic in the stubs only
    def _setup(self) -> None:
        raise AssertionError("the search evaluated a lazy object")


def test_the_search_runs_no_code_of_the_objects_it_looks_at() -> None:
    protocol, send = daphne_send()

    class Wrapper:
        def __init__(self) -> None:
            self.session = Exploding()
            self.real_send = send

        @property
        def transport(self) -> Any:
            raise AssertionError("the search ran a property")

        async def send(self, message: Message) -> None:
            await self.real_send(message)

    found = find_link(Wrapper().send)
    assert isinstance(found, TwistedLink)
    assert found.protocol is protocol


def test_a_send_with_nothing_behind_it_gets_the_plain_link_without_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def send(message: Message) -> None:
        return None

    found = find_link(send)

    assert type(found) is Link
    assert not found.buffered
    assert found.pending() == 0
    assert caplog.records == []  # no Twisted reactor runs this loop


def test_the_search_is_bounded_and_survives_cycles() -> None:
    _, send = daphne_send()
    deep: Send = send
    for _ in range(link.SEARCH_STEPS):
        deep = closure_around(deep)
    assert type(find_link(deep)) is Link  # too deep to look at everything

    class Cycle:
        def __init__(self) -> None:
            self.me: Callable[[Message], Awaitable[None]] = self.send

        async def send(self, message: Message) -> None:
            await self.me(message)

    assert type(find_link(Cycle().send)) is Link
