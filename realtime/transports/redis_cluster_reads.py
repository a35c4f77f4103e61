"""The Redis transport's stream reads on a Redis Cluster: each sent to the primary serving
its key's slot, on a client of that node alone.

Which primary serves a slot is what the listener's map of slots says
(``ClusterListener.node_of``): one map for a worker's subscriptions and its reads, read
from any node that answers and kept until another is read. redis-py's asyncio
``RedisCluster`` is not used: after any connection error its next command reads the map
again and then sends ``COMMAND`` to its default node (the first primary of its map), so
while that primary is in its failover window (dead, its replica not promoted yet) every
command fails, a healthy slot's too, and a client that has not started yet cannot start.
Here a read depends only on the node serving its slot: while one primary's failover is under
way, the streams of the others are read as usual (their follows anchored, their gaps filled).

A read refused because its slot is served elsewhere now (``MOVED``) is sent to the node
named, once, and the listener reads the map again; one refused with ``ASK`` (its slot is
being migrated, its key already moved) is sent to the node named after ``ASKING``. A node
whose connection fails (after one more try on a fresh connection: reads may be repeated)
makes the listener read the map again; the read fails, and its caller (the sequencer, a
follow's anchor) tries again, as on a standalone server. A node that lacks the script
(restarted, promoted) is given it.

A node's client is let go of, its connections closed, when a read on it fails with a
connection error, and when a map read no longer names it as a primary (its replica took
over, or it serves no slot now): its pooled connections would otherwise stay open for good
(half-closed by a dead node), one more set at each failover. Each close runs in a task of its
own, held by the listener, whose ``close`` (after this ``aclose``) waits for it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis
import redis.asyncio
from redis.exceptions import AskError, ClusterDownError, MovedError, NoScriptError

from realtime.transports.redis_cluster_listener import ClusterListener, SlotMap


class ClusterReads:
    """Scripts and key commands run on the node serving each key's slot."""

    def __init__(
        self, slots: ClusterListener, client: Callable[[str, int], redis.asyncio.Redis]
    ) -> None:
        #: The listener whose map of slots says which node serves a key.
        self.slots = slots
        #: ``client(host, port)`` builds an asyncio client of one node (reads may be repeated).
        self.client = client
        #: Node name (``host:port``) → its client, kept for its pooled connections.
        self._clients: dict[str, redis.asyncio.Redis] = {}
        slots.on_map.append(self._keep_primaries)

    def register_script(self, script: str) -> Callable[..., Awaitable[Any]]:
        """``script`` as ``run(keys=..., args=...)``: run on the node serving ``keys[0]``."""
        sha = hashlib.sha1(script.encode(), usedforsecurity=False).hexdigest()

        async def run(*, keys: Sequence[str], args: Sequence[Any]) -> Any:
            return await self._script(script, sha, keys, args)

        return run

    async def pexpire_each(self, keys: Sequence[str], milliseconds: int) -> None:
        """``PEXPIRE`` each of ``keys``, one pipelined round trip per node; a node's failure
        spares the others' keys, and the first failure is raised afterwards."""
        by_node: dict[str, list[str]] = {}
        for key in keys:
            by_node.setdefault(await self._node_of(key), []).append(key)
        failure: Exception | None = None
        for node, its_keys in by_node.items():
            client = self._on(node)
            try:
                async with client.pipeline(transaction=False) as pipe:
                    for key in its_keys:
                        pipe.pexpire(key, milliseconds)
                    await pipe.execute()
            except redis.RedisError as exc:
                self._failed(node, client, exc)
                failure = failure or exc
        if failure is not None:
            raise failure

    async def aclose(self) -> None:
        """Let go of every node's client: the listener's ``close``, next, waits for them."""
        for node in list(self._clients):
            self._let_go(node)

    async def _script(self, script: str, sha: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        node = await self._node_of(keys[0])
        client = self._on(node)
        try:
            try:
                return await self._evalsha(client, script, sha, keys, args)
            except AskError as exc:  # MOVED too (its subclass): sent once where it says
                moved = isinstance(exc, MovedError)
                if moved:
                    self.slots.look_again()
                node = f"{exc.host}:{exc.port}"
                client = self._on(node)
                return await self._evalsha(client, script, sha, keys, args, asking=not moved)
        except redis.RedisError as exc:
            self._failed(node, client, exc)
            raise

    async def _evalsha(
        self,
        client: redis.asyncio.Redis,
        script: str,
        sha: str,
        keys: Sequence[str],
        args: Sequence[Any],
        *,
        asking: bool = False,
    ) -> Any:
        """``script`` on ``client``'s node (after ``ASKING``: a key being migrated to it),
        given to the node first if it lacks it."""
        try:
            return await _evalsha_on(client, sha, keys, args, asking=asking)
        except NoScriptError:
            await client.script_load(script)
        return await _evalsha_on(client, sha, keys, args, asking=asking)

    async def _node_of(self, key: str) -> str:
        node = await self.slots.node_of(key)
        if node is None:
            raise ClusterDownError(f"no Redis Cluster node is known to serve {key!r}")
        return node

    def _on(self, node: str) -> redis.asyncio.Redis:
        client = self._clients.get(node)
        if client is None:
            host, _, port = node.rpartition(":")
            client = self._clients[node] = self.client(host, int(port))
        return client

    def _failed(self, node: str, client: redis.asyncio.Redis, exc: Exception) -> None:
        """A node that failed, or refused a key's slot, may no longer serve it: read the map
        again (a slot being migrated, ``ASK``, is still where the map says). A client whose
        connection failed is let go of: the node may be dead, its other pooled connections
        with it (the next read on the node builds a client afresh)."""
        if isinstance(exc, redis.ConnectionError | redis.TimeoutError | MovedError):
            self.slots.look_again()
        if isinstance(exc, redis.ConnectionError) and self._clients.get(node) is client:
            self._let_go(node)

    def _keep_primaries(self, slots: SlotMap) -> None:
        """Let go of the clients of the nodes that serve no slot in the map just read."""
        for node in self._clients.keys() - set(slots.owners):
            self._let_go(node)

    def _let_go(self, node: str) -> None:
        """Drop ``node``'s client, and hand it to the listener to close."""
        self.slots.let_go(self._clients.pop(node))


async def _evalsha_on(
    client: redis.asyncio.Redis, sha: str, keys: Sequence[str], args: Sequence[Any], *, asking: bool
) -> Any:
    """``EVALSHA`` on one connection of ``client``, after ``ASKING`` if ``asking`` (which holds
    for the next command of its connection only)."""
    async with client.pipeline(transaction=False) as pipe:
        if asking:
            pipe.execute_command("ASKING")
        pipe.evalsha(sha, len(keys), *keys, *args)
        return (await pipe.execute())[-1]
