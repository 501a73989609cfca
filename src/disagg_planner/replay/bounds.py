"""What a replay's GPU-hours are compared with: the feasible oracle, the cheapest static
deployment that meets the SLO target, and the fluid bound.

- **oracle** (:mod:`disagg_planner.replay.oracle`): the clairvoyant plan, run as a policy in
  the same simulator with the same startup delay; its GPU-hours are metered by the runner
  exactly as any policy's are. A static deployment is one of the plans a clairvoyant may
  choose: where the window plan would cost more than the best static one, or serve worse,
  the oracle is that static deployment (``oracle_plan`` says which).
- **best static** (:mod:`disagg_planner.replay.best_static`): the cheapest fixed replicas
  meeting the target, run as a policy likewise.
- Both searches hold the target over the requests some deployment can serve: a request that
  misses even alone on an idle cluster (a prompt whose own prefill outlasts the TTFT target)
  is left to miss, and counted as ``unservable_requests``; where there is one, the best
  static deployment may qualify without meeting the target over all requests
  (``best_static.qualifies`` and ``best_static.meets_target`` say which).
- **fluid bound** (:func:`fluid_bound_gpu_hours`): the physical floor: every admitted
  request's own prompt and output served at the saturated engine's throughput per GPU in the
  profile (no latency target: a policy that lets latency grow gets that far, and no further),
  with no integral replicas, no startup, no idle time. Requests refused on arrival (longer
  than ``max_model_len``) take no GPU time and are left out. No policy can use fewer
  GPU-hours.

:func:`compute_references` finds all three once per replay (several policies of one replay
share them; the searches' results are also kept on disk under ``$PLANNER_REPLAY_CACHE`` when
that is set, keyed by everything they depend on); :func:`reference_summary` turns them into
the ``summary.json`` keys of one run, as ratios of that run's own ``gpu_hours``, so they
follow whatever rule the runner meters GPU time by.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from disagg_planner.core.budget import apply_gpu_budget
from disagg_planner.profiles import Profile
from disagg_planner.replay.best_static import BestStatic, BestStaticPolicy, search_best_static
from disagg_planner.replay.fluid import fluid_bound_gpu_hours
from disagg_planner.replay.oracle import (
    FeasiblePlan,
    OraclePolicy,
    ReactiveOraclePolicy,
    WindowChoice,
    WindowNeed,
    plan_feasible,
)
from disagg_planner.replay.plan import ReplayPlan
from disagg_planner.replay.replay_summary import BestStaticFigures, ReferenceFigures, ReplaySummary
from disagg_planner.replay.runner import ClusterSetup, run_policy
from disagg_planner.replay.search import DEFAULT_SLO_TARGET, LoneLimits, Slo, lone_limits
from disagg_planner.simulator.cluster import Cluster
from disagg_planner.simulator.engine_spec import EngineSpec
from disagg_planner.simulator.engines import engine_for
from disagg_planner.simulator.request import RequestLike
from disagg_planner.simulator.startup import planning_lead_s

log = logging.getLogger(__name__)

CACHE_ENV = "PLANNER_REPLAY_CACHE"
# Part of every cache key: bump it when the searches change what they find.
SEARCH_VERSION = 3


# --- the references of one replay -----------------------------------------------------------


@dataclass(frozen=True)
class RunFigures:
    """What the summary says about a reference run."""

    gpu_hours: float
    slo_attainment: float  # both targets

    @classmethod
    def of(cls, summary: ReplaySummary) -> RunFigures:
        return cls(float(summary.gpu_hours), float(summary.slo_attainment.both))


@dataclass(frozen=True)
class References:
    slo: Slo
    limits: LoneLimits
    unservable: int  # requests that miss even alone on an idle cluster
    oracle_plan: FeasiblePlan
    oracle_source: str  # "windows": the window plan; "best-static": it cost more, see above
    oracle_needs: list[WindowNeed]
    oracle: RunFigures
    window_plan_run: RunFigures  # the window plan's own run, whichever the oracle is
    best_static: BestStatic
    best_static_run: RunFigures
    fluid_bound_gpu_hours: float | None
    wall_s: dict[str, float]

    def oracle_policy(self, *, window_s: float, startup_delay_s: float) -> OraclePolicy:
        return OraclePolicy(self.oracle_needs, window_s=window_s, startup_delay_s=startup_delay_s)

    def reactive_oracle_policy(self, *, window_s: float) -> ReactiveOraclePolicy:
        return ReactiveOraclePolicy(self.oracle_needs, window_s=window_s)

    def best_static_policy(self) -> BestStaticPolicy:
        return BestStaticPolicy(self.best_static.replicas)


_MEMO: dict[str, References] = {}


def compute_references(
    plan: ReplayPlan,
    *,
    window_s: float,
    target: float = DEFAULT_SLO_TARGET,
    cache_dir: Path | None = None,
) -> References:
    """The oracle, best static and fluid bound of ``plan`` (see the module doc), once per
    process for the same plan; the searches' results come from ``cache_dir`` (default
    ``$PLANNER_REPLAY_CACHE``, none when unset) when they were found before."""
    slo = Slo(plan.config.ttft_ms, plan.config.itl_ms, target)
    setup = plan.setup
    floors = {r: plan.config.min_endpoint_for(r) for r in setup.specs}
    key = _fingerprint(plan.requests, setup, slo, window_s, floors)
    memo_key = _memo_key(key, setup)
    if memo_key in _MEMO:
        return _MEMO[memo_key]
    if cache_dir is None and os.environ.get(CACHE_ENV):
        cache_dir = Path(os.environ[CACHE_ENV])
    cached = _load(cache_dir, key)
    wall: dict[str, float] = {}

    def build(counts: Mapping[str, int]) -> Cluster:
        ready = dataclasses.replace(setup, initial_replicas=dict(counts), startup_delay_s=0.0)
        return ready.build([])

    t0 = time.perf_counter()
    limits = lone_limits(plan.requests, build=build, roles=tuple(setup.specs), slo=slo)
    wall["lone_limits"] = time.perf_counter() - t0
    if warning := unservable_warning(plan.requests, limits, slo):
        log.warning("references: %s", warning)
    if cached is not None:
        feasible, static = cached
    else:
        feasible = plan_feasible(
            plan.requests,
            estimate=sane_needs(
                plan.needs,
                plan.requests,
                specs=setup.specs,
                floors=floors,
                profile=plan.profile,
                window_s=window_s,
                slo=slo,
            ),
            build=build,
            window_s=window_s,
            slo=slo,
            floors=floors,
            limits=limits,
        )
        wall["oracle_plan"] = feasible.wall_s
        peak = {r: max(w.replicas[r] for w in feasible.windows) for r in setup.specs}
        static = search_best_static(
            plan.requests, build=build, upper=peak, lower=floors, slo=slo, limits=limits
        )
        wall["best_static_search"] = static.wall_s
        _store(cache_dir, key, feasible, static)
    needs = feasible.needs(plan.needs)
    lead = planning_lead_s(setup.startup_delay_s, setup.specs)
    oracle = OraclePolicy(needs, window_s=window_s, startup_delay_s=lead)
    t1 = time.perf_counter()
    oracle_run = _run(plan, oracle, oracle.initial_replicas)
    wall["oracle_run"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    static_run = _run(plan, BestStaticPolicy(static.replicas), static.replicas)
    wall["best_static_run"] = time.perf_counter() - t1
    source, window_run = "windows", oracle_run
    if static.qualifies and not (
        oracle_run.gpu_hours <= static_run.gpu_hours
        and oracle_run.slo_attainment >= min(static_run.slo_attainment, slo.target)
    ):
        # A static deployment is one of the plans a clairvoyant may choose: where the window
        # plan costs more (a flat load, where startups and per-window margins cost more than
        # they save) or serves worse, the oracle holds the best static replicas throughout.
        # Its run is the static one: the same replicas from time 0, never changed.
        source = "best-static"
        needs = [replace(need, replicas=dict(static.replicas)) for need in needs]
        oracle_run = static_run
    fluid = (
        fluid_bound_gpu_hours(admitted(plan.requests, setup.specs), plan.profile)
        if plan.profile is not None
        else None
    )
    wall["total"] = time.perf_counter() - t0
    log.info(
        "references: oracle (%s) %s, window plan %s, best static %s (%s), in %s",
        source,
        f"{oracle_run.gpu_hours:.3f} GPU-h at {oracle_run.slo_attainment:.2%}",
        f"{window_run.gpu_hours:.3f} GPU-h at {window_run.slo_attainment:.2%}",
        static.replicas,
        f"{static_run.gpu_hours:.3f} GPU-h at {static_run.slo_attainment:.2%}",
        ", ".join(f"{k} {v:.1f} s" for k, v in wall.items()),
    )
    unservable = limits.unservable_count(plan.requests)
    refs = References(
        slo,
        limits,
        unservable,
        feasible,
        source,
        needs,
        oracle_run,
        window_run,
        static,
        static_run,
        fluid,
        wall,
    )
    _MEMO[memo_key] = refs
    return refs


def unservable_warning(requests: Sequence[RequestLike], limits: LoneLimits, slo: Slo) -> str:
    """What the searches leave to miss, said up front ('' when every request is servable)."""
    unservable = limits.unservable_count(requests)
    if not unservable:
        return ""
    why = []
    if math.isfinite(limits.max_isl):
        why.append(f"a prompt over {limits.max_isl:.0f} tokens misses the {slo.ttft_ms:g} ms TTFT")
    if math.isfinite(limits.max_context):
        why.append(
            f"a context over {limits.max_context:.0f} tokens misses the {slo.itl_ms:g} ms ITL"
        )
    return (
        f"{unservable} of {len(requests)} requests ({unservable / len(requests):.1%}) miss the "
        f"targets even alone on an idle cluster ({'; '.join(why)}): no replica count serves "
        "them, so the oracle and best-static searches hold the SLO target over the others and "
        "leave these to miss (summary.json: unservable_requests)"
    )


def _memo_key(fingerprint: str, setup: ClusterSetup) -> str:
    delay = "phases" if setup.startup_delay_s is None else float(setup.startup_delay_s)
    return f"{fingerprint}:{delay}"


def references_key(plan: ReplayPlan, *, window_s: float, target: float = DEFAULT_SLO_TARGET) -> str:
    """What :func:`compute_references` keys the references of ``plan`` by: two plans with
    one key have the same references."""
    slo = Slo(plan.config.ttft_ms, plan.config.itl_ms, target)
    floors = {r: plan.config.min_endpoint_for(r) for r in plan.setup.specs}
    fingerprint = _fingerprint(plan.requests, plan.setup, slo, window_s, floors)
    return _memo_key(fingerprint, plan.setup)


def adopt_references(key: str, refs: References) -> None:
    """Make ``refs``, found for :func:`references_key` ``key`` in another process, what
    :func:`compute_references` returns for that key in this one (parallel replays find the
    references once and hand them to the processes running the policies)."""
    _MEMO[key] = refs


def _run(plan: ReplayPlan, policy: Any, initial: Mapping[str, int]) -> RunFigures:
    result = run_policy(
        policy,
        setup=dataclasses.replace(plan.setup, initial_replicas=dict(initial)),
        requests=plan.requests,
        ttft_slo_ms=plan.config.ttft_ms,
        itl_slo_ms=plan.config.itl_ms,
        flap_window_s=600.0,
    )
    return RunFigures.of(result.summary)


def reference_summary(gpu_hours: float, refs: References) -> ReferenceFigures:
    """What ``summary.json`` says comparing a run's ``gpu_hours`` with the references."""
    fluid = refs.fluid_bound_gpu_hours
    return ReferenceFigures(
        search_attainment_target=refs.slo.target,
        unservable_requests=refs.unservable,
        oracle_plan=refs.oracle_source,
        oracle_gpu_hours=refs.oracle.gpu_hours,
        oracle_attainment_both=refs.oracle.slo_attainment,
        gpu_hours_ratio_to_oracle=_ratio(gpu_hours, refs.oracle.gpu_hours),
        best_static=BestStaticFigures(
            replicas=refs.best_static.replicas,
            gpu_hours=refs.best_static_run.gpu_hours,
            attainment_both=refs.best_static_run.slo_attainment,
            meets_target=refs.best_static_run.slo_attainment >= refs.slo.target,
            # the target held over the requests some deployment can serve
            qualifies=refs.best_static.qualifies,
        ),
        gpu_hours_ratio_to_best_static=_ratio(gpu_hours, refs.best_static_run.gpu_hours),
        fluid_bound_gpu_hours=fluid,
        gpu_hours_ratio_to_fluid_bound=None if fluid is None else _ratio(gpu_hours, fluid),
    )


