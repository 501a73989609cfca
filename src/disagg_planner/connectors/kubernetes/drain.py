"""Graceful scale-down: which pods leave, how they are marked, and the wait for them to
finish what they serve (see "Graceful scale-down" in the package docstring).

The choice and the marks are pure; :func:`wait_drained` is the one wait.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from disagg_planner.connectors.kubernetes.api import SERVICE_POD_LABEL

log = logging.getLogger(__name__)

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


async def wait_drained(
    ref: str,
    pods: list[str],
    *,
    timeout_s: float,
    loads: Callable[[], Mapping[str, int]],
    clock: Callable[[], float],
    sleep: Callable[[float], Awaitable[None]],
) -> None:
    """Return once every pod in ``pods`` reports no request in flight, or when ``timeout_s``
    passed (0: no wait)."""
    if not pods or timeout_s <= 0:
        return
    start = clock()
    while True:
        current = loads()
        busy = {pod: current.get(pod) for pod in pods if current.get(pod) != 0}
        waited = clock() - start
        if not busy:
            log.info(
                "DGD %s: %s drained (no request in flight) after %.1f s",
                ref,
                ", ".join(pods),
                waited,
            )
            return
        if waited >= timeout_s:
            log.warning(
                "DGD %s: drain timeout (%g s): %s; lowering the replicas anyway (Dynamo "
                "serves them for its grace period after SIGTERM)",
                ref,
                timeout_s,
                ", ".join(
                    f"{pod} {'load unknown' if n is None else f'{n} in flight'}"
                    for pod, n in busy.items()
                ),
            )
            return
        await sleep(min(DRAIN_POLL_S, timeout_s - waited))
