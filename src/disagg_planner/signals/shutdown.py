"""Dynamo's staged worker shutdown, as a worker's own ``/metrics`` page reports it.

Facts (Dynamo's graceful-shutdown guide and its runtime's shutdown module, in our words): on
SIGTERM a worker spends ONE total budget, measured from the signal, on four stages in order:

1. router grace: it leaves discovery at once, then still serves requests already routed to
   it for a short while (``DYN_WORKER_SHUTDOWN_ROUTER_GRACE_SECS``, 5 s; legacy name
   ``DYN_GRACEFUL_SHUTDOWN_GRACE_PERIOD_SECS``);
2. in flight: it waits for the requests it admitted (``DYN_WORKER_SHUTDOWN_INFLIGHT_TIMEOUT_SECS``,
   uncapped by default: bounded by what is left of the total);
3. KV-transfer quiescence: a prefill worker waits until no decode peer still reads its KV
   (``DYN_WORKER_SHUTDOWN_KV_TRANSFER_TIMEOUT_SECS``, 30 s; legacy
   ``DYN_PREFILL_DRAIN_TIMEOUT_S``);
4. cleanup: engine and runtime teardown, from a reserve kept inside the total
   (``DYN_WORKER_SHUTDOWN_CLEANUP_TIMEOUT_SECS``, 5 s).

The total is ``DYN_WORKER_SHUTDOWN_TOTAL_TIMEOUT_SECS`` (30 s by default, a positive integer;
legacy ``DYN_WORKER_GRACEFUL_SHUTDOWN_TIMEOUT``); a stage before cleanup gets at most its cap
or what is left of the total minus the cleanup reserve. The worker's metrics during shutdown:

====================================================  ==========  ==========================
metric                                                labels      meaning
====================================================  ==========  ==========================
``dynamo_component_shutdown_stage_seconds``           stage,      time a stage took; its
                                                      reason      outcome in ``reason``
``dynamo_component_shutdown_remaining_seconds``                   what is left of the total
``dynamo_component_shutdown_inflight_requests``                   admitted requests unfinished
``dynamo_component_shutdown_kv_quiescent``                        1 idle, 0 busy, -1 unknown
                                                                  or unsupported
====================================================  ==========  ==========================

(plus Dynamo's usual ``dynamo_namespace``/``dynamo_component``/``dynamo_endpoint`` labels).
The remaining time and the in-flight count are snapshots taken at stage transitions, not
live gauges; -1 for KV quiescence is a declared fallback, never proof that transfers ended;
the page is served on the worker's system port (``DYN_SYSTEM_PORT``) and disappears with the
process. Before a shutdown starts no stage has reported, so a page without any
``stage_seconds`` series is read as "not shutting down", whatever the other gauges say.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

STAGE_SECONDS = "dynamo_component_shutdown_stage_seconds"
REMAINING_SECONDS = "dynamo_component_shutdown_remaining_seconds"
INFLIGHT_REQUESTS = "dynamo_component_shutdown_inflight_requests"
KV_QUIESCENT = "dynamo_component_shutdown_kv_quiescent"

# Where the worker serves its /metrics page (the pod's container env).
SYSTEM_PORT_ENV = "DYN_SYSTEM_PORT"
TOTAL_BUDGET_ENV = "DYN_WORKER_SHUTDOWN_TOTAL_TIMEOUT_SECS"
# Why a page holds no reading before the worker's shutdown starts (the usual case).
NOT_SHUTTING_DOWN = "no shutdown stage reported (not shutting down)"


@dataclass(frozen=True)
class ShutdownReading:
    """One worker's staged shutdown as its page reads now."""

    inflight: int  # admitted requests unfinished (summed over the worker's series)
    kv_quiescent: bool | None  # None: the worker cannot tell (-1)
    remaining_s: float  # what is left of its total budget (the least over its series)

    @property
    def drained(self) -> bool:
        """Nothing left to finish: no request in flight and KV transfers confirmed idle."""
        return self.inflight == 0 and self.kv_quiescent is True


def read_shutdown(text: str) -> ShutdownReading | str:
    """The shutdown reading of a worker's ``/metrics`` page, or why there is none (a line
    for the log): the page is not exposition text, no shutdown has started, a gauge is
    missing, or a value is not a finite number of the expected range."""
    try:
        samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    except (ValueError, TypeError, IndexError) as exc:
        return f"the metrics page is not Prometheus text ({exc})"
    values: dict[str, list[float]] = {}
    for sample in samples:
        values.setdefault(sample.name, []).append(float(sample.value))
    if STAGE_SECONDS not in values:
        return NOT_SHUTTING_DOWN
    for name in (INFLIGHT_REQUESTS, KV_QUIESCENT, REMAINING_SECONDS):
        if name not in values:
            return f"{name} is missing"
        bad = [v for v in values[name] if not math.isfinite(v)]
        if bad:
            return f"{name} is {bad[0]} (not a finite number)"
    inflight = values[INFLIGHT_REQUESTS]
    if any(v < 0 or v != int(v) for v in inflight):
        return f"{INFLIGHT_REQUESTS} is {inflight} (expected whole numbers >= 0)"
    kv = values[KV_QUIESCENT]
    if any(v not in (-1.0, 0.0, 1.0) for v in kv):
        return f"{KV_QUIESCENT} is {kv} (expected 1, 0 or -1)"
    quiescent: bool | None
    if any(v == 0.0 for v in kv):
        quiescent = False
    elif all(v == 1.0 for v in kv):
        quiescent = True
    else:
        quiescent = None
    return ShutdownReading(
        inflight=int(sum(inflight)),
        kv_quiescent=quiescent,
        remaining_s=max(0.0, min(values[REMAINING_SECONDS])),
    )
