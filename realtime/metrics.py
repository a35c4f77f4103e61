"""What an operator watches: sockets, handshakes, closes, frames, lag, polls, reconnects, trims,
slow-socket protection.

Each function here is the one call made at its point in the code; all are no-ops, costing a
function call, when ``prometheus_client`` (the ``metrics`` extra) is not installed. Metrics are
made on first use, so they follow the environment of the process that uses them: with
``PROMETHEUS_MULTIPROC_DIR`` set, ``prometheus_client`` keeps each process's values in files
there, and one endpoint (``realtime.views.metrics``) or ``manage.py realtime_stats`` reads
every worker's. Gauges are then kept per process (a ``pid`` label) and only for live ones;
each is made by the first reading a worker takes, so a process that only publishes, trims or
reads (a command, a web process) keeps counts and no gauge.

Calls on hot paths count once per message, never once per socket: ``delivered`` adds the
number of sockets a frame went to. Commit→frame lag is read from the message's ``mid``, which
starts with the publish time (``realtime.messages.published_at``); clocks of different hosts
add their skew to it.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import threading
import time
from typing import Any

from realtime.messages import published_at

logger = logging.getLogger(__name__)

try:
    import prometheus_client
except ImportError:  # the optional extra is not installed: every call is a no-op
    prometheus_client = None  # type: ignore[assignment]

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: Buckets of lags and poll durations, in seconds: a few milliseconds to a minute.
SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
LIVE_GAUGE_FILE = re.compile(r"gauge_live\w*?_(\d+)\.db")


class Metrics:
    """The process's metric objects (``prometheus_client`` is installed)."""

    def __init__(self) -> None:
        assert prometheus_client is not None
        counter, gauge, histogram = (
            prometheus_client.Counter,
            prometheus_client.Gauge,
            prometheus_client.Histogram,
        )
        # Per worker: every live process's value, under its pid (single process: the one).
        per_worker: dict[str, Any] = {"multiprocess_mode": "liveall"}
        #: The unlabelled gauges of this worker made so far (see ``worker_gauge``).
        self._worker_gauges: dict[str, Any] = {}
        self._worker_gauges_lock = threading.Lock()
        self.handshakes = counter(
            "realtime_handshakes",
            "Socket handshakes, by outcome: accepted or why refused",
            ["outcome"],
        )
        self.closes = counter("realtime_closes", "Sockets closed, by close code", ["code"])
        self.sent = counter("realtime_frames_sent", "Event frames handed to sockets")
        self.dropped = counter(
            "realtime_frames_dropped", "Frames or messages not delivered, by reason", ["reason"]
        )
        self.overflows = counter(
            "realtime_queue_overflows",
            "Items a bounded queue of realtime turned away, by queue",
            ["queue"],
        )
        self.lag = histogram(
            "realtime_commit_to_frame_seconds",
            "From a message's publication (after its commit) to its frame going out",
            buckets=SECONDS,
        )
        self.polls = histogram(
            "realtime_poll_seconds", "Duration of each table-transport poll", buckets=SECONDS
        )
        self.reconnects = counter(
            "realtime_listen_reconnects",
            "Listening connections (pg_notify's LISTEN, Redis's Pub/Sub) made again after a loss",
        )
        self.caught_up = counter(
            "realtime_stream_catch_up_messages",
            "Messages a Redis worker read from the streams rather than live (gap fills after a "
            "reconnect, catch-ups after a full queue, payloads too large to travel live)",
        )
        self.stream_losses = counter(
            "realtime_stream_losses",
            "Times a Redis stream lost history under a worker (a new epoch, or entries trimmed "
            "past it): its sockets were closed 1012",
        )
        self.redis_publishes = histogram(
            "realtime_redis_publish_seconds",
            "Duration of each publish to Redis (one script call)",
            buckets=SECONDS,
        )
        self.relays_dropped = counter(
            "realtime_redis_relays_dropped",
            "Streams that dropped a relay they already held (the same outbox rows relayed again)",
        )
        self.superseded = counter(
            "realtime_events_superseded",
            "Events of a row dropped by a worker: a newer version of the row was delivered first",
        )
        self.trimmed = counter("realtime_trimmed_rows", "Rows trimmed from firm_channel_messages")
        # Every worker reads the same table: the highest reading of the live ones.
        shared: dict[str, Any] = {"multiprocess_mode": "livemax"}
        self.outbox_pending = gauge(
            "realtime_outbox_pending",
            "Rows of realtime_outbox not relayed yet, by database",
            ["database"],
            **shared,
        )
        self.outbox_oldest = gauge(
            "realtime_outbox_oldest_seconds",
            "Age of the oldest row of realtime_outbox, by database (0: none)",
            ["database"],
            **shared,
        )
        self.outbox_relayed = counter(
            "realtime_outbox_relayed_rows",
            "Rows of realtime_outbox a sweeper relayed (their writer did not)",
        )
        self.protection = gauge(
            "realtime_slow_socket_protection",
            "Whether the seam into each library's internals passed its self-test (1) or not (0)",
            ["library"],
            **per_worker,
        )
        self.unprotected = counter(
            "realtime_unprotected_sockets",
            "Sockets served without slow-socket protection, by reason",
            ["reason"],
        )

    @property
    def sockets(self) -> Any:
        return self.worker_gauge("realtime_sockets_open", "Sockets open on this worker")

    @property
    def queue(self) -> Any:
        return self.worker_gauge("realtime_delivery_queue_depth", "Messages waiting for delivery")

    @property
    def last_poll(self) -> Any:
        return self.worker_gauge(
            "realtime_last_poll_timestamp_seconds",
            "When the table transport's last poll succeeded (Unix time)",
        )

    def worker_gauge(self, name: str, documentation: str) -> Any:
        """This worker's gauge ``name``, made at its first reading. An unlabelled gauge is
        written under the process's pid as soon as it is made (at 0) and stays until a worker
        starts after the process is gone: made with the others, it would show every command
        and every process that only publishes as a worker that never polled and holds no
        socket."""
        found = self._worker_gauges.get(name)
        if found is None:
            with self._worker_gauges_lock:
                found = self._worker_gauges.get(name)
                if found is None:
                    assert prometheus_client is not None
                    if not self._worker_gauges:
                        _forget_at_exit()
                    found = self._worker_gauges[name] = prometheus_client.Gauge(
                        name, documentation, multiprocess_mode="liveall"
                    )
        return found


