"""Settings of the test suite; ``REALTIME_TEST_DATABASE`` picks sqlite, postgresql or mariadb.

Subprocesses started by tests (publishers, trimmers, daphne) must reach the database the test
process uses, so ``REALTIME_TEST_DATABASE_NAME`` overrides the database name: the test process
passes the name of its test database on to its children. SQLite's test database is a file,
never in memory, for the same reason.
"""

import json
import os
import tempfile
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
DATABASE = os.environ.get("REALTIME_TEST_DATABASE", "sqlite")
DATABASE_NAME = os.environ.get("REALTIME_TEST_DATABASE_NAME")
HOST = os.environ.get("REALTIME_TEST_DATABASE_HOST", "127.0.0.1")
USER = os.environ.get("REALTIME_DB_USER", "realtime")
PASSWORD = os.environ.get("REALTIME_DB_PASSWORD", "realtime")
SQLITE_DIR = Path(os.environ.get("REALTIME_TEST_SQLITE_DIR", tempfile.gettempdir()))
# Lets two test runs share the servers without sharing test databases.
RUN = os.environ.get("REALTIME_TEST_RUN", "")
TEST_NAME = f"test_realtime{RUN}"

if DATABASE == "sqlite":
    default = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": DATABASE_NAME or str(SQLITE_DIR / "realtime.sqlite3"),
        "TEST": {"NAME": str(SQLITE_DIR / f"{TEST_NAME}.sqlite3")},
        "OPTIONS": {
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
        },
    }
elif DATABASE == "postgresql":
    default = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": DATABASE_NAME or "realtime",
        "USER": USER,
        "PASSWORD": PASSWORD,
        "HOST": HOST,
        "PORT": os.environ.get("REALTIME_TEST_POSTGRESQL_PORT", "5432"),
        "TEST": {"NAME": TEST_NAME},
    }
elif DATABASE == "mariadb":
    default = {
        "ENGINE": "django.db.backends.mysql",
        "NAME": DATABASE_NAME or "realtime",
        "USER": USER,
        "PASSWORD": PASSWORD,
        "HOST": HOST,
        "PORT": os.environ.get("REALTIME_TEST_MARIADB_PORT", "3306"),
        "OPTIONS": {"charset": "utf8mb4"},
        "TEST": {"NAME": TEST_NAME, "CHARSET": "utf8mb4", "COLLATION": "utf8mb4_unicode_ci"},
    }
else:
    raise RuntimeError(
        f"REALTIME_TEST_DATABASE must be sqlite, postgresql or mariadb, not {DATABASE!r}"
    )

# A second database, always SQLite (two SQLite files, or SQLite beside the server): decorated
# models written there announce after its own commits (tests/test_databases.py).
other = {
    "ENGINE": "django.db.backends.sqlite3",
    "NAME": str(SQLITE_DIR / "realtime-other.sqlite3"),
    "TEST": {"NAME": str(SQLITE_DIR / f"{TEST_NAME}-other.sqlite3")},
    "OPTIONS": {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
    },
}

# A read replica of the default database (the same database in tests: Django mirrors it), for
# the tests of writes routed to the primary while reads go to a replica.
replica = {**default, "TEST": {"MIRROR": "default"}}

DATABASES = {"default": default, "other": other, "replica": replica}
DATABASE_ROUTERS = ["tests.routers.NoMigrationsOnTheReplica"]

SECRET_KEY = "tests-only-secret-key-of-realtime"
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "channels",
    "realtime",
    "tests.testapp",
]
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "tests.urls"

REALTIME_SCOPE_MODEL = "testapp.Workspace"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "loggers": {"realtime": {"level": "DEBUG"}},
}

# Subprocesses (daphne) take per-test setting overrides as JSON, e.g. a small frame limit.
globals().update(json.loads(os.environ.get("REALTIME_TEST_SETTINGS", "{}")))
# ... and ``STALE_REPLICA``, the file of a SQLite database that stands for a replica behind its
# primary: it has the tables and none of the latest rows (tests/test_replica_reads.py).
if globals().get("STALE_REPLICA"):
    DATABASES["replica"] = {**other, "NAME": globals()["STALE_REPLICA"]}
