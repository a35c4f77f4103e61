"""Soak: thousands of sockets on two workers under a steady stream of writes, for minutes.

Run from the project root (the default: 5,000 sockets, 100 writes/s, 10 minutes)::

    .venv/bin/python bench/soak.py --database postgresql --transport pg_notify
    .venv/bin/python bench/soak.py --short --gc-freeze off   # 500 sockets, 20 s of writes

Two daphne workers serve ``bench/soak_asgi.py`` (the test application, its collector
watched). The load generator (this process) opens ``--sockets`` sockets, alternately on each
worker, each its own account, spread over ``--scopes`` workspaces and subscribed to
``company``. A publishing subprocess then creates ``Company`` rows at ``--rate`` a second, in
a workspace drawn at random, for ``--duration`` seconds; each frame reaches the sockets of
that workspace (so sockets x rate / scopes frames a second in all). The clock of a frame
starts when its write's transport publish starts, right after the commit, and stops when a
socket reads it.

Reported, for each tenth of the run: p50 and p99 commit→frame over the frames of writes made
in it; each worker's resident memory and open file descriptors at its end; and its garbage
collections (count, longest, p99 of the pauses). At the end: deliveries lost (expected frames
that never arrived, after a drain of up to 30 s; must be 0), duplicates, sockets closed by the
server, and the growth of memory and descriptors from the first tenth to the last (must be
flat). Beside the lag, the floor measured in the same run: for pg_notify the raw NOTIFY round
trip, for the table transport half the polling interval plus one poll query.

``--gc-freeze both`` (the default) runs the soak twice, without and then with ``gc.freeze()``
in the workers after start-up; ``on`` or ``off`` runs one. Everything shares the machine's
cores: the load generator, the publisher, both workers and the database.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness
from harness import AsgiServer, Database

SCRIPT = Path(__file__).resolve()
PREFIX = "bench-soak"
APPLICATION = "soak_asgi:application"
#: Seconds the drain waits for frames still missing after the last write.
DRAIN = 30.0
WINDOWS = 10


# --- The publishing subprocess ------------------------------------------------------------------


def run_publisher(workspace_ids: list[int], rate: float, duration: float) -> None:
    """``--publisher``: create ``Company`` rows at ``rate`` a second for ``duration`` seconds,
    each in a random workspace; print one JSON line per write: seq, workspace index, and
    the time its transport publish started."""
    from realtime.transports import get_transport
    from tests.testapp.models import Company

    transport = get_transport()
    publish = transport.publish
    started: list[float] = []

    def timed(messages: Any) -> None:
        started.append(time.time())
        publish(messages)

    setattr(transport, "publish", timed)  # noqa: B010 - this process's transport only
    Company.objects.create(workspace_id=workspace_ids[0], name="warm-up")
    print("ready", flush=True)
    sys.stdin.readline()
    begin = time.monotonic()
    seq = 0
    while (elapsed := time.monotonic() - begin) < duration:
        ahead = seq / rate - elapsed
        if ahead > 0:
            time.sleep(ahead)
        scope = random.randrange(len(workspace_ids))
        started.clear()
        Company.objects.create(workspace_id=workspace_ids[scope], name=f"soak-{seq}")
        print(json.dumps([seq, scope, started[0] if started else time.time()]), flush=True)
        seq += 1
    print("done", flush=True)


# --- Accounts -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class World:
    slugs: list[str]
    workspace_ids: list[int]
    tokens: list[str]
    #: The workspace index of each socket.
    scope_of: list[int]


def make_world(sockets: int, scopes: int) -> World:
    """``scopes`` workspaces and ``sockets`` accounts; account i is a member of workspace
    i % scopes."""
    from django.contrib.auth import get_user_model

    from realtime.auth import issue_token
    from tests.testapp.models import Membership, Workspace

    user_model = get_user_model()
    workspaces = []
    for index in range(scopes):
        slug = f"{PREFIX}-{index}"
        workspaces.append(Workspace.objects.get_or_create(slug=slug, defaults={"name": slug})[0])
    names = [f"{PREFIX}-{index:05d}" for index in range(sockets)]
    accounts = user_model._default_manager.filter(username__startswith=f"{PREFIX}-")
    existing = set(accounts.values_list("username", flat=True))
    user_model._default_manager.bulk_create(
        [user_model(username=name, password="!") for name in names if name not in existing],  # noqa: S106 - unusable
        batch_size=500,
    )
    users = list(accounts.filter(username__in=names).order_by("username"))
    Membership.objects.bulk_create(
        [
            Membership(workspace=workspaces[index % scopes], user=user)
            for index, user in enumerate(users)
        ],
        ignore_conflicts=True,
        batch_size=500,
    )
    return World(
        slugs=[w.slug for w in workspaces],
        workspace_ids=[w.pk for w in workspaces],
        tokens=[issue_token(user) for user in users],
        scope_of=[index % scopes for index in range(len(users))],
    )


def drop_world() -> None:
    from django.contrib.auth import get_user_model
    from django.db import connection

    from tests.testapp.models import Company, Membership, Workspace

    workspaces = Workspace.objects.filter(slug__startswith=f"{PREFIX}-")
    ids = list(workspaces.values_list("pk", flat=True))
    if ids:
        with connection.cursor() as cursor:
            table = connection.ops.quote_name(Company._meta.db_table)
            marks = ",".join(["%s"] * len(ids))
            cursor.execute(f"DELETE FROM {table} WHERE workspace_id IN ({marks})", ids)
        Membership.objects.filter(workspace_id__in=ids).delete()
        workspaces.delete()
    get_user_model()._default_manager.filter(username__startswith=f"{PREFIX}-").delete()


# --- One soak -----------------------------------------------------------------------------------


@dataclass
class Window:
    lags: list[float] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)
    pauses: list[float] = field(default_factory=list)


@dataclass
class Soak:
    frozen: bool
    windows: list[Window]
    writes: int
    expected: int
    received: int
    duplicates: int
    closed: int
    floor: float

    @property
    def lost(self) -> int:
        return self.expected - (self.received - self.duplicates)


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def gc_pauses(worker: AsgiServer) -> list[float]:
    return [seconds for _, seconds in worker.get_json("/_bench/gc")["pauses"]]


async def soak(args: argparse.Namespace, database: Database, world: World, frozen: bool) -> Soak:
    settings = transport_settings(args)
    env = database.env(settings, path=(harness.BENCH, harness.ROOT))
    env["REALTIME_BENCH_GC_FREEZE"] = "1" if frozen else "0"
    workers = [AsgiServer.start(APPLICATION, env, f"soak-{n}") for n in range(2)]
    connections: list[Any] = []
    publisher = await asyncio.create_subprocess_exec(
        sys.executable,
        str(SCRIPT),
        "--publisher",
        json.dumps(world.workspace_ids),
        "--rate",
        str(args.rate),
        "--duration",
        str(args.duration),
        "--database",
        args.database,
        env=database.env(settings, path=(harness.BENCH, harness.ROOT)),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert publisher.stdin is not None
    assert publisher.stdout is not None
    try:
        opened = time.monotonic()
        urls = [worker.url("/api/ws") for worker in workers]
        connections = await harness.open_many(
            args.sockets,
            lambda i: harness.open_realtime(
                urls[i % 2], world.tokens[i], world.slugs[world.scope_of[i]], [harness.CHANNEL]
            ),
        )
        print(
            f"\n{'with' if frozen else 'without'} gc.freeze(): {args.sockets:,} sockets open "
            f"in {time.monotonic() - opened:.1f} s",
            flush=True,
        )
        arrivals: dict[int, list[float]] = defaultdict(list)
        seen: set[tuple[int, int]] = set()
        duplicates = 0

        def sink(index: int, frame: str | bytes, arrived: float) -> None:
            nonlocal duplicates
            name = json.loads(frame).get("data", {}).get("name", "")
            if not name.startswith("soak-"):
                return
            seq = int(name[5:])
            if (seq, index) in seen:
                duplicates += 1
            seen.add((seq, index))
            arrivals[seq].append(arrived)

        readers = harness.Readers(connections, sink)
        readers.start()
        for worker in workers:
            await worker.settle()
            await asyncio.to_thread(gc_pauses, worker)  # start counting now
        floor = await measure_floor(args, world)
        await publisher.stdout.readline()  # ready
        publisher.stdin.write(b"go\n")
        written: list[tuple[int, int, float]] = []
        windows = [Window() for _ in range(WINDOWS)]
        span = args.duration / WINDOWS
        begin = time.monotonic()
        for index, window in enumerate(windows):
            end = begin + span * (index + 1)
            while time.monotonic() < end:
                try:
                    line = await asyncio.wait_for(
                        publisher.stdout.readline(), max(0.01, end - time.monotonic())
                    )
                except TimeoutError:
                    break
                if line.startswith(b"["):
                    written.append(tuple(json.loads(line)))
            for worker in workers:
                window.rss.append(worker.rss())
                window.fds.append(fd_count(worker.pid))
                window.pauses += await asyncio.to_thread(gc_pauses, worker)
        while (line := await publisher.stdout.readline()) and not line.startswith(b"done"):
            written.append(tuple(json.loads(line)))
        sizes = [world.scope_of.count(scope) for scope in range(len(world.slugs))]
        expected = sum(sizes[scope] for _, scope, _ in written)
        deadline = time.monotonic() + DRAIN
        while len(seen) < expected and time.monotonic() < deadline:  # noqa: ASYNC110 - bounded
            await asyncio.sleep(0.1)
        commit_start = written[0][2] if written else 0.0
        for seq, _, committed in written:
            slot = min(WINDOWS - 1, int((committed - commit_start) / span))
            windows[slot].lags += [arrived - committed for arrived in arrivals.get(seq, [])]
        await readers.stop()
        return Soak(
            frozen,
            windows,
            len(written),
            expected,
            sum(len(times) for times in arrivals.values()),
            duplicates,
            readers.closed,
            floor,
        )
    finally:
        if publisher.returncode is None:
            publisher.kill()
            await publisher.wait()
        await harness.close_all(connections)
        for worker in workers:
            warnings = worker.stop()
            if warnings:
                print(f"  (a worker logged {warnings} warning/error lines: {worker.log})")


async def measure_floor(args: argparse.Namespace, world: World) -> float:
    """The p50 floor of commit→frame on this transport, measured now."""
    if args.transport == "pg_notify":
        trips = await asyncio.to_thread(harness.notify_round_trips, harness.conninfo(), 200, 0.005)
        return float(harness.percentile(trips, 0.5))
    from latency import table_floor

    members = harness.Members(PREFIX, world.workspace_ids[0], world.slugs[0], [], [])
    one_row, _ = await asyncio.to_thread(table_floor, members, 100)
    return float(args.polling_interval / 2 + one_row)


# --- Report ---------------------------------------------------------------------------------------


def mib(value: float) -> str:
    return f"{value / 2**20:.1f} MiB"


def report(args: argparse.Namespace, result: Soak) -> dict[str, Any]:
    label = "with gc.freeze()" if result.frozen else "without gc.freeze()"
    span = args.duration / WINDOWS
    print(f"\n{label}: floor p50 {harness.millis(result.floor)} (measured in this run)")
    print(
        "  window          frames  p50 lag (x floor)    p99 lag        RSS per worker        fds"
        "   GC: n, max, p99"
    )
    rows = []
    for index, window in enumerate(result.windows):
        p50 = harness.percentile(window.lags, 0.5)
        p99 = harness.percentile(window.lags, 0.99)
        ratio = p50 / result.floor if result.floor else math.nan
        pause_max = max(window.pauses, default=0.0)
        pause_p99 = harness.percentile(window.pauses, 0.99) if window.pauses else 0.0
        print(
            f"  {index * span:5.0f}-{(index + 1) * span:<5.0f}s {len(window.lags):>8,}  "
            f"{harness.millis(p50):>9} ({ratio:5.1f}x)  {harness.millis(p99):>9}  "
            f"{' / '.join(mib(r) for r in window.rss):>20}  "
            f"{'/'.join(str(f) for f in window.fds):>9}   "
            f"{len(window.pauses)}, {harness.millis(pause_max)}, {harness.millis(pause_p99)}"
        )
        rows.append(
            {
                "from": index * span,
                "frames": len(window.lags),
                "p50": p50,
                "p99": p99,
                "rss": window.rss,
                "fds": window.fds,
                "gc_count": len(window.pauses),
                "gc_max": pause_max,
                "gc_p99": pause_p99,
            }
        )
    first, last = result.windows[0], result.windows[-1]
    every = [lag for window in result.windows for lag in window.lags]
    every_pause = [p for window in result.windows for p in window.pauses]
    print(
        f"  writes {result.writes:,}; frames expected {result.expected:,}, received "
        f"{result.received:,}; lost {result.lost:,}; duplicates {result.duplicates}; "
        f"sockets closed by the server {result.closed}"
    )
    print(
        f"  whole run: p50 {harness.millis(harness.percentile(every, 0.5))}, p99 "
        f"{harness.millis(harness.percentile(every, 0.99))}; GC pauses {len(every_pause)}, "
        f"max {harness.millis(max(every_pause, default=0.0))}, p99 "
        f"{harness.millis(harness.percentile(every_pause, 0.99) if every_pause else 0.0)}"
    )
    print(
        "  first → last window: RSS "
        + ", ".join(f"{mib(a)} → {mib(b)}" for a, b in zip(first.rss, last.rss, strict=True))
        + "; fds "
        + ", ".join(f"{a} → {b}" for a, b in zip(first.fds, last.fds, strict=True)),
        flush=True,
    )
    return {
        "frozen": result.frozen,
        "floor_p50": result.floor,
        "writes": result.writes,
        "expected": result.expected,
        "received": result.received,
        "lost": result.lost,
        "duplicates": result.duplicates,
        "closed": result.closed,
        "p50": harness.percentile(every, 0.5),
        "p99": harness.percentile(every, 0.99),
        "gc_pauses": len(every_pause),
        "gc_max": max(every_pause, default=0.0),
        "windows": rows,
    }


# --- Command line ------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database", choices=["sqlite", "postgresql"], default="postgresql")
    parser.add_argument("--transport", choices=["table", "pg_notify"], default="table")
    parser.add_argument("--sockets", type=int, default=5000)
    parser.add_argument("--scopes", type=int, default=250, help="workspaces the sockets share")
    parser.add_argument("--rate", type=float, default=100.0, help="announced writes a second")
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of writes")
    parser.add_argument("--short", action="store_true", help="500 sockets for 20 s")
    parser.add_argument("--gc-freeze", choices=["off", "on", "both"], default="both")
    parser.add_argument("--polling-interval", type=float, default=0.1)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--publisher", default=None, help=argparse.SUPPRESS)
    harness.add_set_option(parser)
    args = parser.parse_args(argv)
    if args.short:
        args.sockets, args.scopes, args.duration = 500, 25, 20.0
    return args


def transport_settings(args: argparse.Namespace) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "REALTIME_TRANSPORT": args.transport,
        "REALTIME_POLLING_INTERVAL": args.polling_interval,
    }
    settings.update(harness.parse_settings(args.set))
    return settings


def main() -> None:
    args = parse_args()
    if args.publisher is not None:
        settings = json.loads(os.environ["REALTIME_TEST_SETTINGS"])
        name = os.environ["REALTIME_TEST_DATABASE_NAME"]
        harness.setup_django(Database(args.database, name), settings)
        run_publisher(json.loads(args.publisher), args.rate, args.duration)
        return
    if args.transport == "pg_notify" and args.database != "postgresql":
        raise SystemExit("the pg_notify transport needs --database postgresql")
    harness.raise_open_files(args.sockets * 2 + 1024)
    database = Database.pick(args.database, "soak")
    settings = transport_settings(args)
    harness.migrate(database, settings)
    harness.setup_django(database, settings)
    harness.header(f"soak ({args.transport} transport)", harness.server_version())
    print(
        f"settings: {args.sockets:,} sockets on 2 workers in {args.scopes} workspaces, "
        f"{args.rate:g} writes/s for {args.duration:g} s "
        f"(~{args.sockets * args.rate / args.scopes:,.0f} frames/s)",
        flush=True,
    )
    started = time.monotonic()
    world = make_world(args.sockets, args.scopes)
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.gc_freeze]
    summary: dict[str, Any] = {"settings": settings, "code": harness.code_version(), "runs": []}
    try:
        for frozen in modes:
            result = asyncio.run(soak(args, database, world, frozen))
            summary["runs"].append(report(args, result))
    finally:
        if database.vendor == "postgresql":
            drop_world()
    print(f"\nload average after: {harness.load_average()}")
    print(f"took {time.monotonic() - started:.0f} s")
    harness.write_json(args.json, summary)
    if any(run["lost"] for run in summary["runs"]):
        raise SystemExit("deliveries were lost")


if __name__ == "__main__":
    main()
