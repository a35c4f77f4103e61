"""realtime: tell WebSocket clients about the model writes they may read, after commit.

``from realtime import realtime_model, announce, deleting, silent, RealtimeQuerySet,
RealtimeManager`` is safe in ``models.py``: the names load on first use and touch neither the
database nor the settings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from realtime.writes.decorator import realtime_model
    from realtime.writes.manual import announce, deleting
    from realtime.writes.querysets import RealtimeManager, RealtimeQuerySet, silent

__all__ = [
    "RealtimeManager",
    "RealtimeQuerySet",
    "announce",
    "deleting",
    "realtime_model",
    "silent",
]


def __getattr__(name: str) -> Any:
    if name == "realtime_model":
        from realtime.writes.decorator import realtime_model

        return realtime_model
    if name in ("announce", "deleting"):
        from realtime.writes import manual

        return getattr(manual, name)
    if name in ("silent", "RealtimeQuerySet", "RealtimeManager"):
        from realtime.writes import querysets

        return getattr(querysets, name)
    raise AttributeError(f"module 'realtime' has no attribute {name!r}")
