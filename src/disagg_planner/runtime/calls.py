"""A deployment loop's calls to its connector and its traffic observer: each failure becomes
a :class:`Problem` of the tick (or of the start) instead of an exception, so that the loop
holds and says why."""

from __future__ import annotations

import logging

from disagg_planner.connectors.base import Connector, Hold, advisory_holds
from disagg_planner.core.planner import Effects
from disagg_planner.core.schedule import TrafficWindow
from disagg_planner.core.types import DeploymentStatus, MissingObservation, TrafficObservation
from disagg_planner.errors import ConnectorError, DeploymentError
from disagg_planner.observe import TrafficObserver
from disagg_planner.runtime.clock import Offload
from disagg_planner.runtime.outcome import Problem, ProblemKind

log = logging.getLogger(__name__)


async def validate(connector: Connector, label: str) -> Problem | None:
    """Why the deployment cannot be driven now, None when it can."""
    try:
        await connector.validate()
    except DeploymentError as exc:
        return Problem(ProblemKind.DEPLOYMENT_INVALID, "deployment_error", str(exc), "validate")
    except ConnectorError as exc:
        return Problem(ProblemKind.CONNECTOR_ERROR, "connector_error", str(exc), "validate")
    except Exception as exc:
        log.exception("%s: validating the deployment raised", label)
        return Problem(ProblemKind.TICK_FAILED, type(exc).__name__, str(exc), "validate")
    return None


async def read_status(
    connector: Connector, problems: list[Problem]
) -> DeploymentStatus | MissingObservation:
    try:
        return await connector.status()
    except DeploymentError as exc:
        problems.append(
            Problem(ProblemKind.DEPLOYMENT_INVALID, "deployment_error", str(exc), "status")
        )
        return MissingObservation("deployment_error", str(exc))
    except ConnectorError as exc:
        problems.append(Problem(ProblemKind.CONNECTOR_ERROR, "connector_error", str(exc), "status"))
        return MissingObservation("connector_error", str(exc))


async def observe_traffic(
    traffic: TrafficObserver,
    window: TrafficWindow,
    problems: list[Problem],
    *,
    offload: Offload,
    label: str,
) -> TrafficObservation | MissingObservation:
    try:
        # The observer is blocking HTTP; the window is the one the schedule named.
        observed = await offload(traffic.observe, end_s=window.end_s, duration_s=window.duration_s)
    except Exception as exc:  # an observer bug must not look like traffic, nor kill the loop
        log.exception("%s: the traffic observer raised", label)
        observed = MissingObservation("observer_failed", f"{type(exc).__name__}: {exc}")
    if isinstance(observed, MissingObservation):
        problems.append(
            Problem(ProblemKind.TRAFFIC_MISSING, str(observed.reason), observed.detail, "traffic")
        )
    elif observed.missing_series:
        detail = (
            f"requests were counted but {', '.join(observed.missing_series)} (_sum/_count) "
            "have no series in the window; the decisions that need them hold"
        )
        problems.append(
            Problem(ProblemKind.INPUT_INCOMPLETE, "histograms_missing", detail, "traffic")
        )
    return observed


async def apply_scale(
    connector: Connector,
    effects: Effects,
    status: DeploymentStatus | MissingObservation,
    problems: list[Problem],
    *,
    advisory: bool,
) -> tuple[dict[str, int], dict[str, Hold]]:
    """Apply ``scale_to`` through the connector; (applied, holds by role)."""
    target = effects.scale_to
    if not target or not isinstance(status, DeploymentStatus):
        return {}, {}
    changed = {r: n for r, n in target.items() if status.desired(r) != n}
    if advisory:
        return {}, advisory_holds(changed)
    holds = connector.holds()
    if changed and all(role in holds for role in changed):
        return {}, {r: holds[r] for r in changed}
    try:
        result = await connector.set_replicas(target, blocking=False)
    except (ConnectorError, DeploymentError) as exc:
        kind = (
            ProblemKind.CONNECTOR_ERROR
            if isinstance(exc, ConnectorError)
            else ProblemKind.DEPLOYMENT_INVALID
        )
        reason = "connector_error" if isinstance(exc, ConnectorError) else "deployment_error"
        problems.append(Problem(kind, reason, str(exc), "scale"))
        return {}, {}
    return dict(result.applied), dict(result.held)
