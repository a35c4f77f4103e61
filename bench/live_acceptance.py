"""The acceptance run of live queries: many sockets, each with a query of its own, stay exact.

Run from the project root (PostgreSQL; a few minutes each)::

    .venv/bin/python bench/live_acceptance.py --transport pg_notify
    .venv/bin/python bench/live_acceptance.py --transport redis
    .venv/bin/python bench/live_acceptance.py --transport pg_notify --sockets 100 --writes 1000

One daphne worker serves the test application (``tests.asgi:application``) with the chosen
transport, on the ``realtime`` PostgreSQL database, where the workspace ``bench-live`` holds
``--rows`` rows of ``Case`` (the test project's ticket: ``filters=["status", "company",
"assignee", "priority", "due", "private"]``, read through a guard: a private case only by its
assignee). This process opens ``--sockets`` sockets, each its own account, member of the
workspace, each asking one live query of its own: 70 % by equality (a status and a company),
30 % by a range of priority; a third of each ordered by ``-priority`` with a limit of 50, the
rest by key with the default limit (200).

A writing subprocess (a copy of this script) then makes ``--writes`` random writes at
``--rate`` a second, each in a transaction of its own: 15 % inserts, 10 % deletes, 30 %
updates that move a row (a new status, company or priority: across a filter or a window's
boundary), 40 % updates of the title alone, 5 % changes of the guard's answer (a case made
private or public, or given another assignee). Every write but a delete titles its row
``w<seq>``. Halfway, every socket is closed and opened again, and asks its query again,
while the writes go on.

At ``--checkpoints`` random points and at the end the writes pause; a marker broadcast on
the workspace reaches every socket after every frame of the writes before it, and each
socket's list (``query.rows``, then every ``query.diff`` applied) is compared with the ORM's
answer for its account, built here from the ask without the package's code:
``Case.objects.filter(workspace, guard, **where).order_by(*order_by, "pk")[:limit]``.
Counted: rows missing, extra, stale (a field differs) and duplicated (entered twice).

Latency, commit → diff: each write's commit time is read in the writer by an ``on_commit``
callback registered before the write (so it runs before realtime's publish). A diff frame's
write is the newest write it shows: the ``w<seq>`` titles of its rows entered or updated,
and for a row it lists as left, the last write of that row committed before the frame came.
Frames of ``query.rows`` (answers, the reconnect) are not samples.

This process holds 1,000 lists of up to 200 rows: a full collection of its own garbage
collector takes 70 to 110 ms, and every frame that arrives meanwhile would be timed late. So its
collector runs only at the checkpoints, while the writes pause; the worker's runs as it
would (``--gc-threshold`` sets the worker's thresholds, as a project may in its ASGI module;
``--gc`` logs the worker's collections and prints them). ``--switch-interval`` sets how long
the worker's event loop may hold the interpreter before a thread waiting for it gets it (see
docs/deploying.md).

The goal (``docs/benchmarks.md``): 0 missing, extra, stale or duplicated rows at every
checkpoint; commit → diff p50 ≤ 10 ms, p99 ≤ 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import functools
import gc
import json
import random
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness
from harness import AsgiServer, Database, Members

SCRIPT = Path(__file__).resolve()
PREFIX = "bench-live"
STATUSES = ("open", "closed", "waiting", "blocked")
COMPANIES = 200
#: The channel the markers go on: a model's (a socket holds only those), one nobody writes.
MARKER_CHANNEL = "company"
#: Seconds a checkpoint waits for its marker at every socket.
MARKER_WAIT = 60.0
#: Indexes a real ticket table has for such queries (made by the benchmark, kept).
INDEXES = {
    "bench_live_case_status": "(workspace_id, status, company_id)",
    "bench_live_case_priority": "(workspace_id, priority)",
}


# --- The writing subprocess --------------------------------------------------------------------


def run_writer(workspace_id: int, seed: int, rate: float) -> None:
    """``--writer``: per ``run N`` line read on stdin, make N random writes at ``rate`` a
    second; print one JSON line per write (``[seq, pk, commit time, kind]``), then
    ``done``."""
    from django.db import transaction

    from tests.testapp.models import Case, Company, Membership

    rng = random.Random(seed)
    pks = list(Case.objects.filter(workspace_id=workspace_id).values_list("pk", flat=True))
    at = {pk: index for index, pk in enumerate(pks)}
    companies = list(Company.objects.filter(workspace_id=workspace_id).values_list("pk", flat=True))
    users = list(
        Membership.objects.filter(workspace_id=workspace_id).values_list("user_id", flat=True)
    )
    seq = 0

    def forget(pk: int) -> None:
        index = at.pop(pk)
        last = pks.pop()
        if last != pk:
            pks[index] = last
            at[last] = index

    def write() -> tuple[int, str]:
        roll = rng.random()
        title = f"w{seq}"
        if roll < 0.15 or not pks:
            case = Case.objects.create(**random_case(rng, workspace_id, companies, users, title))
            at[case.pk] = len(pks)
            pks.append(case.pk)
            return int(case.pk), "insert"
        case = Case.objects.get(pk=rng.choice(pks))
        if roll < 0.25:
            forget(case.pk)
            pk = case.pk
            case.delete()
            return int(pk), "delete"
        case.title = title
        kind = "title"
        if roll < 0.55:
            kind = "move"
            moved = rng.choice(("status", "company", "priority"))
            if moved == "status":
                case.status = rng.choice(STATUSES)
            elif moved == "company":
                case.company_id = rng.choice(companies)
            else:
                case.priority = rng.randint(0, 99)
        elif roll >= 0.95:
            kind = "guard"
            if rng.random() < 0.5:
                case.private = not case.private
            else:
                case.assignee_id = rng.choice(users)
        case.save()
        return int(case.pk), kind

    print("ready", flush=True)
    for line in sys.stdin:
        command, _, count = line.strip().partition(" ")
        if command != "run":
            break
        started = time.monotonic()
        for index in range(int(count)):
            delay = started + index / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            committed: list[float] = []
            with transaction.atomic():
                transaction.on_commit(functools.partial(note_time, committed))
                pk, kind = write()
            print(json.dumps([seq, pk, committed[0], kind]), flush=True)
            seq += 1
        print("done", flush=True)


def note_time(times: list[float]) -> None:
    times.append(time.time())


def random_case(
    rng: random.Random,
    workspace_id: int,
    companies: Sequence[int],
    users: Sequence[int],
    title: str,
) -> dict[str, Any]:
    return {
        "workspace_id": workspace_id,
        "company_id": rng.choice(companies),
        "assignee_id": rng.choice(users),
        "title": title,
        "status": rng.choice(STATUSES),
        "priority": rng.randint(0, 99),
        "private": rng.random() < 0.1,
    }


class Writer:
    """The writing subprocess, driven from the event loop; keeps every write's commit."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        #: seq -> (pk, commit time, kind: insert, delete, move, title or guard)
        self.writes: dict[int, tuple[int, float, str]] = {}
        #: Seconds spent writing (the checkpoints' pauses left out).
        self.busy = 0.0

    @classmethod
    async def start(
        cls, env: dict[str, str], workspace_id: int, args: argparse.Namespace
    ) -> Writer:
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(SCRIPT), "--writer", str(workspace_id),
            "--seed", str(args.seed), "--rate", str(args.rate),
            cwd=harness.ROOT, env=env,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        writer = cls(process)
        if await writer._line() != "ready":
            raise RuntimeError("the writer did not start")
        return writer

    async def _line(self) -> str:
        assert self.process.stdout is not None
        raw = await asyncio.wait_for(self.process.stdout.readline(), harness.WAIT)
        if not raw:
            raise RuntimeError(f"the writer exited with {await self.process.wait()}")
        return raw.decode().strip()

    async def run(self, count: int) -> None:
        """Have it make ``count`` writes; return once they are all committed."""
        assert self.process.stdin is not None
        started = time.monotonic()
        self.process.stdin.write(f"run {count}\n".encode())
        await self.process.stdin.drain()
        while (line := await self._line()) != "done":
            seq, pk, committed, kind = json.loads(line)
            self.writes[seq] = (pk, committed, kind)
        self.busy += time.monotonic() - started

    async def stop(self) -> None:
        if self.process.returncode is None:
            assert self.process.stdin is not None
            with contextlib.suppress(Exception):
                self.process.stdin.write(b"stop\n")
                await self.process.stdin.drain()
            try:
                await asyncio.wait_for(self.process.wait(), harness.WAIT)
            except TimeoutError:
                self.process.kill()


