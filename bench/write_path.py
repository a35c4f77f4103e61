"""Benchmark the write path: what ``@realtime_model`` adds to a create, a save and a delete.

Run from the project root, once per database::

    .venv/bin/python bench/write_path.py --database sqlite
    .venv/bin/python bench/write_path.py --database postgresql

The script uses the test settings (``tests.settings``), runs ``migrate`` itself, builds the rows
it needs (a workspace, accounts, memberships, a thread, a shared project...) under names
starting with ``bench-write-path`` and deletes them again at the end, with the rows its writes
published to ``firm_channel_messages`` (and no others: the table transport benchmark may be
using the same table). Run it against a database that holds nothing you want to keep, and on a
quiet machine: another process busy with the same cores or database server shows up in the
figures. SQLite uses its own file, ``/tmp/realtime-bench-write-path.sqlite3``; PostgreSQL uses
the ``realtime`` database.

``--durable`` runs the same writes with a durable table transport: each announcement made in
a transaction is also written to ``realtime_outbox`` there, and deleted after its relay.

``REALTIME_AUTO_TRIM`` is turned off for the run unless ``--auto-trim`` is given: trims run on
a thread of their own, and on SQLite a trim holding the write lock makes a transaction that
read before writing (deleting a ``Company`` reads its contacts first) fail at once with
"database is locked" under Django's default deferred transactions.

Two parts:

* **time** (``--skip-time`` to leave out): ``Company`` (decorated, ``fields=["name"]``) against
  ``Plain``, its undecorated twin with the same columns (workspace foreign key and name), in the
  same run, with the order of the models alternating from repeat to repeat. A third row,
  ``Company`` with every realtime receiver disconnected, shows what the table alone costs.
  Each write is timed three ways:

  - *one block per write*: each write in its own ``transaction.atomic()``, timed from entering
    the block to leaving it, so the commit and, for the decorated model, the ``on_commit``
    publication (one more transaction: an INSERT into ``firm_channel_messages``) are included;
  - *in the transaction only*: the same writes, timed from just before the ORM call to just
    after it, inside the block: the write and what the receivers prepare, without BEGIN, COMMIT
    or publication;
  - *one block of N writes*: the N writes in a single ``transaction.atomic()``, timed whole and
    divided by N: the publication happens once for the whole block (one INSERT of N messages).

  Between the saves and the deletes, the N rows are also read back in one query, outside a
  transaction and inside ``transaction.atomic()``, per row: what keeping track of what each
  row holds (the snapshot taken as Django builds each instance) costs a read.

  Each figure is the mean time per write over ``--writes`` writes; the repeat is done
  ``--repeat`` times and the median, minimum and maximum across the repeats are printed, with
  the ratio of the medians.

* **queries** (``--skip-queries`` to leave out): the statements of one write of each kind of
  model, captured with ``CaptureQueriesContext`` around a ``transaction.atomic()`` block, split
  into those sent before the block's COMMIT and those sent after it (the ``on_commit``
  publication and any audience query asked then). Each write is made twice and the second one
  counted, so that caches (content types, resolved paths) are warm. The same write is also
  counted with realtime's receivers disconnected: the difference is what realtime adds.
  ``--verbose`` prints the statements.

* **bulk** (``--skip-bulk`` to leave out): ``update()`` of 1, 100 and 10,000 rows,
  ``bulk_create`` and ``bulk_update`` of 1,000, of ``Company`` beside ``Plain`` in the same run,
  each in its own ``transaction.atomic()`` (commit and publication included), with the
  statements each sent; then a save of a guarded row (``PrivateNote``, 200 members) that writes
  no field its guard reads, with its ``guard_fields`` and with them taken away.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness import Spread, micros, times, watch_logs

if TYPE_CHECKING:
    from django.db import models

ROOT = Path(__file__).resolve().parent.parent
# A file of its own, apart from the test suite's and the other benchmarks'.
SQLITE_FILE = "/tmp/realtime-bench-write-path.sqlite3"  # noqa: S108
TABLE = "firm_channel_messages"
PREFIX = "bench-write-path"
OPERATIONS = ("create", "save", "delete")
WARM_UP = 50
# Audience sizes of the guarded delete: the first statement of the read check covers 200.
MEMBERS = (1, 10, 200, 1000)
SQL_WIDTH = 220

Write = Callable[[], object]


# --- Small helpers -------------------------------------------------------------------------


# --- Django ----------------------------------------------------------------------------------


def setup_django(database: str) -> None:
    """Point the test settings at ``database`` (before setup) and set Django up."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    os.environ["REALTIME_TEST_DATABASE"] = database
    os.environ["REALTIME_TEST_DATABASE_NAME"] = SQLITE_FILE if database == "sqlite" else "realtime"
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def migrate() -> None:
    from django.core.management import call_command

    call_command("migrate", database="default", interactive=False, verbosity=0)


class Published:
    """The rows this run adds to the message table, so that it can delete them (and no other).

    Another process may be using the table at the same time (the table transport benchmark
    shares the PostgreSQL database): this run deletes only rows above the highest id it saw at
    start, on the channels its writes publish to.
    """

    def __init__(self) -> None:
        from realtime.transports.table_store import MessageStore

        self.start = MessageStore().max_id()

    def delete(self, scope_ids: Sequence[Any]) -> int:
        from django.db import connection

        from realtime.messages import base_channel, scope_channel
        from realtime.transports.table_store import channel_hash, encode_channel

        channels = [base_channel(), *(scope_channel(scope_id) for scope_id in scope_ids)]
        hashes = [channel_hash(encode_channel(channel)) for channel in channels]
        placeholders = ", ".join(["%s"] * len(hashes))
        with connection.cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {TABLE} WHERE id > %s AND channel_hash IN ({placeholders})",
                [self.start, *hashes],
            )
            return int(cursor.rowcount)


