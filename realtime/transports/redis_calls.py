"""Running one Lua script many times (a publish's slots, a resume's streams): one round trip
per server.

``call_each(client, script, calls)`` runs ``script`` once per ``(keys, args)`` and returns
the replies in order. One call goes through redis-py's ``Script`` (which loads the script on
a server that lacks it). Several go in one pipeline on a standalone server; on a Redis
Cluster, in one pipeline per node, to the node serving each call's slot
(``get_node_from_key``; redis-py's ``ClusterPipeline`` refuses ``EVALSHA``). A call a node
refuses because the slot is elsewhere now (``MOVED``, ``ASK``, ``TRYAGAIN``, the Cluster down)
and the calls of a node whose connection failed are run again one by one through the Cluster
client, which follows redirections and reads the map of slots again. A server that lacks the
script (restarted, failed over, added) is given it, and only the calls it refused run again.
The first error left is raised.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis
import redis.cluster
from redis.exceptions import AskError, ClusterDownError, NoScriptError, TryAgainError

#: ``(keys, args)`` of one script call.
Call = tuple[list[str], list[Any]]

#: Replies that mean "ask the Cluster client": the slot is elsewhere or moving, or the node
#: could not be reached.
_ELSEWHERE = (
    AskError,
    TryAgainError,
    ClusterDownError,
    redis.ConnectionError,
    redis.TimeoutError,
)


def call_each(client: Any, script: Any, calls: Sequence[Call]) -> list[Any]:
    """``script``'s reply to each call, in order; see the module docstring."""
    if len(calls) == 1:
        keys, args = calls[0]
        return [script(keys=keys, args=args, client=client)]
    if not isinstance(client, redis.cluster.RedisCluster):
        return _raise_first(_pipelined(client, script, calls))
    by_node: dict[str, tuple[Any, list[int]]] = {}
    for index, (keys, _) in enumerate(calls):
        node = client.get_node_from_key(keys[0])  # type: ignore[no-untyped-call]  # untyped
        by_node.setdefault(node.name, (node, []))[1].append(index)
    replies: list[Any] = [None] * len(calls)
    for node, indexes in by_node.values():
        try:
            server = client.get_redis_connection(node)
            answers = _pipelined(server, script, [calls[i] for i in indexes])
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            answers = [exc] * len(indexes)
        for index, answer in zip(indexes, answers, strict=True):
            replies[index] = answer
    for index, reply in enumerate(replies):
        if isinstance(reply, _ELSEWHERE):
            keys, args = calls[index]
            replies[index] = script(keys=keys, args=args, client=client)
    return _raise_first(replies)


def _pipelined(client: Any, script: Any, calls: Sequence[Call]) -> list[Any]:
    """The calls in one pipeline on one server, errors returned in place; loads the script
    and runs again the calls refused for lack of it."""
    replies: list[Any] = [None] * len(calls)
    todo = list(range(len(calls)))
    for _ in range(2):
        with client.pipeline(transaction=False) as pipe:
            for index in todo:
                keys, args = calls[index]
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            answers = pipe.execute(raise_on_error=False)
        for index, answer in zip(todo, answers, strict=True):
            replies[index] = answer
        todo = [index for index in todo if isinstance(replies[index], NoScriptError)]
        if not todo:
            break
        client.script_load(script.script)
    return replies


def _raise_first(replies: list[Any]) -> list[Any]:
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies
