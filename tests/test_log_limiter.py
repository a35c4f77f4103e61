"""Socket-side log lines go through one limiter: a flood of bad input cannot flood the log."""

from __future__ import annotations

import logging

import pytest

from realtime.sockets import limits
from realtime.sockets.limits import LogLimiter, log_failure


def test_the_limiter_holds_back_lines_past_its_budget_and_says_how_many(
    caplog: pytest.LogCaptureFixture,
) -> None:
    limiter = LogLimiter()
    with caplog.at_level(logging.INFO, logger="realtime.sockets.limits"):
        for n in range(limits.LOG_LINES_PER_MINUTE + 5):
            limiter.log(logging.INFO, "realtime: line %d", n)
    assert len(caplog.records) == limits.LOG_LINES_PER_MINUTE
    assert limiter.suppressed == 5
    limiter._times.clear()  # a minute later
    with caplog.at_level(logging.INFO, logger="realtime.sockets.limits"):
        limiter.log(logging.INFO, "realtime: again")
    assert caplog.records[-1].getMessage() == "realtime: again (5 similar lines held back)"


def test_a_failure_is_one_error_line_naming_its_class_without_a_traceback_or_its_text(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "limiter", LogLimiter())
    try:
        "\ud800".encode()
    except UnicodeEncodeError as exc:
        error = exc
    with caplog.at_level(logging.INFO, logger="realtime.sockets.limits"):
        log_failure("realtime: resolving a watch failed", error)
    (record,) = caplog.records
    assert record.levelno == logging.ERROR
    assert record.exc_info is None
    assert record.getMessage() == "realtime: resolving a watch failed: UnicodeEncodeError"
