"""Decision-quality scorecard: every policy on the same simulated cluster and workload.

Runs ``planner replay`` policies (static peak provisioning, a Kubernetes HPA, Dynamo's
defaults, our planner with its defaults, the cheapest static deployment meeting the SLO
target and the feasible clairvoyant oracle) on two real traces (read from
``$PLANNER_TRACE_DIR``, see ``tests/traces.py``) and two synthetic workloads, and prints one
markdown table of SLO attainment, GPU-hours, the ratios to the oracle, to best-static and to
the fluid bound, scale actions and flaps, all found in the same run; then, per workload,
whether issue 16's conditions held: the oracle meets the SLO target wherever best-static
does and costs no more than it, and every policy uses at least the fluid bound.

    python benchmarks/scorecard.py [--write] [--only NAME] [--jobs N] [--variant K=V ...]
        [--startup-delay S|none] [--startup-sweep S,S,...]

A replica added during a run starts as ``planner replay``'s do by default: each one's
start-up drawn phase by phase from the phase model of its engine
(:mod:`disagg_planner.simulator.startup`; the results' header gives each engine's median);
``--startup-delay S`` gives every replica the constant S seconds instead (120 was the default
before), and ``--startup-sweep`` runs several constants.

The wide-EP workload (``--only wide-ep``) runs a DeepSeek-V3 DP16/EP16 engine on GB200
(the bundled DP profile) and compares three ways of moving its capacity on the same
traffic: a fixed size (``fixed-dp16``, one engine), replica scaling (``planner``: whole
16-GPU engines) and elastic resizing (``elastic-ep``: the planner with ``elastic_ep``, which
resizes the one engine's DP size in steps of 4 ranks, its followers starting for as long as
a new replica does, the constant start-up or the phase model's median for the engine, and
joining, then NIXL EP's resize); it prints their GPU-hours, attainment and requests rejected
with 503 during resize pauses in a table of its own.

Two workloads compare planners told different things (issue 35; ``--only spec-decode``,
``--only kv-hit``): engines running speculative decoding, with the planner unaware of it,
told the accept length or reading it from the engines' counters; and Mooncake's prompts
with their prefix-cache hits, with the planner not discounting prefill (``kv_hit_rate: 0``)
or discounting it by the router's observed hit rate. Their rows show the GPU-hours each
signal saves.

The references of each workload (:mod:`disagg_planner.replay.bounds`) are found once, the
workloads in parallel, then every policy run in parallel with them handed over (``--jobs``,
default the number of cores). ``--write`` replaces the scorecard section of
benchmarks/RESULTS.md. ``--variant`` runs the planner policy with extra settings (for
tuning), e.g. ``--variant load_predictor=kalman``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

# Run as a script, this folder comes first on sys.path, and benchmarks/predictors.py would
# shadow the predictors package: look in the repository root first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# and this folder, last, for its own modules when loaded by path (the tests)
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.append(str(Path(__file__).resolve().parent))

from excess_gpu_hours import over_static
from flap_causes import flap_cause
from missed_windows import where_missed, window_scores

from disagg_planner.cli.arguments import seconds_or_none
from disagg_planner.config import PlannerConfig
from disagg_planner.errors import SpecError
from disagg_planner.replay.bounds import (
    References,
    adopt_references,
    compute_references,
    references_key,
)
from disagg_planner.replay.parallel import resolve_jobs
from disagg_planner.replay.runner import engine_spec_for_profile
from disagg_planner.replay.session import (
    ORACLE_WINDOW_S,
    ReplayPlan,
    WorkloadSpec,
    prepare,
    run,
    with_searched_start,
)
from disagg_planner.runtime.wiring import profile_for
from disagg_planner.simulator.engine_spec import EngineSpec, coerce
from disagg_planner.simulator.startup import PLANNING_QUANTILE, describe, phase_model
from tests.traces import AZURE_CONV, MOONCAKE_CONV, SharedTrace, for_script, servegen_folder

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
PROFILE = "h200_sxm/vllm/llama-3.1-8b-fp8/tp1"
POLICIES = (
    "static-peak",
    "hpa",
    "dynamo-default",
    "planner",
    "best-static",
    "oracle",
    "reactive-oracle",
)
# The wide-EP workload's policies: fixed size, replica scaling, elastic resizing.
WIDE_EP_POLICIES = ("fixed-dp16", "planner", "elastic-ep", "best-static")
WIDE_EP_PROFILE = "gb200/vllm/deepseek-v3/tp1-dp16-ep16"
WIDE_EP_ENGINE = "sim:deepseek-v3@gb200:tp1:dp16:ep16"
# The speculative-decoding workload (issue 35): the scorecard's engine running EAGLE-3 with 7
# draft tokens at an accept length of 2.77, the published one of
# yuhuili/EAGLE3-LLaMA3.1-Instruct-8B on MT-bench (K = 7, temperature 1: the comparison table
# of the nebius/EAGLE3-Llama-3.3-70B-Instruct model card), Dynamo's vLLM speculative-decoding
# example's draft head. Its policies: the planner unaware of it (sizing decode as if every
# iteration emitted one token), the planner told the draft length and the accept length, the
# planner told only the draft length (reading the accept length from the engines'
# speculative-decoding counters, as a user who does not know it would run it), and the
# cheapest static deployment.
SPEC_DECODE_ENGINE = "sim:llama-3.1-8b-fp8@h200_sxm:tp1:nextn=7:accept=2.77"
SPEC_DECODE_SETTINGS: dict[str, Any] = {
    "num_speculative_tokens": 7,
    "speculative_accept_length": 2.77,
}
# the planner policies of that workload and what each is told
SPEC_DECODE_PLANNERS: dict[str, dict[str, Any]] = {
    "planner": {},
    "planner-spec": SPEC_DECODE_SETTINGS,
    # the draft length only: the accept length read from the engines' counters
    "planner-spec-observed": {"num_speculative_tokens": 7},
}
# The KV prefix-hit workload (issue 35): Mooncake's conversation trace, whose prompts carry
# the prefix hashes the simulated engines' prefix caches are keyed by (long prompts: prefill
# dominates). Its policies: the planner reading the router's observed hit rate
# (``dynamo_component_router_kv_hit_rate``; ``kv_hit_rate`` null, its default), the planner
# not discounting prefill by the hit rate (``kv_hit_rate: 0``), and the cheapest static
# deployment. ``planner`` is the defaults, as on every workload: the row the
# decision targets judge.
KV_HIT_PLANNERS: dict[str, dict[str, Any]] = {
    "planner": {},
    "planner-kv-off": {"kv_hit_rate": 0.0},
}
# every planner policy of a workload that runs as the planner with settings of its own
PLANNER_VARIANTS = ("elastic-ep", *SPEC_DECODE_PLANNERS, *KV_HIT_PLANNERS)
# The elastic policy's settings on the wide-EP workload; its followers' start-up + join is the
# scenario's start-up (the same pods a new replica would start), set in _elastic_variant.
WIDE_EP_ELASTIC: dict[str, Any] = {
    "elastic_ep": "agg",
    "elastic_ep_mode": "nixl",
    "elastic_ep_min_dp": 16,
    "elastic_ep_max_dp": 32,
    "elastic_ep_dp_step": 4,
    "elastic_ep_gpus_per_rank": 1,
    "elastic_ep_follower_service": "agg-flw",
}


@dataclass(frozen=True)
class Scenario:
    name: str
    workload: WorkloadSpec
    ttft_ms: float
    itl_ms: float
    note: str
    # A shared trace: main puts its path into the workload (located) only for the scenarios
    # it runs, so the others' traces need not be there.
    trace: SharedTrace | None = None
    # issue 18's "<= 1.25x the feasible oracle" applies to real traces (and ServeGen's
    # production-client descriptions), not to the synthetic shapes
    real: bool = False
    # the simulated deployment (default: the scorecard's Llama-3.1-8B disaggregated one)
    profile: str = PROFILE
    engine: str | None = None
    mode: str = "disagg"
    # a wide-EP workload: the elastic-ep policy's settings and the policies it runs
    elastic: dict[str, Any] | None = None
    router: str = "least_loaded"
    settings: dict[str, Any] | None = None  # config settings of every policy of the workload
    # a workload comparing planners told different things (speculative decoding, KV hits):
    # each planner policy's own settings; its policies are those and best-static
    planners: dict[str, dict[str, Any]] | None = None

    @property
    def policies(self) -> tuple[str, ...]:
        if self.planners is not None:
            return (*self.planners, "best-static")
        return WIDE_EP_POLICIES if self.elastic is not None else POLICIES

    def located(self) -> Scenario:
        if self.trace is None:
            return self
        return replace(self, workload=replace(self.workload, trace=str(for_script(self.trace))))


SCENARIOS = (
    Scenario(
        "azure-conv x16",
        WorkloadSpec(scale_load=16),
        500,
        20,
        "Azure 2023 conversation trace (1 h), each request cloned 16x",
        trace=AZURE_CONV,
        real=True,
    ),
    Scenario(
        "mooncake-conv x4",
        WorkloadSpec(scale_load=4),
        5000,
        20,
        "Mooncake conversation trace (1 h, mean ISL 12k, p99 85k: TTFT target 5 s, because a "
        "lone 85k-token prefill alone takes ~2 s on one H200)",
        trace=MOONCAKE_CONV,
        real=True,
    ),
    Scenario(
        "sinusoid 5-45 req/s",
        WorkloadSpec(workload="sinusoid:min=5,max=45,period=600,duration=1800,isl=3000,osl=300"),
        500,
        20,
        "Dynamo's test load: 5 to 45 req/s, period 600 s, ISL/OSL 3000/300, 30 min",
    ),
    Scenario(
        "step 8->40 req/s",
        WorkloadSpec(workload="step:rates=8/40/8,at=600/1200,duration=1800,isl=2000,osl=200"),
        500,
        20,
        "a burst: 8 req/s, 40 req/s from 600 s to 1200 s, then 8 again",
    ),
    Scenario(
        "servegen m-large day",
        WorkloadSpec(
            trace=f"servegen:{servegen_folder('m-large')},start=1d,span=1d,speedup=24,rate=15"
        ),
        500,
        20,
        "ServeGen m-large (its ten largest clients, generated from their per-window rates, "
        "fitted inter-arrival laws and length PMFs), day 2 compressed to one hour at a mean "
        "of 15 req/s (peak about 3x the mean, minimum 0.4x)",
        real=True,
    ),
    Scenario(
        "on/off bursts",
        WorkloadSpec(workload="onoff:rate=4,duration=1h,isl=2000,osl=200"),
        500,
        20,
        "Markov-modulated Poisson: 4 req/s, busy spells of 1-5 min at 5-10x (20-40 req/s) "
        "after quiet spells of 10 min on average; ISL/OSL 2000/200, 1 h",
    ),
    Scenario(
        "heavy-tailed prompts",
        WorkloadSpec(workload="heavytail:rate=3,duration=1800,context=131072,osl=200"),
        5000,
        20,
        "3 req/s, lognormal ISL with median 4096 and p99 at the model's 131072-token context "
        "(about 1% of prompts longer than the engine accepts), OSL 200, 30 min; TTFT target "
        "5 s, as for Mooncake",
    ),
    Scenario(
        "diurnal ramp 3-30 req/s",
        WorkloadSpec(
            workload="diurnal:min=3,max=30,period=1h,peak=30m,duration=1h,isl=2000,osl=200"
        ),
        500,
        20,
        "a day's shape in one hour: 3 req/s rising slowly to 30 at 30 min and back, ISL/OSL "
        "2000/200",
    ),
    Scenario(
        "sinusoid 5-45 req/s, 1800 s",
        WorkloadSpec(workload="sinusoid:min=5,max=45,period=1800,duration=1h,isl=3000,osl=300"),
        500,
        20,
        "the test load with a slower period: 5 to 45 req/s, period 1800 s, ISL/OSL 3000/300, 1 h",
    ),
    Scenario(
        "wide-ep sinusoid 6-22 req/s",
        WorkloadSpec(workload="sinusoid:min=6,max=22,period=1200,duration=2400,isl=9000,osl=2000"),
        5000,
        100,
        "wide EP: one aggregated DeepSeek-V3 engine on GB200 at TP1, DP/EP 16 (16 GPUs; "
        "bundled profile gb200/vllm/deepseek-v3/tp1-dp16-ep16, about 0.8 req/s per rank at "
        "ISL/OSL 9000/2000), 6 to 22 req/s, period 1200 s, 40 min; TTFT target 5 s and ITL "
        "100 ms, as the elastic-EP ramp benchmark; a planner interval of 60 s; round-robin "
        "routing",
        profile=WIDE_EP_PROFILE,
        engine=WIDE_EP_ENGINE,
        mode="agg",
        elastic=WIDE_EP_ELASTIC,
        # vLLM balances a DP engine's ranks by their request counts; the simulator's
        # least-loaded router weighs KV tokens held, and floods the empty ranks of a grow
        # (or a new replica) until their queued prompts weigh as much
        router="round_robin",
        # both planner policies decide every minute: a 180 s interval adds 180 s to the
        # elastic policy's lead time (followers + resize + one interval)
        settings={"throughput_adjustment_interval_seconds": 60.0},
    ),
    Scenario(
        "spec-decode sinusoid 5-45 req/s",
        WorkloadSpec(workload="sinusoid:min=5,max=45,period=600,duration=1800,isl=3000,osl=300"),
        500,
        20,
        "Dynamo's test load (5 to 45 req/s, period 600 s, ISL/OSL 3000/300, 30 min) on engines "
        "running speculative decoding (EAGLE-3, 7 draft tokens, accept length 2.77: "
        f"`{SPEC_DECODE_ENGINE}`); the profile is the plain engine's. `planner` does not know "
        "of it, `planner-spec` is told `num_speculative_tokens` 7 and "
        "`speculative_accept_length` 2.77 and sizes decode by it, `planner-spec-observed` is "
        "told only `num_speculative_tokens` 7 and sizes decode by the accept length it reads "
        "from the engines' `vllm:spec_decode_*` counters",
        engine=SPEC_DECODE_ENGINE,
        planners=SPEC_DECODE_PLANNERS,
    ),
    Scenario(
        "kv-hit mooncake-conv x4",
        WorkloadSpec(scale_load=4),
        5000,
        20,
        "the mooncake-conv x4 workload (1 h, each request cloned 4x, mean ISL 12k: prefill "
        "dominates; TTFT target 5 s); the simulated prefill engines keep a prefix cache keyed "
        "by the trace's block hashes and the router exports the share of each prompt found in it "
        "(`dynamo_component_router_kv_hit_rate`). `planner` leaves `kv_hit_rate` null (its "
        "default) and discounts prefill by the router's observed hit rate; `planner-kv-off` "
        "is configured `kv_hit_rate` 0 (sizing prefill for every prompt token)",
        trace=MOONCAKE_CONV,
        real=True,
        planners=KV_HIT_PLANNERS,
    ),
)


def engine_of(scenario: Scenario) -> str:
    """The engine spec ``scenario`` simulates: its own, or its profile's."""
    if scenario.engine is not None:
        return scenario.engine
    cfg = PlannerConfig(profile=scenario.profile, mode=scenario.mode)
    return engine_spec_for_profile(profile_for(cfg))


