"""Replay of a fleet: several deployments, each under its own planner, on one simulated GPU pool.

``planner replay --fleet FILE``. Each member is a replay of its own (its workload, profile and
SLOs, its own simulated cluster and planner loop), all on one clock. How the pool's GPUs are
shared is the ``split``:

- ``shared``: the pool's arbiter (:func:`disagg_planner.core.fleet.arbitrate`) runs every
  :data:`ARBITER_PERIOD_S`, and when a member's planner asks for more than its grant, over
  every member's proposal (its planner's standing need, how
  urgently, what it holds) and grants each member its GPUs; a member's scale-ups are capped
  by its grant (its connector refuses what the grant does not cover, counting its draining
  replicas), and a member whose grant falls below what it holds is scaled down to it (a
  reclaim: the replicas leave drained, as any scale-down).
- ``static``: the pool cut into fixed shares in proportion to the members' floors, each
  member's planner with its share as its own ``max_gpu_budget`` (the split a team would
  configure by hand).
- ``unbounded``: each member's planner without a ceiling (sized for its own peaks).

Every member starts with the replicas its first minutes need: within its static share in
the ``static`` split, within what one arbitration over those needs grants it in the
``shared`` split (the pool as it would stand when the replay begins), as they are
``unbounded``.

Writes ``DIR/<member>/`` as a single replay does (summary.json, requests.csv, timeline.csv,
report.html), ``DIR/fleet.json`` (the pool's peak GPUs in use, GPU-hours, each member's SLO
attainment, per priority, borrow and reclaim events, flips) and ``DIR/fleet.html``.
"""

from __future__ import annotations

import bisect
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

from disagg_planner.config import load_config
from disagg_planner.config.schema import PlannerConfig
from disagg_planner.core.budget import gpus_of
from disagg_planner.core.fleet import (
    ArbiterMemory,
    Arbitration,
    FleetError,
    Grant,
    MemberProposal,
    PoolLimits,
    arbitrate,
    fit_to_grant,
    member_urgency,
)
from disagg_planner.errors import SpecError
from disagg_planner.replay.bounds import within_budget
from disagg_planner.replay.connector import ScaleListener, SimulatedConnector, run_now
from disagg_planner.replay.default_workload import replay_config
from disagg_planner.replay.fleet_model import FleetMemberSpec, FleetResult, FleetSpec, static_shares
from disagg_planner.replay.fleet_page import render_fleet
from disagg_planner.replay.plan import ReplayPlan
from disagg_planner.replay.replay_summary import FleetShare, RunSetup, SloTargets
from disagg_planner.replay.report import replay_report_sections
from disagg_planner.replay.runner import PolicyRun, ReplayResult, write_outputs
from disagg_planner.replay.session import WorkloadSpec, make_policy, prepare
from disagg_planner.report.recorder import DiagnosticsRecorder
from disagg_planner.simulator.cluster import Cluster
from disagg_planner.simulator.heap import FrozenHeap

log = logging.getLogger(__name__)

# How often the pool's arbiter runs (simulated seconds): the fast check's cadence, so that a
# member's observed SLO breach reaches the pool within one of its own checks.
ARBITER_PERIOD_S = 15.0
FLEET_FILE = "fleet.json"
FLEET_PAGE = "fleet.html"
Split = Literal["shared", "static", "unbounded"]
SPLITS: tuple[str, ...] = ("shared", "static", "unbounded")


# --- one member ---------------------------------------------------------------------------------


def member_plan(
    member: FleetMemberSpec,
    *,
    base_config: str | None,
    flags: Mapping[str, Any],
    share: int,
    startup_delay_s: float | None,
) -> ReplayPlan:
    """The member's replay plan, starting within ``share`` GPUs."""
    overrides: dict[str, Any] = dict(member.config)
    for key, value in (
        ("profile", member.profile),
        ("ttft_ms", member.ttft),
        ("itl_ms", member.itl),
    ):
        if value is not None:
            overrides[key] = value
    loaded = load_config(
        config_arg=base_config,
        flags=flags,
        overrides=overrides,
        overrides_label=f"fleet member {member.name}",
    )
    config = replay_config(loaded, default_run=False)
    config = config.model_copy(update={"max_gpu_budget": share, "namespace": member.name})
    workload = WorkloadSpec(
        trace=member.trace,
        workload=member.workload,
        trace_format=member.trace_format,
        speedup=member.speedup,
        scale_load=member.scale_load,
        duration_s=member.duration,
        seed=member.seed,
    )
    try:
        return prepare(config, workload, engine=member.engine, startup_delay_s=startup_delay_s)
    except SpecError as exc:
        raise SpecError(f"fleet member {member.name!r}: {exc}") from None


