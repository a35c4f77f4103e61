"""The test settings with accounts, scopes and records keyed by UUIDs and text.

``AUTH_USER_MODEL`` cannot change inside a run, so these settings get a run (and a test
database) of their own: ``pytest --ds=tests.settings_uuid tests/test_uuid_keys.py``.
"""

import json
import os
from typing import Any

from tests.settings import *  # noqa: F403
from tests.settings import RUN, SQLITE_DIR, default

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "channels",
    "realtime",
    "tests.uuidapp",
]
AUTH_USER_MODEL = "uuidapp.Account"
REALTIME_SCOPE_MODEL = "uuidapp.Team"
REALTIME_SCOPE_MEMBERS = "members"

_base: dict[str, Any] = dict(default)
_name = f"test_realtime_uuid{RUN}"
if str(_base["ENGINE"]).endswith("sqlite3"):
    _name = str(SQLITE_DIR / f"{_name}.sqlite3")
DATABASES = {"default": {**_base, "TEST": {**_base["TEST"], "NAME": _name}}}

# Subprocesses (daphne) take per-test setting overrides as JSON, as in ``tests.settings``.
globals().update(json.loads(os.environ.get("REALTIME_TEST_SETTINGS", "{}")))
