"""Benchmark fan-out and memory: one event to N sockets on one daphne (or uvicorn) worker.

Run from the project root::

    .venv/bin/python bench/fanout.py                          # N = 1,000 and 5,000
    .venv/bin/python bench/fanout.py --sockets 1000 --repeat 3
    .venv/bin/python bench/fanout.py --server uvicorn         # both sides under uvicorn

The realtime side is the test application (``tests.asgi:application``) on SQLite with the table
transport, on a file of its own (``/tmp/realtime-bench-fanout.sqlite3``, made anew and migrated
on each run). Every socket is its own account, a member of one workspace, authenticated for it
and subscribed to the ``company`` channel. The floor is ``bare_asgi.py`` under the same server
with the same flags (``--server`` picks daphne or uvicorn for both): it accepts sockets and,
when told to over a control socket, sends one pre-encoded text frame to every socket's raw
ASGI ``send`` with ``asyncio.gather``.

For each N and each repeat, realtime and the floor in turn (which goes first alternates), on a
fresh daphne each time:

1. open one warm-up socket, send one warm-up event through it, wait for the server to go quiet
   and read its resident memory (``VmRSS`` of ``/proc/<pid>/status``);
2. open N more sockets, wait for quiet again, read ``VmRSS`` again: the growth divided by N is
   the memory per idle socket; the server's CPU share while quiet is printed too;
3. send ``--events`` events (after one more for warm-up), waiting for every socket to have
   each one. Realtime: ``broadcast_to_scope`` to the workspace's ``company`` channel, called in
   a thread of the load generator; the clock starts when the call returned (the row is
   committed). Floor: the clock starts just before ``fire`` goes out on the control socket.
   For each event: the time until the last of the N sockets had the frame, from the start and
   from the first socket's frame, frames per second (N over the former), and the server's CPU
   time per frame (the daphne process, every thread, from ``/proc/<pid>/task/*/schedstat``,
   minus its idle share over the same time).

Each repeat reports the median of its events; the summary gives the median [min - max] across
repeats and the ratio to the floor of the same repeat. The load generator (all the sockets,
one asyncio process) shares the two cores with daphne: it must read every frame, so the
end-to-end rates are a floor on what the server can do, while the CPU time per frame is the
server's own cost. The table transport polls every ``--polling-interval`` seconds (0.01 here
by default, against 0.1 for the setting's default), which the time from publish to any frame
includes; the time from the first frame to the last does not.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness
from harness import Arrivals, AsgiServer, Database, Members, Readers, Spread
from websockets.asyncio.client import ClientConnection

#: Accounts ``bench-fanout-00000``... of the workspace ``bench-fanout`` own the sockets.
PREFIX = "bench-fanout"
EVENT = "bench.fanout"
#: Seconds to wait for the last socket to have an event before counting the rest as missing.
EVENT_WAIT = 30.0


@dataclass
class Side:
    """One server's figures in one repeat (each a median over the repeat's events)."""

    to_last: float = 0.0
    first_to_last: float = 0.0
    to_first: float = 0.0
    frames_per_second: float = 0.0
    cpu_per_frame: float = 0.0
    memory_per_socket: float = 0.0
    idle_cpu: float = 0.0
    connect_seconds: float = 0.0
    missing: int = 0


@dataclass
class Repeat:
    ours: Side
    floor: Side


@dataclass
class Event:
    start: float
    first: float
    last: float
    cpu: float
    missing: int


class Server:
    """One side of the comparison: how to start it, open its sockets and fire an event."""

    name = ""

    def __init__(self, daphne: AsgiServer, count: int) -> None:
        self.daphne = daphne
        self.count = count
        self.warm: ClientConnection | None = None

    async def open_warm_up(self) -> ClientConnection:
        raise NotImplementedError

    async def open(self, count: int) -> list[ClientConnection]:
        raise NotImplementedError

    async def fire(self, seq: int) -> float:
        """Send event ``seq``; return the time the clock starts (``time.time()``)."""
        raise NotImplementedError

    async def close(self) -> None:
        return None


def frame_text(seq: int, scope_id: int) -> str:
    """The frame realtime sends for event ``seq`` (the floor sends the very same text)."""
    from realtime.sockets import protocol

    return protocol.event_frame(EVENT, {"seq": seq}, {}, scope_id)


class Realtime(Server):
    name = "realtime"

    def __init__(self, daphne: AsgiServer, count: int, members: Members) -> None:
        super().__init__(daphne, count)
        self.members = members

    def _opener(self, offset: int) -> Any:
        url = self.daphne.url("/api/ws")

        def opener(index: int) -> Any:
            token = self.members.tokens[offset + index]
            return harness.open_realtime(url, token, self.members.slug, [harness.CHANNEL])

        return opener

    async def open_warm_up(self) -> ClientConnection:
        connection: ClientConnection = await self._opener(self.count)(0)
        return connection

    async def open(self, count: int) -> list[ClientConnection]:
        return await harness.open_many(count, self._opener(0))

    async def fire(self, seq: int) -> float:
        return await asyncio.to_thread(publish, self.members.workspace_id, seq)


def publish(workspace_id: int, seq: int) -> float:
    from realtime.broadcast import broadcast_to_scope

    broadcast_to_scope(workspace_id, EVENT, {"seq": seq}, channels=[harness.CHANNEL])
    return time.time()


class Bare(Server):
    name = "bare ASGI"

    def __init__(self, daphne: AsgiServer, count: int, scope_id: int) -> None:
        super().__init__(daphne, count)
        self.scope_id = scope_id
        self.control: ClientConnection | None = None

    async def open_warm_up(self) -> ClientConnection:
        self.control = await harness.connect(self.daphne.url("/control"))
        return await harness.connect(self.daphne.url("/socket"))

    async def open(self, count: int) -> list[ClientConnection]:
        url = self.daphne.url("/socket")
        return await harness.open_many(count, lambda index: harness.connect(url))

    async def fire(self, seq: int) -> float:
        assert self.control is not None
        text = "fire " + frame_text(seq, self.scope_id)
        start = time.time()
        await self.control.send(text)
        return start

    async def close(self) -> None:
        if self.control is not None:
            # The control socket's ``done`` answers were never read: drop them with it.
            await harness.close_all([self.control])


def start_realtime(
    database: Database, settings: dict[str, Any], count: int, server: str = "daphne"
) -> AsgiServer:
    return AsgiServer.start(
        "tests.asgi:application", database.env(settings), f"fanout-{count}", kind=server
    )


def start_bare(database: Database, count: int, server: str = "daphne") -> AsgiServer:
    env = database.env({}, path=(harness.BENCH,))
    return AsgiServer.start("bare_asgi:application", env, f"fanout-bare-{count}", kind=server)


async def one_event(server: Server, readers: Readers, seq: int, idle_share: float) -> Event:
    arrivals = Arrivals(server.count)
    marker = f'"seq":{seq}}}'

    def sink(index: int, frame: str | bytes, arrived: float) -> None:
        if isinstance(frame, str) and marker in frame:
            arrivals.add(arrived)

    readers.sink = sink
    cpu_before = server.daphne.cpu()
    start = await server.fire(seq)
    await arrivals.wait(EVENT_WAIT)
    cpu_after = server.daphne.cpu()
    window = (max(arrivals.times) if arrivals.times else time.time()) - start
    times = arrivals.times or [start]
    return Event(
        start=start,
        first=min(times),
        last=max(times),
        cpu=max(cpu_after - cpu_before - idle_share * window, 0.0),
        missing=server.count - len(arrivals.times),
    )


async def measure_side(server: Server, events: int, pause: float) -> Side:
    """Memory, then ``events`` fan-outs (after one warm-up) on a fresh server."""
    side = Side()
    daphne = server.daphne
    warm = await server.open_warm_up()
    warm_readers = Readers([warm])
    warm_readers.start()
    # The warm-up socket is one more target: it hears every event, untimed.
    await server.fire(-1)
    await asyncio.sleep(0.5)
    await daphne.settle()
    before = daphne.rss()
    started = time.monotonic()
    connections = await server.open(server.count)
    side.connect_seconds = time.monotonic() - started
    readers = Readers(connections)
    readers.start()
    try:
        side.idle_cpu = await daphne.settle(window=1.0)
        side.memory_per_socket = (daphne.rss() - before) / server.count
        results: list[Event] = []
        for seq in range(events + 1):
            event = await one_event(server, readers, seq, side.idle_cpu)
            if seq > 0:  # the first one warms the path up
                results.append(event)
            await asyncio.sleep(harness.jittered(pause))
        side.to_last = statistics.median(e.last - e.start for e in results)
        side.to_first = statistics.median(e.first - e.start for e in results)
        side.first_to_last = statistics.median(e.last - e.first for e in results)
        side.frames_per_second = statistics.median(
            server.count / (e.last - e.start) for e in results
        )
        side.cpu_per_frame = statistics.median(e.cpu / server.count for e in results)
        side.missing = sum(e.missing for e in results)
    finally:
        await readers.stop()
        await warm_readers.stop()
        await server.close()
        await harness.close_all([*connections, warm])
    return side


async def run_side(
    kind: str,
    count: int,
    database: Database,
    settings: dict[str, Any],
    members: Members,
    args: argparse.Namespace,
) -> Side:
    daphne = (
        start_realtime(database, settings, count, args.server)
        if kind == "realtime"
        else start_bare(database, count, args.server)
    )
    try:
        server: Server = (
            Realtime(daphne, count, members)
            if kind == "realtime"
            else Bare(daphne, count, members.workspace_id)
        )
        return await measure_side(server, args.events, args.pause)
    finally:
        warnings = daphne.stop()
        if warnings:
            print(f"    ({kind} {args.server} logged {warnings} warning/error lines: {daphne.log})")


def show_side(label: str, side: Side) -> str:
    return (
        f"{label}: to last {harness.millis(side.to_last)} "
        f"(first→last {harness.millis(side.first_to_last)}), "
        f"{harness.per_second(side.frames_per_second)}, "
        f"CPU {harness.micros(side.cpu_per_frame)}/frame, "
        f"{harness.kib(side.memory_per_socket)}/socket, "
        f"idle CPU {side.idle_cpu:.1%}, connected in {side.connect_seconds:.1f} s"
        + (f", {side.missing} frames missing" if side.missing else "")
    )


async def measure(
    counts: Sequence[int],
    repeats: dict[int, int],
    database: Database,
    settings: dict[str, Any],
    members: Members,
    args: argparse.Namespace,
) -> dict[int, list[Repeat]]:
    results: dict[int, list[Repeat]] = {}
    for count in counts:
        print(f"\nN = {count:,} sockets, {repeats[count]} repeats", flush=True)
        for index in range(repeats[count]):
            order = ["realtime", "bare"] if index % 2 == 0 else ["bare", "realtime"]
            sides: dict[str, Side] = {}
            for kind in order:
                sides[kind] = await run_side(kind, count, database, settings, members, args)
            repeat = Repeat(sides["realtime"], sides["bare"])
            results.setdefault(count, []).append(repeat)
            print(f"  repeat {index + 1}/{repeats[count]}", flush=True)
            print("    " + show_side("realtime ", repeat.ours), flush=True)
            print("    " + show_side("bare ASGI", repeat.floor), flush=True)
    return results


@dataclass
class Row:
    label: str
    unit: Any
    pick: Any


ROWS = [
    Row("publish → last frame", harness.millis, lambda s: s.to_last),
    Row("publish → first frame", harness.millis, lambda s: s.to_first),
    Row("first → last frame", harness.millis, lambda s: s.first_to_last),
    Row("frames/s (N / publish → last)", harness.per_second, lambda s: s.frames_per_second),
    Row("server CPU per frame", harness.micros, lambda s: s.cpu_per_frame),
    Row("memory per idle socket", harness.kib, lambda s: s.memory_per_socket),
    Row("server CPU share, N idle", lambda v: f"{v:.1%}", lambda s: s.idle_cpu),
    Row("time to open N sockets", lambda v: f"{v:.1f} s", lambda s: s.connect_seconds),
]


def report(results: dict[int, list[Repeat]]) -> dict[str, Any]:
    print(
        "\nsummary: median [min - max] across repeats; ratio = realtime / floor per repeat "
        "(for frames/s, below 1 is slower; for times, CPU and memory, above 1 is more)"
    )
    summary: dict[str, Any] = {}
    for count, repeats in results.items():
        print(f"\n  N = {count:,} ({len(repeats)} repeats)")
        rows: dict[str, Any] = {}
        for row in ROWS:
            ours = [row.pick(r.ours) for r in repeats]
            floor = [row.pick(r.floor) for r in repeats]
            ratio = Spread.of(harness.ratios(ours, floor))
            print(f"    {row.label}")
            print(f"      realtime  {Spread.of(ours).show(row.unit)}")
            print(f"      bare ASGI {Spread.of(floor).show(row.unit)}")
            print(f"      ratio     {ratio.show(harness.times)}")
            rows[row.label] = {
                "realtime": Spread.of(ours).as_dict(),
                "floor": Spread.of(floor).as_dict(),
                "ratio": ratio.as_dict(),
            }
        capacity = Spread.of([1 / r.ours.cpu_per_frame for r in repeats if r.ours.cpu_per_frame])
        floor_capacity = Spread.of(
            [1 / r.floor.cpu_per_frame for r in repeats if r.floor.cpu_per_frame]
        )
        print(
            "    frames/s one core could send at that CPU cost: "
            f"realtime {capacity.show(harness.per_second)}, "
            f"bare ASGI {floor_capacity.show(harness.per_second)}"
        )
        missing = sum(r.ours.missing + r.floor.missing for r in repeats)
        print(f"    frames missing: {missing}")
        rows["cpu_capacity"] = {"realtime": capacity.as_dict(), "floor": floor_capacity.as_dict()}
        rows["missing"] = missing
        summary[str(count)] = rows
    return summary


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--sockets",
        default="1000,5000",
        help="comma-separated socket counts (default 1000,5000)",
    )
    parser.add_argument("--repeat", type=int, default=5, help="repeats of each count")
    parser.add_argument(
        "--repeat-large",
        type=int,
        default=None,
        help="repeats for counts of 5,000 and more (default: --repeat)",
    )
    parser.add_argument("--events", type=int, default=5, help="timed events per repeat")
    parser.add_argument(
        "--pause", type=float, default=0.3, help="mean seconds between events (jittered)"
    )
    parser.add_argument(
        "--polling-interval", type=float, default=0.01, help="the table transport's interval"
    )
    parser.add_argument(
        "--server",
        choices=sorted(harness.SERVER_COMMANDS),
        default="daphne",
        help="the ASGI server of both sides",
    )
    harness.add_set_option(parser)
    parser.add_argument("--keep", action="store_true", help="keep the SQLite file afterwards")
    parser.add_argument("--json", type=Path, help="also write the summary to this file")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    counts = [int(part) for part in args.sockets.split(",") if part.strip()]
    large = args.repeat if args.repeat_large is None else args.repeat_large
    repeats = {count: large if count >= 5000 else args.repeat for count in counts}
    limit = harness.raise_open_files(max(counts) * 2 + 1024)
    if limit < max(counts) + 256:
        raise SystemExit(f"the open-files limit ({limit}) is too low for {max(counts)} sockets")
    database = Database.pick("sqlite", "fanout")
    settings = {
        "REALTIME_TRANSPORT": "table",
        "REALTIME_POLLING_INTERVAL": args.polling_interval,
        **harness.parse_settings(args.set),
    }
    harness.migrate(database, settings)
    harness.setup_django(database, settings)
    started = time.monotonic()
    harness.header(f"fan-out benchmark (table transport, {args.server})", harness.server_version())
    print(
        f"settings: polling interval {args.polling_interval:g} s; {args.events} timed events "
        f"per repeat, {args.pause:g} s apart on average; repeats "
        + ", ".join(f"{repeats[c]} at N = {c:,}" for c in counts),
        flush=True,
    )
    members = harness.make_members(PREFIX, max(counts) + 1)
    try:
        results = asyncio.run(measure(counts, repeats, database, settings, members, args))
    finally:
        if args.keep:
            print(f"kept {database.name}")
    summary = {
        "database": harness.server_version(),
        "code": harness.code_version(),
        "settings": settings,
        "server": args.server,
        "events": args.events,
        "results": report(results),
    }
    print(f"\nload average after: {harness.load_average()}")
    print(f"took {time.monotonic() - started:.0f} s")
    harness.write_json(args.json, summary)
    if not args.keep:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{database.name}{suffix}").unlink(missing_ok=True)


if __name__ == "__main__":
    main()