# --- The clients ------------------------------------------------------------------------------


def random_ask(rng: random.Random, companies: Sequence[int]) -> dict[str, Any]:
    where: dict[str, Any]
    if rng.random() < 0.7:
        where = {"status": rng.choice(STATUSES), "company": rng.choice(companies)}
    else:
        low = rng.randint(0, 95)
        where = {"priority__range": [low, low + rng.randint(0, 4)]}
    if rng.random() < 1 / 3:
        return {"model": "case", "where": where, "order_by": ["-priority"], "limit": 50}
    return {"model": "case", "where": where}


@dataclass
class Client:
    """One socket's account, query and list, kept as a client applies the frames."""

    index: int
    user_id: int
    token: str
    ask: dict[str, Any]
    rows: dict[int, dict[str, Any]] | None = None
    connection: Any = None
    reader: asyncio.Task[None] | None = None
    answered: asyncio.Event = field(default_factory=asyncio.Event)
    marker: int = -1
    marked: asyncio.Event = field(default_factory=asyncio.Event)
    duplicated: int = 0
    errors: list[Any] = field(default_factory=list)
    #: Per diff: (arrival, the seqs its rows' titles show, the keys it lists as left).
    diffs: list[tuple[float, list[int], list[int]]] = field(default_factory=list)

    def on_frame(self, text: str | bytes, arrived: float) -> None:
        frame = json.loads(text)
        kind, data = frame.get("type"), frame.get("data") or {}
        if kind == "query.rows":
            ids = [row["id"] for row in data["rows"]]
            self.duplicated += len(ids) - len(set(ids))
            self.rows = {row["id"]: row for row in data["rows"]}
            self.answered.set()
        elif kind == "query.diff":
            rows = self.rows
            assert rows is not None, "a diff before the rows"
            for pk in data["leave"]:
                rows.pop(pk, None)
            for row in data["update"]:
                rows[row["id"]] = row
            for row in data["enter"]:
                if row["id"] in rows:
                    self.duplicated += 1
                rows[row["id"]] = row
            seqs = [seq_of(row) for row in (*data["enter"], *data["update"])]
            self.diffs.append((arrived, [s for s in seqs if s is not None], list(data["leave"])))
        elif kind == "query.error":
            self.errors.append(data)
        elif kind == "bench.marker":
            self.marker = data["n"]
            self.marked.set()


