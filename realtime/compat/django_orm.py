"""Django's ORM: what realtime's querysets and managers rely on that Django does not document.

The rest of the Django seam (connections, transactions, signals) is ``realtime.compat.django``;
each use here is checked by a self-test the first time a process relies on it, as there
(``_fits``), and falls back to what the public interface allows, said in one ERROR line:

* **The instances a fetch built** (``FetchingQuerySet``): ``QuerySet._fetch_all`` fills
  ``_result_cache`` from ``_iterable_class``; a ``RealtimeQuerySet`` is told of the model
  instances of each fetch, to keep what they were loaded with. Fallback: nothing is kept
  (every save of such a row lists every column as changed).
* **An attribute of realtime's on an instance's ``ModelState``** (``keep_on_state``): where what
  it was loaded with is found, without an object per row (``realtime.writes.tracking``).
  Django copies the state with the instance (pickling, ``copy``): realtime's value says
  nothing then. Fallback: nothing is kept.
* **Django's own managers replaced by realtime's** (``replace_managers``): in
  ``Options.local_managers``, with the class attribute's ``ManagerDescriptor``, and the
  options' caches expired (``Options._expire_cache``, as ``add_manager`` does). Only managers
  whose class is exactly ``django.db.models.Manager`` are replaced, keeping their name,
  creation order and flags: migrations see the same managers. Fallback: none is replaced
  (bulk writes through them are not announced; the system check names them).
* **The base manager Django makes** (``replace_base_manager``): where neither a model nor its
  parents name a base manager, ``Options.base_manager`` (a ``cached_property``, made again
  whenever the options' caches expire) makes a ``Manager`` named ``_base_manager``; Django
  reads related rows, refreshes instances and moves rows between related managers (``add()``)
  through it. A decorated model's options are of a subclass of ``Options`` that makes realtime's
  manager there instead, with the same name, model and flags, and leaves every other answer
  Django's. Naming a manager of the model instead (``base_manager_name``) would not do: its
  proxies and children would take their own manager of that name as their base manager, and
  migrations would record it. Fallback: the base manager stays Django's (bulk writes through
  it are not announced, rows it reads keep nothing; the system check names it).
* **The many-to-many count shortcut** (``through_rows``): Django's related managers count and
  test a many-to-many through its table alone (``constrained_target``, unless prefetched:
  ``get_prefetch_cache``) only when the target's default manager is exactly ``Manager``;
  ``RealtimeManager`` stands for it, and takes the same shortcut. Fallback: the join.
* **Deleting without collecting** (``fast_delete``): Django deletes a queryset in one statement
  (``QuerySet._raw_delete``) when nothing listens to its deletes and nothing cascades
  (``Collector.can_fast_delete``, ``Collector._has_signal_listeners``). Realtime's own
  receivers of a decorated model would stop that; a ``RealtimeQuerySet`` reads what it
  announces itself and asks Django's rule with those receivers left out. Fallback: Django's
  delete, row by row.
* **The rows a write matches, read as realtime reads them** (``matching``): without the
  caller's ``select_for_update()`` and ``select_related()`` (``Query.select_for_update``,
  ``Query.select_related``), which change how a read runs but not which rows it matches;
  Django's ``update()`` of one table takes neither into its statement; and whether a queryset
  asks ``select_for_update()`` (``selects_for_update``), for which realtime opens no
  transaction of its own around an ``update()`` (Django refuses some outside one), and with
  which of its arguments (``lock_options``: ``Query.select_for_update_nowait``,
  ``Query.select_for_update_skip_locked``, ``Query.select_for_no_key_update``), which
  realtime's own lock of the rows then takes. Fallback:
  realtime's read before a write keeps them (a ``select_for_update()`` read then fails outside
  a transaction, and the write goes unannounced, logged), and no queryset is said to ask it.
* **The rows a write changed, from its own statement** (``Returning``): on PostgreSQL and
  SQLite 3.35+, Django's ``update()`` of a model whose columns live in one table sends one
  ``UPDATE <table> SET ...`` statement, and its one-statement delete one ``DELETE FROM
  <table> ...`` (``SQLUpdateCompiler``, ``SQLDeleteCompiler``); an execute wrapper (documented)
  adds ``RETURNING`` to that statement and reads its rows, converted as a fetch converts them
  (``connection.ops.get_db_converters``, ``Expression.get_db_converters``). Fallback: realtime
  reads the rows in statements of its own, before the write.
* **A ``Q``'s tree** (``q_tree``): its ``connector``, ``negated`` and ``children`` (Django's
  ``tree.Node``), read to decide simple guards in process (``realtime.guard_checks``).
  Fallback: every guard is decided by the database.
* **The alias a write goes to** (``write_alias``): a queryset's ``_db`` and ``_hints``, as
  ``QuerySet.db`` reads them for a write; and the instance a queryset was made for
  (``instance_hint``: ``refresh_from_db`` hints its instance), which then knows what it read.
  Fallback: ``router.db_for_write(model)``, and a refreshed instance keeps what it knew
  before the refresh.

One documented difference between Django versions is answered here too, with no self-test:
whether ``Model.save()`` reads back the ``GeneratedField`` columns of the row it updated
(``saves_read_generated_back``).
"""