def _footprint(config: PlannerConfig, cluster: Cluster) -> int:
    return sum(config.min_endpoint_for(r) * cluster.gpus_per_replica(r) for r in cluster.roles)


def draining_gpus(cluster: Cluster) -> int:
    """GPUs of the replicas leaving (draining): the pool counts them until they stop."""
    now = cluster.now
    return sum(
        x.gpus_at(now)
        for x in cluster.replicas
        if x.drain_s is not None and x.drain_s <= now and (x.stop_s is None or x.stop_s > now)
    )


def fit_member(
    target: Mapping[str, int], cluster: Cluster, config: PlannerConfig, grant: Grant
) -> dict[str, int]:
    """``target`` cut to the member's grant, its draining replicas counted
    (:func:`disagg_planner.core.fleet.fit_to_grant`)."""
    roles: tuple[str, ...] = tuple(cluster.roles)
    return fit_to_grant(
        {r: target[r] for r in roles},
        {r: cluster.desired_replicas(r) for r in roles},
        gpus_per_replica={r: cluster.gpus_per_replica(r) for r in roles},
        floors={r: config.min_endpoint_for(r) for r in roles},
        grant=grant,
        draining_gpus=draining_gpus(cluster),
    )


class GrantedConnector(SimulatedConnector):
    """The member's connector under the pool: what its planner sets is cut to its grant."""

    def __init__(
        self, cluster: Cluster, *, on_scale: ScaleListener | None, config: PlannerConfig
    ) -> None:
        super().__init__(cluster, on_scale=on_scale)
        self.sim = cluster
        self.config = config
        self.grant: Grant | None = None
        self.capped = 0  # scale-ups the grant cut
        # asks the pool at once for a scale-up its grant does not cover (the arbiter runs on
        # the request, as a scale request to a global planner is answered when it is made)
        self.ask: Callable[[int], Grant | None] | None = None
        self.asked_gpus: int | None = None

    async def set_replicas(self, replicas: Mapping[str, int], *, blocking: bool = False) -> Any:
        target = dict(replicas)
        wanted = gpus_of(target, {r: self.sim.gpus_per_replica(r) for r in target})
        if self.grant is not None and wanted > self.grant.gpus and self.ask is not None:
            self.asked_gpus = wanted
            self.grant = self.ask(wanted) or self.grant
        if self.grant is not None:
            fitted = fit_member(target, self.sim, self.config, self.grant)
            if fitted != target:
                self.capped += 1
            target = fitted
        return await super().set_replicas(target, blocking=blocking)


@dataclass
class _Member:
    spec: FleetMemberSpec
    plan: ReplayPlan
    run: PolicyRun
    connector: GrantedConnector | None
    recorder: DiagnosticsRecorder | None
    done: bool = False

    @property
    def cluster(self) -> Cluster:
        return self.run.cluster

    @property
    def core(self) -> Any:
        """Its planner's core (None for a policy without one)."""
        return getattr(getattr(self.run.policy, "loop", None), "core", None)

    def need_gpus(self) -> int:
        """What its planner wants now: the throughput loop's standing sizing (raised by the
        fast checks), else what it has asked for."""
        cluster = self.cluster
        wanted = dict(getattr(self.core, "throughput_floor", {}) or {})
        replicas = {r: wanted.get(r, cluster.desired_replicas(r)) for r in cluster.roles}
        need = sum(n * cluster.gpus_per_replica(r) for r, n in replicas.items())
        asked = self.connector.asked_gpus if self.connector is not None else None
        return max(need, asked or 0)

    def proposal(self, now_s: float) -> MemberProposal:
        held = self.cluster.gpus_in_use()
        need = max(self.need_gpus(), _footprint(self.plan.config, self.cluster))
        urgency, why = member_urgency(
            need,
            held,
            now_s=now_s,
            fast_scale_up_s=getattr(self.core, "fast_scale_up_s", None),
            window_s=self.plan.config.throughput_adjustment_interval_seconds,
        )
        return MemberProposal(
            name=self.spec.name,
            priority=self.spec.priority,
            floor_gpus=self.spec.floor_gpus,
            need_gpus=need,
            held_gpus=held,
            urgency=urgency,
            ceiling_gpus=self.spec.ceiling_gpus,
            urgency_reason=why,
        )


# --- the run ------------------------------------------------------------------------------------