def server_version() -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("SELECT sqlite_version()")
        else:
            cursor.execute("SELECT version()")
        row = cursor.fetchone()
    version = str(row[0]) if row else "?"
    return f"{connection.vendor} {version.split(' on ')[0]}"


@contextlib.contextmanager
def realtime_off() -> Iterator[None]:
    """Disconnect every announcing receiver for the duration of the block.

    Unregisters each decorated model (its save, delete and many-to-many receivers) and the
    receivers that announce database cascades, then restores both. What stays connected is
    what an application without any decorated model also has (the recheck receivers on
    accounts, the scope and memberships, which these writes do not touch).
    """
    from django.db.models.signals import post_delete, pre_delete

    from realtime import registry
    from realtime.writes import decorator, deletes

    saved = registry.all_options()
    parents = {
        parent
        for options in saved
        for fk_name in options.cascade
        if isinstance(parent := options.model._meta.get_field(fk_name).related_model, type)
    }
    for options in saved:
        decorator.unregister(options.model)
    for parent in parents:
        uid = f"realtime:cascade:{parent._meta.label}"
        pre_delete.disconnect(sender=parent, dispatch_uid=uid)
        post_delete.disconnect(sender=parent, dispatch_uid=uid)
    try:
        yield
    finally:
        for options in saved:
            decorator.register(options)
        deletes.connect_database_cascades()


@contextlib.contextmanager
def views_off() -> Iterator[None]:
    """Disconnect what reads the audience before an update (and the link watchers): writes
    then cost what they cost before realtime told readers who lose sight of a row."""
    from django.db.models.signals import m2m_changed, pre_save

    from realtime import registry
    from realtime.writes import memberships, receivers, shared_roots

    models_ = [options.model for options in registry.all_options()]
    for model in models_:
        pre_save.disconnect(sender=model, dispatch_uid=receivers.UID)
    for through in list(shared_roots._roots):
        m2m_changed.disconnect(sender=through, dispatch_uid=shared_roots.UID)
    watches = dict(memberships._watches)
    memberships._watches.clear()  # membership rows written now tell nobody
    try:
        yield
    finally:
        for model in models_:
            pre_save.connect(receivers.on_pre_save, sender=model, dispatch_uid=receivers.UID)
        shared_roots.connect()
        memberships._watches.update(watches)


def announced(on: bool) -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext() if on else realtime_off()


# --- Rows the writes need ------------------------------------------------------------------


@dataclass
class Fixture:
    """The rows every write refers to, built once per run."""

    workspace: Any
    users: list[Any]
    company: Any
    tags: list[Any]
    thread: Any
    project: Any
    shared: Any
    other_thread: Any
    other_project: Any
    #: A workspace per audience size of the guarded delete.
    audiences: dict[int, Any] = field(default_factory=dict)


def cleanup() -> list[Any]:
    """Delete the rows this script made (now, or in an earlier run); return their scope ids."""
    from django.contrib.auth import get_user_model

    from tests.testapp.models import Thread, Workspace

    workspaces = Workspace.objects.filter(slug__startswith=PREFIX)
    scope_ids = list(workspaces.values_list("pk", flat=True))
    with realtime_off():
        workspaces.delete()
        Thread.objects.filter(title__startswith=PREFIX).delete()
        get_user_model()._default_manager.filter(username__startswith=PREFIX).delete()
    return scope_ids