def follower_ready_s(scenario: Scenario, startup: float | None) -> float:
    """How long the elastic policy's followers take to start and join: the constant start-up
    ``startup``, or (None: the phase model) the phase model's median start-up of the
    scenario's engine, the pods a new replica would start."""
    if startup is not None:
        return startup
    return phase_model(coerce(engine_of(scenario))).median_plan().total_s


def startup_text(delays: list[float | None], scenarios: list[Scenario]) -> str:
    """What the results say of the start-up they ran with: the constant (or the sweep's
    constants), or the phase model's median and planning quantile for each engine that ran
    (:func:`disagg_planner.simulator.startup.describe`; engines with the same phase model are
    named once)."""
    if len(delays) > 1:
        sweep = ", ".join(f"{d:g}" for d in delays if d is not None)
        return f"start-up delays {sweep} s (the sweep; each constant, GPUs charged throughout)"
    if delays[0] is not None:
        return f"start-up delay {delays[0]:g} s (constant, GPUs charged throughout)"
    specs: dict[str, EngineSpec] = {}
    for s in scenarios:
        spec = coerce(engine_of(s))
        if all(phase_model(spec) != phase_model(x) for x in specs.values()):
            specs[engine_of(s)] = spec
    said = describe(None, specs)
    p = f"p{round(PLANNING_QUANTILE * 100)}"
    medians = []
    for engine in specs:
        role = said[engine]
        assert isinstance(role, dict)
        medians.append(
            f"median {role['median_total_s']:.0f} s, {p} {role[f'{p}_total_s']:.0f} s for "
            f"`{engine}`"
        )
    followers = (
        "; the elastic-ep policy's followers start for their engine's median"
        if any(s.elastic is not None for s in scenarios)
        else ""
    )
    return (
        "start-up: each replica's drawn phase by phase from the phase model "
        f"(`simulator/startup.py`: {'; '.join(medians)}; GPUs charged from the "
        f"{str(said['gpu_charged_from']).replace('_', ' ')}{followers})"
    )


