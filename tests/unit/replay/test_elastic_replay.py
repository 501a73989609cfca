"""Elastic EP through replay: the live loop's elastic policy resizes the simulated engine's DP
size (followers join, then the mode's resize), every GPU is metered, the outputs show the DP
size, a pause's arrivals are rejected (or retried), and bad combinations are refused."""

from __future__ import annotations

import csv
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from disagg_planner.cli.main import main
from disagg_planner.config import PlannerConfig
from disagg_planner.errors import SpecError
from disagg_planner.replay import session
from disagg_planner.replay.session import WorkloadSpec, prepare
from disagg_planner.simulator.elastic_ep import PAUSE_REJECTED, SHRINK_ABORTED

PROFILE = "gb200/vllm/deepseek-v3/tp1-dp16-ep16"
ENGINE = "sim:deepseek-v3@gb200:tp1:dp8:ep8"
# quiet (DP 8 carries it), then a rise the policy grows the engine for
WORKLOAD = "step:rates=6/40,at=60,duration=200,isl=2000,osl=200"
FLAGS = [
    "--workload", WORKLOAD, "--engine", ENGINE, "--profile", PROFILE, "--mode", "agg",
    "--elastic-ep", "agg", "--elastic-ep-min-dp", "8", "--elastic-ep-max-dp", "16",
    "--elastic-ep-dp-step", "4", "--throughput-adjustment-interval-seconds", "30",
    "--ttft-ms", "2000", "--itl-ms", "100", "--no-progress", "--seed", "3",
]  # fmt: skip


def _config(**extra: Any) -> PlannerConfig:
    return PlannerConfig(
        mode="agg",
        profile=PROFILE,
        max_gpu_budget=-1,
        ttft_ms=2000,
        itl_ms=100,
        throughput_adjustment_interval_seconds=30,
        elastic_ep="agg",
        elastic_ep_min_dp=8,
        elastic_ep_max_dp=16,
        elastic_ep_dp_step=4,
        **extra,
    )


def _rows(out: Path) -> list[dict[str, str]]:
    with (out / "timeline.csv").open() as handle:
        return list(csv.DictReader(handle))


def _integral(rows: list[dict[str, str]], column: str) -> float:
    return sum(
        float(a[column]) * (float(b["t_s"]) - float(a["t_s"])) for a, b in itertools.pairwise(rows)
    )


