"""Wiring only: system checks, receivers that need every model loaded, cache resets, and the
self-test of daphne's internals realtime reads when daphne is starting."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.contrib.auth.signals import user_logged_out
from django.core.signals import setting_changed

from realtime.conf import PREFIX

#: Settings the recheck triggers are wired from.
RECHECK_SETTINGS = {
    "AUTH_USER_MODEL",
    PREFIX + "SCOPE_MODEL",
    PREFIX + "SCOPE_MEMBERS",
    PREFIX + "RECHECK_MODELS",
}
#: Settings a token's signature is checked with.
SIGNING_SETTINGS = {"SECRET_KEY", "SECRET_KEY_FALLBACKS"}


def _reset_on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting.startswith(PREFIX):
        from realtime.auth import reset_auth
        from realtime.transports import TRANSPORT_SETTINGS, reset_transport

        if setting.removeprefix(PREFIX) in TRANSPORT_SETTINGS:
            reset_transport()
        reset_auth()
    if setting in SIGNING_SETTINGS:
        from realtime.tokens import forget_checked_tokens

        forget_checked_tokens()
    if setting in RECHECK_SETTINGS:
        from realtime.writes import rechecks

        rechecks.connect()


class RealtimeConfig(AppConfig):
    name = "realtime"
    verbose_name = "Realtime"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from realtime import checks  # registers the system checks
        from realtime.conf import validate_with

        validate_with(checks.settings.check_settings)  # for servers, which run no checks
        from realtime.writes import (
            deletes,
            guard_links,
            memberships,
            querysets,
            rechecks,
            relay,
            shared_roots,
        )

        deletes.connect_database_cascades()
        deletes.connect_unlinked()
        shared_roots.connect()
        memberships.connect()
        for model in memberships.membership_models():
            querysets.install(model)  # their bulk writes change memberships
        guard_links.connect()
        for model in [*shared_roots.link_models(), *guard_links.link_models()]:
            querysets.install(model)  # their writes (the manager's too) change readers
        rechecks.connect()
        user_logged_out.connect(rechecks.on_logged_out, dispatch_uid=rechecks.LOGGED_OUT_UID)
        relay.connect()
        setting_changed.connect(_reset_on_setting_changed, dispatch_uid="realtime.settings")
        # daphne runs no lifespan events: a worker's start, for it, is when its apps are ready.
        from realtime.sockets.link import check_starting_server

        check_starting_server()
