"""realtime, installed under its own label by a package ``runtests.py`` finds beside it."""

from __future__ import annotations

import os

import realtime.apps


class RealtimeSuiteConfig(realtime.apps.RealtimeConfig):
    """realtime's own app config: ``name`` makes the app ``realtime``, whose models and
    migrations Django's test databases then hold. In the decorated run a failure to prepare
    an announcement raises in the write that met it, so a silent miss fails its test."""

    name = "realtime"

    def ready(self) -> None:
        super().ready()
        if os.environ.get("REALTIME_SUITE_DECORATE") == "1":
            from realtime.testing import raise_preparation_failures

            raise_preparation_failures()
