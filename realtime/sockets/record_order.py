"""A worker delivers each row's versions in the order they committed.

Writers publish after commit, so two transactions writing one row a moment apart may reach
a worker the other way round. Each model event carries the ``order`` of its version
(``realtime.writes.order``: ``[source, number]``, the number growing with the row's commit
order); ``RecordOrder`` remembers, for the rows it saw last, the greatest number it let
through, and drops an event of a row whose number is below it: that version was superseded
before it arrived, and delivering it would leave sockets showing the older one. Events of
one write (its scope's message, its accounts', its leavers') share a number and all pass.

Events with no order (an autocommit write, an application's own event, a row entering an
account's view) pass and change nothing. An event of a row's many-to-many links alone
(``[source, number, "links"]``: no write of the row, which it did not hold) tells the row's
identity and those links, not the fields a later version may contradict: it passes
whatever came before, but for the row's delete with a greater number (the delete waited
for its links), and changes nothing. A clock number from a writer whose clock is ahead
of this worker's by more than ``ORDER_CLOCK_AHEAD`` is not trusted (it would hold back every
other writer's events of that row): its event passes, unremembered, and one WARNING says so.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from typing import Any

from realtime import limits, metrics
from realtime.messages import LINKS

logger = logging.getLogger(__name__)

_AHEAD_NS = int(limits.ORDER_CLOCK_AHEAD * 1e9)


class RecordOrder:
    """The greatest order number let through, per row, for the ``size`` rows seen last."""

    def __init__(self, size: int = limits.ORDER_MEMORY) -> None:
        self.size = size
        #: The greatest number let through, and whether it deleted the row (not a leave).
        self._last: OrderedDict[tuple[str, str, Any], tuple[int, bool]] = OrderedDict()
        self._warned = False

    def superseded(self, message: dict[str, Any], *, remember: bool = True) -> bool:
        """Whether ``message`` tells a version of a row older than one already let through
        (remember its number otherwise, unless not to ``remember``: a resume's held frames
        are compared with what its replay let through, which several sockets share)."""
        key, number, links = _order_of(message)
        if key is None:
            return False
        if key[0].endswith(":clock") and number > time.time_ns() + _AHEAD_NS:
            self._warn_ahead(key[0], number)
            return False
        last = self._last.get(key)
        if links:
            if last is not None and last[1] and number < last[0]:
                metrics.superseded()
                return True
            return False
        gone = _deletes(message)
        if last is not None and number < last[0]:
            metrics.superseded()
            return True
        if not remember:
            return False
        if last is not None:
            gone = gone or (number == last[0] and last[1])  # another message of that delete
            self._last.move_to_end(key)
        self._last[key] = (number, gone)
        if len(self._last) > self.size:
            self._last.popitem(last=False)
        return False

    def merge(self, other: RecordOrder) -> None:
        """Remember, of each row ``other`` remembers, the greater number of the two (and
        whether it deleted the row): a version either let through is one that committed,
        so a version older than it is superseded for every socket here (see
        ``Dispatcher.replayed``, which merges what a resume's replay let through into the
        live memory once live delivery has caught up with it)."""
        last = self._last
        for key, (number, gone) in other._last.items():
            held = last.get(key)
            if held is not None:
                if number < held[0]:
                    continue
                if number == held[0]:
                    gone = gone or held[1]
                last.move_to_end(key)
            last[key] = (number, gone)
        while len(last) > self.size:
            last.popitem(last=False)

    def _warn_ahead(self, source: str, number: int) -> None:
        if not self._warned:
            self._warned = True
            logger.warning(
                "realtime: a writer's clock (%s) is %.1f s ahead of this worker's: the "
                "events it announces are delivered as they come, not in each row's commit "
                "order, until the clocks agree (keep the hosts' clocks synchronized)",
                source,
                (number - time.time_ns()) / 1e9,
            )


def _deletes(message: dict[str, Any]) -> bool:
    """Whether ``message`` tells its row deleted (not leaving some readers' view)."""
    event_type = message.get("event_type")
    meta = message.get("meta")
    moved = isinstance(meta, dict) and meta.get("moved")
    return isinstance(event_type, str) and event_type.endswith(".deleted") and not moved


def _order_of(message: dict[str, Any]) -> tuple[tuple[str, str, Any] | None, int, bool]:
    """The row ``message`` tells of, as ``(source, model, id)``, its order number and
    whether it tells the row's links alone; ``(None, 0, False)`` for a message without an
    order."""
    meta = message.get("meta")
    order = meta.get("order") if isinstance(meta, dict) else None
    data = message.get("data")
    event_type = message.get("event_type")
    links = isinstance(order, list) and len(order) == 3 and order[2] == LINKS
    if links and isinstance(order, list):
        order = order[:2]
    if not (
        isinstance(order, list)
        and len(order) == 2
        and isinstance(order[0], str)
        and isinstance(order[1], int)
        and isinstance(data, dict)
        and isinstance(event_type, str)
    ):
        return None, 0, False
    row = data.get("id")
    if row is None:
        return None, 0, False
    if not isinstance(row, (int, str)):
        row = json.dumps(row, sort_keys=True)  # a composite key's list
    return (order[0], event_type.rpartition(".")[0], row), order[1], links
