"""Run Django's ORM tests plain and decorated, and fail on what decorating changed.

``python -m tests.django_suite [--database sqlite|postgresql] [--parallel N] [label ...]``

1. Django's sdist for the Django installed here comes from PyPI (``pip download``) into
   ``REALTIME_SUITE_DIR`` (``.django-suite`` by default) and is unpacked there once.
2. ``realtime_suite`` (realtime's app, settings and recording runner) is linked into its
   ``tests/`` folder, and ``runtests.py`` runs the labels twice: plain, then with every concrete
   model of those apps decorated (``realtime_suite.decorating``).
3. A test that passes plain and does not pass decorated is a regression, unless ``allowed.py``
   lists it — a statement count, with both counts, and the counts are those; or a statement
   its failure shows. Listed differences that no longer happen are reported too, so that the
   list stays true.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import django

from tests.django_suite.allowed import ALLOWED, Allowed, Count, Shows

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

#: The ORM test apps of Django's suite that are realtime's contract.
APPS = [
    "basic",
    "bulk_create",
    "update",
    "update_only_fields",
    "save_delete_hooks",
    "delete",
    "delete_regress",
    "many_to_many",
    "m2m_through",
    "m2m_through_regress",
    "m2m_signals",
    "m2m_intermediary",
    "custom_managers",
    "managers_regress",
    "proxy_models",
    "model_inheritance",
    "model_inheritance_regress",
    "composite_pk",
    "multiple_database",
    "select_for_update",
    "transactions",
    "get_or_create",
    "queries",
    "one_to_one",
    "many_to_one",
    "generic_relations",
    "signals",
    "model_fields",
    "defer",
    "defer_regress",
    "prefetch_related",
    "async",
    "fixtures",
    "serializers",
    "queryset_pickle",
    "migrations",
    "cache",
    "select_related",
    "expressions",
    "lookup",
    "ordering",
    "aggregation",
]

#: ``assertNumQueries``'s message: "3 != 2 : 3 queries executed, 2 expected".
COUNT = re.compile(r"AssertionError: (\d+) != (\d+) : \d+ queries executed, \d+ expected")


def sdist_tests(version: str) -> Path:
    """The ``tests/`` folder of Django ``version``'s sdist, downloaded and unpacked once."""
    base = Path(os.environ.get("REALTIME_SUITE_DIR") or ROOT / ".django-suite")
    tree = base / f"django-{version}"
    if not (tree / "tests" / "runtests.py").exists():
        base.mkdir(parents=True, exist_ok=True)
        archive = base / f"django-{version}.tar.gz"
        if not archive.exists():
            subprocess.run(
                [
                    *(sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"),
                    *("--no-binary", ":all:", "--dest", str(base), f"Django=={version}"),
                ],
                check=True,
            )
        with tarfile.open(archive) as sdist:
            sdist.extractall(base, filter="data")
    link = tree / "tests" / "realtime_suite"
    if not link.is_symlink():
        link.symlink_to(HERE / "realtime_suite", target_is_directory=True)
    return tree / "tests"


def run(
    tests: Path, labels: list[str], database: str, parallel: int, decorate: bool
) -> dict[str, dict[str, str]]:
    """Run ``runtests.py`` on ``labels``; each test's outcome by its id."""
    with tempfile.TemporaryDirectory() as scratch:
        results = Path(scratch) / "results.json"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "REALTIME_SUITE_DATABASE": database,
            "REALTIME_SUITE_DECORATE": "1" if decorate else "0",
            "REALTIME_SUITE_APPS": ",".join(labels),
            "REALTIME_SUITE_RESULTS": str(results),
        }
        command = [
            *(sys.executable, "runtests.py", "--settings=realtime_suite.settings"),
            *("--noinput", f"--parallel={parallel}", "--verbosity=1"),
            *labels,
            "realtime_suite",
        ]
        print(f"== {'decorated' if decorate else 'plain'}: {len(labels)} apps on {database}")
        sys.stdout.flush()
        subprocess.run(command, cwd=tests, env=env, check=False)
        if not results.exists():
            raise SystemExit("runtests.py recorded no result: it could not run")
        outcomes: dict[str, dict[str, str]] = json.loads(results.read_text())
        return outcomes


