"""Drive one policy against the simulated cluster in virtual time, and score it.

The runner owns the (virtual) clock: it advances the cluster to the policy's next wake-up,
lets the policy observe and decide, applies the decision through the simulated connector (the
simulator starts replicas after the startup delay and drains removed ones; the planner's live
loop applies its own, through the same connector), and records every step.

One accounting rule for every policy, the oracle included: GPU time is metered from t = 0 until
the policy's own last request has finished or failed, and every replica that exists (starting,
ready or draining) is charged for every second of it. The policy keeps deciding while its
backlog drains, so a policy that falls behind pays for the time it takes to catch up. A replay
whose requests are still unfinished ``MAX_DRAIN_S`` after the last arrival stops there, and
those requests count as failed.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.profiles import Profile
from disagg_planner.replay.connector import SimulatedConnector, run_now
from disagg_planner.replay.policies import Policy, PolicyStep
from disagg_planner.replay.replay_summary import (
    SUMMARY_FILE,
    DrainFigures,
    ElasticFigures,
    ElasticResize,
    ReplaySummary,
)
from disagg_planner.replay.summary import (
    FLAP_WINDOW_S,
    Reversal,
    ScaleLog,
    TimelineRow,
    score_requests,
    write_requests_csv,
    write_timeline_csv,
)
from disagg_planner.report.recorder import DiagnosticsRecorder
from disagg_planner.report.snapshot import TickSnapshot
from disagg_planner.runtime.observation import engine_queues
from disagg_planner.simulator import elastic_ep
from disagg_planner.simulator.cluster import DEFAULT_DRAIN_GRACE_S, Cluster, Replica
from disagg_planner.simulator.elastic_ep import ResizePlan
from disagg_planner.simulator.engine_spec import EngineSpec
from disagg_planner.simulator.heap import FrozenHeap
from disagg_planner.simulator.request import RequestLike
from disagg_planner.simulator.shutdown import ShutdownSettings
from disagg_planner.simulator.startup import STARTUP_PHASES

# How long after the last arrival a replay waits for its backlog to clear; a policy that has
# not served every request by then has its unfinished requests counted as failed.
MAX_DRAIN_S = 3600.0


@dataclass(frozen=True)
class ClusterSetup:
    """The simulated deployment every policy of one replay runs on."""

    mode: str  # "disagg" | "agg"
    specs: dict[str, EngineSpec]
    initial_replicas: dict[str, int]
    startup_delay_s: float | None  # None: the phase model of simulator/startup.py
    seed: int
    # Dynamo's prefill workers pull from a shared queue and its KV router balances decode
    # load, so a request goes to the least-loaded engine rather than the next in turn.
    router: str = "least_loaded"
    model_label: str = "model"
    namespace: str = "dynamo"
    drain_grace_s: float | None = DEFAULT_DRAIN_GRACE_S  # None: drains are not bounded
    migrate_on_drain: bool = False
    # Dynamo's staged worker shutdown of a removed replica, its total budget (s); None: the
    # older drain (until empty or the grace period)
    worker_shutdown_s: float | None = None
    # the frontend retries what an engine paused by an elastic-EP resize answers 503
    retry_paused: bool = False
    # the role the planner resizes by DP size (elastic_ep), shown in the outputs
    elastic_role: str | None = None

    def build(self, requests: Sequence[RequestLike]) -> Cluster:
        cluster = Cluster(
            engines=self.specs,
            mode=self.mode,  # type: ignore[arg-type]
            replicas=self.initial_replicas,
            startup_delay_s=self.startup_delay_s,
            router=self.router,  # type: ignore[arg-type]
            seed=self.seed,
            model_label=self.model_label,
            namespace=self.namespace,
            drain_grace_s=self.drain_grace_s,
            migrate_on_drain=self.migrate_on_drain,
            retry_paused=self.retry_paused,
            worker_shutdown=(
                None
                if self.worker_shutdown_s is None
                else ShutdownSettings(total_s=self.worker_shutdown_s)
            ),
        )
        cluster.submit(requests)
        return cluster


@dataclass
class ReplayResult:
    policy: str
    summary: ReplaySummary
    records: list[Any]
    timeline: list[TimelineRow]
    snapshots: list[TickSnapshot] = field(default_factory=list)
    # the flaps the summary counts, each with its two changes (what a cause quotes)
    reversals: list[Reversal] = field(default_factory=list)


def run_policy(
    policy: Policy,
    *,
    setup: ClusterSetup,
    requests: Sequence[RequestLike],
    ttft_slo_ms: float,
    itl_slo_ms: float,
    flap_window_s: float = FLAP_WINDOW_S,
    advisory: bool = False,
    recorder: DiagnosticsRecorder | None = None,
    progress: Callable[[float, float], None] | None = None,
) -> ReplayResult:
    """Replay ``requests`` under ``policy``; deterministic for a given setup and seed."""
    run = PolicyRun(policy, setup=setup, requests=requests, advisory=advisory, recorder=recorder)
    cluster = run.cluster
    # the collector leaves the simulation's objects alone (simulator/heap.py)
    with FrozenHeap() as heap:
        while not cluster.idle:
            t = policy.next_wakeup_s()
            if not t < run.limit_s:
                break
            # the clock stops at the last request's finish, which ends the metered span
            heap.advance(cluster, max(t, cluster.now), stop_when_idle=True)
            if cluster.idle:
                break
            if run.wake() is None:
                continue
            if progress is not None:
                progress(min(cluster.now, run.last_arrival_s), run.last_arrival_s)
        run.close(heap)
    if progress is not None:
        progress(run.last_arrival_s, run.last_arrival_s)
    return run.result(ttft_slo_ms=ttft_slo_ms, itl_slo_ms=itl_slo_ms, flap_window_s=flap_window_s)


class PolicyRun:
    """One policy on its own simulated cluster, one wake-up at a time: what
    :func:`run_policy` drives alone and the fleet replay drives beside others on one clock.
    ``connector_factory(cluster, on_scale=...)`` builds the connector the policy acts
    through (the fleet's caps what its grant does not cover)."""

    def __init__(
        self,
        policy: Policy,
        *,
        setup: ClusterSetup,
        requests: Sequence[RequestLike],
        advisory: bool = False,
        recorder: DiagnosticsRecorder | None = None,
        connector_factory: Callable[..., SimulatedConnector] | None = None,
    ) -> None:
        self.wall0 = time.perf_counter()
        self.policy = policy
        self.setup = setup
        self.requests = requests
        self.advisory = advisory
        self.recorder = recorder
        self.cluster = cluster = setup.build(requests)
        self.scale_log = ScaleLog()
        make = connector_factory or SimulatedConnector
        self.connector = make(cluster, on_scale=self.scale_log.add)
        start = getattr(policy, "start", None)
        if start is not None:
            start(cluster, self.connector)
        self.last_arrival_s = max((r.arrival_s for r in requests), default=0.0)
        self.limit_s = self.last_arrival_s + MAX_DRAIN_S
        self.roles: tuple[str, ...] = tuple(cluster.roles)
        self.ticks: list[TimelineRow] = []
        self.snapshots: list[TickSnapshot] = []
        self.max_replicas = {r: cluster.desired_replicas(r) for r in self.roles}
        self.initial_desired: dict[str, int] = {r: cluster.desired_replicas(r) for r in self.roles}

    def wake(self) -> PolicyStep | None:
        """Let the policy observe and decide at the cluster's now, apply and record it; None
        for a wake-up that only sampled the engines."""
        cluster, roles = self.cluster, self.roles
        step = self.policy.wake(cluster)
        if step.reason == "sample":
            return None
        applied = _apply(self.connector, step, advisory=self.advisory)
        for role in roles:
            self.max_replicas[role] = max(self.max_replicas[role], cluster.desired_replicas(role))
        row = TimelineRow(
            t_s=cluster.now,
            desired={r: cluster.desired_replicas(r) for r in roles},
            ready={r: cluster.ready_replicas(r) for r in roles},
            gpus_in_use=cluster.gpus_in_use(),
            decision=applied,
            reason=step.reason,
            message=step.message,
        )
        self.ticks.append(row)
        snap = _snapshot(cluster, step, row)
        self.snapshots.append(snap)
        if self.recorder is not None:
            self.recorder.record(snap)
        return step

    def close(self, heap: FrozenHeap) -> None:
        """The policy takes no more decisions; the backlog drains on what it left running."""
        close = getattr(self.policy, "close", None)
        if close is not None:
            close()
        if not self.cluster.idle:
            heap.advance(self.cluster, max(self.limit_s, self.cluster.now), stop_when_idle=True)

    def result(
        self, *, ttft_slo_ms: float, itl_slo_ms: float, flap_window_s: float = FLAP_WINDOW_S
    ) -> ReplayResult:
        cluster, roles, setup, requests = self.cluster, self.roles, self.setup, self.requests
        scale_log = self.scale_log
        end_s = cluster.now
        gpu_seconds = cluster.gpu_seconds
        timeline = replica_timeline(
            cluster.replicas,
            self.ticks,
            roles=roles,
            initial_desired=self.initial_desired,
            end_s=end_s,
            resizes=cluster.resizes,
            elastic_role=setup.elastic_role,
        )
        records = list(cluster.records)
        score = score_requests(
            records, submitted=len(requests), ttft_slo_ms=ttft_slo_ms, itl_slo_ms=itl_slo_ms
        )
        elastic = None
        if setup.elastic_role is not None:
            elastic = elastic_summary(
                cluster.resizes,
                timeline,
                role=setup.elastic_role,
                requests=requests,
                # requests a shrink aborted on its removed ranks (vLLM's mode="abort"): failed
                aborted_at_shrink=cluster.aborted_at_shrink,
            )
        summary = ReplaySummary(
            policy=self.policy.name,
            requests=score.requests,
            completed=score.completed,
            failed=score.failed,
            slo_attainment=score.slo_attainment,
            ttft_ms=score.ttft_ms,
            itl_ms=score.itl_ms,
            unfinished=len(requests) - len(records),
            gpu_hours=gpu_seconds / 3600.0,
            gpu_hours_by_role={
                r: seconds / 3600.0 for r, seconds in cluster.gpu_seconds_by_role().items()
            },
            replica_hours={
                r: sum(_alive_s(x, end_s) for x in cluster.replicas if x.role == r) / 3600.0
                for r in roles
            },
            metered_span_s=end_s,
            last_arrival_s=self.last_arrival_s,
            scale_actions={r: scale_log.actions().get(r, 0) for r in roles},
            drain=DrainFigures(
                grace_s=setup.drain_grace_s,
                cancelled=cluster.cancelled_at_drain,
                migrated=cluster.migrated_at_drain,
                worker_budget_s=setup.worker_shutdown_s,
                ended_by=None if setup.worker_shutdown_s is None else shutdown_ends(cluster),
            ),
            # requests a resize's pause answered 503 (frontend not retrying); 0 without resizes
            rejected=cluster.rejected_in_pause,
            elastic_ep=elastic,
            flaps={r: scale_log.flaps(flap_window_s).get(r, 0) for r in roles},
            flap_window_s=flap_window_s,
            max_replicas=self.max_replicas,
            duration_s=end_s,
            wall_s=time.perf_counter() - self.wall0,
        )
        return ReplayResult(
            self.policy.name,
            summary,
            records,
            timeline,
            self.snapshots,
            reversals=scale_log.reversals(flap_window_s),
        )


def shutdown_ends(cluster: Cluster) -> dict[str, int]:
    """How the serving of each replica removed with the staged shutdown ended, counted."""
    ends = Counter(
        x.shutdown.ended_by or "in_progress" for x in cluster.replicas if x.shutdown is not None
    )
    return dict(sorted(ends.items()))


def _alive_s(replica: Replica, end_s: float) -> float:
    """Seconds ``replica`` existed (starting, ready or draining) within [0, ``end_s``]."""
    stop = end_s if replica.stop_s is None else min(replica.stop_s, end_s)
    return max(0.0, stop - replica.start_s)


def elastic_summary(
    resizes: Sequence[ResizePlan],
    timeline: Sequence[TimelineRow],
    *,
    role: str,
    requests: Sequence[RequestLike],
    aborted_at_shrink: int,
) -> ElasticFigures:
    """The elastic role's DP sizes and resizes: for summary.json and the report."""
    sizes = [row.dp[role] for row in timeline if role in row.dp]
    span = [(a.t_s, b.t_s, a.dp.get(role, 0)) for a, b in itertools.pairwise(timeline)]
    total = sum(t1 - t0 for t0, t1, _ in span)
    arrivals = sorted(r.arrival_s for r in requests)
    return ElasticFigures(
        role=role,
        dp_initial=sizes[0] if sizes else None,
        dp_final=sizes[-1] if sizes else None,
        dp_min=min(sizes, default=None),
        dp_max=max(sizes, default=None),
        dp_mean=sum((t1 - t0) * dp for t0, t1, dp in span) / total if total > 0 else None,
        resizes=tuple(
            ElasticResize(
                from_dp=p.from_dp,
                to_dp=p.to_dp,
                mode=p.mode,
                requested_s=p.start_s if p.requested_s is None else p.requested_s,
                followers_ready_s=p.followers_ready_s,
                start_s=p.start_s,
                pause_start_s=p.downtime_start_s,
                end_s=p.end_s,
                pause_s=p.downtime_s,
                arrived_in_pause=bisect.bisect_left(arrivals, p.end_s)
                - bisect.bisect_left(arrivals, p.downtime_start_s),
            )
            for p in resizes
        ),
        paused_s=sum(p.downtime_s for p in resizes),
        aborted_at_shrink=aborted_at_shrink,
    )


def replica_timeline(
    replicas: Sequence[Replica],
    ticks: Sequence[TimelineRow],
    *,
    roles: Sequence[str],
    initial_desired: Mapping[str, int],
    end_s: float,
    resizes: Sequence[ResizePlan] = (),
    elastic_role: str | None = None,
) -> list[TimelineRow]:
    """The policy's decisions merged with every change of any replica's state, each row
    giving the deployment just after everything that happened at its instant.

    The counts come from the replicas' own history (start, start-up phases, ready, drain,
    stop and GPU changes)
    rather than from what the runner saw at its ticks, so the rows integrate to exactly the
    GPU-seconds the cluster meters: a row at t = 0, one at each tick and at each change
    between ticks, and one at ``end_s`` closing the span.
    """
    changes: set[float] = {0.0, end_s}
    for x in replicas:
        changes.add(x.start_s)
        if x.stop_s is None or x.ready_s < x.stop_s:
            changes.add(x.ready_s)  # a replica stopped while starting never became ready
        if x.drain_s is not None:
            changes.add(x.drain_s)
        if x.stop_s is not None:
            changes.add(x.stop_s)
        changes.update(t for t, _ in x.gpu_segments)
        if x.startup_plan is not None:
            changes.update(t for _, t in x.startup_plan.phase_starts(x.start_s))
    plans_of: dict[str, list[ResizePlan]] = {}
    for plan in resizes:
        plans_of.setdefault(plan.worker_id, []).append(plan)
        changes.update((plan.start_s, plan.downtime_start_s, plan.end_s))
        if plan.requested_s is not None:
            changes.add(plan.requested_s)
    tick_times = {row.t_s for row in ticks}
    # at one instant a tick's row comes first: it already shows the state after that instant
    pending: list[tuple[float, TimelineRow | None]] = [(row.t_s, row) for row in ticks]
    pending += [(t, None) for t in sorted(changes) if t <= end_s and t not in tick_times]
    pending.sort(key=lambda item: (item[0], item[1] is None))

    rows: list[TimelineRow] = []
    desired = dict(initial_desired)
    for t, tick in pending:
        if tick is not None:
            desired = dict(tick.desired)
        starting = dict.fromkeys(roles, 0)
        ready = dict.fromkeys(roles, 0)
        draining = dict.fromkeys(roles, 0)
        phases = {p: dict.fromkeys(roles, 0) for p in STARTUP_PHASES}
        dp = {elastic_role: 0} if elastic_role is not None else {}
        paused = dict(dp)
        gpus = 0
        for x in replicas:
            if x.start_s > t or (x.stop_s is not None and x.stop_s <= t):
                continue
            if x.role == elastic_role:
                plans = plans_of.get(x.worker_id, [])
                first = plans[0].from_dp if plans else len(x.ranks)
                dp[x.role] += elastic_ep.dp_at(plans, t, initial=first)
                paused[x.role] += any(p.downtime_start_s <= t < p.end_s for p in plans)
            if x.ready_s > t:
                starting[x.role] += 1
                phase = x.startup_phase(t)
                if phase in phases:  # a constant start-up has no phases to show
                    phases[phase][x.role] += 1
            elif x.drain_s is not None and x.drain_s <= t:
                draining[x.role] += 1
            else:
                ready[x.role] += 1
            gpus += x.gpus_at(t)
        if tick is not None:
            event = "tick"
        else:
            event = "start" if t == 0.0 else "end" if t == end_s else "state"
        rows.append(
            TimelineRow(
                t_s=t,
                desired=dict(desired),
                ready=ready,
                gpus_in_use=gpus,
                decision=tick.decision if tick is not None else "",
                reason=tick.reason if tick is not None else "",
                message=tick.message if tick is not None else "",
                replicas={r: starting[r] + ready[r] + draining[r] for r in roles},
                starting=starting,
                draining=draining,
                startup_phases=phases,
                event=event,
                dp=dp,
                paused=paused,
            )
        )
    if rows[-1].event != "end":
        # the span closed on a tick: repeat its state as the closing row, so every timeline
        # ends on one "end" row
        last = rows[-1]
        rows.append(dataclasses.replace(last, decision="", reason="", message="", event="end"))
    return rows


def _apply(connector: SimulatedConnector, step: PolicyStep, *, advisory: bool) -> str:
    """Apply a baseline's decision (the planner's loop applied its own); the timeline text."""
    if not step.scale_to:
        return ""
    text = ",".join(f"{r}={n}" for r, n in step.scale_to.items())
    if advisory:
        return f"advised {text}"
    if not step.acted:
        run_now(connector.set_replicas(step.scale_to))
    return text


def _snapshot(cluster: Cluster, step: PolicyStep, row: TimelineRow) -> TickSnapshot:
    effects = step.effects
    observed = forecast = corrections = None
    throughput = effects.throughput if effects is not None else None
    if throughput is not None:
        observed = throughput.diagnostics.observed
        forecast = throughput.diagnostics.forecast
        corrections = throughput.diagnostics.corrections
    interval = observed.duration_s if observed is not None else None
    return TickSnapshot(
        t_s=row.t_s,
        desired=row.desired,
        ready=row.ready,
        gpus_in_use=row.gpus_in_use,
        gpu_hours=cluster.gpu_seconds / 3600.0,
        scale_to=step.scale_to,
        throughput_reason=effects.throughput_reason.value
        if effects is not None and effects.throughput_reason is not None
        else None,
        load_reason=effects.load_reason.value
        if effects is not None and effects.load_reason is not None
        else None,
        message=step.message or step.reason,
        observed_rps=observed.request_rate if observed is not None else None,
        observed_ttft_ms=observed.ttft_ms if observed is not None else None,
        observed_itl_ms=observed.itl_ms if observed is not None else None,
        observed_isl=observed.isl if observed is not None else None,
        observed_osl=observed.osl if observed is not None else None,
        predicted_rps=forecast.num_req / interval if forecast is not None and interval else None,
        predicted_isl=forecast.isl if forecast is not None else None,
        predicted_osl=forecast.osl if forecast is not None else None,
        prefill_correction=corrections.prefill if corrections is not None else None,
        decode_correction=corrections.decode if corrections is not None else None,
        estimated_ttft_ms=effects.estimated_ttft_ms if effects is not None else None,
        estimated_itl_ms=effects.estimated_itl_ms if effects is not None else None,
        engines=engine_queues({role: cluster.latest_fpm(role) for role in cluster.roles}),
    )


def engine_spec_for_profile(profile: Profile) -> str:
    """``sim:MODEL@GPU:tpN`` of the engine a (bundled, modelled) profile describes."""
    manifest = profile.manifest
    if manifest is None:
        raise ValueError(
            f"profile {profile.source_dir} has no profile.yaml manifest: give --engine "
            "sim:MODEL@GPU[:tpN] to say which engine to simulate"
        )
    spec = manifest.extra.get("engine_spec") if manifest.extra else None
    if isinstance(spec, str) and spec.startswith(("sim:", "aic:")):
        return spec
    shape = manifest.decode_engine if manifest.decode_engine.tp > 1 else manifest.engine
    return f"sim:{manifest.model}@{manifest.gpu}:tp{shape.tp}"


def write_outputs(
    out_dir: Path, result: ReplayResult, *, config: PlannerConfig | None, roles: Sequence[str]
) -> None:
    """summary.json, requests.csv, timeline.csv for one policy (the report is separate)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = result.summary
    if config is not None:
        summary = dataclasses.replace(summary, config=config.model_dump(mode="json"))
    summary.write(out_dir / SUMMARY_FILE)
    elastic = result.summary.elastic_ep
    dp_at = None
    if elastic is not None:
        role = elastic.role
        steps = [(row.t_s, row.dp.get(role, 0)) for row in result.timeline]
        times = [t for t, _ in steps]

        def dp_at(t_s: float) -> int:
            return steps[max(0, bisect.bisect_right(times, t_s) - 1)][1]

    write_requests_csv(out_dir / "requests.csv", result.records, dp_at=dp_at)
    write_timeline_csv(out_dir / "timeline.csv", result.timeline, roles)
