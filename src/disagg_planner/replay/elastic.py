"""Elastic EP in replay: the simulated engine behind the live loop's elastic-EP driver.

With ``elastic_ep`` set, the planner policy's :class:`disagg_planner.runtime.loop.DeploymentLoop`
builds its :class:`disagg_planner.runtime.elastic.ElasticDriver` as live: the same policy
(:class:`disagg_planner.core.elastic.ElasticPlanner`) decides the DP size on every throughput
tick. Only the actuator differs: instead of the HTTP client of the engine's resize route, the
driver gets :class:`SimulatedElasticEngine` from the simulated connector, which schedules the
resize on the simulated cluster (:meth:`disagg_planner.simulator.cluster.Cluster.resize_dp`):

- a grow's follower ranks start and join the engine for the time the policy's lead time
  plans with: ``elastic_ep_follower_ready_seconds`` when the followers are pods the planner
  starts (``elastic_ep_follower_service``), none otherwise (the GPUs are already there); their
  GPUs are metered from the request;
- then the resize runs with the mode's timing (``elastic_ep_mode``, or ``elastic_ep_timing``
  when set): the policy's numbers again (:func:`disagg_planner.core.elastic.mode_timing`);
- while the resize pauses serving, requests that find no serving engine are rejected (503),
  or retried after the pause with ``elastic_ep_frontend_retries``
  (:func:`retry_paused`);
- a shrink aborts the requests running on the removed ranks (failed, counted in the
  report), unless ``elastic_ep_engine_drains_requests`` says the engine drains first.

The resize's durations are drawn when it is scheduled, so ``resize`` returns at once with
them (the policy holds while the cluster says a resize is in flight, so learning them then
rather than at the end changes no decision).
"""

from __future__ import annotations

from collections.abc import Mapping

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.connectors.elastic_ep import ResizeInFlight, ResizeOutcome, ResizeResult
from disagg_planner.core.elastic import mode_timing
from disagg_planner.errors import SpecError
from disagg_planner.simulator.cluster import Cluster, Replica, ReplicaState
from disagg_planner.simulator.engine_spec import EngineSpec


def retry_paused(config: PlannerConfig) -> bool:
    """Whether the simulated frontend retries what a paused engine rejects: the setting the
    policy prices the pause with (``elastic_ep_frontend_retries``)."""
    return config.elastic_ep_frontend_retries


def check_elastic_setup(
    config: PlannerConfig, specs: Mapping[str, EngineSpec], initial: Mapping[str, int] | None
) -> None:
    """Refuse, naming the setting, what the simulated elastic engine cannot play."""
    role = config.elastic_ep
    if role is None:
        return
    if role not in specs:
        raise SpecError(
            f"elastic_ep={role}: this {config.mode} replay has the roles {', '.join(specs)}"
        )
    spec = specs[role]
    if spec.model.moe is None:
        raise SpecError(
            f"elastic_ep={role}: the engine {spec} runs {spec.model.name}, a dense model; "
            "elastic EP resizes the expert-parallel group of a MoE engine "
            "(e.g. --engine sim:deepseek-v3@gb200:tp1:dp16:ep16)"
        )
    if config.elastic_ep_gpus_per_rank != spec.tp:
        raise SpecError(
            f"elastic_ep_gpus_per_rank={config.elastic_ep_gpus_per_rank}: the engine {spec} "
            f"runs TP{spec.tp}, so each of its DP ranks has {spec.tp} GPU(s); set "
            f"elastic_ep_gpus_per_rank={spec.tp}"
        )
    lo, hi, step = config.elastic_ep_min_dp, config.elastic_ep_max_dp, config.elastic_ep_dp_step
    assert hi is not None  # the config requires it with elastic_ep
    if not lo <= spec.dp <= hi or (spec.dp - lo) % step:
        raise SpecError(
            f"the engine {spec} starts at DP {spec.dp}, which is not a size elastic_ep_min_dp "
            f"({lo}) + k x elastic_ep_dp_step ({step}) within elastic_ep_max_dp ({hi}); give "
            "the engine's :dpN or change the bounds"
        )
    if initial is not None and initial.get(role, 1) != 1:
        raise SpecError(
            f"--initial {role}={initial[role]}: the elastic-EP role is one engine resized in "
            f"place (elastic_ep={role}); give {role}=1"
        )


