"""System checks of the databases: SQLite's options left on another database
(``realtime.E022``), a database announcing writes that may not hold the outbox of a durable
transport (``realtime.E025``), realtime's log kept by the routers off the database the
transport writes it on (``realtime.E026``), and the options the table transport needs on
SQLite (``realtime.W002``/``W003``).

The quickstart's SQLite ``OPTIONS`` (a ``PRAGMA`` ``init_command``, ``transaction_mode``,
``timeout``) kept when ``ENGINE`` becomes PostgreSQL or MySQL fail the first connection:
PostgreSQL's driver refuses options it does not know ('invalid connection option'), MySQL's
(mysqlclient) takes no ``transaction_mode`` nor ``timeout`` (its own are ``connect_timeout``,
``read_timeout``, ``write_timeout``) and runs ``init_command`` as SQL, in which ``PRAGMA`` is a
syntax error. ``E022`` names the alias and the option, for every alias of ``connections``; the
vendor is the backend's (``connection.vendor``), loaded as Django loads it, never connected.

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
import sys
from collections.abc import Iterable, Mapping
from contextlib import closing
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, router

from realtime.conf import raw

WAL_PRAGMA = re.compile(r"journal_mode\s*=\s*['\"]?wal\b", re.IGNORECASE)
PRAGMA = re.compile(r"\bPRAGMA\b", re.IGNORECASE)
SQLITE_ENGINE = "django.db.backends.sqlite3"
OPTIONS_HINT = 'Add {option} to DATABASES["default"]["OPTIONS"].'
#: The vendors (``connection.vendor``) SQLite's options are reported on, by their names.
OTHER_VENDORS = {"postgresql": "PostgreSQL", "mysql": "MySQL"}
#: The options of SQLite's backend that neither PostgreSQL's nor MySQL's driver takes.
SQLITE_ONLY_OPTIONS = ("transaction_mode", "timeout")


@checks.register()
def check_sqlite_options_elsewhere(
    app_configs: Iterable[Any] | None = None, **kwargs: Any
) -> list[Any]:
    """``realtime.E022`` for each alias of ``DATABASES`` (see the module docstring)."""
    errors: list[checks.CheckMessage] = []
    for alias in connections:
        try:
            vendor = connections[alias].vendor
        except ImproperlyConfigured:
            continue  # a backend that cannot be loaded: Django says why at the first query
        database: dict[str, Any] = settings.DATABASES.get(alias) or {}
        errors += sqlite_options_elsewhere(alias, vendor, database.get("OPTIONS") or {})
    return errors


def sqlite_options_elsewhere(
    alias: str, vendor: str, options: Mapping[str, Any]
) -> list[checks.CheckMessage]:
    """The errors for the ``OPTIONS`` of one alias on ``vendor`` (``connection.vendor``): none
    unless PostgreSQL or MySQL."""
    name = OTHER_VENDORS.get(vendor)
    if name is None:
        return []
    errors: list[checks.CheckMessage] = []
    if PRAGMA.search(str(options.get("init_command", ""))):
        errors.append(_sqlite_option(alias, "init_command", name, "a PRAGMA "))
    errors += [
        _sqlite_option(alias, option, name) for option in SQLITE_ONLY_OPTIONS if option in options
    ]
    return errors


def _sqlite_option(alias: str, option: str, vendor: str, what: str = "") -> checks.Error:
    return checks.Error(
        f'DATABASES["{alias}"]["OPTIONS"] holds {what}{option!r}, an option of SQLite: '
        f"{vendor} fails at the first connection.",
        hint=f'Remove "{option}" from DATABASES["{alias}"]["OPTIONS"] (it came with SQLite\'s '
        f"settings); realtime needs no option on {vendor}.",
        id="realtime.E022",
    )


@checks.register()
def check_outbox_databases(app_configs: Iterable[Any] | None = None, **kwargs: Any) -> list[Any]:
    """``realtime.E025``: with a durable transport, each alias where the routers let a
    decorated model live must let realtime's outbox live there too: its rows are written in
    the write's own transaction. A replica (an alias whose ``TEST["MIRROR"]`` names another)
    takes no write, and is left out."""
    if not _uses_durable_transport():
        return []
    from realtime.models import OutboxItem
    from realtime.registry import all_options

    errors: list[checks.CheckMessage] = []
    for alias in connections:
        if _allows(alias, OutboxItem) or _mirrors(alias):
            continue
        models = sorted(o.model._meta.label for o in all_options() if _allows(alias, o.model))
        if models:
            errors.append(
                checks.Error(
                    f"The transport is durable, and the database routers let "
                    f"{', '.join(models)} live on {alias!r} but not realtime's outbox "
                    "(realtime.OutboxItem): writes there cannot be recorded in their "
                    "transaction, and one may be lost if its process dies after the commit.",
                    hint=f"Let allow_migrate() accept app 'realtime' on {alias!r}, then "
                    f"run migrate --database {alias}.",
                    id="realtime.E025",
                )
            )
    return errors


#: The alias the table transport and pg_notify write realtime's log on: ``get_transport``
#: builds them with no arguments, and they publish on ``"default"``.
LOG_ALIAS = "default"


@checks.register()
def check_log_database(app_configs: Iterable[Any] | None = None, **kwargs: Any) -> list[Any]:
    """``realtime.E026``: the table transport, and pg_notify with its log, write every message
    into realtime's log (``firm_channel_messages``) on ``LOG_ALIAS``: routers that keep the app
    ``realtime`` off that alias leave the table missing there (``migrate`` honours them), and
    every announcement fails to publish, logged and never raised into the write."""
    if not (_uses_table_transport() or _uses_pg_notify_log()):
        return []
    from realtime.models import ChannelMessage

    if router.allow_migrate_model(LOG_ALIAS, ChannelMessage):
        return []
    return [
        checks.Error(
            f"The transport writes realtime's log (realtime.ChannelMessage, table "
            f"{ChannelMessage._meta.db_table}) on {LOG_ALIAS!r}, and the database routers do "
            f"not let it live there: migrate does not create it, and every announcement "
            f"fails to publish.",
            hint=f"Let allow_migrate() accept app 'realtime' on {LOG_ALIAS!r}, then run "
            f"migrate --database {LOG_ALIAS}.",
            id="realtime.E026",
        )
    ]


def _uses_pg_notify_log() -> bool:
    """Whether the transport is pg_notify keeping its log (``REALTIME_PG_NOTIFY_LOG``)."""
    from realtime.transports import transport_class

    value = raw("TRANSPORT")
    try:
        chosen = transport_class(value) if isinstance(value, str) else None
    except ImproperlyConfigured:
        return False  # realtime.E001 says why
    # A subclass of it has its module imported; it is not imported for nothing (it needs
    # its driver).
    pg_notify = sys.modules.get("realtime.transports.pg_notify")
    if chosen is None or pg_notify is None or not issubclass(chosen, pg_notify.PgNotifyTransport):
        return False
    return raw("PG_NOTIFY_LOG") is not False


def _mirrors(alias: str) -> bool:
    """Whether ``alias`` is a replica of another (``TEST["MIRROR"]``)."""
    given: dict[str, Any] = settings.DATABASES.get(alias, {})
    test: dict[str, Any] = given.get("TEST") or {}
    return bool(test.get("MIRROR"))


def _allows(alias: str, model: Any) -> bool:
    """Whether the routers let ``model``'s table live on ``alias`` (managed or not)."""
    meta = model._meta
    return bool(router.allow_migrate(alias, meta.app_label, model_name=meta.model_name))


def _uses_durable_transport() -> bool:
    from realtime.transports import transport_class

    value = raw("TRANSPORT")
    try:
        return isinstance(value, str) and transport_class(value).durable
    except ImproperlyConfigured:
        return False  # realtime.E001 says why


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
