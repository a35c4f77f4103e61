"""Benchmark the pg_notify transport: the raw NOTIFY round trip, and announced writes per second.

Run from the project root (PostgreSQL, the ``realtime`` database, migrated by the script)::

    .venv/bin/python bench/pg_notify.py
    .venv/bin/python bench/pg_notify.py --writes 1000 --repeat 3

Two parts, each repeated ``--repeat`` times (median [min - max] across repeats):

* **round trip** (the floor of the latency benchmark): from sending ``SELECT pg_notify(...)``
  on one psycopg connection (autocommit) to reading the notification on another that LISTENs,
  in this process, ``--trips`` times per repeat, about ``--trip-pace`` seconds apart
  (jittered); p50 and p99.
* **announced writes per second**: two publishing subprocesses (copies of this script), started
  together, each create ``--writes`` rows of ``Company`` (a ``@realtime_model``) in the
  benchmark's workspace, each in its own ``transaction.atomic()`` block, so each write commits
  and then publishes its announcement through the pg_notify transport in a transaction of its
  own. The rate is the writes of both over the time from the first start to the last end.
  This runs twice per repeat: once while a daphne worker with the pg_notify transport LISTENs
  and serves one socket, authenticated for the workspace and subscribed to ``company`` (the
  load generator, this process, counts the frames it gets, so every announcement is really
  heard and delivered, by a worker sharing the cores with the publishers), and once with
  nobody listening (no worker running). Both runs happen twice: with the log (the default:
  each publish inserts its row into ``firm_channel_messages`` and NOTIFYs in one statement)
  and without it (``REALTIME_PG_NOTIFY_LOG = False``: a bare NOTIFY, the transport as it was
  before the log). The floor, in the same repeat: the same two processes creating as many
  rows of ``Plain`` (the same columns, not decorated), each in its own
  ``transaction.atomic()``: INSERT and COMMIT. The five runs take turns going first.

The benchmark's workspace, accounts and rows (``bench-pg-notify``...) are deleted at the end.
The publishers, daphne, the load generator and PostgreSQL share the machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness
from harness import AsgiServer, Database, Members, Readers, Spread

SCRIPT = Path(__file__).resolve()
PREFIX = "bench-pg-notify"
SETTINGS = {"REALTIME_TRANSPORT": "pg_notify"}
#: The transport as it was before it kept the log: a bare NOTIFY per message.
BARE = {**SETTINGS, "REALTIME_PG_NOTIFY_LOG": False}
WARM_UP = 50
READY = "ready"
GO = "go"
#: Seconds to wait, after the publishers are done, for the socket to have every frame.
DELIVERY_WAIT = 30.0


# --- Publishing subprocesses ------------------------------------------------------------------


def run_worker(mode: str, count: int, workspace_id: int, tag: str) -> None:
    """``--worker``: warm up, say ready, wait for go, write ``count`` rows, report JSON."""
    from django.db import transaction

    from tests.testapp.models import Company, Plain

    model: Any = Company if mode == "announced" else Plain
    for index in range(WARM_UP):
        with transaction.atomic():
            model.objects.create(workspace_id=workspace_id, name=f"warm-{tag}-{index}")
    print(READY, flush=True)
    if sys.stdin.readline().strip() != GO:
        raise SystemExit("publishing worker: no go line")
    start = time.time()
    for index in range(count):
        with transaction.atomic():
            model.objects.create(workspace_id=workspace_id, name=f"{tag}-{index}")
    end = time.time()
    print(json.dumps({"start": start, "end": end, "count": count}), flush=True)


class Worker:
    """One publishing subprocess, driven from the event loop."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(
        cls, mode: str, count: int, workspace_id: int, tag: str, env: dict[str, str]
    ) -> Worker:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(SCRIPT),
            "--worker",
            mode,
            "--writes",
            str(count),
            "--workspace",
            str(workspace_id),
            "--tag",
            tag,
            cwd=harness.ROOT,
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        return cls(process)

    async def line(self, timeout: float = harness.WAIT * 5) -> str:
        assert self.process.stdout is not None
        raw = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        if not raw:
            raise RuntimeError(f"a publishing worker exited with {await self.process.wait()}")
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
    """Two processes writing together: the combined rate, and what the socket heard."""

    rate: float
    delivered: int
    expected: int
    delivered_after: float


