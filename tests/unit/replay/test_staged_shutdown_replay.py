"""Replay with Dynamo's staged worker shutdown (issue 35; ``replay --worker-shutdown-budget``):
a removed replica serves through its stages inside its total budget, and ``summary.json``'s
drain block says how each removed worker's serving ended; without the flag the block is as
before (the older drain)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from disagg_planner.config import PlannerConfig
from disagg_planner.replay.replay_summary import ReplaySummary
from disagg_planner.replay.runner import ReplayResult, run_policy
from disagg_planner.replay.session import WorkloadSpec, prepare
from tests.support.policies import ScaleDecodeAt

PROFILE = "h200_sxm/vllm/llama-3.1-8b-fp8/tp1"


def replay(osl: int, budget_s: float | None) -> ReplayResult:
    plan = prepare(
        PlannerConfig(profile=PROFILE, max_gpu_budget=-1, ttft_ms=300, itl_ms=30),
        WorkloadSpec(workload=f"poisson:rate=1,duration=40,isl=500,osl={osl}", seed=1),
        startup_delay_s=0.0,
        initial={"prefill": 1, "decode": 2},
        worker_shutdown_s=budget_s,
    )
    return run_policy(
        ScaleDecodeAt(20.0, 1),
        setup=plan.setup,
        requests=plan.requests,
        ttft_slo_ms=300,
        itl_slo_ms=30,
    )


@pytest.mark.parametrize(
    ("osl", "ended_by", "cancelled"),
    [(3000, {"worker_budget": 1}, True), (50, {"kv_quiescent": 1}, False)],
    ids=["budget_cancels_long_requests", "short_requests_finish"],
)
def test_the_summary_says_how_each_removed_worker_ended(
    osl: int, ended_by: dict[str, int], cancelled: bool, tmp_path: Path
) -> None:
    result = replay(osl, 8.0)
    drain = result.summary.drain
    assert (drain.worker_budget_s, drain.ended_by) == (8.0, ended_by)
    assert (drain.cancelled > 0) is cancelled
    assert result.summary.failed == drain.cancelled
    path = tmp_path / "summary.json"
    result.summary.write(path)
    assert json.loads(path.read_text())["drain"]["ended_by"] == ended_by
    assert ReplaySummary.read(path).drain == drain


def test_without_the_flag_the_drain_block_is_the_older_one() -> None:
    result = replay(3000, None)
    assert result.summary.drain.ended_by is None
    assert "ended_by" not in result.summary.to_json()["drain"]