def _plan(scenario: Scenario, variant: dict[str, Any], startup: float | None) -> ReplayPlan:
    cfg = PlannerConfig(
        profile=scenario.profile,
        mode=scenario.mode,
        ttft_ms=scenario.ttft_ms,
        itl_ms=scenario.itl_ms,
        max_gpu_budget=-1,
        **((scenario.settings or {}) | variant),
    )
    return prepare(
        cfg,
        scenario.workload,
        engine=scenario.engine,
        startup_delay_s=startup,
        router=scenario.router,
    )


def _elastic_variant(scenario: Scenario, startup: float | None) -> dict[str, Any]:
    """The elastic-ep policy's settings: the scenario's, followers starting as replicas do
    (:func:`follower_ready_s`)."""
    assert scenario.elastic is not None
    return scenario.elastic | {
        "elastic_ep_follower_ready_seconds": follower_ready_s(scenario, startup)
    }


def _references(args: tuple[Scenario, float | None]) -> tuple[str, References]:
    """A workload's references, found once for all of its policies."""
    scenario, startup = args
    plan = _plan(scenario, {}, startup)
    refs = compute_references(plan, window_s=ORACLE_WINDOW_S)
    return references_key(plan, window_s=ORACLE_WINDOW_S), refs


def _run_one(
    args: tuple[Scenario, str, dict[str, Any], float | None, tuple[str, References] | None],
) -> dict[str, Any]:
    scenario, policy, variant, startup, found = args
    if policy == "elastic-ep":
        variant = variant | _elastic_variant(scenario, startup)
    if scenario.planners is not None and policy in scenario.planners:
        variant = variant | scenario.planners[policy]
    plan = _plan(scenario, variant, startup)
    if found is not None:
        # the same key: the same requests, cluster, targets and floors (a variant may change
        # them, and then this run finds its own)
        adopt_references(*found)
    # every policy starts with the searched need (the oracle and best-static with their own)
    plan = with_searched_start(plan)
    name = policy
    if policy in PLANNER_VARIANTS:
        name = "planner"
    elif policy == "fixed-dp16":
        name = "static:1"
        plan = replace(plan, setup=replace(plan.setup, initial_replicas={"agg": 1}))
    if policy == "static-peak":
        peak = {r: max(n.replicas[r] for n in plan.needs) for r in plan.setup.specs}
        name = "static:" + ",".join(str(peak[r]) for r in plan.setup.specs)
        plan = replace(plan, setup=replace(plan.setup, initial_replicas=peak))
    result = run(plan, name, progress=False)
    summary = result.summary.to_json()
    static = (summary.get("best_static") or {}).get("replicas")
    if policy in ("planner", *PLANNER_VARIANTS):
        # the causes the targets print beside a miss (decision_targets)
        summary["flap_cause"] = flap_cause(result.timeline, result.reversals)
        if static:  # the GPU-hour and attainment targets are best-static's
            gpus = {role: spec.gpus for role, spec in plan.setup.specs.items()}
            summary["over_best_static"] = over_static(result.timeline, static, gpus).text()
            scores = window_scores(
                [r.arrival_s for r in plan.requests],
                result.records,
                ttft_ms=scenario.ttft_ms,
                itl_ms=scenario.itl_ms,
            )
            summary["missed_where"] = where_missed(
                scores, result.timeline, target=attainment_bar(summary)
            )
    renamed = ("fixed-dp16", *PLANNER_VARIANTS)
    summary["policy"] = policy if policy in renamed else summary["policy"]
    summary["scenario"] = scenario.name
    summary["real_traffic"] = scenario.real
    summary["startup_delay_s"] = startup  # None: the phase model
    summary["label"] = policy
    print(f"  {scenario.name} / {name}: done", file=sys.stderr, flush=True)
    return summary


