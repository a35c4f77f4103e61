"""System checks for ``@realtime_model`` declarations (``realtime.E03x`` / ``realtime.W03x``,
``realtime.E050`` for ``filters=``).

Paths name models that may not exist when a decorator runs, so they are checked here, once
every model is loaded, each error with a hint.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.core import checks
from django.core.exceptions import FieldDoesNotExist
from django.db import connections, models

from realtime.auth import scope_model
from realtime.checks.settings import account_model
from realtime.paths import (
    column_values_field,
    holds_target_pk,
    is_foreign_key,
    path_target,
    resolve_path,
    value_hooks,
)
from realtime.primary import primary
from realtime.registry import (
    ModelOptions,
    all_options,
    duplicate_names,
    is_generic_fk,
    options_for,
    relation_target,
)
from realtime.sockets.live_queries import SQLITE_DECIMAL_DIGITS
from realtime.writes.memberships import followed, membership_models, watch_of


@checks.register()
def check_models(app_configs: Iterable[Any] | None = None, **kwargs: Any) -> list[Any]:
    """Validate every decorated model; see the module docstring."""
    messages: list[checks.CheckMessage] = []
    for name, group in duplicate_names().items():
        labels = ", ".join(options.model._meta.label for options in group)
        messages.append(
            checks.Error(
                f"The realtime name {name!r} is used by {labels}.",
                hint="Give one of them another name with @realtime_model(name=...).",
                obj=group[-1].model,
                id="realtime.E030",
            )
        )
    for options in all_options():
        messages += _check_one(options)
        messages += _check_managers(options.model)
        messages += _check_guard_links(options)
        messages += _check_filters(options)
        messages += _check_parents(options)
    for membership in _undecorated_memberships():
        messages += _check_managers(membership, links=True)
    return messages


#: The longest text a live query may filter by: longer text is searched, not filtered.
FILTER_TEXT_MAX = 255
#: The kinds of columns (``get_internal_type()``, a key's target's) live queries compare in
#: Python as the databases do. Others are refused: addresses (PostgreSQL's ``inet``
#: normalises them), bytes, files, durations (compared as text in Python) and the custom
#: fields of an application, whose stored form only it knows: those reporting a kind of
#: their own, and those reporting one of these whose class handles its values itself
#: (``value_hooks``: a ``CharField`` holding a list).
FILTER_KINDS = frozenset(
    {
        "AutoField",
        "BigAutoField",
        "SmallAutoField",
        "IntegerField",
        "BigIntegerField",
        "SmallIntegerField",
        "PositiveIntegerField",
        "PositiveBigIntegerField",
        "PositiveSmallIntegerField",
        "BooleanField",
        "CharField",
        "SlugField",
        "DateField",
        "DateTimeField",
        "TimeField",
        "DecimalField",
        "FloatField",
        "UUIDField",
    }
)


def _check_filters(options: ModelOptions) -> list[checks.CheckMessage]:
    """``filters=`` names local concrete columns (a foreign key by its id) whose comparison
    Python and the database agree on (``FILTER_KINDS``): no relation path, many-to-many,
    long text, text of a collation of its own, JSON, field class handling its values itself
    (``value_hooks``) or kind of column outside that list, and no decimal the database rounds
    (``SQLITE_DECIMAL_DIGITS``)."""
    model = options.model
    out: list[checks.CheckMessage] = []
    hint = (
        "Name columns of the model itself: numbers, booleans, dates and times, UUIDs, text of "
        "at most 255 characters, or foreign keys to such keys."
    )
    for name in options.declared_filters:
        fix: str | None = None
        try:
            field = model._meta.get_field(name)
        except FieldDoesNotExist:
            field = None
        if "__" in str(name):
            why = "is a relation path, not a column of the model"
        elif field is None:
            why = "is not a field of the model"
        elif field.name != name:  # a foreign key's column: the field is named otherwise
            why = f"is not a field of the model (name the field, {field.name!r})"
        elif not field.concrete or field.many_to_many or name == "pk":
            why = "is not a column of the model"
        elif isinstance(field, models.JSONField):
            why = "is a JSON field"
        elif isinstance(field, models.TextField) or (
            isinstance(field, models.CharField)
            and (field.max_length is None or field.max_length > FILTER_TEXT_MAX)
        ):
            why = f"is text longer than {FILTER_TEXT_MAX} characters"
        elif field.model is not model and field.model._meta.concrete_model is not (
            model._meta.concrete_model
        ):
            why = "lives in a parent model's table"
        elif (kind := _column_kind(field)) not in FILTER_KINDS:
            why = f"is a {kind} column, which the database may compare otherwise than Python"
        elif own := _own_values(field):
            cls, hooks = own
            why = (
                f"is a {cls.__module__}.{cls.__qualname__}, a field class that handles its "
                f"values itself ({', '.join(hooks)}): a live query would compare them as "
                "Python holds them, the database as the column stores them"
            )
            fix = (
                f"Leave {name!r} out of filters=, or filter by a field of Django's own class "
                "(or of a subclass that leaves its values to it)."
            )
        elif collation := getattr(column_values_field(field), "db_collation", None):
            # A nondeterministic collation on PostgreSQL (Django's replacement for
            # CICharField), most of MySQL's: equal text Python tells apart.
            why = (
                f"is text of the collation {collation!r} (db_collation), which the database "
                "may compare case- or accent-insensitively where a live query compares it "
                "exactly"
            )
            fix = (
                f"Leave {name!r} out of filters=, or filter by a column of its values in one "
                "case without db_collation (a GeneratedField of Lower(...), say)."
            )
        elif (digits := _rounded_digits(field)) is not None:
            why = (
                f"is a decimal of {digits} digits, and SQLite keeps {SQLITE_DECIMAL_DIGITS} "
                "significant digits of one (a floating-point number): the database compares "
                "rounded values where a live query compares them exactly"
            )
            fix = (
                f"Declare {name!r} with max_digits={SQLITE_DECIMAL_DIGITS} or fewer, or leave "
                "it out of filters= (PostgreSQL, MySQL and MariaDB keep decimals whole)."
            )
        else:
            continue
        out.append(_e(50, model, f"filters names {name!r}, which {why}.", fix or hint))
    return out


def _rounded_digits(field: Any) -> int | None:
    """A decimal column's ``max_digits`` when its database rounds its values (SQLite,
    past ``SQLITE_DECIMAL_DIGITS``); ``None`` when it keeps them whole."""
    target = column_values_field(field)
    if not isinstance(target, models.DecimalField) or target.max_digits is None:
        return None
    if target.max_digits <= SQLITE_DECIMAL_DIGITS:
        return None
    return target.max_digits if connections[primary(field.model)].vendor == "sqlite" else None


def _own_values(field: Any) -> tuple[type[Any], tuple[str, ...]] | None:
    """The class, of the field's and a foreign key's target's, that holds, reads or writes
    its values otherwise than the Django class it derives from (``value_hooks``: a
    ``CharField`` holding a list reports ``CharField`` still), and the hooks it overrides."""
    for each in (field, column_values_field(field)):
        if each is not None and (hooks := value_hooks(each)):
            return type(each), hooks
    return None


def _column_kind(field: Any) -> str:
    """The kind of values a column holds: a foreign key's target's."""
    target = column_values_field(field)
    return "unknown" if target is None else str(target.get_internal_type())


def _check_guard_links(options: ModelOptions) -> list[checks.CheckMessage]:
    """``realtime.W033``: links that decide who reads the rows, kept as rows of a ``through``
    model of the application's own: those a guard may read, and those of a ``shared_via``
    root. Realtime sees them change through the many-to-many manager only (``m2m_changed``);
    rows written directly change the readers unseen. An auto-created through table is
    watched however it is written — its querysets' ``bulk_create``, ``update()`` and
    ``delete()`` as much as the manager, which writes through them — and is never named."""
    return _guard_links(options) + _shared_links(options)


def _guard_links(options: ModelOptions) -> list[checks.CheckMessage]:
    if options.guard is None:
        return []
    named = options.guard_attnames
    out: list[checks.CheckMessage] = []
    for field in options.model._meta.many_to_many:
        through = field.remote_field.through
        if named is not None and field.name not in named:
            continue
        if not isinstance(through, type) or through._meta.auto_created:
            continue
        out.append(
            checks.Warning(
                f"{options.model._meta.label}: its guard may read {field.name!r}, whose links "
                f"are rows of {through._meta.label}: readers gained or lost by writing those "
                "rows directly (not through the many-to-many manager) are not told.",
                hint=f"Change the links with {options.model.__name__}.{field.name}.add(), "
                ".remove() or .set(); or, if the guard does not read them, leave the field out "
                "of guard_fields.",
                obj=options.model,
                id="realtime.W033",
            )
        )
    return out


def _shared_links(options: ModelOptions) -> list[checks.CheckMessage]:
    """The links of a ``shared_via`` root kept in a ``through`` model of the application's
    own (``realtime.writes.shared_roots`` watches them through ``m2m_changed``)."""
    try:
        root = path_target(options.model, options.shared_via) if options.shared_via else None
    except ValueError:
        return []  # named by realtime.E032
    if root is None:
        return []
    out: list[checks.CheckMessage] = []
    for field in root._meta.local_many_to_many:
        through = field.remote_field.through
        if not isinstance(through, type) or through._meta.auto_created:
            continue
        out.append(
            checks.Warning(
                f"{options.model._meta.label}: the readers its root {root._meta.label} gives "
                f"outside a row's scope may come from {field.name!r}, whose links are rows of "
                f"{through._meta.label}: readers gained or lost by writing those rows directly "
                "(not through the many-to-many manager) are not told.",
                hint=f"Change the links with {root.__name__}.{field.name}.add(), .remove(), "
                ".set() or .clear().",
                obj=options.model,
                id="realtime.W033",
            )
        )
    return out


def _check_parents(options: ModelOptions) -> list[checks.CheckMessage]:
    """``realtime.W034``: a multi-table child decorated while a parent is not. The parent's
    own writes (its ``save()``, its querysets' ``update()``) change the child's rows in the
    parent's table, and no receiver of the child hears them."""
    model = options.model
    if model._meta.proxy:
        return []
    out: list[checks.CheckMessage] = []
    for parent in model._meta.get_parent_list():
        if parent._meta.abstract:
            continue
        parent_options = options_for(parent)
        if parent_options is not None:
            if parent_options.model is parent:  # decorated itself, not as a parent's child
                out.append(_both_decorated(options, parent_options))
            continue
        out.append(
            checks.Warning(
                f"{model._meta.label} is announced, but {parent._meta.label}, a table it "
                f"inherits, is not: writes through {parent._meta.object_name} (its save(), "
                "its querysets' update()) change its rows unannounced.",
                hint=f"Write through {model._meta.object_name} only, or decorate "
                f"{parent._meta.label} alone (a child without a decorator announces as its "
                "parent).",
                obj=model,
                id="realtime.W034",
            )
        )
    return out


def _both_decorated(child: ModelOptions, parent: ModelOptions) -> checks.CheckMessage:
    """``realtime.W044``: a multi-table child and its parent both decorated. Django sends a
    save's signals for the class saved alone, and an ``update()`` is its queryset's model's:
    each announces its own event, never the other's (deletes, whose signals Django sends
    for the parent's row too, announce both)."""
    model, base = child.model, parent.model
    return checks.Warning(
        f"{model._meta.label} and {base._meta.label}, a table it inherits, are both "
        f"decorated: a save() or update() through {model._meta.object_name} is announced "
        f"as {child.name} only, and one through {base._meta.object_name} as {parent.name} "
        f"only, so readers of {parent.name} do not hear rows written as "
        f"{model._meta.object_name}, and readers of {child.name} do not hear those rows "
        f"written as {base._meta.object_name} (deletes are announced as both).",
        hint=f"Decorate {base._meta.label} alone (an undecorated child announces as its "
        f"parent), or tell the other readers yourself (realtime.broadcast).",
        obj=model,
        id="realtime.W044",
    )


def _undecorated_memberships() -> list[type[Any]]:
    """The models holding the membership rows realtime watches, not decorated themselves:
    their bulk writes tell the accounts they link and unlink through their managers too
    (``apps.ready`` made those of Django's own ``Manager`` realtime's)."""
    found = [model for model in membership_models() if options_for(model) is None]
    return sorted(found, key=lambda model: model._meta.label)


def _check_managers(model: type[Any], links: bool = False) -> list[checks.CheckMessage]:
    """``realtime.W031``: a manager whose bulk writes realtime does not announce (``links``:
    of a membership model, whose bulk writes tell no account they link or unlink), with the
    one line that makes it announce them."""
    from realtime.writes.querysets import unextended

    return [_unextended(model, name, manager, links) for name, manager in unextended(model)]


def _unextended(model: type[Any], name: str, manager: Any, links: bool) -> checks.CheckMessage:
    label = f"{model._meta.label}.{name}"
    writes = "update(), bulk_create, bulk_update, QuerySet.delete()"
    if links:
        missed = (
            f"{label}: bulk writes of membership rows through this manager ({writes}) are not "
            "told to the accounts they link or unlink"
        )
        otherwise = "or write those rows one by one (save(), delete())"
    else:
        missed = f"{label}: bulk writes through this manager ({writes}) are not announced"
        otherwise = "or announce such writes with realtime.announce()"
    try:
        queryset_class: Any = type(manager.get_queryset())
    except Exception:
        queryset_class = None
    if queryset_class is None or not issubclass(queryset_class, models.QuerySet):
        return checks.Warning(
            f"{missed}: its get_queryset() returns no QuerySet.",
            hint="Return a realtime.RealtimeQuerySet (or a subclass) from get_queryset(), "
            f"{otherwise}.",
            obj=model,
            id="realtime.W031",
        )
    if name == "_base_manager":
        return checks.Warning(
            f"{missed} (Django moves rows between related managers, with add(), and reads "
            "related rows through it): the model's base manager is Django's own.",
            hint="Name an unfiltered manager whose queryset is a realtime.RealtimeQuerySet in "
            'the model\'s Meta: `base_manager_name = "objects"`.',
            obj=model,
            id="realtime.W031",
        )
    if queryset_class is models.QuerySet:
        mine, theirs = type(manager), "RealtimeManager"
        line = f"first among its bases: `class {mine.__name__}(RealtimeManager, ...)`"
    elif models.QuerySet in queryset_class.__bases__:
        # Django's own class among its bases: realtime's takes its place (beside it, no
        # order of the two is a consistent one).
        mine, theirs = queryset_class, "RealtimeQuerySet"
        bases = ", ".join(
            "RealtimeQuerySet" if base is models.QuerySet else base.__name__
            for base in queryset_class.__bases__
        )
        line = f"in place of Django's QuerySet among its bases: `class {mine.__name__}({bases})`"
    else:
        # Last: the queryset classes it extends run their methods first (a soft delete's
        # delete()), and realtime's see the arguments they hand Django's.
        mine, theirs = queryset_class, "RealtimeQuerySet"
        line = f"after the classes it extends: `class {mine.__name__}(..., RealtimeQuerySet)`"
    return checks.Warning(
        f"{missed}: its queryset is not a realtime.RealtimeQuerySet.",
        hint=f"Make {mine.__module__}.{mine.__qualname__} derive from realtime's class, "
        f"{line} (from realtime import {theirs}); {otherwise}.",
        obj=model,
        id="realtime.W031",
    )


def _check_one(options: ModelOptions) -> list[checks.CheckMessage]:
    model = options.model
    out: list[checks.CheckMessage] = []
    if options.user_field is not None:
        if options.guard is not None or options.shared_via is not None:
            out.append(_e(33, model, "user_field cannot be combined with guard or shared_via."))
        elif options.scope_field != "workspace":
            out.append(_e(33, model, "user_field cannot be combined with a scope_field."))
        account = account_model()
        if account is None:
            pass  # its paths cannot be judged: realtime.E027 says why
        elif not _reaches(model, options.user_field, account):
            out.append(
                _e(
                    31,
                    model,
                    f"user_field {options.user_field!r} does not lead to {account._meta.label}.",
                    'Write a path of relations ending on the account, e.g. "thread.members.user".',
                )
            )
        elif watch_of(options) is False:
            out.append(
                _w032(
                    model,
                    f"realtime cannot follow the links of user_field {options.user_field!r}: "
                    "accounts that gain or lose its rows without a write of the row itself "
                    "are not told.",
                )
            )
        elif not followed(options):
            out.append(
                _w032(
                    model,
                    f"realtime follows the membership rows of user_field "
                    f"{options.user_field!r} and the row's own foreign key, not the foreign "
                    "keys between them: accounts that gain or lose its rows when one of those "
                    "changes are not told.",
                )
            )
    elif options.is_global:
        if _is_scope_model(model):
            out.append(
                checks.Warning(
                    f"{model._meta.label} is REALTIME_SCOPE_MODEL, declared global "
                    "(scope_field=None): every signed-in account hears of every scope's "
                    "writes, its own or not.",
                    hint='Declare the scope model scoped by its own key: scope_field="id".',
                    obj=model,
                    id="realtime.W035",
                )
            )
        if options.shared_via is not None:
            out.append(
                _e(
                    38,
                    model,
                    "shared_via gives readers outside a row's scope, and a global model "
                    "(scope_field=None) has none: every signed-in account reads it already.",
                    "Remove shared_via, or give the model a scope_field.",
                )
            )
    else:
        out += _check_scope_field(options)
    if options.shared_via is not None and not _reaches(model, options.shared_via, None):
        out.append(
            _e(
                32,
                model,
                f"shared_via {options.shared_via!r} does not lead to a model.",
                'Name the relation path to the shared root, e.g. "project".',
            )
        )
    for fk_name in options.cascade:
        try:
            field = model._meta.get_field(fk_name)
        except FieldDoesNotExist:
            field = None
        if field is None or not is_foreign_key(field):
            out.append(_e(34, model, f"cascade names {fk_name!r}, which is not a foreign key."))
    for relation in options.relations:
        try:
            target = relation_target(options, relation)
            if target is None and not is_generic_fk(model, relation):
                raise FieldDoesNotExist(relation)
        except FieldDoesNotExist:
            out.append(
                _e(
                    37,
                    model,
                    f"relations names {relation!r}, which is not a relation of the model.",
                    "Name a foreign key, a many-to-many field, a generic foreign key or a "
                    "reverse relation (by its query name).",
                )
            )
            continue
        if target is not None and options_for(target) is None:
            out.append(
                checks.Warning(
                    f"relation {relation!r} of {model._meta.label} points at "
                    f"{target._meta.label}, which is not a @realtime_model.",
                    hint="Clients can still subscribe to its record channels; decorate it to "
                    "announce its own writes too.",
                    obj=model,
                    id="realtime.W030",
                )
            )
    return out


def _check_scope_field(options: ModelOptions) -> list[checks.CheckMessage]:
    model = options.model
    try:
        scope = scope_model()
    except (LookupError, ValueError):
        return []  # REALTIME_SCOPE_MODEL names no installed model: realtime.E003 says so
    if scope is None:
        return [
            _e(
                35,
                model,
                "announces to a scope, but REALTIME_SCOPE_MODEL is not set.",
                'Set REALTIME_SCOPE_MODEL = "app_label.Model", give the model a user_field, or '
                "declare it global with scope_field=None.",
            )
        ]
    label = scope._meta.label
    hint = (
        f"Give the model a ForeignKey to {label} and name it: "
        f'@realtime_model(scope_field="<its name>") ("workspace" by default); on {label} '
        'itself, scope_field="id"; or scope_field=None for a model every signed-in account '
        "reads (global)."
    )
    if options.scope_field in ("id", "pk"):
        if model is scope or issubclass(model, scope):
            return []
        message = f'scope_field "id" is only for the scope model itself ({label}).'
        return [_e(36, model, message, hint)]
    try:
        field = model._meta.get_field(options.scope_field or "")
    except FieldDoesNotExist:
        return [_e(36, model, f"has no scope field {options.scope_field!r}.", hint)]
    if not (is_foreign_key(field) and field.related_model is scope):
        message = f"scope_field {options.scope_field!r} is not a foreign key to {label}."
        return [_e(36, model, message, hint)]
    if not holds_target_pk(field):
        return [
            _e(
                39,
                model,
                f"scope_field {options.scope_field!r} is declared with to_field="
                f"{field.target_field.name!r}: it holds that column, where a scope is named "
                "by its primary key (its channel, its members, the socket's scope).",
                f"Point the foreign key at {scope._meta.label}'s primary key (remove to_field); "
                f"the row still reaches {field.target_field.name!r} through it.",
            )
        ]
    return []


def _reaches(model: Any, path: str, target: Any) -> bool:
    try:
        resolve_path(model, path)
        end = path_target(model, path)
    except (ValueError, FieldDoesNotExist):
        return False
    return end is not None if target is None else end is target


def _is_scope_model(model: Any) -> bool:
    try:
        return scope_model() is model
    except (LookupError, ValueError):  # a wrong setting: realtime.E003 says so
        return False


def _w032(model: Any, message: str) -> checks.Warning:
    return checks.Warning(
        f"{model._meta.label}: {message}",
        hint="Write the path as at most one foreign key of the row, then one many-to-many to "
        'the account or a reverse foreign key to membership rows and their account ("thread.'
        'members", "chat.seats.user"); or call realtime.broadcast.recheck_users() and tell the '
        "accounts yourself.",
        obj=model,
        id="realtime.W032",
    )


def _e(id_: int, model: Any, message: str, hint: str | None = None) -> checks.Error:
    return checks.Error(
        f"{model._meta.label}: {message}",
        hint=hint or "See the @realtime_model options in the documentation.",
        obj=model,
        id=f"realtime.E{id_:03d}",
    )