def build_fixture(member_counts: Sequence[int]) -> Fixture:
    """A workspace with three members, a second one sharing a project, a thread of three
    accounts, and one workspace per audience size (its first ``n`` accounts as members)."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.hashers import make_password

    from tests.testapp.models import Company, Membership, Project, Tag, Thread, Workspace

    user_model = get_user_model()
    count = max([6, *member_counts])
    # bulk_create sends no signal (no recheck announcement); unusable passwords hash nothing.
    user_model._default_manager.bulk_create(
        [
            user_model(username=f"{PREFIX}-{n:04d}", password=make_password(None))
            for n in range(count)
        ]
    )
    users = list(
        user_model._default_manager.filter(username__startswith=PREFIX).order_by("username")
    )
    workspace = Workspace.objects.create(name="Bench", slug=PREFIX)
    shared = Workspace.objects.create(name="Bench shared", slug=f"{PREFIX}-shared")
    memberships = [Membership(workspace=workspace, user=user) for user in users[:3]]
    memberships += [Membership(workspace=shared, user=user) for user in users[3:6]]
    audiences: dict[int, Any] = {}
    for size in member_counts:
        audience = Workspace.objects.create(name=f"{size} members", slug=f"{PREFIX}-{size}")
        memberships += [Membership(workspace=audience, user=user) for user in users[:size]]
        audiences[size] = audience
    Membership.objects.bulk_create(memberships)
    thread = Thread.objects.create(title=f"{PREFIX} thread")
    thread.members.set(users[:3])
    other_thread = Thread.objects.create(title=f"{PREFIX} other thread")
    other_thread.members.set(users[1:4])
    project = Project.objects.create(workspace=workspace, name="Shared project")
    project.shared_with.add(shared)
    other_project = Project.objects.create(workspace=workspace, name="Unshared project")
    return Fixture(
        workspace=workspace,
        users=users,
        company=Company.objects.create(workspace=workspace, name="Acme"),
        tags=[Tag.objects.create(workspace=workspace, name=f"tag {n}") for n in range(3)],
        thread=thread,
        project=project,
        shared=shared,
        other_thread=other_thread,
        other_project=other_project,
        audiences=audiences,
    )


# --- Part 1: time ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """A model timed in one state: announced (decorated, receivers on) or not."""

    label: str
    short: str
    model: type[models.Model]
    on: bool
    #: Labels of the variants this one is compared with.
    versus: tuple[str, ...] = ()


@dataclass
class Timings:
    """Seconds per write, one value per repeat, keyed by ``(way, variant, operation)``."""

    values: dict[tuple[str, str, str], list[float]] = field(default_factory=dict)

    def add(self, way: str, variant: str, operation: str, value: float) -> None:
        self.values.setdefault((way, variant, operation), []).append(value)

    def get(self, way: str, variant: str, operation: str) -> list[float]:
        return self.values[(way, variant, operation)]


WAYS = {
    "block": "one atomic() block per write, commit and publication included",
    "inside": "in the transaction only: the ORM call inside the block (no COMMIT, no publication)",
    "batch": "one atomic() block of N writes, per write (publication once per block)",
    "read": "reading the N rows in one query, per row, outside a transaction",
    "read_atomic": "reading the N rows in one query, per row, inside atomic()",
}
#: What each way times: reads build instances (where realtime keeps what a row holds).
WAY_OPERATIONS = {
    "block": OPERATIONS,
    "inside": OPERATIONS,
    "batch": OPERATIONS,
    "read": ("load",),
    "read_atomic": ("load",),
}


def block_per_write(writes: Sequence[Write]) -> tuple[float, float]:
    """Run each write in its own ``atomic()``; mean seconds per write, whole block and inside."""
    clock = time.perf_counter
    whole = inside = 0.0
    gc.collect()
    for write in writes:
        start = clock()
        with transaction_atomic():
            begin = clock()
            write()
            inside += clock() - begin
        whole += clock() - start
    return whole / len(writes), inside / len(writes)


def one_block(writes: Sequence[Write]) -> float:
    """Run every write in one ``atomic()``; mean seconds per write, commit included."""
    gc.collect()
    start = time.perf_counter()
    with transaction_atomic():
        for write in writes:
            write()
    return (time.perf_counter() - start) / len(writes)


def read(model: type[models.Model], pks: Sequence[Any], atomic: bool) -> float:
    """Load the rows ``pks`` in one query; mean seconds per row."""
    gc.collect()
    block = transaction_atomic() if atomic else contextlib.nullcontext()
    start = time.perf_counter()
    with block:
        loaded = list(model._default_manager.filter(pk__in=pks))
    elapsed = time.perf_counter() - start
    del loaded
    return elapsed / len(pks)


def transaction_atomic() -> contextlib.AbstractContextManager[Any]:
    from django.db import transaction

    return transaction.atomic()


def creates(model: type[models.Model], workspace: Any, count: int, rows: list[Any]) -> list[Write]:
    manager = model._default_manager

    def create(n: int) -> Write:
        return lambda: rows.append(manager.create(workspace=workspace, name=f"row {n}"))

    return [create(n) for n in range(count)]


def saves(rows: Sequence[Any]) -> list[Write]:
    def save(row: Any, n: int) -> Write:
        def write() -> None:
            row.name = f"saved {n}"
            row.save()

        return write

    return [save(row, n) for n, row in enumerate(rows)]


def deletes(rows: Sequence[Any]) -> list[Write]:
    return [row.delete for row in rows]


def time_repeat(variants: Sequence[Variant], workspace: Any, count: int, timings: Timings) -> None:
    """One repeat: every variant creates, saves and deletes ``count`` rows, both ways."""
    for batched in (False, True):
        rows: dict[str, list[Any]] = {variant.label: [] for variant in variants}
        for operation in OPERATIONS:
            for variant in variants:
                mine = rows[variant.label]
                if operation == "delete" and not batched:
                    pks = [row.pk for row in mine]
                    with announced(variant.on):
                        timings.add("read", variant.label, "load", read(variant.model, pks, False))
                        timings.add(
                            "read_atomic", variant.label, "load", read(variant.model, pks, True)
                        )
                if operation == "create":
                    writes = creates(variant.model, workspace, count, mine)
                elif operation == "save":
                    writes = saves(mine)
                else:
                    writes = deletes(list(mine))
                with announced(variant.on):
                    if batched:
                        timings.add("batch", variant.label, operation, one_block(writes))
                    else:
                        whole, inside = block_per_write(writes)
                        timings.add("block", variant.label, operation, whole)
                        timings.add("inside", variant.label, operation, inside)


def measure_time(workspace: Any, count: int, repeat: int) -> tuple[list[Variant], Timings]:
    from tests.testapp.models import Company, Plain

    plain, company, off = "Plain (undecorated)", "Company (decorated)", "Company, realtime off"
    variants = [
        Variant(plain, "Plain", Plain, True),
        Variant(company, "Company", Company, True, (plain, off)),
        Variant(off, "off", Company, False, (plain,)),
    ]
    # Warm up: connections, statement caches, the transport and its first publication.
    time_repeat(variants, workspace, min(count, WARM_UP), Timings())
    timings = Timings()
    for index in range(repeat):
        order = variants if index % 2 == 0 else variants[::-1]
        time_repeat(order, workspace, count, timings)
        line = ", ".join(
            f"{op} {micros(timings.get('block', plain, op)[-1])} / "
            f"{micros(timings.get('block', company, op)[-1])}"
            for op in OPERATIONS
        )
        print(f"  repeat {index + 1}/{repeat} (one block per write, Plain / Company): {line}")
    return variants, timings


def report_time(variants: Sequence[Variant], timings: Timings, count: int) -> dict[str, Any]:
    repeats = len(timings.get("block", variants[0].label, "create"))
    print(
        f"\nwrite cost, time per write: median [min - max] over {repeats} repeats of {count} "
        "writes;\nratio = median / median of the row named (in brackets: min - max of the "
        "same ratio taken repeat by repeat)"
    )
    summary: dict[str, Any] = {}
    for way, title in WAYS.items():
        print(
            f"  {title.replace('N writes', f'{count} writes').replace('N rows', f'{count} rows')}"
        )
        for operation in WAY_OPERATIONS[way]:
            print(f"    {operation}")
            for variant in variants:
                values = timings.get(way, variant.label, operation)
                spread = Spread.of(values)
                entry: dict[str, Any] = {"seconds": asdict(spread)}
                text = f"      {variant.label:<24} {spread.show(micros):<34}"
                for other in variant.versus:
                    floor = timings.get(way, other, operation)
                    ratio = spread.median / statistics.median(floor)
                    per_repeat = Spread.of([v / f for v, f in zip(values, floor, strict=True)])
                    name = next(v.short for v in variants if v.label == other)
                    text += f" {times(ratio)} {name} [{times(per_repeat.low)} - "
                    text += f"{times(per_repeat.high)}]"
                    entry[f"ratio_to {other}"] = {
                        "of_medians": ratio,
                        "per_repeat": asdict(per_repeat),
                    }
                print(text.rstrip())
                summary.setdefault(way, {}).setdefault(operation, {})[variant.label] = entry
    return summary


# --- Part 2: queries -------------------------------------------------------------------------


@dataclass
class Statement:
    sql: str

    @property
    def kind(self) -> str:
        text = self.sql.lstrip().upper()
        if text.startswith(("SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK TO SAVEPOINT")):
            return "savepoint"
        if text in ("BEGIN", "BEGIN IMMEDIATE", "COMMIT", "ROLLBACK"):
            return "transaction"
        return "query"


@dataclass
class Capture:
    """The statements of one write: before its block's COMMIT, and after it."""

    inside: list[Statement]
    after: list[Statement]

    def count(self, phase: str, kind: str = "query") -> int:
        statements = self.inside if phase == "inside" else self.after
        return sum(1 for statement in statements if statement.kind == kind)


