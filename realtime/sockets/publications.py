"""Where the messages a worker carries begin and end their publications.

A live query's client is told what a publication (one transaction's messages, published
together) changed in one ``query.diff``, not one per message: so the worker tells it once the
publication's last message is carried. Each message of a publication of two or more says its
place (``realtime.messages.publication_of``): how many of its messages follow on its channel,
and on how many channels it has messages. Messages of one channel arrive in order; those of
other channels arrive with them on a transport with one stream (the table, ``pg_notify``), or
on their own streams (Redis), and some may be on channels this worker does not hear.
"""

from __future__ import annotations

from realtime.messages import Publication

#: Seconds to wait for the rest of a publication a channel still owes (it is on the way, in
#: the same stream) before telling the clients what the part carried changed.
OWED_WAIT = 1.0
#: Seconds to wait for a publication's messages on other channels once every channel heard so
#: far has ended (they may be on a channel this worker does not hear).
ELSEWHERE_WAIT = 0.005


class Publications:
    """The publication being carried: which of its channels owe more messages, and how many
    have ended."""

    def __init__(self) -> None:
        self.current: str | None = None
        self.owing: set[str] = set()
        self.ended = 0
        self.channels = 0

    def take(self, publication: Publication | None) -> bool:
        """A message of ``publication`` is next: whether it continues the one being carried
        (``False``: it begins another, and the one before is over, whole or not)."""
        if publication is not None and publication.id == self.current:
            return True
        self.current = None if publication is None else publication.id
        self.owing.clear()
        self.ended = 0
        self.channels = 0 if publication is None else publication.channels
        return False

    def carried(self, channel: str, publication: Publication | None) -> None:
        """The message of ``publication`` on ``channel`` was carried."""
        if publication is None:
            return
        if publication.rest > 0:
            self.owing.add(channel)
        else:
            self.owing.discard(channel)
            self.ended += 1

    @property
    def whole(self) -> bool:
        """Whether every message of the publication being carried was carried."""
        return not self.owing and self.ended >= self.channels

    def wait(self) -> float:
        """How long to wait for the rest of an unfinished publication."""
        return OWED_WAIT if self.owing else ELSEWHERE_WAIT

    def give_up(self) -> None:
        """The rest did not come in time: what was carried of it is told as it is."""
        self.take(None)
