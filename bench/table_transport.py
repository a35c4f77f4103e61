"""Benchmark the table transport: publish throughput and publish → callback latency.

Run from the project root, once per database::

    .venv/bin/python bench/table_transport.py --database sqlite
    .venv/bin/python bench/table_transport.py --database postgresql
    .venv/bin/python bench/table_transport.py --database mariadb

The script uses the test settings (``tests.settings``), runs ``migrate`` (the ``realtime`` app)
itself, and deletes the rows of its own two channels (``bench.throughput`` and
``bench.latency``) from ``firm_channel_messages`` before every measurement and at the end; other
rows are left alone. SQLite uses its own file, ``/tmp/realtime-bench.sqlite3``, made anew on
each run; PostgreSQL and MariaDB use the ``realtime`` database. Run it on a quiet machine:
anything else busy on the cores or the database server shows in the figures (the load average
is printed before and after).

Every figure is printed beside a floor measured in the same run on the same database:

* throughput: a bare loop of single-row INSERTs, each committed on its own (autocommit),
  through the same Django connection, with no transport in between;
* latency: half the polling interval plus the time of one poll query
  (``MessageStore.poll`` for one channel, with a floor just below the highest id).

Each measurement is repeated ``--repeat`` times; the median, minimum and maximum across the
repeats are printed. The publishing subprocesses (the load generator) are copies of this script
started with ``--publish-worker``; they share the machine's cores with the process measured and
with the database server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness import Spread, millis, percentile, times, watch_logs

if TYPE_CHECKING:
    from realtime.positions import StreamPos
    from realtime.transports.table import TableTransport

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).resolve()
# A file of its own, apart from the test suite's; the script is the only one writing it.
SQLITE_FILE = "/tmp/realtime-bench.sqlite3"  # noqa: S108
TABLE = "firm_channel_messages"
THROUGHPUT_CHANNEL = "bench.throughput"
LATENCY_CHANNEL = "bench.latency"
# A payload of the size of a small JSON event.
PAYLOAD = b'{"event": "bench"}'.ljust(200, b" ")
WARM_UP = 20
READY = "ready"
GO = "go"


# --- Small helpers -------------------------------------------------------------------------


def per_second(value: float) -> str:
    return f"{value:,.0f}"


# --- Django ----------------------------------------------------------------------------------


def setup_django(database: str) -> None:
    """Point the test settings at ``database`` (before setup) and set Django up."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    os.environ["REALTIME_TEST_DATABASE"] = database
    os.environ["REALTIME_TEST_DATABASE_NAME"] = SQLITE_FILE if database == "sqlite" else "realtime"
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def fresh_sqlite_file() -> None:
    """Start SQLite from an empty file: it is this script's own, and never holds anything else."""
    for suffix in ("", "-wal", "-shm"):
        Path(SQLITE_FILE + suffix).unlink(missing_ok=True)


def migrate() -> None:
    """Create ``firm_channel_messages``: migrate the ``realtime`` app only, all it needs."""
    from django.core.management import call_command

    call_command("migrate", "realtime", database="default", interactive=False, verbosity=0)


def clear_table() -> None:
    """Delete this benchmark's rows (its two channels); leave any other row alone."""
    from django.db import connection

    from realtime.transports.table_store import channel_hash

    channels = [THROUGHPUT_CHANNEL.encode(), LATENCY_CHANNEL.encode()]
    with connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {TABLE} WHERE channel_hash IN (%s, %s) AND channel IN (%s, %s)",
            [*(channel_hash(c) for c in channels), *channels],
        )


def server_version() -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("SELECT sqlite_version()")
        else:
            cursor.execute("SELECT version()")
        row = cursor.fetchone()
    version = str(row[0]) if row else "?"
    return f"{connection.vendor} {version.split(' on ')[0]}"


