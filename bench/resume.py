"""Benchmark resuming: sockets coming back to what they missed, and a LISTEN outage caught up.

Run from the project root::

    .venv/bin/python bench/resume.py storm --database postgresql --transport pg_notify
    .venv/bin/python bench/resume.py storm --database sqlite --transport table
    .venv/bin/python bench/resume.py storm --sockets 200 --missed 20 --repeat 1   # short
    .venv/bin/python bench/resume.py storm --account-traffic 20000   # beside heavy traffic
    .venv/bin/python bench/resume.py outage                                       # PostgreSQL
    .venv/bin/python bench/resume.py during --database sqlite --transport table

``storm``: one daphne worker serves the test application (``tests.asgi:application``); N
sockets, each its own account, a member of one workspace, opt in to resume with the
``company`` channel in ``authenticate``. In each repeat, on a fresh worker:

1. *connect*: the N sockets connect and authenticate from scratch (``resume: null``), 64
   handshakes at a time; the time until the last ``auth_success``;
2. *live*: M events are published to the workspace (``broadcast_to_scope``, one transaction
   each) while every socket listens; the time until every socket has all M frames;
3. *resume*: every socket is cut (TCP abort, no close frame), M more events are published,
   then the N sockets come back with the cursor of the last frame each handled; the time until
   every socket has ``resumed: true`` and all M missed frames, the worker's CPU time and, on
   PostgreSQL, the statements it ran (transactions counted by ``pg_stat_database``: the worker
   reads in autocommit, one statement per transaction).

With ``--account-traffic K`` each repeat runs the storm twice: quiet, then with K account
events of other accounts (the rest of a busy deployment: every account's events share one
channel, which a resume reads) and one ``Notification`` to each socket's account (an account
event about a row, re-decided at replay) published while the sockets are away.

Connect + live is the baseline: what the same sockets cost to come back without resume and
hear the same events live. Resume has to read the log and plan each missed frame for each
socket (the audience checks of a live delivery), so it should cost about the same.

``outage`` (pg_notify, PostgreSQL only): the worker's LISTEN connection goes through a TCP
relay in this process (``REALTIME_LISTEN_DATABASE``). S sockets listen while a thread
publishes W events per second for D seconds; after a third of it the relay cuts every
connection and refuses new ones for ``--cut`` seconds, then lets them through again. Each event
carries its number: the figures are events delivered, lost and duplicated per socket, the
time from the relay's reopening until every socket had every event published before it, and
commit → frame p50/p99 over the run, beside the same run without a cut.

``during``: live delivery while a storm resumes. L sockets of one workspace hear a stream of
W events per second for D seconds, commit → frame measured for each. In the storm run, N
other sockets (another workspace) were cut after connecting and missed M events each; a third
of the way into the stream they all come back at once with their cursors (every one
``resumed: true`` with its M frames). The figure is the live sockets' commit → frame p50/p99
with the storm beside the same stream without it and beside the same N sockets coming back at
the same moment without resuming (their handshakes alone), on a fresh worker each.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness
from harness import AsgiServer, Database, Members, Spread

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PREFIX = "bench-resume"
EVENT = "bench.resume"
CHANNELS = [harness.CHANNEL, "notification"]


# --- Sockets ------------------------------------------------------------------------------------


@dataclass
class Socket:
    """One account's socket: the cursor of the last frame it handled, and what it heard."""

    token: str
    cursor: str | None = None
    heard: list[int] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    resumed: bool | None = None
    connection: Any = None


async def open_socket(
    daphne: AsgiServer, slug: str, socket: Socket, gate: asyncio.Semaphore
) -> None:
    """Connect and authenticate (resuming from ``socket.cursor``), ``gate`` bounding the
    handshakes in flight; then read frames into ``socket`` until cut or closed."""
    async with gate:
        connection = await harness.connect(daphne.url("/api/ws"))
        data = {"token": socket.token, "scope": slug, "resume": socket.cursor, "channels": CHANNELS}
        await connection.send(json.dumps({"type": "authenticate", "data": data}))
        answer = json.loads(await asyncio.wait_for(connection.recv(), harness.WAIT))
    if answer.get("type") != "auth_success":
        raise RuntimeError(f"authentication refused: {answer}")
    socket.connection = connection
    socket.resumed = answer["data"].get("resumed")
    socket.cursor = answer["data"]["cursor"]


