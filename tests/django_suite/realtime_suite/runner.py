"""Django's test runner, recording each test's outcome in a JSON file for ``run.py``.

In a parallel run the workers' results are replayed on the main process's result, so one
result object sees every test. A test with a failed subtest failed.
"""

from __future__ import annotations

import json
import os
import traceback
import unittest
from types import TracebackType
from typing import Any

from django.test.runner import DiscoverRunner

ErrInfo = tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]

#: Characters of a failure's text kept, from its start (the assertion's line: a statement
#: count) and from its end (the last statements): half each.
DETAIL = 6000


def _kept(text: str) -> str:
    if len(text) <= DETAIL:
        return text
    return f"{text[: DETAIL // 2]}\n[...]\n{text[-DETAIL // 2 :]}"


class RecordingResult(unittest.TextTestResult):
    """Records ``{test id: {"outcome": ..., "detail": ...}}`` and writes it when the run
    stops, to the file ``REALTIME_SUITE_RESULTS`` names."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.outcomes: dict[str, dict[str, str]] = {}

    def _note(self, test: Any, outcome: str, err: Any = None) -> None:
        detail = ""
        if err is not None:
            detail = _kept(self._text(err))
        known = self.outcomes.get(test.id())
        if known is not None and known["outcome"] in ("fail", "error"):
            return  # a failed subtest failed the test
        self.outcomes[test.id()] = {"outcome": outcome, "detail": detail}

    @staticmethod
    def _text(err: Any) -> str:
        if isinstance(err, tuple) and len(err) == 3:
            return "".join(traceback.format_exception(*err))
        return str(err)

    def addSuccess(self, test: Any) -> None:  # noqa: N802 - unittest's names
        super().addSuccess(test)
        self._note(test, "pass")

    def addFailure(self, test: Any, err: Any) -> None:  # noqa: N802
        super().addFailure(test, err)
        self._note(test, "fail", err)

    def addError(self, test: Any, err: Any) -> None:  # noqa: N802
        super().addError(test, err)
        self._note(test, "error", err)

    def addSkip(self, test: Any, reason: str) -> None:  # noqa: N802
        super().addSkip(test, reason)
        self._note(test, "skip")

    def addExpectedFailure(self, test: Any, err: Any) -> None:  # noqa: N802
        super().addExpectedFailure(test, err)
        self._note(test, "xfail")

    def addUnexpectedSuccess(self, test: Any) -> None:  # noqa: N802
        super().addUnexpectedSuccess(test)
        self._note(test, "xpass")

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:  # noqa: N802
        super().addSubTest(test, subtest, err)
        if err is not None:
            failed = issubclass(err[0], test.failureException) if isinstance(err, tuple) else True
            self.outcomes[test.id()] = {
                "outcome": "fail" if failed else "error",
                "detail": _kept(f"{subtest.id()}\n{self._text(err)}"),
            }

    def stopTestRun(self) -> None:  # noqa: N802
        super().stopTestRun()
        path = os.environ.get("REALTIME_SUITE_RESULTS")
        if path:
            with open(path, "w", encoding="utf-8") as file:
                json.dump(self.outcomes, file, indent=0, sort_keys=True)


class RecordingRunner(DiscoverRunner):
    """``DiscoverRunner`` whose result records every outcome (see ``RecordingResult``)."""

    def get_resultclass(self) -> Any:
        return RecordingResult
