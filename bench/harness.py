"""What the live benchmarks (``latency.py``, ``fanout.py``, ``pg_notify.py``, ``scale.py``) share.

Each live benchmark serves the test application (``tests.asgi:application``), or for a floor
``bare_asgi.py``, with daphne subprocesses on a database of its own, and talks to them with
real WebSocket clients (the ``websockets`` package) from one asyncio process: the load
generator, which shares the machine's cores with the servers and the database. This module
holds the plumbing: the environment of every process (``tests.settings`` reads the database
and setting overrides from it), daphne processes and what ``/proc`` tells about them (resident
memory, CPU time), the workspace and accounts the sockets authenticate as, authenticated and
subscribed clients, processes that write rows together (and a worker whose socket counts the
frames their writes become), the raw NOTIFY round trip, and how figures are printed (median
[min - max] across repeats, and the ratio to the floor measured in the same run).
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
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
from collections.abc import AsyncIterator, Callable, Sequence
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
        if vendor in ("postgresql", "mariadb"):
            return cls(vendor, "realtime")
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


#: The transports a benchmark can run on.
TRANSPORTS = ("table", "pg_notify", "redis")


def add_transport_options(parser: argparse.ArgumentParser, default: str | None = None) -> None:
    """``--transport`` (required without a ``default``) and ``--redis-url``."""
    parser.add_argument(
        "--transport", choices=TRANSPORTS, default=default, required=default is None
    )
    parser.add_argument(
        "--redis-url",
        help="the Redis server of the redis transport (default: a redis-server the run starts "
        "on a free port, with no persistence, and stops at the end)",
    )


def start_transport_servers(args: argparse.Namespace) -> None:
    """Start what the transport needs beside the database, for the rest of the run: a
    redis-server of the run's own for the redis transport without ``--redis-url`` (its URL
    goes to ``args.redis_url``; it stops when the run ends)."""
    if getattr(args, "transport", None) != "redis" or args.redis_url:
        return
    port = free_port()
    directory = tempfile.mkdtemp(prefix="bench-redis-")
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", directory, "--loglevel", "warning"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    atexit.register(server.terminate)
    deadline = time.monotonic() + 10
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
            break
        if server.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("redis-server did not start (is it installed?)")
        time.sleep(0.05)
    args.redis_url = f"redis://127.0.0.1:{port}/0"


def redis_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings naming the run's Redis server, for the redis transport."""
    if getattr(args, "transport", None) != "redis":
        return {}
    return {"REALTIME_REDIS_URL": args.redis_url}


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


def setup_django_from_env() -> None:
    """Set Django up in a subprocess on the database and settings its parent's
    ``Database.env`` put in the environment."""
    database = Database(
        os.environ["REALTIME_TEST_DATABASE"], os.environ["REALTIME_TEST_DATABASE_NAME"]
    )
    setup_django(database, json.loads(os.environ["REALTIME_TEST_SETTINGS"]))


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
    env: dict[str, str],
    log: Path | None,
    threshold: str | None = None,
    switch_interval: float | None = None,
) -> dict[str, str]:
    """``env`` for a server that logs each of its garbage collections into the directory
    ``log``, and runs with ``gc.set_threshold(*threshold)`` (``"700,10,10"``) and
    ``sys.setswitchinterval(switch_interval)`` if given."""
    if log is None and threshold is None and switch_interval is None:
        return env
    probed = {**env, "PYTHONPATH": os.pathsep.join([str(PROBE), env.get("PYTHONPATH", "")])}
    if log is not None:
        probed["REALTIME_BENCH_GC_LOG"] = str(log)
    if threshold is not None:
        probed["REALTIME_BENCH_GC_THRESHOLD"] = threshold
    if switch_interval is not None:
        probed["REALTIME_BENCH_SWITCH_INTERVAL"] = str(switch_interval)
    return probed


@dataclass(frozen=True)
class Collections:
    """A process's garbage collections over a window: young (generations 0 and 1) and full
    (generation 2), how many and the CPU they took."""

    young: int
    young_cpu: float
    full: int
    full_cpu: float
    #: The CPU of the longest full collection.
    full_longest: float = 0.0

    def show(self) -> str:
        return (
            f"{self.full} full ({self.full_cpu * 1000:,.0f} ms, the longest "
            f"{self.full_longest * 1000:,.0f} ms), "
            f"{self.young} young ({self.young_cpu * 1000:,.0f} ms)"
        )


def collections(directory: Path, pid: int, start: float, end: float) -> Collections:
    """The collections process ``pid`` logged (``probing_collections``) that ended between
    ``start`` and ``end`` (``time.time()``)."""
    counts = {"young": 0, "full": 0}
    cpu = {"young": 0.0, "full": 0.0}
    longest = 0.0
    log = directory / f"gc-{pid}.jsonl"
    lines = log.read_text().splitlines() if log.exists() else []
    for line in lines:
        entry = json.loads(line)
        if start <= entry["at"] <= end:
            kind = "full" if entry["generation"] == 2 else "young"
            counts[kind] += 1
            cpu[kind] += entry["cpu"]
            if kind == "full":
                longest = max(longest, entry["cpu"])
    return Collections(counts["young"], cpu["young"], counts["full"], cpu["full"], longest)


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


