"""What the Redis transport asks of the server, checked once per process at its first use.

Django's system checks do not run under daphne, and a check there could not reach Redis
anyway; so the transport looks when it first connects, and says what it finds in the log:

* the server's version: sharded Pub/Sub (``SSUBSCRIBE``, ``SPUBLISH``) came with Redis 7.0;
  an older server cannot carry this transport at all (one ERROR; every publish then fails);
* eviction: with a ``maxmemory`` limit and a policy other than ``noeviction``, Redis drops keys
  under memory pressure — realtime's all have a lifetime, so the ``volatile-*`` policies pick
  them too — and a stream that loses its keys gets a new epoch, its sockets closed 1012 (one
  WARNING). A managed Redis that refuses ``CONFIG GET`` is not second-guessed (DEBUG).
"""

from __future__ import annotations

import logging
from typing import Any, Final

logger = logging.getLogger(__name__)

#: The oldest Redis with sharded Pub/Sub.
OLDEST: Final = (7, 0)
#: Policies that never evict a key without a lifetime before one with it, or never evict.
SAFE_POLICIES: Final = (
    "noeviction",
    "volatile-lru",
    "volatile-lfu",
    "volatile-random",
    "volatile-ttl",
)


def version_of(info: dict[str, Any]) -> tuple[int, ...]:
    """``redis_version`` of ``INFO server`` as numbers (``(0,)`` when unreadable)."""
    try:
        return tuple(int(part) for part in str(info.get("redis_version", "")).split("."))
    except ValueError:
        return (0,)


def per_node(answer: Any) -> list[dict[str, Any]]:
    """An ``INFO`` or ``CONFIG GET`` answer as one dict per server (a Cluster client answers
    a dict by node)."""
    if not isinstance(answer, dict):
        return []
    nested = [value for value in answer.values() if isinstance(value, dict)]
    return nested if nested and len(nested) == len(answer) else [answer]


def check_server(client: Any) -> None:
    """Look at the servers ``client`` (a sync redis-py client, of one server or a Cluster)
    talks to; log what is wrong, once each."""
    try:
        infos = per_node(client.info("server"))
    except Exception as exc:  # the server is away now: the publish that follows says so
        logger.debug("realtime: redis: INFO server failed: %s", exc)
        return
    old = sorted({str(i.get("redis_version", "?")) for i in infos if version_of(i) < OLDEST})
    if old:
        logger.error(
            "realtime: redis: the server is Redis %s; the Redis transport needs 7.0 or later "
            "(sharded Pub/Sub): nothing can be published or heard",
            ", ".join(old),
        )
    try:
        configs = per_node(client.config_get("maxmemory*"))
    except Exception as exc:  # managed services often refuse CONFIG
        logger.debug("realtime: redis: CONFIG GET maxmemory* failed: %s", exc)
        return
    for config in configs:
        limit, policy = config.get("maxmemory"), config.get("maxmemory-policy")
        if limit not in (None, "0", 0) and policy not in (None, "noeviction"):
            logger.warning(
                "realtime: redis: maxmemory-policy is %s with a maxmemory of %s bytes: under "
                "memory pressure Redis may evict a stream's keys, which closes its sockets "
                "1012; use noeviction (and size Redis for the resume window)",
                policy,
                limit,
            )
            return