async def two_writers(
    mode: str, count: int, members: Members, tag: str, env: dict[str, str], readers: Readers | None
) -> Run:
    """Two workers writing ``count`` rows each, started together; ``readers`` (the socket of
    a listening worker, if any) count the frames the announcements became."""
    heard = [0]
    last = [0.0]
    marker = f'"name":"{tag}-'
    done = asyncio.Event()
    expected = 2 * count if readers is not None else 0

    def sink(index: int, frame: str | bytes, arrived: float) -> None:
        if isinstance(frame, str) and marker in frame:
            heard[0] += 1
            last[0] = arrived
            if heard[0] >= expected:
                done.set()

    if readers is not None:
        readers.sink = sink
    workers = [
        await Worker.start(mode, count, members.workspace_id, f"{tag}-{side}", env)
        for side in ("a", "b")
    ]
    try:
        for worker in workers:
            if (line := await worker.line()) != READY:
                raise RuntimeError(f"a publishing worker said {line!r}")
        for worker in workers:
            worker.go()
        reports = [await worker.report() for worker in workers]
    finally:
        for worker in workers:
            await worker.kill()
    start = min(float(r["start"]) for r in reports)
    end = max(float(r["end"]) for r in reports)
    if expected:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), DELIVERY_WAIT)
    total = sum(int(r["count"]) for r in reports)
    return Run(
        rate=total / (end - start),
        delivered=heard[0],
        expected=expected,
        delivered_after=max(last[0] - end, 0.0) if heard[0] else 0.0,
    )


@dataclass
class Repeat:
    trip_p50: float
    trip_p99: float
    #: Announced writes while a worker LISTENs and delivers each one to a socket.
    announced: Run
    #: Announced writes with nobody listening.
    unheard: Run
    #: The same two runs with REALTIME_PG_NOTIFY_LOG = False (a bare NOTIFY, no log row).
    bare_announced: Run
    bare_unheard: Run
    plain: Run


@contextlib.asynccontextmanager
async def listening_worker(
    database: Database, members: Members, settings: dict[str, Any]
) -> AsyncIterator[Readers]:
    """A daphne worker on the pg_notify transport with one socket of the workspace,
    subscribed to ``company``; yields the socket's reader."""
    server = AsgiServer.start("tests.asgi:application", database.env(settings), "pg-notify")
    connection = None
    readers = None
    try:
        connection = await harness.open_realtime(
            server.url("/api/ws"), members.tokens[0], members.slug, [harness.CHANNEL]
        )
        readers = Readers([connection])
        readers.start()
        yield readers
    finally:
        if readers is not None:
            await readers.stop()
        if connection is not None:
            await harness.close_all([connection])
        warnings = server.stop()
        if warnings:
            print(f"  (daphne logged {warnings} warning/error lines: {server.log})")


MODES = ("announced", "unheard", "bare_announced", "bare_unheard", "plain")


async def measure(args: argparse.Namespace, database: Database, members: Members) -> list[Repeat]:
    results: list[Repeat] = []
    for index in range(args.repeat):
        trips = await asyncio.to_thread(
            harness.notify_round_trips, harness.conninfo(), args.trips, args.trip_pace
        )
        runs: dict[str, Run] = {}
        # Each mode goes first in turn.
        turn = index % len(MODES)
        for mode in MODES[turn:] + MODES[:turn]:
            tag = f"r{index}-{mode}"
            settings = BARE if mode.startswith("bare_") else SETTINGS
            env = database.env(settings)
            if mode.endswith("announced"):
                async with listening_worker(database, members, settings) as readers:
                    runs[mode] = await two_writers(
                        "announced", args.writes, members, tag, env, readers
                    )
            else:
                kind = "plain" if mode == "plain" else "announced"
                runs[mode] = await two_writers(kind, args.writes, members, tag, env, None)
        repeat = Repeat(
            harness.percentile(trips, 0.5),
            harness.percentile(trips, 0.99),
            runs["announced"],
            runs["unheard"],
            runs["bare_announced"],
            runs["bare_unheard"],
            runs["plain"],
        )
        results.append(repeat)
        announced = repeat.announced
        print(
            f"  repeat {index + 1}/{args.repeat}: round trip p50 "
            f"{harness.millis(repeat.trip_p50)} p99 {harness.millis(repeat.trip_p99)}; "
            f"announced {harness.per_second(announced.rate)} with a worker listening "
            f"(its socket heard {announced.delivered}/{announced.expected}, the last "
            f"{harness.millis(announced.delivered_after)} after the writes ended), "
            f"{harness.per_second(repeat.unheard.rate)} with nobody listening; without the "
            f"log {harness.per_second(repeat.bare_announced.rate)} and "
            f"{harness.per_second(repeat.bare_unheard.rate)}; "
            f"plain {harness.per_second(repeat.plain.rate)}",
            flush=True,
        )
    return results


