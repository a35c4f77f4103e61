"""Bounds on the database connections realtime holds open on threads of its own.

The table poller and the trimming thread keep one connection each for the life of the
process. A connection whose peer silently went away (a NAT that forgot the flow, a failover,
a frozen proxy) would otherwise block a read for hours: the poller would deliver nothing and
say nothing. So each such connection is opened with:

* TCP keepalives (``REALTIME_TCP_KEEPIDLE/KEEPINTVL/KEEPCNT``), and on PostgreSQL
  ``tcp_user_timeout``, so the kernel notices a peer that stopped answering;
* a client read/write timeout on MySQL/MariaDB (``read_timeout``, ``write_timeout``);
* a server-side statement timeout (PostgreSQL ``statement_timeout``, MariaDB
  ``max_statement_time``, MySQL ``max_execution_time``), so a statement stuck on the server
  is cancelled there;

all set to ``REALTIME_HEARTBEAT_TIMEOUT`` seconds. SQLite has no network (its waits are
bounded by the database's own ``timeout``). Whatever those leave — a peer whose kernel still
acknowledges but whose process stopped answering — a ``StatementClock``
(``realtime.statement_clock``) catches: it knows when the statement under way began and which
socket it waits on, so a watchdog on another thread can cut that socket, and the blocked read
fails at once.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from realtime.compat.django import driver_connection, use_options
from realtime.conf import conf
from realtime.transports.table_store import is_mariadb


@dataclass(frozen=True)
class Bounds:
    """How long one statement may take, and the TCP keepalive of a held connection."""

    statement_timeout: float
    keepidle: int
    keepintvl: int
    keepcnt: int

    @classmethod
    def from_settings(cls) -> Bounds:
        return cls(
            statement_timeout=conf.HEARTBEAT_TIMEOUT,
            keepidle=conf.TCP_KEEPIDLE,
            keepintvl=conf.TCP_KEEPINTVL,
            keepcnt=conf.TCP_KEEPCNT,
        )

    def options(self, vendor: str, options: dict[str, Any]) -> dict[str, Any]:
        """The driver options of a bounded connection: ``options`` plus the bounds (the
        project's own values of the same options win)."""
        if vendor == "postgresql":
            bounded: dict[str, Any] = {
                "keepalives": 1,
                "keepalives_idle": self.keepidle,
                "keepalives_interval": self.keepintvl,
                "keepalives_count": self.keepcnt,
                "tcp_user_timeout": int(self.statement_timeout * 1000),
            }
        elif vendor == "mysql":
            seconds = max(1, math.ceil(self.statement_timeout))
            bounded = {"read_timeout": seconds, "write_timeout": seconds}
        else:
            bounded = {}
        return {**bounded, **options}


def bounded_connection(using: str, bounds: Bounds) -> BaseDatabaseWrapper:
    """This thread's connection of ``using``, opened with ``bounds`` if it is not open yet.

    Only this thread's connection gets the bounded options, on the alias's settings as they
    are at each connect (a changed host or port is followed; see
    ``realtime.compat.django.use_options``); other threads are untouched.
    """
    wrapper = connections[using]
    if driver_connection(wrapper) is not None:
        return wrapper
    use_options(wrapper, functools.partial(bounds.options, wrapper.vendor))
    _limit_statements(wrapper, bounds.statement_timeout)  # opens it
    return wrapper


def _limit_statements(wrapper: BaseDatabaseWrapper, seconds: float) -> None:
    with wrapper.cursor() as cursor:
        if wrapper.vendor == "postgresql":
            cursor.execute(
                "SELECT set_config('statement_timeout', %s, false)", [str(int(seconds * 1000))]
            )
        elif wrapper.vendor == "mysql" and is_mariadb(cursor):
            cursor.execute("SET SESSION max_statement_time = %s", [seconds])
        elif wrapper.vendor == "mysql":
            cursor.execute("SET SESSION max_execution_time = %s", [int(seconds * 1000)])