def markdown(rows: list[dict[str, Any]]) -> str:
    head = (
        "| scenario | policy | SLO both | TTFT p99 ms | ITL p99 ms | GPU-h | x oracle "
        "| x best-static | x fluid | actions | flaps | max P/D |"
    )
    lines = [head, "|" + "---|" * 12]
    for s in rows:
        mx = s["max_replicas"]
        lines.append(
            f"| {s['scenario']} | {s['policy']} | {s['slo_attainment']['both']:.2%} "
            f"| {_f(s['ttft_ms']['p99'])} | {_f(s['itl_ms']['p99'])} | {s['gpu_hours']:.2f} "
            f"| {_r(s.get('gpu_hours_ratio_to_oracle'))} "
            f"| {_r(s.get('gpu_hours_ratio_to_best_static'))} "
            f"| {_r(s.get('gpu_hours_ratio_to_fluid_bound'))} "
            f"| {sum(s['scale_actions'].values())} "
            f"| {sum(s['flaps'].values())} | {'/'.join(str(v) for v in mx.values())} |"
        )
    return "\n".join(lines)


def wide_ep_table(rows: list[dict[str, Any]]) -> str:
    """The wide-EP workloads' comparison: fixed size, replica scaling, elastic resizing."""
    head = (
        "| scenario | policy | SLO both | TTFT p99 ms | GPU-h | x best-static | rejected (503) "
        "| failed | replicas max | DP min-max (mean) | resizes (paused s) |"
    )
    lines = [head, "|" + "---|" * 11]
    for s in rows:
        elastic = s.get("elastic_ep")
        dp = resizes = "-"
        if elastic is not None:
            dp = f"{elastic['dp_min']}-{elastic['dp_max']} ({elastic['dp_mean']:.1f})"
            resizes = f"{len(elastic['resizes'])} ({elastic['paused_s']:.1f})"
        lines.append(
            f"| {s['scenario']} | {s['policy']} | {s['slo_attainment']['both']:.2%} "
            f"| {_f(s['ttft_ms']['p99'])} | {s['gpu_hours']:.2f} "
            f"| {_r(s.get('gpu_hours_ratio_to_best_static'))} | {s.get('rejected', 0)} "
            f"| {s['failed']} | {'/'.join(str(v) for v in s['max_replicas'].values())} "
            f"| {dp} | {resizes} |"
        )
    return "\n".join(lines)


