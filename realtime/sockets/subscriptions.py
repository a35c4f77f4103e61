"""Which channels a socket may hear: the ``may_subscribe`` hook, asked off the event loop.

A channel a client names (in ``subscribe`` or ``authenticate.channels``) is first read as
before: a channel of no known model is dropped, one already held is skipped. When the auth
class overrides ``RealtimeAuth.may_subscribe``, each new channel left is then asked about,
once per scope the socket reads (``None`` when it reads none), on realtime's threads; the
sockets that subscribe at the same moment are asked in one batch (``Batcher``). A channel the
hook refuses in every scope is dropped exactly like an unknown one: no frame, no close, and it
takes no room under ``REALTIME_MAX_CHANNELS``. A channel allowed in some scopes only is heard
in those (``Socket.allowed``). The default hook is never asked: nothing changes for an
application that does not override it.

One subscribe asks about at most ``REALTIME_MAX_CHANNELS`` channels, and stops once those it
accepted fill the socket's room: a frame naming thousands of channels the hook refuses costs
a bounded number of asks. A hook that raises refuses every channel of that subscribe (its
asker logs it, with its traceback, limited per place).

Ordering: the consumer reads a socket's frames one after the other and waits for a
subscribe's answer before it reads the next frame, so a subscribe followed by an unsubscribe
ends as it would without the hook. A recheck may change the scopes a socket reads while its
subscribe waits for the hook: the subscribe then asks again about the scopes it did not ask
about, so that it ends decided in every scope the socket reads (``SocketManager.decide``).
Rechecks ask again: at each recheck, every channel a socket holds is asked about in each scope
it then reads; one now refused everywhere is dropped quietly, one refused in a scope is no
longer heard there, and one allowed again in a scope is heard there again. The answer is
applied to the channels it asked about that are still held, whatever the client subscribed
or unsubscribed meanwhile: a channel subscribed meanwhile is as its own subscribe decided, and
when the recheck gives the socket a scope, such a channel is heard there only once the hook
has been asked (a recheck of that socket is then due at once).

With ``settings.DEBUG``, each channel dropped from a client's frame says why in one INFO line
(a nearest known channel for an unknown name), within the budget of lines clients can cause,
which is checked before any work is done for the line.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, NamedTuple

from django.conf import settings

from realtime import logs
from realtime.auth import RealtimeAuth, overridden

logger = logging.getLogger(__name__)

#: Characters of an unknown channel's model compared with the known names (``DEBUG`` only):
#: the work of one suggestion stays small whatever a client sends.
SUGGEST_CHARS = 100


class Ask(NamedTuple):
    """One socket's question: which of ``channels`` (known, in the client's order) may
    ``user`` hear in each of the scopes ``scope_ids`` (``[None]``: a socket reading none);
    ``room``: how many may be accepted at most."""

    user: Any
    scope_ids: Sequence[Any]
    channels: Sequence[str]
    room: int


class Decided(NamedTuple):
    """The channels accepted (allowed in at least one scope asked, in order), those refused
    in every scope asked, and, by scope id asked, the channels that scope allows."""

    channels: list[str]
    refused: list[str]
    allowed: dict[Any, set[str]]


def hooked(auth: RealtimeAuth) -> bool:
    """Whether the application answers ``may_subscribe`` itself (the default is never asked)."""
    return overridden(auth, "may_subscribe")


def scopes_asked(scope_ids: Iterable[Any]) -> list[Any]:
    """The scopes a socket reading ``scope_ids`` is asked about: those, or ``None`` alone."""
    return list(scope_ids) or [None]


def _go_on() -> None:
    """No wait between the sockets of a batch."""


def decide_all(
    auth: RealtimeAuth, asks: Sequence[Ask], between: Callable[[], None] = _go_on
) -> list[Decided | Exception]:
    """Answer the questions of sockets asked together (on a thread: the hook may use the
    ORM). What the hook raised for a socket is that socket's answer, for its asker to log;
    the others are answered all the same. ``between`` is called after each socket (a recheck
    round waits there while delivery has work)."""
    answers: list[Decided | Exception] = []
    for ask in asks:
        try:
            answers.append(_decide(auth, ask))
        except Exception as exc:
            answers.append(exc)
        between()
    return answers


def _decide(auth: RealtimeAuth, ask: Ask) -> Decided:
    accepted: list[str] = []
    refused: list[str] = []
    allowed: dict[Any, set[str]] = {scope_id: set() for scope_id in ask.scope_ids}
    for channel in ask.channels:
        if len(accepted) >= ask.room:
            break
        yes = [s for s in ask.scope_ids if auth.may_subscribe(ask.user, s, channel)]
        (accepted if yes else refused).append(channel)
        for scope_id in yes:
            allowed[scope_id].add(channel)
    return Decided(accepted, refused, allowed)


def log_unknown(channel: str, known: Collection[str]) -> None:
    """With ``DEBUG``, say that ``channel`` names no known model, and the nearest that does:
    an INFO line, as the protocol fixes it (the client hears nothing of a dropped channel, by
    design; a project shows the line with a ``LOGGING`` entry for ``realtime`` at INFO).

    The clients' budget is asked first: past it, the line costs a count, not a search."""
    budget = logs.client_budget
    if not settings.DEBUG or not budget.admit():
        return
    model, sep, rest = channel.partition(":")
    nearest = difflib.get_close_matches(model[:SUGGEST_CHARS], list(known), n=1)
    if nearest:
        budget.admitted(
            logger,
            logging.INFO,
            "realtime: dropped channel %.100r: no such channel (did you mean %.100r?)",
            channel,
            f"{nearest[0]}{sep}{rest}",
        )
    else:
        budget.admitted(
            logger, logging.INFO, "realtime: dropped channel %.100r: no such channel", channel
        )


def log_refused(channel: str) -> None:
    """With ``DEBUG``, say that ``channel`` was refused by the hook (an INFO line, as above)."""
    if settings.DEBUG:
        logs.log_limited(
            logger,
            logging.INFO,
            "realtime: dropped channel %.100r: refused by may_subscribe",
            channel,
        )
