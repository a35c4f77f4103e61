"""The soak benchmark's worker: the test application, with its garbage collector watched.

``tests.asgi:application`` served as is, plus ``GET /_bench/gc``, which answers the pauses of
every collection since the previous call (seconds, by generation) and resets them. With
``REALTIME_BENCH_GC_FREEZE=1`` the worker calls ``gc.freeze()`` once it has imported
everything (Django, the project, realtime): what exists then is never scanned again, so the
collections of a long-running worker walk only what it made since.
"""

from __future__ import annotations

import gc
import json
import os
import time
from typing import Any

from tests.asgi import application as realtime_application

#: Collections since the last read: (generation, seconds).
pauses: list[tuple[int, float]] = []
_started: list[float] = []


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _started.append(time.perf_counter())
    elif _started:
        pauses.append((int(info.get("generation", 0)), time.perf_counter() - _started.pop()))


gc.callbacks.append(_on_gc)

# Whatever the worker needs at run time, imported before the freeze.
import realtime.sockets.consumer  # noqa: E402
import realtime.transports.table  # noqa: E402, F401

FROZEN = os.environ.get("REALTIME_BENCH_GC_FREEZE") == "1"
if FROZEN:
    gc.collect()
    gc.freeze()


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "http" and scope.get("path") == "/_bench/gc":
        taken = pauses[:]
        del pauses[: len(taken)]
        body = json.dumps(
            {"frozen": FROZEN, "permanent": gc.get_freeze_count(), "pauses": taken}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})
        return
    await realtime_application(scope, receive, send)
