"""Scaling policies replay compares, behind one small protocol.

- ``planner``: the real decision core (:class:`disagg_planner.core.planner.PlannerCore`) exactly as
  configured; it sees what production would give it: window aggregates computed from the
  simulated frontend's cumulative metrics as the PromQL computes them, and ForwardPassMetrics
  from the simulated engines.
- ``dynamo-default``: the same core with Dynamo's defaults (throughput loop only, ARIMA,
  180 s, correction on).
- ``static:NP,ND``: fixed replicas.
- ``hpa``: a Kubernetes HPA per role on engine busy time (:mod:`disagg_planner.replay.hpa`).
- ``oracle``: clairvoyant; knows the whole trace and starts replicas one startup delay ahead
  (:mod:`disagg_planner.replay.oracle`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.core.planner import Effects, Observation, PlannerCore
from disagg_planner.core.types import DeploymentStatus, RoleStatus
from disagg_planner.observe.window import Snapshot, snapshot_from_text, traffic_from_snapshots
from disagg_planner.replay.hpa import HorizontalPodAutoscaler, HpaBehavior
from disagg_planner.report.recorder import EngineQueues
from disagg_planner.signals.fpm import ForwardPassMetrics
from disagg_planner.simulator.cluster import Cluster

# How often (simulated seconds) the load models are fed the engines' latest iteration
# between load ticks. Production feeds every iteration; one sample per engine per second
# keeps the regression window fresh at a fraction of the cost.
FPM_SAMPLE_PERIOD_S = 1.0
# Engines' busy share is measured over this long a window (one load tick is too noisy).
BUSY_WINDOW_S = 60.0


@dataclass(frozen=True)
class PolicyStep:
    """What a policy did at one wake-up (one row of timeline.csv)."""

    t_s: float
    scale_to: dict[str, int] | None
    reason: str
    message: str = ""
    effects: Effects | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Policy(Protocol):
    name: str

    def next_wakeup_s(self) -> float:
        """When the policy next wants to look at the cluster (simulated seconds)."""
        ...

    def wake(self, cluster: Cluster) -> PolicyStep:
        """Observe the cluster at ``cluster.now`` and decide (the runner applies it)."""
        ...


def deployment_status(cluster: Cluster) -> DeploymentStatus:
    return DeploymentStatus(
        {
            role: RoleStatus(
                desired=cluster.desired_replicas(role),
                ready=cluster.ready_replicas(role),
                gpus_per_replica=cluster.gpus_per_replica(role),
            )
            for role in cluster.roles
        }
    )


def engine_queues(cluster: Cluster) -> tuple[EngineQueues, ...]:
    out: list[EngineQueues] = []
    for role in cluster.roles:
        for (worker, rank), fpm in cluster.latest_fpm(role).items():
            out.append(
                EngineQueues(
                    role=role,
                    worker_id=worker,
                    dp_rank=rank,
                    queued_prefill_tokens=fpm.queued_requests.sum_prefill_tokens,
                    queued_decode_kv_tokens=fpm.queued_requests.sum_decode_kv_tokens,
                    inflight_decode_kv_tokens=fpm.scheduled_requests.sum_decode_kv_tokens,
                )
            )
    return tuple(out)


class PlannerPolicy:
    """The decision core driven in virtual time."""

    def __init__(self, *, name: str, core: PlannerCore, config: PlannerConfig) -> None:
        self.name = name
        self.core = core
        self.config = config
        self._snapshots: dict[float, Snapshot] = {}
        self._fed: dict[tuple[str, int], int] = {}  # engine -> last counter fed to the models
        self._next_sample_s = FPM_SAMPLE_PERIOD_S
        self._busy_seen: dict[tuple[str, int], deque[tuple[float, float]]] = {}

    def start(self, cluster: Cluster) -> None:
        self._snapshots[cluster.now] = snapshot_from_text(cluster.frontend.render_prometheus_text())

    def next_wakeup_s(self) -> float:
        if self.core.load_models:
            return min(self.core.next_tick_at_s, self._next_sample_s)
        return self.core.next_tick_at_s

    def _feed_models(self, cluster: Cluster) -> None:
        for role in self.core.load_models:
            for key, fpm in cluster.latest_fpm(role).items():
                if self._fed.get(key) != fpm.counter_id:
                    self._fed[key] = fpm.counter_id
                    self.core.observe_iteration(role, fpm)

    def wake(self, cluster: Cluster) -> PolicyStep:
        now = cluster.now
        if self.core.load_models and now >= self._next_sample_s - 1e-9:
            self._feed_models(cluster)
            self._next_sample_s = now + FPM_SAMPLE_PERIOD_S
        if now < self.core.next_tick_at_s - 0.5:
            return PolicyStep(now, None, "sample")
        due = self.core.due(now)
        if due is None:
            return PolicyStep(now, None, "sample")
        traffic = None
        if due.run_throughput:
            interval = self.config.throughput_adjustment_interval_seconds
            end = snapshot_from_text(cluster.frontend.render_prometheus_text())
            start_s = now - interval
            start = self._snapshot_at(start_s)
            self._snapshots[now] = end
            self._snapshots = {t: s for t, s in self._snapshots.items() if t >= start_s - 1e-6}
            if start is None:
                traffic = None
            else:
                traffic = traffic_from_snapshots(
                    start=start,
                    end=end,
                    start_s=start_s,
                    end_s=now,
                    model_name=cluster.frontend.labels["model"],
                    namespace=cluster.frontend.labels["dynamo_namespace"],
                )
        engines: dict[str, Mapping[tuple[str, int], ForwardPassMetrics]] | None = None
        busy: dict[str, dict[tuple[str, int], float]] | None = None
        if due.run_load:
            engines = {role: cluster.latest_fpm(role) for role in cluster.roles}
            busy = self._busy_fractions(cluster, now)
        effects = self.core.tick(
            now,
            Observation(
                status=deployment_status(cluster),
                traffic=traffic,
                engines=engines,
                engine_busy_fraction=busy,
            ),
        )
        reason = "/".join(
            r.value for r in (effects.throughput_reason, effects.load_reason) if r is not None
        )
        return PolicyStep(now, effects.scale_to, reason, effects.message, effects)

    def _busy_fractions(
        self, cluster: Cluster, now: float
    ) -> dict[str, dict[tuple[str, int], float]]:
        """Each engine's busy share over the last ``BUSY_WINDOW_S``: what summing the
        wall_time of every FPM it published over that time gives in production."""
        out: dict[str, dict[tuple[str, int], float]] = {}
        for role in cluster.roles:
            for engine in cluster.engines(role):
                key = (engine.worker_id, engine.dp_rank)
                history = self._busy_seen.setdefault(key, deque())
                history.append((now, engine.busy_time_s))
                while len(history) > 2 and history[1][0] <= now - BUSY_WINDOW_S:
                    history.popleft()
                (t0, b0), (t1, b1) = history[0], history[-1]
                if t1 > t0:
                    out.setdefault(role, {})[key] = min(1.0, max(0.0, (b1 - b0) / (t1 - t0)))
        return out

    def _snapshot_at(self, t_s: float) -> Snapshot | None:
        for t, snap in self._snapshots.items():
            if abs(t - t_s) < 1e-6:
                return snap
        # the first window starts at the beginning of the run
        earliest = min(self._snapshots)
        return self._snapshots[earliest] if earliest <= t_s + 1e-6 else None


class StaticPolicy:
    def __init__(self, replicas: Mapping[str, int]) -> None:
        self.name = "static:" + ",".join(str(n) for n in replicas.values())
        self.replicas = dict(replicas)
        self._done = False

    def next_wakeup_s(self) -> float:
        return math.inf if self._done else 0.0

    def wake(self, cluster: Cluster) -> PolicyStep:
        self._done = True
        return PolicyStep(cluster.now, dict(self.replicas), "static")


class HpaPolicy:
    """One HPA per role on the metrics platform teams scale vLLM on: busy time (GPU
    utilisation) for prefill, KV-cache or sequence-slot usage for decode, the larger of the
    two for aggregated engines."""

    def __init__(self, roles: tuple[str, ...], behavior: HpaBehavior) -> None:
        self.name = "hpa"
        self.behavior = behavior
        self.hpas = {role: HorizontalPodAutoscaler(behavior) for role in roles}
        self._next = behavior.sync_period_s
        self._busy: dict[tuple[str, int], tuple[float, float]] = {}  # engine -> (t, busy_s)

    def next_wakeup_s(self) -> float:
        return self._next

    def _busy_fraction(self, cluster: Cluster, role: str, now: float) -> list[float]:
        fractions = []
        for engine in cluster.engines(role):
            key = (engine.worker_id, engine.dp_rank)
            previous = self._busy.get(key)
            self._busy[key] = (now, engine.busy_time_s)
            if previous is not None and now > previous[0]:
                fractions.append(min(1.0, (engine.busy_time_s - previous[1]) / (now - previous[0])))
        return fractions

    @staticmethod
    def _kv_usage(cluster: Cluster, role: str) -> list[float]:
        """KV-cache usage (``vllm:gpu_cache_usage_perc``) or, when higher, the share of
        sequence slots taken (``vllm:num_requests_running`` over ``max_num_seqs``): an engine
        runs out of either."""
        caps = cluster.capabilities(role)
        usage = []
        for f in cluster.latest_fpm(role).values():
            kv = f.scheduled_requests.sum_decode_kv_tokens + f.queued_requests.sum_decode_kv_tokens
            seqs = f.scheduled_requests.num_decode_requests + f.queued_requests.num_decode_requests
            usage.append(max(kv / caps.max_kv_tokens, seqs / caps.max_num_seqs))
        return usage

    def _utilisation(self, per_engine: list[float], expected: int) -> float | None:
        """The HPA's readiness rule: pods without a metric (still starting) count as 0 % when
        the others say scale up and as 100 % when they say scale down, and may not flip the
        direction; otherwise a scale-up would be multiplied again at every sync while the
        new pods start."""
        if not per_engine:
            return None
        target = self.behavior.target_utilisation
        missing = max(0, expected - len(per_engine))
        total = len(per_engine) + missing
        up = sum(per_engine) / total
        down = (sum(per_engine) + missing) / total
        if up > target:
            return up
        if down < target:
            return down
        return target  # the substitutions disagree: no change

    def wake(self, cluster: Cluster) -> PolicyStep:
        now = cluster.now
        self._next = now + self.behavior.sync_period_s
        target: dict[str, int] = {}
        notes = []
        for role, hpa in self.hpas.items():
            current = cluster.desired_replicas(role)
            expected = current * cluster.capabilities(role).dp
            busy = (
                self._utilisation(self._busy_fraction(cluster, role, now), expected)
                if role != "decode"
                else None
            )
            kv = (
                self._utilisation(self._kv_usage(cluster, role), expected)
                if role != "prefill"
                else None
            )
            signals = [v for v in (busy, kv) if v is not None]
            utilisation = max(signals) if signals else None
            target[role] = hpa.recommend(now_s=now, current=current, utilisation=utilisation)
            if utilisation is not None:
                notes.append(f"{role} {utilisation:.0%}")
        changed = any(target[r] != cluster.desired_replicas(r) for r in target)
        return PolicyStep(now, target if changed else None, "hpa", ", ".join(notes))
