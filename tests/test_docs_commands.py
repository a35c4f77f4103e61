"""The shell lines of docs/javascript-client.md that try the client against the example
project, run as written in a checkout (``python`` the suite's own) on a fresh example database:
the token line leaves a token of alice's in ``REALTIME_TOKEN`` (and nothing else), the write
line makes the contact the page says. (Its Node.js scripts run in jstests/package.test.mjs;
the quickstart's blocks in tests/installed/test_quickstart.py.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.example import COMMAND_WAIT, ExampleProject
from tests.helpers import ROOT

PAGE = ROOT / "docs" / "javascript-client.md"
TOKEN_LINE = 'export REALTIME_TOKEN="$(python manage.py realtime_token alice)"'


def sh_blocks() -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```$", PAGE.read_text(), re.MULTILINE | re.DOTALL)


@pytest.fixture(scope="module")
def example() -> Iterator[ExampleProject]:
    with tempfile.TemporaryDirectory() as workdir:
        project = ExampleProject(Path(workdir))
        project.prepare()
        yield project


def bash(example: ExampleProject, script: str) -> str:
    """``script`` run by bash in the checkout, ``python`` being this interpreter."""
    bin_dir = Path(tempfile.mkdtemp())
    python = bin_dir / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    env = {**example.env, "PATH": f"{bin_dir}{os.pathsep}{example.env['PATH']}"}
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_WAIT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_token_line_exports_a_token_of_alice_and_nothing_else(
    example: ExampleProject,
) -> None:
    (block,) = [block for block in sh_blocks() if "REALTIME_TOKEN=" in block]
    first = block.splitlines()[0]
    assert first == TOKEN_LINE
    token = bash(example, f'{first}\nprintf %s "$REALTIME_TOKEN"')
    assert re.fullmatch(r"[\w:.-]+", token), token
    named = example.shell(
        f"from realtime.auth import get_auth; print(get_auth().user_of_token({token!r}).username)"
    )
    assert named.strip() == "alice"


def test_the_write_line_adds_the_contact_the_page_shows(example: ExampleProject) -> None:
    (block,) = [block for block in sh_blocks() if "manage.py shell -c" in block]
    bash(example, block)
    found = example.shell(
        "from example_project.crm.models import Contact; "
        "print(Contact.objects.filter(workspace__slug='acme', name='Zed').count())"
    )
    assert found.strip() == "1"