@dataclass(frozen=True)
class Scenario:
    """One write: ``prepare`` builds what it needs (not counted) and returns the write."""

    label: str
    prepare: Callable[[], Write]


def capture(prepare: Callable[[], Write]) -> Capture:
    """Count the statements of one write in ``atomic()``, then of its commit hooks."""
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    prepare()()  # the same write once first: caches warm
    write = prepare()
    with CaptureQueriesContext(connection) as captured, transaction.atomic():
        write()
        end = len(captured.captured_queries)
    statements = [Statement(q["sql"]) for q in captured.captured_queries]
    if (
        not statements
        or not statements[0].sql.startswith("BEGIN")
        or statements[end].sql != "COMMIT"
    ):
        raise RuntimeError("the captured statements do not start with BEGIN or lack the COMMIT")
    return Capture(inside=statements[1:end], after=statements[end + 1 :])


def scenarios(fixture: Fixture, members: Sequence[int]) -> list[Scenario]:
    from django.contrib.contenttypes.models import ContentType

    from tests.testapp.models import (
        Attachment,
        Comment,
        Company,
        Contact,
        Message,
        Notification,
        Plain,
        PrivateNote,
        Task,
    )

    ws = fixture.workspace
    user = fixture.users[0]
    contact_type = ContentType.objects.get_for_model(Contact)

    def kinds(
        label: str,
        creator: Callable[[], Callable[[], Any]],
        change: Callable[[Any], None],
        existing: Callable[[], Any] | None = None,
    ) -> list[Scenario]:
        """Create, save (of a row loaded from the database) and delete of one model.

        ``creator()`` builds what a create needs and returns the create itself; ``existing()``
        makes the row a save or a delete starts from (default: one such create).
        """

        def made() -> Any:
            return existing() if existing is not None else creator()()

        def save() -> Write:
            row = made()
            loaded = type(row)._default_manager.get(pk=row.pk)

            def write() -> None:
                change(loaded)
                loaded.save()

            return write

        def delete() -> Write:
            row = made()
            return type(row)._default_manager.get(pk=row.pk).delete  # type: ignore[no-any-return]

        return [
            Scenario(f"{label}: create", creator),
            Scenario(f"{label}: save", save),
            Scenario(f"{label}: delete", delete),
        ]

    def rename(row: Any) -> None:
        row.name = f"{row.name}!"

    def retext(row: Any) -> None:
        row.text = f"{row.text}!"

    def retitle(row: Any) -> None:
        row.title = f"{row.title}!"

    def contact() -> Any:
        return Contact.objects.create(workspace=ws, company=fixture.company, name="Ann")

    def tagged_contact() -> Any:
        row = contact()
        row.tags.set(fixture.tags)
        return row

    def comment() -> Callable[[], Any]:
        target = contact()
        return lambda: Comment.objects.create(
            workspace=ws, text="x", target_type=contact_type, target_id=target.pk
        )

    def contact_with_attachments() -> Write:
        row = tagged_contact()
        for n in range(3):
            Attachment.objects.create(workspace=ws, contact=row, name=f"file {n}")
        return Contact.objects.get(pk=row.pk).delete

    def tag_added() -> Write:
        row = Contact.objects.get(pk=contact().pk)
        return lambda: row.tags.add(fixture.tags[0])

    def guarded_delete(size: int) -> Callable[[], Write]:
        def prepare() -> Write:
            note = PrivateNote.objects.create(
                workspace=fixture.audiences[size], author=user, title="Secret"
            )
            return PrivateNote.objects.get(pk=note.pk).delete

        return prepare

    def moved_company() -> Write:
        row = Company.objects.get(pk=Company.objects.create(workspace=ws, name="x").pk)

        def write() -> None:
            row.workspace = fixture.shared
            row.save()

        return write

    def handed_notification() -> Write:
        row = Notification.objects.get(pk=Notification.objects.create(user=user, text="x").pk)

        def write() -> None:
            row.user = fixture.users[1]
            row.save()

        return write

    def moved_message() -> Write:
        row = Message.objects.get(pk=Message.objects.create(thread=fixture.thread, text="x").pk)

        def write() -> None:
            row.thread = fixture.other_thread
            row.save()

        return write

    def given_note() -> Write:
        note = PrivateNote.objects.create(workspace=ws, author=user, title="x")
        row = PrivateNote.objects.get(pk=note.pk)

        def write() -> None:
            row.author = fixture.users[1]
            row.save()

        return write

    def rerooted_task() -> Write:
        task = Task.objects.create(workspace=ws, project=fixture.project, title="x")
        row = Task.objects.get(pk=task.pk)

        def write() -> None:
            row.project = fixture.other_project
            row.save()

        return write

    return [
        *kinds(
            "Plain, undecorated",
            lambda: lambda: Plain.objects.create(workspace=ws, name="x"),
            rename,
        ),
        *kinds(
            "Company, scoped",
            lambda: lambda: Company.objects.create(workspace=ws, name="x"),
            rename,
        ),
        *kinds("Contact, FK + to-many tags (3 tags)", lambda: contact, rename, tagged_contact),
        Scenario("Contact: delete with 3 attachments (database cascade)", contact_with_attachments),
        Scenario("Contact: tags.add(one tag) (m2m add)", tag_added),
        *kinds("Comment, generic relation", comment, retext),
        *kinds(
            "Notification, account (one hop)",
            lambda: lambda: Notification.objects.create(user=user, text="x"),
            retext,
        ),
        *kinds(
            "Message, account (thread.members, 3)",
            lambda: lambda: Message.objects.create(thread=fixture.thread, text="x"),
            retext,
        ),
        *kinds(
            "PrivateNote, guarded",
            lambda: lambda: PrivateNote.objects.create(workspace=ws, author=user, title="x"),
            retitle,
        )[:2],
        *(
            Scenario(f"PrivateNote, guarded: delete, {size} members", guarded_delete(size))
            for size in members
        ),
        *kinds(
            "Task, shared via project (1 workspace, 3 members)",
            lambda: lambda: Task.objects.create(workspace=ws, project=fixture.project, title="x"),
            retitle,
        ),
        Scenario("Company, scoped: moved to another workspace", moved_company),
        Scenario("PrivateNote, guarded: given to another author", given_note),
        Scenario("Notification, account: handed to another account", handed_notification),
        Scenario("Message, account: moved to another thread", moved_message),
        Scenario("Task, shared: moved to another project", rerooted_task),
    ]