from __future__ import annotations

import functools
import re
import weakref
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import django
from django.db import connections, models, router, transaction
from django.db.models import sql
from django.db.models.base import ModelState
from django.db.models.deletion import Collector
from django.db.models.manager import ManagerDescriptor
from django.db.models.options import Options
from django.db.models.query import ModelIterable
from django.db.models.signals import post_delete, pre_delete
from django.utils.functional import cached_property

from realtime.compat.django import INSTEAD, _fits, _probe_apps

FETCH = "the instances a queryset fetch builds (QuerySet._fetch_all, _result_cache)"
STATE = "an attribute of realtime's on a ModelState"
REPLACE = "replacing a model's managers (Options.local_managers, _expire_cache)"
BASE = "the base manager Django makes (Options.base_manager)"
THROUGH = "a many-to-many's count through its table (constrained_target, get_prefetch_cache)"
FAST_DELETE = "deleting a queryset without collecting (Collector.can_fast_delete, _raw_delete)"
WRITE_ALIAS = "the alias of a queryset's write (QuerySet._db, _hints)"
RETURNING = "the rows of an update() or delete() read from its statement (SQLUpdateCompiler)"
MATCHING = "a queryset's rows read without its lock and joins (Query.select_for_update, ...)"
Q_TREE = "a Q's connector, negation and children (tree.Node)"

INSTEAD.update(
    {
        FETCH: "what rows were loaded with is not kept: their saves list every column changed",
        STATE: "what rows were loaded with is not kept: their saves list every column changed",
        REPLACE: (
            "no manager is replaced by realtime's: bulk writes of decorated models are not "
            "announced (realtime.W031 names the managers)"
        ),
        BASE: (
            "the base manager Django makes stays Django's: bulk writes through it (a reverse "
            "foreign key's add()) are not announced (realtime.W031 names it), and rows it reads "
            "keep nothing (their saves list every column changed)"
        ),
        THROUGH: "related managers' count() and exists() join the target table",
        FAST_DELETE: "QuerySet.delete() of decorated models deletes row by row",
        WRITE_ALIAS: "a bulk write's reads go to router.db_for_write(model)",
        RETURNING: "update() and QuerySet.delete() read their rows in statements of their own",
        Q_TREE: "every guard is decided by the database: one subquery per account",
        MATCHING: (
            "realtime's reads before a bulk write keep the caller's select_for_update() and "
            "select_related(): outside a transaction such a write is not announced"
        ),
    }
)

#: The attribute of ``ModelState`` realtime keeps its value in.
STATE_ATTRIBUTE = "realtime_snapshot"


# Fetches --------------------------------------------------------------------------------------


_Model = TypeVar("_Model", bound=models.Model, covariant=True)
_Row = TypeVar("_Row", covariant=True)


class FetchingQuerySet(models.QuerySet[_Model, _Row]):
    """A queryset told of the model instances each of its fetches builds (``fetched``)."""

    def _fetch_all(self) -> None:
        fresh = self._result_cache is None
        super()._fetch_all()
        cache = self._result_cache
        if (
            fresh
            and cache
            and issubclass(self._iterable_class, ModelIterable)
            and _fits(FETCH, _probe_fetch, type(self))
        ):
            self.fetched(cache)

    def fetched(self, instances: list[Any]) -> None:
        """Called with the instances one fetch built (override it)."""


