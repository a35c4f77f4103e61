"""Benchmark connecting: N sockets authenticated and subscribed on one worker, then idle.

Run from the project root::

    .venv/bin/python bench/connect.py --transport table        # on a SQLite file of its own
    .venv/bin/python bench/connect.py --transport pg_notify    # on PostgreSQL (``realtime``)
    .venv/bin/python bench/connect.py --transport table --sockets 1000 --repeat 3

For the transport and each repeat, realtime and the floor in turn on a fresh daphne (or uvicorn,
with ``--server uvicorn``):

1. the load generator (this process, one asyncio loop) opens N sockets, ``--concurrency``
   handshakes in flight at once; each sends ``authenticate`` naming its workspace and the
   ``company`` channel (as the JavaScript client does) and is done when it reads
   ``auth_success``: from then on it hears that channel. The figure is the time from the first
   connect to the last ``auth_success``, handshakes per second (N over that time), and the
   server's CPU time per handshake (the server process, every thread, from ``/proc``);
2. the sockets then sit idle for ``--idle-window`` seconds and the server's CPU share over that
   window is read. ``REALTIME_RECHECK_INTERVAL`` is ``--recheck-interval`` (30 s by default,
   half the setting's default): every socket's first recheck falls between half the interval
   and the interval after it registered, so with the defaults the window holds one recheck of
   nearly every socket, twice the rate of the default setting. ``--idle-after`` seconds of
   idling come first, unmeasured: past the first rechecks (1.5 intervals), the window reads
   the steady state, in which each socket is rechecked once an interval.

With ``--gc DIRECTORY`` both servers log their garbage collections there
(``probe/sitecustomize.py``), and each side also prints the collections of its connect and of
its idle window: how many, full and young, and the CPU they took. ``--gc-threshold`` runs both
servers with other thresholds of the collector, as a project may set them in its ASGI module.

The floor is ``bare_asgi.py`` under the same server: it accepts each socket and answers its
first frame with a fixed ``auth_success``; no Django, no database. Every socket is its own
account, a member of one workspace. The load generator shares the machine's two cores with the
server and the database: the end-to-end rates are a floor on what the server can do.
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
from harness import AsgiServer, Database, Members, Spread

#: Accounts ``bench-connect-00000``... of the workspace ``bench-connect`` own the sockets.
PREFIX = "bench-connect"
DATABASES = {"table": "sqlite", "pg_notify": "postgresql"}


@dataclass
class Side:
    """One server's figures in one repeat."""

    count: int
    seconds: float
    cpu_per_handshake: float
    idle_share: float

    @property
    def rate(self) -> float:
        return 0.0 if not self.seconds else self.count / self.seconds


async def measure(
    server: AsgiServer, members: Members | None, args: argparse.Namespace, label: str
) -> Side:
    url = server.url("/api/ws")
    count = args.sockets

    def opener(index: int) -> Any:
        token = members.tokens[index] if members else "bare"
        slug = members.slug if members else "bare"
        return harness.open_subscribed(url, token, slug, [harness.CHANNEL])

    warm = await opener(count)
    await server.settle()
    cpu_before = server.cpu()
    started, connect_began = time.monotonic(), time.time()
    connections = await harness.open_many(count, opener, args.concurrency)
    seconds, connected = time.monotonic() - started, time.time()
    cpu = server.cpu() - cpu_before
    try:
        await asyncio.sleep(args.idle_after)
        before, idle_began = server.cpu(), time.time()
        await asyncio.sleep(args.idle_window)
        idle = (server.cpu() - before) / args.idle_window
        idle_ended = time.time()
    finally:
        await harness.close_all([*connections, warm])
    side = Side(count, seconds, cpu / count, idle)
    print(
        f"  {label:<9} {count:,} sockets in {seconds:.2f} s ({side.rate:,.0f} handshakes/s), "
        f"{harness.micros(side.cpu_per_handshake)} server CPU per handshake; "
        f"idle {idle:.2%} of a core over {args.idle_window:g} s",
        flush=True,
    )
    if args.gc:
        while_connecting = harness.collections(args.gc, server.pid, connect_began, connected)
        while_idle = harness.collections(args.gc, server.pid, idle_began, idle_ended)
        print(
            f"  {'':<9} collections while connecting: {while_connecting.show()}; "
            f"idle: {while_idle.show()}",
            flush=True,
        )
    return side


