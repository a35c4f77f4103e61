"""After commit: from the announcements of one transaction to one ``Transport.publish`` call.

``publish`` reads top to bottom: coalesce the events of each row, turn each announcement into
messages (asking the audiences that are asked after commit), publish them all in one call.
Several events of one row in one transaction become one: created+updated is a ``created``,
updated+updated one ``updated`` whose ``changed`` is the union, anything+deleted a
``deleted`` (also told to the readers an earlier write of the transaction took the row from,
and not to those it gave the row to: they never read it as committed), created+deleted
nothing; the event sits at its last write. Nothing raised here
reaches the write that committed: failures are logged, and cost only what failed.

Announcements relayed from realtime's outbox (durable transports) carry the key of their rows
(``txn``), handed to the transport (a call per range of rows: see ``Built``), and a
``relayed`` callback that deletes the rows once the transport took the messages, in
whichever thread published them; a sweeper relaying rows later builds their messages with
``build`` and publishes them with ``send_now``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from django.db import DEFAULT_DB_ALIAS, OperationalError, close_old_connections, connections

from realtime import limits
from realtime.compat.django import in_manual_transaction, in_transaction
from realtime.encoding import normal_id, sorted_ids
from realtime.logs import log_hook_failure, log_operation
from realtime.messages import mark_publication, named_alias
from realtime.readers import shared_readers_once
from realtime.transports import get_transport
from realtime.transports.base import Transport
from realtime.writes.events import Event
from realtime.writes.items import Announcement, Recheck
from realtime.writes.packing import about_row, place_messages, recheck_messages, users_messages
from realtime.writes.views import (
    earlier_readers_messages,
    outside_recipients,
    readers_from_before,
    recipients,
    shared_readers,
    view_messages,
)

logger = logging.getLogger(__name__)


#: Called once the messages of the announcements were published (the outbox deletes their
#: rows then); not called when publishing failed.
Relayed = Callable[[], None]
#: Called when the transport failed to take the messages (an autocommit write's
#: announcements are then kept in the outbox).
Unsent = Callable[[], None]


def publish(
    items: Iterable[Event | Announcement],
    using: str = DEFAULT_DB_ALIAS,
    *,
    txn: str | None = None,
    seqs: Sequence[int] | None = None,
    relayed: Relayed | None = None,
    unsent: Unsent | None = None,
) -> None:
    """Publish committed announcements of writes on ``using`` in one transport call (a relay
    of many outbox rows: one per run of ``Built``), in write order; never raise. ``txn``
    keys the outbox rows they came from, ``seqs`` their places (the transport may drop a
    relay it has seen); ``relayed`` runs once the transport took the messages, ``unsent`` if
    it did not."""
    items = list(items)
    try:
        transport = get_transport()
        built = build(items, transport.max_message_bytes, seqs, using)
        if built.messages:
            _send(transport, built, using, txn, relayed, unsent)
        elif relayed is not None:
            relayed()
    except Exception as exc:
        log_operation(
            logger,
            logging.ERROR,
            "realtime: publishing %d announcement(s) failed",
            len(items),
            exc_info=exc,
        )
        if unsent is not None:
            unsent()


#: The run of the messages that came from no row (see ``Built``).
RECHECKS = -1


@dataclass(frozen=True, slots=True)
class Built:
    """The messages of a publication, and which outbox rows each came from.

    A relay of outbox rows goes to the transport in runs: the messages of the rows whose
    places (``seq``) share a range of ``limits.RELAY_ROWS``, each run under a key of its own
    (``run_key``), the announcements of no row (rechecks) first under theirs. A relay made
    again (a sweeper's, after the writer's failed halfway) builds its messages afresh: rows
    written or deleted since are left out (``realtime.writes.late``), audiences asked again.
    Keyed by rows, not by how many messages came before, each run covers the same rows both
    times: a transport that took a run drops it again, and one that did not takes it whole.
    """

    messages: list[tuple[str, bytes]]
    #: ``(run, count)``: the next ``count`` messages came from the rows of range ``run``
    #: (``RECHECKS``: from no row).
    runs: list[tuple[int, int]]


def run_key(txn: str, run: int) -> str:
    """The key of one run of a relay keyed ``txn``: ``txn`` itself for the first."""
    if run == 0:
        return txn
    return f"{txn}/r" if run == RECHECKS else f"{txn}/{run}"


def build(
    items: Sequence[Event | Announcement],
    budget: int | None,
    seqs: Sequence[int] | None = None,
    using: str | None = None,
) -> Built:
    """The messages of committed announcements, in write order: each row's events coalesced,
    the audiences asked now. An announcement that fails costs only its own messages (logged).
    ``seqs``: the places of the outbox rows ``items`` came from, one each; ``using``: the
    alias their writes went to (``None``: each model's ``router.db_for_write``), where the
    audiences of their rows are read and which their messages name."""
    messages: list[tuple[str, bytes]] = []
    runs: list[tuple[int, int]] = []
    coalesced = list(coalesce(items))
    # Rechecks first: a worker holds the frames of an account's sockets from its recheck on,
    # so none of the transaction's events reaches a member it removed (or an account it
    # deactivated). What the recheck reads is the committed state, the events' own.
    asked = [item for item, _ in coalesced if isinstance(item, Recheck)]
    rechecks = {user_id for item in asked for user_id in item.user_ids}
    ended = [session for item in asked for session in item.ended_sessions]
    if rechecks:
        _extend(messages, runs, recheck_messages(rechecks, budget, ended), RECHECKS)
    with shared_readers_once():
        _build_events(coalesced, budget, seqs, using, messages, runs)
    return Built(mark_publication(messages, budget), runs)


def _build_events(
    coalesced: list[tuple[Event | Announcement, int]],
    budget: int | None,
    seqs: Sequence[int] | None,
    using: str | None,
    messages: list[tuple[str, bytes]],
    runs: list[tuple[int, int]],
) -> None:
    """The messages of ``coalesced`` but the rechecks, added to ``messages`` and ``runs``."""
    for item, last in coalesced:
        if isinstance(item, Recheck):
            continue
        try:
            made = (
                event_messages(item, budget, using)
                if isinstance(item, Event)
                else item.messages(budget)
            )
        except Exception as exc:
            # An audience hook's failure, most often: a traceback per place, within its budget.
            label = _label(item)
            log_hook_failure(
                logger,
                "realtime: preparing %s failed; it is not announced",
                exc,
                label,
                place=label,
            )
            continue
        _extend(messages, runs, made, 0 if seqs is None else seqs[last] // limits.RELAY_ROWS)


def _extend(
    messages: list[tuple[str, bytes]],
    runs: list[tuple[int, int]],
    made: list[tuple[str, bytes]],
    run: int,
) -> None:
    if not made:
        return
    messages += made
    if runs and runs[-1][0] == run:
        runs[-1] = (run, runs[-1][1] + len(made))
    else:
        runs.append((run, len(made)))


def send_now(
    transport: Transport, built: Built, txn: str | None = None, locked_until: float = 0.0
) -> None:
    """``transport.publish``, one call, or with ``txn`` one call per run, each with its key
    (a transport of the application's written before the keyword existed keeps working
    without one). A call that finds SQLite's database locked (it wrote nothing) is made again
    until the monotonic time ``locked_until``."""
    if txn is None:
        _call(transport.publish, locked_until, built.messages)
        return
    start = 0
    for run, count in built.runs:
        part = built.messages[start : start + count]
        _call(transport.publish, locked_until, part, txn=run_key(txn, run))
        start += count


def _call(publish: Callable[..., None], locked_until: float, *args: Any, **kwargs: Any) -> None:
    while True:
        try:
            publish(*args, **kwargs)
            return
        except OperationalError as exc:
            # Only SQLite's "database is locked" is known to have written nothing.
            if "locked" not in str(exc) or time.monotonic() > locked_until:
                raise
            time.sleep(0.05)


def _send(
    transport: Transport,
    built: Built,
    using: str,
    txn: str | None,
    relayed: Relayed | None,
    unsent: Unsent | None,
) -> None:
    """``send_now(built)``, never inside a transaction realtime did not open.

    A write on one database (``using``) can commit while the application holds a transaction
    open on the database the transport writes to (several databases, nested atomic blocks).
    That publish is handed to realtime's own thread, whose connection is its own: it neither
    joins the application's transaction nor waits for it here (on SQLite it must wait for
    that transaction's write lock, which only the application's thread can release). Later
    publishes follow it through that thread while it has any, so the log keeps their order.
    A write on the transport's own database commits with no transaction open there — except
    in a test that runs inside one (``captureOnCommitCallbacks``): it publishes inline, as
    ever — or under manual transaction management (autocommit off, no atomic block), where
    the application's transaction is open whatever was written: that publish goes to
    realtime's thread too.
    """
    alias = transport.publishes_on
    with _aside_lock:
        queued = _aside_pending[0] > 0
        there = None if alias is None else connections[alias]
        open_there = there is not None and (
            (alias != using and in_transaction(there)) or in_manual_transaction(there)
        )
        if not queued and not open_there:
            direct = True
        else:
            direct = False
            _aside_pending[0] += 1
    if direct:
        send_now(transport, built, txn)
        if relayed is not None:
            relayed()
    else:
        _aside().submit(_publish_aside, transport, built, txn, relayed, unsent)


def _publish_aside(
    transport: Transport,
    built: Built,
    txn: str | None,
    relayed: Relayed | None,
    unsent: Unsent | None,
) -> None:
    """Publish on realtime's thread; a database still locked by the application's open
    transaction (SQLite) is waited for, within ``ASIDE_WAIT`` seconds."""
    try:
        send_now(transport, built, txn, time.monotonic() + ASIDE_WAIT)
        if relayed is not None:
            relayed()
    except Exception as exc:
        log_operation(
            logger,
            logging.ERROR,
            "realtime: publishing %d message(s) failed",
            len(built.messages),
            exc_info=exc,
        )
        if unsent is not None:
            unsent()
    finally:
        close_old_connections()
        with _aside_lock:
            _aside_pending[0] -= 1


#: Seconds realtime's publishing thread waits for a database the application keeps locked.
ASIDE_WAIT = 60.0
_executor: ThreadPoolExecutor | None = None
_aside_lock = threading.Lock()
#: Publishes handed to realtime's thread and not done yet.
_aside_pending = [0]


def _aside() -> ThreadPoolExecutor:
    global _executor
    with _aside_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(1, thread_name_prefix="realtime-publish")
        return _executor


def _label(item: Any) -> str:
    return item.event_type if isinstance(item, Event) else type(item).__name__


def coalesce(items: Sequence[Any]) -> list[tuple[Any, int]]:
    """Merge the events of one row (see the module docstring); other items pass through.
    Each comes with the index in ``items`` of its last write.

    Events to accounts a row entered or left the view of (``accounts``) are not merged, but
    weighed against the row's other events of the transaction, account by account: an account
    a later event takes the row from (a ``deleted``, the row's own or to those accounts) is
    taken from its earlier events, as what the row became before it left is nothing it could
    ever read; and a ``deleted`` reaches only accounts that could read the row before the
    transaction: not one the transaction gave it to (an account ``created``), nor anyone, for
    a row the transaction created."""
    result: list[tuple[Any, int]] = []
    merged_away: set[int] = set()
    position: dict[tuple[str, Any], int] = {}
    #: The places in ``result`` of each row's events to accounts (never merged).
    told: dict[tuple[str, Any], list[int]] = {}
    #: Of each row, the accounts this transaction gave it to, those told it left (and not
    #: given it again since), and the rows it created.
    entered: dict[tuple[str, Any], set[Any]] = {}
    gone: dict[tuple[str, Any], set[Any]] = {}
    born: set[tuple[str, Any]] = set()
    for index, item in enumerate(items):
        if not isinstance(item, Event) or item.folded:
            result.append((item, index))
            continue
        key = item.key
        if item.action == "deleted":
            fresh = entered.pop(key, set())
            if item.accounts is not None:  # the row left these accounts' view
                leaving: Iterable[Any] = item.accounts
                still = fresh.difference(sorted_ids(item.accounts))
                if still:
                    entered[key] = still
                earlier = [position[key]] if key in position else []
            else:  # the row itself is gone
                leaving, earlier = fresh, []
            for at in [*earlier, *told.get(key, ())]:
                result[at] = (_without(result[at][0], leaving), result[at][1])
            if key in born and item.accounts is not None:
                continue  # nobody could read the row before the transaction
            item = _without(item, fresh | gone.get(key, set()))  # told once
            if _told_nobody(item):
                continue
            if item.accounts is not None:
                gone.setdefault(key, set()).update(sorted_ids(item.accounts))
        elif item.accounts is not None:
            told.setdefault(key, []).append(len(result))
            if item.action == "created":
                entered.setdefault(key, set()).update(sorted_ids(item.accounts))
                gone.get(key, set()).difference_update(sorted_ids(item.accounts))
        elif item.action == "created":
            born.add(key)
        elif item.links_only and key in entered:
            # Its links changed: those the transaction gave it to were told it whole already.
            item = _without(item, entered[key])
        if item.accounts is not None:
            result.append((item, index))
            continue
        earlier_at = position.pop(key, None)
        if earlier_at is not None:
            merged_away.add(earlier_at)
            merged = _merge(result[earlier_at][0], item)
            if merged is None:
                # Created and deleted: what the transaction told accounts of it goes too.
                for at in told.get(key, ()):
                    told_event = result[at][0]
                    result[at] = (_without(told_event, told_event.accounts or ()), result[at][1])
                continue
            item = merged
        position[key] = len(result)
        result.append((item, index))
    return [
        entry
        for at, entry in enumerate(result)
        if at not in merged_away and not _told_nobody(entry[0])
    ]


def _told_nobody(item: Any) -> bool:
    """Whether ``item`` is an event to accounts left with none of them."""
    return isinstance(item, Event) and item.accounts is not None and not item.accounts


def _without(event: Event, leavers: Iterable[Any]) -> Event:
    """``event`` told to none of ``leavers``: its accounts (an event to accounts), or the
    accounts its path reached and the readers decided for it (a row's own event)."""
    gone = set(sorted_ids(leavers))

    def kept(ids: list[Any] | None) -> list[Any] | None:
        return None if ids is None else [i for i in ids if normal_id(i) not in gone]

    if not gone:
        return event
    if event.accounts is not None:
        return replace(event, accounts=kept(event.accounts))
    return replace(
        event,
        user_ids=kept(event.user_ids),
        readers=kept(event.readers),
        shared=kept(event.shared),
        outside=kept(event.outside),
    )


def _merge(first: Event, then: Event) -> Event | None:
    if then.action == "deleted":
        if first.action == "created":
            return None
        # Who could read the row before the transaction, as its first write saw them: those
        # an earlier write took it from hear it go too (``views.earlier_readers_messages``).
        before = first.before if first.before is not None else then.before
        return replace(then, before=before)
    if then.links_only and not first.links_only:
        # The row's own write tells it, in its order; the links add their name and channels.
        if first.action == "created":
            return replace(first, channels=then.channels)
        changed = sorted({*(first.changed or ()), *(then.changed or ())})
        before = first.before if first.before is not None else then.before
        return replace(first, changed=changed, before=before, channels=then.channels)
    if first.action == "created":
        return replace(then, action="created", changed=None, before=None)
    if first.action == "updated" and then.action == "updated":
        changed = sorted({*(first.changed or ()), *(then.changed or ())})
        # The audience before the transaction is what the first write saw.
        before = first.before if first.before is not None else then.before
        return replace(then, changed=changed, before=before)
    return then


def event_messages(
    event: Event, budget: int | None, using: str | None = None
) -> list[tuple[str, bytes]]:
    """The messages of one model event: to its scope (and beyond), or to its accounts.
    ``using``: the alias the row was written on (``None``: where its model's writes go)."""
    if event.values is not None and named_alias(event.options.model, using) is not None:
        # Live queries list the rows of the database their model's writes go to: a row written
        # on another carries no filters values, so a query reads its rows again rather than
        # list a row its database does not hold.
        event = replace(event, values=None)
    if event.leaves_only:  # its payload= failed: only the readers an update took it from
        if event.action != "updated" or event.before is None or event.accounts is not None:
            return []
        return view_messages(event, budget, using)[0]
    if event.action == "deleted" and event.before is not None:
        earlier = earlier_readers_messages(event, budget, using)
        own = readers_from_before(event)
        return earlier + ([] if own is None else event_messages(own, budget, using))
    if event.accounts is not None:
        data = None if event.folded else event.kept
        return users_messages(
            event.accounts,
            event.event_type,
            data,
            channels=event.channels,
            meta=event.meta(),
            budget=budget,
            row=True,
            using=named_alias(event.options.model, using),
        )
    if event.action == "updated" and event.before is not None:
        messages, reached = view_messages(event, budget, using)
        if event.options.user_field is None and event.scope_id is not None:
            messages += _outside_messages(event, reached, budget, using)
        return messages
    options = event.options
    data = None if event.folded else event.kept
    common: dict[str, Any] = {
        "channels": event.channels,
        "meta": event.meta(),
        "budget": budget,
    }
    if options.user_field is not None:
        accounts = event.readers
        if accounts is None:
            accounts = recipients(event)
        named = named_alias(options.model, using)
        return users_messages(accounts, event.event_type, data, row=True, using=named, **common)
    out: list[tuple[str, bytes]] = []
    place = (options.is_global, event.scope_id, event.event_type, data)
    if options.guard is not None and not event.folded and event.readers is not None:
        if event.readers:
            out += place_messages(*place, only=event.readers, **common)
    elif options.guard is not None and not event.folded:
        about = about_row(options.name, event.data["id"], named_alias(options.model, using))
        out += place_messages(*place, about=about, **common)
    else:
        out += place_messages(*place, **common)
    if options.is_global:
        return out
    if event.folded:
        # Past a cascade's limit: the shared roots' readers outside the scope, asked while
        # the rows were there (``deletes.fold``), read the list again too.
        if event.shared:
            named = named_alias(options.model, using)
            out += users_messages(
                event.shared, event.event_type, None, row=True, using=named, **common
            )
        return out
    shared = event.shared if event.shared is not None else shared_readers(event, using)
    if shared:
        named = named_alias(options.model, using)
        out += users_messages(shared, event.event_type, data, row=True, using=named, **common)
    return out + _outside_messages(event, shared, budget, using)


def _outside_messages(
    event: Event, shared: list[Any], budget: int | None, using: str | None = None
) -> list[tuple[str, bytes]]:
    """The event again, to the outside recipients not served as shared readers."""
    outside = event.outside if event.outside is not None else outside_recipients(event)
    if not outside:
        return []
    served = set(shared)
    outside = [account for account in sorted_ids(outside) if account not in served]
    if not outside:
        return []
    return users_messages(
        outside,
        event.event_type,
        event.kept,
        channels=event.channels,
        meta=event.meta(),
        skip_scope=event.scope_id,
        budget=budget,
        row=True,
        using=named_alias(event.options.model, using),
    )
