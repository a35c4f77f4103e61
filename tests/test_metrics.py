"""Metrics an operator scrapes: real traffic through two real daphne workers sharing
``PROMETHEUS_MULTIPROC_DIR``, read from one worker's endpoint and from ``realtime_stats``;
and nothing breaks without ``prometheus_client``.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from prometheus_client.parser import text_string_to_metric_families

from realtime.auth import issue_token
from realtime.messages import new_mid, published_at
from realtime.metrics import close_label
from realtime.testing import in_thread
from tests.helpers import ROOT, WAIT, subprocess_env
from tests.live import FAST, Clients, Server, start_server
from tests.testapp.models import Contact, Membership, Workspace

pytestmark = pytest.mark.django_db(transaction=True)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def two_workers(tmp_path: Path, live_servers: Any) -> Iterator[tuple[Server, Server, Path]]:
    """Two daphne workers keeping their metrics in one directory, as on one host."""
    directory = tmp_path / "metrics"
    directory.mkdir()
    environ = {"PROMETHEUS_MULTIPROC_DIR": str(directory)}
    workers = [start_server(dict(FAST), environ=environ) for _ in range(2)]
    yield workers[0], workers[1], directory
    for worker in workers:
        worker.stop()


def scrape(server: Server) -> Samples:
    url = f"http://127.0.0.1:{server.port}/metrics"
    with urllib.request.urlopen(url, timeout=WAIT) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    return sum(
        found
        for (sample, sample_labels), found in samples.items()
        if sample == name and set(labels.items()) <= set(sample_labels)
    )


def per_worker(samples: Samples, name: str) -> list[float]:
    return sorted(found for (sample, _), found in samples.items() if sample == name)


async def one_socket_each(server: Server) -> Samples:
    """What ``server``'s endpoint shows once each of the two workers holds one socket."""
    async with asyncio.timeout(WAIT):
        while True:
            samples = await asyncio.to_thread(scrape, server)
            if per_worker(samples, "realtime_sockets_open") == [1, 1]:
                return samples
            await asyncio.sleep(0.05)


def make_members() -> tuple[Workspace, str, str]:
    acme = Workspace.objects.create(name="Acme", slug="acme")
    tokens = []
    for name in ("ann", "bob"):
        user = get_user_model().objects.create_user(username=name)
        Membership.objects.create(workspace=acme, user=user)
        tokens.append(issue_token(user))
    return acme, tokens[0], tokens[1]