def seq_of(row: dict[str, Any]) -> int | None:
    title = row.get("title")
    if isinstance(title, str) and title.startswith("w") and title[1:].isdigit():
        return int(title[1:])
    return None


async def open_client(client: Client, url: str, slug: str) -> None:
    """Connect, authenticate, subscribe to the markers and ask the query; return once its
    rows came."""
    if client.connection is not None:
        client.connection.transport.abort()
    if client.reader is not None:
        client.reader.cancel()
    client.answered.clear()
    connection = await harness.open_subscribed(url, client.token, slug, [MARKER_CHANNEL])
    client.connection = connection
    await connection.send(json.dumps({"type": "query", "data": {"id": "q", **client.ask}}))

    async def read() -> None:
        with contextlib.suppress(Exception):
            async for frame in connection:
                client.on_frame(frame, time.time())

    client.reader = asyncio.get_running_loop().create_task(read())
    await asyncio.wait_for(client.answered.wait(), harness.WAIT)


async def open_all(clients: Sequence[Client], url: str, slug: str) -> None:
    gate = asyncio.Semaphore(harness.CONNECT_CONCURRENCY)

    async def one(client: Client) -> None:
        async with gate:
            await open_client(client, url, slug)

    await asyncio.gather(*(one(client) for client in clients))


# --- The ORM's answer ---------------------------------------------------------------------------


def orm_answers(clients: Sequence[Client], workspace_id: int) -> list[dict[int, dict[str, Any]]]:
    """Each client's list as the ORM answers it for its account (blocking)."""
    from django.contrib.auth import get_user_model

    from tests.testapp.models import Case, may_read_case

    users = get_user_model()._default_manager.in_bulk([c.user_id for c in clients])
    answers = []
    for client in clients:
        rows = Case.objects.filter(workspace_id=workspace_id).filter(
            may_read_case(users[client.user_id])
        )
        rows = rows.filter(**client.ask["where"])
        ordered = rows.order_by(*client.ask.get("order_by", []), "pk")
        found = ordered[: client.ask.get("limit", 200)].values(
            "pk", "title", "status", "priority", "company_id", "assignee_id", "due", "private"
        )
        answers.append({row["pk"]: as_row(row) for row in found})
    return answers


def as_row(values: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "model": "case",
        "id": values["pk"],
        "title": values["title"],
        "status": values["status"],
        "priority": values["priority"],
        "company": values["company_id"],
        "assignee": values["assignee_id"],
        "due": None if values["due"] is None else values["due"].isoformat(),
        "private": values["private"],
    }


