"""A real ``redis-server`` for the tests, started by this test run on a free port.

Standalone, without persistence (``--save '' --appendonly no``), in a temporary directory of
its own; never a system service. Tests that use it get a flushed server (``FLUSHALL`` before
each). A test may restart it on the same port: a new server process, so a new ``run_id`` and
nothing kept, as after a crash of a server without persistence.

Tests that need it are skipped, saying why, when ``redis-server`` is not installed or
redis-py is not (``pip install "django-realtime-models[redis]"``).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.live import free_port

if TYPE_CHECKING:
    import redis

#: Seconds a server has to answer after it was started.
START_WAIT = 10.0


def missing() -> str | None:
    """Why the Redis tests cannot run here; ``None`` when they can."""
    if shutil.which("redis-server") is None:
        return "redis-server is not installed (scripts/provision redis-server)"
    try:
        import redis  # noqa: F401
    except ImportError:
        return 'redis-py is not installed (pip install "django-realtime-models[redis]")'
    return None


class RedisServer:
    """One ``redis-server`` process of this test run."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="realtime-redis-"))
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def unix_url(self) -> str:
        """The same server through its Unix socket."""
        return f"unix://{self.directory / 'redis.sock'}?db=0"

    def start(self) -> None:
        """Start the server (on its port) and wait until it answers."""
        if self.process is not None:
            return
        self.starts += 1
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--unixsocket",
                str(self.directory / "redis.sock"),
                "--unixsocketperm",
                "700",
                "--dir",
                str(self.directory),
                "--logfile",
                str(self.directory / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + START_WAIT
        while not self.answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                log = (self.directory / "redis.log").read_text(errors="replace")[-2000:]
                self.stop()
                raise RuntimeError(f"redis-server did not start on port {self.port}:\n{log}")
            time.sleep(0.02)

    def stop(self) -> None:
        """Stop the server at once (SIGKILL: nothing is saved, clients see a cut)."""
        process, self.process = self.process, None
        if process is not None:
            process.kill()
            process.wait(10)

    def restart(self) -> None:
        """A new server process on the same port: a new ``run_id``, nothing kept."""
        self.stop()
        self.start()

    def client(self) -> redis.Redis:
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def entries(self, key: str) -> list[tuple[bytes, dict[bytes, bytes]]]:
        """Every entry of stream ``key``: its id and fields."""
        with contextlib.closing(self.client()) as client:
            found: Any = client.xrange(key)
        return [(bytes(id_), dict(fields)) for id_, fields in found]

    def answers(self) -> bool:
        try:
            with contextlib.closing(self.client()) as client:
                return bool(client.ping())
        except Exception:
            return False

    def flush(self) -> None:
        with contextlib.closing(self.client()) as client:
            client.flushall()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


@contextlib.asynccontextmanager
async def transports(url: str, **defaults: Any) -> AsyncIterator[Callable[..., Any]]:
    """Build Redis transports on ``url`` with fast test timings (``defaults`` add to them;
    a call's own options win); stop and close them all at the end."""
    from realtime.transports.redis import RedisTransport

    timings = {"supervise_interval": 0.2, "backoff_start": 0.05, "backoff_max": 0.4}
    built: list[RedisTransport] = []

    def make(**options: Any) -> RedisTransport:
        transport = RedisTransport(**{"url": url, **timings, **defaults, **options})
        built.append(transport)
        return transport

    try:
        yield make
    finally:
        for transport in built:
            await transport.stop()
            transport.close()
