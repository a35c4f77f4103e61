"""What the live benchmarks (``latency.py``, ``fanout.py``, ``pg_notify.py``) share.

Each live benchmark serves the test application (``tests.asgi:application``), or for a floor
``bare_asgi.py``, with daphne subprocesses on a database of its own, and talks to them with
real WebSocket clients (the ``websockets`` package) from one asyncio process: the load
generator, which shares the machine's cores with the servers and the database. This module
holds the plumbing: the environment of every process (``tests.settings`` reads the database
and setting overrides from it), daphne processes and what ``/proc`` tells about them (resident
memory, CPU time), the workspace and accounts the sockets authenticate as, authenticated and
subscribed clients, the raw NOTIFY round trip, and how figures are printed (median
[min - max] across repeats, and the ratio to the floor measured in the same run).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import platform
import random
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import websockets
from websockets.asyncio.client import ClientConnection

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
#: Seconds any single wait of the harness may take before it gives up.
WAIT = 60.0
#: Handshakes in flight at once while sockets are being opened.
CONNECT_CONCURRENCY = 64
#: The model whose channel the benchmark sockets subscribe to.
CHANNEL = "company"

T = TypeVar("T")


# --- Figures ----------------------------------------------------------------------------------


def percentile(values: Sequence[float], fraction: float) -> float:
    """The ``fraction`` quantile of ``values``, interpolating between neighbours."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    position = (len(ordered) - 1) * fraction
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class Spread:
    """Median, minimum and maximum of one figure across the repeats."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        kept = [value for value in values if not math.isnan(value)]
        if not kept:
            return cls(math.nan, math.nan, math.nan)
        return cls(statistics.median(kept), min(kept), max(kept))

    def show(self, unit: Callable[[float], str]) -> str:
        return f"{unit(self.median)} [{unit(self.low)} - {unit(self.high)}]"

    def as_dict(self) -> dict[str, float]:
        return {"median": self.median, "min": self.low, "max": self.high}


def ratios(ours: Sequence[float], floors: Sequence[float]) -> list[float]:
    """Per-repeat ratios ``ours / floor`` (each repeat against the floor of the same repeat)."""
    return [o / f if f else math.nan for o, f in zip(ours, floors, strict=True)]


def millis(value: float) -> str:
    return f"{value * 1000:.2f} ms"


def micros(value: float) -> str:
    return f"{value * 1e6:.1f} µs"


def per_second(value: float) -> str:
    return f"{value:,.0f}/s"


def kib(value: float) -> str:
    return f"{value / 1024:.1f} KiB"


def times(value: float) -> str:
    return f"{value:.2f}x"


class LogCounter(logging.Handler):
    """Count the warnings and errors the ``realtime`` loggers emit; keep the first few."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.count = 0
        self.first: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        if len(self.first) < 5:
            self.first.append(f"{record.levelname} {record.name}: {record.getMessage()}")


def watch_logs() -> LogCounter:
    counter = LogCounter()
    logging.getLogger("realtime").addHandler(counter)
    return counter


def jittered(pace: float) -> float:
    """A pause of ``pace`` seconds on average, drawn from ``pace x [0.5, 1.5)``."""
    return pace * random.uniform(0.5, 1.5)


# --- Environment ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Database:
    """The database every process of a run uses: ``tests.settings`` reads it from the env."""

    vendor: str
    name: str

    @classmethod
    def pick(cls, vendor: str, tag: str) -> Database:
        """SQLite: a file of the benchmark's own under /tmp, made anew; else ``realtime``."""
        if vendor == "sqlite":
            path = Path(tempfile.gettempdir()) / f"realtime-bench-{tag}.sqlite3"
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
            return cls("sqlite", str(path))
        if vendor == "postgresql":
            return cls("postgresql", "realtime")
        raise ValueError(f"unknown database {vendor!r}")

    def env(self, settings: dict[str, Any], *, path: Sequence[Path] = (ROOT,)) -> dict[str, str]:
        """The environment of a process on this database with these setting overrides."""
        env = dict(os.environ)
        env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
        env["REALTIME_TEST_DATABASE"] = self.vendor
        env["REALTIME_TEST_DATABASE_NAME"] = self.name
        env["REALTIME_TEST_SETTINGS"] = json.dumps(settings)
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in path)
        return env


def add_set_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help="one more setting for every process of the run (repeatable), "
        "e.g. --set REALTIME_RECHECK_INTERVAL=3600",
    )


def parse_settings(items: Sequence[str]) -> dict[str, Any]:
    """``NAME=JSON`` pairs as settings (a value that is not JSON is taken as a string)."""
    settings: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            raise SystemExit(f"--set wants NAME=JSON, not {item!r}")
        try:
            settings[name] = json.loads(value)
        except ValueError:
            settings[name] = value
    return settings


