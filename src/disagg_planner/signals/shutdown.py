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
``stage_seconds`` series is read as "not shutting down", whatever the other gauges say; a
page with none of the ``dynamo_component_shutdown_*`` gauges is a worker without the staged
shutdown (an older release). The stages report in this order (each ``started``, then
``completed``, ``timed_out``, ``failed``, ``unsupported`` or ``skipped``): ``unregister``,
``router_grace``, ``stop_admission``, ``inflight``, ``kv_transfer``, then the teardown
(``withdraw``, ``cleanup``, ``runtime``, ``deferred_signals``): a worker whose page reports a
teardown stage, or the end of ``kv_transfer``, serves nothing any more.

The total budget is read from the worker's container env as Dynamo does (the canonical name,
else its legacy alias; a value that is not a positive whole number of seconds is the default):
Dynamo's operator validates a literal total in the pod template, so a worker that declares
one is one whose budget the planner can know.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

STAGE_SECONDS = "dynamo_component_shutdown_stage_seconds"
REMAINING_SECONDS = "dynamo_component_shutdown_remaining_seconds"
INFLIGHT_REQUESTS = "dynamo_component_shutdown_inflight_requests"
KV_QUIESCENT = "dynamo_component_shutdown_kv_quiescent"

# Where the worker serves its /metrics page (the pod's container env).
SYSTEM_PORT_ENV = "DYN_SYSTEM_PORT"
TOTAL_BUDGET_ENV = "DYN_WORKER_SHUTDOWN_TOTAL_TIMEOUT_SECS"
TOTAL_BUDGET_LEGACY_ENV = "DYN_WORKER_GRACEFUL_SHUTDOWN_TIMEOUT"
DEFAULT_TOTAL_BUDGET_S = 30.0
_MAX_TOTAL_BUDGET_S = 315_360_000.0  # Dynamo's upper bound on the total
SHUTDOWN_PREFIX = "dynamo_component_shutdown_"
# Why a page holds no reading before the worker's shutdown starts (the usual case).
NOT_SHUTTING_DOWN = "no shutdown stage reported (not shutting down)"
# Why a page holds no reading: the worker has no staged shutdown (no such gauge at all).
NO_SHUTDOWN_METRICS = f"no {SHUTDOWN_PREFIX}* gauge (a worker without the staged shutdown)"
# The stages in Dynamo's order; the first four serve requests, the teardown ones do not.
STAGES = (
    "unregister",
    "router_grace",
    "stop_admission",
    "inflight",
    "kv_transfer",
    "withdraw",
    "cleanup",
    "runtime",
    "deferred_signals",
)
_TEARDOWN = frozenset(STAGES[STAGES.index("withdraw") :])


def total_budget_s(env: Mapping[str, str]) -> float | None:
    """The worker's total shutdown budget declared in ``env`` (its container's literal env):
    the canonical name, else the legacy alias; None when neither is set (Dynamo's default,
    :data:`DEFAULT_TOTAL_BUDGET_S`, applies); a value that is not a positive whole number of
    seconds up to Dynamo's bound is the default, as the worker itself reads it."""
    raw = (env.get(TOTAL_BUDGET_ENV) or "").strip() or (env.get(TOTAL_BUDGET_LEGACY_ENV) or "")
    raw = raw.strip()
    if not raw:
        return None
    if not raw.isdigit() or not 0 < int(raw) <= _MAX_TOTAL_BUDGET_S:
        return DEFAULT_TOTAL_BUDGET_S
    return float(int(raw))


@dataclass(frozen=True)
class ShutdownReading:
    """One worker's staged shutdown as its page reads now."""

    inflight: int  # admitted requests unfinished (summed over the worker's series)
    kv_quiescent: bool | None  # None: the worker cannot tell (-1)
    remaining_s: float  # what is left of its total budget (the least over its series)
    # the furthest stage reported (of :data:`STAGES`) and its latest outcome
    stage: str | None = None
    outcome: str | None = None

    @property
    def drained(self) -> bool:
        """Nothing left to finish: no request in flight and KV transfers confirmed idle."""
        return self.inflight == 0 and self.kv_quiescent is True

    @property
    def serving_over(self) -> bool:
        """The worker is past its serving stages: a teardown stage reported, or the end of
        ``kv_transfer`` (whatever its outcome: after it the worker cancels what is left)."""
        return self.stage in _TEARDOWN or (
            self.stage == "kv_transfer" and self.outcome not in (None, "started")
        )

    @property
    def stage_text(self) -> str:
        return f"{self.stage} {self.outcome}" if self.stage else "no stage"


def _furthest_stage(labels: list[dict[str, str]]) -> tuple[str | None, str | None]:
    """The furthest known stage among the ``stage_seconds`` series and its outcome (an
    ended outcome over ``started`` when both are there)."""
    known = [lab for lab in labels if lab.get("stage") in STAGES]
    if not known:
        return None, None
    stage = max((lab["stage"] for lab in known), key=STAGES.index)
    outcomes = {lab.get("reason") for lab in known if lab["stage"] == stage}
    ended = sorted(o for o in outcomes if o and o != "started")
    return stage, ended[0] if ended else "started"


def read_shutdown(text: str) -> ShutdownReading | str:
    """The shutdown reading of a worker's ``/metrics`` page, or why there is none (a line
    for the log): the page is not exposition text, no shutdown has started, a gauge is
    missing, or a value is not a finite number of the expected range."""
    try:
        samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    except (ValueError, TypeError, IndexError) as exc:
        return f"the metrics page is not Prometheus text ({exc})"
    values: dict[str, list[float]] = {}
    stages: list[dict[str, str]] = []
    for sample in samples:
        values.setdefault(sample.name, []).append(float(sample.value))
        if sample.name == STAGE_SECONDS:
            stages.append(dict(sample.labels))
    if not any(name.startswith(SHUTDOWN_PREFIX) for name in values):
        return NO_SHUTDOWN_METRICS
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
    stage, outcome = _furthest_stage(stages)
    return ShutdownReading(
        inflight=int(sum(inflight)),
        kv_quiescent=quiescent,
        remaining_s=max(0.0, min(values[REMAINING_SECONDS])),
        stage=stage,
        outcome=outcome,
    )