@dataclass
class Tally:
    missing: int = 0
    extra: int = 0
    stale: int = 0
    duplicated: int = 0
    checkpoints: int = 0
    unmarked: int = 0
    bad: list[str] = field(default_factory=list)

    def add(self, client: Client, expected: dict[int, dict[str, Any]], label: str) -> None:
        got = client.rows or {}
        missing = [pk for pk in expected if pk not in got]
        extra = [pk for pk in got if pk not in expected]
        stale = [pk for pk in expected if pk in got and got[pk] != expected[pk]]
        self.missing += len(missing)
        self.extra += len(extra)
        self.stale += len(stale)
        if (missing or extra or stale) and len(self.bad) < 10:
            self.bad.append(
                f"{label} socket {client.index} {client.ask}: missing {missing[:5]}, "
                f"extra {extra[:5]}, stale {stale[:5]}"
            )


async def checkpoint(
    number: int, clients: Sequence[Client], members: Members, tally: Tally, label: str
) -> None:
    """A marker to every socket, then every list against the ORM's answer."""
    from realtime.writes.broadcast import broadcast_to_scope

    for client in clients:
        client.marked.clear()
    await asyncio.to_thread(
        broadcast_to_scope,
        members.workspace_id,
        "bench.marker",
        {"n": number},
        channels=[MARKER_CHANNEL],
    )
    waiting = [client.marked.wait() for client in clients]
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*waiting), MARKER_WAIT)
    tally.unmarked += sum(1 for client in clients if client.marker < number)
    answers = await asyncio.to_thread(orm_answers, clients, members.workspace_id)
    for client, expected in zip(clients, answers, strict=True):
        tally.add(client, expected, label)
    tally.checkpoints += 1


# --- Latency ------------------------------------------------------------------------------------


def latencies(
    clients: Sequence[Client], writes: dict[int, tuple[int, float, str]]
) -> list[tuple[float, float, str]]:
    """Commit → diff of every diff frame, in ms, with its arrival and the kind of the write
    it shows (see the module docstring)."""
    by_row: dict[int, list[tuple[float, int]]] = {}
    for seq, (pk, committed, _) in writes.items():
        by_row.setdefault(pk, []).append((committed, seq))
    for history in by_row.values():
        history.sort()
    found = []
    for client in clients:
        for arrived, seqs, left in client.diffs:
            candidates = [seq for seq in seqs if seq in writes]
            for pk in left:
                history = by_row.get(pk, [])
                at = bisect.bisect_right(history, (arrived, sys.maxsize))
                if at:
                    candidates.append(history[at - 1][1])
            if candidates:
                _, committed, kind = writes[max(candidates)]
                found.append((arrived, (arrived - committed) * 1e3, kind))
    return found


# --- The run ------------------------------------------------------------------------------------


def prepare(args: argparse.Namespace) -> tuple[Members, list[int]]:
    """The workspace, its accounts and companies (made once, kept), ``--rows`` cases."""
    from django.db import connection

    from realtime import silent
    from tests.testapp.models import Case, Company

    members = harness.make_members(PREFIX, args.sockets)
    workspace_id = members.workspace_id
    companies = list(Company.objects.filter(workspace_id=workspace_id).values_list("pk", flat=True))
    if len(companies) < COMPANIES:
        with silent():
            Company.objects.bulk_create(
                Company(workspace_id=workspace_id, name=f"company {n}")
                for n in range(len(companies), COMPANIES)
            )
        companies = list(
            Company.objects.filter(workspace_id=workspace_id).values_list("pk", flat=True)
        )
    rng = random.Random(args.seed)
    with silent():  # made anew: every run of a seed starts from the same rows
        Case.objects.filter(workspace_id=workspace_id).delete()
        for start in range(0, args.rows, 5000):
            Case.objects.bulk_create(
                Case(**random_case(rng, workspace_id, companies, members.user_ids, f"r{n}"))
                for n in range(start, min(args.rows, start + 5000))
            )
    with connection.cursor() as cursor:
        for name, columns in INDEXES.items():
            cursor.execute(f"CREATE INDEX IF NOT EXISTS {name} ON testapp_case {columns}")
        cursor.execute("ANALYZE testapp_case")
    return members, companies