async def test_the_metrics_endpoint_shows_every_worker_after_real_traffic(
    two_workers: tuple[Server, Server, Path], ws: Clients
) -> None:
    first, second, directory = two_workers
    acme, ann, bob = await in_thread(make_members)
    heard = {"scope": "acme", "channels": ["contact"]}  # subscribed before auth_success
    sockets = [
        await ws.authenticated(first, ann, **heard),
        await ws.authenticated(first, bob, **heard),
        await ws.authenticated(second, ann, **heard),
    ]
    refused = await ws.connect(second)
    assert (await refused.authenticate("forged"))["type"] == "auth_error"
    assert await refused.closed_with() == 1008
    await in_thread(Contact.objects.create, workspace=acme, name="Counted")
    for client in sockets:
        await client.wait_for(lambda f: f["type"] == "contact.created")
    await sockets[1].close()

    # Bob's close has been served once the first worker holds one socket.
    samples = await one_socket_each(first)
    assert value(samples, "realtime_handshakes_total", outcome="accepted") == 3
    assert value(samples, "realtime_handshakes_total", outcome="invalid_authentication_token") == 1
    assert value(samples, "realtime_closes_total", code="1008") == 1
    assert value(samples, "realtime_closes_total") == 2  # the refused socket, and bob's
    assert value(samples, "realtime_frames_sent_total") == 3
    assert value(samples, "realtime_commit_to_frame_seconds_count") == 2  # once per worker
    assert value(samples, "realtime_poll_seconds_count") > 0
    assert value(samples, "realtime_last_poll_timestamp_seconds") > 0
    # Either worker's endpoint reads the same files.
    assert value(await asyncio.to_thread(scrape, second), "realtime_frames_sent_total") == 3

    stats = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "manage.py", "realtime_stats"],
        cwd=ROOT,
        env={**subprocess_env(), "PROMETHEUS_MULTIPROC_DIR": str(directory)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "realtime_frames_sent_total 3" in stats.stdout
    assert 'realtime_handshakes_total{outcome="accepted"} 3' in stats.stdout


def test_commands_keep_counts_and_leave_no_worker_behind(tmp_path: Path) -> None:
    """realtime_trim, realtime_relay and realtime_stats, run with the workers' directory (as
    from cron): what they count shows, and none of them shows as a worker (a pid whose last
    poll is 0 would set off the stuck-poller alert), during or after."""
    from tests.test_commands import insert_old_rows

    insert_old_rows(3)
    env = {
        **subprocess_env(),
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
        "REALTIME_TEST_SETTINGS": '{"REALTIME_COMMIT_GRACE": 0.05}',
    }

    def manage(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return done.stdout

    assert "Deleted 3 expired messages." in manage("realtime_trim", "--retention", "0")
    assert "Relayed 0 announcement(s)." in manage("realtime_relay")
    manage("realtime_stats")
    shown = manage("realtime_stats").split("metrics:\n", 1)[1].splitlines()
    assert "  realtime_trimmed_rows_total 3" in shown
    gauges = (
        "realtime_sockets_open",
        "realtime_delivery_queue_depth",
        "realtime_last_poll_timestamp_seconds",
        "realtime_outbox_pending",
        "realtime_outbox_oldest_seconds",
    )
    assert [line for line in shown if line.strip().startswith(gauges)] == []


def test_a_message_id_says_when_it_was_published() -> None:
    import time

    before = time.time()
    mid = new_mid()
    assert len(mid) == 32
    published = published_at(mid)
    assert published is not None
    assert before - 0.001 <= published <= time.time() + 0.001
    assert published_at("0123456789abcdef0123456789abcdef") is None  # years away: a UUID's
    assert published_at("f" * 32) is None
    assert published_at(None) is None


WITHOUT_PROMETHEUS = textwrap.dedent(
    """
    import sys
    sys.modules["prometheus_client"] = None  # import prometheus_client now raises ImportError
    import django
    django.setup()
    from django.core.management import call_command
    from django.test import RequestFactory
    from realtime import metrics, views

    assert metrics.get() is None
    metrics.sockets_open(3)
    metrics.handshake("accepted")
    metrics.closed(1000)
    metrics.delivered(metrics.published_at("x"), 2)
    metrics.dropped("queue_full")
    metrics.queue_depth(4)
    metrics.polled(0.01)
    metrics.listen_reconnected()
    metrics.trimmed(5)
    response = views.metrics(RequestFactory().get("/metrics"))
    assert response.status_code == 503, response.status_code
    call_command("realtime_stats")
    """
)


def test_without_prometheus_client_nothing_breaks() -> None:
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_PROMETHEUS],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "metrics:       prometheus_client is not installed" in result.stdout


def test_each_call_counts_in_its_own_metric() -> None:
    from prometheus_client import REGISTRY

    from realtime import metrics

    def read(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    before = {
        "reconnects": read("realtime_listen_reconnects_total"),
        "trimmed": read("realtime_trimmed_rows_total"),
        "dropped": read("realtime_frames_dropped_total", reason="queue_full"),
        "polls": read("realtime_poll_seconds_count"),
        "lag": read("realtime_commit_to_frame_seconds_count"),
        "sent": read("realtime_frames_sent_total"),
    }
    metrics.listen_reconnected()
    metrics.trimmed(7)
    metrics.trimmed(0)
    metrics.dropped("queue_full", 2)
    metrics.polled(0.003)
    metrics.delivered(new_mid(), 5)
    metrics.delivered("not-a-timed-id", 1)  # counted, but no lag to observe
    metrics.queue_depth(4)
    metrics.sockets_open(9)
    assert read("realtime_listen_reconnects_total") == before["reconnects"] + 1
    assert read("realtime_trimmed_rows_total") == before["trimmed"] + 7
    assert read("realtime_frames_dropped_total", reason="queue_full") == before["dropped"] + 2
    # A table poller of an earlier test of this process may still be finishing a poll (its
    # stop is asked, not waited for): it may add one of its own meanwhile.
    assert read("realtime_poll_seconds_count") >= before["polls"] + 1
    assert read("realtime_commit_to_frame_seconds_count") == before["lag"] + 1
    assert read("realtime_frames_sent_total") == before["sent"] + 6
    assert read("realtime_delivery_queue_depth") == 4
    assert read("realtime_sockets_open") == 9


def test_a_close_code_a_client_chooses_is_counted_as_other() -> None:
    from prometheus_client import REGISTRY

    from realtime import metrics

    def read(code: str) -> float:
        return REGISTRY.get_sample_value("realtime_closes_total", {"code": code}) or 0.0

    before = {code: read(code) for code in ("1008", "none", "other", "4321", "4999")}
    for code in (1008, None, 4321, 4999, 999, 2000):
        metrics.closed(code)
    assert read("1008") == before["1008"] + 1
    assert read("none") == before["none"] + 1
    assert read("other") == before["other"] + 4
    assert read("4321") == before["4321"] == 0
    assert read("4999") == before["4999"] == 0


async def test_a_worker_gone_drops_out_of_the_gauges_at_the_next_scrape(
    two_workers: tuple[Server, Server, Path], ws: Clients
) -> None:
    """A worker killed (no exit of its own) is dropped from the live gauges when another
    worker's endpoint is read: its sockets no longer count, its last poll no longer ages."""
    first, second, _ = two_workers
    _, ann, bob = await in_thread(make_members)
    await ws.authenticated(first, ann, scope="acme")
    await ws.authenticated(second, bob, scope="acme")
    await one_socket_each(first)

    second.process.kill()
    second.process.wait(WAIT)

    samples = await asyncio.to_thread(scrape, first)
    assert per_worker(samples, "realtime_sockets_open") == [1]
    polled = [
        labels for (name, labels) in samples if name == "realtime_last_poll_timestamp_seconds"
    ]
    assert polled == [(("pid", str(first.process.pid)),)]


@pytest.mark.parametrize(
    ("code", "label"),
    [
        (None, "none"),
        (1005, "none"),
        (1006, "none"),
        (1000, "1000"),
        (1012, "1012"),
        (4001, "other"),
    ],
)
def test_a_close_without_a_code_is_labelled_none_whichever_server_reports_it(
    code: int | None, label: str
) -> None:
    assert close_label(code) == label
