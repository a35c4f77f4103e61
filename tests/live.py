"""Real ASGI servers and real WebSocket clients for end-to-end tests.

``LiveServers`` starts server subprocesses serving ``tests.asgi`` on the test database, one
per distinct set of setting overrides, server and stack, reused across the session: daphne by
default, uvicorn (its default WebSocket implementation, websockets' sans-I/O one) when a test
asks, each serving the socket router bare or wrapped in Channels' ``AuthMiddlewareStack`` (whose
session middleware wraps ``send``), or in the other stacks of ``tests.asgi``. The ``each_stack``
fixture runs a test once per server and the first two stacks, ``each_server`` once per server.
``Client`` wraps a ``websockets`` connection with the protocol's frames and bounded waits;
``Server.metrics`` reads what a server's ``realtime.metrics`` hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest
import websockets
from websockets.asyncio.client import ClientConnection

from tests.helpers import ROOT, WAIT, subprocess_env

#: Timings every test server uses unless a test says otherwise.
FAST = {"REALTIME_POLLING_INTERVAL": 0.02}
#: Servers kept running at once; the least recently used beyond are stopped. A worker that
#: served a socket polls its base channel (account events, recheck requests) from then on,
#: 50 times a second here: a whole run's servers, all kept, would take two cores.
MAX_RUNNING = 8
#: The ASGI application of each stack (see ``tests.asgi``).
STACKS = {
    "bare": "tests.asgi:application",
    "wrapped": "tests.asgi:wrapped",
    "opaque": "tests.asgi:opaque",
    "guarded": "tests.asgi:guarded",
}
#: The command line of each server, less the application.
COMMANDS = {
    "daphne": lambda port: ["-m", "daphne", "-b", "127.0.0.1", "-p", str(port)],
    "uvicorn": lambda port: [
        *("-m", "uvicorn", "--host", "127.0.0.1", "--port", str(port)),
        *("--lifespan", "off", "--no-access-log"),
    ],
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Server:
    """One server process."""

    port: int
    process: subprocess.Popen[bytes]
    settings: dict[str, Any]
    log: IO[bytes]
    kind: str = "daphne"
    stack: str = "bare"

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/api/ws"

    def log_text(self) -> str:
        """What the server printed so far."""
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """This server's metric samples, by name and sorted labels (``tests.urls``)."""
        from prometheus_client.parser import text_string_to_metric_families

        url = f"http://127.0.0.1:{self.port}/metrics"
        with urllib.request.urlopen(url, timeout=WAIT) as response:
            text = response.read().decode()
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def state(self) -> dict[str, Any]:
        """The manager's state in that process (see ``tests.urls``)."""
        url = f"http://127.0.0.1:{self.port}/_realtime/state"
        with urllib.request.urlopen(url, timeout=WAIT) as response:
            state: dict[str, Any] = json.load(response)
        return state

    async def wait_for_state(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = WAIT
    ) -> dict[str, Any]:
        """Poll the manager's state until ``predicate`` holds (bounded); return it."""
        async with asyncio.timeout(timeout):
            while True:
                state = await asyncio.to_thread(self.state)
                if predicate(state):
                    return state
                await asyncio.sleep(0.02)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self.log.close()


@dataclass
class LiveServers:
    """Servers by setting overrides, server and stack; ``get()`` starts one on first use."""

    servers: dict[str, Server] = field(default_factory=dict)
    #: Settings every server of the current test gets (the transport under test, say).
    defaults: dict[str, Any] = field(default_factory=dict)
    #: The server and the stack the current test runs under.
    kind: str = "daphne"
    stack: str = "bare"

    def get(self, name: str = "default", **settings: Any) -> Server:
        settings = {**FAST, **self.defaults, **settings}
        key = json.dumps([name, self.kind, self.stack, settings], sort_keys=True)
        server = self.servers.pop(key, None)  # put back last: the most recently used
        if server is None or server.process.poll() is not None:
            server = start_server(settings, self.kind, self.stack)
        self.servers[key] = server
        while len(self.servers) > MAX_RUNNING:
            self.servers.pop(next(iter(self.servers))).stop()
        return server

    def stop_all(self) -> None:
        for server in self.servers.values():
            server.stop()
        self.servers.clear()