@dataclass
class Counted:
    label: str
    on: Capture
    #: With realtime on but without the audience-before reads (what an update cost before).
    views_off: Capture
    off: Capture


def measure_queries(fixture: Fixture, members: Sequence[int]) -> list[Counted]:
    results = []
    for scenario in scenarios(fixture, members):
        on = capture(scenario.prepare)
        with views_off():
            without_views = capture(scenario.prepare)
        with realtime_off():
            off = capture(scenario.prepare)
        results.append(Counted(scenario.label, on, without_views, off))
    return results


def show_sql(sql: str) -> str:
    sql = " ".join(sql.split())
    if len(sql) <= SQL_WIDTH:
        return sql
    return f"{sql[:SQL_WIDTH]}... ({len(sql):,} characters)"


def report_queries(results: Sequence[Counted], verbose: bool) -> list[dict[str, Any]]:
    print(
        "\nqueries per write in transaction.atomic(), counted on the second of two identical writes"
        "\n  on / off / added: queries before the block's COMMIT with realtime, with its receivers"
        "\n    disconnected, and the difference (BEGIN, COMMIT and savepoint statements left out)"
        "\n  views: what reading the audience before an update adds to that (on minus the same"
        "\n    write with those reads disconnected, measured in this run)"
        "\n  savepoints: SAVEPOINT and RELEASE statements realtime sent before the COMMIT"
        "\n  at commit: queries after the COMMIT (on_commit publication, audience queries asked"
        "\n    then), the publication's own BEGIN and COMMIT left out"
    )
    print(
        f"  {'write':<58} {'on':>3} {'off':>4} {'added':>6} {'views':>6} "
        f"{'savepoints':>11} {'at commit':>10}"
    )
    summary = []
    for result in results:
        inside_on, inside_off = result.on.count("inside"), result.off.count("inside")
        views = inside_on - result.views_off.count("inside")
        after_views = result.on.count("after") - result.views_off.count("after")
        savepoints = result.on.count("inside", "savepoint")
        after = result.on.count("after")
        after_off = result.off.count("after")
        print(
            f"  {result.label:<58} {inside_on:>3} {inside_off:>4} {inside_on - inside_off:>+6} "
            f"{views:>+6} {savepoints:>11} {after:>10}"
            + (f" (views {after_views:+d})" if after_views else "")
            + (f" (off: {after_off})" if after_off else "")
        )
        summary.append(
            {
                "write": result.label,
                "in_transaction": inside_on,
                "in_transaction_realtime_off": inside_off,
                "in_transaction_added_by_views": views,
                "at_commit_added_by_views": after_views,
                "savepoint_statements": savepoints,
                "at_commit": after,
                "at_commit_realtime_off": after_off,
                "statements": [
                    {"phase": phase, "kind": s.kind, "sql": s.sql}
                    for phase, group in (("in", result.on.inside), ("at", result.on.after))
                    for s in group
                ],
            }
        )
        if verbose:
            for state, counted in (("on", result.on), ("off", result.off)):
                for phase, group in (("in tx", counted.inside), ("commit", counted.after)):
                    for statement in group:
                        print(f"      {state:>3} [{phase:>6}] {show_sql(statement.sql)}")
    return summary