def code_version() -> str:
    """The commit measured, flagged when the transport's files differ from it."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "realtime/transports"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown"
    return f"{commit or 'unknown'}{' (realtime/transports modified)' if dirty else ''}"


def load_average() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.2f} (1 min), {five:.2f} (5 min)"


def make_transport(**options: Any) -> TableTransport:
    from realtime.transports.table import TableTransport

    return TableTransport(**options)


# --- Publishing loops (in this process and in workers) -------------------------------------


@dataclass
class Span:
    """A publishing run: wall-clock start and end (``time.time()``) and messages sent."""

    start: float
    end: float
    count: int

    @property
    def rate(self) -> float:
        return self.count / (self.end - self.start)


def publish_loop(transport: TableTransport, count: int) -> Span:
    """Publish ``count`` single-message calls; the run ends once the trims it caused ran."""
    message = [(THROUGHPUT_CHANNEL, PAYLOAD)]
    start = time.time()
    for _ in range(count):
        transport.publish(message)
    transport.wait_for_trims()
    return Span(start, time.time(), count)


def raw_insert_loop(count: int, *, atomic: bool = False) -> Span:
    """The throughput floor: single-row INSERTs, each committed on its own, raw cursor.

    With ``atomic``, each INSERT runs in ``transaction.atomic()`` instead of autocommit
    (BEGIN, INSERT, COMMIT: two more round trips), for reference.
    """
    from django.db import connection, transaction

    from realtime.transports.table_store import channel_hash

    channel = THROUGHPUT_CHANNEL.encode()
    created_at: Any = datetime_param()
    params = [channel, PAYLOAD, channel_hash(channel), created_at]
    sql = (
        f"INSERT INTO {TABLE} (channel, payload, channel_hash, created_at) VALUES (%s, %s, %s, %s)"
    )
    assert connection.get_autocommit()
    start = time.time()
    with connection.cursor() as cursor:
        for _ in range(count):
            if atomic:
                with transaction.atomic():
                    cursor.execute(sql, params)
            else:
                cursor.execute(sql, params)
    return Span(start, time.time(), count)


def datetime_param() -> Any:
    """The current naive UTC time as this database's driver takes it (as the store writes)."""
    from django.db import connection

    from realtime.fields import naive_utc_now

    now = naive_utc_now()
    return now if connection.vendor == "postgresql" else now.strftime("%Y-%m-%d %H:%M:%S.%f")


def warm_up(mode: str) -> None:
    """Open the connection and run a few statements before any clock starts."""
    if mode == "raw":
        raw_insert_loop(WARM_UP)
    else:
        transport = make_transport()
        publish_loop(transport, WARM_UP)
        transport.close()


def run_publish_worker(args: argparse.Namespace) -> None:
    """``--publish-worker N``: wait for the go line on stdin, publish, report JSON on stdout."""
    counter = watch_logs()
    if args.worker_pace > 0:
        from django.db import connection

        connection.ensure_connection()
    else:
        warm_up(args.mode)
    print(READY, flush=True)
    if sys.stdin.readline().strip() != GO:
        raise SystemExit("publish worker: no go line")
    report: dict[str, Any]
    if args.worker_pace > 0:
        report = paced_publish(args.publish_worker, args.worker_pace)
    elif args.mode == "raw":
        report = asdict(raw_insert_loop(args.publish_worker))
    else:
        transport = make_transport()
        report = asdict(publish_loop(transport, args.publish_worker))
        transport.close()
    report["log_warnings"] = counter.count
    report["log_first"] = counter.first
    print(json.dumps(report), flush=True)


def paced_publish(count: int, pace: float) -> dict[str, Any]:
    """Publish ``count`` messages on the latency channel, about one every ``pace`` seconds.

    Each sleep is drawn from ``pace x [0.5, 1.5)`` so publishes drift against the poller. The
    commit time of message ``i`` is ``time.time()`` right after ``publish()`` returned; it
    cannot travel in the payload itself, so it is reported on stdout at the end.
    """
    transport = make_transport()
    sent: list[float] = []
    committed: list[float] = []
    for i in range(count):
        before = time.time()
        transport.publish([(LATENCY_CHANNEL, json.dumps({"i": i, "sent": before}).encode())])
        committed.append(time.time())
        sent.append(before)
        time.sleep(pace * random.uniform(0.5, 1.5))
    transport.wait_for_trims()
    transport.close()
    return {"sent": sent, "committed": committed}