async def read(socket: Socket, done: asyncio.Event, wanted: int, progress: asyncio.Event) -> None:
    """Read event frames into ``socket`` until the connection ends; set ``progress`` at each,
    and ``done`` once it has ``wanted`` of them."""
    try:
        async for raw in socket.connection:
            frame = json.loads(raw)
            if frame.get("type") != EVENT:
                continue
            socket.heard.append(frame["data"]["seq"])
            socket.arrivals.append(time.time())
            socket.cursor = frame["cursor"]
            progress.set()
            if len(socket.heard) >= wanted:
                done.set()
    except Exception:  # a cut connection ends the reading, nothing more
        return


class Crowd:
    """N sockets of one worker, reading in tasks of their own."""

    def __init__(self, daphne: AsgiServer, members: Members) -> None:
        self.daphne = daphne
        self.members = members
        self.sockets = [Socket(token) for token in members.tokens]
        self.readers: list[asyncio.Task[None]] = []
        self.done: list[asyncio.Event] = []
        self.progress = asyncio.Event()

    async def connect(self, then_hear: int) -> float:
        """(Re)connect every socket; return the seconds until the last ``auth_success``. Each
        socket then counts as done once it has heard ``then_hear`` more event frames."""
        gate = asyncio.Semaphore(harness.CONNECT_CONCURRENCY)
        start = time.monotonic()
        await asyncio.gather(
            *(open_socket(self.daphne, self.members.slug, s, gate) for s in self.sockets)
        )
        took = time.monotonic() - start
        self.done = [asyncio.Event() for _ in self.sockets]
        self.readers = [
            asyncio.ensure_future(read(s, done, len(s.heard) + then_hear, self.progress))
            for s, done in zip(self.sockets, self.done, strict=True)
        ]
        return took

    async def heard_all(self) -> None:
        await asyncio.wait_for(asyncio.gather(*(d.wait() for d in self.done)), harness.WAIT * 5)

    async def until_each_heard(self, count: int, timeout: float) -> None:
        """Return once every socket heard ``count`` frames, or after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while any(len(s.heard) < count for s in self.sockets):
            self.progress.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.progress.wait(), left)

    async def cut(self) -> None:
        for socket in self.sockets:
            socket.connection.transport.abort()
        await asyncio.gather(*self.readers, return_exceptions=True)


def publish(workspace_id: int, first: int, count: int) -> None:
    from realtime.broadcast import broadcast_to_scope

    for seq in range(first, first + count):
        broadcast_to_scope(workspace_id, EVENT, {"seq": seq}, channels=CHANNELS)


def account_traffic(user_ids: list[int], others: int) -> None:
    """While the sockets are away: ``others`` account events to accounts that are not
    connected (the rest of a busy deployment), and one ``Notification`` to each socket's
    account (an account event about a row, which a resume re-decides)."""
    from django.db import transaction

    from realtime.broadcast import broadcast_to_user
    from tests.testapp.models import Notification

    nobody = max(user_ids) + 1_000_000  # ids no socket holds
    for start in range(0, others, 500):
        with transaction.atomic():
            for n in range(start, min(others, start + 500)):
                broadcast_to_user(nobody + n, "bench.other", {"n": n})
    with transaction.atomic():
        for user_id in user_ids:
            Notification.objects.create(user_id=user_id, text="while away")


def transactions() -> int:
    """Transactions committed and rolled back in this database so far (PostgreSQL)."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = "
            "current_database()"
        )
        row = cursor.fetchone()
    return int(row[0]) if row else 0


# --- Storm ----------------------------------------------------------------------------------------


@dataclass
class Storm:
    connect: float
    live: float
    resume_handshakes: float
    resume: float
    cpu_baseline: float
    cpu_resume: float
    statements: float
    resumed: int


