"""Lines that input from outside can repeat go through one budget: a flood of bad input, or a
receiver failing on every frame, cannot flood the log."""

from __future__ import annotations

import logging

import pytest

from realtime import logs
from realtime.logs import LogLimiter, log_failure

logger = logging.getLogger("realtime.tests")


def test_the_limiter_holds_back_lines_past_its_budget_and_says_how_many(
    caplog: pytest.LogCaptureFixture,
) -> None:
    limiter = LogLimiter()
    with caplog.at_level(logging.INFO, logger="realtime.tests"):
        for n in range(logs.LINES_PER_MINUTE + 5):
            limiter.log(logger, logging.INFO, "realtime: line %d", n)
    assert len(caplog.records) == logs.LINES_PER_MINUTE
    assert limiter.suppressed == 5
    limiter._times.clear()  # a minute later
    with caplog.at_level(logging.INFO, logger="realtime.tests"):
        limiter.log(logger, logging.INFO, "realtime: again")
    assert caplog.records[-1].getMessage() == "realtime: again (5 similar lines held back)"


def test_a_failure_is_one_error_line_naming_its_class_without_a_traceback_or_its_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    try:
        "\ud800".encode()
    except UnicodeEncodeError as exc:
        error = exc
    with caplog.at_level(logging.INFO, logger="realtime.tests"):
        log_failure(logger, "realtime: resolving a watch failed", error)
    (record,) = caplog.records
    assert record.levelno == logging.ERROR
    assert record.exc_info is None
    assert record.getMessage() == "realtime: resolving a watch failed: UnicodeEncodeError"