def _probe_fetch(queryset_class: type[models.QuerySet[Any, Any]]) -> None:
    if not callable(getattr(models.QuerySet, "_fetch_all", None)):
        raise AttributeError("QuerySet has no _fetch_all()")
    queryset: models.QuerySet[Any, Any] = models.QuerySet(_probe_models()[0]).none()
    if queryset._result_cache is not None or queryset._iterable_class is not ModelIterable:
        raise TypeError("a new queryset has a result cache, or is not read by ModelIterable")
    queryset._fetch_all()
    if queryset._result_cache != []:
        raise TypeError("_fetch_all() does not fill _result_cache")


# Model state -----------------------------------------------------------------------------------


def keep_on_state(states: Iterable[ModelState], value: Any) -> None:
    """Keep ``value`` on each of ``states`` (nothing, where Django's state takes none)."""
    if _fits(STATE, _probe_state):
        for state in states:
            setattr(state, STATE_ATTRIBUTE, value)


def kept_on_state(state: ModelState) -> Any:
    """What realtime keeps on ``state``; ``None`` when nothing."""
    return getattr(state, STATE_ATTRIBUTE, None)


def _probe_state() -> None:
    state = ModelState()
    setattr(state, STATE_ATTRIBUTE, 1)
    if getattr(state, STATE_ATTRIBUTE, None) != 1 or "__slots__" in vars(ModelState):
        raise TypeError("a ModelState keeps no attribute of realtime's")


# Managers --------------------------------------------------------------------------------------


def replace_managers(model: type[models.Model], make: Callable[[], models.Manager[Any]]) -> int:
    """Give ``model`` ``make()`` in place of each of its managers whose class is exactly
    Django's ``Manager`` (the ``objects`` Django adds included), under the same name and in
    the same order; how many were replaced.

    A manager the model inherits (from an abstract parent, a concrete one, a proxy's) is not
    replaced on its parent, whose other children keep it: the model gets its own copy of each
    of its managers instead, in the order Django gave them (so its default manager stays
    what it was), the ones to replace replaced."""
    if not _fits(REPLACE, _probe_replace):
        return 0
    meta = model._meta
    managers = list(meta.managers)
    replaced = [m.name for m in managers if type(m) is models.Manager]
    if not replaced:
        return 0
    local = meta.local_managers
    inherited = {m.name for m in managers} - {m.name for m in local}
    if inherited & set(replaced):
        # Its own copy of every manager, in Django's order: the order of its creation counters.
        local[:] = [_realtime(m, make) if m.name in replaced else m for m in managers]
        for order, manager in enumerate(local):
            manager.creation_counter = order
    else:
        local[:] = [_realtime(m, make) if m.name in replaced else m for m in local]
    for manager in local:
        setattr(model, manager.name, ManagerDescriptor(manager))
    meta._expire_cache()  # type: ignore[attr-defined]
    return len(replaced)


def _realtime(manager: models.Manager[Any], make: Callable[[], models.Manager[Any]]) -> Any:
    """``make()`` standing for ``manager``: its name, model, place and flags."""
    new = make()
    new.name = manager.name
    new.model = manager.model
    new.creation_counter = manager.creation_counter
    new.auto_created = manager.auto_created
    new.use_in_migrations = manager.use_in_migrations
    new._db = manager._db
    new._hints = manager._hints  # type: ignore[attr-defined]
    return new


def _probe_replace() -> None:
    probe, _ = _probe_models()
    (auto,) = probe._meta.local_managers
    if type(auto) is not models.Manager or not auto.auto_created or auto.name != "objects":
        raise TypeError("a model without managers has no auto-created 'objects' Manager")
    if probe._meta.default_manager is not probe._meta.managers[0]:
        raise TypeError("Options.managers does not start with the default manager")
    if not isinstance(vars(probe).get("objects"), ManagerDescriptor):
        raise TypeError("a manager is not reached through a ManagerDescriptor")
    if not callable(getattr(probe._meta, "_expire_cache", None)):
        raise AttributeError("Options has no _expire_cache()")