def compare(
    plain: dict[str, dict[str, str]],
    decorated: dict[str, dict[str, str]],
    allowed: dict[str, Allowed],
    database: str,
) -> list[str]:
    """The problems: regressions not allowed, and allowed differences that are not so."""
    problems = []
    seen = set()
    for test, was in sorted(plain.items()):
        if was["outcome"] not in ("pass", "xfail"):
            continue
        now = decorated.get(test)
        if now is None:
            problems.append(f"{test}: not run decorated")
            continue
        if now["outcome"] == was["outcome"]:
            continue
        permitted = _here(allowed.get(test), database)
        if permitted is None:
            problems.append(
                f"{test}: {was['outcome']} plain, {now['outcome']} decorated\n"
                f"{_indent(now['detail'])}"
            )
            continue
        seen.add(test)
        problem = _unlike(test, permitted, now["detail"], database)
        if problem is not None:
            problems.append(problem)
    for test in sorted(set(allowed) - seen):
        if test in decorated and _here(allowed[test], database) is not None:
            problems.append(f"{test}: listed in allowed.py, but no longer differs")
    return problems


def _here(permitted: Allowed | None, database: str) -> Allowed | None:
    """``permitted``, unless it is listed for another database only."""
    if isinstance(permitted, Shows) and permitted.only not in (None, database):
        return None
    return permitted


def _unlike(test: str, permitted: Allowed, detail: str, database: str) -> str | None:
    """What differs between a failure and the difference ``allowed.py`` lists; ``None``:
    nothing."""
    if not isinstance(permitted, Count):
        shows = permitted.shows
        if database == "postgresql" and permitted.postgresql is not None:
            shows = permitted.postgresql
        if shows in detail:
            return None
        return f"{test}: fails without showing {shows!r}\n{_indent(detail)}"
    counts = COUNT.search(detail)
    if counts is None:
        return f"{test}: fails, not on a statement count\n{_indent(detail)}"
    executed, expected = int(counts[1]), int(counts[2])
    listed = permitted.decorated
    if database == "postgresql" and permitted.postgresql is not None:
        listed = permitted.postgresql
    if (expected, executed) == (permitted.plain, listed):
        return None
    return (
        f"{test}: {executed} statements where {expected} are expected; allowed.py lists "
        f"{listed} for {permitted.plain}"
    )


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.strip().splitlines()[-40:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--parallel", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--reuse-plain",
        action="store_true",
        help="compare with the plain run's outcomes kept by an earlier run, if any",
    )
    parser.add_argument("labels", nargs="*", help=f"test apps (default: {len(APPS)} ORM apps)")
    options = parser.parse_args(argv)
    labels = options.labels or list(APPS)
    tests = sdist_tests(django.__version__)
    kept = tests.parent / f"plain-{options.database}-{'-'.join(sorted(labels))[:80]}.json"
    if options.reuse_plain and kept.exists():
        plain = json.loads(kept.read_text())
    else:
        plain = run(tests, labels, options.database, options.parallel, False)
        kept.write_text(json.dumps(plain))
    decorated = run(tests, labels, options.database, options.parallel, True)
    apps = {label.split(".")[0] for label in labels}
    allowed = {test: a for test, a in ALLOWED.items() if test.split(".")[0] in apps}
    problems = compare(plain, decorated, allowed, options.database)
    passed = sum(1 for outcome in decorated.values() if outcome["outcome"] == "pass")
    print(f"== {len(decorated)} tests decorated, {passed} passed; {len(problems)} problem(s)")
    for problem in problems:
        print(f"-- {problem}")
    return 1 if problems else 0
