"""The statement counts decorating a model may change in Django's tests, each with its counts.

Each entry names one test of Django's suite whose ``assertNumQueries`` counts differently once
its models are decorated, the count plain and decorated, and the rule of ``docs/limits.md``
that explains it. ``run.py`` fails when a listed test counts otherwise.
"""

from __future__ import annotations

from typing import NamedTuple


class Allowed(NamedTuple):
    plain: int
    decorated: int
    #: The heading of ``docs/limits.md`` that says why.
    why: str


ALLOWED: dict[str, Allowed] = {}
