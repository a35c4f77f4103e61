"""The example project's logs under daphne, as an operator reads them: every realtime line
once (daphne configures the root logger too, so a propagating ``realtime`` logger printed
each line twice)."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import pytest
import websockets

from tests.example import ExampleProject
from tests.helpers import WAIT

pytestmark = pytest.mark.server  # a real daphne serves the example project

REFUSED = "realtime: refused a socket: Invalid authentication format"
MARKER_LINE = "realtime: refused a socket: Invalid authentication message"


async def test_the_example_project_under_daphne_prints_each_realtime_line_once() -> None:
    with tempfile.TemporaryDirectory() as workdir:
        project = ExampleProject(Path(workdir))
        project.manage("migrate", "--no-input")
        project.start_daphne()
        try:
            for frame in ("not json", '{"type": "hello"}'):
                async with websockets.connect(project.socket_url, open_timeout=WAIT) as socket:
                    await socket.send(frame)
                    await socket.wait_closed()
            # The second refusal is the marker: once it is in the log, so is the first.
            async with asyncio.timeout(WAIT):
                while True:  # a file has no event to wait on: read it again
                    if MARKER_LINE in project.log.read_text():
                        break
                    await asyncio.sleep(0.05)
        finally:
            project.stop()
        log = project.log.read_text()
    assert log.count(REFUSED) == 1, log
    assert log.count(MARKER_LINE) == 1, log