def _forget_at_exit() -> None:
    """Drop this worker's gauge files when it exits (a worker stopped and not started again,
    as when scaling down, would show its last values for good; one killed is dropped at the
    next scrape, or when a worker starts: ``forget_dead_workers``)."""
    directory = os.environ.get(MULTIPROC_ENV)
    if not directory:
        return
    from prometheus_client import multiprocess

    atexit.register(multiprocess.mark_process_dead, os.getpid(), directory)


_lock = threading.Lock()
_metrics: Metrics | None = None


def get() -> Metrics | None:
    """The process's metrics, made on first use; ``None`` without ``prometheus_client``."""
    global _metrics
    if _metrics is None and prometheus_client is not None:
        with _lock:
            if _metrics is None:
                forget_dead_workers()
                _metrics = Metrics()
    return _metrics


def forget_dead_workers() -> None:
    """Drop the gauge files of workers that are gone (a restart leaves them behind), so a
    live gauge shows only live workers. Counters keep every worker's counts, as they should."""
    directory = os.environ.get(MULTIPROC_ENV)
    if not directory or prometheus_client is None:
        return
    from prometheus_client import multiprocess

    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            match = LIVE_GAUGE_FILE.fullmatch(name)
            if match and not _alive(int(match.group(1))):
                multiprocess.mark_process_dead(int(match.group(1)), directory)  # type: ignore[no-untyped-call]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# The calls, one at each point ----------------------------------------------------------------


def sockets_open(count: int) -> None:
    if (m := get()) is not None:
        m.sockets.set(count)


def handshake(outcome: str) -> None:
    """A handshake ended: ``accepted``, or the refusal (its reason, lowercase with ``_``)."""
    if (m := get()) is not None:
        m.handshakes.labels(outcome).inc()


def closed(code: int | None) -> None:
    if (m := get()) is not None:
        m.closes.labels(close_label(code)).inc()


def close_label(code: int | None) -> str:
    """The ``code`` label of a close: a code RFC 6455 defines (1000-1015) as itself, ``none``
    without one, and ``other`` for any other (3000-4999 are the peer's to choose: as labels
    they would let clients grow the metric without bound). 1005 and 1006 are what servers
    report for a connection that ended without a code (daphne one, uvicorn the other): no
    close frame was sent, so ``none`` too."""
    if code is None or code in (1005, 1006):
        return "none"
    return str(code) if 1000 <= code <= 1015 else "other"


