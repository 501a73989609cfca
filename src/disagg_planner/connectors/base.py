"""The connector protocol: how the planner reads and changes the replicas of a deployment.

A connector speaks for one deployment (one DynamoGraphDeployment, or one graph driven
through the virtual decision-id protocol). Every method is a coroutine: the planner's run
loop and the operator's per-object daemons are asyncio tasks, and a connector must never
block them. Failures are typed: :class:`disagg_planner.errors.DeploymentError` when the deployment
is missing or has the wrong shape, :class:`disagg_planner.errors.ConnectorError` when the backend
(Kubernetes API, etcd) refused or failed after its retries. The loop catches both and holds;
nothing else escapes a connector on a backend failure.

Roles are the planner's names (``prefill``, ``decode``, ``agg``); a connector maps them to
its own (a DGD service, an etcd key). Replica counts are whole replicas (engines), not GPUs.

A connector is given its own frozen settings (:class:`ConnectorSettings` and the connector's
subclass), built by the application from its config: connectors never see the config itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from disagg_planner.core.types import DeploymentStatus, ThroughputReason

if TYPE_CHECKING:
    # Type-only: the elastic_ep package's __init__ imports the Kubernetes connector, which
    # imports this module (progress.py itself imports nothing of the connectors).
    from disagg_planner.connectors.elastic_ep.progress import ElasticFollowers


class HoldReason(StrEnum):
    """Why a connector will not change a role right now (values double as log/label text)."""

    # Someone else changed the replicas and the policy is to respect it for one interval.
    MANUAL_OVERRIDE = "manual_override"
    # The virtual protocol's previous decision is not acknowledged yet.
    AWAITING_ACKNOWLEDGEMENT = "awaiting_acknowledgement"
    # config.advisory: the connector reads but never writes.
    ADVISORY = "advisory"
    # A change made before this process started (read back from the deployment) has not
    # converged yet: a restarted or failed-over planner keeps waiting for it.
    AWAITING_CONVERGENCE = "awaiting_convergence"
    # A scale-down waits for the workers chosen to leave to finish what they serve; the
    # connector lowers the replicas itself when the drain ends (the tick does not wait).
    DRAINING = "draining"

    @property
    def throughput_reason(self) -> ThroughputReason | None:
        """The throughput reason of a tick whose change this hold kept from the deployment:
        the hold decided what happened, so it names the tick's reason. None for a drain: the
        change does happen, written by the connector once the leaving workers are done."""
        return _THROUGHPUT_REASON_OF_HOLD.get(self)


_THROUGHPUT_REASON_OF_HOLD = {
    HoldReason.MANUAL_OVERRIDE: ThroughputReason.MANUAL_OVERRIDE_HOLD,
    HoldReason.ADVISORY: ThroughputReason.ADVISORY,
    HoldReason.AWAITING_ACKNOWLEDGEMENT: ThroughputReason.SCALING_IN_PROGRESS,
    # a change made before a restart, read back on adoption, still converging
    HoldReason.AWAITING_CONVERGENCE: ThroughputReason.SCALING_IN_PROGRESS,
}


@dataclass(frozen=True, kw_only=True)
class ConnectorSettings:
    """What every replica connector reads; each connector's settings add their own fields."""

    roles: tuple[str, ...]  # the roles this planner scales
    model_name: str | None  # None: read from the deployment where it can be
    # GPUs per replica by role as configured; a role not here is read from the deployment.
    gpus_per_replica: Mapping[str, int]
    advisory: bool  # read, never write
    scaling_max_wait_s: float  # how long a blocking scale waits (the virtual protocol: an ack)
    scaling_check_interval_s: float  # polling period of that wait


WorkerLoads = Callable[[], Mapping[str, int]]
"""Pod name -> requests in flight on its engines (scheduled and queued), as their latest
ForwardPassMetrics report them; a pod not in the mapping has no known load. The runtime hands
one to a connector that chooses which workers leave on a scale-down."""


@dataclass(frozen=True)
class Hold:
    """A role the connector will not change until ``until_s`` (its own monotonic clock, s).

    ``until_s`` is None when the hold ends on an external event (an acknowledgement) rather
    than at a time.
    """

    role: str
    reason: HoldReason
    detail: str
    until_s: float | None = None


@dataclass(frozen=True)
class ManualOverride:
    """A change of a role's desired replicas that this planner did not make.

    ``expected`` is what the planner last set (or first observed), ``observed`` what the
    deployment asks for now; ``action`` is what the connector did about it.
    """

    role: str
    target: str
    expected: int
    observed: int
    action: str  # "respected" or "reverted"