def conditions(rows: list[dict[str, Any]]) -> list[str]:
    """Per workload, issue 16's conditions, each held or violated, with its figures.

    1. The oracle meets the SLO target wherever best-static does: where best-static meets it
       over every request, the oracle must too; where it meets it only over the requests
       some deployment can serve (``qualifies``), the oracle must meet it there as well.
    2. The oracle costs no more than best-static.
    3. Every policy's GPU-hours are at least the fluid bound.
    The figures are the summaries' references, the ones every ratio divides by."""
    lines = []
    for scenario in dict.fromkeys(s["scenario"] for s in rows):
        mine = [s for s in rows if s["scenario"] == scenario]
        ref = mine[0]
        target = float(ref["slo_target"])
        static = ref["best_static"]
        oracle_att, static_att = float(ref["oracle_slo_attainment"]), static["slo_attainment"]
        n, unservable = int(ref["requests"]), int(ref["unservable_requests"])
        servable_share = (n - unservable) / n if n else 1.0
        if static["meets_target"]:
            bar, over = target, "every request"
        elif static["qualifies"]:
            bar, over = target * servable_share, f"the {n - unservable} servable of {n}"
        else:
            bar, over = -math.inf, ""
        if bar == -math.inf:
            meets = (
                f"not tested: best-static ({static_att:.2%}) meets the {target:.0%} target nowhere"
            )
        else:
            meets = (
                f"{_held(oracle_att >= bar)}: oracle {oracle_att:.2%} >= {bar:.2%} "
                f"(target {target:.0%} over {over}; best-static {static_att:.2%})"
            )
        oracle_h, static_h = float(ref["oracle_gpu_hours"]), float(static["gpu_hours"])
        cost = (
            f"{_held(oracle_h <= static_h)}: oracle {oracle_h:.3f} <= best-static "
            f"{static_h:.3f} GPU-h ({ref['oracle_plan']} plan)"
        )
        fluid = ref.get("fluid_bound_gpu_hours")
        if fluid is None:
            floor = "not tested: no profile, no fluid bound"
        else:
            cheapest = min(mine, key=lambda s: s["gpu_hours"])
            below = [s["policy"] for s in mine if s["gpu_hours"] < fluid]
            floor = (
                f"{_held(not below)}: fluid bound {fluid:.3f} GPU-h <= cheapest "
                f"{cheapest['policy']} {cheapest['gpu_hours']:.3f}"
                + (f" (below it: {', '.join(below)})" if below else "")
            )
        lines.append(
            f"- **{scenario}**: oracle meets the target where best-static does: {meets}; "
            f"costs no more: {cost}; every policy >= the fluid bound: {floor}"
        )
    return lines