async def one_storm(
    database: Database, settings: dict[str, Any], members: Members, missed: int, others: int = 0
) -> Storm:
    daphne = AsgiServer.start("tests.asgi:application", database.env(settings), "resume")
    crowd = Crowd(daphne, members)
    try:
        cpu = daphne.cpu()
        connect = await crowd.connect(then_hear=missed)
        start = time.monotonic()
        await asyncio.to_thread(publish, members.workspace_id, 0, missed)
        await crowd.heard_all()
        live = connect + time.monotonic() - start
        cpu_baseline = daphne.cpu() - cpu
        await crowd.cut()
        await daphne.settle()
        await asyncio.to_thread(publish, members.workspace_id, missed, missed)
        if others:
            await asyncio.to_thread(account_traffic, members.user_ids, others)
        await daphne.settle()
        before = await asyncio.to_thread(transactions)
        cpu = daphne.cpu()
        start = time.monotonic()
        handshakes = await crowd.connect(then_hear=missed)
        await crowd.heard_all()
        resume = time.monotonic() - start
        cpu_resume = daphne.cpu() - cpu
        await asyncio.sleep(1.5)  # PostgreSQL publishes its counters about once a second
        statements = await asyncio.to_thread(transactions) - before - 1
        for socket in crowd.sockets:
            if socket.heard != list(range(2 * missed)):
                raise RuntimeError(f"a socket heard {socket.heard[:5]}... not 0..{2 * missed - 1}")
        await crowd.cut()
        return Storm(
            connect=connect,
            live=live,
            resume_handshakes=handshakes,
            resume=resume,
            cpu_baseline=cpu_baseline,
            cpu_resume=cpu_resume,
            statements=statements / len(crowd.sockets),
            resumed=sum(1 for s in crowd.sockets if s.resumed),
        )
    finally:
        warnings = daphne.stop()
        if warnings:
            print(f"  (daphne logged {warnings} warning/error lines: {daphne.log})")


async def storm(args: argparse.Namespace) -> None:
    database = Database.pick(args.database, "resume")
    settings = {
        "REALTIME_TRANSPORT": args.transport,
        **harness.redis_settings(args),
        "REALTIME_RECHECK_INTERVAL": 3600,
        "REALTIME_RESUME_MAX_FRAMES": max(1000, args.missed),
        "REALTIME_POLLING_INTERVAL": 0.01,
        **harness.parse_settings(args.set),
    }
    harness.migrate(database, settings)
    harness.setup_django(database, settings)
    harness.raise_open_files(args.sockets * 2 + 256)
    harness.header(
        f"resume storm: {args.sockets:,} sockets x {args.missed} missed events, {args.transport}",
        await asyncio.to_thread(harness.server_version),
    )
    members = await asyncio.to_thread(harness.make_members, PREFIX, args.sockets)
    kinds = (
        {"quiet": 0, "account traffic": args.account_traffic}
        if args.account_traffic
        else {"quiet": 0}
    )
    runs: dict[str, list[Storm]] = {kind: [] for kind in kinds}
    try:
        for index in range(args.repeat):
            for kind, others in kinds.items():
                run = await one_storm(database, settings, members, args.missed, others)
                runs[kind].append(run)
                print(
                    f"  repeat {index + 1}, {kind}: connect {run.connect:.2f} s + live "
                    f"{run.live - run.connect:.2f} s = {run.live:.2f} s "
                    f"(CPU {run.cpu_baseline:.2f} s); resume {run.resume:.2f} s"
                    f" (handshakes {run.resume_handshakes:.2f} s, CPU {run.cpu_resume:.2f} s, "
                    + (
                        f"{run.statements:.2f} statements/socket, "
                        if database.vendor != "sqlite"
                        else ""
                    )
                    + f"{run.resumed:,} resumed)",
                    flush=True,
                )
    finally:
        if args.database == "postgresql":
            await asyncio.to_thread(harness.drop_members, PREFIX)
    seconds = lambda v: f"{v:.2f} s"  # noqa: E731
    print("summary (median [min - max]):")
    for kind, done in runs.items():
        if len(runs) > 1:
            extra = f" + {args.account_traffic:,} other accounts' events" if kind != "quiet" else ""
            print(f" {kind}{extra}:")
        print(f"  connect + hear live   {Spread.of([r.live for r in done]).show(seconds)}")
        print(f"  resume until all live {Spread.of([r.resume for r in done]).show(seconds)}")
        ratio = harness.ratios([r.resume for r in done], [r.live for r in done])
        print(f"  ratio resume / (connect + live) {Spread.of(ratio).show(harness.times)}")
        cpu = harness.ratios([r.cpu_resume for r in done], [r.cpu_baseline for r in done])
        print(
            f"  worker CPU: resume {Spread.of([r.cpu_resume for r in done]).show(seconds)}, "
            f"ratio to connect + live {Spread.of(cpu).show(harness.times)}"
        )
        if args.database == "postgresql":
            per = Spread.of([r.statements for r in done]).show(lambda v: f"{v:.2f}")
            print(f"  statements per resumed socket {per}")
    if len(runs) > 1:
        heavy = harness.ratios(
            [r.resume for r in runs["account traffic"]], [r.resume for r in runs["quiet"]]
        )
        print(f"  resume with account traffic / quiet {Spread.of(heavy).show(harness.times)}")
    print(f"load average after: {harness.load_average()}")