def _ratio(value: float, reference: float) -> float | None:
    return value / reference if reference > 0 else None


# --- the cache of the searches --------------------------------------------------------------


def _fingerprint(
    requests: Sequence[RequestLike],
    setup: ClusterSetup,
    slo: Slo,
    window_s: float,
    floors: Mapping[str, int],
) -> str:
    """Everything the searches depend on (not the startup delay: the plan orders replicas
    one delay ahead, and a static deployment is ready at time 0)."""
    digest = hashlib.sha256()
    facts = {
        "version": SEARCH_VERSION,
        "mode": setup.mode,
        "specs": {r: str(s) for r, s in setup.specs.items()},
        "router": setup.router,
        "seed": setup.seed,
        "slo": dataclasses.asdict(slo),
        "window_s": float(window_s),  # 60 and 60.0 are one window
        "floors": dict(floors),
        "drain_grace_s": setup.drain_grace_s,
        "migrate_on_drain": setup.migrate_on_drain,
    }
    if setup.worker_shutdown_s is not None:  # absent otherwise: older digests hold
        facts["worker_shutdown_s"] = setup.worker_shutdown_s
    digest.update(json.dumps(facts, sort_keys=True).encode())
    n = len(requests)
    for column in (
        np.fromiter((r.arrival_s for r in requests), dtype=np.float64, count=n),
        np.fromiter((r.input_length for r in requests), dtype=np.int64, count=n),
        np.fromiter((r.output_length for r in requests), dtype=np.int64, count=n),
    ):
        digest.update(column.tobytes())
    for r in requests:
        if r.hash_ids:
            digest.update(repr(tuple(r.hash_ids)).encode())
    return digest.hexdigest()[:32]