class Worker:
    """A publishing copy of this script, driven through its stdin and stdout."""

    def __init__(self, database: str, count: int, *options: str) -> None:
        command = [sys.executable, str(SCRIPT), "--database", database]
        command += ["--publish-worker", str(count), *options]
        self.process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=dict(os.environ),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def _line(self) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.process.wait()
            raise RuntimeError(f"publish worker exited with {self.process.returncode}")
        return line.strip()

    def wait_ready(self) -> None:
        if (line := self._line()) != READY:
            raise RuntimeError(f"publish worker said {line!r} instead of {READY!r}")

    def go(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(GO + "\n")
        self.process.stdin.flush()

    def report(self) -> dict[str, Any]:
        report: dict[str, Any] = json.loads(self._line())
        self.process.wait()
        return report


# --- Throughput -------------------------------------------------------------------------------


@dataclass
class Throughput:
    one: list[float] = field(default_factory=list)
    one_floor: list[float] = field(default_factory=list)
    two: list[float] = field(default_factory=list)
    two_floor: list[float] = field(default_factory=list)
    worker_warnings: int = 0
    # References, one process: the floor's INSERT in atomic(), and publish() without trims.
    one_atomic: list[float] = field(default_factory=list)
    one_no_trim: list[float] = field(default_factory=list)


def one_process(mode: str, count: int) -> float:
    clear_table()
    if mode in ("raw", "raw-atomic"):
        return raw_insert_loop(count, atomic=mode == "raw-atomic").rate
    transport = make_transport(auto_trim=mode == "transport")
    try:
        return publish_loop(transport, count).rate
    finally:
        transport.close()


def two_processes(database: str, mode: str, count: int) -> tuple[float, int]:
    """Publish ``count`` messages here and ``count`` in a worker, started together."""
    clear_table()
    transport = make_transport(auto_trim=True) if mode == "transport" else None
    worker = Worker(database, count, "--mode", mode)
    try:
        worker.wait_ready()
        worker.go()
        mine = raw_insert_loop(count) if transport is None else publish_loop(transport, count)
        report = worker.report()
    finally:
        if transport is not None:
            transport.close()
        if worker.process.poll() is None:
            worker.process.kill()
            worker.process.wait()
    start = min(mine.start, float(report["start"]))
    end = max(mine.end, float(report["end"]))
    return (mine.count + int(report["count"])) / (end - start), int(report["log_warnings"])


def measure_throughput(database: str, count: int, repeat: int) -> Throughput:
    result = Throughput()
    warm_up("transport")
    warm_up("raw")
    for index in range(repeat):
        result.one.append(one_process("transport", count))
        result.one_floor.append(one_process("raw", count))
        result.one_atomic.append(one_process("raw-atomic", count))
        result.one_no_trim.append(one_process("transport-no-trim", count))
        rate, warnings = two_processes(database, "transport", count)
        result.two.append(rate)
        result.worker_warnings += warnings
        rate, warnings = two_processes(database, "raw", count)
        result.two_floor.append(rate)
        result.worker_warnings += warnings
        print(
            f"  repeat {index + 1}/{repeat}: 1 process {result.one[-1]:,.0f} msg/s "
            f"(floor {result.one_floor[-1]:,.0f}), 2 processes {result.two[-1]:,.0f} msg/s "
            f"(floor {result.two_floor[-1]:,.0f})",
            flush=True,
        )
    return result


# --- Latency ----------------------------------------------------------------------------------


@dataclass
class LatencyRun:
    """One repeat at one polling interval."""

    samples: list[float]
    missing: int
    duplicates: int
    publish_call: float
    poll_query: float
    poll_query_trailing: float
    worker_warnings: int

    @property
    def p50(self) -> float:
        return percentile(self.samples, 0.5)

    @property
    def p99(self) -> float:
        return percentile(self.samples, 0.99)


async def listen_once(
    database: str, interval: float, count: int, pace: float
) -> tuple[dict[int, float], dict[str, Any]]:
    """Follow the latency channel while a worker publishes; return receive times and report."""
    transport = make_transport(polling_interval=interval)
    received: dict[int, float] = {}
    all_in = asyncio.Event()

    duplicates = 0

    def on_message(channel: str, payload: bytes, position: StreamPos | None) -> None:
        nonlocal duplicates
        now = time.time()
        index = int(json.loads(payload)["i"])
        if index in received:
            duplicates += 1
            return
        received[index] = now
        if len(received) >= count:
            all_in.set()

    transport.add_listener(on_message)
    worker = Worker(database, count, "--worker-pace", str(pace))
    try:
        await asyncio.to_thread(worker.wait_ready)
        await transport.follow(LATENCY_CHANNEL)
        worker.go()
        report = await asyncio.to_thread(worker.report)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_in.wait(), timeout=max(5.0, 20 * interval))
    finally:
        await transport.stop()
        transport.close()
        if worker.process.poll() is None:
            worker.process.kill()
            worker.process.wait()
    report["duplicates"] = duplicates
    return received, report


def time_poll_query(floor_below_max: int, iterations: int = 300) -> float:
    """Median time of one poll (``MessageStore.poll``) for the latency channel,
    ``floor_below_max`` rows below the highest id, on this thread's connection."""
    from realtime.transports.table_store import MessageStore, channel_hash, encode_channel

    store = MessageStore()
    hashes = {channel_hash(encode_channel(LATENCY_CHANNEL))}
    floor = max(store.max_id() - floor_below_max, 0)
    for _ in range(10):
        store.poll(hashes, floor, 0.0, set())
    durations = []
    for _ in range(iterations):
        start = time.perf_counter()
        store.poll(hashes, floor, 0.0, set())
        durations.append(time.perf_counter() - start)
    return statistics.median(durations)