class SimulatedElasticEngine:
    """The :class:`disagg_planner.runtime.elastic.ElasticController` of the elastic role's
    one simulated engine (see the module doc); its coroutines never suspend."""

    def __init__(self, cluster: Cluster, config: PlannerConfig) -> None:
        if config.elastic_ep is None or config.elastic_ep_max_dp is None:
            raise ValueError("SimulatedElasticEngine needs a config with elastic_ep set")
        self.cluster = cluster
        # vLLM aborts what runs on the ranks a shrink removes, unless it drains first.
        cluster.shrink_drains_first = config.elastic_ep_engine_drains_requests
        self.role: str = config.elastic_ep
        self.min_dp = config.elastic_ep_min_dp
        self.max_dp = config.elastic_ep_max_dp
        self.step = config.elastic_ep_dp_step
        self.timing = mode_timing(config)
        self.followers_ready_s = (
            config.elastic_ep_follower_ready_seconds
            if config.elastic_ep_follower_service is not None
            else 0.0
        )

    def engine(self) -> Replica:
        """The role's one engine (the replica that serves or will)."""
        live = [
            x
            for x in self.cluster.replicas
            if x.role == self.role and x.state is not ReplicaState.STOPPED
        ]
        if len(live) != 1:
            raise SpecError(
                f"elastic_ep={self.role}: the simulated {self.role} role has {len(live)} "
                "replicas; elastic EP resizes one engine in place"
            )
        return live[0]

    async def current_dp(self) -> int:
        return len(self.engine().ranks)

    async def partial_reconfiguration(self) -> str | None:
        return None  # a simulated resize never half-fails

    async def is_resizing(self) -> bool:
        return self.engine().resizing is not None

    async def recover(self) -> ResizeResult | None:
        return None  # nothing is left over from a previous planner

    async def resize(self, new_dp: int) -> ResizeResult:
        if not self.min_dp <= new_dp <= self.max_dp or (new_dp - self.min_dp) % self.step:
            raise ValueError(
                f"new DP size {new_dp} is not elastic_ep_min_dp ({self.min_dp}) + k x "
                f"elastic_ep_dp_step ({self.step}) within elastic_ep_max_dp ({self.max_dp})"
            )
        x = self.engine()
        if x.resizing is not None:
            raise ResizeInFlight(f"elastic EP: {x.worker_id} is already resizing")
        current = len(x.ranks)
        if new_dp == current:
            return ResizeResult(
                ResizeOutcome.UNCHANGED, current, new_dp, current, f"already at DP {current}"
            )
        grow = new_dp > current
        followers = self.followers_ready_s if grow else 0.0
        # every ready replica of the role: the one engine; the role's size (what the
        # connector reports per replica) is the new one from now, as its GPUs are
        [plan] = self.cluster.resize_dp(self.role, new_dp, self.timing, followers_ready_s=followers)
        return ResizeResult(
            ResizeOutcome.RESIZED,
            current,
            new_dp,
            new_dp,
            f"simulated DP {current} -> {new_dp}: followers join {plan.followers_ready_s:.0f} s, "
            f"{plan.mode} resize {plan.end_s - plan.start_s:.2f} s, serving paused "
            f"{plan.downtime_s:.2f} s from {plan.downtime_start_s:.1f} s",
            followers_ready_s=plan.followers_ready_s if grow and followers > 0 else None,
            resize_s=plan.end_s - plan.start_s,
            pause_s=plan.downtime_s,
        )