def _load(cache_dir: Path | None, key: str) -> tuple[FeasiblePlan, BestStatic] | None:
    if cache_dir is None:
        return None
    path = cache_dir / f"references-{key}.json"
    try:
        data = json.loads(path.read_text())
        plan = FeasiblePlan([WindowChoice(**w) for w in data["windows"]], data["plan_wall_s"])
        static = BestStatic(data["best_static"]["replicas"], data["best_static"]["qualifies"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent, or written by another version: search again
    return plan, static


def _store(cache_dir: Path | None, key: str, plan: FeasiblePlan, static: BestStatic) -> None:
    if cache_dir is None:
        return
    cache_dir.mkdir(parents=True, exist_ok=True)
    data = {
        "windows": [dataclasses.asdict(w) for w in plan.windows],
        "plan_wall_s": plan.wall_s,
        "best_static": {"replicas": static.replicas, "qualifies": static.qualifies},
    }
    # write then rename: parallel replays of one workload may store the same key at once
    tmp = cache_dir / f".references-{key}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(cache_dir / f"references-{key}.json")


# --- the requests an engine refuses, and an initial sizing that says why it is large --------

# An initial sizing above this many times the GPUs the first minutes take at the profile's best
# throughput (plus a few) is sized by latency, not by load: it is said why.
OVERSIZED_FACTOR = 8.0
OVERSIZED_SLACK_GPUS = 8


def context_limits(specs: Mapping[str, EngineSpec]) -> dict[str, int]:
    """Each role's ``max_model_len`` (found once: :func:`fits_context` runs per request)."""
    return {role: _max_model_len(spec) for role, spec in specs.items()}


def fits_context(request: RequestLike, limits: Mapping[str, int]) -> bool:
    """Whether every engine admits ``request``: its prompt plus what the role generates (one
    token for prefill, the output for the others) within the engine's ``max_model_len``
    (``limits``, from :func:`context_limits`), the rule the simulated cluster refuses requests
    by on arrival, as vLLM does (a client error)."""
    for role, limit in limits.items():
        need = request.input_length + (1 if role == "prefill" else request.output_length)
        if need > limit:
            return False
    return True


def admitted(requests: Sequence[RequestLike], specs: Mapping[str, EngineSpec]) -> list[RequestLike]:
    """The requests of ``requests`` every engine of ``specs`` admits (:func:`fits_context`):
    the others are refused on arrival and take no GPU time."""
    limits = context_limits(specs)
    return [r for r in requests if fits_context(r, limits)]


@cache
def _max_model_len(spec: EngineSpec) -> int:
    return engine_for(spec).max_model_len


def refused_warning(requests: Sequence[RequestLike], specs: Mapping[str, EngineSpec]) -> str:
    """The warning for the requests that exceed the engines' context ('' when none)."""
    limits = context_limits(specs)
    refused = sum(1 for r in requests if not fits_context(r, limits))
    if not refused:
        return ""
    named = ", ".join(f"{role} {limit}" for role, limit in limits.items())
    return (
        f"{refused} of {len(requests)} requests exceed the engines' max_model_len ({named} "
        "tokens, prompt plus output): the engine refuses them on arrival as vLLM does (client "
        "errors, counted as failed), and no sizing is made for them"
    )


def sane_initial(
    start: Mapping[str, int],
    requests: Sequence[RequestLike],
    *,
    specs: Mapping[str, EngineSpec],
    floors: Mapping[str, int],
    profile: Profile | None,
    lead_s: float,
    ttft_ms: float,
    itl_ms: float,
) -> tuple[dict[str, int], str]:
    """The initial replicas ``start`` (what the first ``lead_s`` seconds need), or, where
    they are far above what serving those seconds at the profile's best throughput per GPU
    takes (the fluid bound of :func:`fluid_bound_gpu_hours`; :data:`OVERSIZED_FACTOR` times
    it plus :data:`OVERSIZED_SLACK_GPUS`), that bound, and the warning saying why ('' when
    they are within it, or without a profile). A prompt whose own prefill outlasts the TTFT
    target sizes its window for a latency no replica count reaches."""
    first = [r for r in admitted(requests, specs) if r.arrival_s < lead_s]
    if profile is None or not first or lead_s <= 0:
        return dict(start), ""
    cut = _fluid_cut(
        start, first, specs=specs, floors=floors, profile=profile, span_s=lead_s,
        ttft_ms=ttft_ms, itl_ms=itl_ms,
    )  # fmt: skip
    if cut is None:
        return dict(start), ""
    capped, fluid_gpus = cut
    gpus = sum(n * specs[role].gpus for role, n in start.items())
    longest = int(np.max(profile.prefill.data.isl))
    beyond = sum(1 for r in first if r.input_length > longest)
    mean_isl = sum(r.input_length for r in first) / len(first)
    return capped, (
        f"initial replicas {dict(start)} ({gpus} GPUs) are {gpus / max(fluid_gpus, 1e-9):.0f}x "
        f"the {fluid_gpus:.1f} GPUs that serving the first {lead_s:g} s at the profile's best "
        f"throughput takes: they are sized to hold the TTFT target of {ttft_ms:g} ms for the "
        f"windows' mean prompt ({mean_isl:.0f} tokens), not "
        "for the load"
        + (
            f" ({beyond} of those {len(first)} prompts are longer than the profile's longest "
            f"ISL {longest}, where its TTFT is extrapolated)"
            if beyond
            else ""
        )
        + f"; starting with {capped} ({OVERSIZED_FACTOR:g}x those GPUs plus "
        f"{OVERSIZED_SLACK_GPUS}); pass --initial ROLE=N to start elsewhere, or a looser --ttft"
    )


def sane_needs(
    needs: Sequence[WindowNeed],
    requests: Sequence[RequestLike],
    *,
    specs: Mapping[str, EngineSpec],
    floors: Mapping[str, int],
    profile: Profile | None,
    window_s: float,
    slo: Slo,
) -> list[WindowNeed]:
    """Each window's estimate (where the oracle's search starts) cut, as :func:`sane_initial`
    cuts the initial replicas, to :data:`OVERSIZED_FACTOR` times the GPUs that serving the
    window's requests at the profile's best throughput takes, plus
    :data:`OVERSIZED_SLACK_GPUS`: a window of long prompts under a tight TTFT target is
    estimated at up to a million replicas (no count meets it), and a search starting there
    simulates that many engines. The search still climbs above the cut where the window needs
    it. Without a profile, ``needs`` as they are."""
    if profile is None:
        return list(needs)
    served = admitted(requests, specs)
    arrivals = [r.arrival_s for r in served]
    result: list[WindowNeed] = []
    for k, need in enumerate(needs):
        lo = bisect.bisect_left(arrivals, k * window_s)
        last = k == len(needs) - 1
        hi = len(served) if last else bisect.bisect_left(arrivals, (k + 1) * window_s)
        cut = (
            _fluid_cut(
                need.replicas, served[lo:hi], specs=specs, floors=floors, profile=profile,
                span_s=window_s, ttft_ms=slo.ttft_ms, itl_ms=slo.itl_ms,
            )
            if hi > lo
            else None
        )  # fmt: skip
        result.append(need if cut is None else replace(need, replicas=cut[0]))
    return result


def _fluid_cut(
    start: Mapping[str, int],
    requests: Sequence[RequestLike],
    *,
    specs: Mapping[str, EngineSpec],
    floors: Mapping[str, int],
    profile: Profile,
    span_s: float,
    ttft_ms: float,
    itl_ms: float,
) -> tuple[dict[str, int], float] | None:
    """``start`` cut to :data:`OVERSIZED_FACTOR` times the GPUs that serving ``requests``
    (arriving over ``span_s``) at the profile's best throughput takes, plus
    :data:`OVERSIZED_SLACK_GPUS`, and those GPUs; None where ``start`` is within that."""
    fluid_gpus = fluid_bound_gpu_hours(requests, profile, ttft_ms=ttft_ms, itl_ms=itl_ms)
    fluid_gpus *= 3600.0 / span_s
    gpus = sum(n * specs[role].gpus for role, n in start.items())
    bound = math.ceil(OVERSIZED_FACTOR * fluid_gpus) + OVERSIZED_SLACK_GPUS
    if gpus <= bound:
        return None
    capped, _ = within_budget(start, specs=specs, floors=floors, max_gpus=bound)
    return capped, fluid_gpus


def within_budget(
    start: Mapping[str, int],
    *,
    specs: Mapping[str, EngineSpec],
    floors: Mapping[str, int],
    max_gpus: int,
) -> tuple[dict[str, int], str]:
    """``start`` cut to ``max_gpus`` (-1: no budget) as the planner's budget stage cuts a
    proposal, and the warning saying so ('' when it fits)."""
    result = apply_gpu_budget(
        start,
        gpus_per_replica={role: spec.gpus for role, spec in specs.items()},
        floors=floors,
        max_gpus=max_gpus,
        min_gpus=-1,
        order=tuple(start),
    )
    if result.replicas == dict(start) or result.hold:
        return dict(start), ""
    return result.replicas, (
        f"initial replicas {dict(start)} exceed max_gpu_budget {max_gpus}: starting with "
        f"{result.replicas}"
    )
