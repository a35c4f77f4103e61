"""Benchmark commit → frame latency: a write in one process, its frame at N subscribed sockets.

Run from the project root::

    .venv/bin/python bench/latency.py --transport table --database sqlite
    .venv/bin/python bench/latency.py --transport pg_notify --database postgresql
    .venv/bin/python bench/latency.py --transport pg_notify --database postgresql --sockets 1,100
    .venv/bin/python bench/latency.py --transport pg_notify --database postgresql --audience one

For each socket count (``--sockets``, default 1, 100 and 1,000) a fresh daphne serves the test
application (``tests.asgi:application``) with the chosen transport, and the load generator
(this process, one asyncio loop) opens that many sockets, each its own account, authenticated
for one workspace and subscribed to the ``company`` channel (with ``--audience one``, only the
first socket is; the others subscribe to ``contact`` and hear nothing of the writes, so each
write is one frame whatever the count). A publishing subprocess (a copy of
this script) then creates ``Company`` rows in that workspace, one at a time, when told to. The
clock starts when the ``on_commit`` publish of the create returned (the subprocess wraps the
transport's ``publish`` to read ``time.time()`` right after it) and stops when a socket reads
the ``company.created`` frame. The next write waits until every socket has the previous frame
(or 10 s passed), plus a jittered pause (``--pace`` x [0.5, 1.5), plus up to one polling
interval for the table transport, so that writes land anywhere in the polling cycle).

Each repeat takes ``--samples`` writes (after 3 warm-up writes) and reports p50 and p99 over
every frame (each socket's arrival is one sample), and, with more than one socket, over the
first and the last socket of each write. The summary gives the median [min - max] of those
across ``--repeat`` repeats, beside the floor measured in the same repeat:

* pg_notify: the raw round trip, from sending ``SELECT pg_notify(...)`` on one psycopg
  connection (autocommit) to reading the notification on another that LISTENs, in this
  process, as many times as there are samples;
* table: half the polling interval plus the time of one poll (``MessageStore.poll``, the
  poller's queries, on the two channels a worker follows, reading one new row).

The SQLite database is a file of its own (``/tmp/realtime-bench-latency.sqlite3``), made anew
and migrated on each run; PostgreSQL uses the ``realtime`` database (migrated), where the
benchmark's workspace, accounts and rows (``bench-latency``...) are deleted at the end. The load
generator, the publisher, daphne and the database server all share the machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness
from harness import Arrivals, AsgiServer, Database, Members, Readers, Spread

SCRIPT = Path(__file__).resolve()
PREFIX = "bench-latency"
#: What the sockets that do not hear the writes subscribe to (``--audience one``).
OTHER_CHANNEL = "contact"
#: Writes before each socket count's timed repeats (they also prove every subscription).
WARM_UP = 3
#: Seconds a write waits for every socket's frame before the rest count as missing.
SAMPLE_WAIT = 10.0
READY = "ready"


# --- The publishing subprocess ---------------------------------------------------------------


def run_publisher(workspace_id: int, live_query: str | None = None) -> None:
    """``--publisher``: create a ``Company`` (``--live-query``: a ``Case``) per ``pub TAG``
    line read on stdin; answer ``ok TAG BEFORE AFTER``, the wall-clock times around the
    transport's publish call."""
    from realtime.transports import get_transport
    from tests.testapp.models import Case, Company, Job

    def create(tag: str) -> None:
        if live_query:
            model = Case if live_query == "case" else Job
            model.objects.create(workspace_id=workspace_id, title=tag, priority=9)
        else:
            Company.objects.create(workspace_id=workspace_id, name=tag)

    transport = get_transport()
    publish = transport.publish
    stamps: list[tuple[float, float]] = []

    def timed(messages: Any, **options: Any) -> None:
        before = time.time()
        publish(messages, **options)  # txn=, for a transport that keeps an outbox
        stamps.append((before, time.time()))

    # An instance attribute shadows the method for this process's transport only.
    setattr(transport, "publish", timed)  # noqa: B010
    create("warm-up")
    print(READY, flush=True)
    for line in sys.stdin:
        command, _, tag = line.strip().partition(" ")
        if command != "pub":
            break
        stamps.clear()
        create(tag)
        after_create = time.time()
        before, after = stamps[-1] if stamps else (after_create, after_create)
        print(f"ok {tag} {before:.6f} {after:.6f}", flush=True)