def replace_base_manager(
    model: type[models.Model], make: Callable[[], models.Manager[Any]]
) -> bool:
    """Have ``make()`` stand for the base manager Django makes for ``model`` (where neither
    it nor a parent names one), with its name, model and flags; whether ``model`` has it so.

    Django makes that manager again each time the options' caches expire, so the options
    make realtime's instead: they become of a subclass of Django's ``Options`` that changes
    nothing else. A proxy or child still gets a base manager of its own, as from Django (the
    name of this one says Django made it)."""
    if not _fits(BASE, _probe_base):
        return False
    meta = model._meta
    if type(meta) is Options:
        meta.__class__ = _options_making(make)
        if "base_manager" in vars(meta):
            del meta.base_manager  # made again, by the subclass
    return isinstance(meta, BaseManagerOptions)


if TYPE_CHECKING:
    _Options = Options[Any]
else:
    _Options = Options  # generic for type checkers only


class BaseManagerOptions(_Options):
    """A model's ``Options`` whose base manager, where Django would make its own ``Manager``,
    is ``make_base_manager()`` standing for it (a subclass per ``make``: ``_options_making``)."""

    make_base_manager: Callable[[], models.Manager[Any]]

    @cached_property
    def base_manager(self) -> Any:
        djangos = super().base_manager
        return _realtime(djangos, self.make_base_manager) if _made_by_django(djangos) else djangos


@functools.cache
def _options_making(make: Callable[[], models.Manager[Any]]) -> type[BaseManagerOptions]:
    """The ``BaseManagerOptions`` whose base manager stands ``make()`` for Django's."""
    return type("BaseManagerOptions", (BaseManagerOptions,), {"make_base_manager": make})


def _made_by_django(manager: models.Manager[Any]) -> bool:
    """Whether ``manager`` is the base manager Django makes (no model names one)."""
    return bool(
        type(manager) is models.Manager and manager.auto_created and manager.name == "_base_manager"
    )


def _probe_base() -> None:
    if not isinstance(vars(Options).get("base_manager"), cached_property):
        raise TypeError("Options.base_manager is no cached_property")
    parent, proxy = _probe_family()
    if not all(_made_by_django(model._base_manager) for model in (parent, proxy)):
        raise TypeError("a model without Meta.base_manager_name has no base manager of Django's")

    class Standing(models.Manager[Any]):
        pass

    parent._meta.__class__ = _options_making(Standing)
    del parent._meta.base_manager
    made = parent._base_manager
    if type(made) is not Standing or made.name != "_base_manager" or made.model is not parent:
        raise TypeError("Options.base_manager is not what makes a model's base manager")
    if not _made_by_django(proxy._base_manager):
        raise TypeError("a proxy takes the base manager its parent's options make")


def through_rows(manager: Any) -> models.QuerySet[Any, Any] | None:
    """The rows of a many-to-many's table that Django's own ``Manager`` would count and test
    for existence on, when ``manager`` is the related manager of such a relation (and nothing
    was prefetched); ``None`` otherwise."""
    if getattr(type(manager), "constrained_target", None) is None:
        return None
    if not _fits(THROUGH, _probe_through):
        return None
    if manager.get_prefetch_cache() is not None:
        return None
    found: models.QuerySet[Any, Any] | None = manager.constrained_target
    return found


def _probe_through() -> None:
    _, linked = _probe_models()
    manager_class = linked.links.related_manager_cls
    if not isinstance(vars(manager_class).get("constrained_target"), property):
        raise TypeError("a many-to-many's related manager has no constrained_target")
    if not callable(getattr(manager_class, "get_prefetch_cache", None)):
        raise TypeError("a many-to-many's related manager has no get_prefetch_cache()")


# Deletes ---------------------------------------------------------------------------------------