def run_fleet(
    spec: FleetSpec,
    *,
    split: Split = "shared",
    out_dir: Path | None = None,
    base_config: str | None = None,
    flags: Mapping[str, Any] | None = None,
    startup_delay_s: float | None = None,
    write_report: bool = True,
) -> FleetResult:
    """Replay every member of ``spec`` on one clock under ``split`` (see the module)."""
    if split not in SPLITS:
        raise SpecError(f"--fleet-split {split!r}: expected one of {', '.join(SPLITS)}")
    shares = static_shares(spec)
    pool = spec.limits
    members: list[_Member] = []
    plans = {
        m.name: member_plan(
            m,
            base_config=base_config,
            flags=flags or {},
            share=shares[m.name] if split == "static" else -1,
            startup_delay_s=startup_delay_s,
        )
        for m in spec.members
    }
    if split == "shared":
        plans = start_within_grants(spec, plans)
    for m in spec.members:
        plan = plans[m.name]
        budget = shares[m.name] if split == "static" else -1
        if m.ceiling_gpus is not None and split != "static":
            budget = m.ceiling_gpus
        config = plan.config.model_copy(update={"max_gpu_budget": budget})
        plan = replace(plan, config=config)
        recorder = None
        if out_dir is not None and write_report:
            recorder = DiagnosticsRecorder(
                output_dir=out_dir / m.name,
                filename="report",
                write_gzip_log=False,
                ttft_slo_ms=config.ttft_ms,
                itl_slo_ms=config.itl_ms,
                title=f"planner replay --fleet: {m.name} ({split})",
            )
        policy, _ = make_policy("planner", plan)
        policy.name = m.name
        holder: dict[str, GrantedConnector] = {}

        def factory(
            cluster: Cluster,
            on_scale: ScaleListener | None,
            _config: PlannerConfig = config,
            _holder: dict[str, GrantedConnector] = holder,
        ) -> SimulatedConnector:
            _holder["c"] = GrantedConnector(cluster, on_scale=on_scale, config=_config)
            return _holder["c"]

        run = PolicyRun(
            policy,
            setup=plan.setup,
            requests=plan.requests,
            advisory=config.advisory,
            recorder=recorder,
            connector_factory=factory if split == "shared" else None,
        )
        footprint = _footprint(config, run.cluster)
        if footprint > m.floor_gpus and split == "shared":
            raise SpecError(
                f"fleet member {m.name!r}: floor_gpus = {m.floor_gpus} is below its minimum "
                f"footprint ({footprint} GPUs: min endpoints x GPUs per replica)"
            )
        members.append(_Member(m, plan, run, holder.get("c"), recorder))

    state = _PoolState(pool)
    next_arbiter = 0.0
    for member in members:
        if member.connector is not None:
            member.connector.ask = _asker(member, members, state)
    with FrozenHeap() as heap:
        while True:
            live = [x for x in members if not x.done]
            if not live:
                break
            wake = min(x.run.policy.next_wakeup_s() for x in live)
            t = min(wake, next_arbiter) if split == "shared" else wake
            for x in live:
                if not t < x.run.limit_s or x.cluster.idle:
                    x.done = True
                    continue
                heap.advance(x.cluster, max(t, x.cluster.now), stop_when_idle=True)
                if x.cluster.idle:
                    x.done = True
            live = [x for x in members if not x.done]
            if not live:
                break
            if split == "shared" and t >= next_arbiter:
                state.arbitrate(live, t)
                next_arbiter = t + ARBITER_PERIOD_S
            for x in live:
                if x.connector is not None:
                    x.connector.asked_gpus = None
            for x in live:
                if x.run.policy.next_wakeup_s() <= t:
                    x.run.wake()
        for x in members:
            x.run.close(heap)

    results: dict[str, ReplayResult] = {}
    for x in members:
        cfg = x.plan.config
        result = x.run.result(ttft_slo_ms=cfg.ttft_ms, itl_slo_ms=cfg.itl_ms)
        result.summary = replace(
            result.summary,
            setup=RunSetup(
                startup_delay_s=x.plan.setup.startup_delay_s,
                startup=None,
                initial_replicas=x.plan.setup.initial_replicas,
                engine=None,
                slo=SloTargets.of(cfg),
            ),
            fleet=FleetShare(
                split=split,
                priority=x.spec.priority,
                floor_gpus=x.spec.floor_gpus,
                static_share_gpus=shares[x.spec.name],
                capped_by_grant=x.connector.capped if x.connector is not None else 0,
            ),
        )
        results[x.spec.name] = result
        if out_dir is not None:
            write_outputs(out_dir / x.spec.name, result, config=cfg, roles=x.run.roles)
            if x.recorder is not None:
                x.recorder.write_report(
                    **replay_report_sections(result, x.plan, title=x.recorder.title)
                )

    series = pool_series(results)
    late = {x.spec.name: ready_after_last_arrival(x.cluster, x.run.last_arrival_s) for x in members}
    fleet = fleet_summary(spec, split, results, series, state.events, state.grant_log, shares)
    for name, replicas in late.items():
        fleet["members"][name]["ready_after_last_arrival"] = replicas
    out = FleetResult(split, results, fleet, series, state.grant_log)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / FLEET_FILE).write_text(json.dumps(fleet, indent=2, default=str) + "\n")
        (out_dir / FLEET_PAGE).write_text(render_fleet(out, spec), encoding="utf-8")
    return out