def latency_once(database: str, interval: float, count: int, pace: float) -> LatencyRun:
    from realtime.conf import conf

    clear_table()
    received, report = asyncio.run(listen_once(database, interval, count, pace))
    committed: list[float] = report["committed"]
    sent: list[float] = report["sent"]
    samples = [received[i] - at for i, at in enumerate(committed) if i in received]
    # What a poll really reads: every row newer than the commit grace, not just the new ones.
    trailing = min(count, round(conf.COMMIT_GRACE / pace))
    return LatencyRun(
        samples=samples,
        missing=len(committed) - len(samples),
        duplicates=int(report["duplicates"]),
        publish_call=statistics.median(c - s for c, s in zip(committed, sent, strict=True)),
        poll_query=time_poll_query(1),
        poll_query_trailing=time_poll_query(trailing),
        worker_warnings=int(report["log_warnings"]),
    )


def measure_latency(
    database: str, intervals: Sequence[float], count: int, pace: float, repeat: int
) -> dict[float, list[LatencyRun]]:
    results: dict[float, list[LatencyRun]] = {}
    for interval in intervals:
        runs = results.setdefault(interval, [])
        for index in range(repeat):
            run = latency_once(database, interval, count, pace)
            runs.append(run)
            negative = sum(1 for s in run.samples if s < 0)
            print(
                f"  interval {interval:g} s, repeat {index + 1}/{repeat}: "
                f"p50 {millis(run.p50)}, p99 {millis(run.p99)}, max {millis(max(run.samples))}, "
                f"{len(run.samples)} samples, {run.missing} missing, {run.duplicates} duplicated, "
                f"{negative} negative; "
                f"poll query {millis(run.poll_query)} "
                f"(reading the commit-grace window: {millis(run.poll_query_trailing)})",
                flush=True,
            )
    return results


# --- Report -----------------------------------------------------------------------------------


def ratios(ours: Sequence[float], floors: Sequence[float]) -> list[float]:
    return [o / f for o, f in zip(ours, floors, strict=True)]


def report_throughput(result: Throughput) -> dict[str, Any]:
    print("\npublish throughput (msg/s, median [min-max]; ratio = ours / floor, per repeat)")
    rows = [
        ("1 process", result.one, result.one_floor),
        ("2 processes, combined", result.two, result.two_floor),
    ]
    summary: dict[str, Any] = {}
    for label, ours, floors in rows:
        mine, floor, ratio = Spread.of(ours), Spread.of(floors), Spread.of(ratios(ours, floors))
        print(f"  {label:<22} {mine.show(per_second)}")
        print(f"  {'floor':>22} {floor.show(per_second)}")
        print(f"  {'ratio':>22} {ratio.show(times)}")
        summary[label] = {"ours": asdict(mine), "floor": asdict(floor), "ratio": asdict(ratio)}
    print("  for reference, 1 process, as a fraction of the same repeat's floor:")
    references = [
        ("bare INSERT in atomic()", result.one_atomic),
        ("publish(), auto_trim off", result.one_no_trim),
    ]
    for label, values in references:
        spread, ratio = Spread.of(values), Spread.of(ratios(values, result.one_floor))
        print(f"  {label:>26} {spread.show(per_second)}, ratio {ratio.show(times)}")
        summary[label] = {"ours": asdict(spread), "ratio": asdict(ratio)}
    return summary