# --- Part 3: bulk writes and guards -------------------------------------------------------------

#: Rows of the update() timings, and of the bulk_create and bulk_update ones.
UPDATE_SIZES = (1, 100, 10_000)
BULK_SIZE = 1000


def timed_block(write: Write) -> float:
    """Seconds for ``write`` in its own ``atomic()``, commit and publication included."""
    gc.collect()
    start = time.perf_counter()
    with transaction_atomic():
        write()
    return time.perf_counter() - start


def measure_bulk(fixture: Fixture, repeat: int) -> dict[str, Any]:
    """``update()`` of 1, 100 and 10,000 rows, ``bulk_create`` and ``bulk_update`` of 1,000,
    each of ``Company`` (decorated) beside ``Plain`` (its undecorated twin), in the same run;
    the statements each sends; and a guarded save with and without ``guard_fields``."""
    from django.db import connection
    from django.db.models import F
    from django.test.utils import CaptureQueriesContext

    from realtime import silent
    from tests.testapp.models import Company, Plain

    workspace = fixture.workspace
    results: dict[str, Any] = {}
    print("\nbulk writes, one atomic() block each, commit and publication included;")
    print("  median [min - max] over the repeats, and the statements each sent")
    print(f"  {'write':<34} {'Plain':>24} {'Company':>24} {'ratio':>7} {'statements':>12}")

    def row(label: str, run: Callable[[type[models.Model]], Write]) -> None:
        seconds: dict[str, list[float]] = {"Plain": [], "Company": []}
        statements: dict[str, int] = {}
        for index in range(repeat + 1):  # the first is a warm-up
            for model in (Plain, Company) if index % 2 else (Company, Plain):
                write = run(model)
                with CaptureQueriesContext(connection) as captured:
                    elapsed = timed_block(write)
                if index:
                    seconds[model.__name__].append(elapsed)
                statements[model.__name__] = len(captured.captured_queries)
                with silent():
                    made = model._default_manager.filter(workspace=workspace)
                    made.filter(name__startswith="bulk").delete()
        plain, company = Spread.of(seconds["Plain"]), Spread.of(seconds["Company"])
        ratio = company.median / plain.median
        print(
            f"  {label:<34} {plain.median * 1e3:>9.2f} ms [{plain.low * 1e3:.2f}-"
            f"{plain.high * 1e3:.2f}] {company.median * 1e3:>9.2f} ms [{company.low * 1e3:.2f}-"
            f"{company.high * 1e3:.2f}] {ratio:>6.2f}x {statements['Plain']:>5} / "
            f"{statements['Company']:<5}",
            flush=True,
        )
        results[label] = {
            "plain_seconds": asdict(plain),
            "company_seconds": asdict(company),
            "ratio": ratio,
            "statements": statements,
        }

    def rows_of(model: type[models.Model], count: int) -> list[Any]:
        with silent():
            return model._default_manager.bulk_create(
                [model(workspace=workspace, name=f"bulk {n}") for n in range(count)]
            )

    for size in UPDATE_SIZES:

        def update(model: type[models.Model], size: int = size) -> Write:
            rows_of(model, size)
            matching = model._default_manager.filter(workspace=workspace, name__startswith="bulk")
            return lambda: matching.update(name=F("name"))

        row(f"update() of {size:,} rows", update)

    def create(model: type[models.Model]) -> Write:
        made = [model(workspace=workspace, name=f"bulk {n}") for n in range(BULK_SIZE)]
        return lambda: model._default_manager.bulk_create(made)

    row(f"bulk_create of {BULK_SIZE:,}", create)

    def bulk_update(model: type[models.Model]) -> Write:
        made: list[Any] = list(
            model._default_manager.filter(pk__in=[r.pk for r in rows_of(model, BULK_SIZE)])
        )
        for n, item in enumerate(made):
            item.name = f"bulk changed {n}"  # read, so the snapshot knows what changed
        return lambda: model._default_manager.bulk_update(made, ["name"], batch_size=BULK_SIZE)

    row(f"bulk_update of {BULK_SIZE:,}", bulk_update)
    results["guarded_save"] = measure_guarded_save(fixture, repeat)
    return results