def start_within_grants(spec: FleetSpec, plans: Mapping[str, ReplayPlan]) -> dict[str, ReplayPlan]:
    """The shared split's start: one arbitration at time 0 over each member's first-minutes
    need (nothing held yet), and each member's initial replicas cut to its grant, as the pool
    would have them when the replay begins (the static split starts within its shares)."""
    proposals = []
    for m in spec.members:
        setup = plans[m.name].setup
        need = gpus_of(setup.initial_replicas, {r: s.gpus for r, s in setup.specs.items()})
        proposals.append(
            MemberProposal(m.name, m.priority, m.floor_gpus, need, 0, ceiling_gpus=m.ceiling_gpus)
        )
    try:
        grants = arbitrate(proposals, spec.limits, ArbiterMemory(), 0.0).grants
    except FleetError as exc:
        raise SpecError(f"fleet: {exc}") from None
    out = {}
    for name, plan in plans.items():
        floors = {r: plan.config.min_endpoint_for(r) for r in plan.setup.specs}
        start, cut = within_budget(
            plan.setup.initial_replicas,
            specs=plan.setup.specs,
            floors=floors,
            max_gpus=grants[name].gpus,
        )
        if cut:
            log.info("fleet member %s starts within its grant: %s", name, cut)
        out[name] = replace(plan, setup=replace(plan.setup, initial_replicas=start))
    return out


class _PoolState:
    """The arbiter's memory and what it did, across the ticks of one fleet replay."""

    def __init__(self, pool: PoolLimits) -> None:
        self.pool = pool
        self.memory = ArbiterMemory()
        self.last: Arbitration | None = None
        self.grant_log: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []

    def arbitrate(self, live: Sequence[_Member], now_s: float) -> Arbitration:
        """One arbiter tick: grants handed to the members' connectors, and a member holding
        more than its grant scaled down to it (a reclaim, drained as any scale-down)."""
        proposals = [x.proposal(now_s) for x in live]
        try:
            arbitration = arbitrate(proposals, self.pool, self.memory, now_s)
        except FleetError as exc:
            raise SpecError(f"fleet: {exc}") from None
        self.memory = arbitration.memory
        row: dict[str, Any] = {"t_s": now_s}
        for x in live:
            grant = arbitration.grants[x.spec.name]
            assert x.connector is not None
            x.connector.grant = grant
            before = self.last.grants.get(x.spec.name) if self.last is not None else None
            row[x.spec.name] = {
                "grant": grant.gpus,
                "need": grant.need_gpus,
                "held": grant.held_gpus,
                "reason": grant.reason.value,
            }
            if grant.borrowed_gpus > 0 and (before is None or before.borrowed_gpus == 0):
                self.events.append(_event(now_s, "borrow", grant))
            if grant.reclaiming:
                current: dict[str, int] = {r: x.cluster.desired_replicas(r) for r in x.run.roles}
                target = fit_member(current, x.cluster, x.plan.config, grant)
                if target != current:
                    run_now(SimulatedConnector.set_replicas(x.connector, target))
                    self.events.append(_event(now_s, "reclaim", grant, replicas=target))
        self.grant_log.append(row)
        self.last = arbitration
        return arbitration


def _asker(
    member: _Member, members: Sequence[_Member], state: _PoolState
) -> Callable[[int], Grant | None]:
    def ask(_wanted_gpus: int) -> Grant | None:
        live = [x for x in members if not x.done]
        if member not in live:
            return None
        now = member.cluster.now
        return state.arbitrate(live, now).grants[member.spec.name]

    return ask


def _event(t_s: float, kind: str, grant: Grant, **extra: Any) -> dict[str, Any]:
    return {
        "t_s": t_s,
        "kind": kind,
        "member": grant.name,
        "grant": grant.gpus,
        "held": grant.held_gpus,
        "need": grant.need_gpus,
        "reason": grant.reason.value,
        "message": grant.message,
        **extra,
    }


