"""The fluid bound: every admitted request's own lengths at the saturated engine's throughput; no
policy uses fewer GPU-hours. The summary's reference keys are ratios of the run's own
GPU-hours; the searches behind them are found once and can be kept on disk."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from disagg_planner.predictors.traces import TraceRequest
from disagg_planner.profiles import Profile, load_profile, resolve_profile
from disagg_planner.replay import bounds
from disagg_planner.replay.bounds import admitted, compute_references
from disagg_planner.replay.fluid import fluid_bound_gpu_hours
from disagg_planner.replay.oracle import OraclePolicy
from disagg_planner.replay.session import ORACLE_WINDOW_S, ReplayPlan, WorkloadSpec, prepare, run
from tests.unit.replay.test_oracle_plan import PROFILE, WORKLOADS, config, plan_for


@pytest.fixture(scope="module")
def profile() -> Profile:
    return load_profile(resolve_profile(PROFILE))


def one(isl: int, osl: int) -> list[TraceRequest]:
    return [TraceRequest(arrival_s=0.0, input_length=isl, output_length=osl)]


def test_a_lone_request_costs_its_own_work_at_the_profiled_throughput(profile: Profile) -> None:
    # so tight a TTFT target that no batch of prompts meets it: the prompt's own throughput
    isl, osl, itl = 3000, 200, 20.0
    tight = profile.prefill.ttft_ms(100) / 2
    decode = profile.decode.find_best_throughput_per_gpu(itl, isl + osl / 2)
    assert decode.feasible
    expected = (isl / profile.prefill.thpt_per_gpu(isl) + osl / decode.thpt_per_gpu) / 3600
    got = fluid_bound_gpu_hours(one(isl, osl), profile, ttft_ms=tight, itl_ms=itl)
    assert got == pytest.approx(expected, rel=1e-12)


def test_short_prompts_are_costed_as_batched_where_the_ttft_target_allows(
    profile: Profile,
) -> None:
    short = one(300, 1)
    loose = fluid_bound_gpu_hours(short, profile, ttft_ms=5000, itl_ms=20)
    tight = fluid_bound_gpu_hours(short, profile, ttft_ms=1, itl_ms=20)
    assert loose < tight
    # a prompt as long as the batch budget has nothing longer to be batched into
    assert profile.manifest is not None
    budget = profile.manifest.prefill_engine.max_num_batched_tokens
    assert budget is not None
    full = one(budget, 1)
    assert fluid_bound_gpu_hours(full, profile, ttft_ms=5000, itl_ms=20) == pytest.approx(
        fluid_bound_gpu_hours(full, profile, ttft_ms=1, itl_ms=20), rel=1e-12
    )


def test_the_bound_adds_up_over_requests_and_loosens_with_the_itl_target(
    profile: Profile,
) -> None:
    requests = [
        TraceRequest(arrival_s=float(i), input_length=500 + 97 * i, output_length=50 + 13 * i)
        for i in range(50)
    ]
    single = sum(fluid_bound_gpu_hours([r], profile, ttft_ms=500, itl_ms=20) for r in requests)
    assert fluid_bound_gpu_hours(requests, profile, ttft_ms=500, itl_ms=20) == pytest.approx(
        single, rel=1e-9
    )
    assert fluid_bound_gpu_hours(requests, profile, ttft_ms=500, itl_ms=60) < single
    assert fluid_bound_gpu_hours([], profile, ttft_ms=500, itl_ms=20) == 0.0


def test_without_targets_the_bound_is_the_saturated_engine_s(profile: Profile) -> None:
    # a policy that lets latency grow runs its engines full: the floor is their throughput
    # there, at or above what any latency target allows
    requests = [
        TraceRequest(arrival_s=float(i), input_length=200 + 311 * i, output_length=20 + 7 * i)
        for i in range(40)
    ]
    saturated = fluid_bound_gpu_hours(requests, profile)
    for ttft, itl in ((5000, 200), (500, 20), (100, 8)):
        assert saturated <= fluid_bound_gpu_hours(requests, profile, ttft_ms=ttft, itl_ms=itl)
    contexts = np.array([500.0, 4000.0, 30000.0])
    full = profile.decode.find_best_many(math.inf, contexts)
    assert full.feasible.all()
    assert np.all(full.thpt_per_gpu >= profile.decode.find_best_many(1e6, contexts).thpt_per_gpu)
    with pytest.raises(ValueError, match="ITL target"):
        profile.decode.find_best_many(math.nan, contexts)


@pytest.mark.slow
def test_requests_refused_on_arrival_cost_no_gpu_time_in_the_bound() -> None:
    # heavy-tailed prompts, a few longer than max_model_len: the engine refuses those on
    # arrival, and an overloaded single pair serving the rest must still pay at least the bound
    workload = WorkloadSpec(workload="heavytail:rate=3,duration=300,context=131072,osl=200", seed=7)
    plan = prepare(config(ttft_ms=5000), workload, startup_delay_s=60)
    kept = admitted(plan.requests, plan.setup.specs)
    assert 0 < len(plan.requests) - len(kept) < 20
    refs = compute_references(plan, window_s=ORACLE_WINDOW_S)
    assert plan.profile is not None and refs.fluid_bound_gpu_hours is not None
    assert refs.fluid_bound_gpu_hours == pytest.approx(fluid_bound_gpu_hours(kept, plan.profile))
    assert refs.fluid_bound_gpu_hours < fluid_bound_gpu_hours(plan.requests, plan.profile)
    for policy in ("static:1,1", "dynamo-default"):
        s = run(plan, policy, progress=False).summary
        assert s.references is not None and s.references.fluid_bound_gpu_hours is not None
        assert s.gpu_hours >= s.references.fluid_bound_gpu_hours, policy


@pytest.mark.slow
@pytest.mark.parametrize("name", [*WORKLOADS, "azure"])
def test_every_policy_uses_at_least_the_fluid_bound(
    name: str, request: pytest.FixtureRequest
) -> None:
    trace = request.getfixturevalue("azure_trace") if name == "azure" else None
    plan = plan_for(name, trace)
    refs = compute_references(plan, window_s=ORACLE_WINDOW_S)
    fluid = refs.fluid_bound_gpu_hours
    assert fluid is not None and fluid > 0
    assert refs.oracle.gpu_hours >= fluid
    assert refs.best_static_run.gpu_hours >= fluid
    for policy in ("planner", "dynamo-default", "hpa"):
        s = run(plan, policy, progress=False).summary
        assert s.references is not None
        assert s.gpu_hours >= fluid, policy
        assert s.references.fluid_bound_gpu_hours == fluid
        assert s.references.gpu_hours_ratio_to_fluid_bound == pytest.approx(s.gpu_hours / fluid)
        assert s.references.gpu_hours_ratio_to_oracle == pytest.approx(
            s.gpu_hours / refs.oracle.gpu_hours
        )
        assert s.references.gpu_hours_ratio_to_best_static == pytest.approx(
            s.gpu_hours / s.references.best_static.gpu_hours
        )
        assert s.references.best_static.replicas == refs.best_static.replicas


@pytest.mark.slow
def test_the_searches_are_kept_on_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    workload = WORKLOADS["step"]
    plan = prepare(config(ttft_ms=400), workload, startup_delay_s=90)
    first = compute_references(plan, window_s=ORACLE_WINDOW_S, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("references-*.json"))) == 1
    monkeypatch.setattr(bounds, "_MEMO", {})

    def no_search(*_a: object, **_k: object) -> None:
        raise AssertionError("searched again")

    monkeypatch.setattr(bounds, "plan_feasible", no_search)
    monkeypatch.setattr(bounds, "search_best_static", no_search)
    again = compute_references(plan, window_s=ORACLE_WINDOW_S, cache_dir=tmp_path)
    assert compute_references(plan, window_s=60, cache_dir=tmp_path) is again  # 60 s is 60.0
    assert again.oracle_plan.windows == first.oracle_plan.windows
    assert again.best_static.replicas == first.best_static.replicas
    # the runs are not cached: they are metered by the runner's rule of the day
    assert again.oracle == first.oracle
    assert again.best_static_run == first.best_static_run
    # another target is another search
    other = prepare(config(ttft_ms=300), workload, startup_delay_s=90)
    with pytest.raises(AssertionError, match="searched again"):
        compute_references(other, window_s=ORACLE_WINDOW_S, cache_dir=tmp_path)


@pytest.mark.slow
def test_where_the_window_plan_costs_more_the_oracle_is_the_best_static(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plan = plan_for("step")
    monkeypatch.setattr(bounds, "_MEMO", {})
    honest = bounds._run

    def dearer_windows(
        plan: ReplayPlan, policy: object, initial: Mapping[str, int]
    ) -> bounds.RunFigures:
        figures = honest(plan, policy, initial)
        if isinstance(policy, OraclePolicy):
            return replace(figures, gpu_hours=figures.gpu_hours * 10)
        return figures

    monkeypatch.setattr(bounds, "_run", dearer_windows)
    refs = compute_references(plan, window_s=ORACLE_WINDOW_S)
    assert refs.oracle_source == "best-static"
    assert refs.oracle == refs.best_static_run
    assert refs.window_plan_run.gpu_hours > refs.best_static_run.gpu_hours
    assert all(n.replicas == refs.best_static.replicas for n in refs.oracle_needs)
    # run as a policy, that plan is the static deployment's run
    monkeypatch.setattr(bounds, "_run", honest)
    s = run(plan, "oracle", progress=False).summary
    assert s.references is not None
    assert s.gpu_hours == refs.best_static_run.gpu_hours
    assert (
        s.references.oracle_plan == "best-static" and s.references.gpu_hours_ratio_to_oracle == 1.0
    )