def migrate(database: Database, settings: dict[str, Any]) -> None:
    """``python -m django migrate`` on the benchmark's database, in a subprocess."""
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT,
        env=database.env(settings),
        check=True,
    )


def setup_django(database: Database, settings: dict[str, Any]) -> None:
    """Set Django up in this process on ``database`` with these setting overrides."""
    os.environ.update(database.env(settings))
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def raise_open_files(wanted: int) -> int:
    """Raise this process's open-files limit towards ``wanted`` (up to the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def code_version() -> str:
    """The commit measured, flagged when ``realtime/`` differs from it."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", "realtime"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown"
    return f"{commit or 'unknown'}{' (realtime/ modified)' if dirty else ''}"


def load_average() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.2f} (1 min), {five:.2f} (5 min)"


def describe_machine() -> str:
    return (
        f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}; "
        "the load generator, the servers and the database share these cores"
    )


def server_version() -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT sqlite_version()" if connection.vendor == "sqlite" else "SELECT version()"
        )
        row = cursor.fetchone()
    version = str(row[0]) if row else "?"
    return f"{connection.vendor} {version.split(' on ')[0]}"


# --- Processes --------------------------------------------------------------------------------


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (``VmRSS`` of ``/proc/<pid>/status``), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of a process so far, with nanosecond resolution (schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


#: On a server's ``PYTHONPATH``, logs its garbage collections (see ``probe/sitecustomize.py``).
PROBE = BENCH / "probe"


def probing_collections(
    env: dict[str, str], log: Path | None, threshold: str | None = None
) -> dict[str, str]:
    """``env`` for a server that logs each of its garbage collections into the directory
    ``log``, and runs with ``gc.set_threshold(*threshold)`` (``"700,10,10"``) if given."""
    if log is None and threshold is None:
        return env
    probed = {**env, "PYTHONPATH": os.pathsep.join([str(PROBE), env.get("PYTHONPATH", "")])}
    if log is not None:
        probed["REALTIME_BENCH_GC_LOG"] = str(log)
    if threshold is not None:
        probed["REALTIME_BENCH_GC_THRESHOLD"] = threshold
    return probed


@dataclass(frozen=True)
class Collections:
    """A process's garbage collections over a window: young (generations 0 and 1) and full
    (generation 2), how many and the CPU they took."""

    young: int
    young_cpu: float
    full: int
    full_cpu: float

    def show(self) -> str:
        return (
            f"{self.full} full ({self.full_cpu * 1000:,.0f} ms), "
            f"{self.young} young ({self.young_cpu * 1000:,.0f} ms)"
        )


def collections(directory: Path, pid: int, start: float, end: float) -> Collections:
    """The collections process ``pid`` logged (``probing_collections``) that ended between
    ``start`` and ``end`` (``time.time()``)."""
    counts = {"young": 0, "full": 0}
    cpu = {"young": 0.0, "full": 0.0}
    log = directory / f"gc-{pid}.jsonl"
    lines = log.read_text().splitlines() if log.exists() else []
    for line in lines:
        entry = json.loads(line)
        if start <= entry["at"] <= end:
            kind = "full" if entry["generation"] == 2 else "young"
            counts[kind] += 1
            cpu[kind] += entry["cpu"]
    return Collections(counts["young"], cpu["young"], counts["full"], cpu["full"])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


#: How each server is started on ``port``: no access log, a listen backlog of 2,048 (daphne's
#: default, 50, drops handshakes of a burst of connections), uvicorn without lifespan events
#: and with its default WebSocket implementation.
SERVER_COMMANDS = {
    "daphne": lambda port: [
        "-m", "daphne", "-v", "0", "-e", f"tcp:port={port}:interface=127.0.0.1:backlog=2048",
    ],
    "uvicorn": lambda port: [
        "-m", "uvicorn", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
        "--no-access-log", "--backlog", "2048", "--lifespan", "off",
    ],
}  # fmt: skip


@dataclass
class AsgiServer:
    """One server process (daphne unless said otherwise) serving ``application`` on
    127.0.0.1, without an access log."""

    process: subprocess.Popen[bytes]
    port: int
    log: Path

    @classmethod
    def start(
        cls,
        application: str,
        env: dict[str, str],
        name: str,
        port: int | None = None,
        kind: str = "daphne",
    ) -> AsgiServer:
        port = port or free_port()
        log = Path(tempfile.gettempdir()) / f"realtime-bench-{name}-{port}.log"
        with log.open("wb") as output:
            process = subprocess.Popen(
                [sys.executable, *SERVER_COMMANDS[kind](port), application],
                cwd=ROOT,
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        server = cls(process, port, log)
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"{kind} exited with {process.returncode}; see {log}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                return server
            time.sleep(0.05)
        server.stop()
        raise RuntimeError(f"{kind} did not listen within {WAIT:g} s; see {log}")

    @property
    def pid(self) -> int:
        return self.process.pid

    def url(self, path: str) -> str:
        return f"ws://127.0.0.1:{self.port}/{path.lstrip('/')}"

    def get_json(self, path: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/{path.lstrip('/')}"
        with urllib.request.urlopen(url, timeout=WAIT) as response:
            return json.load(response)

    def rss(self) -> int:
        return rss_bytes(self.pid)

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    async def settle(
        self, window: float = 0.5, quiet: float = 0.03, timeout: float = 30.0
    ) -> float:
        """Wait until the server uses under ``quiet`` of a core over ``window``; return that
        share (the last window's, if it never got that quiet within ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            before = self.cpu()
            await asyncio.sleep(window)
            share = (self.cpu() - before) / window
            if share < quiet or time.monotonic() > deadline:
                return share

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> int:
        """Stop the server; return how many warnings and errors it logged. A log without any
        is removed, one with some is kept (and named by the caller)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(15)
        warnings = count_warnings(self.log)
        if not warnings:
            self.log.unlink(missing_ok=True)
        return warnings


def count_warnings(log: Path) -> int:
    """Lines of a server log that are warnings or errors."""
    with contextlib.suppress(OSError):
        text = log.read_text(errors="replace")
        return sum(1 for line in text.splitlines() if "WARNING" in line or "ERROR" in line)
    return 0


# --- Accounts -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Members:
    """A workspace and ``count`` accounts that are its members, each with a token."""

    prefix: str
    workspace_id: int
    slug: str
    user_ids: list[int]
    tokens: list[str]


def make_members(prefix: str, count: int) -> Members:
    """The workspace ``prefix`` with ``count`` member accounts ``prefix-00000``... (made once)."""
    from django.contrib.auth import get_user_model

    from realtime.auth import issue_token
    from tests.testapp.models import Membership, Workspace

    user_model = get_user_model()
    workspace, _ = Workspace.objects.get_or_create(slug=prefix, defaults={"name": prefix})
    names = [f"{prefix}-{index:05d}" for index in range(count)]
    accounts = user_model._default_manager.filter(username__startswith=f"{prefix}-")
    existing = set(accounts.values_list("username", flat=True))
    user_model._default_manager.bulk_create(
        [
            user_model(username=name, email=f"{name}@example.invalid", password="!")  # noqa: S106 - unusable
            for name in names
            if name not in existing
        ],
        batch_size=500,
    )
    users = list(accounts.filter(username__in=names).order_by("username"))
    Membership.objects.bulk_create(
        [Membership(workspace=workspace, user=user) for user in users],
        ignore_conflicts=True,
        batch_size=500,
    )
    return Members(
        prefix=prefix,
        workspace_id=workspace.pk,
        slug=workspace.slug,
        user_ids=[user.pk for user in users],
        tokens=[issue_token(user) for user in users],
    )


def drop_members(prefix: str) -> None:
    """Delete what ``make_members(prefix, ...)`` made and the rows written in its workspace.

    The rows of the benchmark models go first, by plain SQL: deleting them through the ORM
    would announce every one of them.
    """
    from django.contrib.auth import get_user_model
    from django.db import connection

    from tests.testapp.models import Company, Membership, Plain, Workspace

    workspace = Workspace.objects.filter(slug=prefix).first()
    if workspace is not None:
        with connection.cursor() as cursor:
            for model in (Company, Plain):
                table = connection.ops.quote_name(model._meta.db_table)
                cursor.execute(f"DELETE FROM {table} WHERE workspace_id = %s", [workspace.pk])
        Membership.objects.filter(workspace=workspace).delete()
        workspace.delete()
    get_user_model()._default_manager.filter(username__startswith=f"{prefix}-").delete()


# --- Clients ----------------------------------------------------------------------------------


async def connect(url: str) -> ClientConnection:
    """A plain WebSocket connection: no client pings, no compression, a generous queue."""
    return await websockets.connect(
        url, open_timeout=WAIT, ping_interval=None, compression=None, max_queue=None
    )


async def open_realtime(
    url: str, token: str, slug: str, channels: Sequence[str]
) -> ClientConnection:
    """Connect, authenticate for the workspace ``slug`` and subscribe to ``channels``."""
    connection = await connect(url)
    await connection.send(
        json.dumps({"type": "authenticate", "data": {"token": token, "scope": slug}})
    )
    answer = json.loads(await asyncio.wait_for(connection.recv(), WAIT))
    if answer.get("type") != "auth_success":
        await connection.close()
        raise RuntimeError(f"authentication refused: {answer}")
    if channels:
        await connection.send(json.dumps({"type": "subscribe", "data": {"channels": channels}}))
    return connection


async def open_subscribed(
    url: str, token: str, slug: str, channels: Sequence[str]
) -> ClientConnection:
    """Connect and authenticate for ``slug``, subscribed to ``channels`` in the same frame (as
    the JavaScript client does): once ``auth_success`` is read, the socket hears them."""
    connection = await connect(url)
    data = {"token": token, "scope": slug, "channels": list(channels)}
    await connection.send(json.dumps({"type": "authenticate", "data": data}))
    answer = json.loads(await asyncio.wait_for(connection.recv(), WAIT))
    if answer.get("type") != "auth_success":
        await connection.close()
        raise RuntimeError(f"authentication refused: {answer}")
    return connection


async def open_many(
    count: int, opener: Callable[[int], Any], concurrency: int = CONNECT_CONCURRENCY
) -> list[ClientConnection]:
    """Open ``count`` connections with ``opener(index)``, ``concurrency`` handshakes at once."""
    gate = asyncio.Semaphore(concurrency)

    async def one(index: int) -> ClientConnection:
        async with gate:
            connection: ClientConnection = await opener(index)
            return connection

    return list(await asyncio.gather(*(one(index) for index in range(count))))


async def close_all(connections: Sequence[ClientConnection]) -> None:
    """Close every connection (the closing handshakes at once, bounded; then just drop)."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(
            asyncio.gather(*(c.close() for c in connections), return_exceptions=True), WAIT
        )
    for connection in connections:
        connection.transport.abort()


Sink = Callable[[int, str | bytes, float], None]


def _ignore(index: int, frame: str | bytes, arrived: float) -> None:
    return None


@dataclass
class Readers:
    """A reading task per connection handing each frame and its arrival time to ``sink``."""

    connections: Sequence[ClientConnection]
    sink: Sink = _ignore
    closed: int = 0
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.tasks = [
            loop.create_task(self._read(index, connection))
            for index, connection in enumerate(self.connections)
        ]

    async def _read(self, index: int, connection: ClientConnection) -> None:
        try:
            async for frame in connection:
                self.sink(index, frame, time.time())
        except websockets.ConnectionClosed:
            pass
        self.closed += 1

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


class Arrivals:
    """Arrival times of one awaited frame at ``expected`` sockets; ``complete`` once all came."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.times: list[float] = []
        self.complete = asyncio.Event()

    def add(self, arrived: float) -> None:
        self.times.append(arrived)
        if len(self.times) >= self.expected:
            self.complete.set()

    async def wait(self, timeout: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.complete.wait(), timeout)
        return self.complete.is_set()


# --- The raw NOTIFY round trip ------------------------------------------------------------------

FLOOR_CHANNEL = "realtime_bench_floor"


def notify_round_trips(conninfo: dict[str, Any], count: int, pace: float) -> list[float]:
    """Seconds from sending ``SELECT pg_notify(...)`` on one psycopg connection (autocommit) to
    the notification being read on another that LISTENs, for ``count`` notifications about
    ``pace`` seconds apart (jittered). The payload has the size of a small event message."""
    import psycopg

    padding = "x" * 200
    received: dict[int, float] = {}
    listener = psycopg.connect(**conninfo, autocommit=True)
    sender = psycopg.connect(**conninfo, autocommit=True)
    try:
        listener.execute(f"LISTEN {FLOOR_CHANNEL}")
        ready = threading.Event()

        def listen() -> None:
            ready.set()
            for notify in listener.notifies(timeout=WAIT, stop_after=count):
                received[int(notify.payload.split(" ", 1)[0])] = time.time()

        thread = threading.Thread(target=listen, name="bench-notify-floor", daemon=True)
        thread.start()
        ready.wait(WAIT)
        time.sleep(0.05)  # the listener is inside notifies() before the first one goes
        sent: dict[int, float] = {}
        for index in range(count):
            sent[index] = time.time()
            sender.execute("SELECT pg_notify(%s, %s)", [FLOOR_CHANNEL, f"{index} {padding}"])
            time.sleep(jittered(pace))
        thread.join(WAIT)
    finally:
        sender.close()
        listener.close()
    return [received[index] - at for index, at in sent.items() if index in received]


def conninfo() -> dict[str, Any]:
    """libpq parameters of the default database (Django's settings)."""
    from realtime.transports.pg_notify import conninfo_of

    return conninfo_of(None)


# --- Printing -------------------------------------------------------------------------------------


def header(title: str, database: str) -> None:
    print(f"{title} on {database}, code {code_version()}")
    print(f"machine: {describe_machine()}")
    print(f"load average before: {load_average()}", flush=True)


def write_json(path: Path | None, summary: dict[str, Any]) -> None:
    if path is not None:
        path.write_text(json.dumps(summary, indent=2, default=str) + "\n")