def fast_delete(
    queryset: models.QuerySet[Any, Any],
    ignoring: Collection[Any],
    using: str,
    before: Callable[[models.QuerySet[Any, Any]], models.QuerySet[Any, Any] | None] | None = None,
) -> int | None:
    """Delete the rows of ``queryset`` on ``using`` in one statement, as Django's
    ``QuerySet.delete()`` does when nothing but the receivers ``ignoring`` listens to the
    model's deletes and nothing cascades; how many went. ``before`` is called first, with
    the queryset of the rows to delete; the queryset it answers (those rows narrowed to what
    it read), if any, is what the statement deletes.
    ``None``, deleting nothing, where Django would delete otherwise (or refuse: a slice,
    ``values()``, ``distinct(*fields)``)."""
    if not _fits(FAST_DELETE, _probe_fast_delete):
        return None
    query = queryset.query
    if query.is_sliced or query.distinct_fields or query.combinator:
        return None
    if queryset._fields is not None:  # type: ignore[attr-defined]
        return None
    doomed = matching(queryset, using)
    collector = _Collector(using=using, origin=queryset)
    collector.ignoring = ignoring
    if not collector.can_fast_delete(doomed):
        return None
    if before is not None:
        narrowed = before(doomed)
        doomed = doomed if narrowed is None else narrowed
    with transaction.atomic(using=using, savepoint=False):  # as Django's Collector.delete()
        count: int = doomed._raw_delete(using)
    queryset._result_cache = None  # as QuerySet.delete(): the queryset may be used again
    return count


def matching(queryset: models.QuerySet[Any, Any], using: str) -> models.QuerySet[Any, Any]:
    """The rows ``queryset`` matches, for realtime to read before a write of them, on
    ``using`` (the write's alias): unordered, and without what changes how the caller's read
    runs but not which rows it matches, as Django's ``update()`` and one-statement delete
    leave it out of their statements: ``select_for_update()`` (outside a transaction the read
    would raise; inside, it would lock the rows of joined tables too), ``select_related()``'s
    joins, ``prefetch_related()``'s reads, ``distinct()`` (with fields, ``DISTINCT ON``:
    Django's ``UPDATE`` changes every row the filter matches, and no database but
    PostgreSQL reads with it)."""
    rows = queryset.using(using).order_by().prefetch_related(None)
    if _fits(MATCHING, _probe_matching):
        rows.query.select_for_update = False
        rows.query.select_related = False
        rows.query.distinct, rows.query.distinct_fields = False, ()
    return rows


def selects_for_update(queryset: models.QuerySet[Any, Any]) -> bool:
    """Whether ``queryset`` asks ``select_for_update()`` (``False`` where that cannot be
    told)."""
    if not _fits(MATCHING, _probe_matching):
        return False
    return bool(queryset.query.select_for_update)


def lock_options(queryset: models.QuerySet[Any, Any]) -> dict[str, bool] | None:
    """The ``select_for_update()`` arguments ``queryset`` asks that change which of its rows
    a write takes (``nowait``, ``skip_locked``) or how strongly (``no_key``); ``None`` when it
    asks no ``select_for_update()`` (or that cannot be told). ``of`` is left out: realtime
    locks the rows of the model's own table alone."""
    if not selects_for_update(queryset):
        return None
    query = queryset.query
    return {
        "nowait": bool(query.select_for_update_nowait),
        "skip_locked": bool(query.select_for_update_skip_locked),
        "no_key": bool(query.select_for_no_key_update),
    }


def _probe_matching() -> None:
    probe, _ = _probe_models()
    # select_related() with no field is deprecated from Django 6.1; the probe model has no
    # foreign key to name: the attribute is checked at its default (False, or the fields).
    query = models.QuerySet(probe).select_for_update().query
    if query.select_for_update is not True or query.select_related is not False:
        raise TypeError("Query keeps select_for_update() and select_related() elsewhere")
    distinct = models.QuerySet(probe).distinct("pk").query
    if distinct.distinct is not True or distinct.distinct_fields != ("pk",):
        raise TypeError("Query keeps distinct() and its fields elsewhere")
    asked: models.QuerySet[Any, Any] = models.QuerySet(probe).select_for_update(
        nowait=True, skip_locked=False, no_key=True
    )
    flags = (
        asked.query.select_for_update_nowait,
        asked.query.select_for_update_skip_locked,
        asked.query.select_for_no_key_update,
    )
    if flags != (True, False, True):
        raise TypeError("Query keeps select_for_update()'s nowait, skip_locked, no_key elsewhere")


