"""Keep cores busy while a test run goes on: ``python -m tests.cpu_load 2``.

The stall long run (``REALTIME_CPU_LOAD``, see ``tests/conftest.py``) starts it, so that the
servers' event loops and the stall watch compete for the CPU as on a loaded host. It starts one
spinning child per core asked for and stops them when its standard input closes, which happens
when the run that started it ends, however it ends; a child whose parent is gone (killed) stops
by itself.
"""

from __future__ import annotations

import os
import subprocess
import sys


def spin(parent: int) -> None:
    """Burn one core for as long as ``parent`` lives."""
    while os.getppid() == parent:
        for _ in range(100_000):
            pass


def main(cores: int) -> None:
    children = [
        subprocess.Popen([sys.executable, "-m", "tests.cpu_load", "--spin", str(os.getpid())])
        for _ in range(cores)
    ]
    try:
        sys.stdin.read()  # until the run closes it
    finally:
        for child in children:
            child.terminate()
        for child in children:
            child.wait()


if __name__ == "__main__":
    if sys.argv[1] == "--spin":
        spin(int(sys.argv[2]))
    else:
        main(int(sys.argv[1]))
