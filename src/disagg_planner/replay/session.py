"""One replay: load the workload, pick the engine, build each policy, run them on the same
simulated cluster, write the outputs. Used by ``planner replay`` and the scorecard."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.errors import SpecError
from disagg_planner.predictors.traces import read_trace
from disagg_planner.replay import bounds, default_workload
from disagg_planner.replay.bounds import References, compute_references, reference_summary
from disagg_planner.replay.elastic import check_elastic_setup, retry_paused
from disagg_planner.replay.hpa import HpaBehavior
from disagg_planner.replay.oracle import initial_replicas, plan_needs
from disagg_planner.replay.plan import ReplayPlan
from disagg_planner.replay.policies import HpaPolicy, PlannerPolicy, Policy, StaticPolicy
from disagg_planner.replay.progress import RunProgress
from disagg_planner.replay.replay_summary import RunSetup, SloTargets
from disagg_planner.replay.report import replay_report_sections
from disagg_planner.replay.runner import (
    ClusterSetup,
    ReplayResult,
    engine_spec_for_profile,
    run_policy,
    write_outputs,
)
from disagg_planner.replay.summary import FLAP_WINDOW_S
from disagg_planner.report.recorder import DiagnosticsRecorder
from disagg_planner.runtime.wiring import profile_for
from disagg_planner.simulator import engine_spec as engine_specs
from disagg_planner.simulator import startup
from disagg_planner.simulator.cluster import DEFAULT_DRAIN_GRACE_S
from disagg_planner.simulator.engine_spec import EngineSpec
from disagg_planner.simulator.request import RequestLike
from disagg_planner.simulator.workloads import parse_workload, scale_load, speedup

log = logging.getLogger(__name__)

ORACLE_WINDOW_S = 60.0


@dataclass(frozen=True)
class WorkloadSpec:
    trace: str | None = None
    workload: str | None = None
    trace_format: str | None = None
    speedup: float = 1.0
    scale_load: float = 1.0
    duration_s: float | None = None  # keep only arrivals before this time
    seed: int = 0
    # Clones of one request (scale_load) arrive spread over this many seconds, as independent
    # users would; a 1 s spread turns every request into a synchronised burst of K.
    clone_jitter_s: float = 30.0
    skip_bad_rows: bool = False  # count and skip malformed trace rows (--skip-bad-rows)


def load_requests(spec: WorkloadSpec) -> list[RequestLike]:
    """The requests of a trace or synthetic workload, time-compressed and scaled."""
    if spec.trace and spec.workload:
        raise SpecError("give either --trace or --workload, not both")
    source: Iterator[Any]
    if spec.workload:
        source = parse_workload(spec.workload, seed=spec.seed)
    elif spec.trace:
        source = read_trace(
            spec.trace, trace_format=spec.trace_format, skip_bad_rows=spec.skip_bad_rows
        )
    else:
        # No third-party file ships with the package: the default is generated from facts
        # measured from the Azure 2023 conversation trace (replay/default_workload.json).
        source = default_workload.requests(seed=spec.seed)
    if spec.speedup != 1.0:
        source = speedup(source, spec.speedup)
    if spec.duration_s is not None:
        limit = spec.duration_s
        source = (r for r in _until(source, limit))
    if spec.scale_load != 1.0:
        source = scale_load(source, spec.scale_load, seed=spec.seed, jitter_s=spec.clone_jitter_s)
    requests: list[RequestLike] = list(source)
    if not requests:
        raise SpecError("the workload has no requests")
    return requests


def _until(requests: Iterator[Any], limit_s: float) -> Iterator[Any]:
    for r in requests:
        if r.arrival_s >= limit_s:
            return
        yield r


def prepare(
    config: PlannerConfig,
    workload: WorkloadSpec,
    *,
    engine: str | None = None,
    startup_delay_s: float | None = None,
    initial: dict[str, int] | None = None,
    router: str = "least_loaded",
    drain_grace_s: float | None = DEFAULT_DRAIN_GRACE_S,
    migrate_on_drain: bool = False,
    requests: Sequence[RequestLike] | None = None,
    worker_shutdown_s: float | None = None,
) -> ReplayPlan:
    """The shared part of one replay. ``startup_delay_s``: a constant start-up of every new
    replica, or ``None`` for the phase model of :mod:`disagg_planner.simulator.startup`.
    ``drain_grace_s`` bounds a removed replica's drain (``None``: unbounded); after it the
    requests left on it are cancelled, or with ``migrate_on_drain`` moved to another.
    ``worker_shutdown_s``: a removed replica goes through Dynamo's staged shutdown with that
    total budget (:mod:`disagg_planner.simulator.shutdown`) instead.
    ``requests``: the requests themselves (a benchmark's own workload, sorted by arrival)
    instead of those of ``workload``, whose seed still seeds the simulator."""
    if config.mode not in ("disagg", "agg"):
        raise SpecError(f"replay simulates disagg or agg deployments, not mode={config.mode}")
    profile = profile_for(config) if (config.throughput_scaling_active or engine is None) else None
    spec_text = engine or (engine_spec_for_profile(profile) if profile is not None else None)
    if spec_text is None:
        raise SpecError("give --engine sim:MODEL@GPU[:tpN] or a profile with a manifest")
    spec = engine_specs.parse(spec_text)
    roles = ("agg",) if config.mode == "agg" else ("prefill", "decode")
    specs = dict.fromkeys(roles, spec)
    check_elastic_setup(config, specs, initial)
    if requests is None:
        requests = load_requests(workload)
    elif not requests:
        raise SpecError("the workload has no requests")
    requests = list(requests)
    duration = max(r.arrival_s for r in requests)
    floors = {r: config.min_endpoint_for(r) for r in roles}
    if warning := bounds.refused_warning(requests, specs):
        log.warning("replay: %s", warning)
    limits = bounds.context_limits(specs)
    sized = [r for r in requests if bounds.fits_context(r, limits)]  # refused: not sized for
    needs = plan_needs(
        sized,
        specs=specs,
        mode=config.mode,
        window_s=ORACLE_WINDOW_S,
        duration_s=duration,
        ttft_ms=config.ttft_ms,
        itl_ms=config.itl_ms,
        floors=floors,
        kv_transfer_bandwidth_bps=64e9,
    )
    # Every policy starts warm, sized for what the trace needs until a first decision could
    # land (one interval plus one startup): the trace begins mid-day, not at a cold start.
    lead = start_lead_s(config, startup_delay_s, specs)
    start = initial or initial_replicas(needs, window_s=ORACLE_WINDOW_S, lead_s=lead)
    if not initial:
        start, oversized = bounds.sane_initial(
            start, sized, specs=specs, floors=floors, profile=profile, lead_s=lead,
            ttft_ms=config.ttft_ms, itl_ms=config.itl_ms,
        )  # fmt: skip
        start, over_budget = bounds.within_budget(
            start, specs=specs, floors=floors, max_gpus=config.max_gpu_budget
        )
        for warning in filter(None, (oversized, over_budget)):
            log.warning("replay: %s", warning)
    start = _one_elastic_engine(config, start)
    setup = ClusterSetup(
        mode=config.mode,
        specs=specs,
        initial_replicas=start,
        startup_delay_s=startup_delay_s,
        seed=workload.seed,
        router=router,
        model_label=config.model_name or spec.model.name,
        namespace=config.namespace,
        drain_grace_s=drain_grace_s,
        migrate_on_drain=migrate_on_drain,
        worker_shutdown_s=worker_shutdown_s,
        retry_paused=retry_paused(config),
        elastic_role=config.elastic_ep,
    )
    return ReplayPlan(config, profile, setup, requests, needs)


def start_lead_s(
    config: PlannerConfig, startup_delay_s: float | None, specs: Mapping[str, EngineSpec]
) -> float:
    """How much of the trace the replicas a replay starts with are sized for: until a first
    decision could land, one throughput interval plus one start-up."""
    lead = startup.planning_lead_s(startup_delay_s, specs)
    return lead + config.throughput_adjustment_interval_seconds


def with_searched_start(plan: ReplayPlan) -> ReplayPlan:
    """``plan`` starting with the replicas its oracle's searched plan has over the start's
    lead (:func:`start_lead_s`), not the estimate :func:`prepare` starts from.

    The estimate is the search's starting point, sized from the profile's throughput alone;
    where the search finds another need (more for long prompts whose own prefill takes most
    of the TTFT target, fewer for engines faster than their profile, such as speculative
    decoding's), the oracle and best-static start with their own need while the others
    start elsewhere, and the first minutes measure the start rather than the policies. A
    benchmark comparing policies starts them all with the searched need (the references are
    found once per plan and kept)."""
    refs = compute_references(plan, window_s=ORACLE_WINDOW_S)
    setup = plan.setup
    lead = start_lead_s(plan.config, setup.startup_delay_s, setup.specs)
    start = initial_replicas(refs.oracle_needs, window_s=ORACLE_WINDOW_S, lead_s=lead)
    floors = {r: plan.config.min_endpoint_for(r) for r in setup.specs}
    start, _ = bounds.within_budget(
        start, specs=setup.specs, floors=floors, max_gpus=plan.config.max_gpu_budget
    )
    start = _one_elastic_engine(plan.config, start)
    return replace(plan, setup=replace(setup, initial_replicas=start))


def _one_elastic_engine(config: PlannerConfig, start: dict[str, int]) -> dict[str, int]:
    """``start`` with the elastic-EP role at one engine, resized in place (every policy
    starts with it; the baselines scale its replicas, which is what elastic resizing is
    compared with)."""
    if config.elastic_ep is None:
        return start
    return {**start, config.elastic_ep: 1}


DYNAMO_DEFAULTS: dict[str, Any] = {
    "enable_throughput_scaling": True,
    "enable_load_scaling": False,
    "load_predictor": "arima",
    "throughput_adjustment_interval_seconds": 180.0,
    "no_correction": False,
    "load_predictor_quantile": None,
    "ttft_attainment_target": None,
    "scale_down_stabilization_seconds": 0.0,
    "fast_check_interval_seconds": None,
    "burst_quantile": None,
    # rules Dynamo's planner does not have: none remembers bursts or sizes per prompt length
    "burst_memory_seconds": None,
    "prefill_length_mix": False,
}


def make_policy(name: str, plan: ReplayPlan) -> tuple[Policy, PlannerConfig | None]:
    """A policy by name: planner, dynamo-default, static:NP,ND (or static:N), hpa, oracle,
    reactive-oracle, best-static."""
    cfg = plan.config
    roles = tuple(plan.setup.specs)
    if name in ("planner", "dynamo-default"):
        if name == "dynamo-default":
            cfg = PlannerConfig.model_validate(cfg.model_dump() | DYNAMO_DEFAULTS)
        # the loop loads the profile itself when the plan has none
        profile = plan.profile if cfg.throughput_scaling_active else None
        return PlannerPolicy(name=name, config=cfg, profile=profile), cfg
    if name.startswith("static:"):
        counts = [c.strip() for c in name.removeprefix("static:").split(",")]
        if len(counts) != len(roles) or not all(c.isdigit() for c in counts):
            raise SpecError(
                f"policy {name!r}: expected static:{','.join('N' + r[0].upper() for r in roles)}"
                f" ({len(roles)} replica count(s) for {', '.join(roles)})"
            )
        return StaticPolicy(dict(zip(roles, map(int, counts), strict=True))), None
    if name == "hpa":
        floor = min(cfg.min_endpoint_for(r) for r in roles)
        return HpaPolicy(roles, HpaBehavior(min_replicas=max(1, floor))), None
    if name == "oracle":
        refs = compute_references(plan, window_s=ORACLE_WINDOW_S)
        policy = refs.oracle_policy(
            window_s=ORACLE_WINDOW_S,
            startup_delay_s=startup.planning_lead_s(plan.setup.startup_delay_s, plan.setup.specs),
        )
        return policy, None
    if name == "reactive-oracle":
        refs = compute_references(plan, window_s=ORACLE_WINDOW_S)
        return refs.reactive_oracle_policy(window_s=ORACLE_WINDOW_S), None
    if name == "best-static":
        return compute_references(plan, window_s=ORACLE_WINDOW_S).best_static_policy(), None
    raise SpecError(
        f"unknown policy {name!r}: expected planner, dynamo-default, static:NP,ND, hpa, oracle, "
        "reactive-oracle or best-static"
    )


def run(
    plan: ReplayPlan,
    policy_name: str,
    *,
    out_dir: Path | None = None,
    progress: bool | Callable[[float, float], None] = True,
    write_report: bool = True,
    references: bool | Callable[[], References] = True,
    flap_window_s: float = FLAP_WINDOW_S,
) -> ReplayResult:
    """Run one policy of ``plan``; with ``out_dir``, write its files there. With
    ``references``, the summary compares it with the oracle, the best static deployment and
    the fluid bound (:mod:`disagg_planner.replay.bounds`; found once per plan). ``progress``:
    a bar on a terminal (True), none (False), or what the runner reports its simulated time
    to (several policies: :func:`disagg_planner.replay.parallel.run_policies`)."""
    policy, cfg = make_policy(policy_name, plan)
    effective = cfg or plan.config
    recorder = None
    if out_dir is not None and write_report:
        recorder = DiagnosticsRecorder(
            output_dir=out_dir,
            filename="report",
            write_gzip_log=False,
            ttft_slo_ms=effective.ttft_ms,
            itl_slo_ms=effective.itl_ms,
            title=f"planner replay: {policy_name}",
        )
    # the oracle and best-static are ready at time 0 with what they planned for
    initial = getattr(policy, "initial_replicas", None)
    setup = replace(plan.setup, initial_replicas=initial) if initial else plan.setup
    result = run_policy(
        policy,
        setup=setup,
        requests=plan.requests,
        ttft_slo_ms=plan.config.ttft_ms,
        itl_slo_ms=plan.config.itl_ms,
        flap_window_s=flap_window_s,
        advisory=effective.advisory,
        recorder=recorder,
        progress=_progress_callback(progress, plan),
    )
    figures = None
    if references:
        # a callable: what hands over the references found elsewhere (replay/parallel)
        refs = (
            references()
            if callable(references)
            else compute_references(plan, window_s=ORACLE_WINDOW_S)
        )
        figures = reference_summary(result.summary.gpu_hours, refs)
    result.summary = replace(
        result.summary,
        references=figures,
        setup=RunSetup(
            startup_delay_s=setup.startup_delay_s,
            startup=startup.describe(setup.startup_delay_s, setup.specs),
            initial_replicas=setup.initial_replicas,
            engine=str(next(iter(plan.setup.specs.values()))),
            slo=SloTargets.of(plan.config),
        ),
    )
    if out_dir is not None:
        write_outputs(out_dir, result, config=effective, roles=tuple(plan.setup.specs))
        if recorder is not None:
            recorder.write_report(**replay_report_sections(result, plan, title=recorder.title))
    return result


def _progress_callback(
    progress: bool | Callable[[float, float], None], plan: ReplayPlan
) -> Callable[[float, float], None] | None:
    if progress is False:
        return None
    if progress is True:
        bar = RunProgress(1, max(r.arrival_s for r in plan.requests))

        def report(now_s: float, span_s: float) -> None:
            bar.update(0, now_s)
            if now_s >= span_s:  # the runner's last report
                bar.finish(0)
                bar.close()

        return report
    return progress
