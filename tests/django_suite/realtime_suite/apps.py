"""realtime, installed under its own label by a package ``runtests.py`` finds beside it."""

from __future__ import annotations

import realtime.apps


class RealtimeSuiteConfig(realtime.apps.RealtimeConfig):
    """realtime's own app config: ``name`` makes the app ``realtime``, whose models and
    migrations Django's test databases then hold."""

    name = "realtime"
