"""An auth service with a ``may_subscribe`` hook, for servers that test the subscription hook.

It refuses every ``tag`` channel; ``company`` channels in the scope of slug ``secret`` or of
name ``no-company``, and for an account whose last name is ``no-company`` (so that a recheck
can change its answer); it raises for ``contact:666``. Each answer reads the database: asked
on the event loop, the hook would raise ``SynchronousOnlyOperation`` and refuse everything.

A server whose settings name a ``SUBSCRIBE_GATE`` directory also lets the test hold the hook
and count its trips (see ``Gate``): while the file ``closed-<channel>`` is there, each ask
about that channel adds a line to ``entered-<channel>`` and waits until the file is gone (10 s
at most); and each ask appends ``<user id> <channel> <trip>`` to ``calls``, where ``<trip>``
numbers the trips realtime made to its threads. Each trip runs under an execute wrapper of
its own (``realtime.blocking``), so the wrapper at the top of the connection's stack tells
the trips apart: asks in one batch share one.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Q

from realtime.auth import RealtimeAuth
from tests.testapp.models import Workspace

#: Seconds a gated ask waits at most.
GATE_WAIT = 10.0

_lock = threading.Lock()
#: The execute wrappers of the trips seen so far (kept: their ids are never reused).
_trips: list[Any] = []


class ChoosyAuth(RealtimeAuth):
    def may_subscribe(self, user: Any, scope_id: Any, channel: str) -> bool:
        gate = getattr(settings, "SUBSCRIBE_GATE", None)
        if gate:
            _record(Path(gate), user, channel)
        if channel == "contact:666":
            raise RuntimeError("a bug in may_subscribe")
        model = channel.split(":", 1)[0]
        if model == "tag":
            return False
        if model != "company":
            return True
        refusing = Workspace.objects.filter(Q(slug="secret") | Q(name="no-company"))
        if refusing.filter(pk=scope_id).exists():
            return False
        users = get_user_model()._default_manager
        return not users.filter(pk=user.pk, last_name="no-company").exists()


def _record(gate: Path, user: Any, channel: str) -> None:
    wrapper = connection.execute_wrappers[-1] if connection.execute_wrappers else None
    with _lock:
        trip = next((n for n, seen in enumerate(_trips) if seen is wrapper), None)
        if trip is None:
            trip = len(_trips)
            _trips.append(wrapper)
        with (gate / "calls").open("a") as calls:
            calls.write(f"{user.pk} {channel} {trip}\n")
    closed = gate / f"closed-{channel}"
    if not closed.exists():
        return
    with _lock, (gate / f"entered-{channel}").open("a") as entered:
        entered.write("entered\n")
    deadline = time.monotonic() + GATE_WAIT
    while closed.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
