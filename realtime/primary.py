"""Where realtime reads what a write decided: the database the model's writes go to.

Much of what realtime reads comes right after a commit: who may read a row just written,
which scopes an account still belongs to once a membership changed, the rows of a live query
whose stream starts at that commit. A read replica may not have the commit yet. Read there,
an event would reach nobody, a socket would keep a scope its account left, or a list would
miss a row, and nothing later would correct it. So when no alias is given, realtime reads
where ``router.db_for_write`` sends the model's writes, never where ``db_for_read`` would
send an application's own reads.
"""

from __future__ import annotations

from typing import Any

from django.db import models, router


def primary(model: type[models.Model]) -> str:
    """The alias ``model``'s writes go to, where realtime reads about them."""
    return router.db_for_write(model)


def on_primary(
    model: type[models.Model], using: str | None = None, *, base: bool = False
) -> models.Manager[Any]:
    """``model``'s default manager (``base``: its base manager) on ``using``, else on the
    alias its writes go to."""
    manager = model._base_manager if base else model._default_manager
    return manager.db_manager(using or primary(model))
