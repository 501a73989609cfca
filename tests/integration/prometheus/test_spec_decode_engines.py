"""The accept length from SGLang's and TensorRT-LLM's speculative-decoding counters, read by
the traffic PromQL against a real Prometheus and by the replay path from the same scrapes
(issue 35; vLLM's counters: test_traffic_observer.py).

One Prometheus (1 s scrapes) reads one exporter serving a frontend's requests and, per
namespace, one engine family's counters: SGLang's per-request counters (verify passes,
output tokens, requests), TensorRT-LLM's per-position drafted and accepted draft tokens,
and an SGLang deployment that does not speculate (output tokens and requests only).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.core.types import MissingObservation, TrafficObservation
from disagg_planner.observe import (
    PrometheusTrafficObserver,
    snapshot_from_text,
    traffic_from_snapshots,
)
from tests.integration.conftest import PrometheusFactory, PrometheusServer
from tests.integration.prometheus.exporter import FrontendExporter, Requests
from tests.integration.prometheus.test_traffic_observer import (
    assert_same_observation,
    wait_for_generation,
)

MODEL = "Llama-3.1-8B"
REQUESTS = Requests(n=10, ttft_s=0.25, itl_s=1 / 64, isl=1000, osl=31, duration_s=1.0)


@dataclass(frozen=True)
class Windows:
    prometheus: PrometheusServer
    exporter: FrontendExporter
    window: tuple[float, float]  # (start_s, end_s): scrapes of the baseline and the traffic
    baseline: int
    traffic: int

    def live(self, namespace: str) -> TrafficObservation | MissingObservation:
        start, end = self.window
        config = PlannerConfig(
            model_name=MODEL,
            namespace=namespace,
            metric_pulling_prometheus_endpoint=self.prometheus.url,
        )
        with PrometheusTrafficObserver(config) as observer:
            return observer.observe(end_s=end, duration_s=round((end - start) * 1000) / 1000)

    def replay(self, namespace: str) -> TrafficObservation | MissingObservation:
        start, end = self.window
        return traffic_from_snapshots(
            start=snapshot_from_text(self.exporter.texts[self.baseline]),
            end=snapshot_from_text(self.exporter.texts[self.traffic]),
            start_s=start,
            end_s=end,
            model_name=MODEL,
            namespace=namespace,
        )


def _record(exporter: FrontendExporter, scale: int) -> None:
    for namespace in ("dyn-sglang", "dyn-trtllm", "dyn-plain"):
        exporter.record(REQUESTS, model=MODEL, namespace=namespace)
    # SGLang: 10 requests of 31 tokens, the first from prefill, 100 verify passes emitting
    # the other 300: 3 tokens per pass
    exporter.record_sglang(
        verify=100 * scale, generated=310 * scale, requests=10 * scale, model=MODEL,
        namespace="dyn-sglang",
    )  # fmt: skip
    # TensorRT-LLM: 200 steps (position 0 drafted 200 times), 160 + 120 + 60 drafts kept
    exporter.record_trtllm(
        drafted=[200 * scale, 200 * scale, 150 * scale],
        accepted=[160 * scale, 120 * scale, 60 * scale],
        model=MODEL,
        namespace="dyn-trtllm",
    )
    # SGLang without speculative decoding: its generic counters only
    exporter.record_sglang(
        verify=None, generated=310, requests=10, model=MODEL, namespace="dyn-plain"
    )


@pytest.fixture(scope="module")
def windows(module_prometheus_factory: PrometheusFactory) -> Iterator[Windows]:
    exporter = FrontendExporter()
    try:
        _record(exporter, scale=3)  # history before the window
        baseline = exporter.publish()
        prometheus = module_prometheus_factory([exporter.target])
        wait_for_generation(prometheus, exporter)
        _record(exporter, scale=1)
        traffic = exporter.publish()
        wait_for_generation(prometheus, exporter)
        scrapes = prometheus.samples(
            f'planner_test_exporter_generation{{instance="{exporter.target}"}}'
        )
        start = max(t for t, g in scrapes if g == baseline)
        end = min(t for t, g in scrapes if g == traffic)
        yield Windows(prometheus, exporter, (start, end), baseline, traffic)
    finally:
        exporter.close()


@pytest.mark.parametrize(
    ("namespace", "accept"),
    [
        pytest.param("dyn-sglang", 300 / 100, id="sglang: (generated - requests) / verify"),
        pytest.param("dyn-trtllm", 1 + 340 / 200, id="trtllm: 1 + accepted / position 0"),
    ],
)
def test_accept_length_from_each_engines_counters(
    windows: Windows, namespace: str, accept: float
) -> None:
    live = windows.live(namespace)
    assert isinstance(live, TrafficObservation), live
    assert live.num_req == 10
    assert live.accept_length == pytest.approx(accept, rel=1e-9)
    assert live.accept_length_missing is None
    assert_same_observation(live, windows.replay(namespace))


def test_an_engine_that_does_not_speculate_says_nothing(windows: Windows) -> None:
    # SGLang's output-token and request counters exist without speculative decoding
    live = windows.live("dyn-plain")
    assert isinstance(live, TrafficObservation), live
    assert (live.accept_length, live.accept_length_missing) == (None, None)
    assert_same_observation(live, windows.replay("dyn-plain"))
