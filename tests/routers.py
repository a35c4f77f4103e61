"""The suite's database router: ``replica`` (a read replica of ``default``, see settings) is
never migrated, as a project's replica is not; so Django's checks never connect to it."""

from __future__ import annotations

from typing import Any


class NoMigrationsOnTheReplica:
    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        return False if db == "replica" else None


class ReadsFromTheReplica(NoMigrationsOnTheReplica):
    """A primary/replica router as projects write one: the application's reads go to the
    replica, its writes to ``default``."""

    def db_for_read(self, model: Any, **hints: Any) -> str:
        return "replica"

    def db_for_write(self, model: Any, **hints: Any) -> str:
        return "default"
