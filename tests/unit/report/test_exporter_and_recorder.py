"""Planner gauges over real HTTP, health endpoints, and the diagnostics recorder's files."""

from __future__ import annotations

import gzip
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from disagg_planner.exporter import HealthState, MetricsServer, PlannerMetrics
from disagg_planner.report.recorder import DiagnosticsRecorder, EngineQueues, TickSnapshot


def snap(t: float, *, engines: tuple[EngineQueues, ...] = (), **kw) -> TickSnapshot:
    base = dict(
        t_s=t,
        desired={"prefill": 2, "decode": 3},
        ready={"prefill": 2, "decode": 2},
        gpus_in_use=5,
        gpu_hours=t / 3600 * 5,
    )
    base.update(kw)
    return TickSnapshot(engines=engines, **base)


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


@pytest.fixture
def served():
    metrics, health = PlannerMetrics(), HealthState()
    server = MetricsServer(metrics, health, host="127.0.0.1", port=0).start()
    yield metrics, health, server.port
    server.stop()


def test_gauges_are_labelled_per_deployment_and_engines_expire(served) -> None:
    metrics, _, port = served
    engine = EngineQueues("prefill", "w1", 0, 512, 0, 0)
    metrics.publish(
        "ns",
        "a",
        snap(
            60,
            engines=(engine,),
            observed_rps=4.0,
            scale_to={"prefill": 3, "decode": 3},
            throughput_reason="scale",
        ),
    )
    metrics.publish("ns", "b", snap(60, observed_rps=9.0))
    got = scrape(port)
    assert (
        got[("dynamo_planner_observed_requests_per_second", (("dgd", "a"), ("namespace", "ns")))]
        == 4.0
    )
    assert (
        got[("dynamo_planner_observed_requests_per_second", (("dgd", "b"), ("namespace", "ns")))]
        == 9.0
    )
    assert got[("dynamo_planner_num_decode_replicas", (("dgd", "a"), ("namespace", "ns")))] == 2
    assert (
        got[("dynamo_planner_predicted_num_prefill_replicas", (("dgd", "a"), ("namespace", "ns")))]
        == 3
    )
    assert (
        got[
            (
                "dynamo_planner_throughput_scaling_decision",
                (
                    ("dgd", "a"),
                    ("dynamo_planner_throughput_scaling_decision", "scale"),
                    ("namespace", "ns"),
                ),
            )
        ]
        == 1
    )
    key = (
        "dynamo_planner_engine_queued_prefill_tokens",
        (
            ("dgd", "a"),
            ("dp_rank", "0"),
            ("namespace", "ns"),
            ("role", "prefill"),
            ("worker_id", "w1"),
        ),
    )
    assert got[key] == 512
    metrics.publish("ns", "a", snap(65))  # the engine vanished
    assert key not in scrape(port)
    metrics.forget("ns", "b")
    assert not [k for k in scrape(port) if ("dgd", "b") in k[1]]


def test_readyz_turns_ready_after_first_observation(served) -> None:
    _, health, port = served
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5)
    assert info.value.code == 503
    assert urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).status == 200
    health.mark_ready()
    assert urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5).status == 200


def test_recorder_writes_periodic_reports_and_a_complete_log(tmp_path: Path) -> None:
    rec = DiagnosticsRecorder(
        output_dir=tmp_path,
        report_interval_hours=1 / 60,
        filename="run",
        ttft_slo_ms=500,
        itl_slo_ms=20,
    )
    written = [rec.record(snap(float(t), observed_ttft_ms=float("nan"))) for t in range(0, 150, 10)]
    assert [p for p in written if p] == [tmp_path / "run.html"] * 2  # at 60 s and 120 s
    rec.finalize()
    html = (tmp_path / "run.html").read_text()
    assert "Replicas per role" in html and "plotly" in html.lower()
    with gzip.open(tmp_path / "run.log.jsonl.gz", "rt") as handle:
        rows = [json.loads(line) for line in handle]
    assert [r["t_s"] for r in rows] == [float(t) for t in range(0, 150, 10)]
    assert rows[0]["observed_ttft_ms"] is None  # NaN never reaches JSON
