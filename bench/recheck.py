"""Benchmark one recheck round: the statements and the CPU it costs per 1,000 sockets.

Run from the project root::

    .venv/bin/python bench/recheck.py --database sqlite
    .venv/bin/python bench/recheck.py --database postgresql --sockets 5000

``--sockets`` accounts (``bench-recheck-00000``...), each a member of one workspace, each with
a token; one socket each, reading that workspace, as a worker's manager holds them. A round is
what the manager's housekeeping runs for its due sockets (``realtime.sockets.access.recheck``),
here in this process, on one connection kept open across rounds (as realtime's threads keep
theirs), in batches of 200 sockets as the manager sends them.

Ours: the default ``RealtimeAuth``, answering each batch with its bulk hooks. The baseline, in
the same run: the same service with ``user_of_token`` overridden by a method that only calls
the default, which makes the round ask the single hooks socket by socket (what a custom auth
class implementing only those gets, and what every round cost before the bulk hooks). For
each: the statements of a round (counted by a ``connection.execute_wrapper``), the CPU time
of this process over the round (``time.process_time``: the worker's side of it, the hooks and
the driver; the database server's work is not counted) and its wall time. Rounds alternate between
the two; each figure is the median [min - max] over ``--repeat`` rounds.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

import harness
from harness import Database, Spread

PREFIX = "bench-recheck"
BATCH = 200


def one_round(auth: Any, questions: list[Any]) -> tuple[int, float, float]:
    """Recheck every socket as the manager does; return statements, CPU and wall seconds."""
    from django.db import connection

    from realtime.sockets import access

    statements = 0

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        nonlocal statements
        statements += 1
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        cpu, wall = time.process_time(), time.perf_counter()
        for start in range(0, len(questions), BATCH):
            answers = access.recheck(auth, questions[start : start + BATCH])
            assert all(isinstance(answer, list) and answer for answer in answers), answers[:3]
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return statements, cpu, wall


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--database", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--sockets", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args(argv)
    database = Database.pick(args.database, "recheck")
    harness.migrate(database, {})
    harness.setup_django(database, {})
    harness.header("recheck round benchmark", harness.server_version())

    from realtime.auth import RealtimeAuth
    from realtime.encoding import normal_id
    from realtime.sockets.protocol import read_scopes

    class OneByOne(RealtimeAuth):
        """The default answers, asked socket by socket (see the module docstring)."""

        def user_of_token(self, token: str) -> Any | None:
            return super().user_of_token(token)

    members = harness.make_members(PREFIX, args.sockets)
    try:
        ask = read_scopes({"scope": members.slug})
        questions = [
            (normal_id(pk), token, ask, [members.workspace_id])
            for pk, token in zip(members.user_ids, members.tokens, strict=True)
        ]
        per = 1000 / args.sockets
        sides: dict[str, list[tuple[int, float, float]]] = {"bulk": [], "one by one": []}
        services = {"bulk": RealtimeAuth(), "one by one": OneByOne()}
        one_round(services["bulk"], questions)  # warm-up: the connection, the caches
        for index in range(args.repeat):
            order = list(services) if index % 2 == 0 else list(reversed(services))
            for name in order:
                sides[name].append(one_round(services[name], questions))
        print(f"\n{args.sockets:,} sockets, per 1,000 sockets, median [min - max] of {args.repeat}")
        print("| measurement | bulk hooks | one by one (baseline) | ratio |")
        print("| --- | --- | --- | --- |")
        for label, column, unit in (
            ("statements per round", 0, lambda v: f"{v:,.0f}"),
            ("worker CPU per round", 1, harness.millis),
            ("wall time per round", 2, harness.millis),
        ):
            ours = [run[column] * per for run in sides["bulk"]]
            base = [run[column] * per for run in sides["one by one"]]
            ratio = Spread.of(harness.ratios(ours, base))
            print(
                f"| {label} | {Spread.of(ours).show(unit)} | {Spread.of(base).show(unit)} | "
                f"{ratio.show(harness.times)} |"
            )
    finally:
        if database.vendor == "postgresql":
            harness.drop_members(PREFIX)
    print(f"load average after: {harness.load_average()}")


if __name__ == "__main__":
    main()
