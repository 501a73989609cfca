"""Planner gauges over real HTTP, health endpoints, and the diagnostics recorder's files."""

from __future__ import annotations

import gzip
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from disagg_planner.report.recorder import BLOCK_TICKS, DiagnosticsRecorder, TickWindow
from disagg_planner.report.snapshot import EngineQueues, TickSnapshot
from disagg_planner.runtime.metrics import HealthState, MetricsServer, PlannerMetrics


def snap(t: float, *, engines: tuple[EngineQueues, ...] = (), **kw) -> TickSnapshot:
    base: dict[str, Any] = dict(
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


def test_recorder_writes_periodic_reports_and_the_window_log(tmp_path: Path) -> None:
    rec = DiagnosticsRecorder(
        output_dir=tmp_path,
        report_interval_hours=1 / 60,
        filename="run",
        ttft_slo_ms=500,
        itl_slo_ms=20,
    )
    written = [rec.record(snap(float(t), observed_ttft_ms=float("nan"))) for t in range(0, 150, 10)]
    assert [p for p in written if p] == [tmp_path / "run.html"] * 2  # at 60 s and 120 s
    html = (tmp_path / "run.html").read_text()
    assert "Replicas per role" in html and "plotly" in html.lower()
    with gzip.open(tmp_path / "run.log.jsonl.gz", "rt") as handle:
        rows = [json.loads(line) for line in handle]
    assert [r["t_s"] for r in rows] == [float(t) for t in range(0, 130, 10)]  # up to the report
    assert rows[0]["observed_ttft_ms"] is None  # NaN never reaches JSON


@pytest.mark.slow
def test_the_window_keeps_a_day_of_compact_ticks_however_long_the_run() -> None:
    """Issue 36 item 1: 50,000 snapshot objects of 2.3 kB were kept per policy."""
    window = TickWindow(window_s=24 * 3600.0)
    engines = tuple(EngineQueues("decode", f"w{i}", 0, 100, 2000, 9000) for i in range(4))
    for t in range(0, 3 * 86_400, 15):  # three days at the fast-check cadence
        window.append(snap(float(t), engines=engines, observed_rps=3.25, message="hold"))
    kept = window.snapshots()
    day_ticks = 86_400 // 15
    assert (
        day_ticks <= len(kept) <= day_ticks + BLOCK_TICKS,
        kept[-1].t_s - kept[0].t_s < 86_400 + BLOCK_TICKS * 15,
        window.nbytes / len(window) < 200,  # bytes per tick (the objects took 2,324)
    ) == (True, True, True)


def test_a_snapshot_comes_back_from_the_window_as_it_went_in() -> None:
    window = TickWindow(window_s=None)
    original = snap(5.0, engines=(EngineQueues("prefill", "w", 1, 7, 0, 3),), scale_to={"x": 1})
    window.append(original)
    assert window.snapshots() == [original]


def test_scheduled_reports_keep_k_files_per_deployment_under_a_byte_cap(tmp_path: Path) -> None:
    def recorder(name: str, max_bytes: int | None) -> DiagnosticsRecorder:
        return DiagnosticsRecorder(
            output_dir=tmp_path / name,
            report_interval_hours=1 / 60,
            keep_files=2,
            max_bytes=max_bytes,
            disk_root=tmp_path,
        )

    first = recorder("a", None)
    for t in range(0, 300, 20):  # reports at 60, 120, 180 and 240 s
        first.record(snap(float(t)))
    kept_a = sorted(p.name for p in (tmp_path / "a").iterdir())
    one_report = sum(p.stat().st_size for p in (tmp_path / "a").iterdir()) // 2
    second = recorder("b", int(one_report * 2.5))
    for t in range(0, 200, 20):
        second.record(snap(float(t)))
    on_disk = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
    assert (kept_a, on_disk <= one_report * 2.5, (tmp_path / "b").exists()) == (
        [
            "planner-report-180s.html",
            "planner-report-180s.log.jsonl.gz",
            "planner-report-240s.html",
            "planner-report-240s.log.jsonl.gz",
        ],
        True,
        True,
    )


def test_policies_created_together_report_at_different_times(tmp_path: Path) -> None:
    due = {}
    for key in ("ns/alpha", "ns/beta", "ns/gamma"):
        rec = DiagnosticsRecorder(
            output_dir=tmp_path / key, report_interval_hours=1.0, stagger_key=key
        )
        due[key] = next(t for t in range(0, 7200, 60) if rec.record(snap(float(t))) is not None)
    assert len(set(due.values())) == 3 and all(1800 <= t <= 3660 for t in due.values()), due


def test_the_report_endpoint_renders_a_deployment_on_demand(tmp_path: Path) -> None:
    rec = DiagnosticsRecorder(output_dir=tmp_path)
    rec.record(snap(0.0))

    def reports(namespace: str, name: str) -> str | None:
        return rec.render_html() if (namespace, name) == ("ns", "a") else None

    server = MetricsServer(
        PlannerMetrics(), HealthState(), host="127.0.0.1", port=0, reports=reports
    ).start()
    try:
        page = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/report/ns/a", timeout=30)
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/report/ns/b", timeout=30)
        assert (page.status, b"Replicas per role" in page.read(), missing.value.code) == (
            200,
            True,
            404,
        )
    finally:
        server.stop()
    assert list(tmp_path.iterdir()) == []  # rendered on demand, nothing written


@pytest.mark.slow
def test_a_live_recorder_renders_in_a_child_and_keeps_no_render_modules(tmp_path: Path) -> None:
    """Issue 36 (the soak): a render left plotly and its peak heap in the operator for good
    (RSS 1.89x day 1 after the first scheduled report). In a fresh interpreter, a recorder as
    the operator builds it writes its scheduled report and renders on demand, and neither
    the report code nor plotly is imported in that process."""
    script = f"""
import sys
from pathlib import Path
from disagg_planner.report.recorder import DiagnosticsRecorder
from disagg_planner.report.snapshot import TickSnapshot
rec = DiagnosticsRecorder(output_dir=Path({str(tmp_path)!r}), report_interval_hours=1 / 60,
                          filename="run", render_in_child=True, ttft_slo_ms=500)
written = [rec.record(TickSnapshot(t_s=float(t), desired={{"decode": 2}}, ready={{"decode": 2}},
                                   gpus_in_use=2, gpu_hours=0.0)) for t in range(0, 70, 10)]
html = rec.render_html()
assert [p.name for p in written if p] == ["run.html"], written
assert "Replicas per role" in html, html[:200]
leaked = sorted(m for m in sys.modules if m.startswith(("plotly", "disagg_planner.report.html")))
assert leaked == [], leaked
"""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Replicas per role" in (tmp_path / "run.html").read_text()
    assert (tmp_path / "run.log.jsonl.gz").exists()


def test_a_child_that_cannot_render_is_a_clear_error(tmp_path: Path) -> None:
    from disagg_planner.report.child import ReportRenderError, render_in_child

    with pytest.raises(ReportRenderError, match=r"(?s)exited 1:.*JSONDecodeError"):
        render_in_child([b"not json"], title="t", ttft_slo_ms=None, itl_slo_ms=None)