def report(results: list[Repeat]) -> dict[str, Any]:
    ms = harness.millis
    rate = harness.per_second
    p50 = Spread.of([r.trip_p50 for r in results])
    p99 = Spread.of([r.trip_p99 for r in results])
    print("\nraw NOTIFY round trip (median [min - max] of the per-repeat percentiles)")
    print(f"  p50 {p50.show(ms)}")
    print(f"  p99 {p99.show(ms)}")
    floor = [r.plain.rate for r in results]
    print("\nwrites per second, two processes together (median [min - max])")
    summary: dict[str, Any] = {
        "round_trip": {"p50": p50.as_dict(), "p99": p99.as_dict()},
        "plain_per_second": Spread.of(floor).as_dict(),
    }
    for name, label in (
        ("announced", "a worker listening, one socket"),
        ("unheard", "nobody listening"),
    ):
        logged = [getattr(r, name).rate for r in results]
        bare = [getattr(r, f"bare_{name}").rate for r in results]
        to_bare = Spread.of(harness.ratios(logged, bare))
        print(f"  announced (Company, pg_notify), {label}:")
        print(f"    with the log     {Spread.of(logged).show(rate)}")
        print(f"    without the log  {Spread.of(bare).show(rate)}")
        print(
            f"    ratio log / no log {to_bare.show(harness.times)}; to the floor "
            f"{Spread.of(harness.ratios(logged, floor)).show(harness.times)} and "
            f"{Spread.of(harness.ratios(bare, floor)).show(harness.times)}"
        )
        summary[name] = {
            "log_per_second": Spread.of(logged).as_dict(),
            "bare_per_second": Spread.of(bare).as_dict(),
            "log_to_bare": to_bare.as_dict(),
        }
    print(f"  floor: plain INSERT + COMMIT     {Spread.of(floor).show(rate)}")
    for name in ("announced", "bare_announced"):
        delivered = sum(getattr(r, name).delivered for r in results)
        expected = sum(getattr(r, name).expected for r in results)
        lag = Spread.of([getattr(r, name).delivered_after for r in results])
        print(
            f"  frames the socket got ({'without' if name.startswith('bare') else 'with'} the "
            f"log): {delivered:,} of {expected:,}; the last one {lag.show(ms)} after the writes "
            "ended"
        )
        summary[f"{name}_delivered"] = {
            "delivered": delivered,
            "expected": expected,
            "lag": lag.as_dict(),
        }
    return summary


def postgresql_settings() -> str:
    from django.db import connection

    values = []
    with connection.cursor() as cursor:
        for name in ("synchronous_commit", "fsync", "shared_buffers"):
            cursor.execute(f"SHOW {name}")
            row = cursor.fetchone()
            values.append(f"{name} {row[0] if row else '?'}")
    return ", ".join(values)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--repeat", type=int, default=5, help="repeats of each measurement")
    parser.add_argument("--writes", type=int, default=3000, help="writes per process and run")
    parser.add_argument("--trips", type=int, default=500, help="round trips per repeat")
    parser.add_argument(
        "--trip-pace", type=float, default=0.005, help="mean seconds between round trips"
    )
    parser.add_argument("--json", type=Path, help="also write the summary to this file")
    # Internal: the publishing subprocesses.
    parser.add_argument("--worker", choices=["announced", "plain"], help=argparse.SUPPRESS)
    parser.add_argument("--workspace", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--tag", default="", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    database = Database("postgresql", "realtime")
    if args.worker is not None:
        # The settings of the run (with or without the log) come from the parent.
        harness.setup_django(database, json.loads(os.environ["REALTIME_TEST_SETTINGS"]))
        run_worker(args.worker, args.writes, args.workspace, args.tag)
        return
    harness.migrate(database, SETTINGS)
    harness.setup_django(database, SETTINGS)
    started = time.monotonic()
    harness.header("pg_notify transport benchmark", harness.server_version())
    print(f"postgresql: {postgresql_settings()}")
    print(
        f"settings: {args.repeat} repeats; {args.trips} round trips per repeat; "
        f"{args.writes} writes per process per run, two processes",
        flush=True,
    )
    members = harness.make_members(PREFIX, 1)
    try:
        results = asyncio.run(measure(args, database, members))
    finally:
        harness.drop_members(PREFIX)
    summary = {
        "database": harness.server_version(),
        "code": harness.code_version(),
        "results": report(results),
    }
    print(f"\nload average after: {harness.load_average()}")
    print(f"took {time.monotonic() - started:.0f} s")
    harness.write_json(args.json, summary)


if __name__ == "__main__":
    main()