class _Collector(Collector):
    """Django's collector, told that the receivers ``ignoring`` do not count as listeners."""

    ignoring: Collection[Any] = ()

    def _has_signal_listeners(self, model: type[models.Model]) -> bool:
        for signal in (pre_delete, post_delete):
            found, asynchronous = signal._live_receivers(model)
            if any(receiver not in self.ignoring for receiver in (*found, *asynchronous)):
                return True
        return False


def _probe_fast_delete() -> None:
    probe, _ = _probe_models()
    if not callable(getattr(models.QuerySet, "_raw_delete", None)):
        raise AttributeError("QuerySet has no _raw_delete()")
    collector = _Collector(using="default", origin=None)
    queryset: models.QuerySet[Any, Any] = models.QuerySet(probe)
    if not collector.can_fast_delete(queryset) or collector._has_signal_listeners(probe):
        raise TypeError("a model nothing listens to cannot be fast-deleted")

    def listener(**kwargs: Any) -> None:
        return None

    pre_delete.connect(listener, sender=probe, weak=False)
    try:
        if Collector(using="default").can_fast_delete(queryset):
            raise TypeError("Collector.can_fast_delete() ignores signal listeners")
        collector.ignoring = [listener]
        if not collector.can_fast_delete(queryset):
            raise TypeError("Collector._has_signal_listeners() is not what decides")
    finally:
        pre_delete.disconnect(listener, sender=probe)


# Rows returned by a write ----------------------------------------------------------------------

#: Rows read from a returning statement at a time.
RETURNED_BATCH = 2_000
#: Comments an execute wrapper of the application may put before a statement (a tag).
_LEADING_COMMENTS = re.compile(r"\s*(?:/\*.*?\*/\s*|--[^\n]*\n\s*)+", re.DOTALL)


def can_return_rows(using: str) -> bool:
    """Whether an ``UPDATE`` or ``DELETE`` on ``using`` can return its rows (``Returning``)."""
    connection = connections[using]
    if connection.vendor == "sqlite":
        if not connection.features.can_return_columns_from_insert:  # SQLite before 3.35
            return False
    elif connection.vendor != "postgresql":
        return False  # MySQL has no RETURNING; MariaDB none for UPDATE
    return _fits(RETURNING, _probe_returning, using)


class Returning:
    """An execute wrapper (``with connection.execute_wrapper(returning):``) that adds
    ``RETURNING`` the columns of ``fields`` to the first ``UPDATE`` (``verb="UPDATE"``) or
    ``DELETE`` of ``model``'s table it sees, and reads what it returns: the first ``keep``
    rows whole (``rows``), of the others the distinct values of the columns at ``rest``
    (``rest``); ``count`` of them all. Only rows are read inside the statement; ``converted``
    turns them into Python values afterwards (what fails there cannot fail the write)."""

    def __init__(
        self,
        model: type[models.Model],
        using: str,
        verb: str,
        fields: Sequence[Any],
        keep: int,
        rest: Sequence[int] = (),
    ) -> None:
        connection = connections[using]
        layout = _layout(model, connection, verb, fields)
        self.prefix = layout.prefix
        self.clause = layout.clause
        self.converting = layout.converting
        self.fields = list(fields)
        self.table = model._meta.db_table
        self.using = using
        self.keep = keep
        self.rest_at = list(rest)
        self.seen = False
        #: Whether the statement, seen, returned no rows at all (its ``RETURNING`` lost).
        self.lost = False
        #: The start of a write that went by without being recognised (for the error).
        self.other: str | None = None
        self.count = 0
        self.rows: list[tuple[Any, ...]] = []
        self.rest: set[tuple[Any, ...]] = set()

    def __call__(
        self, execute: Callable[..., Any], sql_: str, params: Any, many: bool, context: Any
    ) -> Any:
        if self.seen or many or not self._fits(sql_):
            return execute(sql_, params, many, context)
        self.seen = True
        clause = self.clause if params is None else self.clause.replace("%", "%%")
        result = execute(sql_ + clause, params, many, context)
        cursor = context["cursor"]
        if cursor.description is None:  # fetching would raise (psycopg): the write stands
            self.lost = True
            return result
        rest_at = self.rest_at
        while batch := cursor.fetchmany(RETURNED_BATCH):
            room = self.keep - len(self.rows)
            if room > 0:
                self.rows += batch[:room]
            for row in batch[max(room, 0) :]:
                self.rest.add(tuple(row[at] for at in rest_at))
            self.count += len(batch)
        return result

    def _fits(self, sql_: str) -> bool:
        """Whether ``sql_`` is the statement: after any comments an execute wrapper put in
        front of it, the prefix, then (a ``DELETE``'s table name ending there) nothing or a
        space."""
        start = _LEADING_COMMENTS.match(sql_)
        text = sql_[start.end() :] if start else sql_
        if not text.startswith(self.prefix) or sql_.rstrip().endswith(";"):
            if self.other is None and text[:6].upper() in ("UPDATE", "DELETE"):
                self.other = text[:120]
            return False
        return self.prefix.endswith(" ") or text[len(self.prefix) : len(self.prefix) + 1] in (
            "",
            " ",
        )

    def converted(self) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """The rows kept and the distinct values of the others, as a fetch makes them."""
        connection = connections[self.using]
        convert: dict[int, tuple[Any, list[Any]]] = {}
        for index in self.converting:
            col = self.fields[index].get_col(self.table)
            found = [*connection.ops.get_db_converters(col), *col.get_db_converters(connection)]
            convert[index] = (col, found)

        def row_of(values: Sequence[Any], at: Iterable[int]) -> tuple[Any, ...]:
            if not convert:
                return tuple(values)
            out = []
            for value, index in zip(values, at, strict=True):
                col, converters = convert.get(index, (None, ()))
                for converter in converters:
                    value = converter(value, col, connection)
                out.append(value)
            return tuple(out)

        every = range(len(self.fields))
        rows = [row_of(row, every) for row in self.rows]
        return rows, list({row_of(values, self.rest_at) for values in self.rest})


