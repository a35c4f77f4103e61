"""The statements decorating a model may change in Django's tests, each with its count.

Each entry names one test of Django's suite (Django 6.1) that counts or shows the statements
of a write differently once its models are decorated, and the rule of ``docs/limits.md``
("Statements realtime adds to a write") that explains it. ``run.py`` fails when a listed test
counts otherwise — and when it no longer differs, so that the list stays true.

* ``Count``: an ``assertNumQueries`` that counts ``plain`` statements without realtime and
  ``decorated`` with it (on PostgreSQL, ``postgresql`` when it differs: realtime's reads run in
  a savepoint there).
* ``Shows``: a test that looks at one statement, which is realtime's, or at whether Django
  may delete without collecting; its failure must show ``shows`` (on PostgreSQL,
  ``postgresql`` when it differs).
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


Allowed = Count | Shows

#: The rules of docs/limits.md, by the words of its table.
AUTOCOMMIT = "any write in autocommit: its announcement, published at once after it"
UPDATE = "QuerySet.update(): one SELECT of the matched keys before the UPDATE"
DELETE = "QuerySet.delete() Django can make in one statement: one SELECT of the rows first"
UNLINKED = "a delete of a row whose decorated children it sets to NULL or to their default"
ADD = "add() of a many-to-many realtime listens to: Django reads the links that exist first"
COLLECTED = "Model.delete() of a model with receivers: its related rows are read whole"

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
    "delete.tests.FastDeleteTests.test_fast_delete_aggregation": Count(1, 2, DELETE, postgresql=4),
    "delete.tests.FastDeleteTests.test_fast_delete_all": Count(1, 2, DELETE, postgresql=4),
    "delete.tests.FastDeleteTests.test_fast_delete_combined_relationships": Count(2, 3, DELETE),
    "delete.tests.FastDeleteTests.test_fast_delete_empty_no_update_can_self_select": Count(
        1, 2, DELETE, postgresql=4
    ),
    "delete.tests.FastDeleteTests.test_fast_delete_fk": Count(2, 3, DELETE),
    "delete.tests.FastDeleteTests.test_fast_delete_full_match": Count(1, 2, DELETE, postgresql=4),
    "delete.tests.FastDeleteTests.test_fast_delete_inheritance": Count(2, 3, DELETE),
    "delete.tests.FastDeleteTests.test_fast_delete_instance_set_pk_none": Shows(
        "collector.can_fast_delete(u)", COLLECTED
    ),
    "delete.tests.FastDeleteTests.test_fast_delete_joined_qs": Count(1, 2, DELETE, postgresql=4),
    "delete.tests.FastDeleteTests.test_fast_delete_large_batch": Count(1, 2, DELETE, postgresql=4),
    "delete.tests.FastDeleteTests.test_fast_delete_qs": Count(1, 2, DELETE, postgresql=4),
    "delete_regress.tests.DeleteTests.test_self_reference_with_through_m2m_at_second_level": (
        Count(1, 2, DELETE, postgresql=4)
    ),
    "delete_regress.tests.SetQueryCountTests.test_set_querycount": Count(
        3, 7, UNLINKED, postgresql=11
    ),
    "delete_regress.tests.Ticket19102Tests.test_ticket_19102_annotate": Count(
        1, 2, DELETE, postgresql=4
    ),
    "delete_regress.tests.Ticket19102Tests.test_ticket_19102_defer": Count(
        1, 2, DELETE, postgresql=4
    ),
    "delete_regress.tests.Ticket19102Tests.test_ticket_19102_extra": Count(
        1, 2, DELETE, postgresql=4
    ),
    "delete_regress.tests.Ticket19102Tests.test_ticket_19102_select_related": Count(
        1, 2, DELETE, postgresql=4
    ),
    "generic_relations.tests.GenericRelationsTests.test_add_bulk": Count(
        1, 2, UPDATE, postgresql=4
    ),
    "many_to_many.tests.ManyToManyTests.test_fast_add_ignore_conflicts": Count(1, 2, ADD),
    "model_inheritance.tests.ModelInheritanceTests.test_update_parent_filtering": Shows(
        'SELECT "model_inheritance_place"."id" AS "pk"', UPDATE, postgresql="SAVEPOINT"
    ),
    "proxy_models.tests.ProxyModelTests.test_proxy_update": Count(1, 2, UPDATE, postgresql=4),
}