# --- Outage ---------------------------------------------------------------------------------------


class Publisher(threading.Thread):
    """Publish numbered events at ``rate`` per second for ``seconds``; keep each commit time."""

    def __init__(self, workspace_id: int, rate: float, seconds: float) -> None:
        super().__init__(daemon=True)
        self.workspace_id = workspace_id
        self.rate = rate
        self.seconds = seconds
        self.sent: list[float] = []

    def run(self) -> None:
        from django.db import connection

        start = time.monotonic()
        try:
            while (elapsed := time.monotonic() - start) < self.seconds:
                publish(self.workspace_id, len(self.sent), 1)
                self.sent.append(time.time())
                time.sleep(max(0.0, len(self.sent) / self.rate - elapsed))
        finally:
            connection.close()


@dataclass
class Outage:
    delivered: int
    lost: int
    duplicated: int
    catch_up: float
    p50: float
    p99: float


async def one_outage(
    database: Database,
    settings: dict[str, Any],
    members: Members,
    args: argparse.Namespace,
    cut: bool,
) -> Outage:
    from realtime.transports.pg_notify import conninfo_of
    from tests.proxy import Proxy

    info = conninfo_of(None)
    proxy = Proxy(info.get("host", "127.0.0.1"), int(info.get("port", 5432)))
    await proxy.open()
    settings = {**settings, "REALTIME_LISTEN_DATABASE": proxy.dsn(info["dbname"])}
    daphne = AsgiServer.start("tests.asgi:application", database.env(settings), "resume-outage")
    crowd = Crowd(daphne, members)
    reopened = 0.0
    try:
        await crowd.connect(then_hear=10**9)
        publisher = Publisher(members.workspace_id, args.rate, args.seconds)
        publisher.start()
        if cut:
            await asyncio.sleep(args.seconds / 3)
            await proxy.close()
            await asyncio.sleep(args.cut)
            await proxy.open()
            reopened = time.time()
        await asyncio.to_thread(publisher.join)
        total = len(publisher.sent)
        await crowd.until_each_heard(total, harness.WAIT)
        await crowd.cut()
    finally:
        daphne.stop()
        await proxy.close()
    sent = publisher.sent
    before = sum(1 for at in sent if at < reopened) if cut else 0
    lags: list[float] = []
    last_missed = reopened
    delivered = lost = duplicated = 0
    for socket in crowd.sockets:
        delivered += len(set(socket.heard))
        duplicated += len(socket.heard) - len(set(socket.heard))
        lost += total - len(set(socket.heard) & set(range(total)))
        for seq, at in zip(socket.heard, socket.arrivals, strict=True):
            lags.append(at - sent[seq])
            if seq < before:
                last_missed = max(last_missed, at)
    return Outage(
        delivered=delivered,
        lost=lost,
        duplicated=duplicated,
        catch_up=last_missed - reopened if cut else 0.0,
        p50=harness.percentile(lags, 0.5),
        p99=harness.percentile(lags, 0.99),
    )