def start_server(
    settings: dict[str, Any],
    kind: str = "daphne",
    stack: str = "bare",
    environ: dict[str, str] | None = None,
    args: Sequence[str] = (),
) -> Server:
    """Start a server on the test database (``environ``: more environment variables;
    ``args``: more options of the server's command line)."""
    port = free_port()
    env = {**subprocess_env(), **(environ or {})}
    env["REALTIME_TEST_SETTINGS"] = json.dumps(settings)
    path = os.path.join(tempfile.gettempdir(), f"{kind}-{port}.log")
    log = open(path, "wb")  # noqa: SIM115
    process = subprocess.Popen(
        [sys.executable, *COMMANDS[kind](port), *args, STACKS[stack]],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log.close()
            raise RuntimeError(f"{kind} exited with {process.returncode}; see {log.name}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return Server(port, process, settings, log, kind, stack)
        time.sleep(0.05)
    process.kill()
    log.close()
    raise RuntimeError(f"{kind} did not listen within 30 s; see {log.name}")


@pytest.fixture(
    params=[
        pytest.param(("daphne", "bare"), id="daphne"),
        pytest.param(("daphne", "wrapped"), id="daphne-wrapped"),
        pytest.param(("uvicorn", "bare"), id="uvicorn"),
        pytest.param(("uvicorn", "wrapped"), id="uvicorn-wrapped"),
    ]
)
def each_stack(request: pytest.FixtureRequest, live_servers: LiveServers) -> Iterator[str]:
    """Run a test once per server (daphne, uvicorn) and stack (bare, wrapped in Channels'
    ``AuthMiddlewareStack``): the servers it starts are of that kind."""
    live_servers.kind, live_servers.stack = request.param
    yield "-".join(request.param)
    live_servers.kind, live_servers.stack = "daphne", "bare"


@pytest.fixture(params=["daphne", "uvicorn"])
def each_server(request: pytest.FixtureRequest, live_servers: LiveServers) -> Iterator[str]:
    """Run a test once per server (daphne, uvicorn): the servers it starts are of that kind,
    serving the stack it sets on ``live_servers``."""
    live_servers.kind = request.param
    yield request.param
    live_servers.kind, live_servers.stack = "daphne", "bare"


class Client:
    """A WebSocket client speaking the protocol, with bounded waits."""

    def __init__(self, connection: ClientConnection) -> None:
        self.connection = connection
        self.received: list[dict[str, Any]] = []

    @classmethod
    async def connect(cls, server: Server, **options: Any) -> Client:
        return cls(await websockets.connect(server.url, open_timeout=WAIT, **options))

    async def send(self, type_: str, data: Any = None) -> None:
        await self.connection.send(json.dumps({"type": type_, "data": data}))

    async def send_raw(self, frame: str | bytes) -> None:
        await self.connection.send(frame)

    async def authenticate(self, token: str, **data: Any) -> dict[str, Any]:
        """Send ``authenticate`` and return the answer frame."""
        await self.send("authenticate", {"token": token, **data})
        return await self.next_frame()

    async def next_frame(self, timeout: float = WAIT) -> dict[str, Any]:
        raw = await asyncio.wait_for(self.connection.recv(), timeout)
        frame: dict[str, Any] = json.loads(raw)
        self.received.append(frame)
        return frame

    async def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = WAIT
    ) -> dict[str, Any]:
        """Read frames until one matches; return it (the frames before it stay in received)."""
        async with asyncio.timeout(timeout):
            while True:
                frame = await self.next_frame(timeout)
                if predicate(frame):
                    return frame

    async def frames_until(self, type_: str, timeout: float = WAIT) -> list[dict[str, Any]]:
        """Read frames up to and including one of ``type_``; return those before it."""
        before: list[dict[str, Any]] = []
        async with asyncio.timeout(timeout):
            while True:
                frame = await self.next_frame(timeout)
                if frame.get("type") == type_:
                    return before
                before.append(frame)

    async def closed_with(self, timeout: float = WAIT) -> int | None:
        """Wait for the server to close the connection; return its close code."""
        async with asyncio.timeout(timeout):
            with contextlib.suppress(websockets.ConnectionClosed):
                while True:
                    raw = await self.connection.recv()
                    self.received.append(json.loads(raw))
        return self.connection.close_code

    async def close(self) -> None:
        await self.connection.close()

    def drop(self) -> None:
        """Cut the connection as a failing network would: at once, without a close frame.

        (A polite ``close`` waits for the server's close frame behind every frame the client
        has not read, which a client that stopped reading mid-stream may never get to.)
        """
        self.connection.transport.abort()


def iter_frames(frames: list[dict[str, Any]], type_: str) -> Iterator[dict[str, Any]]:
    return (frame for frame in frames if frame.get("type") == type_)


class Clients:
    """The clients a test opened; a fixture closes them all when the test ends."""

    def __init__(self) -> None:
        self.opened: list[Client] = []

    async def connect(self, server: Server, **options: Any) -> Client:
        client = await Client.connect(server, **options)
        self.opened.append(client)
        return client

    async def not_reading(self, server: Server, token: str, **ask: Any) -> Client:
        """An authenticated client that will never read again: a one-frame queue and a small
        receive window, so the server's output to it piles up (``ask``: what its
        ``authenticate`` asks for besides the token, a scope say)."""
        raw = socket.socket()
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)  # before connect: the window
        raw.connect(("127.0.0.1", server.port))
        client = Client(
            await websockets.connect(
                server.url, sock=raw, max_queue=1, max_size=None, open_timeout=WAIT
            )
        )
        self.opened.append(client)
        answer = await client.authenticate(token, **ask)
        assert answer["type"] == "auth_success", answer
        return client

    async def authenticated(self, server: Server, token: str, **ask: Any) -> Client:
        """Connect and authenticate; fail the test unless the answer is ``auth_success``."""
        client = await self.connect(server)
        answer = await client.authenticate(token, **ask)
        assert answer["type"] == "auth_success", answer
        return client

    async def close_all(self) -> None:
        for client in self.opened:
            await client.close()


