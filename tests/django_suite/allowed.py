"""The statements decorating a model may change in Django's tests, each with its count.

Each entry names one test of Django's suite (Django 6.1) that counts or shows the statements
of a write differently once its models are decorated, and the rule of ``docs/limits.md``
("Statements realtime adds to a write") that explains it. ``run.py`` fails when a listed test
counts otherwise — and when it no longer differs, so that the list stays true.

* ``Count``: an ``assertNumQueries`` that counts ``plain`` statements without realtime and
  ``decorated`` with it (on PostgreSQL, ``postgresql`` when it differs: realtime's reads run in
  a savepoint there).
* ``Shows``: a test that looks at one statement, which is realtime's or which realtime
  changed, or at whether Django may delete without collecting; its failure must show
  ``shows`` (on PostgreSQL, ``postgresql`` when it differs). ``only``: the one database where
  the test differs; on the others it must pass.
"""

from __future__ import annotations

from typing import NamedTuple


class Count(NamedTuple):
    plain: int
    decorated: int
    why: str
    postgresql: int | None = None


class Shows(NamedTuple):
    shows: str
    why: str
    postgresql: str | None = None
    only: str | None = None


Allowed = Count | Shows

#: The rules of docs/limits.md, by the words of its table.
AUTOCOMMIT = "any write in autocommit: its announcement, published at once after it"
UNLINKED = "a delete of a row whose decorated children it sets to NULL or to their default"
ADD = "add() of a many-to-many realtime listens to: Django reads the links that exist first"
COLLECTED = "Model.delete() of a model with receivers: its related rows are read whole"
RETURNING = "QuerySet.update(): its UPDATE returns the rows it changed (RETURNING)"

ALLOWED: dict[str, Allowed] = {
    "bulk_create.tests.BulkCreateTransactionTests.test_multiple_batches": Count(4, 5, AUTOCOMMIT),
    "bulk_create.tests.BulkCreateTransactionTests.test_no_unnecessary_transaction": Count(
        1, 2, AUTOCOMMIT
    ),
    "bulk_create.tests.BulkCreateTransactionTests.test_objs_with_and_without_pk": Count(
        4, 5, AUTOCOMMIT
    ),
    "delete.tests.DeletionTests.test_db_cascade": Count(1, 4, UNLINKED, postgresql=6),
    "delete.tests.DeletionTests.test_only_referenced_fields_selected": Shows(
        '"delete_referrer"."origin_id"', COLLECTED
    ),
    "delete.tests.FastDeleteTests.test_fast_delete_combined_relationships": Count(2, 3, COLLECTED),
    "delete.tests.FastDeleteTests.test_fast_delete_fk": Count(2, 3, COLLECTED),
    "delete.tests.FastDeleteTests.test_fast_delete_inheritance": Count(2, 3, COLLECTED),
    "delete.tests.FastDeleteTests.test_fast_delete_instance_set_pk_none": Shows(
        "collector.can_fast_delete(u)", COLLECTED
    ),
    "delete.tests.FastDeleteTests.test_fast_delete_large_batch": Count(2, 22, COLLECTED),
    "delete_regress.tests.SetQueryCountTests.test_set_querycount": Count(
        3, 7, UNLINKED, postgresql=11
    ),
    "many_to_many.tests.ManyToManyTests.test_fast_add_ignore_conflicts": Count(1, 2, ADD),
    # Django logs the statement PostgreSQL was sent, and SQLite's as Django wrote it.
    "model_inheritance.tests.ModelInheritanceTests.test_update_parent_filtering": Shows(
        'RETURNING "id", "name", "address"', RETURNING, only="postgresql"
    ),
}