def report_latency(results: dict[float, list[LatencyRun]]) -> dict[str, Any]:
    print(
        "\npublish → callback latency (commit in the publisher → listener callback; "
        "median [min-max] of the per-repeat percentiles)"
    )
    summary: dict[str, Any] = {}
    for interval, runs in results.items():
        p50 = Spread.of([r.p50 for r in runs])
        p99 = Spread.of([r.p99 for r in runs])
        queries = [r.poll_query for r in runs]
        floors = [interval / 2 + q for q in queries]
        floor = Spread.of(floors)
        ratio = Spread.of(ratios([r.p50 for r in runs], floors))
        pooled = [s for r in runs for s in r.samples]
        print(f"  polling interval {interval:g} s ({len(pooled)} samples in all)")
        print(f"    p50   {p50.show(millis)}")
        print(f"    p99   {p99.show(millis)}")
        print(
            f"    floor {floor.show(millis)}  (= {interval * 500:g} ms + one poll query "
            f"{Spread.of(queries).show(millis)})"
        )
        print(f"    ratio p50 / floor {ratio.show(times)}")
        trailing = Spread.of([r.poll_query_trailing for r in runs])
        publish_call = Spread.of([r.publish_call for r in runs])
        print(f"    poll query over the commit-grace window: {trailing.show(millis)}")
        print(f"    publish() call in the publisher: {publish_call.show(millis)}")
        missing = sum(r.missing for r in runs)
        duplicates = sum(r.duplicates for r in runs)
        negative = sum(1 for s in pooled if s < 0)
        warnings = sum(r.worker_warnings for r in runs)
        print(
            f"    missing {missing}, duplicated {duplicates}, negative {negative} "
            f"(pooled min {millis(min(pooled))}), pooled max {millis(max(pooled))}"
        )
        print(f"    realtime log warnings/errors in the publishing workers: {warnings}")
        summary[f"{interval:g}"] = {
            "p50": asdict(p50),
            "p99": asdict(p99),
            "floor": asdict(floor),
            "poll_query": asdict(Spread.of(queries)),
            "ratio": asdict(ratio),
            "poll_query_commit_grace_window": asdict(trailing),
            "publish_call": asdict(publish_call),
            "missing": missing,
            "duplicates": duplicates,
            "negative": negative,
            "pooled_min": min(pooled),
            "pooled_max": max(pooled),
            "samples": len(pooled),
            "worker_log_warnings": warnings,
        }
    return summary


# --- Main -------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--database", choices=["sqlite", "postgresql", "mariadb"], required=True)
    parser.add_argument("--repeat", type=int, default=5, help="repeats of each measurement")
    parser.add_argument(
        "--messages", type=int, default=5000, help="messages per process for throughput"
    )
    parser.add_argument(
        "--samples", type=int, default=250, help="latency samples per repeat and interval"
    )
    parser.add_argument(
        "--pace", type=float, default=0.037, help="mean seconds between latency publishes"
    )
    parser.add_argument(
        "--intervals", type=float, nargs="+", default=[0.1, 0.01], help="polling intervals (s)"
    )
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the summary to this file")
    # Internal: the load generator.
    parser.add_argument("--publish-worker", type=int, metavar="N", help=argparse.SUPPRESS)
    parser.add_argument(
        "--mode", choices=["transport", "raw"], default="transport", help=argparse.SUPPRESS
    )
    parser.add_argument("--worker-pace", type=float, default=0.0, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    if args.database == "sqlite" and args.publish_worker is None:
        fresh_sqlite_file()
    setup_django(args.database)
    if args.publish_worker is not None:
        run_publish_worker(args)
        return

    from realtime.conf import conf

    counter = watch_logs()
    migrate()
    clear_table()
    started = time.monotonic()
    print(f"table transport benchmark on {server_version()}, code {code_version()}")
    print(
        f"machine: {os.cpu_count()} cores, {platform.machine()}, Python "
        f"{platform.python_version()}; the publishing subprocesses (load generator) and the "
        "database server share these cores with the process measured"
    )
    print(f"load average before: {load_average()}")
    print(
        f"settings: auto_trim {conf.AUTO_TRIM} (batch {conf.TRIM_BATCH_SIZE}, retention "
        f"{conf.MESSAGE_RETENTION:g} s), commit grace {conf.COMMIT_GRACE:g} s, "
        f"repeat {args.repeat}",
        flush=True,
    )
    summary: dict[str, Any] = {
        "database": server_version(),
        "code": code_version(),
        "cores": os.cpu_count(),
        "load_before": os.getloadavg(),
    }
    try:
        if not args.skip_throughput:
            print(f"\nthroughput: {args.messages} single-message publish() calls per process")
            result = measure_throughput(args.database, args.messages, args.repeat)
            summary["throughput"] = report_throughput(result)
            summary["worker_log_warnings"] = result.worker_warnings
        if not args.skip_latency:
            print(
                f"\nlatency: {args.samples} messages per repeat, one every {args.pace * 1000:g} ms"
                " on average (±50 % jitter), from a publishing subprocess",
                flush=True,
            )
            results = measure_latency(
                args.database, args.intervals, args.samples, args.pace, args.repeat
            )
            summary["latency"] = report_latency(results)
    finally:
        clear_table()
    print(f"\nrealtime log warnings/errors in this process: {counter.count}")
    for line in counter.first:
        print(f"  {line}")
    if "worker_log_warnings" in summary:
        print(f"  in the throughput workers: {summary['worker_log_warnings']}")
    print(f"load average after: {load_average()}")
    print(f"took {time.monotonic() - started:.0f} s")
    summary["log_warnings"] = counter.count
    summary["load_after"] = os.getloadavg()
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
