"""``StatementClock``: a watchdog cuts the socket of a statement that outlived its bound.

The socket is a real one (a socket pair): a cut shuts it down, and its peer reads the end of
the stream at once. Times are handed to the clock, never waited for.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator

import pytest

from realtime import statement_clock
from realtime.statement_clock import StatementClock


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ends = socket.socketpair()
    yield ends
    for end in ends:
        end.close()


def begun(clock: StatementClock) -> float:
    """When the statement under way began, on the clock's own (monotonic) scale."""
    running = clock.running_for(0.0)
    assert running is not None
    return -running


def test_a_statement_is_cut_only_once_it_outlived_its_bound_and_the_grace(
    pair: tuple[socket.socket, socket.socket], caplog: pytest.LogCaptureFixture
) -> None:
    ours, peer = pair
    clock = StatementClock()
    with caplog.at_level(logging.WARNING, logger="realtime"), clock.running(ours.fileno()):
        since = begun(clock)
        assert not clock.cut_overdue(since + 2.0 + statement_clock.CUT_GRACE, 2.0, "a test")
        peer.setblocking(False)
        with pytest.raises(BlockingIOError):
            peer.recv(1)  # not cut: nothing to read, and no end of stream
        assert clock.cut_overdue(since + 2.0 + statement_clock.CUT_GRACE + 0.01, 2.0, "a test")
        peer.setblocking(True)
        assert peer.recv(1) == b""  # cut: the stream ended
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("realtime")]
    assert len(lines) == 1, lines
    assert lines[0].startswith("realtime: a test had no answer for 3.0")
    assert "(bound 2.0 s); cut its connection" in lines[0]


def test_every_watchdog_follows_the_one_grace(
    pair: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(statement_clock, "CUT_GRACE", 0.0)
    clock = StatementClock()
    with clock.running(pair[0].fileno()):
        assert clock.cut_overdue(begun(clock) + 2.01, 2.0, "a test")


def test_nothing_is_cut_without_a_statement_or_a_socket() -> None:
    clock = StatementClock()
    assert not clock.cut_overdue(1e9, 0.0, "a test")
    with clock.running(None):
        assert clock.running_for(begun(clock) + 5.0) == pytest.approx(5.0)
        assert not clock.cut_overdue(1e9, 0.0, "a test")
    assert clock.running_for(1e9) is None