FLAPS_PER_HOUR = 2.0
ORACLE_RATIO_REAL = 1.25


# Where best-static itself misses 99 %, the planner may fall this far short of it (issue 29).
STATIC_SHORTFALL = 0.003


def attainment_bar(row: dict[str, Any]) -> float:
    """Issue 29's attainment target for one policy's run: 99 %, or, where best-static itself
    is under 99 %, :data:`STATIC_SHORTFALL` (0.3 points) under best-static's."""
    static_att = float(row["best_static"]["slo_attainment"])
    return 0.99 if static_att >= 0.99 else static_att - STATIC_SHORTFALL


def attainment_target(row: dict[str, Any]) -> str:
    """:func:`attainment_bar`, held or missed with its figures, and where a miss's requests
    arrived (``missed_where``, the run's own account) when it is missed."""
    att = row["slo_attainment"]["both"]
    static_att = float(row["best_static"]["slo_attainment"])
    oracle = f"oracle {float(row['oracle_slo_attainment']):.2%}"
    bar = attainment_bar(row)
    ok = att >= bar - 1e-12
    where = row.get("missed_where")
    cause = f" (cause: {where})" if where and not ok else ""
    if static_att >= 0.99:
        return f"{_met(ok)} attainment {att:.2%} >= 99% ({oracle}){cause}"
    return (
        f"{_met(ok)} attainment {att:.2%} >= {bar:.2%}, best-static's "
        f"{static_att:.2%} less 0.3 points (it misses 99%; {oracle}){cause}"
    )


def decision_targets(rows: list[dict[str, Any]], policy: str = "planner") -> list[str]:
    """Per workload, the targets for ``policy`` (the planner with its defaults), each held or
    missed with its figures: attainment >= 99 %, or within 0.3 points of best-static's where
    that misses 99 % (issue 29: :func:`attainment_target`); GPU-hours <= best-static;
    <= 1.25x the oracle on real traffic; higher attainment than the HPA, and fewer
    GPU-hours wherever both reach 99 %; flaps <= 2 per hour (issue 18)."""
    lines = []
    for scenario in dict.fromkeys(s["scenario"] for s in rows):
        mine = {s["label"]: s for s in rows if s["scenario"] == scenario}
        me = mine.get(policy)
        if me is None:
            continue
        att = me["slo_attainment"]["both"]
        checks = [attainment_target(me)]
        reactive = mine.get("reactive-oracle")
        if reactive is not None and att < 0.99:
            ratt = reactive["slo_attainment"]["both"]
            checks.append(
                f"reactive-oracle {ratt:.2%} (each minute's need ordered once seen, no "
                "backlog term)"
            )
        static_h = float(me["best_static"]["gpu_hours"])
        over = me.get("over_best_static")
        # two figures equal to two decimals, but not equal, are told apart with more (a run
        # metered a few seconds longer than best-static's, with the same replicas throughout)
        digits = 2
        while (
            digits < 6
            and me["gpu_hours"] != static_h
            and f"{me['gpu_hours']:.{digits}f}" == f"{static_h:.{digits}f}"
        ):
            digits += 1
        checks.append(
            f"{_met(me['gpu_hours'] <= static_h)} {me['gpu_hours']:.{digits}f} <= best-static "
            f"{static_h:.{digits}f} GPU-h"
            + (f" (cause: {over})" if over and me["gpu_hours"] > static_h else "")
        )
        if me.get("real_traffic"):
            ratio = float(me["gpu_hours"]) / float(me["oracle_gpu_hours"])
            oracle = mine.get("oracle")
            checks.append(
                f"{_met(ratio <= ORACLE_RATIO_REAL)} {ratio:.2f}x oracle <= {ORACLE_RATIO_REAL}x"
                + (
                    f" (cause: {over_oracle(me, oracle)})"
                    if oracle is not None and ratio > ORACLE_RATIO_REAL
                    else ""
                )
            )
        hpa = mine.get("hpa")
        if hpa is not None:
            hatt = hpa["slo_attainment"]["both"]
            checks.append(f"{_met(att > hatt)} attainment above hpa's {hatt:.2%}{_tie(att, hatt)}")
            if att >= 0.99 and hatt >= 0.99:
                fewer = me["gpu_hours"] < hpa["gpu_hours"]
                smallest = all(
                    n <= 1 for n in (*me["max_replicas"].values(), *hpa["max_replicas"].values())
                )
                checks.append(
                    f"{_met(fewer)} fewer GPU-h than hpa "
                    f"({me['gpu_hours']:.2f} vs {hpa['gpu_hours']:.2f})"
                    + (
                        " (both ran one replica per role throughout)"
                        if smallest and not fewer
                        else ""
                    )
                )
        hours = float(me["duration_s"]) / 3600.0
        flaps = sum(me["flaps"].values())
        # the count against what the rate allows over the metered span: a run a few seconds
        # short of an hour allows 1.99 flaps at 2/h, which a rounded rate would hide
        allowed = FLAPS_PER_HOUR * hours
        cause = me.get("flap_cause")
        checks.append(
            f"{_met(flaps <= allowed)} {flaps} flaps in {hours * 60:.1f} min <= "
            f"{FLAPS_PER_HOUR:g}/h ({allowed:.2f} allowed)"
            + (f" (cause: {cause})" if cause and flaps > allowed else "")
        )
        lines.append(f"- **{scenario}** ({policy}): " + "; ".join(checks))
    return lines