# --- Processes writing together -----------------------------------------------------------------

#: Writes each writing process makes, untimed, before it says it is ready.
WRITER_WARM_UP = 50
READY = "ready"
GO = "go"
#: Seconds to wait, after the writers are done, for a listening socket to have every frame.
DELIVERY_WAIT = 30.0


def add_writer_options(parser: argparse.ArgumentParser) -> None:
    """The hidden options a script's writing subprocesses are started with (see ``Writer``);
    the script gives them to ``write_rows`` with its own ``--writes``."""
    parser.add_argument(
        "--worker", choices=["announced", "unlocked", "plain"], help=argparse.SUPPRESS
    )
    parser.add_argument("--workspace", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--tag", default="", help=argparse.SUPPRESS)


def write_rows(mode: str, count: int, workspace_id: int, tag: str) -> None:
    """A writing subprocess: warm up, say ready, wait for go, then create ``count`` rows named
    ``<tag>-<i>`` in the workspace, each in its own ``transaction.atomic()``; report on stdout,
    as JSON, the start and end (``time.time()``), the count, and the seconds each write took.

    ``announced`` writes ``Company`` (a ``@realtime_model``): a write's time is its INSERT, its
    COMMIT and the publish of its announcement, run on commit. ``plain`` writes ``Plain``, the
    same columns undecorated, the floor: INSERT and COMMIT.
    """
    from django.db import transaction

    from tests.testapp.models import Company, Plain

    if mode == "unlocked":
        without_publish_lock()
    model: Any = Plain if mode == "plain" else Company
    for index in range(WRITER_WARM_UP):
        with transaction.atomic():
            model.objects.create(workspace_id=workspace_id, name=f"warm-{tag}-{index}")
    print(READY, flush=True)
    if sys.stdin.readline().strip() != GO:
        raise SystemExit("writing process: no go line")
    durations: list[float] = []
    start = time.time()
    for index in range(count):
        began = time.perf_counter()
        with transaction.atomic():
            model.objects.create(workspace_id=workspace_id, name=f"{tag}-{index}")
        durations.append(time.perf_counter() - began)
    end = time.time()
    report = {"start": start, "end": end, "count": count, "durations": durations}
    print(json.dumps(report), flush=True)


def without_publish_lock() -> None:
    """An ablation, for this benchmarking process only: publish as usual but without
    serialising on the log's publish lock, to tell the lock's share of the cost from the rest.

    PostgreSQL takes the same advisory lock in its shared form (the statement keeps its shape;
    shared holders never wait for each other); MySQL takes a named lock of this process's own.
    The log's ids then no longer grow in commit order: positions, resume and the table poller's
    order are not what realtime promises, so nobody should listen to these writes.
    """
    import os

    from realtime.transports import pg_log, table_store

    shared = table_store.PG_PUBLISH_START.replace(
        "pg_advisory_xact_lock(", "pg_advisory_xact_lock_shared("
    )
    own_name = f"{table_store.PUBLISH_LOCK_NAME}.{os.getpid()}"
    # Module constants, replaced in this process only.
    for module, name, value in (
        (table_store, "PG_PUBLISH_START", shared),
        (pg_log, "PG_PUBLISH_START", shared),
        (table_store, "PUBLISH_LOCK_NAME", own_name),
    ):
        setattr(module, name, value)


class Writer:
    """One writing subprocess (``write_rows``), driven from the event loop."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(
        cls,
        command: Sequence[str],
        mode: str,
        count: int,
        workspace_id: int,
        tag: str,
        env: dict[str, str],
    ) -> Writer:
        """Start ``python <command> --worker MODE --writes COUNT ...``: ``command`` is the
        script (and its subcommand) that hands these options to ``write_rows``."""
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            *command,
            "--worker",
            mode,
            "--writes",
            str(count),
            "--workspace",
            str(workspace_id),
            "--tag",
            tag,
            cwd=ROOT,
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        return cls(process)

    async def line(self, timeout: float = WAIT * 5) -> str:
        assert self.process.stdout is not None
        raw = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        if not raw:
            raise RuntimeError(f"a writing process exited with {await self.process.wait()}")
        return raw.decode().strip()

    def go(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{GO}\n".encode())

    async def report(self) -> dict[str, Any]:
        report: dict[str, Any] = json.loads(await self.line())
        await self.process.wait()
        return report

    async def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()


@dataclass
class Run:
    """Processes writing together: their combined rate, the time of each write, and, with a
    listening socket, the frames it heard."""

    rate: float
    durations: list[float]
    #: Distinct writes of the run whose frame the socket read, and frames read twice.
    delivered: int = 0
    duplicates: int = 0
    expected: int = 0
    #: From the end of the last writer to the last frame read.
    delivered_after: float = 0.0

    @property
    def lost(self) -> int:
        return self.expected - self.delivered


async def concurrent_writes(
    command: Sequence[str],
    processes: int,
    mode: str,
    count: int,
    members: Members,
    tag: str,
    env: dict[str, str],
    readers: Readers | None = None,
) -> Run:
    """``processes`` writers (``Writer``) creating ``count`` rows each, told to go together;
    the rate is all their writes over the time from the first start to the last end. With
    ``readers`` (the socket of a listening worker, see ``listening_worker``), the frames of
    the run's writes are counted, by name, waiting up to ``DELIVERY_WAIT`` for the last."""
    marker = f'"name":"{tag}-'
    names: set[str] = set()
    duplicates = [0]
    last = [0.0]
    done = asyncio.Event()
    expected = processes * count if readers is not None else 0

    def sink(index: int, frame: str | bytes, arrived: float) -> None:
        if not isinstance(frame, str) or (at := frame.find(marker)) < 0:
            return
        begin = at + len('"name":"')
        name = frame[begin : frame.find('"', begin)]
        if name in names:
            duplicates[0] += 1
            return
        names.add(name)
        last[0] = arrived
        if len(names) >= expected:
            done.set()

    if readers is not None:
        readers.sink = sink
    writers = await asyncio.gather(
        *(
            Writer.start(command, mode, count, members.workspace_id, f"{tag}-{n}", env)
            for n in range(processes)
        )
    )
    try:
        for writer in writers:
            if (line := await writer.line()) != READY:
                raise RuntimeError(f"a writing process said {line!r}")
        for writer in writers:
            writer.go()
        reports = [await writer.report() for writer in writers]
    finally:
        for writer in writers:
            await writer.kill()
    start = min(float(r["start"]) for r in reports)
    end = max(float(r["end"]) for r in reports)
    if expected:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), DELIVERY_WAIT)
    return Run(
        rate=sum(int(r["count"]) for r in reports) / (end - start),
        durations=[float(d) for r in reports for d in r["durations"]],
        delivered=len(names),
        duplicates=duplicates[0],
        expected=expected,
        delivered_after=max(last[0] - end, 0.0) if names else 0.0,
    )


