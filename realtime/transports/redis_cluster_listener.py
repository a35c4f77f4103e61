"""The Redis transport's Pub/Sub on a Redis Cluster: one connection per node it needs.

A shard channel is served by the primary that owns its slot, and only there (sharded Pub/Sub:
``SSUBSCRIBE`` on that node). So a worker holds one ``RedisListener`` per node that serves a
channel it follows, not one per node of the Cluster: each with its own heartbeat,
reconnection backoff, logs (``Outage``, naming the node) and stall bound, and each
subscription it confirms followed by a gap fill, exactly as on a standalone server.

Who serves a slot is read from the Cluster's map of slots: ``CLUSTER SLOTS``, asked of one
node at a time on a client of this listener's own (closed once it answered: a map is read
only when something moved), until one answers with a map in which every slot is served —
first the node that answered last, then the other nodes the last map names (primaries and
replicas), then the URL's. So a worker goes on when the nodes ``REALTIME_REDIS_URL`` names
are gone for good, and a read does not wait on any one node: a primary in its failover
window answers nothing, but the others do. A node that answers a map leaving slots unserved
(one restarted without its ``nodes.conf``, or reset: it knows no other node yet) is passed
over like one that fails, and never becomes the node asked first: the worker would be held
to its map, following no failover.
Each client let go is closed in a task of its own, which ``close`` waits for: a close
cancelled midway (the transport stopping while the map is read) would leave the node
connected, for the garbage collector to close. A node listener whose
connection fails, whose subscription is refused with ``MOVED``, or whose subscription the
server takes back (Redis unsubscribes the shard channels of a slot that leaves the node)
says so (``on_displaced``); this listener then reads the map again and moves each channel
whose slot another node serves now: unsubscribed on the old node's listener, subscribed on
the new one's, whose confirmation brings the gap fill. A map read while a failover is under
way still names the dead primary: the dead node's listener keeps failing, and each failure
asks for another read, with backoff, until a replica took over.

The last map read is kept until another is read, and channels are placed from it: a read
that fails (no node answers, or the answer is not a map) is logged as an outage, once, and
tried again with backoff, never a stop of this listener. A failover moves only the failed
primary's slots, so the rest of the map holds, and a stale entry corrects itself: the node
it names refuses the subscription (``MOVED``) or fails, which asks for another read. Only a
worker that has read no map yet depends on the URL's nodes. The transport's stream reads go
by the same map (``node_of``), and ask for another read when a node fails them or refuses
a slot (``look_again``): one map of slots per worker.

redis-py's own ``ClusterPubSub`` is not used for reading: without a ``target_node``, its
``get_sharded_message`` waits on each node's connection in turn (one node's message waits
for the others' timeouts), and it resubscribes in the background behind the transport's
back (a resubscription must be followed by a gap fill).

A node's listener that no longer serves any channel is stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot
from redis.exceptions import ClusterDownError

from realtime.transports.outage import Outage
from realtime.transports.redis_listener import ListenerOptions, RedisListener
from realtime.transports.tasks import Tasks

logger = logging.getLogger(__name__)


class ClusterListener:
    """Follow shard channels on the nodes that serve them; the same face as
    ``RedisListener`` (``subscribe``, ``unsubscribe``, ``run``, ``wanted``, ``beat``)."""

    def __init__(
        self,
        topology: Callable[[str, int], Any],
        seeds: Sequence[str],
        client: Callable[[str, int], Any],
        options: ListenerOptions,
        on_message: Callable[[str, bytes], None],
        on_subscribed: Callable[[str], None],
        on_stalled: Callable[[frozenset[str]], None],
        node_answers: Callable[[str, int], Awaitable[bool]],
    ) -> None:
        #: ``topology(host, port)`` builds an asyncio client of one node, to read the map with.
        self.topology = topology
        #: The nodes (``host:port``) ``REALTIME_REDIS_URL`` names: asked after those of the map.
        self.seeds = tuple(seeds)
        #: The last map read (``None``: none read yet); kept when a read fails.
        self._map: SlotMap | None = None
        #: The node that answered the last read: asked first next time.
        self._source: str | None = None
        #: ``client(host, port)`` builds an asyncio client of one node.
        self.client = client
        self.options = options
        self.on_message = on_message
        self.on_subscribed = on_subscribed
        self.on_stalled = on_stalled
        self.node_answers = node_answers
        #: Shard channels that should be subscribed, on whichever node serves them.
        self.wanted: set[str] = set()
        #: Shard channel → the name (``host:port``) of the node it is subscribed on.
        self.home: dict[str, str] = {}
        #: Node name → its listener, and the task running it.
        self.nodes: dict[str, RedisListener] = {}
        self._tasks: Tasks | None = None
        #: Tasks of node listeners let go, closing their connection (held until done).
        self._closing: set[asyncio.Task[None]] = set()
        #: Tasks closing the clients let go of, the map reads' and the stream reads' (held
        #: until done, waited for by ``close``).
        self._closing_clients: set[asyncio.Task[None]] = set()
        #: Times the map of slots was read (the first time, then again).
        self.map_reads = 0
        #: Called with each map taken (the stream reads let go of the nodes it drops).
        self.on_map: list[Callable[[SlotMap], None]] = []
        #: Channels moved to another node.
        self.moves = 0
        self._beat = time.monotonic()
        self._mapping = asyncio.Lock()
        self._look_again = asyncio.Event()
        self._map_outage = Outage("reading the Redis Cluster's map of slots", "failed", "works")

    @property
    def beat(self) -> float:
        """When this listener, or the least recent of its node listeners, last turned."""
        running = [self.nodes[name].beat for name in self._tasks or () if name in self.nodes]
        return min([self._beat, *running])

    @beat.setter
    def beat(self, value: float) -> None:
        self._beat = value
        for listener in self.nodes.values():
            listener.beat = value

    async def subscribe(self, name: str) -> None:
        """``SSUBSCRIBE name`` on the node serving it; return once that node confirmed it
        (after a move, on the node it moved to)."""
        self.wanted.add(name)
        while name in self.wanted:
            node = self.home.get(name)
            if node is None:
                node = await self._owner(name)
                if node is None or name not in self.wanted:
                    return  # taken back meanwhile
                node = self.home.setdefault(name, node)
            listener = self._listener(node)
            await listener.subscribe(name)
            if name in listener.wanted:
                return  # confirmed; otherwise it moved (or was taken back) meanwhile

    async def unsubscribe(self, name: str) -> None:
        """Stop wanting ``name``; ``SUNSUBSCRIBE`` it on its node."""
        self.wanted.discard(name)
        node = self.home.pop(name, None)
        listener = self.nodes.get(node) if node is not None else None
        if listener is not None:
            await listener.unsubscribe(name)

    async def run(self) -> None:
        """Run the node listeners (restarting one that stopped), drop those that serve
        nothing, and move channels when a node says they may be served elsewhere; until
        cancelled, which stops the node listeners too."""
        if self.wanted - self.home.keys():
            self._look_again.set()  # channels wanted before this run (a restart): place them
        self._tasks = Tasks(asyncio.get_running_loop(), "the Redis Pub/Sub listener of node")
        try:
            delay = self.options.backoff_start
            while True:
                self._beat = time.monotonic()
                self._tend()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.options.heartbeat_interval):
                        await self._look_again.wait()
                if not self._look_again.is_set():
                    delay = self.options.backoff_start
                    continue
                self._look_again.clear()
                await self._rehome()
                # Moves come from failures: asked again at once, look again later, and
                # later each time (a failover under way keeps asking until it is done).
                await self._pause(delay)
                delay = min(2 * delay, self.options.backoff_max)
        finally:
            tasks, self._tasks = self._tasks, None
            await tasks.stop(self.options.heartbeat_timeout)

    async def _pause(self, delay: float) -> None:
        deadline = time.monotonic() + delay
        while (left := deadline - time.monotonic()) > 0:
            self._beat = time.monotonic()
            self._tend()
            await asyncio.sleep(min(left, self.options.heartbeat_interval))

    def _tend(self) -> None:
        """Start the node listeners not running; stop those that serve nothing."""
        tasks = self._tasks
        if tasks is None:
            return  # not running
        homes = set(self.home.values())
        for node, listener in list(self.nodes.items()):
            if listener.wanted or node in homes:
                tasks.ensure(node, listener.run)
                continue
            self.nodes.pop(node)
            task = tasks.cancel(node)
            if task is not None:
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)

    def _listener(self, node: str) -> RedisListener:
        listener = self.nodes.get(node)
        if listener is None:
            host, _, port = node.rpartition(":")
            listener = self.nodes[node] = RedisListener(
                lambda: self.client(host, int(port)),
                self.options,
                self.on_message,
                self.on_subscribed,
                self.on_stalled,
                lambda: self.node_answers(host, int(port)),
                on_displaced=self.look_again,
                what=f"the Redis Pub/Sub connection to node {node}",
            )
            self._tend()
        return listener

    async def node_of(self, key: str) -> str | None:
        """The primary serving ``key``'s slot in the last map (read first if none was):
        where the transport's stream reads go too, so that subscriptions and reads follow
        one map. ``None`` when no map could be read, or when no node serves the slot (then
        the map is read again)."""
        if self._map is None:
            async with self._mapping:
                if self._map is None:
                    await self._read_map()
        owner = self._map.owner(key) if self._map is not None else None
        if owner is None and self._map is not None:
            self._look_again.set()  # a slot no node serves: read the map again
        return owner

    def look_again(self) -> None:
        """A node failed, or refused a key of a slot it no longer serves (``MOVED``): read
        the map again, and move what it moves (after the pause between reads)."""
        self._look_again.set()

    async def _owner(self, name: str) -> str | None:
        """The node serving ``name``'s slot, from the last map (read first if none was; read
        again until it can be, or until a node serves the slot: ``None`` if ``name`` is
        taken back meanwhile)."""
        while name in self.wanted:
            owner = await self.node_of(name)
            if owner is not None:
                return owner
            await asyncio.sleep(self.options.backoff_start)
        return None

    async def _read_map(self) -> bool:
        """Read the map of slots again, asking the nodes one at a time until one answers
        with a map in which every slot is served; whether a map was read. A node whose map
        leaves slots unserved (restarted without its ``nodes.conf``, or after ``CLUSTER
        RESET``: it knows no other node) is passed over, and is not asked first next time:
        pinned, it would hold the worker to its map for good. When no node serves every slot
        in its map, the map serving the most is taken (a Cluster missing slots), asked of the
        nodes it names next time; one serving none is no map. On failure the last map stays,
        and the failure is logged as an outage (one WARNING, then DEBUG lines, until a read
        works again)."""
        failure: BaseException = ConnectionError("no Redis Cluster node to ask")
        best: SlotMap | None = None
        for node in self._nodes_to_ask():
            try:
                fresh = await self._ask(node)
            except Exception as exc:  # any failure (a reply that is no map too): ask the next
                failure = exc
                continue
            if fresh.served == REDIS_CLUSTER_HASH_SLOTS:
                self._took(fresh, node)
                return True
            failure = ClusterDownError(f"node {node} serves {fresh.served} slot(s) in its map")
            if fresh.served and (best is None or fresh.served > best.served):
                best = fresh
        if best is not None:
            self._took(best, None)
            return True
        self._map_outage.failed(failure, self.options.backoff_start)
        return False

    def _took(self, fresh: SlotMap, source: str | None) -> None:
        """Place channels from ``fresh`` from now on; ``source`` is asked first next time."""
        self._map, self._source = fresh, source
        self.map_reads += 1
        self._map_outage.recovered()
        for taken in self.on_map:
            taken(fresh)

    def _nodes_to_ask(self) -> list[str]:
        """The node that answered last, the other nodes of the last map, then the URL's."""
        known = self._map.nodes if self._map is not None else ()
        return list(dict.fromkeys(n for n in (self._source, *known, *self.seeds) if n))

    async def _ask(self, node: str) -> SlotMap:
        """``node``'s map of slots (``CLUSTER SLOTS``), on a client closed afterwards."""
        host, _, port = node.rpartition(":")
        client = self.topology(host, int(port))
        try:
            async with asyncio.timeout(self.options.heartbeat_timeout * 2):
                reply = await client.execute_command("CLUSTER", "SLOTS")
        finally:
            self.let_go(client)
        return SlotMap(reply, host)

    async def close(self) -> None:
        """Wait until every client let go of is closed (the transport stops, after closing its
        stream reads), even one whose close an earlier call, cancelled, left under way (within
        the heartbeat timeout: one that hangs is logged and let go of)."""
        if self._closing_clients:
            # ``wait`` cancels nothing it waits for: cancelled here, the closes go on. Bounded
            # as a stop is: a close that hangs (a node that never answers) is let go of.
            bound = self.options.heartbeat_timeout
            _, pending = await asyncio.wait(set(self._closing_clients), timeout=bound)
            if pending:
                logger.error(
                    "realtime: a Redis Cluster node's client did not close within "
                    "%.1f s; it is let go of (its connections close when the nodes answer)",
                    bound,
                )

    def let_go(self, client: Any) -> None:
        """Close ``client`` (a node's: a map read's, or the stream reads') in a task of its
        own, held until done: cancelled midway, redis-py's ``aclose`` would leave the node
        connected."""
        task = asyncio.get_running_loop().create_task(_close(client))
        self._closing_clients.add(task)
        task.add_done_callback(self._closing_clients.discard)

    async def _rehome(self) -> None:
        """Read the map again; move each channel wanted whose slot another node serves now,
        place those wanted that have no node yet, and ask again for those still served where
        they are but not subscribed. A read that fails leaves the last map to place them
        from, and is tried again after the pause."""
        async with self._mapping:
            if not await self._read_map():
                self._look_again.set()
        slots = self._map
        if slots is None:
            return
        owners = {name: slots.owner(name) for name in self.wanted}
        moved: dict[tuple[str, str], list[str]] = {}
        for name, owner in owners.items():
            if owner is None:
                self._look_again.set()  # a slot no node serves (yet): read again later
                continue
            if name not in self.wanted:
                continue  # taken back meanwhile
            old = self.home.setdefault(name, owner)
            if owner != old:
                self.home[name] = owner
                moved.setdefault((old, owner), []).append(name)
                listener = self.nodes.get(old)
                if listener is not None:
                    await listener.unsubscribe(name)
            listener = self._listener(owner)
            if name not in listener.subscribed:
                await listener.want(name)
        for (old, new), names in moved.items():
            self.moves += len(names)
            logger.warning(
                "realtime: %d channel(s) moved from Redis Cluster node %s to %s (a failover "
                "or a slot migration); subscribed there, reading what they missed",
                len(names),
                old,
                new,
            )
        self._tend()


