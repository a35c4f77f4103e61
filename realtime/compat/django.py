"""Django: what realtime relies on that Django's documentation does not promise.

Everything else realtime asks of Django is documented. These are not, and no public way gives
them:

* **Querysets that build plain instances** (``plain_instances``). A recheck reads the columns
  a token remembers instead of building account instances, but only where an instance would
  hold exactly those values: the default manager's queryset is built by Django's
  ``ModelIterable`` (its ``_iterable_class``) with no annotation and no ``extra`` select (its
  query's ``annotations`` and ``extra``). Fallback: instances.
* **Whether a signal has receivers** (``has_receivers``): ``Signal.has_listeners``, asked of
  ``pre_init`` and ``post_init`` for the same reason. Fallback: assume it has (instances).
* **A signal's receivers for one sender** (``live_receivers``): ``Signal._live_receivers``,
  its synchronous and its asynchronous receivers. Realtime calls the receivers of its own
  signals itself, so that what one raises is logged within a budget of that receiver's
  (``Signal.asend_robust`` logs every failure, with its traceback, without a limit: a client
  could repeat one per frame). Fallback: ``asend_robust``.
* **The driver connection behind a connection wrapper** (``driver_connection``, its socket
  ``socket_of``, and ``driver_errors``, the context raising driver errors as Django's: the
  wrapper's ``connection`` and ``wrap_database_errors``). The statement watchdog cuts a
  statement that hangs by shutting its socket down; the table poller runs its window
  statement on the driver's cursor (Django's wrapper cost more than the statement). Fallback:
  no cut (keepalives and statement timeouts still bound a statement), Django's cursor, and a
  held connection's bounds set again before each of its uses.
* **Driver options for one thread's connection** (``use_options``): the connection wrapper's
  ``settings_dict`` replaced, on realtime's own threads, by the alias's settings with more
  driver options (keepalives, client timeouts). Fallback: the project's options alone.
* **Whether a transaction is open, without opening a connection** (``in_transaction``): the
  wrapper's ``in_atomic_block``. The documented ``transaction.get_autocommit()`` connects to
  the database, and a model built by hand, which runs no query, must not. Fallback:
  ``get_autocommit()``.
* **A thread's connections, asked from an event loop running on it** (``sync_connection``).
  ``connections[alias]`` answers per thread in sync code but per async context on a
  loop's thread (asgiref's thread-critical ``Local``), so a coroutine that ``asyncio.run``
  runs inside ``atomic()`` sees a connection of its own, outside the block its thread holds.
  Realtime reads the thread's own from the handler's ``_connections`` (the ``Local``'s
  thread-local ``_storage``), without a statement, to hold the work of ``broadcast_*``,
  ``recheck_users`` and ``announce`` called there until that block commits. The self-test
  runs a loop on a thread of its own and compares. Fallback: that work runs at once on
  asgiref's shared thread, outside the block (``async_to_sync`` keeps it in).
* **Which atomic block is open innermost** (``atomic_block``): the last of the wrapper's
  ``atomic_blocks``. Django's delete runs its ``pre_delete`` signals, the ``update()`` that
  sets children to ``NULL`` and its ``post_delete`` signals in one block of its own: what a
  receiver notes for that ``update()`` holds in that block alone, and a delete that fails
  between the two signals leaves nothing noted for later writes. Fallback: no block told
  apart (after a delete refused by a ``pre_delete`` receiver of the application's, later
  ``update()`` calls of the foreign keys it would have unlinked, in a transaction, go
  unannounced in its thread).
* **That Django lets go of the on_commit callbacks it discards** (``callbacks_released``).
  Django documents that a callback registered in a savepoint or transaction that rolls back
  is never called; realtime learns *that it was discarded* — during the transaction, not only
  at its end — by holding its callbacks weakly, Django keeping the only strong reference. The
  self-test registers a callback in a savepoint (a transaction, where the database has none)
  that rolls back, in a transaction of its own that writes nothing, the first time it is
  asked while no transaction is open on the connection; until then it answers yes, as every
  supported Django does. Fallback: each announcement published by its own callback, without
  coalescing, and an update that cannot tell what was committed lists every column as
  changed.

What the ORM's querysets and managers rely on is ``realtime.compat.django_orm``, checked the same
way. Each is checked by a self-test the first time a process uses it; the tests change nothing
of the application's, and only the last runs statements. Where one fails, one ERROR line names the
Django version and what realtime does instead, and that use falls back for the life of the
process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from django import get_version
from django.conf import settings
from django.db import (
    DEFAULT_DB_ALIAS,
    DatabaseError,
    DataError,
    connections,
    models,
    transaction,
)
from django.db.backends.base.base import BaseDatabaseWrapper
from django.dispatch import Signal

logger = logging.getLogger(__name__)

QUERYSETS = "queryset internals (_iterable_class, query.annotations, query.extra)"
RECEIVERS = "Signal.has_listeners"
LIVE_RECEIVERS = "a signal's receivers for one sender (Signal._live_receivers)"
CONNECTION = "the driver connection of a connection wrapper (its connection attribute)"
SOCKET = "a driver connection's fileno()"
ERRORS = "the translation of driver errors (wrap_database_errors)"
OPTIONS = "per-thread driver options (settings_dict, get_connection_params)"
TRANSACTION = "the open-transaction flag of a connection wrapper (in_atomic_block)"
ATOMIC = "the atomic blocks open on a connection wrapper (atomic_blocks)"
CALLBACKS = "the release of the on_commit callbacks of rolled-back savepoints"
SYNC_CONNECTION = (
    "a thread's connections read from an event loop on it (ConnectionHandler._connections)"
)

#: What realtime does where each use does not fit.
INSTEAD = {
    QUERYSETS: "rechecks read accounts as instances",
    RECEIVERS: "rechecks read accounts as instances",
    LIVE_RECEIVERS: (
        "realtime's signals are sent with asend_robust, which logs every receiver's failure "
        "without a limit"
    ),
    CONNECTION: (
        "statements that hang on realtime's threads are not cut (keepalives and statement "
        "timeouts still bound them), polls use Django's cursor, and the poller's and the "
        "trims' connections set their bounds again before each use"
    ),
    SOCKET: (
        "statements that hang on realtime's threads are not cut (keepalives and statement "
        "timeouts still bound them)"
    ),
    ERRORS: "polls use Django's cursor",
    OPTIONS: (
        "the poller's and the trims' connections open with the project's OPTIONS only (their "
        "statement timeout and the watchdog still bound them)"
    ),
    TRANSACTION: "whether a transaction is open is asked with get_autocommit(), which connects",
    ATOMIC: (
        "a delete refused by a pre_delete receiver leaves the update()s of the foreign keys it "
        "would have set to NULL, in a transaction, unannounced in its thread"
    ),
    CALLBACKS: (
        "announcements are published one by one, without coalescing, and updates that cannot "
        "tell what was committed list every column as changed"
    ),
    SYNC_CONNECTION: (
        "broadcast_*, recheck_users and announce called by a coroutine that asyncio.run runs "
        "inside atomic() publish at once, outside that block (async_to_sync keeps them in it)"
    ),
}

#: How long a self-test run on a thread of its own is waited for, in seconds.
PROBE_TIMEOUT = 10.0

#: Each use's self-test verdict, once it ran.
_verdicts: dict[str, bool] = {}
_lock = threading.Lock()
_MISSING = object()


def _fits(use: str, probe: Callable[..., None], *args: Any) -> bool:
    """Whether ``use`` fits this Django: ``probe(*args)`` (which raises where it does not)
    run once per process; where it does not, one ERROR line."""
    verdict = _verdicts.get(use)
    if verdict is not None:
        return verdict
    with _lock:
        verdict = _verdicts.get(use)
        if verdict is None:
            try:
                probe(*args)
            except Exception as exc:
                logger.error(
                    "realtime: Django %s does not fit %s (%s: %s); %s",
                    get_version(),
                    use,
                    type(exc).__name__,
                    exc,
                    INSTEAD[use],
                )
                verdict = False
            else:
                verdict = True
            _verdicts[use] = verdict
    return verdict


# Querysets and signals ------------------------------------------------------------------------


def plain_instances(queryset: models.QuerySet[Any, Any]) -> bool:
    """Whether ``queryset`` builds instances holding exactly their columns' values: Django's
    own iterable of model instances, no annotation, no ``extra`` select. ``False`` where that
    cannot be told."""
    if not _fits(QUERYSETS, _probe_querysets, queryset.model):
        return False
    from django.db.models.query import ModelIterable

    query = queryset.query
    iterable = queryset._iterable_class
    return iterable is ModelIterable and not query.annotations and not query.extra


def _probe_querysets(model: type[models.Model]) -> None:
    from django.db.models.query import ModelIterable

    plain: models.QuerySet[Any, Any] = models.QuerySet(model)
    if plain._iterable_class is not ModelIterable:
        raise TypeError("a plain queryset is not read by ModelIterable")
    if plain.query.annotations or plain.query.extra:
        raise TypeError("a plain queryset has annotations or extra selects")
    if plain.values("pk")._iterable_class is ModelIterable:
        raise TypeError("values() is read by ModelIterable")
    if not plain.annotate(realtime_probe=models.Value(1)).query.annotations:
        raise TypeError("annotate() is not in query.annotations")
    if not plain.extra(select={"realtime_probe": "1"}).query.extra:
        raise TypeError("extra() is not in query.extra")


def has_receivers(signal: Signal, sender: Any) -> bool:
    """Whether ``signal`` has receivers for ``sender`` (those of every sender included);
    ``True`` where that cannot be told."""
    if not _fits(RECEIVERS, _probe_receivers):
        return True
    return bool(signal.has_listeners(sender))


def _probe_receivers() -> None:
    signal = Signal(use_caching=True)  # as the model signals are

    class Sender:
        pass

    def receiver(**kwargs: Any) -> None:
        return None

    if signal.has_listeners(Sender):
        raise TypeError("a signal without receivers has listeners")
    signal.connect(receiver, sender=Sender, weak=False)
    try:
        if not signal.has_listeners(Sender) or signal.has_listeners(object):
            raise TypeError("has_listeners() does not tell a sender's receivers")
    finally:
        signal.disconnect(receiver, sender=Sender)
    if signal.has_listeners(Sender):
        raise TypeError("a disconnected receiver still listens")


def live_receivers(signal: Signal, sender: Any) -> tuple[list[Any], list[Any]] | None:
    """The synchronous and the asynchronous receivers of ``signal`` for ``sender`` (those of
    every sender included), each in the order they were connected; ``None`` where that cannot
    be told."""
    if not _fits(LIVE_RECEIVERS, _probe_live_receivers):
        return None
    found, asynchronous = signal._live_receivers(sender)
    return list(found), list(asynchronous)


def _probe_live_receivers() -> None:
    signal = Signal(use_caching=True)

    class Sender:
        pass

    def first(**kwargs: Any) -> None:
        return None

    async def second(**kwargs: Any) -> None:
        return None

    def third(**kwargs: Any) -> None:
        return None

    signal.connect(first, sender=Sender, weak=False)
    signal.connect(second, weak=False)
    signal.connect(third, weak=False)
    try:
        found, asynchronous = signal._live_receivers(Sender)
        if list(found) != [first, third] or list(asynchronous) != [second]:
            raise TypeError("_live_receivers() does not answer (sync, async) receivers")
        found, asynchronous = signal._live_receivers(object)
        if list(found) != [third] or list(asynchronous) != [second]:
            raise TypeError("_live_receivers() does not tell a sender's receivers")
    finally:
        for receiver in (first, second, third):
            signal.disconnect(receiver, sender=Sender if receiver is first else None)


def _probe_apps() -> Any:
    from django.apps.registry import Apps

    return Apps(())


# Connections ------------------------------------------------------------------------------


def driver_connection(wrapper: BaseDatabaseWrapper) -> Any | None:
    """``wrapper``'s open DB-API connection; ``None`` while it is closed, or where this
    Django keeps it elsewhere."""
    raw = getattr(wrapper, "connection", _MISSING)
    if raw is None:
        return None
    if not _fits(CONNECTION, _probe_connection, raw):
        return None
    return raw


def _probe_connection(raw: Any) -> None:
    if raw is _MISSING:
        raise AttributeError("a connection wrapper has no connection attribute")
    for method in ("cursor", "commit", "rollback", "close"):
        if not callable(getattr(raw, method, None)):
            raise TypeError(f"a wrapper's connection has no {method}()")


def socket_of(wrapper: BaseDatabaseWrapper) -> int | None:
    """The socket of ``wrapper``'s open networked connection; ``None`` for SQLite, a closed
    connection, or where it cannot be had."""
    if wrapper.vendor == "sqlite":
        return None
    raw = driver_connection(wrapper)
    if raw is None:
        return None
    try:
        fd = int(raw.fileno())
    except Exception:
        return None  # closed since
    return fd if _fits(SOCKET, _probe_socket, fd) else None


def _probe_socket(fd: int) -> None:
    if not stat.S_ISSOCK(os.fstat(fd).st_mode):
        raise TypeError(f"fileno() {fd} is not a socket")


def driver_errors(wrapper: BaseDatabaseWrapper) -> contextlib.AbstractContextManager[Any] | None:
    """The context in which ``wrapper``'s driver errors are raised as Django's, as its own
    cursors raise them; ``None`` where it cannot be had (use Django's cursor)."""
    if not _fits(ERRORS, _probe_errors, wrapper):
        return None
    errors: contextlib.AbstractContextManager[Any] = wrapper.wrap_database_errors
    return errors


def _probe_errors(wrapper: BaseDatabaseWrapper) -> None:
    # A data error: the one class Django does not take for a broken connection.
    driver_error = wrapper.Database.DataError  # type: ignore[attr-defined]
    try:
        with wrapper.wrap_database_errors:
            raise driver_error("realtime: a probe of the error translation")
    except DataError:
        return
    raise TypeError("a driver error was swallowed")


def use_options(
    wrapper: BaseDatabaseWrapper, options: Callable[[dict[str, Any]], dict[str, Any]]
) -> None:
    """Have this thread's ``wrapper`` connect, from its next connection on, with the alias's
    settings as they are now but ``options(its OPTIONS)`` as driver options; other threads are
    untouched. Nothing where this Django does not take them."""
    alias: dict[str, Any] = settings.DATABASES[wrapper.alias]
    given: dict[str, Any] = dict(alias.get("OPTIONS") or {})
    wanted = options(given)
    proposed = {**alias, "OPTIONS": wanted}
    added = wanted.keys() - given.keys()
    if _fits(OPTIONS, _probe_options, wrapper, proposed, added):
        wrapper.settings_dict = proposed


def _probe_options(wrapper: BaseDatabaseWrapper, proposed: dict[str, Any], added: Any) -> None:
    saved = wrapper.settings_dict
    wrapper.settings_dict = proposed
    try:
        params = wrapper.get_connection_params()
    finally:
        wrapper.settings_dict = saved
    missing = sorted(set(added) - params.keys())
    if missing:
        raise KeyError(f"options {missing} do not reach the driver")


# Transactions -------------------------------------------------------------------------------


def in_transaction(connection: BaseDatabaseWrapper) -> bool:
    """Whether an atomic block is open on ``connection`` (this thread's, of its alias),
    without connecting to the database."""
    if _fits(TRANSACTION, _probe_transaction, connection):
        return bool(connection.in_atomic_block)
    return not transaction.get_autocommit(connection.alias)


def in_atomic_block(connection: BaseDatabaseWrapper) -> bool:
    """Whether an atomic block is open on ``connection``, read without a statement or a
    connection, so from an event loop's thread too, where ``in_transaction``'s fallback would
    connect; ``False`` where the flag does not fit this Django."""
    return _fits(TRANSACTION, _probe_transaction, connection) and bool(connection.in_atomic_block)


def sync_connection(alias: str) -> BaseDatabaseWrapper | None:
    """The connection of ``alias`` that this thread's sync code holds, asked from an event loop
    running on the thread, where ``connections[alias]`` answers the loop's own; ``None`` when
    that code made none, or where this does not fit this Django and asgiref."""
    if not _fits(SYNC_CONNECTION, _probe_sync_connection):
        return None
    return _held_by_thread(alias)


def _held_by_thread(alias: str) -> BaseDatabaseWrapper | None:
    storage = getattr(getattr(connections, "_connections", None), "_storage", None)
    wrapper = getattr(storage, alias, None)
    return wrapper if isinstance(wrapper, BaseDatabaseWrapper) else None


def _probe_sync_connection() -> None:
    """In a thread of its own (the caller runs a loop): the connection its sync code made is
    the one answered from a loop ``asyncio.run`` runs there. No connection is opened."""
    outcome: list[str | None] = []

    def run() -> None:
        try:
            made = connections[DEFAULT_DB_ALIAS]

            async def ask() -> BaseDatabaseWrapper | None:
                return _held_by_thread(DEFAULT_DB_ALIAS)

            answered = asyncio.run(ask())
        except Exception as exc:
            outcome.append(f"{type(exc).__name__}: {exc}")
            return
        outcome.append(None if answered is made else "another connection was answered")

    thread = threading.Thread(target=run, name="realtime connections check", daemon=True)
    thread.start()
    thread.join(PROBE_TIMEOUT)
    problem = outcome[0] if outcome else f"the probe did not end in {PROBE_TIMEOUT:g} s"
    if problem is not None:
        raise RuntimeError(problem)


def in_manual_transaction(connection: BaseDatabaseWrapper) -> bool:
    """Whether ``connection`` is under manual transaction management: autocommit turned off
    (``transaction.set_autocommit(False)``) with no atomic block open, so that a statement
    made on it joins a transaction only the application ends. Asked before a statement on
    it: Django's ``get_autocommit`` connects if it has to."""
    if in_transaction(connection):
        return False
    return not transaction.get_autocommit(connection.alias)


def callbacks_committed(connection: BaseDatabaseWrapper) -> bool:
    """Whether the ``on_commit`` callbacks Django still holds on ``connection``, or lets go of
    now, unrun, are those of a committed transaction: the connection is open, in autocommit,
    with no atomic block. Django discards callbacks only with a transaction open (a rollback,
    a savepoint's, a close inside an atomic block); with none, those it holds are a commit's
    whose run is under way (a callback of the application's is writing), and one it lets go
    of unrun was stopped by a callback before it, registered with ``robust=False``, that
    raised. Never where Django keeps discarded callbacks (``callbacks_released``); read
    without connecting: a closed connection answers no."""
    if _verdicts.get(CALLBACKS) is False:
        return False
    if in_transaction(connection) or connection.connection is None:
        return False
    return bool(connection.get_autocommit())


def _probe_transaction(connection: BaseDatabaseWrapper) -> None:
    if not isinstance(getattr(connection, "in_atomic_block", None), bool):
        raise AttributeError("a connection wrapper has no in_atomic_block flag")


def atomic_block(connection: BaseDatabaseWrapper) -> object | None:
    """The atomic block open innermost on ``connection`` (this thread's, of its alias), to
    be told apart from any other by identity; ``None`` when none is open, or when blocks
    cannot be told apart (then every one is ``None``)."""
    if not _fits(ATOMIC, _probe_atomic_blocks, connection):
        return None
    blocks = connection.atomic_blocks
    return blocks[-1] if blocks else None


def _probe_atomic_blocks(connection: BaseDatabaseWrapper) -> None:
    blocks = getattr(connection, "atomic_blocks", None)
    if not isinstance(blocks, list):
        raise AttributeError("a connection wrapper keeps no list of its atomic blocks")
    if any(not isinstance(block, transaction.Atomic) for block in blocks):
        raise TypeError("a connection wrapper's atomic blocks are not Atomic objects")


#: Seconds before a check of the callbacks that could not run (the database away) is tried
#: again.
RETRY_AFTER = 30.0
_next_try = 0.0


def callbacks_released(connection: BaseDatabaseWrapper) -> bool:
    """Whether Django frees the ``on_commit`` callbacks it discards; checked on
    ``connection`` the first time no transaction is open on it (see the module docstring)."""
    global _next_try
    verdict = _verdicts.get(CALLBACKS)
    if verdict is not None:
        return verdict
    if in_transaction(connection) or time.monotonic() < _next_try:
        return True
    _next_try = time.monotonic() + RETRY_AFTER
    try:
        released = _discarded_and_freed(connection.alias)
    except DatabaseError:
        logger.debug("realtime: the on_commit check could not run yet", exc_info=True)
        return True
    return _fits(CALLBACKS, _judge_callbacks, released)


class _Probe:
    __slots__ = ("__weakref__",)

    def __call__(self) -> None:
        """Never called: it is registered in a savepoint that rolls back."""


class _RollBackError(Exception):
    """Raised to roll the probe's savepoint (or transaction) back."""


def _discarded_and_freed(using: str) -> bool:
    """Register a callback in a savepoint that rolls back (a transaction, where the database
    has no savepoints) and tell whether Django freed it at once. Nothing is written."""
    nested = connections[using].features.uses_savepoints
    discarded = _Probe()
    dropped: weakref.ref[_Probe] = weakref.ref(discarded)
    freed = False
    with transaction.atomic(using=using):
        try:
            with transaction.atomic(using=using):
                transaction.on_commit(discarded, using=using, robust=True)
                del discarded
                raise _RollBackError
        except _RollBackError:
            pass
        # Freed by reference counting when Django let go of it, not by a collection.
        freed = dropped() is None
    return freed if nested else dropped() is None


def _judge_callbacks(released: bool) -> None:
    if not released:
        raise TypeError("a callback registered in a rolled-back savepoint is still alive")
