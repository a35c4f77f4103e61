"""Every concrete model of the test apps decorated right after its class statement.

Django sends ``class_prepared`` when a model class statement has been run, just before the
class is bound to its name: where a ``@realtime_model`` line above it would apply. Models
Django builds itself are left alone, as no decorator ever sees them: the historical models
migrations render (module ``__fake__``), auto-created through tables, and proxies (they
announce as their decorated parents do). So are the models a test declares inside its own
body (``<locals>`` in their qualified name): they are that test's fixtures, not its app's
models, and some tests count the signal receivers connected while holding such a model —
a decorated model has its receivers for as long as its class lives. Realtime's own suite
decorates such short-lived models, and checks that they are released with their class.

Each model is global (``scope_field=None``: Django's test models have neither a scope nor
accounts), named after its app and its class, as a project with two ``Book`` models names
them apart.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models.signals import class_prepared

_apps: frozenset[str] = frozenset()


def decorate_apps(labels: Iterable[str]) -> None:
    """Decorate, from now on, every concrete model whose app label is one of ``labels``."""
    global _apps
    _apps = frozenset(labels)
    class_prepared.connect(_decorate, dispatch_uid="realtime_suite.decorate")


def _decorate(sender: Any, **kwargs: Any) -> None:
    meta = sender._meta
    if meta.app_label not in _apps or sender.__module__ == "__fake__":
        return
    if "<locals>" in sender.__qualname__:
        return
    if meta.abstract or meta.proxy or meta.auto_created:
        return
    from realtime import realtime_model

    realtime_model(scope_field=None, name=f"{meta.app_label}_{meta.model_name}")(sender)