class _Layout:
    """What a ``Returning`` of some columns of one model needs that depends only on the
    model, the database's vendor and the verb: its statement's text, and the columns a fetch
    converts (the converters themselves are asked for each write: they are bound to the
    fields). Text and numbers only: a model defined in a test can still be released."""

    __slots__ = ("clause", "converting", "prefix")

    def __init__(self, prefix: str, clause: str, converting: tuple[int, ...]) -> None:
        self.prefix = prefix
        self.clause = clause
        self.converting = converting


_layouts: weakref.WeakKeyDictionary[type[models.Model], dict[Any, _Layout]] = (
    weakref.WeakKeyDictionary()
)


def _layout(
    model: type[models.Model], connection: Any, verb: str, fields: Sequence[Any]
) -> _Layout:
    """The ``_Layout`` of a ``Returning`` of ``fields`` of ``model`` on ``connection``,
    worked out once per vendor, verb and columns."""
    key = (connection.vendor, verb, tuple(field.column for field in fields))
    by_key = _layouts.get(model)
    if by_key is None:
        by_key = _layouts[model] = {}
    layout = by_key.get(key)
    if layout is None:
        quote = connection.ops.quote_name
        table = quote(model._meta.db_table)
        prefix = f"UPDATE {table} SET " if verb == "UPDATE" else f"DELETE FROM {table}"
        # On a line of its own: a wrapper may end the statement with a ``--`` comment (a tag).
        clause = "\nRETURNING " + ", ".join(quote(field.column) for field in fields)
        converting = []
        for index, field in enumerate(fields):
            col = field.get_col(model._meta.db_table)
            if connection.ops.get_db_converters(col) or col.get_db_converters(connection):
                converting.append(index)
        layout = by_key[key] = _Layout(prefix, clause, tuple(converting))
    return layout


def _probe_returning(using: str) -> None:
    probe, _ = _probe_models()
    connection = connections[using]
    table = connection.ops.quote_name(probe._meta.db_table)
    query = models.QuerySet(probe).filter(pk=1).query
    update: Any = query.chain(sql.UpdateQuery)
    update.add_update_values({"id": 2})
    written, _ = update.get_compiler(using).as_sql()
    deleted = query.chain(sql.DeleteQuery)
    removed, _ = deleted.get_compiler(using).as_sql()
    for text, start in ((written, f"UPDATE {table} SET "), (removed, f"DELETE FROM {table} ")):
        if not text.startswith(start) or "RETURNING" in text.upper():
            raise TypeError(f"Django's statement {text!r} is not {start!r}... without RETURNING")