@pytest.fixture(scope="module")
def rejecting(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("elastic") / "reject"
    assert main(["replay", *FLAGS, "-o", str(out)]) == 0
    return out


@pytest.mark.slow
def test_replay_resizes_the_engine_by_dp_and_the_outputs_show_it(rejecting: Path) -> None:
    summary = json.loads((rejecting / "summary.json").read_text())
    elastic = summary["elastic_ep"]
    assert elastic["role"] == "agg" and elastic["dp_initial"] == 8
    [grow, *_] = elastic["resizes"]
    assert (grow["from_dp"], grow["to_dp"]) in ((8, 12), (8, 16))
    assert grow["mode"] == "nixl_ep" and grow["pause_s"] == pytest.approx(0.82)
    assert grow["end_s"] - grow["start_s"] == pytest.approx(92.34)  # the mode's grow
    assert elastic["dp_max"] == grow["to_dp"]
    # the elastic role keeps its one replica: capacity moved by DP, not by replicas
    assert summary["max_replicas"] == {"agg": 1} and summary["scale_actions"] == {"agg": 0}
    rows = _rows(rejecting)
    # DP changes when the new topology serves, GPUs when they are taken
    before = [r for r in rows if float(r["t_s"]) < grow["end_s"]]
    after = [r for r in rows if float(r["t_s"]) >= grow["end_s"]]
    assert {r["dp_agg"] for r in before} == {"8"}
    assert after[0]["dp_agg"] == str(grow["to_dp"])
    at_request = next(r for r in rows if float(r["t_s"]) == grow["requested_s"])
    assert int(at_request["gpus_in_use"]) == grow["to_dp"]
    paused = [r for r in rows if r["paused_agg"] == "1"]
    assert [float(r["t_s"]) for r in paused] == [pytest.approx(grow["pause_start_s"])]
    decided = next(r for r in rows if r["event"] == "tick" and float(r["t_s"]) == grow["start_s"])
    assert f"elastic agg: resizing DP 8 -> {grow['to_dp']}" in decided["message"]
    # every rank is metered: the timeline integrates to the summary's GPU-hours
    assert _integral(rows, "gpus_in_use") / 3600 == pytest.approx(summary["gpu_hours"], rel=5e-3)
    assert "Elastic EP: the agg engine" in (rejecting / "report.html").read_text()
    with (rejecting / "requests.csv").open() as handle:
        requests = list(csv.DictReader(handle))
    assert {r["dp_at_arrival"] for r in requests if float(r["arrival_s"]) < 50} == {"8"}
    assert requests[-1]["dp_at_arrival"] == str(elastic["dp_final"])


@pytest.mark.slow
def test_arrivals_in_a_pause_are_rejected_without_frontend_retries(rejecting: Path) -> None:
    summary = json.loads((rejecting / "summary.json").read_text())
    pauses = [(p["pause_start_s"], p["end_s"]) for p in summary["elastic_ep"]["resizes"]]
    with (rejecting / "requests.csv").open() as handle:
        failed = [r for r in csv.DictReader(handle) if r["ok"] == "0"]
    assert summary["rejected"] > 0
    assert summary["failed"] == summary["rejected"] == len(failed)
    assert {r["error"] for r in failed} == {PAUSE_REJECTED}
    # each one arrived just before or during a pause (the frontend's latency before dispatch)
    for r in failed:
        t = float(r["arrival_s"])
        assert any(start - 0.1 <= t < end for start, end in pauses)


@pytest.mark.slow
def test_frontend_retries_delay_the_pause_s_arrivals_instead(tmp_path: Path) -> None:
    out = tmp_path / "retry"
    flags = [*FLAGS, "--elastic-ep-frontend-retries"]
    assert main(["replay", *flags, "-o", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rejected"] == 0 and summary["failed"] == 0
    [grow, *_] = summary["elastic_ep"]["resizes"]
    with (out / "requests.csv").open() as handle:
        waited = [
            r
            for r in csv.DictReader(handle)
            if grow["pause_start_s"] <= float(r["arrival_s"]) < grow["end_s"] - 0.1
        ]
    assert waited
    for r in waited:  # sent after the pause; the wait is in the TTFT
        assert float(r["first_token_s"]) >= grow["end_s"]
        assert float(r["ttft_ms"]) >= (grow["end_s"] - float(r["arrival_s"])) * 1000


@pytest.mark.slow
def test_followers_start_and_join_for_the_time_the_policy_plans_with(tmp_path: Path) -> None:
    config = _config(elastic_ep_follower_service="agg-flw", elastic_ep_follower_ready_seconds=45.0)
    plan = prepare(config, WorkloadSpec(workload=WORKLOAD, seed=3), engine=ENGINE)
    result = session.run(plan, "planner", out_dir=tmp_path, progress=False, references=False)
    assert result.summary.elastic_ep is not None
    [grow, *_] = result.summary.elastic_ep.resizes
    assert grow.followers_ready_s == pytest.approx(45.0)
    assert grow.start_s == pytest.approx(grow.requested_s + 45.0)
    rows = _rows(tmp_path)
    joining = [r for r in rows if grow.requested_s <= float(r["t_s"]) < grow.end_s]
    # the followers' GPUs are metered while they start; the engine serves at DP 8 meanwhile
    assert {(r["dp_agg"], r["gpus_in_use"]) for r in joining} == {("8", str(grow.to_dp))}
    hours = _integral(rows, "gpus_in_use") / 3600
    assert hours == pytest.approx(result.summary.gpu_hours, rel=5e-3)
    # the lead time the policy decided with included the followers' 45 s
    assert "followers 45 s" in next(r["message"] for r in rows if "resizing DP" in r["message"])


@pytest.mark.parametrize(
    ("engine", "extra", "initial", "match"),
    [
        ("sim:llama-3.1-8b-fp8@h200_sxm:tp1:dp8", {}, None, "dense model"),
        (ENGINE, {"elastic_ep_gpus_per_rank": 2}, None, "elastic_ep_gpus_per_rank=2"),
        ("sim:deepseek-v3@gb200:tp1:dp10:ep10", {}, None, "starts at DP 10"),
        (ENGINE, {}, {"agg": 2}, "--initial agg=2"),
    ],
)
def test_combinations_replay_cannot_play_are_refused_by_name(
    engine: str, extra: dict[str, Any], initial: dict[str, int] | None, match: str
) -> None:
    with pytest.raises(SpecError, match=match):
        prepare(_config(**extra), WorkloadSpec(workload=WORKLOAD), engine=engine, initial=initial)


@pytest.mark.slow
def test_the_simulated_resize_takes_the_timing_the_policy_plans_with(tmp_path: Path) -> None:
    # measured timings replace the mode's: the policy's lead time and the simulated resize
    config = _config(elastic_ep_mode="blocking", elastic_ep_timing="40,6,20,4")
    plan = prepare(config, WorkloadSpec(workload=WORKLOAD, seed=3), engine=ENGINE)
    result = session.run(plan, "planner", progress=False, references=False, write_report=False)
    assert result.summary.elastic_ep is not None
    [grow, *_] = result.summary.elastic_ep.resizes
    assert grow.mode == "blocking"
    assert grow.end_s - grow.start_s == pytest.approx(40.0)
    assert grow.pause_s == pytest.approx(6.0)
    decided = next(r for r in result.timeline if "resizing DP" in r.message)
    assert "blocking resize 40 s" in decided.message


@pytest.mark.slow
def test_a_shrink_under_load_aborts_the_removed_ranks_requests(tmp_path: Path) -> None:
    """Issue 32, items 2 and 6: with a budget that lets it shrink under load, the replay
    counts the requests on the removed ranks as failed (aborted), not moved; with no budget
    the policy waits and nothing is aborted."""
    base = [
        *FLAGS, "--elastic-ep-frontend-retries", "--elastic-ep-trend-window-seconds", "90",
        "--workload", "step:rates=30/6,at=60,duration=300,isl=2000,osl=200",
        "--engine", ENGINE.replace("dp8:ep8", "dp16:ep16"),
    ]  # fmt: skip
    runs = {}
    for name, budget in (("budget", "1000000"), ("no-budget", "0")):
        out = tmp_path / name
        flags = [*base, "--elastic-ep-shrink-abort-budget", budget]
        assert main(["replay", *flags, "-o", str(out)]) == 0
        runs[name] = (json.loads((out / "summary.json").read_text()), out)

    summary, out = runs["budget"]
    shrinks = [p for p in summary["elastic_ep"]["resizes"] if p["to_dp"] < p["from_dp"]]
    assert shrinks
    with (out / "requests.csv").open() as handle:
        aborted = [r for r in csv.DictReader(handle) if r["error"] == SHRINK_ABORTED]
    assert len(aborted) == summary["elastic_ep"]["aborted_at_shrink"] > 0
    assert summary["failed"] >= len(aborted)

    held, _ = runs["no-budget"]
    assert held["elastic_ep"]["aborted_at_shrink"] == 0
