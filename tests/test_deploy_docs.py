"""The process setup of ``docs/deploying.md`` is valid as printed.

The systemd units are the page's ``ini`` blocks whose first line names their file; the proxy
is its ``nginx`` block. They are parsed and checked for what the page relies on, and verified
with ``systemd-analyze verify`` (with the page's ``/srv/mysite`` pointing at a stand-in
``daphne``, since verify wants the command to exist).
"""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT

DEPLOYING = ROOT / "docs" / "deploying.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)
UNIT_PATH = re.compile(r"#\s*(/etc/systemd/system/(\S+))\s*$")
APP_DIR = "/srv/mysite"


def page_blocks(language: str) -> list[str]:
    return [code for lang, code in FENCE.findall(DEPLOYING.read_text()) if lang == language]


def units() -> dict[str, str]:
    """The page's unit files by name."""
    found = {}
    for code in page_blocks("ini"):
        match = UNIT_PATH.match(code.splitlines()[0])
        if match:
            found[match[2]] = code
    return found


def parsed(text: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(text)
    return parser


def worker_template() -> tuple[str, configparser.ConfigParser]:
    (name,) = [name for name in units() if name.endswith("@.service")]
    return name, parsed(units()[name])


def target() -> tuple[str, configparser.ConfigParser]:
    (name,) = [name for name in units() if name.endswith(".target")]
    return name, parsed(units()[name])


def instance_ports() -> list[str]:
    template, _ = worker_template()
    _, unit = target()
    prefix = template.removesuffix(".service")
    wanted = unit["Unit"]["Wants"].split()
    assert wanted, "the target starts no worker"
    assert all(name.startswith(prefix) and name.endswith(".service") for name in wanted)
    return [name.removeprefix(prefix).removesuffix(".service") for name in wanted]


def test_the_worker_unit_runs_daphne_on_its_instance_port_and_restarts() -> None:
    _, unit = worker_template()
    target_name, _ = target()
    service = unit["Service"]
    command = service["ExecStart"].split()
    assert command[0] == f"{APP_DIR}/.venv/bin/daphne"
    assert command[command.index("--port") + 1] == "%i"
    assert command[-1] == "mysite.asgi:application"
    assert service["Restart"] == "always"
    assert service["WorkingDirectory"] == APP_DIR
    assert service["User"] != "root"
    assert unit["Install"]["WantedBy"] == target_name
    assert unit["Unit"]["PartOf"] == target_name


def test_the_target_starts_workers_on_distinct_ports_at_boot() -> None:
    ports = instance_ports()
    assert len(ports) >= 2
    assert len(set(ports)) == len(ports)
    assert all(port.isdigit() for port in ports)
    _, unit = target()
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_the_proxy_balances_over_exactly_the_workers_and_upgrades_the_socket() -> None:
    (nginx,) = page_blocks("nginx")
    upstream = re.search(r"upstream \w+ \{(.*?)\}", nginx, re.DOTALL)
    assert upstream is not None
    assert re.findall(r"server 127\.0\.0\.1:(\d+);", upstream[1]) == instance_ports()
    socket_route = re.search(r"location /api/ws \{(.*?)\}", nginx, re.DOTALL)
    assert socket_route is not None
    assert "proxy_set_header Upgrade $http_upgrade;" in socket_route[1]
    assert 'proxy_set_header Connection "upgrade";' in socket_route[1]
    assert "proxy_set_header Host $host;" in socket_route[1]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_systemd_analyze_verifies_the_units_without_a_word(tmp_path: Path) -> None:
    app = tmp_path / "srv-mysite"
    (app / ".venv" / "bin").mkdir(parents=True)
    daphne = app / ".venv" / "bin" / "daphne"
    daphne.write_text("#!/bin/sh\n")
    daphne.chmod(0o755)
    for name, text in units().items():
        (tmp_path / name).write_text(text.replace(APP_DIR, str(app)))
    template, _ = worker_template()
    target_name, _ = target()
    instances = [template.replace("@.", f"@{port}.") for port in instance_ports()]
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", target_name, *instances],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout + done.stderr == ""