def delivered(mid: Any, sockets: int) -> None:
    """A message's frame went out to ``sockets`` sockets: count them, and observe its lag."""
    if (m := get()) is not None:
        m.sent.inc(sockets)
        published = published_at(mid)
        if published is not None:
            m.lag.observe(max(0.0, time.time() - published))


def dropped(reason: str, count: int = 1) -> None:
    if (m := get()) is not None:
        m.dropped.labels(reason).inc(count)


def overflowed(queue: str, count: int = 1) -> None:
    """A bounded queue turned ``count`` items away: ``pending_notifications`` (pg_notify,
    caught up from its log), ``event_delivered_signals`` (not sent), ``trim_requests`` (not
    made: later trims delete the same rows), ``held_frames`` (a socket's frames held
    through its handshake, resume or a recheck: the socket is closed 1012)."""
    if (m := get()) is not None:
        m.overflows.labels(queue).inc(count)


def queue_depth(depth: int) -> None:
    if (m := get()) is not None:
        m.queue.set(depth)


def polled(seconds: float) -> None:
    if (m := get()) is not None:
        m.polls.observe(seconds)
        m.last_poll.set(time.time())


def listen_reconnected() -> None:
    if (m := get()) is not None:
        m.reconnects.inc()


def caught_up(count: int = 1) -> None:
    if (m := get()) is not None:
        m.caught_up.inc(count)


def stream_lost() -> None:
    if (m := get()) is not None:
        m.stream_losses.inc()


def redis_published(seconds: float, dropped: int) -> None:
    """One publish to Redis took ``seconds``; ``dropped`` of its streams held it already."""
    if (m := get()) is not None:
        m.redis_publishes.observe(seconds)
        if dropped:
            m.relays_dropped.inc(dropped)


def trimmed(rows: int) -> None:
    if rows and (m := get()) is not None:
        m.trimmed.inc(rows)


def outbox_backlog(database: str, rows: int, oldest: float | None) -> None:
    """A sweeper measured the outbox of ``database``."""
    if (m := get()) is not None:
        m.outbox_pending.labels(database).set(rows)
        m.outbox_oldest.labels(database).set(oldest or 0.0)


def superseded() -> None:
    if (m := get()) is not None:
        m.superseded.inc()


def outbox_relayed(rows: int) -> None:
    if rows and (m := get()) is not None:
        m.outbox_relayed.inc(rows)


def slow_socket_protection(library: str, on: bool) -> None:
    """A seam's self-test ran: ``library`` is ``daphne``, ``uvicorn``, ``channels`` or
    ``kernel`` (its send queue can be read)."""
    if (m := get()) is not None:
        m.protection.labels(library).set(1 if on else 0)


def unprotected_socket(reason: str) -> None:
    """A socket is served without slow-socket protection: ``unknown_send``, or the library
    whose seam is off for it."""
    if (m := get()) is not None:
        m.unprotected.labels(reason).inc()


def registry() -> Any:
    """The registry to read: every worker's files with ``PROMETHEUS_MULTIPROC_DIR``, else
    this process's metrics; ``None`` without ``prometheus_client``."""
    if prometheus_client is None:
        return None
    if not os.environ.get(MULTIPROC_ENV):
        get()  # this process's own metrics are read: made, so that every count shows
        return prometheus_client.REGISTRY
    # The workers' files are read; a reader that made its own metrics would add files of its
    # own there (realtime_stats from cron, one per run).
    from prometheus_client import multiprocess

    forget_dead_workers()  # a worker stopped (or killed) since: its gauges go
    collected = prometheus_client.CollectorRegistry()
    multiprocess.MultiProcessCollector(collected)  # type: ignore[no-untyped-call]
    return collected


def exposition() -> tuple[bytes, str] | None:
    """The text a Prometheus scrape reads, and its content type; ``None`` without
    ``prometheus_client``."""
    read = registry()
    if read is None:
        return None
    return prometheus_client.generate_latest(read), prometheus_client.CONTENT_TYPE_LATEST


def samples() -> list[tuple[str, dict[str, str], float]] | None:
    """Every ``realtime_*`` sample as (name, labels, value), sorted; ``None`` without
    ``prometheus_client``."""
    read = registry()
    if read is None:
        return None
    found = [
        (sample.name, dict(sample.labels), sample.value)
        for family in read.collect()
        if family.name.startswith("realtime_")
        for sample in family.samples
    ]
    return sorted(found, key=lambda s: (s[0], sorted(s[1].items())))


def outcome_of(reason: str) -> str:
    """The label of a refusal: ``Scope not found`` -> ``scope_not_found``."""
    return reason.lower().replace(" ", "_")
