"""Issue 35, "Worker shutdown metrics": a leaving worker that is shutting down reports its
staged shutdown on its own metrics page (``dynamo_component_shutdown_*``, on the pod's
``DYN_SYSTEM_PORT``). The drain reads it: such a worker has drained once it reports no request
in flight and KV transfers quiescent (whatever its FPM says), and the drain does not wait past
the worker's own total budget. Without a usable reading (no page, not shutting down, a
missing or NaN value, KV quiescence unknown) its FPM decide, as before, with the reason
logged.

The pages are real ``prometheus_client`` gauges served over HTTP by a test server; the
cluster is kmock with the SimulatedDynamo of conftest, the connector the real one."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from disagg_planner.connectors.kubernetes import KubernetesConnector
from disagg_planner.connectors.kubernetes.drain import DrainEnd
from disagg_planner.signals.shutdown import (
    INFLIGHT_REQUESTS,
    KV_QUIESCENT,
    REMAINING_SECONDS,
    STAGE_SECONDS,
    SYSTEM_PORT_ENV,
)
from tests.integration.connectors.conftest import (
    NS,
    PODS,
    Cluster,
    FakeTime,
    frontend,
    k8s_settings,
    worker,
)

pytestmark = pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")

PREFILL = "prefill-pool"
DYNAMO_LABELS = ("dynamo_namespace", "dynamo_component", "dynamo_endpoint")
Page = Callable[[float], str]  # fake time -> the worker's /metrics text


def shutdown_page(*, stage: str | None, inflight: float, kv: float, remaining_s: float) -> str:
    """A worker's page in shutdown (``stage``: the last stage that reported; None: not
    shutting down, only the gauges without a stage series)."""
    reg = CollectorRegistry()
    labels = ("ns", PREFILL.lower(), "generate")
    if stage is not None:
        Gauge(
            STAGE_SECONDS, "stage time", (*DYNAMO_LABELS, "stage", "reason"), registry=reg
        ).labels(*labels, stage, "completed").set(1.5)
    Gauge(INFLIGHT_REQUESTS, "in flight", DYNAMO_LABELS, registry=reg).labels(*labels).set(inflight)
    Gauge(KV_QUIESCENT, "kv", DYNAMO_LABELS, registry=reg).labels(*labels).set(kv)
    Gauge(REMAINING_SECONDS, "left", DYNAMO_LABELS, registry=reg).labels(*labels).set(remaining_s)
    return generate_latest(reg).decode()


class WorkerPages:
    """One HTTP server standing for the system port of the leaving worker: it serves
    ``page(now)`` of the fake clock."""

    def __init__(self, time: FakeTime) -> None:
        self.page: Page = lambda _now: ""
        self.reads = 0
        pages = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                pages.reads += 1
                body = pages.page(time.now).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def pages(fake_time: FakeTime) -> Iterator[WorkerPages]:
    served = WorkerPages(fake_time)
    yield served
    served.close()


def deploy(cluster: Cluster, time: FakeTime, port: int | None) -> tuple[str, str]:
    """Two ready prefill pods; the first (the one that leaves: FPM say it is the less
    loaded) serves its metrics on ``port`` (None: its container sets no system port)."""
    cluster.add_dgd(
        {"Frontend": frontend(), PREFILL: worker("prefill", 2), "decode": worker("decode", 1)}
    )
    dynamo = cluster.simulate_dynamo(time, ready=True)
    first, second = (p.name for p in dynamo.pods if p.service == PREFILL)
    env = [] if port is None else [{"name": SYSTEM_PORT_ENV, "value": str(port)}]
    cluster.kmock.objects[PODS, NS, first].patch(
        {
            "spec": {"containers": [{"name": "main", "env": env}]},
            "status": {"podIP": "127.0.0.1"},
        }
    )
    return first, second


def connector(
    api_client: Any, time: FakeTime, loads: Callable[[], dict[str, int]], timeout_s: float
) -> KubernetesConnector:
    conn = KubernetesConnector(
        k8s_settings(kubernetes_drain_timeout_seconds=timeout_s),
        api_client=api_client,
        clock=time.clock,
        sleep=time.sleep,
    )
    conn.use_worker_loads(loads)
    return conn


async def drain(
    cluster: Cluster,
    api_client: Any,
    time: FakeTime,
    loads: Callable[[str, str], dict[str, int]],
    *,
    port: int | None,
    timeout_s: float = 30.0,
) -> tuple[DrainEnd | None, float, str]:
    """Scale the prefill pool 2 -> 1 and follow the drain: which signal ended it, after how
    long (fake seconds), and which pod left."""
    first, second = deploy(cluster, time, port)
    conn = connector(api_client, time, lambda: loads(first, second), timeout_s)
    start = time.now
    await conn.set_replicas({"prefill": 1})
    end = await conn.drained()
    assert cluster.dynamo is not None and cluster.dynamo.removed == [first]
    return end, time.now - start, first


async def test_the_workers_shutdown_metrics_end_the_drain_before_its_fpm_would(
    cluster: Cluster, api_client: Any, fake_time: FakeTime, pages: WorkerPages
) -> None:
    """Its FPM still say 1 in flight (their last report); its shutdown page says it finished
    at +2 s and its KV transfers are quiescent: the drain ends then, not at the timeout."""
    t0 = fake_time.now
    pages.page = lambda now: shutdown_page(
        stage="inflight", inflight=0 if now >= t0 + 2 else 3, kv=1, remaining_s=25
    )
    end, waited, _ = await drain(
        cluster, api_client, fake_time, lambda a, b: {a: 1, b: 4}, port=pages.port
    )
    assert end is DrainEnd.SHUTDOWN_IDLE
    assert 2.0 <= waited < 2.6


async def test_kv_transfers_still_busy_hold_the_drain_though_nothing_is_in_flight(
    cluster: Cluster, api_client: Any, fake_time: FakeTime, pages: WorkerPages
) -> None:
    """FPM (and the page) say no request in flight, but a decode peer still reads its KV
    until +3 s: leaving earlier would free GPU memory mid-transfer."""
    t0 = fake_time.now
    pages.page = lambda now: shutdown_page(
        stage="kv_transfer", inflight=0, kv=1 if now >= t0 + 3 else 0, remaining_s=20
    )
    end, waited, _ = await drain(
        cluster, api_client, fake_time, lambda a, b: {a: 0, b: 4}, port=pages.port
    )
    assert end is DrainEnd.SHUTDOWN_IDLE
    assert 3.0 <= waited < 3.6


async def test_the_drain_does_not_wait_past_the_workers_own_budget(
    cluster: Cluster, api_client: Any, fake_time: FakeTime, pages: WorkerPages, caplog: Any
) -> None:
    """The worker stays busy with 4 s left of its total budget: after those 4 s it cancels
    the rest and exits, so the drain (timeout 30 s) ends there, saying so."""
    pages.page = lambda _now: shutdown_page(stage="inflight", inflight=2, kv=0, remaining_s=4)
    with caplog.at_level(logging.INFO, logger="disagg_planner.connectors.kubernetes"):
        end, waited, first = await drain(
            cluster, api_client, fake_time, lambda a, b: {a: 2, b: 4}, port=pages.port
        )
    assert end is DrainEnd.WORKER_BUDGET
    assert 4.0 <= waited < 4.6
    assert any(
        "ended by worker_budget" in r.getMessage()
        and f"{first} 2 in flight, KV transfers busy (shutdown metrics)" in r.getMessage()
        for r in caplog.records
    ), caplog.text


async def test_the_drain_timeout_caps_the_workers_budget(
    cluster: Cluster, api_client: Any, fake_time: FakeTime, pages: WorkerPages
) -> None:
    pages.page = lambda _now: shutdown_page(stage="inflight", inflight=2, kv=0, remaining_s=25)
    end, waited, _ = await drain(
        cluster, api_client, fake_time, lambda a, b: {a: 2, b: 4}, port=pages.port, timeout_s=3
    )
    assert end is DrainEnd.TIMEOUT
    assert 3.0 <= waited < 3.6


NAN = float("nan")


@pytest.mark.parametrize(
    ("page", "reason"),
    [
        # Before SIGTERM no stage has reported: the zero gauges prove nothing.
        (shutdown_page(stage=None, inflight=0, kv=1, remaining_s=30), "not shutting down"),
        (shutdown_page(stage="inflight", inflight=NAN, kv=1, remaining_s=30), "not a finite"),
        (
            shutdown_page(stage="kv_transfer", inflight=0, kv=-1, remaining_s=30),
            "KV quiescence unknown",
        ),
        ("this is not an exposition page {", "not Prometheus text"),
        (
            "\n".join(
                line
                for line in shutdown_page(stage="inflight", inflight=0, kv=1, remaining_s=9).split(
                    "\n"
                )
                if KV_QUIESCENT not in line
            ),
            f"{KV_QUIESCENT} is missing",
        ),
    ],
    ids=["not_shutting_down", "nan", "kv_unknown", "garbage", "missing_gauge"],
)
async def test_without_a_usable_reading_the_fpm_decide_and_the_log_says_why(
    cluster: Cluster,
    api_client: Any,
    fake_time: FakeTime,
    pages: WorkerPages,
    caplog: Any,
    page: str,
    reason: str,
) -> None:
    """The page says "drained" or cannot tell; the worker's FPM say 1 in flight until +5 s:
    the drain follows the FPM (today's behaviour), and logs once why the page was not used
    (at debug level for a worker not shutting down yet, the usual case; else at info)."""
    pages.page = lambda _now: page
    t0 = fake_time.now
    with caplog.at_level(logging.DEBUG, logger="disagg_planner.connectors.kubernetes"):
        end, waited, first = await drain(
            cluster,
            api_client,
            fake_time,
            lambda a, b: {a: 0 if fake_time.now >= t0 + 5 else 1, b: 4},
            port=pages.port,
        )
    assert end is DrainEnd.IDLE
    assert 5.0 <= waited < 5.6
    assert pages.reads > 1
    notes = [r for r in caplog.records if "metrics are not used" in r.getMessage()]
    assert len(notes) == 1, [r.getMessage() for r in notes]
    assert first in notes[0].getMessage() and reason in notes[0].getMessage()
    quiet = reason == "not shutting down"
    assert notes[0].levelno == (logging.DEBUG if quiet else logging.INFO)


@pytest.mark.parametrize("port", [None, "closed"], ids=["no_system_port", "unreachable"])
async def test_a_worker_without_a_reachable_page_is_judged_by_its_fpm(
    cluster: Cluster, api_client: Any, fake_time: FakeTime, port: str | None, caplog: Any
) -> None:
    if port == "closed":  # a port nothing listens on
        idle = WorkerPages(fake_time)
        number: int | None = idle.port
        idle.close()
    else:
        number = None
    t0 = fake_time.now
    with caplog.at_level(logging.INFO, logger="disagg_planner.connectors.kubernetes"):
        end, waited, _ = await drain(
            cluster,
            api_client,
            fake_time,
            lambda a, b: {a: 0 if fake_time.now >= t0 + 1 else 1, b: 4},
            port=number,
        )
    assert (end, 1.0 <= waited < 1.6) == (DrainEnd.IDLE, True)
    expected = "no metrics page known" if number is None else "unreachable"
    assert any(expected in r.getMessage() for r in caplog.records), caplog.text
