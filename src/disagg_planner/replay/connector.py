"""The simulated cluster behind the live loop's protocols: replay's connector and sources.

Replay runs the live :class:`disagg_planner.runtime.loop.DeploymentLoop`; it differs from
production only in its clock (:class:`disagg_planner.runtime.clock.DrivenClock`, the
cluster's virtual time) and in what this module plugs into the loop instead of Kubernetes,
Prometheus and ZMQ:

- :class:`SimulatedConnector` (the :class:`Connector` protocol): replica status read from the
  cluster, ``set_replicas`` starting or draining simulated replicas;
- :class:`SimulatedTraffic` (the ``TrafficObserver`` protocol): the frontend's Prometheus text
  exposition, snapshot at the start and end of each window, increases computed as PromQL's
  ``increase()`` does (:func:`disagg_planner.observe.window.traffic_from_snapshots`);
- :class:`SimulatedEngines` (the ``EngineSource`` protocol, with its own busy meter): the
  latest ForwardPassMetrics of every rank. Production feeds the load models every iteration
  (thousands a second); replay keeps one report per engine per :data:`FPM_SAMPLE_PERIOD_S`
  (:meth:`SimulatedEngines.sample`, called by the replay shell between ticks), which keeps the
  regression window fresh at a fraction of the cost, and reads busy time from the simulated
  engines, which sampling could not sum.

The connector's coroutines never suspend, so replay drives them, and the loop's tick, with
:func:`run_now` rather than an event loop.
"""

from __future__ import annotations

from collections.abc import Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.connectors.base import ConnectorDefaults, Hold, ScaleOutcome, check_replicas
from disagg_planner.core.load_scaling import EngineKey
from disagg_planner.core.types import (
    DeploymentStatus,
    MissingObservation,
    RoleStatus,
    TrafficObservation,
)
from disagg_planner.errors import SpecError
from disagg_planner.observe.window import (
    SampleLike,
    Snapshot,
    snapshot_from_samples,
    traffic_from_snapshots,
)
from disagg_planner.signals.fpm import ForwardPassMetrics
from disagg_planner.signals.frontend import MODEL_LABEL, NAMESPACE_LABEL

if TYPE_CHECKING:
    from disagg_planner.replay.elastic import SimulatedElasticEngine

T = TypeVar("T")

# How often (simulated seconds) the load models are given the engines' latest iteration.
FPM_SAMPLE_PERIOD_S = 1.0


class SimulatedFrontend(Protocol):
    labels: Mapping[str, str]

    def exposition_samples(self) -> Sequence[SampleLike]: ...


class SimulatedEngine(Protocol):
    """One rank: who it is, and the seconds it has spent in iterations."""

    worker_id: str
    dp_rank: int
    busy_time_s: float


class SimulatedDeployment(Protocol):
    """What replay reads of and does to the simulated deployment (a
    :class:`disagg_planner.simulator.cluster.Cluster`, or a scripted stand-in in tests)."""

    @property
    def now(self) -> float: ...
    @property
    def roles(self) -> Sequence[str]: ...
    @property
    def frontend(self) -> SimulatedFrontend: ...
    def desired_replicas(self, role: str) -> int: ...
    def ready_replicas(self, role: str) -> int: ...
    def gpus_per_replica(self, role: str) -> int: ...
    def set_replicas(self, role: str, n: int) -> None: ...
    def latest_fpm(self, role: str) -> dict[EngineKey, ForwardPassMetrics]: ...
    def engines(self, role: str) -> Sequence[SimulatedEngine]: ...


def run_now(coroutine: Coroutine[Any, Any, T]) -> T:
    """The result of a coroutine that never suspends (replay's connector, sources and the
    loop's tick on them): run to completion in place, without an event loop."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise RuntimeError("a replay coroutine suspended: something in the tick awaited real I/O")


def deployment_status(cluster: SimulatedDeployment) -> DeploymentStatus:
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


class ScaleListener(Protocol):
    def __call__(self, t_s: float, role: str, before: int, after: int) -> None: ...


class SimulatedConnector(ConnectorDefaults):
    """The :class:`Connector` of a simulated deployment. It never holds a role (nobody edits
    the simulated deployment by hand) and never fails; ``on_scale`` hears of every change of
    a role's desired replicas it makes (replay counts actions and flaps from them)."""

    def __init__(
        self, cluster: SimulatedDeployment, *, on_scale: ScaleListener | None = None
    ) -> None:
        self.cluster = cluster
        self.roles = tuple(cluster.roles)
        self._on_scale = on_scale

    @property
    def model_name(self) -> str | None:
        return self.cluster.frontend.labels.get(MODEL_LABEL)

    async def validate(self) -> None:
        return None  # the simulated deployment has exactly the roles it was built with

    async def status(self) -> DeploymentStatus:
        return deployment_status(self.cluster)

    async def set_replicas(
        self, replicas: Mapping[str, int], *, blocking: bool = False
    ) -> ScaleOutcome:
        """Start or drain simulated replicas. ``blocking`` cannot wait: the replay runner,
        not the connector, moves simulated time; ``ready`` then says whether it is ready now."""
        applied: dict[str, int] = {}
        unchanged: list[str] = []
        for role, n in check_replicas(replicas, self.roles).items():
            before = self.cluster.desired_replicas(role)
            if n == before:
                unchanged.append(role)
                continue
            self.cluster.set_replicas(role, n)
            applied[role] = n
            if self._on_scale is not None:
                self._on_scale(self.cluster.now, role, before, n)
        ready = deployment_status(self.cluster).converged if blocking else None
        return ScaleOutcome(
            requested=dict(replicas), applied=applied, unchanged=tuple(unchanged), ready=ready
        )

    def holds(self) -> Mapping[str, Hold]:
        return {}

    def elastic_controller(self, config: PlannerConfig) -> SimulatedElasticEngine:
        """The elastic-EP role's engine, resized on the simulated cluster
        (:class:`disagg_planner.runtime.elastic.ElasticEngineProvider`)."""
        from disagg_planner.replay.elastic import SimulatedElasticEngine
        from disagg_planner.simulator.cluster import Cluster

        if not isinstance(self.cluster, Cluster):
            raise SpecError("elastic EP in replay needs the simulated cluster")
        return SimulatedElasticEngine(self.cluster, config)

    async def close(self) -> None:
        return None


