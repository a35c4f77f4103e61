"""The table transport on SQLite without WAL (``realtime.W002``) or without IMMEDIATE
transactions (``realtime.W003``): each id with its hint, on real database files."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from realtime.checks.database import check_database, sqlite_warnings

WAL = "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"


def sqlite(name: Any = ":memory:", **options: Any) -> dict[str, Any]:
    return {"ENGINE": "django.db.backends.sqlite3", "NAME": name, "OPTIONS": options}


def ids(database: dict[str, Any]) -> list[str | None]:
    messages = sqlite_warnings(database)
    for message in messages:
        assert message.hint
        assert "OPTIONS" in message.hint
    return [message.id for message in messages]


def test_sqlite_with_wal_and_immediate_transactions_passes() -> None:
    assert ids(sqlite(init_command=WAL, transaction_mode="IMMEDIATE")) == []


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"init_command": "PRAGMA synchronous=NORMAL;"},
        {"init_command": "PRAGMA journal_mode=DELETE"},
    ],
)
def test_sqlite_without_wal_is_warning_w002(options: dict[str, Any]) -> None:
    assert ids(sqlite(transaction_mode="IMMEDIATE", **options)) == ["realtime.W002"]


def test_the_w002_hint_gives_the_init_command() -> None:
    (warning,) = sqlite_warnings(sqlite(transaction_mode="IMMEDIATE"))
    assert "journal_mode=WAL" in str(warning.hint)


@pytest.mark.parametrize("mode", [None, "DEFERRED", "EXCLUSIVE"])
def test_sqlite_without_immediate_transactions_is_warning_w003(mode: str | None) -> None:
    options = (
        {"init_command": WAL} if mode is None else {"init_command": WAL, "transaction_mode": mode}
    )
    assert ids(sqlite(**options)) == ["realtime.W003"]


def test_the_w003_hint_gives_the_transaction_mode() -> None:
    (warning,) = sqlite_warnings(sqlite(init_command=WAL))
    assert '"transaction_mode": "IMMEDIATE"' in str(warning.hint)


def test_sqlite_with_neither_gives_w002_and_w003() -> None:
    assert ids(sqlite()) == ["realtime.W002", "realtime.W003"]


def test_a_database_file_already_in_wal_mode_needs_no_init_command(tmp_path: Path) -> None:
    path = tmp_path / "wal.sqlite3"
    with closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA journal_mode=WAL")
    assert ids(sqlite(path, transaction_mode="IMMEDIATE")) == []
    assert ids(sqlite(str(path), transaction_mode="IMMEDIATE")) == []


def test_a_database_file_in_rollback_journal_mode_is_warning_w002(tmp_path: Path) -> None:
    path = tmp_path / "delete.sqlite3"
    with closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE t (x)")
    assert ids(sqlite(path, transaction_mode="IMMEDIATE")) == ["realtime.W002"]


def test_a_database_file_that_does_not_exist_is_not_created(tmp_path: Path) -> None:
    path = tmp_path / "absent.sqlite3"
    assert ids(sqlite(path, transaction_mode="IMMEDIATE")) == ["realtime.W002"]
    assert not path.exists()


@pytest.mark.parametrize("engine", ["django.db.backends.postgresql", "django.db.backends.mysql"])
def test_other_databases_get_no_sqlite_warning(engine: str) -> None:
    assert sqlite_warnings({"ENGINE": engine, "NAME": "x", "OPTIONS": {}}) == []


def test_the_test_settings_pass() -> None:
    assert check_database() == []


def test_the_pg_notify_transport_is_not_checked_for_sqlite_options() -> None:
    # Only the table transport polls the database; pg_notify on SQLite is realtime.E020.
    with override_settings(REALTIME_TRANSPORT="pg_notify"):
        assert check_database() == []