async def outage(args: argparse.Namespace) -> None:
    database = Database.pick("postgresql", "resume")
    settings = {
        "REALTIME_TRANSPORT": "pg_notify",
        "REALTIME_RECHECK_INTERVAL": 3600,
        **harness.parse_settings(args.set),
    }
    harness.migrate(database, settings)
    harness.setup_django(database, settings)
    harness.header(
        f"LISTEN outage: {args.sockets} sockets, {args.rate:g} writes/s for {args.seconds:g} s, "
        f"cut {args.cut:g} s",
        await asyncio.to_thread(harness.server_version),
    )
    members = await asyncio.to_thread(harness.make_members, PREFIX, args.sockets)
    try:
        for index in range(args.repeat):
            for cut in (False, True):
                run = await one_outage(database, settings, members, args, cut)
                label = "with the cut   " if cut else "without a cut  "
                print(
                    f"  repeat {index + 1} {label} delivered {run.delivered:,}, lost {run.lost}, "
                    f"duplicated {run.duplicated}; commit -> frame p50 {harness.millis(run.p50)}, "
                    f"p99 {harness.millis(run.p99)}"
                    + (f"; caught up {run.catch_up:.2f} s after the reopening" if cut else ""),
                    flush=True,
                )
    finally:
        await asyncio.to_thread(harness.drop_members, PREFIX)
    print(f"load average after: {harness.load_average()}")


# --- Live delivery during a storm ----------------------------------------------------------


@dataclass
class During:
    p50: float
    p99: float
    resumed: int
    resume: float


async def one_during(
    database: Database,
    settings: dict[str, Any],
    live_members: Members,
    storm_members: Members,
    args: argparse.Namespace,
    storm_kind: str,
) -> During:
    """One stream to the live sockets, beside no storm (``"none"``), the storm of resumes
    (``"resume"``), or the same sockets coming back at the same moment without resuming
    (``"reconnect"``: the handshakes alone, nothing replayed)."""
    with_storm = storm_kind != "none"
    env = harness.probing_collections(database.env(settings), args.gc)
    daphne = AsgiServer.start("tests.asgi:application", env, "resume-during")
    live = Crowd(daphne, live_members)
    storm = Crowd(daphne, storm_members)
    resume = 0.0
    try:
        if with_storm:
            await storm.connect(then_hear=0)
            await storm.cut()
            await daphne.settle()
            await asyncio.to_thread(publish, storm_members.workspace_id, 0, args.missed)
            await daphne.settle()
        await live.connect(then_hear=10**9)
        publisher = Publisher(live_members.workspace_id, args.rate, args.seconds)
        publisher.start()
        if with_storm:
            await asyncio.sleep(args.seconds / 3)
            replayed = args.missed if storm_kind == "resume" else 0
            if not replayed:
                for socket in storm.sockets:
                    socket.cursor = None
            start = time.monotonic()
            await storm.connect(then_hear=replayed)
            if replayed:
                await storm.heard_all()
            resume = time.monotonic() - start
        await asyncio.to_thread(publisher.join)
        await live.until_each_heard(len(publisher.sent), harness.WAIT)
        await live.cut()
        if storm_kind == "resume":
            for socket in storm.sockets:
                if socket.heard != list(range(args.missed)):
                    raise RuntimeError(f"a resumed socket heard {socket.heard[:5]}...")
        if with_storm:
            await storm.cut()
    finally:
        daphne.stop()
    sent = publisher.sent
    lags = [
        at - sent[seq]
        for socket in live.sockets
        for seq, at in zip(socket.heard, socket.arrivals, strict=True)
    ]
    if any(len(socket.heard) != len(sent) for socket in live.sockets):
        raise RuntimeError("a live socket missed events")
    return During(
        p50=harness.percentile(lags, 0.5),
        p99=harness.percentile(lags, 0.99),
        resumed=sum(1 for socket in storm.sockets if socket.resumed),
        resume=resume,
    )


