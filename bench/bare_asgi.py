"""A bare ASGI application: the floor of ``fanout.py``, served by daphne like the real one.

It accepts every WebSocket (at any path but ``/control``), keeps each one's raw ASGI ``send``
callable, answers the first text frame a socket sends with a fixed ``auth_success`` frame (the
floor of a handshake, for ``connect.py`` and ``storm.py``) and ignores whatever else it sends.
A control socket (path ``/control``) sends
``fire <text>``: the application sends ``<text>``, encoded once, to every other socket with
one ``asyncio.gather`` of their ``send`` calls, then answers ``done <sockets> <seconds>`` (the
time the gather took). ``GET /stats`` answers ``{"sockets": N}``. No Django, no
authentication, no index, no per-socket bookkeeping: only what any fan-out over daphne does.

Served from the ``bench`` directory (``fanout.py`` starts it itself)::

    cd bench && ../.venv/bin/python -m daphne -p 8001 bare_asgi:application
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

AUTH_SUCCESS = json.dumps({"type": "auth_success", "data": {"user_id": 0, "scopes": []}})
#: The raw ``send`` of every open socket but the control ones.
sockets: dict[int, Send] = {}
_keys = itertools.count()


async def application(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    if scope["type"] == "websocket":
        if scope["path"].rstrip("/") == "/control":
            await _control(receive, send)
        else:
            await _member(receive, send)
    elif scope["type"] == "http":
        await _stats(send)


async def _member(receive: Receive, send: Send) -> None:
    if (await receive())["type"] != "websocket.connect":
        return
    await send({"type": "websocket.accept"})
    key = next(_keys)
    sockets[key] = send
    answered = False
    try:
        while (message := await receive())["type"] != "websocket.disconnect":
            if not answered and message.get("text") is not None:
                answered = True
                await send({"type": "websocket.send", "text": AUTH_SUCCESS})
    finally:
        sockets.pop(key, None)


async def _control(receive: Receive, send: Send) -> None:
    if (await receive())["type"] != "websocket.connect":
        return
    await send({"type": "websocket.accept"})
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            return
        text = message.get("text") or ""
        if not text.startswith("fire "):
            continue
        frame: Message = {"type": "websocket.send", "text": text[len("fire ") :]}
        targets = list(sockets.values())
        start = time.perf_counter()
        await asyncio.gather(*(target(frame) for target in targets))
        took = time.perf_counter() - start
        await send({"type": "websocket.send", "text": f"done {len(targets)} {took:.6f}"})


async def _stats(send: Send) -> None:
    body = json.dumps({"sockets": len(sockets)}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})
