"""Graceful scale-down: which pods leave, how they are marked, and the wait for them to
finish what they serve (see "Graceful scale-down" in the package docstring).

All pure: the choice, the marks, and :func:`drain_end`, the rule that ends a drain (the
connector follows a drain in the background: the tick that asked for it does not wait).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Any

from disagg_planner.connectors.kubernetes.api import SERVICE_POD_LABEL
from disagg_planner.signals.shutdown import (
    NOT_SHUTTING_DOWN,
    SYSTEM_PORT_ENV,
    TOTAL_BUDGET_ENV,
    ShutdownReading,
)

# Kubernetes' ReplicaSet deletes the pods of lowest cost first (an int32; unset is 0).
POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
LEAVING_COST = str(-(2**31))
DRAINING_ANNOTATION = "planner.autoscaling.dev/draining-since"
# How often a drain reads the leaving workers' load (their FPM arrive every iteration).
DRAIN_POLL_S = 0.5
# How long one read of a leaving worker's metrics page may take (a drain polls every
# DRAIN_POLL_S; a page that does not answer soon is no reading, and FPM decides).
SHUTDOWN_SCRAPE_TIMEOUT_S = 1.0


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
    """Which signal ended a drain (values are log text and the hold's words)."""

    # Before the count is lowered (a worker without Dynamo's staged shutdown):
    # every leaving pod's engines report no request in flight (their latest FPM).
    IDLE = "fpm_idle"
    # No per-worker load at all (no FPM, no shutdown metrics): nothing to wait for. Dynamo's
    # worker leaves discovery on SIGTERM, so no new request reaches it, and serves what it
    # holds within its own shutdown budget (DYN_WORKER_SHUTDOWN_TOTAL_TIMEOUT_SECS).
    NO_LOAD_SIGNAL = "no_load_signal"
    # No ready pod leaves (the ones leaving serve nothing).
    NOTHING_SERVING = "nothing_serving"
    # Following a worker's staged shutdown (count lowered first), by its own metrics page:
    # no request in flight and KV transfers confirmed quiescent (kv_quiescent 1).
    KV_QUIESCENT = "kv_quiescent"
    # it reported a stage past serving (the end of kv_transfer, or a teardown stage).
    SHUTDOWN_STAGE = "shutdown_stage"
    # its in-flight gauge says 0 and it cannot tell KV quiescence (-1).
    INFLIGHT_ZERO = "shutdown_inflight_zero"
    # the pod is gone (its worker exited).
    POD_GONE = "pod_gone"
    # Every pod still busy is shutting down and its own total budget is spent: it has
    # cancelled what was left and exits, so waiting on serves nothing.
    WORKER_BUDGET = "worker_budget"
    # The drain budget (drain_timeout_s, one total) ran out.
    TIMEOUT = "timeout"


# From the weakest evidence that a pod finished to the strongest: a drain of several pods
# ends with the weakest of theirs.
_EVIDENCE = (
    DrainEnd.TIMEOUT,
    DrainEnd.WORKER_BUDGET,
    DrainEnd.NO_LOAD_SIGNAL,
    DrainEnd.IDLE,
    DrainEnd.INFLIGHT_ZERO,
    DrainEnd.SHUTDOWN_STAGE,
    DrainEnd.KV_QUIESCENT,
    DrainEnd.POD_GONE,
    DrainEnd.NOTHING_SERVING,
)


def pod_end(
    pod: str,
    loads: Mapping[str, int],
    shutdown: Mapping[str, ShutdownReading],
    gone: Collection[str] = (),
) -> DrainEnd | None:
    """Whether ``pod`` has finished serving, and by which signal (None: not yet): gone; its
    shutdown page (KV quiescent with no request in flight, a stage past serving, or no
    request in flight with KV quiescence unknown); else its latest FPM (none in flight). A
    page that says KV transfers busy, or a request in flight with KV quiescence known, holds
    it whatever its FPM say (FPM see requests, not a decode peer reading its KV)."""
    if pod in gone:
        return DrainEnd.POD_GONE
    reading = shutdown.get(pod)
    if reading is not None:
        if reading.drained:
            return DrainEnd.KV_QUIESCENT
        if reading.serving_over:
            return DrainEnd.SHUTDOWN_STAGE
        if reading.kv_quiescent is not None:
            return None
        if reading.inflight == 0:
            return DrainEnd.INFLIGHT_ZERO
    return DrainEnd.IDLE if loads.get(pod) == 0 else None


def drain_end(
    pods: Sequence[str],
    loads: Mapping[str, int],
    *,
    waited_s: float,
    timeout_s: float,
    shutdown: Mapping[str, ShutdownReading] | None = None,
    budget_ends_s: Mapping[str, float] | None = None,
    gone: Collection[str] = (),
    lowered: bool = False,
) -> DrainEnd | None:
    """Whether the drain of the ready pods ``pods`` is over, and by which signal; None: wait
    on. ``loads`` is every pod's requests in flight as known now (empty: no signal);
    ``shutdown`` the readings of the pods shutting down (:func:`read_shutdown`);
    ``budget_ends_s`` when (in ``waited_s`` time) each pod's own total budget ends; ``gone``
    the pods no longer there. ``lowered``: the count was lowered first (the pods are
    terminating), so a missing signal is waited for (up to the budgets), not taken as
    nothing to wait for."""
    shutdown = shutdown or {}
    if not pods:
        return DrainEnd.NOTHING_SERVING
    if not lowered and not loads and not shutdown:
        return DrainEnd.NO_LOAD_SIGNAL
    ends = {pod: pod_end(pod, loads, shutdown, gone) for pod in pods}
    busy = [pod for pod, end in ends.items() if end is None]
    if not busy:
        return min((end for end in ends.values() if end is not None), key=_EVIDENCE.index)
    if waited_s >= timeout_s:
        return DrainEnd.TIMEOUT
    budgets = budget_ends_s or {}
    if all(pod in budgets for pod in busy) and waited_s >= max(budgets[pod] for pod in busy):
        return DrainEnd.WORKER_BUDGET
    return None


def busy_text(
    pods: Sequence[str],
    loads: Mapping[str, int],
    shutdown: Mapping[str, ShutdownReading] | None = None,
    gone: Collection[str] = (),
) -> str:
    """The leaving pods still serving, as a log line reads them."""
    shutdown = shutdown or {}
    parts = []
    for pod in pods:
        if pod_end(pod, loads, shutdown, gone) is not None:
            continue
        reading = shutdown.get(pod)
        if reading is not None and reading.kv_quiescent is not None:
            kv = "KV transfers busy" if reading.kv_quiescent is False else "KV quiescent"
            parts.append(
                f"{pod} {reading.inflight} in flight, {kv} (shutdown metrics, {reading.stage_text})"
            )
        else:
            load = loads.get(pod)
            parts.append(f"{pod} {'load unknown' if load is None else f'{load} in flight'}")
    return ", ".join(parts)


def literal_env(pod: Any) -> dict[str, str]:
    """The env the containers of ``pod`` set literally (``value``, not ``valueFrom``)."""
    env: dict[str, str] = {}
    containers = (pod.spec.containers if pod.spec is not None else None) or ()
    for container in containers:
        for var in container.env or ():
            if var.value is not None:
                env.setdefault(var.name, var.value)
    return env


def lowers_first(pod: Any, answer: ShutdownReading | str | None) -> bool:
    """Whether the worker of ``pod`` has Dynamo's staged shutdown, so that its count is
    lowered first and its own shutdown followed: its metrics page carries the
    ``dynamo_component_shutdown_*`` gauges (``answer``: its page read before SIGTERM), or its
    container declares the total budget by its current name (the staged shutdown's)."""
    if isinstance(answer, ShutdownReading) or answer == NOT_SHUTTING_DOWN:
        return True
    return TOTAL_BUDGET_ENV in literal_env(pod)


def metrics_url(pod: Any) -> str | None:
    """Where the worker of ``pod`` serves its ``/metrics`` page: the pod's IP and the system
    port its container sets literally (``DYN_SYSTEM_PORT``); None when either is unknown."""
    ip = pod.status.pod_ip if pod.status is not None else None
    port = literal_env(pod).get(SYSTEM_PORT_ENV, "")
    return f"http://{ip}:{int(port)}/metrics" if ip and port.isdigit() else None