class SimulatedTraffic:
    """The traffic observer of a simulated frontend: Prometheus' ``increase()`` over a window
    whose ends are both scrapes (the start of the run and every window's end)."""

    def __init__(self, cluster: SimulatedDeployment) -> None:
        self.cluster = cluster
        self._snapshots: dict[float, Snapshot] = {cluster.now: self._scrape()}
        # the widest window asked for: a fast check's short window must not drop the scrape
        # the next throughput window starts at
        self._widest_s = 0.0

    def _scrape(self) -> Snapshot:
        # the samples the frontend's /metrics page holds (test_signals checks they are what
        # parsing the page gives), without writing and parsing the text every tick
        return snapshot_from_samples(self.cluster.frontend.exposition_samples())

    def observe(
        self, *, end_s: float | None = None, duration_s: float | None = None
    ) -> TrafficObservation | MissingObservation:
        """Traffic over ``[end_s - duration_s, end_s]``; ``end_s`` must be the cluster's now
        (a simulated frontend cannot be read in the past) and ``duration_s`` is required."""
        now = self.cluster.now
        if duration_s is None or (end_s is not None and abs(end_s - now) > 1e-6):
            raise ValueError(f"a simulated window ends now ({now:g}) and has a duration")
        end = self._scrape()
        start_s = now - duration_s
        start = self._snapshot_at(start_s)
        self._snapshots[now] = end
        self._widest_s = max(self._widest_s, duration_s)
        keep_from = now - self._widest_s
        self._snapshots = {t: s for t, s in self._snapshots.items() if t >= keep_from - 1e-6}
        if start is None:
            return MissingObservation("not_collected", f"no scrape at or before {start_s:g} s")
        labels = self.cluster.frontend.labels
        return traffic_from_snapshots(
            start=start,
            end=end,
            start_s=start_s,
            end_s=now,
            model_name=labels[MODEL_LABEL],
            namespace=labels[NAMESPACE_LABEL],
        )

    def _snapshot_at(self, t_s: float) -> Snapshot | None:
        """The scrape at ``t_s`` (the previous window's end, or the start of the run), else
        the latest before it; None before the first scrape."""
        before = [t for t in self._snapshots if t <= t_s + 1e-6]
        return self._snapshots[max(before)] if before else None


class SimulatedEngines:
    """The FPM source of one role of a simulated deployment (see the module)."""

    def __init__(self, cluster: SimulatedDeployment, role: str) -> None:
        self.cluster = cluster
        self.role = role
        self._fed: dict[EngineKey, int] = {}  # engine -> last counter sampled
        self._samples: list[ForwardPassMetrics] = []
        self._latest: tuple[float, dict[EngineKey, ForwardPassMetrics]] | None = None

    def sample(self) -> None:
        """Keep every engine's latest report that was not kept yet (the next
        :meth:`drain_samples` hands them to the load models)."""
        for key, fpm in self.cluster.latest_fpm(self.role).items():
            if self._fed.get(key) != fpm.counter_id:
                self._fed[key] = fpm.counter_id
                self._samples.append(fpm)

    def drain_samples(self) -> list[ForwardPassMetrics]:
        samples, self._samples = self._samples, []
        return samples

    def snapshot(self, now_s: float | None = None) -> dict[EngineKey, ForwardPassMetrics]:
        latest = self.cluster.latest_fpm(self.role)
        self._latest = (self.cluster.now, latest)
        return latest

    def last_seen(self) -> dict[EngineKey, float]:
        # A live simulated rank is always reachable: heard from now, never stale.
        now = self.cluster.now
        if self._latest is not None and self._latest[0] == now:
            return dict.fromkeys(self._latest[1], now)  # the tick's snapshot, not rebuilt
        return dict.fromkeys(self.cluster.latest_fpm(self.role), now)

    def busy_seconds(self) -> dict[EngineKey, float]:
        return {(e.worker_id, e.dp_rank): e.busy_time_s for e in self.cluster.engines(self.role)}

    @property
    def dropped(self) -> dict[str, int]:
        return {}

    def start(self) -> None:
        return None

    def stop(self, timeout_s: float = 5.0) -> None:
        return None
