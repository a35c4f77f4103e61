"""System checks of the database the table transport runs on (``realtime.W002``/``W003``).

On SQLite the table transport needs two options of ``DATABASES["default"]``:

- WAL journal mode, so that each worker's poller reads while a request writes (in the default
  rollback journal a writer locks out every reader); WAL is also on when the database file
  already is in WAL mode, which persists once set;
- ``transaction_mode = "IMMEDIATE"``, so that a transaction takes the write lock when it
  begins: concurrent writers then wait for each other (up to ``timeout``) instead of failing
  with "database is locked" when a deferred transaction that read tries to write.

Both are warnings: a single process with one writer works without them, until it does not.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable
from contextlib import closing
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from realtime.conf import raw

WAL_PRAGMA = re.compile(r"journal_mode\s*=\s*['\"]?wal\b", re.IGNORECASE)
SQLITE_ENGINE = "django.db.backends.sqlite3"
OPTIONS_HINT = 'Add {option} to DATABASES["default"]["OPTIONS"].'


@checks.register()
def check_database(app_configs: Iterable[Any] | None = None, **kwargs: Any) -> list[Any]:
    """Check the default database's options when the table transport runs on SQLite."""
    if not _uses_table_transport():
        return []
    return sqlite_warnings(settings.DATABASES.get("default", {}))


def _uses_table_transport() -> bool:
    from realtime.transports import transport_class
    from realtime.transports.table import TableTransport

    value = raw("TRANSPORT")
    try:
        return isinstance(value, str) and issubclass(transport_class(value), TableTransport)
    except ImproperlyConfigured:
        return False  # realtime.E001 says why


def sqlite_warnings(database: dict[str, Any]) -> list[checks.CheckMessage]:
    """The warnings for one ``DATABASES`` entry (none unless it is SQLite)."""
    if not str(database.get("ENGINE", "")).startswith(SQLITE_ENGINE):
        return []
    options = database.get("OPTIONS") or {}
    warnings: list[checks.CheckMessage] = []
    if not _wal(options, database.get("NAME")):
        warnings.append(
            checks.Warning(
                "The table transport runs on SQLite without WAL: each poll waits for the "
                "writer, and writes wait for the polls.",
                hint=OPTIONS_HINT.format(
                    option='"init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"'
                ),
                id="realtime.W002",
            )
        )
    if str(options.get("transaction_mode", "")).upper() != "IMMEDIATE":
        warnings.append(
            checks.Warning(
                "The table transport runs on SQLite without transaction_mode IMMEDIATE: "
                'concurrent writers may fail with "database is locked".',
                hint=OPTIONS_HINT.format(option='"transaction_mode": "IMMEDIATE"'),
                id="realtime.W003",
            )
        )
    return warnings


def _wal(options: dict[str, Any], name: Any) -> bool:
    if WAL_PRAGMA.search(str(options.get("init_command", ""))):
        return True
    return _file_in_wal_mode(name)


def _file_in_wal_mode(name: Any) -> bool:
    """Whether an existing database file is in WAL mode (read-only: nothing is created)."""
    if not isinstance(name, str | Path) or str(name).startswith(("file:", ":memory:")):
        return False
    path = Path(name)
    if not path.is_file():
        return False
    try:
        with closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as db:
            mode = db.execute("PRAGMA journal_mode").fetchone()[0]
    except sqlite3.Error:
        return False
    return str(mode).lower() == "wal"