# Aliases ---------------------------------------------------------------------------------------


def write_alias(queryset: models.QuerySet[Any, Any]) -> str:
    """The alias a write of ``queryset`` (``update()``, ``delete()``) goes to: its
    ``using()``, else the routers' ``db_for_write``."""
    if not _fits(WRITE_ALIAS, _probe_write_alias):
        return router.db_for_write(queryset.model)
    given: Any = queryset
    alias: str = given._db or router.db_for_write(queryset.model, **given._hints)
    return alias


def instance_hint(queryset: models.QuerySet[Any, Any]) -> models.Model | None:
    """The instance ``queryset`` was made for, as its router hints say (``refresh_from_db``
    reads an instance again through such a queryset); ``None`` when none."""
    if not _fits(WRITE_ALIAS, _probe_write_alias):
        return None
    given: Any = queryset
    found = given._hints.get("instance")
    return found if isinstance(found, models.Model) else None


def _probe_write_alias() -> None:
    probe, _ = _probe_models()
    hints: dict[str, Any] = {"instance": None}
    queryset: Any = models.QuerySet(probe, using="elsewhere", hints=hints)
    if queryset._db != "elsewhere" or queryset._hints != hints:
        raise TypeError("a queryset keeps no _db and _hints")


# Saves -----------------------------------------------------------------------------------------


def saves_read_generated_back() -> bool:
    """Whether an update by ``Model.save()`` leaves on its instance what the database made of
    the row's ``GeneratedField`` columns: from Django 6.0 it reads them back (``RETURNING``),
    or defers them where the database cannot return them (MySQL, MariaDB), as its release
    notes say; Django 5.2 leaves the values the instance held before the save."""
    return django.VERSION >= (6, 0)


# Q objects -------------------------------------------------------------------------------------


def q_tree(q: Any) -> tuple[str, bool, list[Any]] | None:
    """A ``Q``'s connector (``Q.AND``, ``Q.OR``, ``Q.XOR``), whether it is negated, and its
    children (``Q`` objects and ``(lookup, value)`` pairs, or expressions); ``None`` for what
    is no ``Q``, or where Django keeps them so no more."""
    if not isinstance(q, models.Q) or not _fits(Q_TREE, _probe_q_tree):
        return None
    return str(q.connector), bool(q.negated), list(q.children)


def _probe_q_tree() -> None:
    q = models.Q(a=1) | ~models.Q(b__in=[2])
    if q.connector != models.Q.OR or q.negated or len(q.children) != 2:
        raise TypeError("a Q keeps no connector, negated and children")
    first, second = q.children
    if first != ("a", 1) or not isinstance(second, models.Q):
        raise TypeError("a Q's children are no (lookup, value) pairs and Q objects")
    if not second.negated or second.children != [("b__in", [2])]:
        raise TypeError("a negated Q keeps no negated flag and children")


# Probes ----------------------------------------------------------------------------------------

_models: tuple[Any, Any] | None = None


def _probe_models() -> tuple[Any, Any]:
    """Models of a registry of their own (never migrated, never queried): one nothing points
    at, and one with a many-to-many (to a third)."""
    global _models
    if _models is None:
        registry = _probe_apps()

        class Alone(models.Model):  # noqa: DJ008 - never shown
            class Meta:
                app_label = "realtime"
                apps = registry

        class Target(models.Model):  # noqa: DJ008 - never shown
            class Meta:
                app_label = "realtime"
                apps = registry

        class Linked(models.Model):  # noqa: DJ008 - never shown
            links = models.ManyToManyField(Target)

            class Meta:
                app_label = "realtime"
                apps = registry

        _models = (Alone, Linked)
    return _models


def _probe_family() -> tuple[Any, Any]:
    """A model of a registry of its own (never migrated, never queried), and a proxy of it,
    made anew for each call (a probe may change them)."""
    registry = _probe_apps()

    class Parent(models.Model):  # noqa: DJ008 - never shown
        class Meta:
            app_label = "realtime"
            apps = registry

    class Proxy(Parent):  # noqa: DJ008 - never shown
        class Meta:
            app_label = "realtime"
            apps = registry
            proxy = True

    return Parent, Proxy