def measure_guarded_save(fixture: Fixture, repeat: int) -> dict[str, Any]:
    """A save of a guarded row that writes no field its guard reads, in a workspace of 200
    members: with ``guard_fields`` (the readers before are not taken) and without (taken)."""
    import dataclasses

    from realtime import registry
    from realtime.writes import decorator
    from tests.testapp.models import PrivateNote

    declared = registry.options_for(PrivateNote)
    assert declared is not None
    workspace = fixture.audiences.get(200) or fixture.workspace
    author = fixture.users[0]
    notes = [
        PrivateNote.objects.create(workspace=workspace, author=author, title=f"n{n}", public=True)
        for n in range(100)
    ]
    print(f"\na guarded save (title only) in a workspace of {workspace.members.count()} members,")
    print("  one atomic() block per save, per save: median [min - max] over the repeats")
    found: dict[str, Any] = {}
    for label, options in (
        ("with guard_fields", declared),
        ("without guard_fields", dataclasses.replace(declared, guard_fields=None)),
    ):
        decorator.unregister(PrivateNote)
        decorator.register(options)
        try:
            per_save = []
            for index in range(repeat + 1):
                writes = saves_of(notes, index)
                whole, _ = block_per_write(writes)
                if index:
                    per_save.append(whole)
        finally:
            decorator.unregister(PrivateNote)
            decorator.register(declared)
        spread = Spread.of(per_save)
        low, high = micros(spread.low), micros(spread.high)
        print(f"  {label:<22} {micros(spread.median)} [{low} - {high}]")
        found[label] = asdict(spread)
    for note in notes:
        note.delete()
    return found


def saves_of(notes: Sequence[Any], index: int) -> list[Write]:
    def save(note: Any, n: int) -> Write:
        def write() -> None:
            note.title = f"title {index} {n}"
            note.save()

        return write

    return [save(note, n) for n, note in enumerate(notes)]


# --- Main -------------------------------------------------------------------------------------


# --- The cost table of transparent.md: each operation against the undecorated twin ------------

#: (operation, goal as a ratio to the twin), as docs/benchmarks.md shows.
GOALS = (
    ("load 20,000 rows (list(qs))", 1.15),
    ("save() 500 rows in one transaction", 1.3),
    ("update() of 1 row, end to end incl. publish", 2.0),
    ("bulk_create(1,000) in autocommit", 2.0),
    ("bulk_create(1,000) in atomic()", 2.0),
)
LOAD_ROWS = 20_000
SAVE_ROWS = 500
UPDATES = 200
BULK_ROWS = 1_000
DELETE_ROWS = 2_000


