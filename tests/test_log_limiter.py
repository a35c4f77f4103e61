"""Lines that input from outside can repeat go through a budget: a flood of bad input cannot
flood the log, nor hold back realtime's own lines, nor one failing hook another's."""

from __future__ import annotations

import logging

import pytest

from realtime import logs
from realtime.logs import LogLimiter, log_failure, log_hook_failure, log_limited, log_operation

logger = logging.getLogger("realtime.tests")


def test_the_limiter_holds_back_lines_past_its_budget_and_says_how_many(
    caplog: pytest.LogCaptureFixture,
) -> None:
    limiter = LogLimiter(logs.CLIENT_LINES_PER_MINUTE)
    with caplog.at_level(logging.INFO, logger="realtime.tests"):
        for n in range(logs.CLIENT_LINES_PER_MINUTE + 5):
            limiter.log(logger, logging.INFO, "realtime: line %d", n)
    assert len(caplog.records) == logs.CLIENT_LINES_PER_MINUTE
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


def test_lines_clients_cause_never_hold_back_realtime_s_own(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="realtime.tests"):
        for _ in range(logs.CLIENT_LINES_PER_MINUTE + 5):
            log_limited(logger, logging.INFO, "realtime: refused a socket: format")
        log_operation(logger, logging.WARNING, "realtime: the connection is lost")
    assert caplog.records[-1].getMessage() == "realtime: the connection is lost"


def test_one_place_failing_over_and_over_holds_back_only_its_own_tracebacks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    error = RuntimeError("hook bug")
    with caplog.at_level(logging.INFO, logger="realtime.tests"):
        for _ in range(logs.PLACE_LINES_PER_MINUTE + 5):
            log_hook_failure(logger, "realtime: recipients() failed", error)
        log_hook_failure(logger, "realtime: audience() failed", error)
    first = [r for r in caplog.records if r.getMessage() == "realtime: recipients() failed"]
    assert len(first) == logs.PLACE_LINES_PER_MINUTE
    last = caplog.records[-1]
    assert last.getMessage() == "realtime: audience() failed"
    assert last.levelno == logging.ERROR
    assert last.exc_info is not None
    assert last.exc_info[1] is error
