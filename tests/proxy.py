"""A TCP relay between this process (or a server it starts) and the test database, that a
test can cut, reopen or freeze: real network faults, confined to this test run.

``close`` makes the database unreachable (connections are cut and refused); ``freeze`` makes
the established connections go silent while new ones flow (a half-open connection, as behind
a NAT that forgot the flow, or a hung peer). The database server itself is never touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from django.db import connection, connections

from realtime.blocking import close_connections
from tests.helpers import WAIT


class Proxy:
    """A TCP relay to PostgreSQL that a test can cut, reopen, or freeze."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.port = 0
        self.accepted = 0
        self._server: asyncio.Server | None = None
        self._links: dict[asyncio.Task[None], asyncio.Event] = {}
        self._writers: set[asyncio.StreamWriter] = set()

    async def open(self) -> None:
        """Accept connections (on the same port as before, once it has one); if not yet."""
        if self._server is not None:
            return
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        """Stop accepting (connections are refused) and cut every connection at once."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
            if sys.version_info >= (3, 13):
                server.abort_clients()  # any connection not yet handed to a link, too
        for writer in list(self._writers):
            writer.transport.abort()
        for link in self._links:
            link.cancel()  # a frozen link waits for nothing else
        async with asyncio.timeout(WAIT):
            await asyncio.gather(*self._links, return_exceptions=True)
            # Since Python 3.12.1 this waits for the connections too: cut them first.
            if server is not None:
                await server.wait_closed()

    def freeze(self) -> None:
        """Stop relaying on the open connections, silently; new connections still flow."""
        for flowing in self._links.values():
            flowing.clear()

    def dsn(self, dbname: str) -> str:
        settings = connection.settings_dict
        return (
            f"host=127.0.0.1 port={self.port} dbname={dbname} "
            f"user={settings['USER']} password={settings['PASSWORD']}"
        )

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._server is None:  # accepted just as the relay closed: refused after all
            writer.transport.abort()
            return
        self.accepted += 1
        task = asyncio.current_task()
        assert task is not None
        flowing = asyncio.Event()
        flowing.set()
        self._links[task] = flowing
        self._writers.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except BaseException as exc:
            # Refused, or cancelled by ``close``: the client's end must not outlive the link
            # (the server's ``wait_closed`` waits for every connection it accepted).
            writer.transport.abort()
            self._forget(task, writer)
            if isinstance(exc, OSError):
                return
            raise
        self._writers.add(up_writer)
        pumps = [
            asyncio.ensure_future(self._pump(reader, up_writer, flowing)),
            asyncio.ensure_future(self._pump(up_reader, writer, flowing)),
        ]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            for end in (writer, up_writer):
                end.transport.abort()
            self._writers.discard(up_writer)
            self._forget(task, writer)

    def _forget(self, task: asyncio.Task[None], writer: asyncio.StreamWriter) -> None:
        self._links.pop(task, None)
        self._writers.discard(writer)

    @staticmethod
    async def _pump(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, flowing: asyncio.Event
    ) -> None:
        while data := await reader.read(65536):
            await flowing.wait()
            writer.write(data)
            await writer.drain()


@contextlib.contextmanager
def default_database_through(relay: Proxy) -> Iterator[None]:
    """Have every new connection of this process to ``default`` go through ``relay``.

    Django builds each connection from the one settings dict of the alias, so changing it
    reroutes the connections realtime's threads open and the LISTEN connection (whose DSN
    comes from it): the database is unreachable for the whole process while the relay is
    closed. The connections those threads kept from earlier tests go straight to the
    database: they are closed on the way in, and on the way out.
    """
    settings = connections.settings["default"]
    saved = {key: settings[key] for key in ("HOST", "PORT")}
    close_connections()
    settings.update(HOST="127.0.0.1", PORT=str(relay.port))
    try:
        yield
    finally:
        settings.update(saved)
        close_connections()


def databases_through(relay: Proxy) -> dict[str, Any]:
    """``DATABASES`` for a server subprocess whose every connection goes through ``relay``."""
    settings = {
        key: value
        for key, value in connection.settings_dict.items()
        if key in ("ENGINE", "NAME", "USER", "PASSWORD", "OPTIONS", "TEST")
    }
    return {"default": {**settings, "HOST": "127.0.0.1", "PORT": str(relay.port)}}
