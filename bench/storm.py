"""Benchmark a reconnect storm: a worker holding N sockets restarts, every client comes back.

Run from the project root::

    .venv/bin/python bench/storm.py                       # 5,000 sockets, table on SQLite
    .venv/bin/python bench/storm.py --sockets 2000 --repeat 3
    .venv/bin/python bench/storm.py --transport pg_notify --database postgresql

Each repeat, for each client policy (``--policies``: ``jitter``, the JavaScript client's
default, and ``exact``, the same backoff without jitter) and for realtime and the floor in
turn:

1. a daphne worker (uvicorn with ``--server uvicorn``) starts and the load generator (this
   process) opens N sockets, each its own account, authenticated for one workspace and
   subscribed to ``company`` in its ``authenticate`` frame (as the JavaScript client does);
2. the worker is stopped (SIGTERM, as a deploy does) and started again on the same port;
3. every client, on losing its socket, follows the JavaScript client's reconnection schedule:
   wait ``--backoff-start`` seconds (1 s), less a random share of it with ``jitter`` (anywhere
   from none to all of it, as ``jitter: 1`` does), try; on failure (the worker is not back yet)
   double the step and wait again. A client is back when it reads ``auth_success``: from then
   on it hears its channel.

Figures: the time from the stop to the last client back; the burst, from the first client
back to the last; handshakes per second over the burst (N over its length); and the restarted
worker's CPU time from listening to the last client back, per handshake. The floor is
``bare_asgi.py`` under the same storm (it answers each socket's first frame with a fixed
``auth_success``: no Django, no database), so the burst and the rate compare directly; the time
from the stop includes each server's start-up (Django's set-up for realtime). The load
generator shares the machine's cores with the server and the database.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness
import websockets
from harness import AsgiServer, Database, Members, Spread
from websockets.asyncio.client import ClientConnection

PREFIX = "bench-storm"
#: Seconds the storm may take before the clients still away are counted as lost.
STORM_WAIT = 120.0


@dataclass
class Storm:
    """One side's figures in one storm."""

    count: int
    from_stop: float
    burst: float
    cpu_per_handshake: float
    back: int

    @property
    def rate(self) -> float:
        return self.count / self.burst if self.burst else float("nan")


class Client:
    """One socket that comes back after its worker restarts, on the JS client's schedule."""

    def __init__(self, open_: Callable[[], Any], jitter: float, start: float) -> None:
        self.open = open_
        self.jitter = jitter
        self.start = start
        self.connection: ClientConnection | None = None
        self.back_at: float | None = None

    async def hold_then_return(self) -> None:
        assert self.connection is not None
        with contextlib.suppress(websockets.ConnectionClosed):
            async for _ in self.connection:
                pass
        step = self.start
        while True:
            await asyncio.sleep(step * (1 - self.jitter * random.random()))
            try:
                self.connection = await self.open()
            except (
                OSError,
                websockets.InvalidHandshake,
                websockets.ConnectionClosed,
                TimeoutError,
            ):
                step = min(step * 2, 30.0)
                continue
            self.back_at = time.monotonic()
            return


async def storm(
    start_server: Callable[[int | None], AsgiServer],
    members: Members | None,
    args: argparse.Namespace,
    jitter: float,
    label: str,
) -> Storm:
    server = start_server(None)
    port = server.port
    url = server.url("/api/ws")

    def opener(index: int) -> Callable[[], Any]:
        token = members.tokens[index] if members else "bare"
        slug = members.slug if members else "bare"
        return lambda: harness.open_subscribed(url, token, slug, [harness.CHANNEL])

    clients = [Client(opener(i), jitter, args.backoff_start) for i in range(args.sockets)]
    connections = await harness.open_many(args.sockets, lambda i: clients[i].open())
    for client, connection in zip(clients, connections, strict=True):
        client.connection = connection
    tasks = [asyncio.ensure_future(client.hold_then_return()) for client in clients]
    restarted: AsgiServer | None = None
    try:
        await server.settle()
        stopped = time.monotonic()
        server.stop()
        restarted = await asyncio.to_thread(start_server, port)
        listening = time.monotonic()
        cpu_before = restarted.cpu()
        await asyncio.wait(tasks, timeout=STORM_WAIT)
        cpu = restarted.cpu() - cpu_before
        times = [c.back_at for c in clients if c.back_at is not None]
        back = len(times)
        last = max(times) if times else listening
        result = Storm(
            count=back,
            from_stop=last - stopped,
            burst=last - min(times) if times else float("nan"),
            cpu_per_handshake=cpu / back if back else float("nan"),
            back=back,
        )
        print(
            f"  {label:<9} back {back:,}/{args.sockets:,} {result.from_stop:.2f} s after the "
            f"stop (listening after {listening - stopped:.2f} s), burst {result.burst:.2f} s, "
            f"{result.rate:,.0f} handshakes/s, "
            f"{harness.micros(result.cpu_per_handshake)} CPU per handshake",
            flush=True,
        )
        return result
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await harness.close_all([c.connection for c in clients if c.connection is not None])
        for each in (server, restarted):
            if each is not None and each.stop():
                print(f"  ({label} server logged warnings or errors: {each.log})")


