"""The broadcast API: events of the application's own, to a scope or to accounts.

``broadcast_to_scope``, ``broadcast_to_users`` and ``broadcast_to_user`` send an event;
``recheck_users`` has every worker re-resolve what let these accounts' sockets in. Each call
publishes after the current transaction commits (at once outside one), from sync or async
code, and logs failures rather than raising them. Implemented in ``realtime.writes.broadcast``.
"""

from realtime.writes.broadcast import (
    broadcast_to_scope,
    broadcast_to_user,
    broadcast_to_users,
    recheck_users,
)

__all__ = ["broadcast_to_scope", "broadcast_to_user", "broadcast_to_users", "recheck_users"]
