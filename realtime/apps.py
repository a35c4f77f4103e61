"""Wiring only: system checks and the cache resets on ``setting_changed``."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.core.signals import setting_changed

from realtime.conf import PREFIX


def _reset_on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting.startswith(PREFIX):
        from realtime.transports import reset_transport

        reset_transport()


class RealtimeConfig(AppConfig):
    name = "realtime"
    verbose_name = "Realtime"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from realtime import checks  # noqa: F401 - registers the system checks

        setting_changed.connect(_reset_on_setting_changed, dispatch_uid="realtime.settings")
