"""realtime reads other libraries' internals only inside ``realtime/compat``, one module per
library: a name below, found anywhere else in the package, fails this test.

The names are the internals realtime once leaned on (Django's transaction state and signing
format, daphne's, Twisted's and autobahn's connection, Channels' session wrapper, routers and
validator). A new use of another library's internals belongs in its compat module, checked
there by a self-test.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "realtime"
SEAMS = PACKAGE / "compat"

#: Attributes no module outside the seams may read or assign.
INTERNALS = {
    # Django
    "run_on_commit",
    "savepoint_ids",
    "in_atomic_block",
    "atomic_blocks",
    "errors_occurred",
    "_iterable_class",
    "settings_dict",
    "b62_decode",
    "ensure_connection",
    "is_usable",
    "wrap_database_errors",
    "get_connection_params",
    "mysql_is_mariadb",
    "local_managers",
    "_expire_cache",
    "_fetch_all",
    "_result_cache",
    "_raw_delete",
    "_has_signal_listeners",
    "constrained_target",
    "get_prefetch_cache",
    "_hints",
    "_live_receivers",
    "m2m_field_name",
    "m2m_reverse_field_name",
    "m2m_target_field_name",
    "m2m_reverse_target_field_name",
    # daphne, Twisted, autobahn
    "dataBuffer",
    "_tempDataLen",
    "offset",
    "sendCloseFrame",
    "closeHandshakeTimeout",
    "STATE_OPEN",
    "_asyncioEventloop",
    "handle_reply",
    # Channels
    "real_send",
    "application_mapping",
    "routes",
    "consumer_class",
    "allowed_origins",
}


def modules_outside_the_seams() -> list[Path]:
    return sorted(
        path
        for path in PACKAGE.rglob("*.py")
        if SEAMS not in path.parents and "migrations" not in path.parts
    )


def internals_used(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in INTERNALS:
            found.append(f"{path.name}:{node.lineno} .{node.attr}")
        elif isinstance(node, ast.Constant) and node.value in INTERNALS:
            found.append(f"{path.name}:{node.lineno} {node.value!r}")  # getattr(x, "name")
    return sorted(found)


@pytest.mark.parametrize("path", modules_outside_the_seams(), ids=lambda path: path.name)
def test_no_module_outside_the_seams_reads_another_librarys_internals(path: Path) -> None:
    assert internals_used(path) == []


def test_the_check_sees_an_internal_where_one_is_used(tmp_path: Path) -> None:
    module = tmp_path / "example.py"
    module.write_text(
        "def f(connection):\n"
        "    return connection.run_on_commit, getattr(connection, 'savepoint_ids')\n"
    )
    assert internals_used(module) == ["example.py:2 'savepoint_ids'", "example.py:2 .run_on_commit"]


def classes_assigned(path: Path) -> list[str]:
    """Where a module gives an object another class (``obj.__class__ = ...``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return sorted(
        f"{path.name}:{node.lineno}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Attribute) and target.attr == "__class__"
    )


@pytest.mark.parametrize("path", modules_outside_the_seams(), ids=lambda path: path.name)
def test_no_module_outside_the_seams_gives_an_object_another_class(path: Path) -> None:
    """Only a compat module may, checked there by a self-test: the options of a decorated
    model (``Options.base_manager``, ``realtime.compat.django_orm``) are the one use, and
    never a class of the application's."""
    assert classes_assigned(path) == []


def test_the_seams_give_only_django_options_another_class() -> None:
    assigned = [found for path in sorted(SEAMS.rglob("*.py")) for found in classes_assigned(path)]
    assert [found.split(":")[0] for found in assigned] == ["django_orm.py"] * len(assigned)
    source = (SEAMS / "django_orm.py").read_text().splitlines()
    for found in assigned:
        line = source[int(found.split(":")[1]) - 1]
        assert "__class__ = _options_making(" in line, line


def test_the_check_sees_a_class_assigned(tmp_path: Path) -> None:
    module = tmp_path / "example.py"
    module.write_text("def f(queryset, cls):\n    queryset.__class__ = cls\n")
    assert classes_assigned(module) == ["example.py:2"]
