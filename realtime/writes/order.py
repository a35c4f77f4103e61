"""Where each announced version of a row stands among the row's versions: its ``order``.

Announcements are published after commit, each by the process that made its write, so two
transactions writing one row a moment apart may be published the other way round. Workers
put them back in order (``realtime.sockets.record_order``): each model event carries an
``order``, ``[source, number]``, and a worker drops an event whose number is below the last
one it delivered for the same row of the same source.

The number must grow with the row's commit order, so it is taken while the write holds the
row's lock: inside the write's transaction, after the write. A transaction that writes the
row later can only do so once this one committed, and so takes a greater number:

``<alias>:outbox``
    On a durable transport, the id of the announcement's row in ``realtime_outbox``, which
    is inserted right after the write (a sequence or auto-increment: the database's own
    order, whatever the hosts' clocks). Free: the row is written anyway.
``<alias>:clock``
    Otherwise the writing process's clock in nanoseconds, read after the write: exact on one
    host (and for SQLite, whose writers share the file's host); across hosts, as good as
    their clocks agree. A database read would be exact everywhere but cost a round trip per
    write (measured: as much as the write itself on PostgreSQL).

A write outside a transaction (a plain ``save()`` or ``update()`` in autocommit) has no such
moment: Django committed it before realtime announces it, so its events carry no order and
are delivered as they come (a transaction of realtime's around an ``update()`` would give it
one, for two more round trips and the savepoints realtime's reads need inside a transaction:
about 0.7 ms on PostgreSQL, measured, so it is not opened). So do events of rows that enter
or leave an account's view without a write of their own (``accounts``), and the rows an
autocommit publish kept in the outbox after it failed.

A many-to-many ``add()``, ``remove()`` or ``clear()`` writes the link table alone: it holds
no lock on the owner row (PostgreSQL's foreign key check takes ``FOR KEY SHARE``, which an
``UPDATE`` does not wait for; a ``remove()`` takes nothing), so a transaction updating the row
meanwhile may take a greater number and commit first. Locking the row would change what
Django locks (a ``FOR UPDATE`` blocks writers, and can deadlock where Django does not), so the
owner's ``updated`` event of a link change (``Event.links_only``) is told so that its place
does not matter: its readers who keep the row hear its identity and the links it names (the
other fields its instance holds may be older than a write told before it), live queries read
the row again, and its order carries a third part, ``"links"``. A worker delivers it whatever
came before and remembers nothing of it, but drops it after the row's delete with a greater
number: a delete of the row waits for the transaction that changed its links (the link rows it
removes, or the foreign key check's lock on the row), so the links came first. The same event
coalesced with a write of the row in its transaction is that write's: its data and its order.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from realtime.writes.events import Event


def stamp(items: Sequence[Any], using: str, outbox_ids: Sequence[int | None]) -> None:
    """Give each model event of ``items`` (announced in the open transaction on ``using``,
    right after their write) its order: its outbox row's id where it has one, else the clock."""
    clock: list[Any] | None = None
    for item, row_id in zip(items, outbox_ids, strict=True):
        if not ordered(item):
            continue
        if row_id is not None:
            item.order = [f"{using}:outbox", row_id]
        else:
            clock = clock or [f"{using}:clock", time.time_ns()]
            item.order = clock


def ordered(item: Any) -> bool:
    """Whether ``item`` is an event of its row's own write (which an order is given)."""
    return isinstance(item, Event) and item.accounts is None


#: What an event written to the outbox in its transaction is dumped with: its number is its
#: row's id, which the row does not know yet (``relayed``).
PENDING = "outbox"


def pending(items: Sequence[Any]) -> None:
    """Mark the events of ``items`` about to be written to the outbox in their transaction."""
    for item in items:
        if ordered(item):
            item.order = [PENDING]


def relayed(item: Any, using: str, row_id: int) -> None:
    """Give an event read back from the outbox row ``row_id`` its order, if it was written in
    its write's transaction (``PENDING``); one kept there after its publish failed has none."""
    if isinstance(item, Event) and item.order == [PENDING]:
        item.order = [f"{using}:outbox", row_id]
