"""Scaling policies replay compares, behind one small protocol.

- ``planner``: the live reconcile loop (:class:`disagg_planner.runtime.loop.DeploymentLoop`,
  around the real decision core, exactly as configured) on the simulated cluster's clock,
  connector and sources (:mod:`disagg_planner.replay.connector`): every tick gathers, decides
  and applies through the very code ``planner run`` executes, so a replay result speaks for
  the live loop.
- ``dynamo-default``: the same loop with Dynamo's defaults (throughput loop only, ARIMA,
  180 s, correction on).
- ``static:NP,ND``: fixed replicas.
- ``hpa``: a Kubernetes HPA per role on engine busy time (:mod:`disagg_planner.replay.hpa`).
- ``oracle``: clairvoyant; knows the whole trace and starts replicas one startup delay ahead
  (:mod:`disagg_planner.replay.oracle`).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.core.planner import Effects
from disagg_planner.core.schedule import MERGE_TOLERANCE_S
from disagg_planner.profiles import Profile
from disagg_planner.replay.connector import (
    FPM_SAMPLE_PERIOD_S,
    SimulatedConnector,
    SimulatedDeployment,
    SimulatedEngines,
    SimulatedTraffic,
    run_now,
)
from disagg_planner.replay.hpa import HorizontalPodAutoscaler, HpaBehavior
from disagg_planner.runtime.clock import DrivenClock, inline
from disagg_planner.runtime.loop import DeploymentLoop, DeploymentRef
from disagg_planner.runtime.observation import dp_size
from disagg_planner.signals.fpm import ForwardPassMetrics
from disagg_planner.simulator.cluster import Cluster


@dataclass(frozen=True)
class PolicyStep:
    """What a policy did at one wake-up (one row of timeline.csv). ``acted``: the policy
    applied ``scale_to`` through the connector itself, as the live loop does; otherwise the
    runner applies it."""

    t_s: float
    scale_to: dict[str, int] | None
    reason: str
    message: str = ""
    effects: Effects | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    acted: bool = False


class Policy(Protocol):
    name: str

    def next_wakeup_s(self) -> float:
        """When the policy next wants to look at the cluster (simulated seconds)."""
        ...

    def wake(self, cluster: Cluster) -> PolicyStep:
        """Observe the cluster at ``cluster.now`` and decide (the runner applies it, unless
        the policy acted itself)."""
        ...


class PlannerPolicy:
    """The live loop in virtual time (see the module). Between ticks it wakes every
    :data:`FPM_SAMPLE_PERIOD_S` to sample the engines' reports for the load models, as the
    FPM subscribers receive them in the background live."""

    def __init__(self, *, name: str, config: PlannerConfig, profile: Profile | None) -> None:
        self.name = name
        self.config = config
        self.profile = profile
        self._loop: DeploymentLoop | None = None
        self._sources: dict[str, SimulatedEngines] = {}
        self._next_sample_s = FPM_SAMPLE_PERIOD_S

    @property
    def loop(self) -> DeploymentLoop:
        if self._loop is None:
            raise RuntimeError("PlannerPolicy used before start()")
        return self._loop

    def start(self, cluster: SimulatedDeployment, connector: SimulatedConnector) -> None:
        """Build the loop on ``cluster`` at its current time (the core's schedule starts
        then) and validate, as ``planner run`` does at start-up."""
        if self.config.load_scaling_active:
            self._sources = {role: SimulatedEngines(cluster, role) for role in self.config.roles}
        self._next_sample_s = cluster.now + FPM_SAMPLE_PERIOD_S
        self._loop = DeploymentLoop(
            self.config,
            connector=connector,
            ref=DeploymentRef(self.config.namespace, self.name),
            clock=DrivenClock(lambda: cluster.now),
            profile=self.profile,
            traffic_factory=lambda _model: SimulatedTraffic(cluster),
            engine_sources=self._sources,
            offload=inline,
            # one line per tick is what timeline.csv holds; the CLI would drown in them
            tick_log_level=logging.DEBUG,
            raise_tick_errors=True,
        )
        run_now(self._loop.start(asyncio.Event()))

    def next_wakeup_s(self) -> float:
        if self._sources:
            return min(self.loop.next_wake_s, self._next_sample_s)
        return self.loop.next_wake_s

    def wake(self, cluster: SimulatedDeployment) -> PolicyStep:
        now = cluster.now
        if self._sources and now >= self._next_sample_s - 1e-9:
            for source in self._sources.values():
                source.sample()
            self._next_sample_s = now + FPM_SAMPLE_PERIOD_S
        # A sample wake-up this close to the tick runs it, as the core's schedule merges
        # ticks that close (the next sample would come late).
        outcome = None
        if now >= self.loop.next_wake_s - MERGE_TOLERANCE_S:
            outcome = run_now(self.loop.tick())
        if outcome is None:
            return PolicyStep(now, None, "sample")
        reason = "/".join(r for r in (outcome.throughput_reason, outcome.load_reason) if r)
        return PolicyStep(
            now, outcome.scale_to, reason, outcome.message, outcome.effects, acted=True
        )

    def close(self) -> None:
        run_now(self.loop.close())


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
    def _kv_usage(
        cluster: Cluster, role: str, latest: Mapping[tuple[str, int], ForwardPassMetrics]
    ) -> list[float]:
        """KV-cache usage (``vllm:gpu_cache_usage_perc``) or, when higher, the share of
        sequence slots taken (``vllm:num_requests_running`` over ``max_num_seqs``): an engine
        runs out of either."""
        caps = cluster.capabilities(role)
        usage = []
        for f in latest.values():
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
            latest = cluster.latest_fpm(role)
            # pods expected to have a metric: ranks per worker as the engines report them,
            # counted as the planner's loop counts them
            expected = current * dp_size(latest)
            busy = (
                self._utilisation(self._busy_fraction(cluster, role, now), expected)
                if role != "decode"
                else None
            )
            kv = (
                self._utilisation(self._kv_usage(cluster, role, latest), expected)
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