@contextlib.asynccontextmanager
async def listening_worker(
    database: Database, members: Members, settings: dict[str, Any], name: str
) -> AsyncIterator[Readers]:
    """A daphne worker of the test application with these settings, and one socket of the
    workspace, subscribed to ``company``; yields the socket's reader (see
    ``concurrent_writes``)."""
    server = AsgiServer.start("tests.asgi:application", database.env(settings), name)
    connection = None
    readers = None
    try:
        connection = await open_subscribed(
            server.url("/api/ws"), members.tokens[0], members.slug, [CHANNEL]
        )
        readers = Readers([connection])
        readers.start()
        yield readers
    finally:
        if readers is not None:
            await readers.stop()
        if connection is not None:
            await close_all([connection])
        warnings = server.stop()
        if warnings:
            print(f"  (daphne logged {warnings} warning/error lines: {server.log})")


# --- The raw NOTIFY and SPUBLISH round trips --------------------------------------------------

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


def spublish_round_trips(url: str, count: int, pace: float) -> list[float]:
    """Seconds from sending ``SPUBLISH`` on one Redis connection to the message being read on
    another that ``SSUBSCRIBE``s, for ``count`` messages about ``pace`` seconds apart
    (jittered): the Redis transport's floor. The payload has the size of a small event."""
    import redis

    padding = "x" * 200
    received: dict[int, float] = {}
    listener = redis.Redis.from_url(url)
    sender = redis.Redis.from_url(url)
    pubsub = listener.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
    try:
        pubsub.ssubscribe(FLOOR_CHANNEL)
        pubsub.get_sharded_message(timeout=1.0)  # the confirmation
        ready = threading.Event()

        def listen() -> None:
            ready.set()
            deadline = time.monotonic() + WAIT + count * pace * 2
            while len(received) < count and time.monotonic() < deadline:
                message = pubsub.get_sharded_message(timeout=0.5)
                if message is not None and message["type"] == "smessage":
                    received[int(message["data"].split(b" ", 1)[0])] = time.time()

        thread = threading.Thread(target=listen, name="bench-redis-floor", daemon=True)
        thread.start()
        ready.wait(WAIT)
        time.sleep(0.05)
        sent: dict[int, float] = {}
        for index in range(count):
            sent[index] = time.time()
            sender.spublish(FLOOR_CHANNEL, f"{index} {padding}")
            time.sleep(jittered(pace))
        thread.join(WAIT + count * pace * 2)
    finally:
        pubsub.close()
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
