"""best-static: the cheapest fixed replicas that meet the SLO target, found by simulation;
one replica fewer of either role misses it."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path

import pytest

from disagg_planner.cli.main import main
from disagg_planner.replay.best_static import search_best_static
from disagg_planner.replay.bounds import compute_references
from disagg_planner.replay.policies import StaticPolicy
from disagg_planner.replay.runner import run_policy
from disagg_planner.replay.search import Slo
from disagg_planner.replay.session import ORACLE_WINDOW_S, ReplayPlan
from disagg_planner.simulator.cluster import Cluster
from tests.unit.replay.test_oracle_plan import plan_for


@pytest.fixture(scope="module")
def step() -> ReplayPlan:
    return plan_for("step")


def static_attainment(plan: ReplayPlan, replicas: Mapping[str, int]) -> float:
    """A static deployment ready at time 0 with ``replicas``, run as any policy is."""
    s = run_policy(
        StaticPolicy(replicas),
        setup=dataclasses.replace(plan.setup, initial_replicas=dict(replicas)),
        requests=plan.requests,
        ttft_slo_ms=plan.config.ttft_ms,
        itl_slo_ms=plan.config.itl_ms,
        flap_window_s=600,
    ).summary
    return float(s.slo_attainment.both)


@pytest.mark.slow
def test_the_best_static_meets_the_target_and_one_replica_fewer_does_not(
    step: ReplayPlan,
) -> None:
    refs = compute_references(step, window_s=ORACLE_WINDOW_S)
    best = refs.best_static
    assert best.qualifies
    assert static_attainment(step, best.replicas) == refs.best_static_run.slo_attainment
    assert refs.best_static_run.slo_attainment >= refs.slo.target
    for role, n in best.replicas.items():
        if n > 1:
            fewer = best.replicas | {role: n - 1}
            assert static_attainment(step, fewer) < refs.slo.target, role
    assert best.replicas["prefill"] > 1  # the step's burst needs more than the minimum


@pytest.mark.slow
def test_undersized_candidates_are_dropped_early(step: ReplayPlan) -> None:
    best = compute_references(step, window_s=ORACLE_WINDOW_S).best_static
    allowed = Slo(step.config.ttft_ms, step.config.itl_ms).allowed_misses(len(step.requests))
    failed = [t for t in best.trials if not t.qualifies]
    assert failed
    # dropped once over the allowance, not run to the end with every miss counted
    assert all(allowed < t.misses < len(step.requests) / 2 for t in failed)


def test_a_target_nothing_meets_reports_the_largest_tried(step: ReplayPlan) -> None:
    def build(counts: Mapping[str, int]) -> Cluster:
        ready = dataclasses.replace(step.setup, initial_replicas=dict(counts), startup_delay_s=0)
        return ready.build([])

    requests = step.requests[:300]
    impossible = Slo(ttft_ms=1.0, itl_ms=20.0)
    best = search_best_static(
        requests,
        build=build,
        upper={"prefill": 1, "decode": 1},
        lower={"prefill": 1, "decode": 1},
        slo=impossible,
        growth_limit=2,
    )
    assert not best.qualifies
    assert best.replicas == {"prefill": 2, "decode": 2}
    assert all(not t.qualifies for t in best.trials)


@pytest.mark.slow
def test_cli_runs_best_static(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code = main(
        [
            "replay",
            "--workload",
            "step:rates=3/12,at=120,duration=300,isl=2000,osl=200",
            "--profile",
            "h200_sxm/vllm/llama-3.1-8b-fp8/tp1",
            "--ttft",
            "300",
            "--itl",
            "20",
            "--policy",
            "best-static",
            "--policy",
            "static:1,1",
            "--no-progress",
            "-o",
            str(out),
        ]
    )
    assert code == 0
    best = json.loads((out / "best-static" / "summary.json").read_text())
    one = json.loads((out / "static-1-1" / "summary.json").read_text())
    assert best["policy"] == "best-static"
    assert best["initial_replicas"] == best["max_replicas"] == best["best_static"]["replicas"]
    assert best["gpu_hours"] == best["best_static"]["gpu_hours"]
    assert best["gpu_hours_ratio_to_best_static"] == 1.0
    assert best["slo_attainment"]["both"] >= best["slo_target"]
    assert one["best_static"] == best["best_static"]
    assert "x static" in capsys.readouterr().out