async def run(
    args: argparse.Namespace, database: Database, members: Members, companies: list[int]
) -> dict[str, Any]:
    settings = {"REALTIME_TRANSPORT": args.transport, **harness.redis_settings(args)}
    settings |= harness.parse_settings(args.set)
    env = database.env(settings)
    server_env = harness.probing_collections(env, args.gc, args.gc_threshold, args.switch_interval)
    server = AsgiServer.start("tests.asgi:application", server_env, "live-acceptance")
    rng = random.Random(args.seed + 1)
    clients = [
        Client(index, user_id, token, random_ask(rng, companies))
        for index, (user_id, token) in enumerate(zip(members.user_ids, members.tokens, strict=True))
    ]
    url = server.url("/api/ws")
    writer = await Writer.start(env, members.workspace_id, args)
    tally = Tally()
    #: When the reconnect began and ended (wall clock).
    reconnecting = [0.0, 0.0]
    try:
        started = time.monotonic()
        await open_all(clients, url, members.slug)
        print(
            f"{len(clients):,} sockets asked their queries in {time.monotonic() - started:.1f} s",
            flush=True,
        )
        await checkpoint(0, clients, members, tally, "start")
        points = [*sorted(rng.sample(range(1, args.writes), args.checkpoints)), args.writes]
        halfway = args.writes // 2
        done = 0
        cpu_before, wall_before = server.cpu(), time.monotonic()
        writes_began = time.time()
        pause_time = 0.0
        for number, point in enumerate(points, 1):
            reconnect = None
            if done < halfway <= point:

                async def again(delay: float) -> float:
                    await asyncio.sleep(delay)
                    began = time.monotonic()
                    reconnecting[0] = time.time()
                    await open_all(clients, url, members.slug)
                    reconnecting[1] = time.time()
                    return time.monotonic() - began

                reconnect = asyncio.get_running_loop().create_task(
                    again((halfway - done) / args.rate)
                )
            gc.disable()  # this process collects at checkpoints only (see the docstring)
            try:
                await writer.run(point - done)
                if reconnect is not None:
                    took = await reconnect
                    print(f"every socket reconnected and asked again in {took:.1f} s", flush=True)
            finally:
                gc.enable()
            paused = time.monotonic()
            gc.collect()
            await checkpoint(
                number, clients, members, tally, f"checkpoint {number} (write {point})"
            )
            pause_time += time.monotonic() - paused
            done = point
            if number % 10 == 0:
                print(f"  {point:,} writes, {number} checkpoints: {tally.missing} missing, "
                      f"{tally.extra} extra, {tally.stale} stale", flush=True)  # fmt: skip
        writing = time.monotonic() - wall_before - pause_time
        cpu = server.cpu() - cpu_before
        writes_ended = time.time()
    finally:
        await writer.stop()
        for client in clients:
            if client.reader is not None:
                client.reader.cancel()
            if client.connection is not None:
                client.connection.transport.abort()
        warnings = server.stop()
    tally.duplicated = sum(client.duplicated for client in clients)
    timed = latencies(clients, writer.writes)
    samples = [ms for _, ms, _ in timed]
    # Apart: the diffs that came while every socket was reconnecting and asking again (and
    # the second after), and the others.
    begun, ended = reconnecting[0], reconnecting[1] + 1.0
    steady = [ms for at, ms, _ in timed if not begun <= at <= ended]
    by_kind: dict[str, list[float]] = {}
    for at, ms, kind in timed:
        if not begun <= at <= ended:
            by_kind.setdefault(kind, []).append(ms)
    return {
        "transport": args.transport,
        "sockets": len(clients),
        "rows": args.rows,
        "writes": len(writer.writes),
        "rate": args.rate,
        "achieved_rate": len(writer.writes) / writer.busy if writer.busy else None,
        "checkpoints": tally.checkpoints,
        "missing": tally.missing,
        "extra": tally.extra,
        "stale": tally.stale,
        "duplicated": tally.duplicated,
        "unmarked": tally.unmarked,
        "refused": sum(len(client.errors) for client in clients),
        "diffs": len(samples),
        "p50_ms": harness.percentile(samples, 0.5) if samples else None,
        "p99_ms": harness.percentile(samples, 0.99) if samples else None,
        "max_ms": max(samples) if samples else None,
        "steady_diffs": len(steady),
        "steady_p50_ms": harness.percentile(steady, 0.5) if steady else None,
        "steady_p99_ms": harness.percentile(steady, 0.99) if steady else None,
        "steady_by_write": {
            kind: {
                "diffs": len(found),
                "p50_ms": harness.percentile(found, 0.5),
                "p99_ms": harness.percentile(found, 0.99),
            }
            for kind, found in sorted(by_kind.items())
        },
        "worker_cpu_share": cpu / writing if writing else None,
        "worker_warnings": warnings,
        "worker_collections": (
            harness.collections(args.gc, server.pid, writes_began, writes_ended).show()
            if args.gc
            else None
        ),
        "first_bad": tally.bad,
    }


