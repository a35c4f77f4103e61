"""Settings of Django's test suite (as its ``test_sqlite``), with realtime beside it.

The environment says what ``run.py`` asks for: the database (``REALTIME_SUITE_DATABASE``),
whether every model is decorated (``REALTIME_SUITE_DECORATE``, see ``decorating``), and where
the runner records each test's outcome (``REALTIME_SUITE_RESULTS``).
"""

from __future__ import annotations

import os
from typing import Any

from . import decorating

_database = os.environ.get("REALTIME_SUITE_DATABASE", "sqlite")


def _postgresql(name: str) -> dict[str, Any]:
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": os.environ.get("REALTIME_DB_USER", "realtime"),
        "PASSWORD": os.environ.get("REALTIME_DB_PASSWORD", "realtime"),
        "HOST": os.environ.get("REALTIME_TEST_DATABASE_HOST", "127.0.0.1"),
        "PORT": os.environ.get("REALTIME_TEST_POSTGRESQL_PORT", "5432"),
        "TEST": {"NAME": f"test_realtime_suite_{name}"},
    }


if _database == "postgresql":
    DATABASES = {"default": _postgresql("default"), "other": _postgresql("other")}
else:
    DATABASES = {
        "default": {"ENGINE": "django.db.backends.sqlite3"},
        "other": {"ENGINE": "django.db.backends.sqlite3"},
    }

SECRET_KEY = "django_tests_secret_key"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
USE_TZ = False

TEST_RUNNER = "realtime_suite.runner.RecordingRunner"

if os.environ.get("REALTIME_SUITE_DECORATE") == "1":
    decorating.decorate_apps(os.environ["REALTIME_SUITE_APPS"].split(","))
