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
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness
from harness import Database, Members, Run, Spread

SCRIPT = Path(__file__).resolve()
PREFIX = "bench-pg-notify"
SETTINGS = {"REALTIME_TRANSPORT": "pg_notify"}
#: The transport as it was before it kept the log: a bare NOTIFY per message.
BARE = {**SETTINGS, "REALTIME_PG_NOTIFY_LOG": False}
#: What starts this script's writing processes (``harness.Writer``).
COMMAND = (str(SCRIPT),)


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
                async with harness.listening_worker(
                    database, members, settings, "pg-notify"
                ) as readers:
                    runs[mode] = await harness.concurrent_writes(
                        COMMAND, 2, "announced", args.writes, members, tag, env, readers
                    )
            else:
                kind = "plain" if mode == "plain" else "announced"
                runs[mode] = await harness.concurrent_writes(
                    COMMAND, 2, kind, args.writes, members, tag, env
                )
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
    harness.add_writer_options(parser)
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    database = Database("postgresql", "realtime")
    if args.worker is not None:
        # The settings of the run (with or without the log) come from the parent.
        harness.setup_django_from_env()
        harness.write_rows(args.worker, args.writes, args.workspace, args.tag)
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
