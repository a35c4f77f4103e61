"""Guards decided in process (``realtime.guard_checks``) answer exactly as the database does.

The oracle is the database itself: for random guards of the forms decided in process and
random rows (NULLs included), ``in_process``'s check must pass exactly the rows that
``Case.objects.filter(pk=row).filter(q)`` finds. Forms outside them must be left to the
database, and ``readers_of_rows`` must give the same readers either way.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db.models import F, Q

from realtime.audience import readers_of_rows
from realtime.guard_checks import Forms, in_process
from realtime.registry import options_for
from tests.testapp.models import Case, Company, Workspace

pytestmark = pytest.mark.django_db

#: The columns a row's values are read from, as ``readers_of_rows`` reads them.
COLUMNS = ("id", "private", "priority", "assignee_id", "company_id", "workspace_id")


def make_rows(rng: random.Random) -> tuple[list[Case], list[Any], list[Company]]:
    workspace = Workspace.objects.create(name="Acme", slug="acme")
    users = [get_user_model().objects.create_user(username=f"u{n}") for n in range(3)]
    companies = [Company.objects.create(workspace=workspace, name=f"c{n}") for n in range(2)]
    rows = [
        Case.objects.create(
            workspace=workspace if rng.random() < 0.8 else None,
            company=rng.choice([*companies, None]),
            assignee=rng.choice([*users, None]),
            title=f"case {n}",
            priority=rng.randint(0, 3),
            private=rng.random() < 0.5,
        )
        for n in range(24)
    ]
    return rows, users, companies


def random_leaf(rng: random.Random, users: list[Any], companies: list[Company]) -> Q:
    kind = rng.randrange(9)
    if kind == 0:
        return Q(private=rng.random() < 0.5)
    if kind == 1:
        return Q(assignee=rng.choice([*users, None]))
    if kind == 2:
        return Q(assignee_id=rng.choice(users).pk)
    if kind == 3:
        return Q(company__in=rng.sample(companies, rng.randint(1, 2)))
    if kind == 4:
        return Q(assignee__isnull=rng.random() < 0.5)
    if kind == 5:
        return Q(priority__in=rng.sample(range(4), rng.randint(0, 2)))
    if kind == 6:
        return Q(priority=rng.randint(0, 3))
    if kind == 7:
        return Q(company_id__exact=rng.choice(companies).pk)
    return Q(pk__in=[rng.randint(1, 50) for _ in range(3)])


def random_guard(rng: random.Random, users: list[Any], companies: list[Company], depth: int) -> Q:
    if depth == 0 or rng.random() < 0.3:
        q = random_leaf(rng, users, companies)
    else:
        parts = [random_guard(rng, users, companies, depth - 1) for _ in range(rng.randint(1, 3))]
        q = Q()
        for part in parts:
            q = (q | part) if rng.random() < 0.5 else (q & part)
    return ~q if rng.random() < 0.4 else q


def test_guards_decided_in_process_pass_exactly_the_rows_the_database_finds() -> None:
    rng = random.Random(47)
    rows, users, companies = make_rows(rng)
    values = list(Case.objects.values(*COLUMNS))
    forms: Forms = {}  # shared, as by a caller asking about many accounts
    for _ in range(300):
        guard = random_guard(rng, users, companies, depth=3)
        expected = set(Case.objects.filter(guard).values_list("pk", flat=True))
        for decided in (in_process(Case, guard), in_process(Case, guard, forms)):
            assert decided is not None, guard
            check, read = decided
            assert read <= set(COLUMNS)
            assert {row["id"] for row in values if check(row)} == expected, guard
    assert len(rows) == len(values)
    assert len(forms) < 300  # forms were shared by guards of other values


def test_answers_of_one_form_compiled_once_keep_each_accounts_values() -> None:
    rng = random.Random(11)
    rows, users, _ = make_rows(rng)
    values = list(Case.objects.values(*COLUMNS))
    forms: Forms = {}
    for user in users:
        guard = Q(private=False) | Q(assignee=user) | Q(pk__in=[rows[users.index(user)].pk])
        decided = in_process(Case, guard, forms)
        assert decided is not None
        expected = set(Case.objects.filter(guard).values_list("pk", flat=True))
        assert {row["id"] for row in values if decided[0](row)} == expected
    assert len(forms) == 1
    # A value of the form that the database must compare leaves that answer alone to it.
    assert in_process(Case, Q(private=False) | Q(assignee="x") | Q(pk__in=[1]), forms) is None
    assert in_process(Case, Q(private=False) | Q(assignee=users[0]) | Q(pk__in=[1]), forms)


@pytest.mark.parametrize(
    "guard",
    [
        Q(title="case 1"),  # text: collations
        Q(company__name="c0"),  # a relation path
        Q(priority__gte=2),  # a lookup other than exact, in and isnull
        Q(priority=F("id")),  # an expression
        Q(private=1),  # a boolean given what is no boolean
        Q(private=True) ^ Q(priority=1),  # XOR
        Q(due=None) & Q(due__isnull=False),  # a date column
        Q(company_id__in=[None, 1]),  # None in a list: Django's answer changed in 6.1
    ],
    ids=["text", "path", "gte", "expression", "not-a-boolean", "xor", "date", "none-in-a-list"],
)
def test_guards_of_other_forms_are_left_to_the_database(guard: Q) -> None:
    assert in_process(Case, guard) is None


def test_an_empty_guard_passes_every_row_negated_or_not() -> None:
    for guard in (Q(), ~Q()):
        decided = in_process(Case, guard)
        assert decided is not None
        assert decided[0]({}) is True


def test_readers_are_the_same_decided_in_process_or_by_the_database() -> None:
    rng = random.Random(5)
    rows, users, _ = make_rows(rng)
    options = options_for(Case)
    assert options is not None
    pks = [row.pk for row in rows]
    found = readers_of_rows(options, pks, [user.pk for user in users])
    # The same guard, made undecidable here by a condition that changes nothing
    # (``pk__gte=0`` holds for every row): the database answers.
    by_database = dataclasses.replace(options, guard=_asked_of_database)
    assert found == readers_of_rows(by_database, pks, [user.pk for user in users])
    assert options.guard is not None
    assert in_process(Case, options.guard(users[0])) is not None  # the first: in process
    assert any(found[pk] for pk in pks)
    assert not all(len(found[pk]) == 3 for pk in pks)


def _asked_of_database(user: Any) -> Q:
    return (Q(private=False) | Q(assignee=user)) & Q(pk__gte=0)
