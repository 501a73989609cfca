"""Graceful scale-down: which pods leave, how they are marked, and the wait for them to
finish what they serve (see "Graceful scale-down" in the package docstring).

All pure: the choice, the marks, and :func:`drain_end`, the rule that ends a drain (the
connector follows a drain in the background: the tick that asked for it does not wait).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Any

from disagg_planner.connectors.kubernetes.api import SERVICE_POD_LABEL

# Kubernetes' ReplicaSet deletes the pods of lowest cost first (an int32; unset is 0).
POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
LEAVING_COST = str(-(2**31))
DRAINING_ANNOTATION = "planner.autoscaling.dev/draining-since"
# How often a drain reads the leaving workers' load (their FPM arrive every iteration).
DRAIN_POLL_S = 0.5


def pod_ready(pod: Any) -> bool:
    conditions = (pod.status.conditions if pod.status is not None else None) or ()
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def leave_rank(pod: Any, loads: Mapping[str, int]) -> tuple[bool, bool, int, str]:
    """Sort key of the pods that leave first: not ready, then the least requests in flight,
    then unknown load; the name keeps the order stable."""
    load = loads.get(pod.metadata.name)
    return (pod_ready(pod), load is None, load or 0, pod.metadata.name)


def load_text(pod: Any, loads: Mapping[str, int]) -> str:
    if not pod_ready(pod):
        return "not ready"
    load = loads.get(pod.metadata.name)
    return "load unknown" if load is None else f"{load} in flight"


def live_pods_of(pods: Iterable[Any], service: str) -> list[Any]:
    """The pods of ``service`` neither terminating nor exited."""
    return [
        p
        for p in pods
        if (p.metadata.labels or {}).get(SERVICE_POD_LABEL) == service
        and p.metadata.deletion_timestamp is None
        and not (p.status is not None and p.status.phase in ("Succeeded", "Failed"))
    ]


def choose_leaving(
    pods: Iterable[Any], service: str, target: int, loads: Mapping[str, int]
) -> list[Any]:
    """The pods of ``service`` that leave when it goes down to ``target`` replicas."""
    live = live_pods_of(pods, service)
    ranked = sorted(live, key=lambda p: leave_rank(p, loads))
    return ranked[: max(0, len(live) - target)]


def pod_marks(
    pods: Iterable[Any], leaving: Iterable[str], since: str
) -> list[tuple[str, dict[str, str | None]]]:
    """The annotation patches to make: each leaving pod not yet marked gets the lowest
    deletion cost and when it started draining; a pod marked by an earlier scale-down that
    did not take it (and is not terminating) has both removed."""
    leaving = set(leaving)
    marks: list[tuple[str, dict[str, str | None]]] = []
    for pod in pods:
        name = pod.metadata.name
        annotations = pod.metadata.annotations or {}
        if name in leaving:
            if annotations.get(POD_DELETION_COST) != LEAVING_COST:
                marks.append((name, {POD_DELETION_COST: LEAVING_COST, DRAINING_ANNOTATION: since}))
        elif DRAINING_ANNOTATION in annotations and pod.metadata.deletion_timestamp is None:
            marks.append((name, {POD_DELETION_COST: None, DRAINING_ANNOTATION: None}))
    return marks


class DrainEnd(StrEnum):
    """Which signal ended a drain (values are log text)."""

    # Every leaving pod's engines report no request in flight (their latest FPM).
    IDLE = "fpm_idle"
    # No per-worker load at all (no FPM): nothing to wait for. Dynamo's worker leaves
    # discovery on SIGTERM, so no new request reaches it, and serves what it holds within
    # its own shutdown budget (DYN_WORKER_SHUTDOWN_TOTAL_TIMEOUT_SECS) before it exits.
    NO_LOAD_SIGNAL = "no_load_signal"
    # No ready pod leaves (the ones leaving serve nothing).
    NOTHING_SERVING = "nothing_serving"
    # The drain budget (drain_timeout_s, one total) ran out.
    TIMEOUT = "timeout"


def drain_end(
    pods: Sequence[str], loads: Mapping[str, int], *, waited_s: float, timeout_s: float
) -> DrainEnd | None:
    """Whether the drain of the ready pods ``pods`` is over, and by which signal; None: wait
    on. ``loads`` is every pod's requests in flight as known now (empty: no signal)."""
    if not pods:
        return DrainEnd.NOTHING_SERVING
    if not loads:
        return DrainEnd.NO_LOAD_SIGNAL
    if all(loads.get(pod) == 0 for pod in pods):
        return DrainEnd.IDLE
    if waited_s >= timeout_s:
        return DrainEnd.TIMEOUT
    return None


def busy_text(pods: Sequence[str], loads: Mapping[str, int]) -> str:
    """The leaving pods still serving, as a log line reads them."""
    return ", ".join(
        f"{pod} {'load unknown' if loads.get(pod) is None else f'{loads[pod]} in flight'}"
        for pod in pods
        if loads.get(pod) != 0
    )