def pool_series(results: Mapping[str, ReplayResult]) -> list[tuple[float, dict[str, int]]]:
    """GPUs in use by member at every instant any member's changed (from each member's
    replica timeline, which integrates to exactly the GPU-seconds its cluster metered)."""
    steps = {
        name: ([row.t_s for row in r.timeline], [row.gpus_in_use for row in r.timeline])
        for name, r in results.items()
    }
    times = sorted({t for ts, _ in steps.values() for t in ts})
    series = []
    for t in times:
        at = {}
        for name, (ts, gpus) in steps.items():
            i = bisect.bisect_right(ts, t) - 1
            # a member whose span ended holds nothing after its last row
            at[name] = gpus[i] if i >= 0 and t <= ts[-1] else 0
        series.append((t, at))
    return series


def count_flips(grant_log: Sequence[Mapping[str, Any]], window_s: float) -> dict[str, int]:
    """Grants withdrawn (lowered below what the member held) and raised again within
    ``window_s`` of the withdrawal. The window runs from the tick that lowered the grant, as
    the arbiter's own rule does: the ticks while the member drains what was withdrawn are
    the same withdrawal, not new ones."""
    flips: dict[str, int] = {}
    cut_at: dict[str, float] = {}
    previous: dict[str, int] = {}
    for row in grant_log:
        t = row["t_s"]
        for name, g in row.items():
            if name == "t_s":
                continue
            before = previous.get(name)
            if before is not None and g["grant"] > before:
                if name in cut_at and t - cut_at[name] < window_s:
                    flips[name] = flips.get(name, 0) + 1
            elif before is not None and g["grant"] < before and g["grant"] < g["held"]:
                cut_at[name] = t
            previous[name] = g["grant"]
    return flips


def ready_after_last_arrival(cluster: Cluster, last_arrival_s: float) -> list[dict[str, Any]]:
    """The replicas that became ready only after the last request arrived (or never did),
    each with its GPUs, start, ready time and metered GPU-hours: capacity no arrival found."""
    return [
        {
            "role": str(r.role),
            "gpus": max((g for _, g in r.gpu_segments), default=0),
            "start_s": r.start_s,
            "ready_s": r.ready_s,
            "gpu_hours": r.gpu_seconds(cluster.now) / 3600.0,
        }
        for r in cluster.replicas
        if r.ready_s > last_arrival_s
    ]


def fleet_summary(
    spec: FleetSpec,
    split: str,
    results: Mapping[str, ReplayResult],
    series: Sequence[tuple[float, Mapping[str, int]]],
    events: Sequence[Mapping[str, Any]],
    grant_log: Sequence[Mapping[str, Any]],
    shares: Mapping[str, int],
) -> dict[str, Any]:
    totals = [sum(at.values()) for _, at in series]
    members: dict[str, Any] = {}
    by_priority: dict[int, list[ReplayResult]] = {}
    for m in spec.members:
        r = results[m.name]
        by_priority.setdefault(m.priority, []).append(r)
        members[m.name] = {
            "priority": m.priority,
            "floor_gpus": m.floor_gpus,
            "static_share_gpus": shares[m.name],
            "slo_attainment": asdict(r.summary.slo_attainment),
            "requests": r.summary.requests,
            "last_arrival_s": r.summary.last_arrival_s,
            "gpu_hours": r.summary.gpu_hours,
            "peak_gpus": max((row.gpus_in_use for row in r.timeline), default=0),
            "reclaims": sum(1 for e in events if e["member"] == m.name and e["kind"] == "reclaim"),
            "borrows": sum(1 for e in events if e["member"] == m.name and e["kind"] == "borrow"),
        }
    flips = count_flips(grant_log, spec.pool.stabilization_seconds)
    return {
        "split": split,
        "pool": spec.pool.model_dump(),
        "max_gpus_in_use": max(totals, default=0),
        "budget_exceeded": max(totals, default=0) > spec.pool.max_total_gpus,
        "gpu_hours": sum(r.summary.gpu_hours for r in results.values()),
        "members": members,
        "priorities": {
            str(p): {
                "slo_attainment_both": (
                    sum(r.summary.slo_attainment.both * r.summary.requests for r in rs)
                    / max(1, sum(r.summary.requests for r in rs))
                ),
                "members": [r.policy for r in rs],
            }
            for p, rs in sorted(by_priority.items(), reverse=True)
        },
        "reclaims": sum(1 for e in events if e["kind"] == "reclaim"),
        "borrows": sum(1 for e in events if e["kind"] == "borrow"),
        "flips": sum(flips.values()),
        "flips_by_member": flips,
        "events": list(events),
    }
