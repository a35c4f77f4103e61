"""Benchmark how realtime's cost grows with concurrent writers and with workers.

Run from the project root, once per transport and database::

    .venv/bin/python bench/scale.py writers --transport table --database sqlite
    .venv/bin/python bench/scale.py writers --transport table --database postgresql
    .venv/bin/python bench/scale.py writers --transport table --database mariadb
    .venv/bin/python bench/scale.py writers --transport pg_notify --database postgresql
    .venv/bin/python bench/scale.py workers --transport table --database sqlite
    .venv/bin/python bench/scale.py workers --transport table --database postgresql
    .venv/bin/python bench/scale.py workers --transport pg_notify --database postgresql

Every announcement is published in a transaction that holds one lock of the database (the
publish lock of the log, so that ids grow in commit order; SQLite has one writer anyway), and
PostgreSQL's NOTIFY takes a lock at commit too; every worker of the table transport polls the
database. These two subcommands measure where that stops growing.

``writers``: for each count of ``--counts`` (default 1, 2, 4 and 8), that many writing
processes (``harness.write_rows``), told to go together, each create ``--writes`` rows, each
in its own ``transaction.atomic()``. Once as ``Company`` (a ``@realtime_model``: the write,
its commit, then its announcement published on commit) and once as ``Plain`` (the same
columns, not decorated: realtime off, the floor), in turns (which goes first alternates).
Reported per count: the writes per second of all the processes together, with realtime and
without, their ratio (per repeat), the growth over one writer, and the p50 and p99 of one
write's time (its ``atomic()`` block, the publish included). Nobody listens by default; with
``--listen``, a daphne worker of the test application runs through both runs of each repeat
with one socket subscribed to ``company``, and the load generator counts the frames of the
announced writes by name: a write whose frame never came is reported lost (and the script
exits non-zero).

``workers``: for each count of ``--counts`` (default 1, 2 and 4), that many daphne workers of
the test application, each holding ``--sockets`` sockets (default 1,000), every socket its own
account, all of them members of one workspace and subscribed to ``company``: every write
reaches every socket of every worker. A publishing subprocess (``latency.py``'s) creates a
``Company`` about ``--rate`` times a second (jittered) for ``--seconds``; the clock of a write
starts when its publish returned (committed) and stops when a socket reads its frame.
Reported per count: commit → frame p50 and p99 over every frame, commit → the last socket's
frame p50 and p99 over the writes, beside the floor measured in the same repeat (``latency.py``'s:
the raw NOTIFY round trip, or half the polling interval plus one poll); the workers' CPU
(all together, in share of a core) while idle before the writes and during them; on
PostgreSQL, the database's transactions per second during the writes (``pg_stat_database``,
every client of the database: the pollers, the publisher, the LISTEN connections' reads).
Frames that never came (after a drain of up to 30 s) are reported, and fail the run.

Each figure is the median [min - max] across ``--repeat`` repeats. SQLite uses a file of its
own, made anew (``/tmp/realtime-bench-scale-*.sqlite3``); PostgreSQL and MariaDB the
``realtime`` database, migrated, where the benchmark's workspace, accounts and rows
(``bench-scale``...) are deleted at the end. The writers, workers, load generator and
database share the machine's cores: past the cores' count, more processes mostly share them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness
import latency
from harness import AsgiServer, Database, Members, Readers, Run, Spread

SCRIPT = Path(__file__).resolve()
PREFIX = "bench-scale"
#: Writes of the ``workers`` subcommand before a count's timed repeats (they also prove that
#: every socket hears the writes).
WARM_UP = 3
#: Seconds to wait, after the last write of a repeat, for every socket to have every frame.
DRAIN = 30.0
#: Round trips (pg_notify) per floor measurement of the ``workers`` subcommand.
FLOOR_SAMPLES = 200


# --- writers ------------------------------------------------------------------------------------


@dataclass
class WritersRepeat:
    """One repeat at one count of writers: realtime on, and off (``Plain``); with
    ``--ablate-lock``, realtime on without the publish lock too."""

    announced: Run
    plain: Run
    unlocked: Run | None = None


def listening(
    args: argparse.Namespace, database: Database, members: Members, settings: dict[str, Any]
) -> contextlib.AbstractAsyncContextManager[Readers | None]:
    if args.listen:
        return harness.listening_worker(database, members, settings, "scale-writers")
    return contextlib.nullcontext()


async def measure_writers(
    args: argparse.Namespace,
    counts: Sequence[int],
    database: Database,
    settings: dict[str, Any],
    members: Members,
) -> dict[int, list[WritersRepeat]]:
    command = (str(SCRIPT), "writers", "--database", args.database)
    env = database.env(settings)
    results: dict[int, list[WritersRepeat]] = {}
    for count in counts:
        print(f"\n{count} writing process(es), {args.writes:,} writes each", flush=True)
        for index in range(args.repeat):
            runs: dict[str, Run] = {}
            modes = ["announced", "plain"] + (["unlocked"] if args.ablate_lock else [])
            if index % 2:
                modes.reverse()
            async with listening(args, database, members, settings) as readers:
                for mode in modes:
                    runs[mode] = await harness.concurrent_writes(
                        command,
                        count,
                        mode,
                        args.writes,
                        members,
                        f"w{count}-r{index}-{mode}",
                        env,
                        readers if mode == "announced" else None,
                    )
            repeat = WritersRepeat(runs["announced"], runs["plain"], runs.get("unlocked"))
            results.setdefault(count, []).append(repeat)
            print_writers_repeat(index, args, repeat)
    return results


def print_writers_repeat(index: int, args: argparse.Namespace, repeat: WritersRepeat) -> None:
    ms = harness.millis
    on, off = repeat.announced, repeat.plain
    line = (
        f"  repeat {index + 1}/{args.repeat}: realtime {harness.per_second(on.rate)} "
        f"(a write p50 {ms(p(on.durations, 0.5))}, p99 {ms(p(on.durations, 0.99))}); "
        f"off {harness.per_second(off.rate)} (p50 {ms(p(off.durations, 0.5))}, "
        f"p99 {ms(p(off.durations, 0.99))}); ratio {harness.times(on.rate / off.rate)}"
    )
    if repeat.unlocked is not None:
        line += f"; without the lock {harness.per_second(repeat.unlocked.rate)}"
    if args.listen:
        line += f"; the socket heard {on.delivered:,} of {on.expected:,}"
        if on.lost:
            line += f", LOST {on.lost:,}"
        if on.duplicates:
            line += f", {on.duplicates} twice"
        line += f", the last {ms(on.delivered_after)} after the writes ended"
    print(line, flush=True)


def p(values: Sequence[float], fraction: float) -> float:
    return harness.percentile(values, fraction)


def report_writers(args: argparse.Namespace, results: dict[int, list[WritersRepeat]]) -> Any:
    ms = harness.millis
    rate = harness.per_second
    print(
        f"\nwrites per second, all writing processes together, {args.transport} on "
        f"{args.database} (median [min - max] across repeats; ratios per repeat)"
    )
    ones = results.get(1)
    summary: dict[str, Any] = {}
    lost = 0
    for count, repeats in results.items():
        on = [r.announced.rate for r in repeats]
        off = [r.plain.rate for r in repeats]
        ratio = Spread.of(harness.ratios(on, off))
        print(f"\n  {count} writer(s), {len(repeats)} repeats")
        print(f"    realtime on   {Spread.of(on).show(rate)}")
        print(f"    realtime off  {Spread.of(off).show(rate)}  (Plain: INSERT + COMMIT)")
        print(f"    ratio on/off  {ratio.show(harness.times)}")
        unlocked = [r.unlocked.rate for r in repeats if r.unlocked is not None]
        if len(unlocked) == len(repeats):
            print(f"    on, no lock   {Spread.of(unlocked).show(rate)}  (ablation: not orderly)")
            lock_ratio = Spread.of(harness.ratios(on, unlocked))
            print(f"    ratio on/no lock {lock_ratio.show(harness.times)}")
        entry: dict[str, Any] = {
            "on_per_second": Spread.of(on).as_dict(),
            "off_per_second": Spread.of(off).as_dict(),
            "ratio": ratio.as_dict(),
        }
        if len(unlocked) == len(repeats):
            entry["unlocked_per_second"] = Spread.of(unlocked).as_dict()
            entry["ratio_on_unlocked"] = lock_ratio.as_dict()
        if ones is not None and count != 1 and len(ones) == len(repeats):
            grew_on = Spread.of(harness.ratios(on, [r.announced.rate for r in ones]))
            grew_off = Spread.of(harness.ratios(off, [r.plain.rate for r in ones]))
            print(
                f"    over 1 writer: on {grew_on.show(harness.times)}, "
                f"off {grew_off.show(harness.times)}"
            )
            entry["over_one_on"] = grew_on.as_dict()
            entry["over_one_off"] = grew_off.as_dict()
        for name, pick in (("on", "announced"), ("off", "plain")):
            runs = [getattr(r, pick) for r in repeats]
            p50 = Spread.of([p(run.durations, 0.5) for run in runs])
            p99 = Spread.of([p(run.durations, 0.99) for run in runs])
            print(f"    one write, realtime {name + ':':<4} p50 {p50.show(ms)}, p99 {p99.show(ms)}")
            entry[f"write_{name}"] = {"p50": p50.as_dict(), "p99": p99.as_dict()}
        if args.listen:
            delivered = sum(r.announced.delivered for r in repeats)
            expected = sum(r.announced.expected for r in repeats)
            twice = sum(r.announced.duplicates for r in repeats)
            after = Spread.of([r.announced.delivered_after for r in repeats])
            missing = expected - delivered
            lost += missing
            print(
                f"    frames the listening socket read: {delivered:,} of {expected:,}"
                + (f" — {missing:,} LOST" if missing else "")
                + (f", {twice} read twice" if twice else "")
                + f"; the last {after.show(ms)} after the writes ended"
            )
            entry["delivered"] = {
                "delivered": delivered,
                "expected": expected,
                "lost": missing,
                "duplicates": twice,
                "after": after.as_dict(),
            }
        summary[str(count)] = entry
    summary["lost"] = lost
    return summary


# --- workers ------------------------------------------------------------------------------------


@dataclass
class Write:
    committed: float
    arrivals: list[float] = field(default_factory=list)


@dataclass
class WorkersRepeat:
    """One repeat at one count of workers."""

    sockets: int
    writes: list[Write]
    duplicates: int
    floor_p50: float
    floor_p99: float
    #: The workers' CPU (all together, share of one core) just before the writes, and during.
    idle_cpu: float
    busy_cpu: float
    #: Seconds the writes took.
    window: float
    #: PostgreSQL: transactions per second in the database during the writes (else NaN).
    database_tps: float

    def every_frame(self) -> list[float]:
        return [at - w.committed for w in self.writes for at in w.arrivals]

    def last_frames(self) -> list[float]:
        """Commit → the last socket's frame, for each write every socket had."""
        return [
            max(w.arrivals) - w.committed for w in self.writes if len(w.arrivals) >= self.sockets
        ]

    @property
    def missing(self) -> int:
        return sum(self.sockets - len(w.arrivals) for w in self.writes)

    @property
    def cpu_per_frame(self) -> float:
        """The workers' CPU per frame sent, their idle share taken off."""
        frames = len(self.writes) * self.sockets
        return (self.busy_cpu - self.idle_cpu) * self.window / frames if frames else math.nan


