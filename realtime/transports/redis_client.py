"""Redis clients of the Redis transport, built from ``REALTIME_REDIS_URL``, and the URL's rules.

The URL is ``redis://``, ``rediss://`` (TLS, its options in the query) or ``unix://``, as
redis-py reads them. A Redis Cluster is named by some of its nodes: one URL
``redis+cluster://host:port,host:port`` (``rediss+cluster://`` for TLS; credentials before
the first host and a query after the last apply to every node) or a list of ``redis://``
(or ``rediss://``) node URLs. Any node is enough to start from: the client reads the
Cluster's map of slots from the first that answers.

The Pub/Sub client is built without redis-py's retries (``Retry`` over no error): a
connection that breaks must be seen by the transport, which reconnects with its own backoff
and reads what it missed, rather than be replaced behind its back (redis-py's retry
reconnects and resubscribes a Pub/Sub connection silently, losing what was sent meanwhile).
The others try once more, on a fresh connection, a command whose pooled connection broke since
its last use (the server restarted, the network was cut): the reads on a timeout too (a
read can be repeated), the publisher only when the connection broke (a publish that timed
out may have been applied). On a Cluster, redis-py's Cluster client tries a command once more
after a broken connection or a timeout alike, on the map of slots read again. Timeouts are
the heartbeat timeout: a silent server is a dead one.

This module imports redis-py only when a client is built: the system checks read the URL's
rules without it.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import redis
    import redis.asyncio
    import redis.cluster

#: Schemes of a standalone server.
STANDALONE_SCHEMES = ("redis", "rediss", "unix")
#: The schemes of a Redis Cluster given as one URL of ``host:port`` pairs, and the scheme
#: of each node they stand for.
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
#: How the client names its connections (``CLIENT LIST``), so operators and tests can find them.
PUBLISHER_NAME = "realtime-publisher"
LISTENER_NAME = "realtime-listener"
READER_NAME = "realtime-reader"
TOPOLOGY_NAME = "realtime-topology"


class UrlError(ValueError):
    """``REALTIME_REDIS_URL`` is not a URL the transport can use."""


@dataclass(frozen=True)
class Target:
    """What ``REALTIME_REDIS_URL`` names: a standalone server's URL, or a Cluster's nodes
    (``redis://`` or ``rediss://`` URLs, database 0)."""

    url: str | None
    cluster: tuple[str, ...] = ()


def parse_url(value: Any) -> Target:
    """The server (or Cluster) ``value`` names; ``UrlError`` saying why it names none."""
    if value is None:
        raise UrlError("is not set")
    if isinstance(value, list | tuple):
        if not value:
            raise UrlError("is an empty list")
        return Target(None, _cluster_of([_standalone(node) for node in value]))
    if not isinstance(value, str):
        raise UrlError(f"must be a URL string, not {type(value).__name__}")
    scheme = value.partition("://")[0]
    if scheme in CLUSTER_SCHEMES:
        return Target(None, _cluster_of(_cluster_nodes(value, CLUSTER_SCHEMES[scheme])))
    return Target(_standalone(value))


def _cluster_of(nodes: Sequence[str]) -> tuple[str, ...]:
    """Cluster nodes: TCP, all with or all without TLS, database 0 (a Cluster has no other)."""
    schemes = {urlsplit(node).scheme for node in nodes}
    if "unix" in schemes:
        raise UrlError("names a Cluster node by a unix:// socket; Cluster nodes are host:port")
    if len(schemes) > 1:
        raise UrlError("mixes redis:// and rediss:// Cluster nodes; use one or the other")
    for node in nodes:
        if urlsplit(node).path.strip("/") not in ("", "0"):
            raise UrlError(f"{node!r}: a Redis Cluster has database 0 only")
    return tuple(nodes)


def _standalone(value: Any) -> str:
    if not isinstance(value, str):
        raise UrlError(f"holds {value!r}, which is not a URL string")
    parts = urlsplit(value)
    if parts.scheme not in STANDALONE_SCHEMES:
        raise UrlError(
            f"{value!r} has no known scheme (redis://, rediss://, unix://, redis+cluster:// "
            "or rediss+cluster://)"
        )
    if parts.scheme == "unix":
        if not parts.path:
            raise UrlError(f"{value!r} names no socket path")
        return value
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as exc:
        raise UrlError(f"{value!r} has an invalid port") from exc
    if not parts.hostname:
        raise UrlError(f"{value!r} names no host")
    path = parts.path.strip("/")
    if path and not path.isdigit():
        raise UrlError(f"{value!r}: the path must be a database number")
    return value


def _cluster_nodes(value: str, scheme: str) -> Sequence[str]:
    """``[rediss+]cluster://[credentials@]h:p,h:p[/][?query]`` as one node URL per host."""
    rest = value.partition("://")[2]
    rest, _, query = rest.partition("?")
    hosts, _, path = rest.partition("/")
    if path.strip("/") not in ("", "0"):
        raise UrlError(f"{value!r}: a Redis Cluster has database 0 only")
    credentials, at, hosts = hosts.rpartition("@")
    nodes = []
    for host in hosts.split(","):
        parts = urlsplit("redis://" + host)
        try:
            port = parts.port
        except ValueError as exc:
            raise UrlError(f"{value!r} has an invalid port") from exc
        if not parts.hostname or port is None:
            raise UrlError(f"{value!r}: write each node as host:port, separated by commas")
        nodes.append(f"{scheme}://{credentials}{at}{host}" + (f"?{query}" if query else ""))
    return nodes


def node_url(template: str, host: str, port: int) -> str:
    """``template`` (a Cluster node's URL) pointed at another node: the same scheme,
    credentials and options, so that every node is reached alike."""
    parts = urlsplit(template)
    credentials = parts.netloc.rpartition("@")[0]
    netloc = (credentials + "@" if credentials else "") + (
        f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    )
    return parts._replace(netloc=netloc, path="").geturl()


def node_name(url: str) -> str:
    """``host:port`` of a Cluster node's URL, as the Cluster's map of slots names nodes."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 6379}"


def _options(url: str, timeout: float, keepalive: tuple[int, int, int]) -> dict[str, Any]:
    """The options of every client of ``url``: its timeouts and, over TCP, its keepalive (a
    Unix socket's connection takes no keepalive options: redis-py refuses them)."""
    common: dict[str, Any] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "health_check_interval": 0,
    }
    if urlsplit(url).scheme == "unix":
        return common
    idle, interval, count = keepalive
    keepalive_options = {
        option: value
        for name, value in (
            ("TCP_KEEPIDLE", idle),
            ("TCP_KEEPINTVL", interval),
            ("TCP_KEEPCNT", count),
        )
        if (option := getattr(socket, name, None)) is not None
    }
    return {**common, "socket_keepalive": True, "socket_keepalive_options": keepalive_options}


def sync_client(url: str, timeout: float, keepalive: tuple[int, int, int]) -> redis.Redis:
    """The publisher's (and the history reads') client: a thread-safe pool."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return redis.Redis.from_url(
        url,
        client_name=PUBLISHER_NAME,
        retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
        **_options(url, timeout, keepalive),
    )


def cluster_sync_client(
    nodes: Sequence[str], timeout: float, keepalive: tuple[int, int, int]
) -> redis.cluster.RedisCluster:
    """The publisher's client on a Cluster: it routes each command to the node serving its
    slot, follows ``MOVED``/``ASK`` and reads the map of slots again after a failure. A
    command that failed on a broken connection, or timed out, is tried once more after that
    reading (redis-py's Cluster retries both alike: a relay's transaction key makes a
    repeated relay harmless)."""
    import redis.cluster
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    first, *others = nodes
    return redis.cluster.RedisCluster.from_url(
        first,
        startup_nodes=[_startup_node(redis.cluster.ClusterNode, node) for node in others],
        client_name=PUBLISHER_NAME,
        retry=Retry(NoBackoff(), 1),
        **_options(first, timeout, keepalive),
    )


def _startup_node(node_class: Any, url: str) -> Any:
    parts = urlsplit(url)
    return node_class(parts.hostname, parts.port)


def async_client(
    url: str, timeout: float, keepalive: tuple[int, int, int], name: str, *, retry: bool
) -> redis.asyncio.Redis:
    """A client on the running event loop: the listener's (no retry), or the stream reads'
    (reads may be repeated: a read on a pooled connection that broke, or went silent, is
    tried once more on a fresh one)."""
    import redis.asyncio
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    errors = (redis.ConnectionError, redis.TimeoutError) if retry else ()
    return redis.asyncio.Redis.from_url(
        url,
        client_name=name,
        retry=Retry(NoBackoff(), 1 if retry else 0, supported_errors=errors),
        **_options(url, timeout, keepalive),
    )