# The manager's state ------------------------------------------------------------------------


def sockets_of(state: dict[str, Any], user_id: Any) -> list[dict[str, Any]]:
    return [socket for socket in state["sockets"] if socket["user_id"] == user_id]


async def wait_for_socket(server: Server, user_id: Any, **expected: Any) -> dict[str, Any]:
    """Wait until the account holds exactly one socket on ``server`` whose fields (``scopes``,
    ``slugs``, ``channels``) equal ``expected``; return that socket."""

    def matches(state: dict[str, Any]) -> bool:
        mine = sockets_of(state, user_id)
        return len(mine) == 1 and all(mine[0][key] == value for key, value in expected.items())

    try:
        state = await server.wait_for_state(matches)
    except TimeoutError:
        last = sockets_of(await asyncio.to_thread(server.state), user_id)
        raise AssertionError(
            f"expected one socket with {expected}; the server holds {last}"
        ) from None
    return sockets_of(state, user_id)[0]


async def wait_for_follow(server: Server, *scope_ids: Any) -> None:
    """Wait until ``server`` follows the scopes ``scope_ids``. A scope a recheck gives a socket
    shows in its ``scopes`` as the worker starts following it: a write there before the
    follow is done is never heard (an opted-in client is told the scope only after, with a
    cursor)."""
    await server.wait_for_state(lambda state: set(scope_ids) <= set(state["followed"]))