class Publisher:
    """The publishing subprocess, driven line by line from the event loop."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(
        cls, args: argparse.Namespace, env: dict[str, str], workspace_id: int
    ) -> Publisher:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(SCRIPT),
            "--transport",
            args.transport,
            "--database",
            args.database,
            "--publisher",
            str(workspace_id),
            *(["--live-query", args.live_query] if args.live_query else []),
            cwd=harness.ROOT,
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        publisher = cls(process)
        line = await publisher._line()
        if line != READY:
            raise RuntimeError(f"the publisher said {line!r}")
        return publisher

    async def _line(self) -> str:
        assert self.process.stdout is not None
        raw = await asyncio.wait_for(self.process.stdout.readline(), harness.WAIT)
        if not raw:
            raise RuntimeError(f"the publisher exited with {await self.process.wait()}")
        return raw.decode().strip()

    async def publish(self, tag: str) -> tuple[float, float]:
        """Have the publisher create a row named ``tag``; return its publish call's times."""
        assert self.process.stdin is not None
        self.process.stdin.write(f"pub {tag}\n".encode())
        await self.process.stdin.drain()
        answer, got, before, after = (await self._line()).split()
        if answer != "ok" or got != tag:
            raise RuntimeError(f"the publisher answered {answer} {got}")
        return float(before), float(after)

    async def stop(self) -> None:
        if self.process.returncode is None:
            assert self.process.stdin is not None
            with contextlib.suppress(Exception):
                self.process.stdin.write(b"quit\n")
                await self.process.stdin.drain()
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


# --- Measuring --------------------------------------------------------------------------------


@dataclass
class Sample:
    before: float
    committed: float
    arrivals: list[float]


@dataclass
class RepeatResult:
    """One repeat at one socket count: its samples and the floor measured right after."""

    #: The sockets that hear each write.
    sockets: int
    samples: list[Sample]
    floor_p50: float
    floor_p99: float
    floor_extra: dict[str, float] = field(default_factory=dict)

    def every_frame(self) -> list[float]:
        return [at - s.committed for s in self.samples for at in s.arrivals]

    def first_frames(self) -> list[float]:
        return [min(s.arrivals) - s.committed for s in self.samples if s.arrivals]

    def last_frames(self) -> list[float]:
        return [max(s.arrivals) - s.committed for s in self.samples if s.arrivals]

    def from_publish_start(self) -> list[float]:
        return [min(s.arrivals) - s.before for s in self.samples if s.arrivals]

    def publish_calls(self) -> list[float]:
        return [s.committed - s.before for s in self.samples]

    @property
    def missing(self) -> int:
        return sum(self.sockets - len(s.arrivals) for s in self.samples)


class Session:
    """The sockets of one count, their readers, and the publisher that writes for them."""

    def __init__(
        self, readers: Readers, publisher: Publisher, count: int, field: str = "name"
    ) -> None:
        self.readers = readers
        self.publisher = publisher
        self.count = count
        #: The field of the row written whose value tags the frame (``title``: a Case's).
        self.field = field
        self.serial = 0

    async def sample(self, label: str) -> Sample:
        self.serial += 1
        tag = f"{label}-{self.serial}"
        marker = f'"{self.field}":"{tag}"'
        arrivals = Arrivals(self.count)

        def sink(index: int, frame: str | bytes, arrived: float) -> None:
            if isinstance(frame, str) and marker in frame:
                arrivals.add(arrived)

        self.readers.sink = sink
        before, committed = await self.publisher.publish(tag)
        await arrivals.wait(SAMPLE_WAIT)
        return Sample(before, committed, list(arrivals.times))