async def during(args: argparse.Namespace) -> None:
    database = Database.pick(args.database, "resume")
    settings = {
        "REALTIME_TRANSPORT": args.transport,
        **harness.redis_settings(args),
        "REALTIME_RECHECK_INTERVAL": 3600,
        "REALTIME_RESUME_MAX_FRAMES": max(1000, args.missed),
        **harness.parse_settings(args.set),
    }
    harness.migrate(database, settings)
    harness.setup_django(database, settings)
    harness.raise_open_files((args.sockets + args.live) * 2 + 256)
    harness.header(
        f"live delivery during a resume storm: {args.live} live sockets, {args.rate:g} events/s "
        f"for {args.seconds:g} s; storm {args.sockets:,} sockets x {args.missed} missed, "
        f"{args.transport}",
        await asyncio.to_thread(harness.server_version),
    )
    live_members = await asyncio.to_thread(harness.make_members, f"{PREFIX}-live", args.live)
    storm_members = await asyncio.to_thread(harness.make_members, PREFIX, args.sockets)
    labels = {
        "none": "without a storm       ",
        "reconnect": "with reconnects alone ",
        "resume": "with the resume storm ",
    }
    runs: dict[str, list[During]] = {kind: [] for kind in labels}
    try:
        for index in range(args.repeat):
            for kind, label in labels.items():
                run = await one_during(database, settings, live_members, storm_members, args, kind)
                runs[kind].append(run)
                print(
                    f"  repeat {index + 1} {label} commit -> frame p50 {harness.millis(run.p50)},"
                    f" p99 {harness.millis(run.p99)}"
                    + (
                        f"; {run.resumed:,} resumed, all frames in {run.resume:.2f} s"
                        if kind == "resume"
                        else ""
                    ),
                    flush=True,
                )
    finally:
        if args.database == "postgresql":
            for prefix in (PREFIX, f"{PREFIX}-live"):
                await asyncio.to_thread(harness.drop_members, prefix)
    print("summary (median [min - max]):")
    for kind, label in labels.items():
        p50 = Spread.of([r.p50 for r in runs[kind]]).show(harness.millis)
        p99 = Spread.of([r.p99 for r in runs[kind]]).show(harness.millis)
        print(f"  {label} p50 {p50}, p99 {p99}")
    for kind in ("reconnect", "none"):
        ratio = harness.ratios([r.p99 for r in runs["resume"]], [r.p99 for r in runs[kind]])
        print(f"  p99 ratio resume storm / {kind} {Spread.of(ratio).show(harness.times)}")
    print(f"load average after: {harness.load_average()}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    kinds = parser.add_subparsers(dest="kind", required=True)
    one = kinds.add_parser("storm", help="N sockets resume M missed events each")
    one.add_argument("--database", choices=["sqlite", "postgresql"], default="postgresql")
    harness.add_transport_options(one, default="pg_notify")
    one.add_argument("--sockets", type=int, default=1000)
    one.add_argument("--missed", type=int, default=100)
    one.add_argument("--repeat", type=int, default=3)
    one.add_argument(
        "--account-traffic",
        type=int,
        default=0,
        help="also run each repeat with this many account events of other accounts, and one "
        "row event to each socket's account, published while the sockets are away",
    )
    harness.add_set_option(one)
    two = kinds.add_parser("outage", help="a LISTEN connection cut while writes flow")
    two.add_argument("--sockets", type=int, default=20)
    two.add_argument("--rate", type=float, default=200.0)
    two.add_argument("--seconds", type=float, default=15.0)
    two.add_argument("--cut", type=float, default=5.0)
    two.add_argument("--repeat", type=int, default=1)
    harness.add_set_option(two)
    three = kinds.add_parser("during", help="live delivery while N sockets resume at once")
    three.add_argument("--database", choices=["sqlite", "postgresql"], default="postgresql")
    harness.add_transport_options(three, default="pg_notify")
    three.add_argument("--sockets", type=int, default=1000)
    three.add_argument("--missed", type=int, default=100)
    three.add_argument("--live", type=int, default=20)
    three.add_argument("--rate", type=float, default=50.0)
    three.add_argument("--seconds", type=float, default=12.0)
    three.add_argument("--repeat", type=int, default=3)
    three.add_argument(
        "--gc", type=Path, help="a directory where the worker logs each garbage collection"
    )
    harness.add_set_option(three)
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    if args.kind != "outage" and args.transport == "pg_notify" and args.database != "postgresql":
        raise SystemExit("pg_notify needs --database postgresql")
    runs = {"storm": storm, "outage": outage, "during": during}
    harness.start_transport_servers(args)
    asyncio.run(runs[args.kind](args))


if __name__ == "__main__":
    main()
