"""A table transport whose history a test can take away, in every process at once.

``HistoryAwayTransport`` answers ``stream_bounds`` as the table transport does, unless the
file named by the setting ``TEST_HISTORY_AWAY`` exists: then it fails as a history whose
database is away would, while the rest of the transport (publishing, the poller) works. A
daphne worker started by the test reads the same flag, so a test can make a resume unable to
read the history without also stopping the worker from following scopes.
"""

from __future__ import annotations

import os
from collections.abc import Collection

from django.conf import settings

from realtime.exceptions import TransportError
from realtime.transports.base import StreamBounds
from realtime.transports.table import TableTransport


class HistoryAwayTransport(TableTransport):
    def stream_bounds(self, streams: Collection[str]) -> dict[str, StreamBounds] | None:
        if os.path.exists(getattr(settings, "TEST_HISTORY_AWAY", "")):
            raise TransportError("the history is away (a test's flag)")
        return super().stream_bounds(streams)