#: The live query each socket asks with ``--live-query``: the newest open cases, 50 of them
#: (each write enters every window at its top, pushing its last row out).
LIVE_QUERY = {"where": {"status": "open"}, "order_by": ["-id"], "limit": 50}


async def open_queried(url: str, token: str, slug: str, hearing: bool, model: str) -> Any:
    """Connect and authenticate for ``slug``; a socket that hears the writes asks the live
    query and has its rows before it counts as open (the others ask one of another status)."""
    connection = await harness.open_realtime(url, token, slug, [])
    where = LIVE_QUERY["where"] if hearing else {"status": "never"}
    await connection.send(
        json.dumps(
            {
                "type": "query",
                "data": {**LIVE_QUERY, "model": model, "id": "bench", "where": where},
            }
        )
    )
    async with asyncio.timeout(harness.WAIT):
        while json.loads(await connection.recv()).get("type") != "query.rows":
            pass
    return connection


def pause(args: argparse.Namespace) -> float:
    extra = random.uniform(0, args.polling_interval) if args.transport == "table" else 0.0
    return harness.jittered(args.pace) + extra


def table_floor(members: Members, iterations: int = 300) -> tuple[float, float]:
    """Median time of one poll (``MessageStore.poll``) for the channels a worker follows,
    reading one new row: from just below it, and, for reference, over the whole settled
    window (the rows of the last commit-grace seconds, as polls read it in steady use)."""
    import datetime

    from django.db import connections

    from realtime.conf import conf
    from realtime.fields import naive_utc_now
    from realtime.messages import base_channel, scope_channel
    from realtime.models import ChannelMessage
    from realtime.transports.table_store import MessageStore, channel_hash, encode_channel

    store = MessageStore()
    hashes = {
        channel_hash(encode_channel(name))
        for name in (base_channel(), scope_channel(members.workspace_id))
    }
    try:
        newest = store.max_id()
        settled_before = naive_utc_now() - datetime.timedelta(seconds=conf.COMMIT_GRACE)
        rows = ChannelMessage.objects.using(store.using)
        settled = rows.filter(created_at__lt=settled_before).order_by("-id").first()
        window_floor = settled.pk if settled is not None else 0
        window = set(rows.filter(id__gt=window_floor).values_list("id", flat=True))
        results = []
        for floor, known in ((newest - 1, set()), (window_floor, window - {newest})):
            for _ in range(10):
                store.poll(hashes, floor, conf.COMMIT_GRACE, known)
            durations = []
            for _ in range(iterations):
                start = time.perf_counter()
                store.poll(hashes, floor, conf.COMMIT_GRACE, known)
                durations.append(time.perf_counter() - start)
            results.append(statistics.median(durations))
    finally:
        connections.close_all()
    return results[0], results[1]


#: The transports whose floor is a raw round trip of their server (p50 and p99), by what it is.
RAW_FLOORS = {"pg_notify": "raw NOTIFY round trip", "redis": "raw SPUBLISH round trip"}


async def measure_floor(
    args: argparse.Namespace, members: Members
) -> tuple[float, float, dict[str, float]]:
    if args.transport == "pg_notify":
        trips = await asyncio.to_thread(
            harness.notify_round_trips, harness.conninfo(), args.samples, args.floor_pace
        )
        return harness.percentile(trips, 0.5), harness.percentile(trips, 0.99), {}
    if args.transport == "redis":
        trips = await asyncio.to_thread(
            harness.spublish_round_trips, args.redis_url, args.samples, args.floor_pace
        )
        return harness.percentile(trips, 0.5), harness.percentile(trips, 0.99), {}
    one_row, window = await asyncio.to_thread(table_floor, members)
    floor = args.polling_interval / 2 + one_row
    return floor, math.nan, {"poll_query": one_row, "poll_query_window": window}