def over_oracle(me: dict[str, Any], oracle: dict[str, Any]) -> str:
    """Where a run's GPU-hours above the oracle's run went, role by role, and how many
    changes the oracle made for its figure (it follows each minute's need, ordered one
    start-up ahead, which a controller that sees no minute before it starts cannot)."""
    mine, its = me["gpu_hours_by_role"], oracle["gpu_hours_by_role"]
    roles = ", ".join(
        f"{role} {mine[role]:.2f} against the oracle's {its.get(role, 0.0):.2f} GPU-h"
        for role in mine
    )
    actions = sum(oracle["scale_actions"].values())
    flaps = sum(oracle["flaps"].values())
    return f"{roles}; the oracle changes replicas {actions} times ({flaps} flaps) for its figure"


def _tie(att: float, other: float) -> str:
    """What an attainment equal to the one it should exceed says: none above a run that
    serves every request exists."""
    if f"{att:.4%}" != f"{other:.4%}":
        return ""
    return " (both serve every request)" if att >= 1.0 - 1e-12 else " (the same share)"


def startup_sweep(rows: list[dict[str, Any]], policy: str = "planner") -> list[str]:
    """Issue 18's start-up sweep, per workload run at several constant start-up delays
    (``--startup-sweep``; a run of the phase model is no point of it): attainment >= 99 % at
    every delay, GPU-hours growing by at most 15 % from the shortest."""
    lines = []
    for scenario in dict.fromkeys(s["scenario"] for s in rows):
        mine = sorted(
            (
                s
                for s in rows
                if s["scenario"] == scenario
                and s["label"] == policy
                and s["startup_delay_s"] is not None
            ),
            key=lambda s: s["startup_delay_s"],
        )
        if len(mine) < 2:
            continue
        base = mine[0]["gpu_hours"]
        cells = [
            f"{s['startup_delay_s']:g} s: {s['slo_attainment']['both']:.2%} / "
            f"{s['gpu_hours']:.2f} GPU-h ({s['gpu_hours'] / base - 1:+.0%})"
            for s in mine
        ]
        worst = min(s["slo_attainment"]["both"] for s in mine)
        growth = max(s["gpu_hours"] for s in mine) / base - 1
        lines.append(
            f"- **{scenario}** ({policy}) start-up sweep: "
            + "; ".join(cells)
            + f". {_met(worst >= 0.99)} attainment >= 99% at every delay (lowest {worst:.2%}); "
            f"{_met(growth <= 0.15)} GPU-hours +{growth:.0%} <= +15%"
        )
    return lines


def _met(ok: bool) -> str:
    return "MET" if ok else "MISSED"


def _held(ok: bool) -> str:
    return "held" if ok else "VIOLATED"