def measure_goals(workspace: Any, repeat: int) -> dict[str, Any]:
    """Time each operation of the cost table on ``Twin`` (decorated) and ``Plain`` (the same
    model undecorated) in turn, ``repeat`` times, alternating which goes first; count the
    statements of a 2,000-row ``QuerySet.delete()``."""
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    from tests.testapp.models import Plain, Twin

    models_: dict[str, Any] = {"Twin": Twin, "Plain": Plain}
    timed: dict[str, dict[str, list[float]]] = {op: {"Twin": [], "Plain": []} for op, _ in GOALS}

    def clear(model: Any) -> None:
        with realtime_off():
            model._default_manager.filter(workspace=workspace).delete()

    for round_ in range(repeat):
        order = ["Twin", "Plain"] if round_ % 2 == 0 else ["Plain", "Twin"]
        for name in order:
            model = models_[name]
            manager = model._default_manager
            clear(model)
            manager.bulk_create(
                [model(workspace=workspace, name=f"load {n}") for n in range(LOAD_ROWS)]
            )
            gc.collect()
            start = time.perf_counter()
            loaded = list(manager.filter(workspace=workspace))
            timed[GOALS[0][0]][name].append(time.perf_counter() - start)
            saved = loaded[:SAVE_ROWS]
            del loaded
            gc.collect()
            start = time.perf_counter()
            with transaction.atomic():
                for n, row in enumerate(saved):
                    row.name = f"saved {round_} {n}"
                    row.save()
            timed[GOALS[1][0]][name].append(time.perf_counter() - start)
            pk = saved[0].pk
            gc.collect()
            start = time.perf_counter()
            for n in range(UPDATES):
                manager.filter(pk=pk).update(name=f"updated {round_} {n}")
            timed[GOALS[2][0]][name].append((time.perf_counter() - start) / UPDATES)
            for goal, atomic in ((GOALS[3][0], False), (GOALS[4][0], True)):
                clear(model)
                made = [model(workspace=workspace, name=f"bulk {n}") for n in range(BULK_ROWS)]
                gc.collect()
                block = transaction.atomic() if atomic else contextlib.nullcontext()
                start = time.perf_counter()
                with block:
                    manager.bulk_create(made)
                timed[goal][name].append(time.perf_counter() - start)
    counted: dict[str, int] = {}
    publishing = 0
    for name, model in models_.items():
        clear(model)
        model._default_manager.bulk_create(
            [model(workspace=workspace, name=f"delete {n}") for n in range(DELETE_ROWS)]
        )
        # In a transaction, to tell the delete's statements from the publish after commit.
        with CaptureQueriesContext(connection) as queries, transaction.atomic():
            model._default_manager.filter(workspace=workspace).delete()
            counted[name] = len(queries.captured_queries)
        if name == "Twin":
            publishing = len(queries.captured_queries) - counted[name]
    print(
        f"\nthe cost table: Twin (decorated) against Plain (the same model undecorated), {repeat} "
        "rounds, median [min - max]"
    )
    summary: dict[str, Any] = {}
    for operation, aim in GOALS:
        decorated = Spread.of(timed[operation]["Twin"])
        plain = Spread.of(timed[operation]["Plain"])
        ratio = decorated.median / plain.median
        print(
            f"  {operation:<46} {decorated.show(micros)} / {plain.show(micros)} = "
            f"{ratio:.2f}x (goal <= {aim:.2f}x)"
        )
        summary[operation] = {"twin": asdict(decorated), "plain": asdict(plain), "ratio": ratio}
    print(
        f"  QuerySet.delete() of {DELETE_ROWS:,} rows, statements: {counted['Twin']} "
        f"(plain: {counted['Plain']}; goal <= 4), then {publishing} publishing its "
        "announcements after the commit"
    )
    summary["delete_statements"] = counted
    summary["delete_publish_statements"] = publishing
    clear(Twin)
    clear(Plain)
    return summary


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--database", choices=["sqlite", "postgresql"], required=True)
    parser.add_argument("--repeat", type=int, default=5, help="repeats of each timing")
    parser.add_argument("--writes", type=int, default=400, help="writes per timing and repeat")
    parser.add_argument(
        "--members",
        type=int,
        nargs="+",
        default=list(MEMBERS),
        help="workspace sizes for the guarded delete",
    )
    parser.add_argument(
        "--auto-trim",
        action="store_true",
        help="keep REALTIME_AUTO_TRIM as configured (default: off for the run, see the docs)",
    )
    parser.add_argument(
        "--durable",
        action="store_true",
        help="a durable table transport (tests.durable_transport): each announcement also "
        "written to realtime_outbox in its transaction, and deleted after its relay",
    )
    parser.add_argument("--skip-time", action="store_true")
    parser.add_argument("--skip-queries", action="store_true")
    parser.add_argument("--skip-bulk", action="store_true")
    parser.add_argument("--skip-goals", action="store_true", help="leave out the cost table")
    parser.add_argument("--verbose", action="store_true", help="print each counted statement")
    parser.add_argument("--json", type=Path, help="also write the summary to this file")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.writes < 1:
        parser.error("--repeat and --writes must be at least 1")
    return args


def main() -> None:
    args = parse_args()
    setup_django(args.database)

    from django.conf import settings

    from realtime.conf import conf

    if not args.auto_trim:
        # Before the transport is built: trims run on a thread of their own (see the docs).
        settings.REALTIME_AUTO_TRIM = False
    if args.durable:
        settings.REALTIME_TRANSPORT = "tests.durable_transport.DurableTableTransport"
    from realtime.transports import get_transport

    counter = watch_logs()
    migrate()
    started = time.monotonic()
    version = server_version()
    print(f"write path benchmark on {version}")
    print(
        f"machine: {os.cpu_count()} cores, {platform.machine()}, Python "
        f"{platform.python_version()}; the database server shares these cores"
    )
    print(
        f"settings: transport {conf.TRANSPORT!r}, auto_trim {conf.AUTO_TRIM} (batch "
        f"{conf.TRIM_BATCH_SIZE}), repeat {args.repeat}, {args.writes} writes per timing",
        flush=True,
    )
    summary: dict[str, Any] = {"database": version, "cores": os.cpu_count()}
    cleanup()
    published = Published()
    try:
        fixture = build_fixture(args.members)
        if not args.skip_goals:
            summary["goals"] = measure_goals(fixture.workspace, args.repeat)
        if not args.skip_time:
            print("\ntiming Plain, Company and Company with realtime off", flush=True)
            variants, timings = measure_time(fixture.workspace, args.writes, args.repeat)
            summary["time"] = report_time(variants, timings, args.writes)
        if not args.skip_queries:
            results = measure_queries(fixture, args.members)
            summary["queries"] = report_queries(results, args.verbose)
        if not args.skip_bulk:
            summary["bulk"] = measure_bulk(fixture, args.repeat)
    finally:
        scope_ids = cleanup()
        get_transport().close()
        removed = published.delete(scope_ids)
        print(f"\ndeleted the {removed:,} rows this run added to {TABLE}")
    print(f"\nrealtime log warnings/errors: {counter.count}")
    for line in counter.first:
        print(f"  {line}")
    print(f"took {time.monotonic() - started:.0f} s")
    summary["log_warnings"] = counter.count
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
