"""``realtime.limits`` holds realtime's fixed limits as named constants, so that a test can
patch one (``monkeypatch.setattr(limits, "MAX_IDS_PER_MESSAGE", 2)``) and every use of it
sees the patch: a module that copied a constant's value at import (``from realtime.limits
import NAME``) would keep the old one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "realtime"


def copied_limits(source: str) -> list[str]:
    """The names a module imports from ``realtime.limits`` (its values, copied)."""
    return [
        alias.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and node.module == "realtime.limits"
        for alias in node.names
    ]


@pytest.mark.parametrize(
    "path", sorted(PACKAGE.rglob("*.py")), ids=lambda path: str(path.relative_to(PACKAGE))
)
def test_every_module_reads_the_limits_through_their_module(path: Path) -> None:
    assert copied_limits(path.read_text()) == []


def test_the_check_sees_a_limit_copied() -> None:
    assert copied_limits("from realtime.limits import MAX_IDS_PER_MESSAGE\n") == [
        "MAX_IDS_PER_MESSAGE"
    ]
    assert copied_limits("from realtime import limits\n") == []