class Hearing:
    """Every socket's frames of the benchmark's writes, by the name of the written row."""

    MARKER = f'"name":"{PREFIX}-'

    def __init__(self) -> None:
        self.writes: dict[str, Write] = {}
        self.seen: set[tuple[str, int]] = set()
        self.duplicates = 0

    def sink(self, index: int, frame: str | bytes, arrived: float) -> None:
        if not isinstance(frame, str) or (at := frame.find(self.MARKER)) < 0:
            return
        begin = at + len('"name":"')
        name = frame[begin : frame.find('"', begin)]
        if (name, index) in self.seen:
            self.duplicates += 1
            return
        self.seen.add((name, index))
        self.writes.setdefault(name, Write(0.0)).arrivals.append(arrived)

    async def write(self, publisher: latency.Publisher, name: str) -> Write:
        write = self.writes.setdefault(name, Write(0.0))
        _, write.committed = await publisher.publish(name)
        return write

    async def drain(self, writes: Sequence[Write], sockets: int, timeout: float) -> None:
        """Wait until every socket has every one of ``writes``, at most ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(len(w.arrivals) >= sockets for w in writes):
                return
            await asyncio.sleep(0.05)


def database_transactions() -> float:
    """PostgreSQL: transactions committed and rolled back in this database so far (every
    client's, as the statistics have them); NaN elsewhere."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return float("nan")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database "
            "WHERE datname = current_database()"
        )
        row = cursor.fetchone()
    return float(row[0]) if row else float("nan")