def _r(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _f(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.0f}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="Update benchmarks/RESULTS.md.")
    parser.add_argument("--only", action="append", help="Scenario name prefix to run.")
    parser.add_argument("--policy", action="append", help="Policies (default: all).")
    parser.add_argument(
        "--jobs",
        type=int,
        help="Parallel processes (default: the number of cores).",
    )
    parser.add_argument(
        "--startup-delay",
        type=seconds_or_none,
        metavar="S|none",
        help="Seconds from scale-up to ready, the same for every replica (e.g. 120, the "
        "constant the scorecard ran with before). Default, or 'none': each replica's start-up "
        "drawn phase by phase from its engine's phase model (simulator/startup.py), as "
        "planner replay does; the elastic-ep policy's followers take the phase model's median.",
    )
    parser.add_argument(
        "--startup-sweep",
        metavar="S,S,...",
        help="Run the policies at each of these start-up delays (e.g. 30,60,120,200,300) "
        "instead of --startup-delay, and print issue 18's start-up sweep check.",
    )
    parser.add_argument("--variant", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--json", action="store_true")
    return parser


def variants(items: list[str]) -> dict[str, Any]:
    """``--variant KEY=VALUE`` settings as config values (``none``/``null``: None; the
    config schema parses the rest)."""
    out: dict[str, Any] = {}
    for item in items:
        key, _, value = item.partition("=")
        out[key] = None if value.lower() in {"none", "null"} else value
    return out


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        jobs = resolve_jobs(args.jobs)
    except SpecError as e:
        parser.error(str(e))
    variant = variants(args.variant)
    delays: list[float | None] = [args.startup_delay]
    if args.startup_sweep:
        try:
            constants = [float(x) for x in args.startup_sweep.split(",")]  # constants only
        except ValueError:
            parser.error(
                f"--startup-sweep {args.startup_sweep!r}: expected seconds, e.g. 30,120,300"
            )
        delays = list(constants)
        if any(not math.isfinite(d) or d < 0 for d in constants):
            parser.error(f"--startup-sweep {args.startup_sweep!r}: delays must be >= 0")
    # The arguments are checked before the traces are looked for: a bad one is refused even
    # where the traces are missing.
    scenarios = [
        s.located()
        for s in SCENARIOS
        if not args.only or any(s.name.startswith(o) for o in args.only)
    ]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(jobs) as pool:
        runs = [(s, d) for d in delays for s in scenarios]
        found = list(pool.map(_references, runs))
        print(f"references found in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        tasks = [
            (
                s,
                p,
                variant if p in PLANNER_VARIANTS else {},
                d,
                refs,
            )
            for (s, d), refs in zip(runs, found, strict=True)
            for p in (args.policy or s.policies)
        ]
        rows = list(pool.map(_run_one, tasks))
    wall = time.perf_counter() - t0
    every = rows
    wide = [r for r in rows if any(s.elastic and s.name == r["scenario"] for s in scenarios)]
    rows = [r for r in rows if r not in wide]
    table = markdown(rows) if rows else ""
    if wide:
        table += ("\n\n" if table else "") + wide_ep_table(wide)
    held = "\n".join([*conditions(rows), "", *decision_targets(rows), *startup_sweep(rows)])
    command = "python benchmarks/scorecard.py " + " ".join(argv or sys.argv[1:])
    if args.json:
        print(json.dumps(every, indent=2, default=str))
    else:
        print(table)
        print(f"\n{held}")
        print(f"\n{len(every)} runs in {wall:.0f} s")
    if args.write:
        notes = "\n".join(f"- **{s.name}**: {s.note}" for s in scenarios)
        section = (
            f"Command: `{command.strip()}` (wall {wall:.0f} s on the 2-core dev machine).\n"
            f"Engine `sim:llama-3.1-8b-fp8@h200_sxm:tp1` (bundled profile {PROFILE}), "
            f"{startup_text(delays, scenarios)}, ITL target 20 ms; every policy starts "
            "with the replicas the first minutes need (what the oracle's searched plan has "
            "until a first decision could land, one start-up plus one interval: the same "
            "start for every policy; a `static:` row keeps its own), and is metered from "
            "t = 0 until its own last request finished. `x oracle` is GPU-hours over the "
            "feasible oracle's run (a clairvoyant per-minute plan found by simulation, "
            "ordered one start-up ahead, the constant or the phase model's p99, or the best "
            "static deployment where that is cheaper), `x best-static` over the cheapest "
            "static deployment meeting the target, `x fluid` over the fluid "
            "bound (every request's own work at the profile's best throughput per GPU). "
            "`reactive-oracle` runs the oracle's per-minute needs, each ordered only once its "
            "minute has begun (one 15 s fast check in), none ahead and with no term for the "
            "backlog a late order leaves: what a controller sized exactly to each minute's "
            "load as it is seen reaches with this start-up (a yardstick, not a bound: where a "
            "rise no trend foretells outruns the start-up, only capacity held ahead serves "
            "it).\n\n"
            f"{notes}\n\n{table}\n\n{held}\n"
        )
        _write_section(section)
    return 0


def _write_section(body: str) -> None:
    begin, end = "<!-- BEGIN scorecard -->", "<!-- END scorecard -->"
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    block = f"{begin}\n## Decision-quality scorecard\n\n{body}{end}"
    if begin in text and end in text:
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    RESULTS.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
