"""Rows that enter or leave a reader's view: the audience before an update against after it.

An update may change who may read a row: it moves to another scope, a guarded row's fields
change whom the guard admits, a ``user_field`` path reaches other accounts, a shared record
gets another root. Each reader then hears what changed *for them*: one who could read it
before and still can hears ``<model>.updated``; one who now can and could not hears
``<model>.created``; one who could and now cannot hears ``<model>.deleted`` with only the
model and the id (they may no longer read its fields). Enter and leave frames carry
``"moved": true``. The audience before is taken in the transaction
(``realtime.writes.audiences``); ``view_messages`` runs after commit and compares.

A hook that fails (``recipients``, ``shared_readers``) leaves its side undecided, which is
never taken for "nobody": nobody hears a row leave on the strength of a failure. Readers
after undecided: that part of the event goes to nobody (a reader before may still read it,
and one after is not known). Readers before undecided: the readers after hear the update
as if nothing moved — as when the audience before was not taken at all. Each failure is
logged once, with its traceback, where the hook is asked (``realtime.writes.audiences``).

An update whose ``payload=`` failed (``Event.leaves_only``) sends the leave frames alone: they
carry the identity only, while a frame to a reader who enters or stays would carry a record
without the payload's keys as if it were whole.

The audience hooks asked after commit live here too: each answer comes from a
``RealtimeAuth`` hook; a hook that fails costs its own answer, logged, never the other
messages of the event: ``recipients`` failing means the account event reaches nobody,
``shared_readers`` or ``outside_recipients`` failing means only those extra messages are not
sent. Where a failure must not pass for an empty answer (who leaves a view), the ``*_or_none``
forms answer ``None`` instead: undecided, never "nobody". What a hook raises is logged at
ERROR with its traceback, limited per hook (``realtime.logs``); the ids a hook answers are
read by the user model's primary key field (``realtime.auth.account_ids``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

from realtime.audience import readers_of_rows
from realtime.auth import account_ids, get_auth, overridden, readers_pool
from realtime.encoding import jsonable, normal_id, row_key, sorted_ids
from realtime.logs import log_hook_failure
from realtime.messages import named_alias
from realtime.primary import on_primary
from realtime.readers import members_of, shared_readers_of
from realtime.registry import ModelOptions
from realtime.writes.events import Before, Event, read_event
from realtime.writes.packing import about_row, place_messages, scope_messages, users_messages

logger = logging.getLogger(__name__)

Messages = list[tuple[str, bytes]]


def view_messages(
    event: Event, budget: int | None, using: str | None = None
) -> tuple[Messages, list[Any]]:
    """The messages of an update whose audience may have changed, and the shared readers it
    reached: leavers first (a client hearing a leave and an enter of one row keeps it),
    then enterers and those who stay. ``using``: the alias the row was written on, where
    its readers now are read (``None``: where its model's writes go)."""
    before = event.before
    assert before is not None
    if event.options.user_field is not None:
        now = recipients_or_none(event)
        if now is None:
            return [], []
        was = recipients_or_none(
            event,
            before.accounts or [],
            "nobody hears it leave; its readers now hear it as an update",
        )
        now = sorted_ids(now)
        was = now if was is None else sorted_ids(was)
        return _compare(event, was, now, budget, using), []
    out = _scope_messages(event, before, budget, using)
    if event.options.shared_via is None:
        return out, []
    shared: list[Any] | None = []
    if event.scope_id is not None:
        shared = shared_readers_or_none(event, "no reader outside its scope hears of it", using)
    if shared is None:
        return out, []
    was = before.shared if before.shared is not None else shared
    if event.scope_id is not None and before.scope_id != normal_id(event.scope_id):
        was = _outside_new_scope(event, was, using)
    return out + _compare(event, was, shared, budget, using), shared


def _outside_new_scope(event: Event, was: list[Any], using: str | None) -> list[Any]:
    """Of ``was``, the readers of a moved row's root outside its old scope, those who do not
    read it through its new scope: a member there hears it enter with the scope (its
    ``created``), and a leave frame sent after that would take the row from a reader."""
    if not was:
        return was
    members = members_of(event.scope_id, using)
    inside = [account for account in was if account in members]
    if inside and event.options.guard is not None:
        (inside,) = audience(
            event.options, event.scope_id, inside, [event.pk], using, as_events([event])
        )
    kept = set(sorted_ids(inside))
    return [account for account in was if account not in kept]


def _compare(
    event: Event, was: list[Any], now: list[Any], budget: int | None, using: str | None
) -> Messages:
    """Account messages: leave frames to ``was - now``, enter frames to ``now - was``."""
    name = event.options.name
    identity, moved, meta = _forms(event)
    before, after = set(was), set(now)
    common: dict[str, Any] = {
        "channels": event.channels,
        "budget": budget,
        "row": True,
        "using": named_alias(event.options.model, using),
    }
    leaves = users_messages(before - after, f"{name}.deleted", identity, meta=moved, **common)
    if event.leaves_only:
        return leaves
    entering = after - before
    entered = _entered(event, entering, using)
    enters: Messages = []
    if entered is not None:
        enters = users_messages(entering, f"{name}.created", entered, meta=moved, **common)
    return [
        *leaves,
        *enters,
        *users_messages(after & before, event.event_type, event.kept, meta=meta, **common),
    ]


def _entered(event: Event, accounts: Iterable[Any], using: str | None) -> dict[str, Any] | None:
    """The data of the frame telling ``accounts`` that the row entered their view: the
    event's, or for a change of the row's links alone the row as it is now, read once on
    ``using`` (the fields its instance held may be older than a write of the row that
    committed before; those readers never heard that write). ``None``: nobody enters, or the
    row is gone."""
    if not event.links_only or not accounts:
        return event.data
    if "entered" not in event.extra:
        found = on_primary(event.options.model, using, base=True).filter(pk=event.pk).first()
        fresh = None
        if found is not None:
            fresh = read_event(event.options, found, "created", using=using)
        event.extra["entered"] = None if fresh is None else fresh.data
    entered: dict[str, Any] | None = event.extra["entered"]
    return entered


def _forms(event: Event) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The data of a leave frame, the meta of enter and leave frames, and of an update."""
    identity = {"model": event.options.name, "id": event.data["id"]}
    moved: dict[str, Any] = {"moved": True}
    if event.origin is not None:
        moved = {"origin": event.origin, "moved": True}
    if event.options.filters:
        moved["filters"] = event.values  # a live query places the row that enters
    return identity, moved, event.meta()


def _scope_messages(
    event: Event, before: Before, budget: int | None, using: str | None
) -> Messages:
    options = event.options
    name = options.name
    identity, moved, meta = _forms(event)
    now_scope = None if event.scope_id is None else normal_id(event.scope_id)
    was_scope = before.scope_id
    about = None
    if options.guard is not None:
        about = about_row(name, event.data["id"], named_alias(options.model, using))
    left: dict[str, Any] = {"channels": before.channels or event.channels, "budget": budget}
    here: dict[str, Any] = {"channels": event.channels, "about": about, "budget": budget}
    guarded = options.guard is not None
    out: Messages = []
    if was_scope != now_scope:
        if was_scope is not None and not (guarded and not before.readers):
            only = before.readers if guarded else None
            out += scope_messages(
                was_scope, f"{name}.deleted", identity, meta=moved, only=only, **left
            )
        if now_scope is not None and not event.leaves_only:
            out += scope_messages(now_scope, f"{name}.created", event.data, meta=moved, **here)
        return out
    placed = now_scope is not None or options.is_global
    if not placed or (event.leaves_only and (not guarded or before.readers is None)):
        return []
    if not guarded or before.readers is None:
        return place_messages(
            options.is_global, now_scope, event.event_type, event.kept, meta=meta, **here
        )
    pool = readers_pool(options, event.scope_id, using)
    (found,) = audience(options, event.scope_id, pool, [event.pk], using, as_events([event]))
    now = set(sorted_ids(found))
    was = set(before.readers)
    kinds = (
        (was - now, f"{name}.deleted", identity, moved, left),
        (now - was, f"{name}.created", _entered(event, now - was, using), moved, here),
        (now & was, event.event_type, event.kept, meta, here),
    )
    for accounts, event_type, data, frame_meta, where in kinds[:1] if event.leaves_only else kinds:
        if accounts and data is not None:
            only = sorted_ids(accounts)
            out += place_messages(
                options.is_global, now_scope, event_type, data, meta=frame_meta, only=only, **where
            )
    return out


def earlier_readers_messages(
    event: Event, budget: int | None, using: str | None = None
) -> Messages:
    """The delete of a row an earlier write of its transaction took from some of its readers
    (an update that carried ``before``, merged into the delete: ``publish._merge``), to
    those readers: each who could read the row before the transaction and is not told the
    delete itself hears it, with the row's identity alone (what it became meanwhile was not
    theirs to read). The readers at the delete are those it carries, decided before the row
    went; a side whose readers before were not taken, or could not be decided, tells nobody
    more. ``using``: the alias the row was written on."""
    before = event.before
    assert before is not None
    options = event.options
    identity = {"model": options.name, "id": event.data["id"]}
    common: dict[str, Any] = {
        "channels": before.channels or event.channels,
        "meta": event.meta(),
        "budget": budget,
    }
    named = named_alias(options.model, using)
    if options.user_field is not None:
        was = recipients_or_none(event, before.accounts or [], "nobody else hears it go")
        gone = _gone(was or (), event.readers or ())
        return users_messages(gone, event.event_type, identity, row=True, using=named, **common)
    out: Messages = []
    guarded = options.guard is not None
    now_scope = None if event.scope_id is None else normal_id(event.scope_id)
    if before.scope_id != now_scope:
        if before.scope_id is not None and not (guarded and not before.readers):
            only = before.readers if guarded else None
            out += scope_messages(before.scope_id, event.event_type, identity, only=only, **common)
    elif guarded and before.readers:
        gone = _gone(before.readers, event.readers or ())
        if gone:
            place = (options.is_global, now_scope, event.event_type, identity)
            out += place_messages(*place, only=gone, **common)
    if before.shared and not options.is_global:
        now = event.shared if event.shared is not None else shared_readers(event, using)
        gone = _gone(before.shared, now)
        out += users_messages(gone, event.event_type, identity, row=True, using=named, **common)
    return out


def readers_from_before(event: Event) -> Event | None:
    """The delete ``event`` (its ``before`` taken by an earlier write of its transaction) told
    only to those who could read the row before the transaction and still could at the
    delete: an account an earlier write gave it to, or the scope it moved to, never read it
    as committed and is not told what it held (those it was taken from hear its identity:
    ``earlier_readers_messages``); ``None`` when that leaves nobody (it moved to another
    scope). A side whose readers before were not taken is left as the delete decided it."""
    before = event.before
    assert before is not None
    options = event.options
    now_scope = None if event.scope_id is None else normal_id(event.scope_id)
    if options.user_field is None and before.scope_id is not None and before.scope_id != now_scope:
        return None
    narrowed = replace(event, before=None)
    if options.user_field is not None and before.accounts is not None:
        narrowed.readers = _kept(event.readers, before.accounts)
        narrowed.user_ids = _kept(event.user_ids, before.accounts)
    elif options.guard is not None and before.readers is not None:
        narrowed.readers = _kept(event.readers, before.readers)
    if before.shared is not None:
        narrowed.shared = _kept(event.shared, before.shared)
    return narrowed


def _kept(now: list[Any] | None, was: Iterable[Any]) -> list[Any] | None:
    """The accounts of ``now`` (``None``: undecided, left so) among ``was``."""
    if now is None:
        return None
    allowed = set(sorted_ids(was))
    return [account for account in now if normal_id(account) in allowed]


def _gone(was: Iterable[Any], now: Iterable[Any]) -> list[Any]:
    """The accounts of ``was`` not in ``now``, sorted."""
    kept = set(sorted_ids(now))
    return [account for account in sorted_ids(was) if account not in kept]


# Audience hooks, asked after commit ------------------------------------------------------------


def recipients(event: Event) -> list[Any]:
    """Ask ``auth.recipients``; when it fails, the event reaches nobody."""
    return recipients_or_none(event) or []


def recipients_or_none(
    event: Event, accounts: Iterable[Any] | None = None, failing: str = "it reaches nobody"
) -> list[Any] | None:
    """``auth.recipients`` asked about ``accounts`` (by default the event's); ``None`` when
    it raises, logged once with its traceback and ``failing`` (what the failure costs)."""
    if accounts is None:
        accounts = event.user_ids or ()
    try:
        return account_ids(get_auth().recipients(event.event_type, event.data, list(accounts)))
    except Exception as exc:
        log_hook_failure(
            logger, "realtime: recipients() failed for %s; %s", exc, event.event_type, failing
        )
        return None


def shared_readers(event: Event, using: str | None = None) -> list[Any]:
    """Readers of the event's shared root outside its scope (guard-checked); [] on failure."""
    return shared_readers_or_none(event, "they hear nothing of it", using) or []


def shared_readers_or_none(
    event: Event, failing: str, using: str | None = None
) -> list[Any] | None:
    """``shared_readers`` of the event; ``None`` on failure (see ``shared_readers_of``)."""
    return shared_readers_of(
        event.options,
        event.pk,
        event.scope_id,
        event.extra.get("root_pk"),
        event.event_type,
        failing,
        using,
    )


#: The frame an audience is asked about for a row: its event type and data.
Frame = Callable[[Any], tuple[str, dict[str, Any]]]


def audience(
    options: ModelOptions,
    scope_id: Any,
    pool: Iterable[Any],
    pks: Sequence[Any],
    using: str | None,
    frame: Frame,
) -> list[list[Any]]:
    """The readers among ``pool`` of each guarded row of ``pks`` (in their order), as
    delivery decides who hears an event about one: asked of ``auth.audience`` about each
    row, with the frame ``frame(pk)`` says, where the application overrides it; else, as its
    default answers, the guard's readers among the accounts still active (all the rows at
    once). The readers before an update and after it, and a delete's, are decided so: an
    account the audience refuses never hears a row enter, stay or leave its view."""
    auth = get_auth()
    if not overridden(auth, "audience"):
        found = readers_of_rows(options, pks, pool, active_only=True, using=using)
        return [found[row_key(pk)] for pk in pks]
    asked = list(pool)
    named = named_alias(options.model, using)
    out = []
    for pk in pks:
        event_type, data = frame(pk)
        about = about_row(options.name, data["id"], named)
        out.append(account_ids(auth.audience(scope_id, event_type, data, asked, about)))
    return out


def as_events(events: Sequence[Event]) -> Frame:
    """Each row's frame among ``events``, by its key: what an audience is asked about."""
    frames = {row_key(event.pk): (event.event_type, event.data) for event in events}
    return lambda pk: frames[row_key(pk)]


def as_leaving(options: ModelOptions) -> Frame:
    """The frame of a row leaving a reader's view (its identity alone): what the readers
    before an update are asked about, while the row still holds what it held."""
    return lambda pk: (f"{options.name}.deleted", {"model": options.name, "id": jsonable(pk)})


def outside_recipients(event: Event) -> list[Any]:
    """Ask ``auth.outside_recipients`` (nobody, by default: not asked); when it fails, log:
    the scope event still goes."""
    auth = get_auth()
    if not overridden(auth, "outside_recipients"):
        return []
    try:
        return account_ids(auth.outside_recipients(event.scope_id, event.event_type, event.data))
    except Exception as exc:
        log_hook_failure(
            logger, "realtime: outside_recipients() failed for %s", exc, event.event_type
        )
        return []
