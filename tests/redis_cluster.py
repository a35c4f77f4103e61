"""A Redis Cluster of the test run's own: three primaries and a replica of each, on free ports.

Started once per test session that asks for it (about two seconds): each node a
``redis-server --cluster-enabled yes`` without persistence, in a temporary folder, then
``redis-cli --cluster create`` with one replica per primary, then a wait until every node says
``cluster_state:ok``. Failover is quick (``cluster-node-timeout`` 1,000 ms), so a test that
kills a primary waits for ``cluster_state:ok`` again rather than for a fixed time.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers import WAIT
from tests.live import free_port

#: Primaries, and replicas of each.
PRIMARIES = 3
REPLICAS = 1
NODE_TIMEOUT_MS = 1000


def available() -> bool:
    return shutil.which("redis-server") is not None and shutil.which("redis-cli") is not None


@dataclass
class Node:
    port: int
    #: The cluster bus's port (by default the port + 10,000, which may not exist).
    bus_port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass
class RedisCluster:
    """The nodes of one cluster; ``url`` is what ``REALTIME_REDIS_URL`` takes."""

    folder: Path
    nodes: list[Node] = field(default_factory=list)

    @classmethod
    def start(cls) -> RedisCluster:
        cluster = cls(Path(tempfile.mkdtemp(prefix="realtime-redis-cluster-")))
        try:
            cluster._create()
        except BaseException:
            cluster.stop()  # no node of a cluster that did not start is left running
            raise
        return cluster

    def _create(self) -> None:
        self.nodes = []
        for _ in range(PRIMARIES * (1 + REPLICAS)):
            self.nodes.append(Node(*self._free_ports()))
        for node in self.nodes:
            self.launch(node)
        for node in self.nodes:
            self._wait_answering(node)
        subprocess.run(
            ["redis-cli", "--cluster", "create", *(node.address for node in self.nodes),
             "--cluster-replicas", str(REPLICAS), "--cluster-yes"],
            check=True, capture_output=True, timeout=WAIT,
        )  # fmt: skip
        self.wait_ok()

    def _free_ports(self) -> tuple[int, int]:
        """A port and a bus port free now, and no other node's."""
        taken = {port for node in self.nodes for port in (node.port, node.bus_port)}
        found: list[int] = []
        while len(found) < 2:
            port = free_port()
            if port not in taken and port not in found:
                found.append(port)
        return found[0], found[1]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(node.address for node in self.nodes[:PRIMARIES])

    def launch(self, node: Node) -> None:
        """Start ``node``'s server (again: it keeps its cluster configuration file)."""
        folder = self.folder / str(node.port)
        folder.mkdir(exist_ok=True)
        node.process = subprocess.Popen(
            ["redis-server", "--port", str(node.port), "--bind", "127.0.0.1",
             "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
             "--cluster-port", str(node.bus_port), "--repl-diskless-sync-delay", "0",
             "--cluster-node-timeout", str(NODE_TIMEOUT_MS), "--save", "", "--appendonly", "no",
             "--dir", str(folder), "--logfile", "redis.log"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def launch_blank(self, node: Node) -> None:
        """Restart ``node`` without its cluster configuration, as a node whose volume was lost
        comes back: it knows no other node and serves no slot (``CLUSTER SLOTS`` is empty)
        until joined again; ``restore`` starts it again as it was. Its data goes too: a
        replica keeps what its primary sent in ``dump.rdb``, and a node without configuration
        takes the slots of the keys it loads."""
        folder = self.folder / str(node.port)
        self.kill(node)
        (folder / "nodes.conf").rename(folder / "nodes.conf.kept")
        (folder / "dump.rdb").unlink(missing_ok=True)
        self.launch(node)
        self._wait_answering(node)

    def restore(self, node: Node) -> None:
        """Start ``node``, launched blank, again with its cluster configuration."""
        folder = self.folder / str(node.port)
        self.kill(node)
        (folder / "nodes.conf.kept").replace(folder / "nodes.conf")
        self.launch(node)
        self._wait_answering(node)

    def cli(self, node: Node, *command: str) -> str:
        answer = subprocess.run(
            ["redis-cli", "-p", str(node.port), *command],
            capture_output=True, text=True, timeout=WAIT,
        )  # fmt: skip
        return answer.stdout

    def kill(self, node: Node) -> None:
        """Kill ``node`` at once (``SIGKILL``: no goodbye to the others)."""
        if node.process is not None:
            node.process.kill()
            node.process.wait(timeout=WAIT)
            node.process = None

    def primaries(self) -> list[Node]:
        """The nodes that serve slots now."""
        alive = [node for node in self.nodes if node.process is not None]
        return [node for node in alive if "role:master" in self.cli(node, "INFO", "replication")]

    def primary_of(self, key: str) -> Node:
        """The node serving ``key``'s slot now (as the cluster's view says)."""
        asked = self.primaries()[0]
        slot = int(self.cli(asked, "CLUSTER", "KEYSLOT", key).strip())
        by_address = {node.address: node for node in self.nodes}
        for line in self.cli(asked, "CLUSTER", "NODES").splitlines():
            parts = line.split()
            if "master" not in parts[2] or "fail" in parts[2]:
                continue
            for span in parts[8:]:
                low, _, high = span.partition("-")
                if low.isdigit() and int(low) <= slot <= int(high or low):
                    return by_address[parts[1].split("@")[0]]
        raise AssertionError(f"no primary serves slot {slot}")

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Wait until every running node says ``cluster_state:ok`` and sees every slot served
        by a running primary (after a kill: its replica took over), and every replica is in
        sync with its primary."""
        deadline = time.monotonic() + timeout
        while True:
            alive = [node for node in self.nodes if node.process is not None]
            running = {node.address for node in alive}
            infos = [self.cli(node, "CLUSTER", "INFO") for node in alive]
            serving = [self._serving(node) for node in alive]
            replication = [self.cli(node, "INFO", "replication") for node in alive]
            if (
                all("cluster_state:ok" in info for info in infos)
                and all(owners <= running for owners in serving)
                # A replica not synced yet could not take over from its primary.
                and all("role:master" in r or "master_link_status:up" in r for r in replication)
            ):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"the cluster is not ok after {timeout} s: {infos}")
            time.sleep(0.1)

    def _serving(self, asked: Node) -> set[str]:
        """The addresses of the primaries that serve slots, in ``asked``'s view."""
        owners = set()
        for line in self.cli(asked, "CLUSTER", "NODES").splitlines():
            parts = line.split()
            if len(parts) > 8 and "master" in parts[2]:
                owners.add(parts[1].split("@")[0])
        return owners

    def flush(self) -> None:
        for node in self.primaries():
            self.cli(node, "FLUSHALL")

    def stop(self) -> None:
        for node in self.nodes:
            self.kill(node)
        shutil.rmtree(self.folder, ignore_errors=True)

    def _wait_answering(self, node: Node) -> None:
        """Wait until ``node`` answers. A server that exits first lost one of its ports to
        another process between the pick and its start (the suite's servers and clients
        take ports all the time): it starts again on others."""
        deadline = time.monotonic() + WAIT
        while self.cli(node, "PING").strip() != "PONG":
            if time.monotonic() > deadline:
                raise AssertionError(f"redis-server on {node.port} did not start")
            if node.process is not None and node.process.poll() is not None:
                node.process = None
                node.port, node.bus_port = self._free_ports()
                self.launch(node)
            time.sleep(0.05)