async def measure_count(
    count: int,
    args: argparse.Namespace,
    database: Database,
    settings: dict[str, Any],
    members: Members,
    publisher: Publisher,
) -> list[RepeatResult]:
    server = AsgiServer.start("tests.asgi:application", database.env(settings), f"latency-{count}")
    url = server.url("/api/ws")
    hearing = count if args.audience == "all" else 1
    connections = []
    try:
        started = time.monotonic()
        if args.live_query:
            connections = await harness.open_many(
                count,
                lambda index: open_queried(
                    url, members.tokens[index], members.slug, index < hearing, args.live_query
                ),
            )
        else:
            connections = await harness.open_many(
                count,
                lambda index: harness.open_realtime(
                    url,
                    members.tokens[index],
                    members.slug,
                    [harness.CHANNEL if index < hearing else OTHER_CHANNEL],
                ),
            )
        print(
            f"\n{count:,} sockets open in {time.monotonic() - started:.1f} s "
            f"(server RSS {harness.kib(server.rss())}); {hearing:,} of them hear each write",
            flush=True,
        )
        readers = Readers(connections)
        readers.start()
        session = Session(readers, publisher, hearing, "title" if args.live_query else "name")
        for _ in range(WARM_UP):
            warm = await session.sample(f"warm-{count}")
            if len(warm.arrivals) < hearing:
                print(f"  warm-up: {len(warm.arrivals)} of {hearing} sockets had the frame")
            await asyncio.sleep(pause(args))
        results: list[RepeatResult] = []
        for index in range(args.repeat):
            samples: list[Sample] = []
            for _ in range(args.samples):
                samples.append(await session.sample(f"n{count}-r{index}"))
                await asyncio.sleep(pause(args))
            floor_p50, floor_p99, extra = await measure_floor(args, members)
            result = RepeatResult(hearing, samples, floor_p50, floor_p99, extra)
            results.append(result)
            print_repeat(index, args, result)
        await readers.stop()
        return results
    finally:
        await harness.close_all(connections)
        warnings = server.stop()
        if warnings:
            print(f"  (daphne logged {warnings} warning/error lines: {server.log})")


def print_repeat(index: int, args: argparse.Namespace, result: RepeatResult) -> None:
    frames = result.every_frame()
    line = (
        f"  repeat {index + 1}/{args.repeat}: every frame p50 {harness.millis(_p(frames, 0.5))}"
        f" p99 {harness.millis(_p(frames, 0.99))}"
    )
    if result.sockets > 1:
        line += (
            f"; first socket p50 {harness.millis(_p(result.first_frames(), 0.5))}"
            f"; last socket p50 {harness.millis(_p(result.last_frames(), 0.5))}"
            f" p99 {harness.millis(_p(result.last_frames(), 0.99))}"
        )
    if args.transport in RAW_FLOORS:
        line += (
            f"; floor p50 {harness.millis(result.floor_p50)} p99 {harness.millis(result.floor_p99)}"
        )
    else:
        line += (
            f"; floor {harness.millis(result.floor_p50)}"
            f" (one poll {harness.millis(result.floor_extra['poll_query'])})"
        )
    if result.missing:
        line += f"; {result.missing} frames missing"
    print(line, flush=True)


def _p(values: Sequence[float], fraction: float) -> float:
    return harness.percentile(values, fraction)


# --- Report -------------------------------------------------------------------------------------


def spread_of(
    results: Sequence[RepeatResult], pick: Callable[[RepeatResult], Sequence[float]], q: float
) -> tuple[Spread, list[float]]:
    values = [_p(pick(r), q) for r in results]
    return Spread.of(values), values