def report(result: dict[str, Any]) -> None:
    print(
        f"\n{result['transport']}: {result['sockets']:,} sockets, {result['rows']:,} rows, "
        f"{result['writes']:,} writes at {result['rate']:g}/s (made at "
        f"{result['achieved_rate']:.0f}/s), {result['checkpoints']} checkpoints"
    )
    print(
        f"  lists against the ORM: {result['missing']} missing, {result['extra']} extra, "
        f"{result['stale']} stale, {result['duplicated']} duplicated "
        f"({result['unmarked']} marker waits timed out, {result['refused']} queries refused)"
    )
    if result["p50_ms"] is not None:
        print(
            f"  commit → diff over {result['diffs']:,} diffs: p50 {result['p50_ms']:.2f} ms, "
            f"p99 {result['p99_ms']:.2f} ms, max {result['max_ms']:.1f} ms"
        )
    if result["steady_p50_ms"] is not None:
        print(
            f"  the same but while no socket was reconnecting ({result['steady_diffs']:,} "
            f"diffs): p50 {result['steady_p50_ms']:.2f} ms, p99 {result['steady_p99_ms']:.2f} ms"
        )
    for kind, figures in result["steady_by_write"].items():
        print(
            f"    diffs of {kind} writes ({figures['diffs']:,}): p50 {figures['p50_ms']:.2f} ms, "
            f"p99 {figures['p99_ms']:.2f} ms"
        )
    if result["worker_cpu_share"] is not None:
        print(f"  worker CPU while writing: {result['worker_cpu_share'] * 100:.0f} % of a core")
    if result["worker_collections"] is not None:
        print(f"  worker garbage collections while writing: {result['worker_collections']}")
    print(f"  worker log: {result['worker_warnings']} warnings or errors")
    for line in result["first_bad"]:
        print(f"  {line}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    harness.add_transport_options(parser, default="pg_notify")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--sockets", type=int, default=1_000)
    parser.add_argument("--writes", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=200.0, help="writes a second")
    parser.add_argument("--checkpoints", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--gc",
        type=Path,
        metavar="DIRECTORY",
        help="the worker logs its garbage collections here; print them",
    )
    parser.add_argument(
        "--gc-threshold",
        metavar="T0,T1,T2",
        help="the worker runs with gc.set_threshold(T0, T1, T2) (Python's default: 700,10,10)",
    )
    parser.add_argument(
        "--switch-interval",
        type=float,
        metavar="SECONDS",
        help="the worker runs with sys.setswitchinterval(SECONDS) (Python's default: 0.005)",
    )
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    harness.add_set_option(parser)
    parser.add_argument("--writer", type=int, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    if args.writer is not None:
        harness.setup_django_from_env()
        run_writer(args.writer, args.seed, args.rate)
        return
    if args.transport == "table":
        raise SystemExit("live.md's acceptance run is on pg_notify and redis")
    harness.start_transport_servers(args)
    harness.raise_open_files(args.sockets * 2 + 1024)
    database = Database.pick("postgresql", "live")
    settings = {"REALTIME_TRANSPORT": args.transport, **harness.redis_settings(args)}
    harness.migrate(database, settings)
    harness.setup_django(database, settings)
    harness.header(
        f"live queries acceptance ({args.transport} transport)", harness.server_version()
    )
    tuning = [
        f"gc.set_threshold({args.gc_threshold})" if args.gc_threshold else "",
        f"sys.setswitchinterval({args.switch_interval:g})" if args.switch_interval else "",
    ]
    if any(tuning):
        print("worker runs with " + ", ".join(filter(None, tuning)))
    started = time.monotonic()
    members, companies = prepare(args)
    print(f"prepared {args.rows:,} cases in {time.monotonic() - started:.0f} s", flush=True)
    result = asyncio.run(run(args, database, members, companies))
    report(result)
    print(f"\nload average after: {harness.load_average()}")
    print(f"took {time.monotonic() - started:.0f} s")
    harness.write_json(args.json, {"code": harness.code_version(), **result})


if __name__ == "__main__":
    main()
