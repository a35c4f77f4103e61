"""Benchmark one large publish on Redis: how long each script call blocks the server.

Run from the project root::

    .venv/bin/python bench/large_publish.py                  # 100,000 messages, 3 runs
    .venv/bin/python bench/large_publish.py --messages 20000 --runs 1   # short

A Lua script blocks every client of its Redis server while it runs (a cache, a channel layer
sharing it), so the Redis transport publishes a large transaction in chunks of
``PUBLISH_CHUNK`` messages, one script call each. This publishes ``--messages`` messages of
about 170 bytes over 10 channels through ``RedisTransport.publish`` on a redis-server of the
run's own, and reads each call's time from Redis's own slow log (the server's clock: what
another client waits), beside the same publish in one call (the floor of what chunking
costs, and what it replaces).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness
from harness import Spread

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def one_publish(url: str, messages: int, chunk: int) -> tuple[int, float, float, float]:
    """Publish ``messages`` in chunks of ``chunk``; (calls, longest ms, median ms, seconds)."""
    import redis

    from realtime import limits
    from realtime.transports.redis import RedisTransport

    admin = redis.Redis.from_url(url)
    admin.flushall()
    # Calls of 0.5 ms or more only: the commands a script runs are logged too, in microseconds.
    admin.config_set("slowlog-log-slower-than", 500)
    admin.config_set("slowlog-max-len", 10_000)
    admin.slowlog_reset()
    transport = RedisTransport(url=url)
    pad = b"x" * 150
    batch = [(f"big{n % 10}", b'{"n": %d, "pad": "%s"}' % (n, pad)) for n in range(messages)]
    kept, limits.PUBLISH_CHUNK = limits.PUBLISH_CHUNK, chunk  # type: ignore[misc]
    try:
        start = time.monotonic()
        transport.publish(batch)
        took = time.monotonic() - start
    finally:
        limits.PUBLISH_CHUNK = kept  # type: ignore[misc]
        transport.close()
    calls = sorted(
        int(entry["duration"]) / 1000
        for entry in admin.slowlog_get(10_000)
        if bytes(entry["command"]).startswith(b"EVALSHA")
    )
    admin.close()
    return len(calls), calls[-1], calls[len(calls) // 2], took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from realtime import limits

    port = harness.free_port()
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", tempfile.mkdtemp(prefix="bench-redis-")],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        time.sleep(0.5)
        url = f"redis://127.0.0.1:{port}/0"
        harness.header(f"one publish of {args.messages:,} messages", "Redis")
        ms = lambda v: f"{v:.1f} ms"  # noqa: E731
        seconds = lambda v: f"{v:.2f} s"  # noqa: E731
        for label, chunk in (
            (f"chunks of {limits.PUBLISH_CHUNK}", limits.PUBLISH_CHUNK),
            ("one call (floor)", args.messages),
        ):
            runs = [one_publish(url, args.messages, chunk) for _ in range(args.runs)]
            longest = Spread.of([r[1] for r in runs]).show(ms)
            median = Spread.of([r[2] for r in runs]).show(ms)
            whole = Spread.of([r[3] for r in runs]).show(seconds)
            print(
                f"  {label}: {runs[0][0]} call(s); longest {longest}, median {median}; "
                f"whole publish {whole}",
                flush=True,
            )
    finally:
        server.kill()


if __name__ == "__main__":
    main()
