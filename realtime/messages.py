"""The internal messages between publishing processes and listening workers.

The write side builds them (``realtime.writes.payload``) and a transport carries them; the
socket side reads them (``realtime.sockets.delivery``). Neither side imports the other: this
module is the contract between them. A message is a JSON object with a ``target``:

``scope``
    on ``<REALTIME_CHANNEL>_<scope id>``: ``scope_id``, ``event_type``, ``data``, ``channels``
    (``null``: every socket of the scope), ``meta``; optionally ``only`` (the accounts it
    reaches), ``exclude`` (accounts it skips) and ``about`` (``{"model", "id"}``: ask the
    audience hook).
``users``
    on ``<REALTIME_CHANNEL>``: ``user_ids``, ``event_type``, ``data``, ``channels``, ``meta``;
    optionally ``skip_scope`` (sockets reading that scope heard it there already).
``recheck``
    on ``<REALTIME_CHANNEL>``: ``user_ids`` whose sockets every worker rechecks now.

Every message carries a unique ``mid`` (PostgreSQL merges identical notifications of one
transaction). ``meta`` holds ``origin``, ``changed`` and ``truncated`` when they apply.
"""

from __future__ import annotations

from typing import Any, Final

from realtime.conf import conf

SCOPE: Final = "scope"
USERS: Final = "users"
RECHECK: Final = "recheck"


def scope_channel(scope_id: Any) -> str:
    """The transport channel of one scope's events."""
    return f"{conf.CHANNEL}_{scope_id}"


def base_channel() -> str:
    """The transport channel of account events and recheck requests."""
    return conf.CHANNEL
