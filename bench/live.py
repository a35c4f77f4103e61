"""Benchmark live queries' matching on one worker: CPU per write and memory per query.

Run from the project root::

    .venv/bin/python bench/live.py
    .venv/bin/python bench/live.py --queries 1000 10000 --writes 10000

What it measures, in process (no socket, no database: matching is what a worker does for
every write it hears, whatever the transport): ``--queries`` live queries of the test
project's ``Case`` model (``filters=["status", "company", "assignee", "priority", "due",
"private"]``), each held by a socket of its own reading one scope; 70 % filter by equality
(``status``, ``company``), 30 % by a range of ``priority``; a third are ordered by
``-priority`` with a limit of 50, the rest by key with a limit of 200. Their windows are
loaded from a table of ``--rows`` rows kept in memory. Then ``--writes`` random writes (half
move a row across a filter or a window's boundary) are carried as the delivery pipeline
carries a message: the changed row, its ``filters`` values, to every socket of the scope.

Printed for each count of queries:

* **matching**: CPU per write (``time.process_time``), refills excluded: deciding which
  queries a write touches, applying it to their windows, working out and encoding the
  diffs;
* **refills**: the reads of windows (a row left a full window) per write, one for each
  query shape and reader: each is one statement on a real worker; counted here and left
  out of the time, with the windows they replace (here they search the in-memory table);
* **memory per query**: ``tracemalloc``'s count of what the queries, with empty windows,
  hold, divided by their number (the rows a window shows are left out, as the goal says);
* **objects the garbage collector tracks per row held**: what loading the windows added to
  ``gc.get_objects()`` after a collection, over the rows the windows hold. A full collection
  of a worker walks every tracked object while the worker waits (``live_acceptance.py
  --gc``): a window's rows should add as few as they can.

The goal (``docs/benchmarks.md``): matching at most 1 ms per write at 1,000 queries, and
at most 4 KB a query.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def setup_django() -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    os.environ.setdefault("REALTIME_TEST_DATABASE", "sqlite")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import django

    django.setup()


class FakeUser:
    def __init__(self, pk: int) -> None:
        self.pk = pk


class FakeSocket:
    """What live queries read of a socket: its account, scopes and queries."""

    def __init__(self, user_id: int) -> None:
        self.user = FakeUser(user_id)
        self.scopes = {1: "bench"}
        self.queries: dict[str, Any] = {}


STATUSES = ["open", "closed", "waiting", "blocked"]


def random_row(rng: random.Random, pk: int) -> dict[str, Any]:
    return {
        "model": "case",
        "id": pk,
        "title": f"case {pk}",
        "status": rng.choice(STATUSES),
        "priority": rng.randint(0, 99),
        "company": rng.randint(1, 200),
        "assignee": rng.randint(1, 50),
        "due": None,
        "private": False,
    }


def random_ask(rng: random.Random) -> dict[str, Any]:
    where: dict[str, Any]
    if rng.random() < 0.7:
        where = {"status": rng.choice(STATUSES), "company": rng.randint(1, 200)}
    else:
        low = rng.randint(0, 90)
        where = {"priority__range": [low, low + rng.randint(1, 9)]}
    if rng.random() < 1 / 3:
        return {"model": "case", "where": where, "order_by": ["-priority"], "limit": 50}
    return {"model": "case", "where": where, "limit": 200}


def run(count: int, rows: int, writes: int, seed: int) -> dict[str, float]:
    from realtime.registry import options_named
    from realtime.sockets import live_queries
    from realtime.sockets.live_queries import LiveQuery, ModelQueries, Queries, read_query

    options = options_named("case")
    assert options is not None
    rng = random.Random(seed)
    table = {pk: random_row(rng, pk) for pk in range(1, rows + 1)}

    async def deliver(socket: Any, frame: str) -> None:
        return None

    queries = Queries(deliver, restart=lambda socket: None)  # nothing here reads rows again
    refills = 0

    entries = {pk: live_queries.entry_of(options, row) for pk, row in table.items()}

    def answer(query: LiveQuery) -> list[dict[str, Any]]:
        found = [
            table[pk]
            for pk, entry in entries.items()
            if entry is not None and query.sorting.matches(entry[live_queries.TYPED])
        ]
        if query.shape.order[0][0] == "priority":
            found.sort(key=lambda row: (-row["priority"], row["id"]))
        else:
            found.sort(key=lambda row: row["id"])
        return found[: live_queries.capacity(query.shape) + 1]

    async def read_again(stale: Sequence[LiveQuery]) -> list[list[dict[str, Any]] | None]:
        """A refill of queries of one shape and reader group: one statement on a worker (of
        a guarded shape's accounts together), answered here in process."""
        nonlocal refills
        refills += 1
        return [answer(query) for query in stale]

    queries._read_again = read_again  # type: ignore[method-assign,assignment]
    sockets = []
    gc.collect()
    tracked_before = len(gc.get_objects())
    for n in range(count):
        socket = FakeSocket(n)
        query_id, shape = read_query({"id": "q", **random_ask(rng)})
        group = queries.by_model.setdefault("case", ModelQueries())
        query = LiveQuery(query_id, shape, socket, group)
        socket.queries[query_id] = query
        group.add(query)
        query.pending = None
        query.load(answer(query))
        sockets.append(socket)
    gc.collect()
    held = sum(len(s.queries["q"].window) for s in sockets)
    tracked_per_row = (len(gc.get_objects()) - tracked_before) / held
    readers = set(sockets)
    changes = []
    for _ in range(writes):
        pk = rng.randint(1, rows)
        row = dict(table[pk])
        if rng.random() < 0.5:
            row["status"] = rng.choice(STATUSES)
        else:
            row["priority"] = rng.randint(0, 99)
        changes.append(row)

    async def carry_all() -> float:
        spent = 0.0
        for row in changes:
            table[row["id"]] = row
            entries[row["id"]] = live_queries.entry_of(options, row)
            data = {key: row[key] for key in ("model", "id", "title", "status", "priority")}
            meta = {"filters": {name: row[name] for name in options.filters}}
            started = time.process_time()
            change = queries.change("case", data, meta, "row")
            # As the dispatcher does: the sockets a write may touch (then, on a worker, their
            # permissions asked), then what it does to their queries.
            touched = queries.sockets_touched("case", change)
            queries.carry("case", touched & readers, change, touched)
            await queries.flush()  # each write its own publication
            spent += time.process_time() - started
        return spent

    refills = 0
    gc.collect()
    # Refills (the reads, then the windows replaced) run inside flush: timed apart, taken out.
    refill_time = 0.0
    plain_refill = queries._refill

    async def timed_refill(stale: Any) -> None:
        nonlocal refill_time
        started = time.process_time()
        try:
            await plain_refill(stale)
        finally:
            refill_time += time.process_time() - started

    queries._refill = timed_refill  # type: ignore[method-assign]
    spent = asyncio.run(carry_all())
    return {
        "matching_ms": (spent - refill_time) / writes * 1e3,
        "refills_per_write": refills / writes,
        "tracked_per_row": tracked_per_row,
    }


def memory_per_query(counts: list[int], seed: int) -> float:
    """Bytes each query holds beyond the rows of its window: the slope between counts."""
    from realtime.sockets.live_queries import LiveQuery, ModelQueries, read_query

    sizes = []
    for count in counts:
        rng = random.Random(seed)
        held = [FakeSocket(n) for n in range(count)]  # the sockets are not the queries' cost
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        group = ModelQueries()
        for n, socket in enumerate(held):
            query_id, shape = read_query({"id": f"q{n}", **random_ask(rng)})
            query = LiveQuery(query_id, shape, socket, group)
            socket.queries[query_id] = query
            group.add(query)
        sizes.append(tracemalloc.get_traced_memory()[0] - before)
        tracemalloc.stop()
        del held, group
    return (sizes[-1] - sizes[0]) / (counts[-1] - counts[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queries", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--writes", type=int, default=10000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=47)
    args = parser.parse_args()
    setup_django()
    print(f"live queries of Case, {args.rows} rows, {args.writes} writes, median of {args.repeat}")
    for count in args.queries:
        runs = [run(count, args.rows, args.writes, args.seed + n) for n in range(args.repeat)]
        matching = statistics.median(r["matching_ms"] for r in runs)
        refills = statistics.median(r["refills_per_write"] for r in runs)
        print(
            f"  {count:>6} queries: matching {matching:.3f} ms per write "
            f"(min {min(r['matching_ms'] for r in runs):.3f}), "
            f"refills {refills:.3f} per write, "
            f"{runs[0]['tracked_per_row']:.2f} tracked objects per row held"
        )
    if len(args.queries) > 1:
        per_query = memory_per_query(args.queries, args.seed)
        print(f"  memory: {per_query:,.0f} bytes per query (rows excluded)")


if __name__ == "__main__":
    main()
