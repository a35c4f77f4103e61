"""Benchmark what recheck rounds do to delivery: write → frame with rounds, and without.

Run from the project root::

    .venv/bin/python bench/recheck_latency.py --transport pg_notify --database postgresql
    .venv/bin/python bench/recheck_latency.py --transport table --database sqlite --repeat 3

The measurement is ``latency.py``'s (read its docstring): N sockets (``--sockets``, 1,000 by
default) on one daphne worker, each its own account subscribed to ``company``; a publishing
subprocess creates ``Company`` rows one at a time; each socket's arrival is one sample of the
time from the publish's return to the frame. Each repeat measures two fresh workers in turn
(which goes first alternates):

* **without rounds**: ``REALTIME_RECHECK_INTERVAL`` at 3,600 s, so no socket comes due in the
  window;
* **with rounds**: ``REALTIME_RECHECK_INTERVAL`` at ``--interval`` seconds (2 by default): every
  socket is rechecked between 1 and 2 s after it registered and about every 2 s after that, so
  the window of each repeat holds several rounds over all N sockets, 30 times the rate of the
  setting's default.

The figure is the p50 and p99 over every frame of the repeat, with rounds against without, and
their ratio within the repeat.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import harness
import latency
from harness import Database, Spread

PREFIX = "bench-recheck-latency"


async def run(
    args: argparse.Namespace, database: Database, members: Any, interval: float
) -> dict[str, list[Any]]:
    base = latency.transport_settings(args)
    variants = {
        "without rounds": {**base, "REALTIME_RECHECK_INTERVAL": 3600.0},
        "with rounds": {**base, "REALTIME_RECHECK_INTERVAL": interval},
    }
    publisher = await latency.Publisher.start(args, database.env(base), members.workspace_id)
    results: dict[str, list[Any]] = {name: [] for name in variants}
    count = int(args.sockets)
    repeats, args.repeat = args.repeat, 1
    try:
        for index in range(repeats):
            names = list(variants) if index % 2 == 0 else list(reversed(variants))
            for name in names:
                print(f"\nrepeat {index + 1}: {name}", flush=True)
                found = await latency.measure_count(
                    count, args, database, variants[name], members, publisher
                )
                results[name].append(found[0])
    finally:
        await publisher.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--interval", type=float, default=2.0)
    ours, rest = parser.parse_known_args()
    if "--sockets" not in rest:
        rest += ["--sockets", "1000"]
    args = latency.parse_args(rest)
    count = int(args.sockets)
    harness.raise_open_files(count * 2 + 1024)
    database = Database.pick(args.database, "recheck-latency")
    settings = latency.transport_settings(args)
    harness.migrate(database, settings)
    harness.setup_django(database, settings)
    harness.header(
        f"write → frame with and without recheck rounds ({args.transport})",
        harness.server_version(),
    )
    members = harness.make_members(PREFIX, count)
    started = time.monotonic()
    try:
        results = asyncio.run(run(args, database, members, ours.interval))
    finally:
        if database.vendor == "postgresql":
            harness.drop_members(PREFIX)
    print(f"\n{count:,} sockets, median [min - max] of {len(results['with rounds'])} repeats")
    print("| measurement | with rounds | without rounds | ratio |")
    print("| --- | --- | --- | --- |")
    for label, fraction in (("p50", 0.5), ("p99", 0.99)):
        with_ = [harness.percentile(r.every_frame(), fraction) for r in results["with rounds"]]
        without = [harness.percentile(r.every_frame(), fraction) for r in results["without rounds"]]
        ratio = Spread.of(harness.ratios(with_, without)).show(harness.times)
        print(
            f"| write → frame {label} | {Spread.of(with_).show(harness.millis)} | "
            f"{Spread.of(without).show(harness.millis)} | {ratio} |"
        )
    print(f"load average after: {harness.load_average()}; took {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
