"""The garbage collector of the server process it is loaded into, logged and, if asked, tuned;
and, if asked, its threads' switch interval.

The benchmarks that take ``--gc``, ``--gc-threshold`` or ``--switch-interval`` put this
directory on the servers' ``PYTHONPATH``, and Python imports ``sitecustomize`` at start-up, so
the same server command, realtime's or the bare floor's, is observed or tuned without a line
of either application changed:

* with ``REALTIME_BENCH_GC_LOG`` naming a directory, each collection appends one JSON line to
  ``gc-<pid>.jsonl`` there: when it ended (``time.time()``), its generation, and the CPU time
  of the thread it ran on (``harness.collections`` sums them over a window);
* with ``REALTIME_BENCH_GC_THRESHOLD`` (``"700,10,10"``, say), ``gc.set_threshold`` is called
  with those numbers, as a project would in its ASGI module;
* with ``REALTIME_BENCH_SWITCH_INTERVAL`` (``"0.0005"``, say), ``sys.setswitchinterval`` is
  called with it, as a project would too.
"""

import gc
import json
import os
import sys
import threading
import time

_threshold = os.environ.get("REALTIME_BENCH_GC_THRESHOLD")
if _threshold:
    gc.set_threshold(*(int(part) for part in _threshold.split(",")))

_switch_interval = os.environ.get("REALTIME_BENCH_SWITCH_INTERVAL")
if _switch_interval:
    sys.setswitchinterval(float(_switch_interval))

_directory = os.environ.get("REALTIME_BENCH_GC_LOG")
if _directory:
    _log = open(  # noqa: SIM115 - open for the life of the process
        os.path.join(_directory, f"gc-{os.getpid()}.jsonl"), "a", buffering=1
    )
    _started = threading.local()

    def _on_collection(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            _started.cpu = time.thread_time()
            return
        cpu = time.thread_time() - getattr(_started, "cpu", time.thread_time())
        line = {"at": time.time(), "generation": info["generation"], "cpu": cpu}
        _log.write(json.dumps(line) + "\n")

    gc.callbacks.append(_on_collection)
