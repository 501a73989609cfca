"""Accounting of the ramp benchmark (benchmarks/elastic_ep_ramp.py): the workload, the
client's view of TTFT, rolling p95, time above the SLO and GPU-hours."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from disagg_planner.predictors.traces import TraceRequest
from disagg_planner.profiles import elastic_resize, load_profile
from disagg_planner.profiles.registry import resolve_profile
from disagg_planner.simulator.elastic_ep import ResizePlan
from disagg_planner.simulator.request import RequestRecord


def _load_benchmark() -> ModuleType:
    path = Path(__file__).resolve().parents[3] / "benchmarks" / "elastic_ep_ramp.py"
    spec = importlib.util.spec_from_file_location("elastic_ep_ramp", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through it
    spec.loader.exec_module(module)
    return module


ramp = _load_benchmark()


def record(arrival: float, ttft_s: float | None, *, ok: bool = True) -> RequestRecord:
    first = None if ttft_s is None else arrival + ttft_s
    return RequestRecord(
        request_id=int(arrival * 1000),
        arrival_s=arrival,
        isl=100,
        osl=10,
        first_token_s=first,
        finish_s=(first or arrival) + 1.0,
        ttft_ms=None if ttft_s is None else ttft_s * 1000.0,
        itl_ms=None,
        ok=ok,
    )


# --- workload ---------------------------------------------------------------------------------


def test_ramp_has_exactly_the_posts_request_count_and_a_rising_rate():
    requests = ramp.ramp_requests(
        ramp.REQUESTS, start_rps=8.0, end_rps=16.0, seed=0, isl=ramp.ISL, osl=ramp.OSL
    )
    duration = ramp.ramp_duration_s(ramp.REQUESTS, 8.0, 16.0)

    assert len(requests) == 11_391
    assert duration == pytest.approx(11_391 / 12.0)
    arrivals = [r.arrival_s for r in requests]
    assert arrivals == sorted(arrivals) and arrivals[0] >= 0.0 and arrivals[-1] <= duration
    first = sum(1 for a in arrivals if a < duration / 4)
    last = sum(1 for a in arrivals if a >= 3 * duration / 4)
    # mean rates 9 and 15 req/s over the first and last quarter
    assert first == pytest.approx(9.0 * duration / 4, rel=0.06)
    assert last == pytest.approx(15.0 * duration / 4, rel=0.06)
    assert all(8500 <= r.input_length <= 13500 for r in requests)
    assert all(1200 <= r.output_length <= 2800 for r in requests)


def test_ramp_is_deterministic_per_seed():
    def make(seed: int) -> list[TraceRequest]:
        return ramp.ramp_requests(
            500, start_rps=8, end_rps=16, seed=seed, isl=ramp.ISL, osl=ramp.OSL
        )

    assert make(3) == make(3)
    assert make(3) != make(4)
    with pytest.raises(ValueError, match="n=0"):
        ramp.ramp_requests(0, start_rps=8, end_rps=16, seed=0, isl=ramp.ISL, osl=ramp.OSL)


# --- the client's TTFT ------------------------------------------------------------------------


def test_failed_and_abandoned_requests_count_as_the_30_s_penalty():
    assert ramp.effective_ttft_s(record(0.0, 1.5)) == 1.5
    assert ramp.effective_ttft_s(record(0.0, None, ok=False)) == 30.0
    assert ramp.effective_ttft_s(record(0.0, 45.0)) == 30.0  # the client gave up at 30 s
    assert ramp.completed(record(0.0, 1.5))
    assert not ramp.completed(record(0.0, None, ok=False))
    assert not ramp.completed(record(0.0, 45.0))


def test_rolling_p95_counts_an_outage_by_arrival_time():
    # 10 req/s for 100 s at 1 s TTFT; the 20 arrivals in [50, 52) fail
    records = [
        record(i / 10, None if 50.0 <= i / 10 < 52.0 else 1.0, ok=not 50.0 <= i / 10 < 52.0)
        for i in range(1000)
    ]

    series = ramp.rolling_p95(records, end_s=100.0)

    values = dict(series)
    assert values[40.0] == 1.0  # no failure in (10, 40]
    assert values[60.0] == 30.0  # 20 of 300 in (30, 60] failed: above the 5% tail
    assert max(values.values()) == 30.0
    arrivals = np.array([r.arrival_s for r in records])
    ttfts = np.array([ramp.effective_ttft_s(r) for r in records])
    for t, v in series:
        window = ttfts[(arrivals > t - 30.0) & (arrivals <= t)]
        assert v == pytest.approx(float(np.percentile(window, 95)))
    above = ramp.seconds_above(series, 5.0, 1.0)
    # windows holding at least 16 of the failures (5% of 300): t in [51.5, 81.5)
    assert 28 <= above <= 31
    assert above == sum(1 for _, v in series if v > 5.0)


# --- one policy, small ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def profile():
    return load_profile(resolve_profile(ramp.PROFILE))


def test_fixed_policy_meters_16_gpus_to_the_last_arrival(profile):
    requests = [TraceRequest(i * 0.5, 4000, 200) for i in range(120)]

    result = ramp.run_policy("fixed-16", requests, profile=profile, seed=0)

    assert (result.requests, result.completed) == (120, 120)
    assert result.gpu_hours == pytest.approx(16 * requests[-1].arrival_s / 3600.0)
    assert result.seconds_above_slo == 0 and result.max_rolling_p95_ttft_s < 5.0
    assert set(result.public()) == {
        "name",
        "requests",
        "completed",
        "max_rolling_p95_ttft_s",
        "seconds_above_slo",
        "gpu_hours",
        "arrived_in_pause",
        "rejected",
    }
    assert result.arrived_in_pause == 0  # no resize, no pause


def test_arrivals_during_a_pause_are_counted_as_vllm_would_reject_them():
    requests = [TraceRequest(float(t), 1000, 100) for t in range(0, 100)]
    pause = ResizePlan(
        "w0", 16, 20, "nixl_ep", start_s=10.0, downtime_start_s=50.0, end_s=52.5
    )  # arrivals at 50, 51 and 52 s

    assert ramp.arrivals_in_pauses(requests, [pause]) == 3
    assert ramp.arrivals_in_pauses(requests, []) == 0


def test_light_load_leaves_the_elastic_engine_at_16(profile):
    requests = [TraceRequest(i * 0.5, 4000, 200) for i in range(120)]

    result = ramp.run_policy("elastic-nixl", requests, profile=profile, seed=0)

    assert result.resizes == []
    assert result.gpu_hours == pytest.approx(16 * requests[-1].arrival_s / 3600.0)


def test_restart_mode_exists_only_while_a_restart_policy_runs():
    with ramp.restart_mode(197.0) as mode:
        assert elastic_resize.mode("restart") is mode
        assert mode.up.preparation_s == 0.0 and mode.up.downtime_s == 197.0
    assert "restart" not in elastic_resize.MODES


def test_unknown_policy_is_rejected(profile):
    with pytest.raises(ValueError, match="unknown policy 'elastic-fast'"):
        ramp.run_policy("elastic-fast", [TraceRequest(0.0, 10, 10)], profile=profile, seed=0)


@pytest.mark.slow
def test_the_ramp_through_replay_rejects_the_arrivals_of_a_pause_unless_retried():
    # a short, steep ramp: the elastic policy grows DP 16 -> 20 within it, and 20 ranks carry
    # its end (with the benchmark's lengths re-chosen for issue 31's faster prefill)
    requests = ramp.ramp_requests(
        3000, start_rps=10.0, end_rps=18.0, seed=1, isl=ramp.ISL, osl=ramp.OSL
    )
    rejecting = ramp.run_through_replay("elastic-nixl", requests, seed=1)
    retrying = ramp.run_through_replay("elastic-nixl-retry", requests, seed=1)
    for result in (rejecting, retrying):
        assert [r.split(" at ")[0] for r in result.resizes] == ["16->20 nixl_ep"]
        assert result.arrived_in_pause > 0
    assert 0 < rejecting.rejected <= rejecting.arrived_in_pause + 1
    assert retrying.rejected == 0 and retrying.completed >= rejecting.completed
    assert rejecting.public()["rejected"] == rejecting.rejected
    with pytest.raises(ValueError, match="restart-20"):
        ramp.run_through_replay("restart-20", requests, seed=1)


@pytest.mark.parametrize(
    "argv", [["--write", "--only", "fixed-16"], ["--write", "--seed", "3"], ["--write", "--json"]]
)
def test_write_records_only_the_default_run(argv, capsys):
    """A partial or re-seeded run written into the results would pass for the default one."""
    with pytest.raises(SystemExit) as exit_info:
        ramp.main(argv)
    assert exit_info.value.code == 2
    assert "--write records the default run" in capsys.readouterr().err


def test_write_replaces_the_marked_blocks_with_the_runs_table(tmp_path, monkeypatch):
    results_md, doc_md = tmp_path / "RESULTS.md", tmp_path / "docs" / "elastic-ep.md"
    doc_md.parent.mkdir()
    doc_md.write_text(
        "intro\n<!-- BEGIN elastic-ep-ramp -->\nold\n<!-- END elastic-ep-ramp -->\nend\n"
    )
    monkeypatch.setattr(ramp, "RESULTS", results_md)
    monkeypatch.setattr(ramp, "write_block", _write_block_into(results_md))
    monkeypatch.setattr(ramp, "__file__", str(tmp_path / "benchmarks" / "elastic_ep_ramp.py"))
    results = [type("R", (), {"name": "fixed-16"})()]
    monkeypatch.setattr(ramp, "table", lambda rs: "| policy |\n| fixed-16 |")
    ramp.write_ramp_blocks(results, "| policy |\n| fixed-16 |\n\nrolling ...")

    doc = doc_md.read_text()
    assert doc.startswith("intro\n") and doc.endswith("end\n") and "old" not in doc
    assert "| fixed-16 |" in doc and "--write" in doc
    assert "rolling ..." in results_md.read_text()


def _write_block_into(results_md):
    from benchmarks.results_block import write_block

    def write(name, block, path=results_md):
        write_block(name, block, path)

    return write
