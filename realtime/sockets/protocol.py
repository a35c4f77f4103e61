"""The socket protocol, without I/O: close codes, refusal reasons, frame reading and writing.

Every frame both ways is a JSON object ``{"type": str, "data": object | null}`` in a text
frame. Reading is defensive: anything a client sends is parsed here into plain values or a
precise ``FrameError``, so the consumer is a small state machine over already-checked input.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any, Final

from realtime.encoding import dumps, storable


class CloseCode(enum.IntEnum):
    """WebSocket close codes the server uses."""

    POLICY_VIOLATION = 1008
    MESSAGE_TOO_BIG = 1009
    INTERNAL_ERROR = 1011
    #: The worker may have missed events for this socket: reconnect and read again.
    SERVICE_RESTART = 1012


class Refusal(enum.StrEnum):
    """Reasons of ``auth_error``, verbatim: clients match on them."""

    TIMEOUT = "Authentication timeout"
    FORMAT = "Invalid authentication format"
    MESSAGE = "Invalid authentication message"
    TOKEN = "Invalid authentication token"  # noqa: S105 - a message, not a secret
    SCOPE = "Scope not found"
    TOO_MANY = "Too many connections"


# Frame types the protocol defines.
AUTHENTICATE: Final = "authenticate"
WATCH: Final = "watch"
SUBSCRIBE: Final = "subscribe"
UNSUBSCRIBE: Final = "unsubscribe"
HEARTBEAT: Final = "heartbeat"
AUTH_SUCCESS: Final = "auth_success"
AUTH_ERROR: Final = "auth_error"
#: The answer to an opted-in socket's ``heartbeat`` (see ``refresh``).
CURSOR: Final = "cursor"

# Meta keys an event frame may carry at its top level, in their order.
META_KEYS: Final = ("origin", "changed", "truncated")


class FrameError(ValueError):
    """A frame that is not a JSON object (binary, unreadable, nested too deep, or not a dict)."""


@dataclass(frozen=True, slots=True)
class Frame:
    type: str | None
    data: dict[str, Any]


def parse_frame(text: Any) -> Frame:
    """Read one client text frame; raise ``FrameError`` unless it is a JSON object.

    ``type`` is ``None`` when missing or not a string; ``data`` is ``{}`` unless an object.
    """
    if not isinstance(text, str):
        raise FrameError("binary frame")
    try:
        value = json.loads(text, parse_constant=_not_json)
    except (ValueError, RecursionError) as exc:
        raise FrameError("not JSON") from exc
    if not isinstance(value, dict):
        raise FrameError("not a JSON object")
    type_ = value.get("type")
    raw = value.get("data")
    return Frame(
        type=type_ if isinstance(type_, str) else None,
        data=raw if isinstance(raw, dict) else {},
    )


def _not_json(constant: str) -> Any:
    """Refuse ``NaN``, ``Infinity`` and ``-Infinity``, which Python's reader takes and JSON
    does not have (RFC 8259): a frame holding one is not JSON. So is one holding an integer
    of more than 4,300 digits, which Python refuses to read (``ValueError``)."""
    raise ValueError(f"{constant} is not JSON")


@dataclass(frozen=True, slots=True)
class ScopeAsk:
    """What a client asked to read: a list of slugs, or one slug (or nothing)."""

    many: bool
    slugs: tuple[str, ...]
    single: Any
    #: Whether something was asked: a non-empty list, or a non-null single scope.
    asked: bool


def read_scopes(data: dict[str, Any]) -> ScopeAsk:
    """Read ``scopes`` (a JSON list only) else ``scope``; ``workspace(s)`` when those are absent.

    Entries that are not storable strings are dropped, but a non-empty list still counts as
    asked; so does a single scope that is not one (it names nothing: ``slugs`` is empty).
    """
    listed = data["scopes"] if "scopes" in data else data.get("workspaces")
    if isinstance(listed, list):
        slugs = tuple(dict.fromkeys(slug for slug in listed if storable(slug)))
        return ScopeAsk(many=True, slugs=slugs, single=None, asked=bool(listed))
    single = data["scope"] if "scope" in data else data.get("workspace")
    return ScopeAsk(
        many=False,
        slugs=(single,) if storable(single) else (),
        single=single,
        asked=single is not None,
    )


def read_channels(data: dict[str, Any]) -> list[str]:
    """``channels`` when a non-empty list, else ``[channel]`` when a string; storable strings
    only."""
    channels = data.get("channels")
    if isinstance(channels, list) and channels:
        return [channel for channel in channels if storable(channel)]
    channel = data.get("channel")
    return [channel] if storable(channel) else []


def channel_model(channel: str) -> str:
    """The model part of a channel: ``contact`` of ``contact:7``."""
    return channel.split(":", 1)[0]


#: ``json.dumps`` with these options would build an encoder at every call.
_FRAMES = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=str, allow_nan=False)


def encode(frame: dict[str, Any]) -> str:
    """Encode a frame compactly, non-ASCII kept as is, floats JSON cannot hold as ``null``."""
    return dumps(frame, _FRAMES)


def event_frame(
    event_type: Any, data: Any, meta: dict[str, Any] | None, scope_id: Any = None
) -> str:
    """The frame of an event: ``type, data, origin, changed, truncated, scope_id, moved``, in
    order (``moved`` marks a row entering or leaving the reader's view)."""
    frame: dict[str, Any] = {"type": event_type, "data": data}
    if meta:
        for key in META_KEYS:
            if key in meta:
                frame[key] = meta[key]
    if scope_id is not None:
        frame["scope_id"] = scope_id
    if meta and meta.get("moved"):
        frame["moved"] = True
    return encode(frame)


def with_cursor(frame: str, cursor: str) -> str:
    """An encoded frame with ``"cursor"`` added as its last key (cursors need no escaping)."""
    return f'{frame[:-1]},"cursor":"{cursor}"}}'


def cursor_frame(cursor: str) -> str:
    """``{"type": "cursor", "cursor": cursor}``: a fresh cursor, and nothing else."""
    return encode({"type": CURSOR, "cursor": cursor})


@dataclass(frozen=True, slots=True)
class ResumeAsk:
    """What ``authenticate`` asked about resuming: whether the socket opts in (a ``resume``
    key), and the cursor it gave (``None``: start now; anything else is checked later)."""

    opted: bool
    cursor: Any


def read_resume(data: dict[str, Any]) -> ResumeAsk:
    return ResumeAsk(opted="resume" in data, cursor=data.get("resume"))


def auth_success(
    user_id: Any, slugs: list[str], cursor: str | None = None, resumed: bool | None = None
) -> str:
    """``auth_success``; ``cursor`` (and ``resumed``, when a cursor was given) for a socket
    that opted in to resume, after the keys every client knows."""
    data: dict[str, Any] = {"user_id": user_id, "scope": slugs[0] if slugs else None}
    data["scopes"] = slugs
    if cursor is not None:
        data["cursor"] = cursor
        if resumed is not None:
            data["resumed"] = resumed
    return encode({"type": AUTH_SUCCESS, "data": data})


def auth_error(reason: Refusal) -> str:
    return encode({"type": AUTH_ERROR, "data": {"message": reason.value}})
