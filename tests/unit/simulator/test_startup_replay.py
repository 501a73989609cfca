"""The phase model and the drain grace period in a replay: the default start-up when
``--startup-delay`` is not given, its phases in timeline.csv, GPU-hours charged from the image
pull, the oracle ordering replicas by the same model, and cancelled requests in the summary."""

from __future__ import annotations

import csv
import itertools
from pathlib import Path

import pytest

from disagg_planner.cli.main import main
from disagg_planner.config import PlannerConfig
from disagg_planner.replay.runner import run_policy, write_outputs
from disagg_planner.replay.session import WorkloadSpec, make_policy, prepare
from disagg_planner.simulator import startup
from disagg_planner.simulator.cluster import DRAIN_CANCELLED
from tests.support.policies import ScaleDecodeAt

PROFILE = "h200_sxm/vllm/llama-3.1-8b-fp8/tp1"
WORKLOAD = "step:rates=3/12,at=60,duration=400,isl=1500,osl=100"


def config() -> PlannerConfig:
    return PlannerConfig(profile=PROFILE, max_gpu_budget=-1, ttft_ms=300, itl_ms=30)


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


def test_replay_defaults_to_the_phase_model_and_shows_the_phases(tmp_path: Path) -> None:
    plan = prepare(
        config(), WorkloadSpec(workload=WORKLOAD, seed=2), initial={"prefill": 1, "decode": 1}
    )
    assert plan.setup.startup_delay_s is None
    policy, _ = make_policy("static:3,1", plan)
    result = run_policy(
        policy,
        setup=plan.setup,
        requests=plan.requests,
        ttft_slo_ms=300,
        itl_slo_ms=30,
    )
    write_outputs(tmp_path, result, config=None, roles=("prefill", "decode"))
    rows = _rows(tmp_path / "timeline.csv")
    phases = [p for p in startup.STARTUP_PHASES]
    # each added prefill replica passes through every phase, in order
    seen: list[str] = []
    for row in rows:
        for p in phases:
            if int(row[f"{p}_prefill"]) and p not in seen:
                seen.append(p)
        starting = int(row["starting_prefill"])
        assert starting == sum(int(row[f"{p}_prefill"]) for p in phases)
    assert seen == phases
    # the rows integrate to the metered GPU-hours, which leave out the pending pods
    gpu_s = sum(
        float(a["gpus_in_use"]) * (float(b["t_s"]) - float(a["t_s"]))
        for a, b in itertools.pairwise(rows)
    )
    # (timeline.csv keeps microseconds)
    assert gpu_s / 3600 == pytest.approx(result.summary.gpu_hours, rel=1e-6)
    first = rows[0]  # the policy's decision at t = 0
    assert int(first["scheduling_prefill"]) == 2
    assert int(first["gpus_in_use"]) == 2  # the two being scheduled hold no GPU yet


def test_constant_startup_delay_keeps_todays_behaviour(tmp_path: Path) -> None:
    plan = prepare(
        config(),
        WorkloadSpec(workload=WORKLOAD, seed=2),
        startup_delay_s=120.0,
        initial={"prefill": 1, "decode": 1},
    )
    policy, _ = make_policy("static:2,1", plan)
    result = run_policy(
        policy, setup=plan.setup, requests=plan.requests, ttft_slo_ms=300, itl_slo_ms=30
    )
    write_outputs(tmp_path, result, config=None, roles=("prefill", "decode"))
    rows = _rows(tmp_path / "timeline.csv")
    ready_at = next(float(r["t_s"]) for r in rows if int(r["ready_prefill"]) == 2)
    assert ready_at == pytest.approx(120.0)
    assert int(rows[0]["gpus_in_use"]) == 3  # held from the start of the delay
    assert all(int(r[f"{p}_prefill"]) == 0 for r in rows for p in startup.STARTUP_PHASES)


@pytest.mark.slow
def test_oracle_orders_replicas_by_the_same_startup_model() -> None:
    plan = prepare(config(), WorkloadSpec(workload=WORKLOAD, seed=2))
    oracle, _ = make_policy("oracle", plan)
    lead = startup.planning_lead_s(None, plan.setup.specs)
    assert oracle.delay == lead  # type: ignore[attr-defined]
    assert lead > startup.phase_model(plan.setup.specs["decode"]).median_plan().total_s


@pytest.mark.slow
@pytest.mark.parametrize("migrate", [False, True])
def test_grace_period_cancels_or_migrates_and_the_summary_counts_it(migrate: bool) -> None:
    plan = prepare(
        config(),
        WorkloadSpec(workload="poisson:rate=2,duration=60,isl=500,osl=8000", seed=1),
        startup_delay_s=0.0,
        initial={"prefill": 1, "decode": 2},
        drain_grace_s=5.0,
        migrate_on_drain=migrate,
    )
    result = run_policy(
        ScaleDecodeAt(30.0, 1),
        setup=plan.setup,
        requests=plan.requests,
        ttft_slo_ms=300,
        itl_slo_ms=30,
    )
    drain = result.summary.drain
    assert drain.grace_s == 5.0
    if migrate:
        assert drain.migrated > 0 and drain.cancelled == 0
        assert result.summary.failed == 0
    else:
        assert drain.cancelled > 0 and drain.migrated == 0
        assert result.summary.failed == drain.cancelled
        assert {r.error for r in result.records if not r.ok} == {DRAIN_CANCELLED}


@pytest.mark.parametrize(("flag", "value"), [("--drain-grace", "-5"), ("--startup-delay", "soon")])
def test_bad_lifecycle_flags_are_refused(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["replay", "--workload", WORKLOAD, flag, value])
    assert f"{value!r}: expected a number of seconds >= 0 or 'none'" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "none", "-3"])
def test_a_worker_shutdown_budget_must_be_positive(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["replay", "--workload", WORKLOAD, "--worker-shutdown-budget", value])
    assert "expected a number of seconds" in capsys.readouterr().err
