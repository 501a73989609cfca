"""Issue 35, "Worker shutdown metrics": Dynamo's worker enters its staged shutdown on
SIGTERM (router grace, requests in flight, KV-transfer quiescence, cleanup, one total budget)
and only then reports it on its own metrics page (``dynamo_component_shutdown_*``, on the
pod's ``DYN_SYSTEM_PORT``). So a leaving worker whose page carries those gauges (or whose
container declares the budget by its current name) has its count lowered FIRST, and the
connector follows the terminating worker through its stages: the drain ends when it reports
no request in flight and KV transfers quiescent, a stage past serving, or its total budget
spent (the GPUs it holds stay counted until its pod is gone). A worker without them keeps
today's order: its FPM are waited for, then the count is lowered.

The pages are real ``prometheus_client`` gauges served over HTTP by a test server per pod,
showing stages only once the simulated operator has told that pod to terminate; the cluster
is kmock with the SimulatedDynamo of conftest, the connector the real one."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from disagg_planner.connectors.base import HoldReason
from disagg_planner.connectors.kubernetes import KubernetesConnector
from disagg_planner.connectors.kubernetes.drain import DrainEnd
from disagg_planner.signals.shutdown import (
    INFLIGHT_REQUESTS,
    KV_QUIESCENT,
    REMAINING_SECONDS,
    STAGE_SECONDS,
    SYSTEM_PORT_ENV,
    TOTAL_BUDGET_ENV,
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
LOGGER = "disagg_planner.connectors.kubernetes"
# fake time now, seconds since its SIGTERM (None: not told to stop) -> the worker's page
Page = Callable[[float, float | None], str]


def shutdown_page(
    *, stages: tuple[tuple[str, str], ...], inflight: float, kv: float, remaining_s: float
) -> str:
    """A worker's page with the shutdown gauges: ``stages`` the (stage, outcome) series
    reported so far (none: not shutting down, the gauges as registered at start)."""
    reg = CollectorRegistry()
    labels = ("ns", PREFILL.lower(), "generate")
    if stages:
        gauge = Gauge(
            STAGE_SECONDS, "stage time", (*DYNAMO_LABELS, "stage", "reason"), registry=reg
        )
        for stage, outcome in stages:
            gauge.labels(*labels, stage, outcome).set(1.5)
    Gauge(INFLIGHT_REQUESTS, "in flight", DYNAMO_LABELS, registry=reg).labels(*labels).set(inflight)
    Gauge(KV_QUIESCENT, "kv", DYNAMO_LABELS, registry=reg).labels(*labels).set(kv)
    Gauge(REMAINING_SECONDS, "left", DYNAMO_LABELS, registry=reg).labels(*labels).set(remaining_s)
    return generate_latest(reg).decode()


BEFORE_SIGTERM = shutdown_page(stages=(), inflight=0, kv=-1, remaining_s=30)


def staged(after: Callable[[float], str] | str) -> Page:
    """A staged worker's page: the gauges alone before SIGTERM, then ``after`` (a page, or
    one per second since SIGTERM)."""

    def page(_now: float, since: float | None) -> str:
        if since is None:
            return BEFORE_SIGTERM
        return after if isinstance(after, str) else after(since)

    return page


def quiescent_after(seconds: float, *, remaining_s: float) -> Callable[[float], str]:
    """Nothing in flight; a decode peer reads its KV until ``seconds`` after SIGTERM."""
    return lambda since: shutdown_page(
        stages=(("kv_transfer", "started"),),
        inflight=0,
        kv=1 if since >= seconds else 0,
        remaining_s=remaining_s,
    )


# An older worker: its page has Dynamo's usual metrics and no shutdown gauge.
OLD_WORKER_PAGE = (
    "# TYPE dynamo_component_requests_total counter\ndynamo_component_requests_total 7\n"
)


class WorkerPage:
    """One HTTP server standing for one pod's system port: it serves ``page(now, since)``
    of the fake clock, ``since`` the seconds since the simulated operator told the pod to
    terminate (None before); a pod gone answers nothing (404)."""

    def __init__(self, cluster: Cluster, time: FakeTime) -> None:
        self.page: Page = lambda _now, _since: OLD_WORKER_PAGE
        self.pod = ""
        self.reads = 0
        served = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                served.reads += 1
                dynamo = cluster.dynamo
                assert dynamo is not None
                if served.pod not in {p.name for p in dynamo.pods}:
                    self.send_response(404)
                    self.end_headers()
                    return
                sigterm = dynamo.sigterm_at.get(served.pod)
                since = None if sigterm is None else time.now - sigterm
                body = served.page(time.now, since).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        # polled every 0.05 s, not 0.5 s: close() waits for the loop to see its shutdown
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def pages(cluster: Cluster, fake_time: FakeTime) -> Iterator[tuple[WorkerPage, WorkerPage]]:
    served = (WorkerPage(cluster, fake_time), WorkerPage(cluster, fake_time))
    yield served
    for page in served:
        page.close()


def deploy(
    cluster: Cluster,
    time: FakeTime,
    pages: tuple[WorkerPage, WorkerPage],
    *,
    env: dict[str, str] | None = None,
    system_port: bool = True,
    honours_deletion_cost: bool = True,
    grace_s: float = 60.0,
) -> tuple[str, str]:
    """Two ready prefill pods, each serving its metrics page (``system_port``: its container
    sets DYN_SYSTEM_PORT) with ``env`` besides; their pods stay terminating ``grace_s``."""
    cluster.add_dgd(
        {"Frontend": frontend(), PREFILL: worker("prefill", 2), "decode": worker("decode", 1)}
    )
    dynamo = cluster.simulate_dynamo(
        time, ready=True, grace_s=grace_s, honours_deletion_cost=honours_deletion_cost
    )
    names = tuple(p.name for p in dynamo.pods if p.service == PREFILL)
    for name, page in zip(names, pages, strict=True):
        page.pod = name
        variables = dict(env or {})
        if system_port:
            variables[SYSTEM_PORT_ENV] = str(page.port)
        cluster.kmock.objects[PODS, NS, name].patch(
            {
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "env": [{"name": k, "value": v} for k, v in variables.items()],
                        }
                    ]
                },
                "status": {"podIP": "127.0.0.1"},
            }
        )
    first, second = names
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


async def scale_down(
    cluster: Cluster,
    conn: KubernetesConnector,
    time: FakeTime,
) -> tuple[Any, list[str], DrainEnd | None, float]:
    """Scale the prefill pool 2 -> 1: the outcome, the pods the operator had told to
    terminate when the call returned, which signal ended the drain and after how long."""
    assert cluster.dynamo is not None
    start = time.now
    outcome = await conn.set_replicas({"prefill": 1})
    removed_at_once = list(cluster.dynamo.removed)
    end = await conn.drained()
    return outcome, removed_at_once, end, time.now - start


def fpm_busy_for(
    seconds: float, first: str, second: str, time: FakeTime
) -> Callable[[], dict[str, int]]:
    """FPM: ``first`` serves 1 request for ``seconds`` from now, ``second`` 4 throughout."""
    t0 = time.now
    return lambda: {first: 0 if time.now >= t0 + seconds else 1, second: 4}


def ended_by(caplog: Any, end: DrainEnd) -> list[str]:
    return [r.getMessage() for r in caplog.records if f"ended by {end.value}" in r.getMessage()]


async def test_a_staged_worker_is_lowered_first_and_followed_until_kv_quiescent(
    cluster: Cluster,
    api_client: Any,
    fake_time: FakeTime,
    pages: tuple[WorkerPage, WorkerPage],
    caplog: Any,
) -> None:
    """Its page carries the shutdown gauges: the count drops at once (no wait before
    SIGTERM), then the worker serves 2 requests, and a decode peer reads its KV until 3 s
    after SIGTERM; its last FPM still say 1 in flight. The drain ends on its KV quiescence."""
    first, second = deploy(cluster, fake_time, pages)

    def after(since: float) -> str:
        if since < 3.0:
            return shutdown_page(
                stages=(("unregister", "completed"), ("inflight", "started")),
                inflight=2,
                kv=0,
                remaining_s=30 - since,
            )
        return shutdown_page(
            stages=(("inflight", "completed"), ("kv_transfer", "completed")),
            inflight=0,
            kv=1,
            remaining_s=27,
        )

    pages[0].page = staged(after)
    conn = connector(api_client, fake_time, lambda: {first: 1, second: 4}, timeout_s=30)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        outcome, removed_at_once, end, waited = await scale_down(cluster, conn, fake_time)
    assert (outcome.applied, outcome.held, removed_at_once) == ({"prefill": 1}, {}, [first])
    assert cluster.replicas(PREFILL) == 1
    assert end is DrainEnd.KV_QUIESCENT
    assert 3.0 <= waited < 3.6
    (line,) = ended_by(caplog, DrainEnd.KV_QUIESCENT)
    assert first in line and "its count was lowered first" in line
    # its GPUs still count while its pod terminates (cleanup follows the drain's end)
    assert (await conn.releasing_replicas())["prefill"] == 1


@pytest.mark.parametrize("system_port", [True, False], ids=["page", "no_page"])
async def test_the_follow_ends_with_the_workers_declared_budget(
    cluster: Cluster,
    api_client: Any,
    fake_time: FakeTime,
    pages: tuple[WorkerPage, WorkerPage],
    caplog: Any,
    system_port: bool,
) -> None:
    """The worker declares an 8 s total budget (Dynamo's current name) and stays busy (KV
    transfers busy): 8 s after its SIGTERM it cancels the rest and exits, so the follow
    ends there, not at the drain timeout (30 s). Without a page the declared budget alone
    both says the worker has the staged shutdown and bounds the follow."""
    first, second = deploy(
        cluster, fake_time, pages, env={TOTAL_BUDGET_ENV: "8"}, system_port=system_port
    )
    pages[0].page = staged(
        shutdown_page(stages=(("inflight", "started"),), inflight=2, kv=0, remaining_s=8)
    )
    conn = connector(api_client, fake_time, lambda: {first: 2, second: 4}, timeout_s=30)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        outcome, removed_at_once, end, waited = await scale_down(cluster, conn, fake_time)
    assert (outcome.applied, removed_at_once) == ({"prefill": 1}, [first])
    assert end is DrainEnd.WORKER_BUDGET
    assert 8.0 <= waited < 8.6
    (line,) = ended_by(caplog, DrainEnd.WORKER_BUDGET)
    assert TOTAL_BUDGET_ENV in line


async def test_without_shutdown_metrics_the_fpm_are_waited_for_before_lowering(
    cluster: Cluster,
    api_client: Any,
    fake_time: FakeTime,
    pages: tuple[WorkerPage, WorkerPage],
    caplog: Any,
) -> None:
    """An older worker (no shutdown gauge on its page, no budget declared): today's order.
    The role is held, saying why; its FPM say 1 in flight until +5 s; then the count drops.
    The log names the reason its page was not used."""
    first, second = deploy(cluster, fake_time, pages)
    conn = connector(api_client, fake_time, fpm_busy_for(5.0, first, second, fake_time), 30)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        outcome, removed_at_once, end, waited = await scale_down(cluster, conn, fake_time)
    assert (outcome.applied, removed_at_once) == ({}, [])
    hold = outcome.held["prefill"]
    assert hold.reason is HoldReason.DRAINING
    assert "before the count is lowered (no staged-shutdown metrics" in hold.detail
    assert (end, 5.0 <= waited < 5.6) == (DrainEnd.IDLE, True)
    assert cluster.dynamo is not None and cluster.dynamo.removed == [first]
    assert any(
        first in r.getMessage() and "no dynamo_component_shutdown_* gauge" in r.getMessage()
        for r in caplog.records
    ), caplog.text


async def test_kv_transfers_still_busy_hold_the_follow_though_nothing_is_in_flight(
    cluster: Cluster, api_client: Any, fake_time: FakeTime, pages: tuple[WorkerPage, WorkerPage]
) -> None:
    """FPM (and the page) say no request in flight, but a decode peer still reads its KV
    until 3 s after SIGTERM: the follow goes on until then."""
    first, second = deploy(cluster, fake_time, pages)
    pages[0].page = staged(quiescent_after(3.0, remaining_s=20))
    conn = connector(api_client, fake_time, lambda: {first: 0, second: 4}, timeout_s=30)
    _, _, end, waited = await scale_down(cluster, conn, fake_time)
    assert (end, 3.0 <= waited < 3.6) == (DrainEnd.KV_QUIESCENT, True)


@pytest.mark.parametrize(
    ("after_sigterm", "expected"),
    [
        # a Python worker cannot tell KV quiescence (-1): it reports its stages
        (
            shutdown_page(
                stages=(("kv_transfer", "unsupported"), ("cleanup", "started")),
                inflight=0,
                kv=-1,
                remaining_s=4,
            ),
            DrainEnd.SHUTDOWN_STAGE,
        ),
        (
            shutdown_page(stages=(("inflight", "completed"),), inflight=0, kv=-1, remaining_s=20),
            DrainEnd.INFLIGHT_ZERO,
        ),
    ],
    ids=["teardown_stage", "inflight_zero_kv_unknown"],
)
async def test_the_follow_says_which_shutdown_signal_ended_it(
    cluster: Cluster,
    api_client: Any,
    fake_time: FakeTime,
    pages: tuple[WorkerPage, WorkerPage],
    after_sigterm: str,
    expected: DrainEnd,
) -> None:
    first, second = deploy(cluster, fake_time, pages)
    pages[0].page = staged(after_sigterm)
    conn = connector(api_client, fake_time, lambda: {first: 1, second: 4}, timeout_s=30)
    _, removed_at_once, end, _ = await scale_down(cluster, conn, fake_time)
    assert (removed_at_once, end) == ([first], expected)


async def test_the_drain_timeout_caps_the_follow(
    cluster: Cluster, api_client: Any, fake_time: FakeTime, pages: tuple[WorkerPage, WorkerPage]
) -> None:
    first, second = deploy(cluster, fake_time, pages)
    pages[0].page = staged(
        shutdown_page(stages=(("inflight", "started"),), inflight=2, kv=0, remaining_s=25)
    )
    conn = connector(api_client, fake_time, lambda: {first: 2, second: 4}, timeout_s=3)
    _, _, end, waited = await scale_down(cluster, conn, fake_time)
    assert (end, 3.0 <= waited < 3.6) == (DrainEnd.TIMEOUT, True)


async def test_the_pod_the_operator_removed_is_followed_when_it_ignores_the_deletion_cost(
    cluster: Cluster,
    api_client: Any,
    fake_time: FakeTime,
    pages: tuple[WorkerPage, WorkerPage],
    caplog: Any,
) -> None:
    """Grove's PodClique removes the newest pod whatever the deletion cost: the marked
    (first) pod stays, the second terminates; the follow reads the second's page (KV
    quiescent 2 s after its SIGTERM) and says so."""
    first, second = deploy(cluster, fake_time, pages, honours_deletion_cost=False)
    never_quiescent = shutdown_page(
        stages=(("inflight", "started"),), inflight=3, kv=0, remaining_s=30
    )
    pages[0].page = staged(never_quiescent)
    pages[1].page = staged(quiescent_after(2.0, remaining_s=28))
    conn = connector(api_client, fake_time, lambda: {first: 0, second: 4}, timeout_s=30)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        _, removed_at_once, end, waited = await scale_down(cluster, conn, fake_time)
    assert removed_at_once == [second]
    assert (end, 2.0 <= waited < 2.6) == (DrainEnd.KV_QUIESCENT, True)
    assert any(
        f"{first} was marked to leave but the operator removed {second}" in r.getMessage()
        for r in caplog.records
    ), caplog.text


NAN = float("nan")


@pytest.mark.parametrize(
    ("after_sigterm", "reason"),
    [
        (
            shutdown_page(stages=(("inflight", "started"),), inflight=NAN, kv=1, remaining_s=30),
            "not a finite",
        ),
        ("this is not an exposition page {", "not Prometheus text"),
        (
            "\n".join(
                line
                for line in shutdown_page(
                    stages=(("inflight", "started"),), inflight=0, kv=1, remaining_s=9
                ).split("\n")
                if KV_QUIESCENT not in line
            ),
            f"{KV_QUIESCENT} is missing",
        ),
    ],
    ids=["nan", "garbage", "missing_gauge"],
)
async def test_a_bad_page_after_sigterm_leaves_the_follow_to_the_fpm_and_says_why(
    cluster: Cluster,
    api_client: Any,
    fake_time: FakeTime,
    pages: tuple[WorkerPage, WorkerPage],
    caplog: Any,
    after_sigterm: str,
    reason: str,
) -> None:
    """The page went bad after SIGTERM; the worker's FPM say 1 in flight until +5 s: the
    follow ends on its FPM, and logs once why the page was not used."""
    first, second = deploy(cluster, fake_time, pages)
    pages[0].page = staged(after_sigterm)
    conn = connector(api_client, fake_time, fpm_busy_for(5.0, first, second, fake_time), 30)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        _, removed_at_once, end, waited = await scale_down(cluster, conn, fake_time)
    assert (removed_at_once, end, 5.0 <= waited < 5.6) == ([first], DrainEnd.IDLE, True)
    notes = [r for r in caplog.records if "metrics are not used" in r.getMessage()]
    assert len(notes) == 1, [r.getMessage() for r in notes]
    assert first in notes[0].getMessage() and reason in notes[0].getMessage()


async def test_an_increase_asked_with_the_lowering_waits_for_the_gpus_it_releases(
    cluster: Cluster, api_client: Any, fake_time: FakeTime, pages: tuple[WorkerPage, WorkerPage]
) -> None:
    """Prefill 2 -> 1 and decode 1 -> 2 in one request: prefill is lowered at once, decode
    held until the leaving worker's pod is gone (10 s: its GPUs held until then), the next
    tick's same plan keeps following; the GPUs in use never exceed the old or new total."""
    first, second = deploy(cluster, fake_time, pages, grace_s=10.0)
    pages[0].page = staged(quiescent_after(3.0, remaining_s=27))
    conn = connector(api_client, fake_time, lambda: {first: 0, second: 4}, timeout_s=30)
    plan = {"prefill": 1, "decode": 2}
    outcome = await conn.set_replicas(plan)
    assert outcome.applied == {"prefill": 1}
    assert outcome.held["decode"].reason is HoldReason.DRAINING
    assert first in outcome.held["decode"].detail
    again = await conn.set_replicas(plan)  # the next tick: the same plan, still waiting
    assert (again.unchanged, again.held["decode"].reason) == (("prefill",), HoldReason.DRAINING)
    assert await conn.drained() is DrainEnd.KV_QUIESCENT
    assert (cluster.replicas(PREFILL), cluster.replicas("decode")) == (1, 2)
    assert cluster.dynamo is not None
    assert max(cluster.dynamo.gpus_in_use({PREFILL: 1, "decode": 1})) <= 3