def report(args: argparse.Namespace, results: dict[int, list[RepeatResult]]) -> dict[str, Any]:
    ms = harness.millis
    print(
        f"\ncommit → frame latency, {args.transport} transport (median [min - max] of the "
        "per-repeat percentiles; ratio = ours / floor of the same repeat)"
    )
    summary: dict[str, Any] = {}
    for count, runs in results.items():
        samples = sum(len(r.samples) for r in runs)
        hearing = runs[0].sockets
        print(
            f"\n  {count:,} socket(s), {hearing:,} hearing each write: {len(runs)} repeats, "
            f"{samples} writes in all"
        )
        entry: dict[str, Any] = {}
        floor50 = [r.floor_p50 for r in runs]
        floor99 = [r.floor_p99 for r in runs]
        rows: list[tuple[str, Callable[[RepeatResult], Sequence[float]]]] = [
            ("every frame", RepeatResult.every_frame)
        ]
        if hearing > 1:
            rows += [
                ("first socket", RepeatResult.first_frames),
                ("last socket", RepeatResult.last_frames),
            ]
        for label, pick in rows:
            p50, p50s = spread_of(runs, pick, 0.5)
            p99, p99s = spread_of(runs, pick, 0.99)
            ratio50 = Spread.of(harness.ratios(p50s, floor50))
            print(f"    {label:<12} p50 {p50.show(ms)}  ratio {ratio50.show(harness.times)}")
            line = f"    {'':<12} p99 {p99.show(ms)}"
            if args.transport in RAW_FLOORS:
                ratio99 = Spread.of(harness.ratios(p99s, floor99))
                line += f"  ratio {ratio99.show(harness.times)}"
                entry[f"{label} p99 ratio"] = ratio99.as_dict()
            print(line)
            entry[label] = {"p50": p50.as_dict(), "p99": p99.as_dict()}
            entry[f"{label} p50 ratio"] = ratio50.as_dict()
        if args.transport in RAW_FLOORS:
            print(f"    floor: {RAW_FLOORS[args.transport]} p50 {Spread.of(floor50).show(ms)}")
            print(f"    {'':<12}                    p99 {Spread.of(floor99).show(ms)}")
            entry["floor"] = {
                "p50": Spread.of(floor50).as_dict(),
                "p99": Spread.of(floor99).as_dict(),
            }
        else:
            queries = Spread.of([r.floor_extra["poll_query"] for r in runs])
            window = Spread.of([r.floor_extra["poll_query_window"] for r in runs])
            print(
                f"    floor: {Spread.of(floor50).show(ms)} = half the polling interval "
                f"({ms(args.polling_interval / 2)}) + one poll {queries.show(ms)}"
            )
            print(f"    (a poll reading the whole commit-grace window: {window.show(ms)})")
            entry["floor"] = Spread.of(floor50).as_dict()
            entry["poll_query"] = queries.as_dict()
            entry["poll_query_window"] = window.as_dict()
        calls = Spread.of([statistics.median(r.publish_calls()) for r in runs])
        from_start = Spread.of([_p(r.from_publish_start(), 0.5) for r in runs])
        print(f"    publish call in the publisher, median: {calls.show(ms)}")
        print(f"    first frame from the start of the publish call, p50: {from_start.show(ms)}")
        frames = [value for r in runs for value in r.every_frame()]
        missing = sum(r.missing for r in runs)
        negative = sum(1 for value in frames if value < 0)
        print(f"    pooled: max {ms(max(frames))}, {missing} frames missing, {negative} negative")
        entry.update(
            publish_call=calls.as_dict(),
            first_frame_from_publish_start_p50=from_start.as_dict(),
            pooled_max=max(frames),
            missing=missing,
            negative=negative,
            writes=samples,
        )
        summary[str(count)] = entry
    return summary


