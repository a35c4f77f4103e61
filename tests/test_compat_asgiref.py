"""The asgiref seam: thread-sensitive work queued at the call, and its self-test.

Tested without a database: the seam is about threads; what the work does in the caller's
transaction is tested in tests/test_broadcast.py and tests/test_announcements.py."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest
from asgiref.sync import async_to_sync

from realtime.compat import asgiref as asgiref_compat
from tests.helpers import WAIT


def forget_the_verdict(monkeypatch: pytest.MonkeyPatch, problem: str | None) -> None:
    """The self-test asked again, answering ``problem`` (``None``: it passes)."""
    with asgiref_compat._verdict_lock:
        monkeypatch.setattr(asgiref_compat, "_verdict", None)
        monkeypatch.setattr(asgiref_compat, "_probe", lambda: problem)


def test_this_asgiref_queues_thread_sensitive_work_at_the_call() -> None:
    assert asgiref_compat._probe() is None


def test_work_of_a_helper_that_returns_at_once_runs_on_the_caller_s_thread() -> None:
    ran_on: list[int] = []

    async def helper() -> None:
        asgiref_compat.start_task(lambda: ran_on.append(threading.get_ident()))

    async_to_sync(helper)()
    assert ran_on == [threading.get_ident()]


def test_a_self_test_that_fails_is_said_once_and_the_work_still_runs_when_awaited(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    forget_the_verdict(monkeypatch, "the probe failed")
    ran_on: list[int] = []

    async def helper() -> None:
        for _ in range(2):
            task = asgiref_compat.start_task(lambda: ran_on.append(threading.get_ident()))
            assert task is not None
            await asyncio.wait_for(task, WAIT)

    with caplog.at_level(logging.ERROR, logger="realtime"):
        async_to_sync(helper)()
    assert ran_on == [threading.get_ident()] * 2
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert "the probe failed" in line
    assert "asgiref" in line