def servers(
    database: Database, settings: dict[str, Any], kind: str
) -> dict[str, Callable[[int | None], AsgiServer]]:
    real_env = database.env(settings)
    bare_env = database.env({}, path=(harness.BENCH,))
    return {
        "realtime": lambda port: AsgiServer.start(
            "tests.asgi:application", real_env, "storm", port, kind
        ),
        "bare": lambda port: AsgiServer.start(
            "bare_asgi:application", bare_env, "storm-bare", port, kind
        ),
    }


def summarise(results: dict[tuple[str, str], list[Storm]], args: argparse.Namespace) -> None:
    print(f"\n{args.sockets:,} sockets, median [min - max] of {args.repeat} repeats")
    print("| client policy | measurement | realtime | bare ASGI floor | ratio |")
    print("| --- | --- | --- | --- | --- |")
    rows: list[tuple[str, Callable[[float], str], Callable[[Storm], float]]] = [
        ("time from the stop to all back", harness.millis, lambda s: s.from_stop),
        ("burst: first back to last back", harness.millis, lambda s: s.burst),
        ("handshakes per second (burst)", harness.per_second, lambda s: s.rate),
        ("worker CPU per handshake", harness.micros, lambda s: s.cpu_per_handshake),
        ("clients back", lambda v: f"{v:,.0f}", lambda s: s.back),
    ]
    for policy in args.policies:
        for name, unit, read in rows:
            ours = [read(s) for s in results[(policy, "realtime")]]
            base = [read(s) for s in results[(policy, "bare")]]
            ratio = Spread.of(harness.ratios(ours, base)).show(harness.times)
            print(
                f"| {policy} | {name} | {Spread.of(ours).show(unit)} | "
                f"{Spread.of(base).show(unit)} | {ratio} |"
            )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--transport", choices=["table", "pg_notify"], default="table")
    parser.add_argument("--database", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--sockets", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--backoff-start", type=float, default=1.0)
    parser.add_argument(
        "--policies", nargs="+", choices=["jitter", "exact"], default=["jitter", "exact"]
    )
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
    if args.transport == "pg_notify" and args.database != "postgresql":
        raise SystemExit("the pg_notify transport needs --database postgresql")
    harness.raise_open_files(args.sockets * 2 + 1024)
    database = Database.pick(args.database, "storm")
    settings = {"REALTIME_TRANSPORT": args.transport}
    harness.migrate(database, settings)
    harness.setup_django(database, settings)
    harness.header(f"reconnect storm ({args.transport} transport)", harness.server_version())
    members = harness.make_members(PREFIX, args.sockets)
    starts = servers(database, settings, args.server)
    results: dict[tuple[str, str], list[Storm]] = {}
    try:
        for index in range(args.repeat):
            for policy in args.policies:
                jitter = 1.0 if policy == "jitter" else 0.0
                sides = ["realtime", "bare"] if index % 2 == 0 else ["bare", "realtime"]
                for side in sides:
                    label = f"{side}/{policy}"
                    found = asyncio.run(
                        storm(
                            starts[side],
                            members if side == "realtime" else None,
                            args,
                            jitter,
                            label,
                        )
                    )
                    results.setdefault((policy, side), []).append(found)
    finally:
        if database.vendor == "postgresql":
            harness.drop_members(PREFIX)
    summarise(results, args)
    print(f"load average after: {harness.load_average()}")
    harness.write_json(
        args.json,
        {
            "code": harness.code_version(),
            "transport": args.transport,
            "results": {f"{p}/{s}": [vars(r) for r in v] for (p, s), v in results.items()},
        },
    )


if __name__ == "__main__":
    main()
