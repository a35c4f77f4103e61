"""``realtime.E040``: models decorated with ``@realtime_model`` while realtime is not installed.

Without ``"realtime"`` in ``INSTALLED_APPS`` realtime's app config never runs: none of its
system checks is registered, its table is never migrated, and every announced write fails on
the missing table (logged, the write itself stands). The decorator's module is what such a
project imports (its ``models.py`` does), so it imports this one: a module runs once, so the
check is registered once, and it reports only when realtime is not installed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.apps import apps
from django.core import checks

from realtime.registry import all_options


@checks.register()
def check_installed(app_configs: Iterable[Any] | None = None, **kwargs: Any) -> list[Any]:
    """Report decorated models when ``"realtime"`` is not in ``INSTALLED_APPS``."""
    if apps.is_installed("realtime"):
        return []
    installed = set(apps.get_models())
    labels = sorted({o.model._meta.label for o in all_options() if o.model in installed})
    if not labels:
        return []
    return [
        checks.Error(
            f'"realtime" is not in INSTALLED_APPS, yet {", ".join(labels)} '
            f"{'is' if len(labels) == 1 else 'are'} decorated with @realtime_model: their "
            "writes are not announced, and each logs an error on realtime's missing table.",
            hint='Add "channels" and "realtime" to INSTALLED_APPS ("daphne" first, to serve '
            'the socket with runserver), then run "python manage.py migrate".',
            id="realtime.E040",
        )
    ]