# --- Main -----------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    harness.add_transport_options(parser)
    parser.add_argument("--database", choices=["sqlite", "postgresql", "mariadb"], required=True)
    parser.add_argument("--sockets", default="1,100,1000", help="comma-separated socket counts")
    parser.add_argument("--samples", type=int, default=200, help="writes per repeat")
    parser.add_argument(
        "--audience",
        choices=["all", "one"],
        default="all",
        help="which sockets subscribe to the written model: all (each write is one frame per "
        "socket), or one (the others subscribe to another model)",
    )
    parser.add_argument("--repeat", type=int, default=5, help="repeats per socket count")
    parser.add_argument(
        "--pace", type=float, default=0.03, help="mean seconds between writes (jittered)"
    )
    parser.add_argument(
        "--polling-interval", type=float, default=0.1, help="the table transport's interval"
    )
    parser.add_argument(
        "--floor-pace", type=float, default=0.01, help="mean seconds between raw NOTIFYs"
    )
    harness.add_set_option(parser)
    parser.add_argument("--json", type=Path, help="also write the summary to this file")
    parser.add_argument(
        "--live-query",
        choices=["case", "job"],
        help="each socket asks a live query of this model instead of subscribing (case: "
        "guarded, job: unguarded); the publisher creates its rows, and the clock stops at "
        "each socket's query.diff",
    )
    parser.add_argument("--publisher", type=int, metavar="WORKSPACE", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def transport_settings(args: argparse.Namespace) -> dict[str, Any]:
    settings: dict[str, Any] = {"REALTIME_TRANSPORT": args.transport}
    if args.transport == "table":
        settings["REALTIME_POLLING_INTERVAL"] = args.polling_interval
    return {**settings, **harness.redis_settings(args), **harness.parse_settings(args.set)}


async def run(
    args: argparse.Namespace, counts: list[int], database: Database, members: Members
) -> dict[int, list[RepeatResult]]:
    settings = transport_settings(args)
    publisher = await Publisher.start(args, database.env(settings), members.workspace_id)
    results: dict[int, list[RepeatResult]] = {}
    try:
        for count in counts:
            results[count] = await measure_count(
                count, args, database, settings, members, publisher
            )
    finally:
        await publisher.stop()
    return results


def main() -> None:
    args = parse_args()
    if args.publisher is not None:
        # A publishing subprocess: the environment already names the database and settings.
        settings = json.loads(os.environ["REALTIME_TEST_SETTINGS"])
        harness.setup_django(Database(args.database, _database_name()), settings)
        run_publisher(args.publisher, args.live_query)
        return
    if args.transport == "pg_notify" and args.database != "postgresql":
        raise SystemExit("the pg_notify transport needs --database postgresql")
    harness.start_transport_servers(args)
    counts = [int(part) for part in args.sockets.split(",") if part.strip()]
    harness.raise_open_files(max(counts) * 2 + 1024)
    database = Database.pick(args.database, "latency")
    settings = transport_settings(args)
    harness.migrate(database, settings)
    harness.setup_django(database, settings)
    started = time.monotonic()
    harness.header(
        f"commit → frame latency benchmark ({args.transport} transport)", harness.server_version()
    )
    print(
        f"settings: {args.samples} writes per repeat, {args.repeat} repeats per count, "
        f"{args.pace * 1000:g} ms mean pause (±50 %)"
        + (
            f" + up to one polling interval ({args.polling_interval:g} s)"
            if args.transport == "table"
            else ""
        ),
        flush=True,
    )
    members = harness.make_members(PREFIX, max(counts))
    try:
        results = asyncio.run(run(args, counts, database, members))
        summary = {
            "transport": args.transport,
            "database": harness.server_version(),
            "code": harness.code_version(),
            "settings": settings,
            "audience": args.audience,
            "live_query": args.live_query,
            "results": report(args, results),
        }
    finally:
        if database.vendor != "sqlite":
            harness.drop_members(PREFIX)
    print(f"\nload average after: {harness.load_average()}")
    print(f"took {time.monotonic() - started:.0f} s")
    harness.write_json(args.json, summary)
    if database.vendor == "sqlite":
        for suffix in ("", "-wal", "-shm"):
            Path(f"{database.name}{suffix}").unlink(missing_ok=True)


def _database_name() -> str:
    return os.environ["REALTIME_TEST_DATABASE_NAME"]


if __name__ == "__main__":
    main()