async def repeat(
    transport: str, database: Database, members: Members, args: argparse.Namespace, index: int
) -> tuple[Side, Side]:
    settings = {
        "REALTIME_TRANSPORT": transport,
        "REALTIME_RECHECK_INTERVAL": args.recheck_interval,
    }
    sides: dict[str, Side] = {}
    order = ["realtime", "bare"] if index % 2 == 0 else ["bare", "realtime"]
    for kind in order:
        if kind == "realtime":
            env = database.env(settings)
            application, name = "tests.asgi:application", f"connect-{transport}"
        else:
            env = database.env({}, path=(harness.BENCH,))
            application, name = "bare_asgi:application", "connect-bare"
        env = harness.probing_collections(env, args.gc, args.gc_threshold)
        server = AsgiServer.start(application, env, name, kind=args.server)
        try:
            sides[kind] = await measure(server, members if kind == "realtime" else None, args, kind)
        finally:
            warnings = server.stop()
            if warnings:
                print(f"  ({kind} daphne logged {warnings} warning/error lines: {server.log})")
    return sides["realtime"], sides["bare"]


def summarise(transport: str, count: int, runs: list[tuple[Side, Side]]) -> dict[str, Any]:
    ours, floor = [r for r, _ in runs], [b for _, b in runs]
    rows = [
        ("time to all authenticated", harness.millis, "seconds"),
        ("handshakes per second", harness.per_second, "rate"),
        ("server CPU per handshake", harness.micros, "cpu_per_handshake"),
        ("server CPU share, idle", lambda v: f"{v:.2%}", "idle_share"),
    ]
    print(f"\n{transport}: {count:,} sockets, median [min - max] of {len(runs)} repeats")
    print("| measurement | realtime | bare ASGI floor | ratio |\n| --- | --- | --- | --- |")
    summary: dict[str, Any] = {}
    for name, unit, attribute in rows:
        mine = [getattr(side, attribute) for side in ours]
        base = [getattr(side, attribute) for side in floor]
        ratio = Spread.of(harness.ratios(mine, base))
        print(
            f"| {name} | {Spread.of(mine).show(unit)} | {Spread.of(base).show(unit)} | "
            f"{ratio.show(harness.times)} |"
        )
        summary[attribute] = {
            "realtime": Spread.of(mine).as_dict(),
            "floor": Spread.of(base).as_dict(),
            "ratio": ratio.as_dict(),
        }
    return summary


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--transport", choices=["table", "pg_notify"], required=True)
    parser.add_argument("--sockets", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=500, help="handshakes in flight")
    parser.add_argument("--idle-window", type=float, default=30.0, help="seconds idle")
    parser.add_argument(
        "--idle-after",
        type=float,
        default=0.0,
        help="seconds the sockets sit before the idle window (past the first rechecks: "
        "1.5 times the recheck interval reads the steady state)",
    )
    parser.add_argument(
        "--gc",
        type=Path,
        metavar="DIRECTORY",
        help="servers log their garbage collections here; print them per window",
    )
    parser.add_argument(
        "--gc-threshold",
        metavar="T0,T1,T2",
        help="both servers run with gc.set_threshold(T0, T1, T2) (Python's default: 700,10,10)",
    )
    parser.add_argument("--recheck-interval", type=float, default=30.0)
    parser.add_argument(
        "--server",
        choices=sorted(harness.SERVER_COMMANDS),
        default="daphne",
        help="serving both sides",
    )
    parser.add_argument("--json", type=Path, help="also write the summary to this file")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    count, transport = args.sockets, args.transport
    harness.raise_open_files(count * 2 + 1024)
    database = Database.pick(DATABASES[transport], "connect")
    settings = {"REALTIME_TRANSPORT": transport}
    harness.migrate(database, settings)
    harness.setup_django(database, settings)
    harness.header(f"connect benchmark ({transport} transport)", harness.server_version())
    print(
        f"settings: {count:,} sockets, {args.concurrency} handshakes in flight, idle window "
        f"{args.idle_window:g} s, REALTIME_RECHECK_INTERVAL {args.recheck_interval:g} s, "
        f"served by {args.server}",
        flush=True,
    )
    members = harness.make_members(PREFIX, count + 1)
    try:
        runs = [
            asyncio.run(repeat(transport, database, members, args, index))
            for index in range(args.repeat)
        ]
    finally:
        if database.vendor == "postgresql":
            harness.drop_members(PREFIX)
    summary = {
        "code": harness.code_version(),
        "transport": transport,
        "results": summarise(transport, count, runs),
    }
    print(f"load average after: {harness.load_average()}", flush=True)
    harness.write_json(args.json, summary)


if __name__ == "__main__":
    main()
