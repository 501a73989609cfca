"""``prefill_batching``: prefill engines sized at the throughput a full chunk of prompts reaches
under load (:class:`disagg_planner.profiles.prefill.LoadedPrefill`), checked against the
simulated engine it claims to describe and through a whole replay."""

from __future__ import annotations

from dataclasses import replace

import pytest

from disagg_planner.config import PlannerConfig
from disagg_planner.core.load_scaling import EngineLimits
from disagg_planner.core.sizing import LoadForecast, at_load, size_prefill
from disagg_planner.profiles import Profile
from disagg_planner.profiles.manifest import EngineShape
from disagg_planner.profiles.prefill import LoadedPrefill
from disagg_planner.replay.session import WorkloadSpec, prepare, run
from disagg_planner.runtime.wiring import prefill_chunk_tokens, profile_for

BUNDLED = "h200_sxm/vllm/llama-3.1-8b-fp8/tp1"


@pytest.fixture(scope="module")
def bundled() -> Profile:
    return profile_for(PlannerConfig(profile=BUNDLED))


def test_a_loaded_engine_carries_a_chunk_of_prompts_not_one(bundled: Profile) -> None:
    lone = bundled.prefill
    loaded = LoadedPrefill(lone, chunk_tokens=8192)
    gain = {isl: loaded.thpt_per_gpu(isl) / lone.thpt_per_gpu(isl) for isl in (250, 1000, 2000)}
    # short prompts gain the most: one alone pays the iteration's fixed cost and weights
    assert gain[250] > 3.0
    assert 1.4 < gain[1000] < 1.7
    assert 1.1 < gain[2000] < 1.35
    assert gain[250] > gain[1000] > gain[2000]
    # a prompt as long as the chunk or longer runs alone, chunk by chunk
    for isl in (8192, 20000):
        assert loaded.thpt_per_gpu(isl) == pytest.approx(lone.thpt_per_gpu(isl))
    # each prompt's own TTFT stays the profiled one
    assert loaded.ttft_ms(2000) == lone.ttft_ms(2000)
    assert "8192-token chunk of 2000-token prompts" in loaded.describe(2000)


def _one_engine(rate: float, isl: int) -> tuple[float, float]:
    """TTFT attainment (500 ms) and p99 of one simulated prefill engine (the bundled
    profile's own engine) at ``rate`` req/s of ``isl``-token prompts for 300 s."""
    cfg = PlannerConfig(profile=BUNDLED, ttft_ms=500, itl_ms=20, max_gpu_budget=-1)
    spec = WorkloadSpec(workload=f"poisson:rate={rate:g},duration=300,isl={isl},osl=20")
    plan = prepare(cfg, spec, startup_delay_s=120, initial={"prefill": 1, "decode": 2})
    summary = run(plan, "static:1,2", progress=False, write_report=False).summary
    assert summary.ttft_ms.p99 is not None
    return summary.slo_attainment.ttft, summary.ttft_ms.p99


@pytest.mark.slow
def test_the_loaded_throughput_is_what_the_simulated_engine_sustains(bundled: Profile) -> None:
    isl = 1000
    lone = bundled.prefill.thpt_per_gpu(isl) / isl  # req/s one engine carries, one at a time
    loaded = LoadedPrefill(bundled.prefill, chunk_tokens=8192).thpt_per_gpu(isl) / isl
    # 85% of the loaded capacity is 1.3x what the lone profile says one engine carries: the
    # engine serves it within the SLO
    assert 0.85 * loaded > 1.25 * lone
    attainment, p99 = _one_engine(0.85 * loaded, isl)
    assert attainment >= 0.99 and p99 < 500
    # and 15% over it, the queue grows without bound
    attainment, p99 = _one_engine(1.15 * loaded, isl)
    assert attainment < 0.9 and p99 > 2000


def test_the_sizing_sees_the_loaded_throughput_only_when_asked(bundled: Profile) -> None:
    forecast = LoadForecast(num_req=27 * 180, isl=2000, osl=200)

    def engines(profile: object) -> int:
        return size_prefill(
            forecast,
            profile.prefill,  # type: ignore[attr-defined]
            interval_s=180,
            correction=1.0,
            gpus_per_replica=1,
            ttft_target_ms=500,
            attainment=0.99,
            service_scv=0.0,
            pooled=True,
        ).replicas

    assert engines(bundled) == 2  # 54000 tok/s against 55805 alone: no headroom left
    assert engines(at_load(bundled, 8192)) == 1
    assert at_load(bundled, None) is bundled


def test_the_chunk_budget_comes_from_the_config_then_the_profile_then_the_engines(
    bundled: Profile,
) -> None:
    cfg = PlannerConfig(profile=BUNDLED)
    published = EngineLimits(max_num_batched_tokens=2048)
    assert bundled.manifest is not None and bundled.manifest.engine.max_num_batched_tokens == 8192
    assert (
        prefill_chunk_tokens(
            cfg.model_copy(update={"max_num_batched_tokens": 4096}), bundled, published
        )
        == 4096
    )
    assert prefill_chunk_tokens(cfg, bundled, published) == 8192
    bare = replace(
        bundled,
        manifest=replace(bundled.manifest, engine=EngineShape(), prefill_engine=EngineShape()),
    )
    assert prefill_chunk_tokens(cfg, bare, published) == 2048
    assert prefill_chunk_tokens(cfg, None, None) == EngineLimits().max_num_batched_tokens


@pytest.mark.slow
@pytest.mark.parametrize(
    ("batching", "engines"),
    [(False, 2), (True, 1)],
    ids=["lone-prompt throughput: a second engine", "loaded throughput: one engine"],
)
def test_one_engine_is_kept_where_one_engine_serves(batching: bool, engines: int) -> None:
    # the scorecard's on/off bursts, its first 20 minutes: a burst at 24.7 req/s of
    # 2000-token prompts (with its burst factor, 99% of one engine alone, 82% of one loaded
    # engine), which the one simulated engine serves within the SLO either way
    cfg = PlannerConfig(
        profile=BUNDLED, ttft_ms=500, itl_ms=20, max_gpu_budget=-1, prefill_batching=batching
    )
    spec = WorkloadSpec(workload="onoff:rate=4,duration=1h,isl=2000,osl=200", duration_s=1200)
    plan = prepare(cfg, spec, startup_delay_s=120, initial={"prefill": 1, "decode": 1})
    result = run(plan, "planner", progress=False, write_report=False)
    summary = result.summary.to_json()
    assert summary["max_replicas"]["prefill"] == engines
    assert summary["slo_attainment"]["both"] >= 0.999
    said = [row.message for row in result.timeline if row.event == "tick" and row.message]
    loaded = "prefill at load: 67854 tok/s/GPU with a 8192-token chunk of 2000-token prompts"
    assert any(loaded in m for m in said) == batching