async def _close(client: Any) -> None:
    with contextlib.suppress(Exception):
        await client.aclose()


class SlotMap:
    """The Cluster's map of slots, as one node's ``CLUSTER SLOTS`` gave it: the primary
    (``host:port``) serving each slot, and every node it names, primaries and replicas."""

    def __init__(self, reply: Any, asked_host: str) -> None:
        #: Slot → the primary serving it (``None``: no node serves it).
        self.owners: list[str | None] = [None] * REDIS_CLUSTER_HASH_SLOTS
        #: Every node named, primaries first: any of them may answer the next read.
        self.nodes: list[str] = []
        replicas: list[str] = []
        for start, end, primary, *others in reply:
            owner = _node_name(primary, asked_host)
            self.owners[int(start) : int(end) + 1] = [owner] * (int(end) - int(start) + 1)
            self.nodes.append(owner)
            replicas += [_node_name(node, asked_host) for node in others]
        self.nodes = list(dict.fromkeys([*self.nodes, *replicas]))
        #: How many slots a primary serves in this map (all of them in a whole Cluster's).
        self.served = sum(1 for owner in self.owners if owner is not None)

    def owner(self, name: str) -> str | None:
        """The primary serving the slot of ``name`` (a shard channel, or a key)."""
        return self.owners[key_slot(name.encode())]


def _node_name(node: Any, asked_host: str) -> str:
    """``host:port`` of a node of ``CLUSTER SLOTS`` (``[host, port, id, ...]``); a node that
    does not know its address leaves the host empty: the one asked, reached at ``asked_host``."""
    host, port = node[0], node[1]
    host = host.decode() if isinstance(host, bytes) else str(host)
    return f"{host or asked_host}:{int(port)}"