def workers_cpu(servers: Sequence[AsgiServer]) -> float:
    return sum(server.cpu() for server in servers)


@contextlib.contextmanager
def started_workers(count: int, env: dict[str, str]) -> Iterator[list[AsgiServer]]:
    servers: list[AsgiServer] = []
    try:
        for n in range(count):
            servers.append(AsgiServer.start("tests.asgi:application", env, f"scale-{count}-{n}"))
        yield servers
    finally:
        for server in servers:
            warnings = server.stop()
            if warnings:
                print(f"  (a worker logged {warnings} warning/error lines: {server.log})")


async def steady_writes(
    args: argparse.Namespace, hearing: Hearing, publisher: latency.Publisher, label: str
) -> list[Write]:
    """Writes about ``--rate`` a second (jittered) for ``--seconds``, without waiting for
    their frames."""
    writes: list[Write] = []
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        began = time.monotonic()
        writes.append(await hearing.write(publisher, f"{PREFIX}-{label}-{len(writes)}"))
        pause = harness.jittered(1 / args.rate) - (time.monotonic() - began)
        await asyncio.sleep(max(pause, 0.0))
    return writes


async def measure_workers_count(
    count: int,
    args: argparse.Namespace,
    database: Database,
    settings: dict[str, Any],
    members: Members,
    publisher: latency.Publisher,
) -> list[WorkersRepeat]:
    total = count * args.sockets
    floor_args = argparse.Namespace(
        transport=args.transport,
        samples=FLOOR_SAMPLES,
        floor_pace=0.005,
        polling_interval=args.polling_interval,
        redis_url=args.redis_url,
    )
    hearing = Hearing()
    connections = []
    with started_workers(count, database.env(settings)) as servers:
        try:
            urls = [server.url("/api/ws") for server in servers]
            opened = time.monotonic()
            connections = await harness.open_many(
                total,
                lambda i: harness.open_subscribed(
                    urls[i // args.sockets], members.tokens[i], members.slug, [harness.CHANNEL]
                ),
            )
            print(
                f"\n{count} worker(s), {args.sockets:,} sockets each: {total:,} open in "
                f"{time.monotonic() - opened:.1f} s",
                flush=True,
            )
            readers = Readers(connections, hearing.sink)
            readers.start()
            warm = [
                await hearing.write(publisher, f"{PREFIX}-c{count}-warm-{n}")
                for n in range(WARM_UP)
            ]
            await hearing.drain(warm, total, DRAIN)
            if short := sum(total - len(w.arrivals) for w in warm):
                print(f"  warm-up: {short:,} frames did not come", flush=True)
            results: list[WorkersRepeat] = []
            for index in range(args.repeat):
                floor_p50, floor_p99, _ = await latency.measure_floor(floor_args, members)
                idle = await idle_share(servers)
                transactions = await asyncio.to_thread(database_transactions)
                cpu = workers_cpu(servers)
                began = time.monotonic()
                duplicates = hearing.duplicates
                writes = await steady_writes(args, hearing, publisher, f"c{count}-r{index}")
                window = time.monotonic() - began
                busy = (workers_cpu(servers) - cpu) / window
                tps = (await asyncio.to_thread(database_transactions) - transactions) / window
                await hearing.drain(writes, total, DRAIN)
                result = WorkersRepeat(
                    sockets=total,
                    writes=writes,
                    duplicates=hearing.duplicates - duplicates,
                    floor_p50=floor_p50,
                    floor_p99=floor_p99,
                    idle_cpu=idle,
                    busy_cpu=busy,
                    window=window,
                    database_tps=tps,
                )
                results.append(result)
                print_workers_repeat(index, args, result)
            await readers.stop()
            return results
        finally:
            await harness.close_all(connections)


async def idle_share(servers: Sequence[AsgiServer], window: float = 1.0) -> float:
    """The workers' CPU over ``window`` seconds, all together, in share of one core."""
    before = workers_cpu(servers)
    await asyncio.sleep(window)
    return (workers_cpu(servers) - before) / window


def print_workers_repeat(index: int, args: argparse.Namespace, result: WorkersRepeat) -> None:
    ms = harness.millis
    every, last = result.every_frame(), result.last_frames()
    line = (
        f"  repeat {index + 1}/{args.repeat}: {len(result.writes)} writes; every frame p50 "
        f"{ms(p(every, 0.5))} p99 {ms(p(every, 0.99))}; last socket p50 {ms(p(last, 0.5))} "
        f"p99 {ms(p(last, 0.99))}; floor p50 {ms(result.floor_p50)}; workers' CPU "
        f"{result.idle_cpu:.1%} idle, {result.busy_cpu:.1%} writing"
    )
    if not math.isnan(result.database_tps):
        line += f"; database {result.database_tps:,.0f} transactions/s"
    if result.missing:
        line += f"; {result.missing:,} frames MISSING"
    if result.duplicates:
        line += f"; {result.duplicates:,} frames twice"
    print(line, flush=True)


def report_workers(args: argparse.Namespace, results: dict[int, list[WorkersRepeat]]) -> Any:
    ms = harness.millis
    print(
        f"\ncommit → frame with more workers, {args.transport} on {args.database}, "
        f"{args.sockets:,} sockets per worker, about {args.rate:g} writes/s (median "
        "[min - max] of the per-repeat figures; ratio = ours / floor of the same repeat)"
    )
    summary: dict[str, Any] = {}
    missing = 0
    for count, runs in results.items():
        floors = [r.floor_p50 for r in runs]
        print(
            f"\n  {count} worker(s), {runs[0].sockets:,} sockets, "
            f"{sum(len(r.writes) for r in runs)} writes in {len(runs)} repeats"
        )
        entry: dict[str, Any] = {}
        for label, pick in (
            ("every frame", WorkersRepeat.every_frame),
            ("last socket", WorkersRepeat.last_frames),
        ):
            p50s = [p(pick(r), 0.5) for r in runs]
            p99s = [p(pick(r), 0.99) for r in runs]
            ratio = Spread.of(harness.ratios(p50s, floors))
            print(
                f"    {label:<12} p50 {Spread.of(p50s).show(ms)}  ratio {ratio.show(harness.times)}"
            )
            print(f"    {'':<12} p99 {Spread.of(p99s).show(ms)}")
            entry[label] = {
                "p50": Spread.of(p50s).as_dict(),
                "p99": Spread.of(p99s).as_dict(),
                "p50_ratio": ratio.as_dict(),
            }
        floor = Spread.of(floors)
        what = {
            "pg_notify": "raw NOTIFY round trip p50",
            "redis": "raw SPUBLISH round trip p50",
        }.get(
            args.transport,
            f"half the polling interval ({ms(args.polling_interval / 2)}) + one poll =",
        )
        print(f"    floor: {what} {floor.show(ms)}")
        idle = Spread.of([r.idle_cpu for r in runs])
        busy = Spread.of([r.busy_cpu for r in runs])
        share = "{:.1%}".format
        print(
            f"    workers' CPU, all together: idle {idle.show(share)}, writing {busy.show(share)}"
        )
        per_frame = Spread.of([r.cpu_per_frame for r in runs])
        print(f"    workers' CPU per frame, idle share taken off: {per_frame.show(harness.micros)}")
        entry.update(
            floor=floor.as_dict(),
            idle_cpu=idle.as_dict(),
            busy_cpu=busy.as_dict(),
            cpu_per_frame=per_frame.as_dict(),
        )
        if args.database == "postgresql":
            tps = Spread.of([r.database_tps for r in runs])
            per_write = Spread.of([r.database_tps * r.window / len(r.writes) for r in runs])
            print(
                f"    database transactions/s while writing: {tps.show('{:,.0f}'.format)} "
                f"(about {per_write.show('{:,.1f}'.format)} per write)"
            )
            entry.update(database_tps=tps.as_dict(), database_per_write=per_write.as_dict())
        lost = sum(r.missing for r in runs)
        twice = sum(r.duplicates for r in runs)
        missing += lost
        print(f"    frames missing: {lost:,}" + (" (LOST)" if lost else "") + f", twice: {twice}")
        entry.update(missing=lost, duplicates=twice)
        summary[str(count)] = entry
    summary["lost"] = missing
    return summary


async def measure_workers(
    args: argparse.Namespace,
    counts: Sequence[int],
    database: Database,
    settings: dict[str, Any],
    members: Members,
) -> dict[int, list[WorkersRepeat]]:
    publisher_args = argparse.Namespace(transport=args.transport, database=args.database)
    publisher = await latency.Publisher.start(
        publisher_args, database.env(settings), members.workspace_id
    )
    results: dict[int, list[WorkersRepeat]] = {}
    try:
        for count in counts:
            results[count] = await measure_workers_count(
                count, args, database, settings, members, publisher
            )
    finally:
        await publisher.stop()
    return results


# --- Command line -------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    kinds = parser.add_subparsers(dest="kind", required=True)
    writers = kinds.add_parser("writers", help="publish throughput with N writing processes")
    writers.add_argument("--counts", default="1,2,4,8", help="writing processes, comma-separated")
    writers.add_argument("--writes", type=int, default=1000, help="writes per process and run")
    writers.add_argument(
        "--listen",
        action="store_true",
        help="a worker with one socket runs beside the writers; its frames are counted",
    )
    writers.add_argument(
        "--ablate-lock",
        action="store_true",
        help="also run the announced writes without the publish lock (an ablation)",
    )
    harness.add_writer_options(writers)
    workers = kinds.add_parser("workers", help="commit → frame latency with N workers")
    workers.add_argument("--counts", default="1,2,4", help="daphne workers, comma-separated")
    workers.add_argument("--sockets", type=int, default=1000, help="sockets per worker")
    workers.add_argument("--rate", type=float, default=2.0, help="writes per second")
    workers.add_argument("--seconds", type=float, default=30.0, help="seconds of writes")
    for kind in (writers, workers):
        kind.add_argument("--database", choices=["sqlite", "postgresql", "mariadb"], required=True)
        harness.add_transport_options(kind, default="table")
        kind.add_argument("--repeat", type=int, default=5, help="repeats per count")
        kind.add_argument(
            "--polling-interval", type=float, default=0.1, help="the table transport's interval"
        )
        harness.add_set_option(kind)
        kind.add_argument("--json", type=Path, help="also write the summary to this file")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    if args.kind == "writers" and args.worker is not None:
        harness.setup_django_from_env()
        harness.write_rows(args.worker, args.writes, args.workspace, args.tag)
        return
    if args.transport == "pg_notify" and args.database != "postgresql":
        raise SystemExit("the pg_notify transport needs --database postgresql")
    harness.start_transport_servers(args)
    counts = [int(part) for part in args.counts.split(",") if part.strip()]
    accounts = max(counts) * args.sockets if args.kind == "workers" else 1
    harness.raise_open_files(accounts * 2 + 1024)
    database = Database.pick(args.database, f"scale-{args.kind}")
    settings = latency.transport_settings(args)
    harness.migrate(database, settings)
    harness.setup_django(database, settings)
    started = time.monotonic()
    harness.header(f"scale benchmark: {args.kind} ({args.transport})", harness.server_version())
    if args.kind == "writers":
        print(
            f"settings: {args.writes:,} writes per process, counts {counts}, {args.repeat} "
            f"repeats" + (", a listening worker" if args.listen else ", nobody listening"),
            flush=True,
        )
    else:
        print(
            f"settings: {args.sockets:,} sockets per worker, counts {counts}, about "
            f"{args.rate:g} writes/s for {args.seconds:g} s per repeat, {args.repeat} repeats"
            + (
                f", polling interval {args.polling_interval:g} s"
                if args.transport == "table"
                else ""
            ),
            flush=True,
        )
    members = harness.make_members(PREFIX, accounts)
    summary: dict[str, Any] = {
        "kind": args.kind,
        "transport": args.transport,
        "database": harness.server_version(),
        "code": harness.code_version(),
        "settings": settings,
        "counts": counts,
    }
    try:
        if args.kind == "writers":
            writers = asyncio.run(measure_writers(args, counts, database, settings, members))
            summary["results"] = report_writers(args, writers)
        else:
            workers = asyncio.run(measure_workers(args, counts, database, settings, members))
            summary["results"] = report_workers(args, workers)
    finally:
        harness.drop_members(PREFIX)
    print(f"\nload average after: {harness.load_average()}")
    print(f"took {time.monotonic() - started:.0f} s")
    harness.write_json(args.json, summary)
    if database.vendor == "sqlite":
        for suffix in ("", "-wal", "-shm"):
            Path(f"{database.name}{suffix}").unlink(missing_ok=True)
    if summary["results"]["lost"]:
        sys.exit("events were lost: see above")


if __name__ == "__main__":
    main()