@dataclass(frozen=True)
class ScaleOutcome:
    """What one :meth:`Connector.set_replicas` call did.

    ``applied`` holds the roles whose replicas were written (new value); roles already at
    their target are in ``unchanged``; ``held`` holds the roles left alone and why. ``ready``
    is None for a non-blocking call, else whether the deployment became ready in time.
    """

    requested: Mapping[str, int]
    applied: Mapping[str, int] = field(default_factory=dict)
    unchanged: tuple[str, ...] = ()
    held: Mapping[str, Hold] = field(default_factory=dict)
    ready: bool | None = None


@dataclass(frozen=True)
class PodDiscovery:
    """Where a deployment's engines run as Kubernetes pods: what FPM discovery reads (the
    same cluster as the same identity, ``api_client`` a ``kubernetes`` ApiClient)."""

    api_client: Any
    namespace: str
    dgd_name: str
    service_roles: Mapping[str, str]  # DGD service -> the role it carries


@runtime_checkable
class Connector(Protocol):
    """One deployment whose replicas the planner reads and sets."""

    @property
    def model_name(self) -> str | None:
        """Served model name (lower case) known after :meth:`validate`, or None."""
        ...

    async def validate(self) -> None:
        """Check that the deployment exists and has the roles the config asks for.

        Raises :class:`DeploymentError` naming what is missing or inconsistent.
        """
        ...

    async def status(self) -> DeploymentStatus:
        """Desired and ready replicas and GPUs per replica of every role this planner scales."""
        ...

    async def set_replicas(
        self, replicas: Mapping[str, int], *, blocking: bool = False
    ) -> ScaleOutcome:
        """Set the replicas of one or more roles in one call.

        Roles already at their target are not written; held roles (see :meth:`holds`) are
        skipped. With ``blocking`` the call then waits until the deployment is ready or the
        configured maximum wait passed (``ScaleOutcome.ready``).
        """
        ...

    def holds(self) -> Mapping[str, Hold]:
        """Roles the connector will not change now, by role (the loop reports them)."""
        ...

    async def close(self) -> None:
        """Release connections; the connector is unusable afterwards."""
        ...

    def pod_discovery(self) -> PodDiscovery | None:
        """Where the engines run as pods (known once :meth:`validate` ran), for the runtime
        to discover their publishers; None where the engines are not pods it can discover."""
        ...

    def elastic_followers(self) -> ElasticFollowers | None:
        """The follower pods of the elastic-EP engine, which this connector raises before a
        grow and retires after a shrink; None where the engine's GPUs are someone else's to
        provide (the engine then starts at ``elastic_ep_min_dp``)."""
        ...

    def use_worker_loads(self, loads: WorkerLoads) -> None:
        """Where a scale-down reads the load of each pod, so that the least-loaded workers
        leave; a connector that does not choose which workers leave ignores it."""
        ...

    async def releasing_replicas(self) -> Mapping[str, int]:
        """Replicas of each role scaled away but still holding their GPUs (terminating pods),
        by role; empty from a connector whose deployment releases at once or that sees no
        pods. A GPU pool counts them, so that one member's released GPUs are not granted to
        another before they are free."""
        ...

    def on_deployment_change(self, callback: Callable[[], None]) -> Callable[[], None] | None:
        """Call ``callback`` (from any thread) when the deployment appears or changes, so that
        a loop backing off after failures retries at once; returns the unsubscribe, or None
        from a connector that hears of no change."""
        ...


class ConnectorDefaults:
    """The answers of a connector whose engines are no pods the runtime discovers and that
    hears of no change to its deployment (the virtual and the simulated connector)."""

    def pod_discovery(self) -> PodDiscovery | None:
        return None

    def elastic_followers(self) -> ElasticFollowers | None:
        return None

    def use_worker_loads(self, loads: WorkerLoads) -> None:
        return None  # the deployment's own controller chooses which workers leave

    async def releasing_replicas(self) -> Mapping[str, int]:
        return {}  # no pods: a replica scaled away releases its GPUs at once

    def on_deployment_change(self, callback: Callable[[], None]) -> Callable[[], None] | None:
        return None


def advisory_holds(roles: Mapping[str, int]) -> dict[str, Hold]:
    """Holds for every role of a request in advisory mode."""
    detail = "advisory mode: recommendations are logged, replicas are never changed"
    return {role: Hold(role, HoldReason.ADVISORY, detail) for role in roles}


def check_replicas(replicas: Mapping[str, int], roles: tuple[str, ...]) -> dict[str, int]:
    """Validate a replica request against the roles this planner scales.

    Raises ValueError (a caller bug, not a deployment problem) naming the role or value.
    """
    if not replicas:
        raise ValueError("set_replicas needs at least one role")
    checked: dict[str, int] = {}
    for role, count in replicas.items():
        if role not in roles:
            raise ValueError(f"role {role!r} is not scaled by this planner (roles: {roles})")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"replicas of {role!r} must be an integer >= 0, got {count!r}")
        checked[role] = count
    return checked
