"""A policy's ``status``: what its loop last saw and decided, and three conditions.

Conditions (``type``: meaning when True; the ``reason`` is CamelCase, the ``message`` says
the details):

- ``Ready``: the planner is planning this DGD: the deployment was validated and the last
  tick read it. False reasons: ``Starting``, ``DeploymentInvalid``, ``ConnectorError``,
  ``InvalidSpec``, ``DuplicateTarget``, ``TickFailed``.
- ``Scaling``: a change is in progress: replicas were written this tick (``ScaleUp``,
  ``ScaleDown``, ``Rebalance``) or the DGD has not converged (``Converging``). False
  reasons: ``Stable``, or why a recommended change was not made (``ManualOverrideHold``,
  ``Advisory``, ``AwaitingAcknowledgement``), or ``NotPlanning``.
- ``Degraded``: the last tick lacked something (``TrafficMissing``, ``ConnectorError``,
  ``DeploymentInvalid``, ``TickFailed``, ``InvalidSpec``, ``DuplicateTarget``); the planner
  then holds rather than guesses. False reason: ``AsExpected``.

From adoption until the first tick: ``Ready`` False ``Starting``, ``Scaling`` False
``NotPlanning``, ``Degraded`` Unknown ``Starting`` (nothing observed yet). A tick that could
not read the deployment (deleted, unreachable) leaves ``Scaling`` False ``NotPlanning``:
nothing is known to match anything.

``lastDegraded`` keeps the latest episode of ``Degraded`` True: its ``reason`` and first
``message``, ``since`` when, and ``until`` once it cleared. The writer keeps it even when the
status could not be written (the API server unreachable), so that the first status written
afterwards says what happened meanwhile.

``lastTransitionTime`` changes only when a condition's status does. The writer sends a JSON
merge patch of what changed since its last write (keys that disappeared are nulled), skips
unchanged statuses, and, while only the measurements move, writes at most every
``min_interval_s`` seconds.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import urllib3
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from disagg_planner.operator.crd import GROUP, PLURAL, VERSION
from disagg_planner.runtime.loop import DeploymentRef
from disagg_planner.runtime.outcome import Problem, ProblemKind, TickOutcome

log = logging.getLogger(__name__)

CONDITION_TYPES = ("Ready", "Scaling", "Degraded")
MESSAGE_LIMIT = 1024
# Status keys that change with every measurement; on their own they do not force a write.
_VOLATILE = frozenset({"lastTickTime", "observed", "predicted", "gpuHours", "message"})

_HOLD_REASONS = {
    "manual_override": "ManualOverrideHold",
    "advisory": "Advisory",
    "awaiting_acknowledgement": "AwaitingAcknowledgement",
}

Condition = tuple[str, str, str]  # status, reason, message


def camel(text: str) -> str:
    """``deployment_invalid`` -> ``DeploymentInvalid`` (Kubernetes reason style)."""
    return "".join(part.capitalize() for part in text.split("_"))


def _clip(text: str) -> str:
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 3] + "..."


def rfc3339(seconds: float) -> str:
    return (
        datetime.datetime.fromtimestamp(seconds, datetime.UTC)
        .replace(microsecond=0)
        .isoformat()
        .replace("+00:00", "Z")
    )


def problem_conditions(problem: Problem) -> dict[str, Condition]:
    """Conditions while the loop cannot plan at all (start-up failed, bad spec)."""
    reason = camel(problem.reason) if problem.reason == "duplicate_target" else camel(problem.kind)
    text = _clip(problem.render())
    return {
        "Ready": ("False", reason, text),
        "Scaling": ("False", "NotPlanning", "the planner is not planning this deployment"),
        "Degraded": ("True", reason, text),
    }


def starting_conditions(target: DeploymentRef) -> dict[str, Condition]:
    """Conditions from adoption until the first tick."""
    return {
        "Ready": ("False", "Starting", f"adopted {target}; validating it before the first tick"),
        "Scaling": ("False", "NotPlanning", "the first tick has not run yet"),
        "Degraded": ("Unknown", "Starting", "nothing observed yet"),
    }


def tick_conditions(outcome: TickOutcome) -> dict[str, Condition]:
    """Conditions after one tick (or one failed start-up attempt)."""
    if outcome.status is None and outcome.effects is None and outcome.problems:
        return problem_conditions(outcome.problems[0])
    problem = outcome.problem()
    status = outcome.status
    if status is not None:
        ready: Condition = ("True", "Planning", "the last tick read the deployment")
    else:
        failed = outcome.problem() or Problem(ProblemKind.TICK_FAILED, "unknown")
        ready = ("False", camel(failed.kind), _clip(failed.render()))

    scaling: Condition
    if status is None:
        scaling = ("False", "NotPlanning", "the deployment could not be read; nothing is scaled")
    elif outcome.applied:
        ups = [r for r, n in outcome.applied.items() if n > status.desired(r)]
        downs = [r for r, n in outcome.applied.items() if n < status.desired(r)]
        reason = "Rebalance" if ups and downs else "ScaleUp" if ups else "ScaleDown"
        changes = ", ".join(
            f"{r} {status.desired(r)} -> {n}" for r, n in sorted(outcome.applied.items())
        )
        scaling = ("True", reason, changes)
    elif not status.converged:
        pending = ", ".join(
            f"{r} {s.ready}/{s.desired} ready"
            for r, s in sorted(status.roles.items())
            if s.ready != s.desired
        )
        scaling = ("True", "Converging", pending)
    elif outcome.held:
        first = next(iter(outcome.held.values()))
        held = ", ".join(f"{r} ({why})" for r, why in sorted(outcome.held.items()))
        scaling = ("False", _HOLD_REASONS.get(first, camel(first)), f"not changed: {held}")
    else:
        scaling = ("False", "Stable", "replicas match the recommendation")

    degraded: Condition = (
        ("True", camel(problem.kind), _clip(problem.render()))
        if problem is not None
        else ("False", "AsExpected", "every input of the last tick was available")
    )
    return {"Ready": ready, "Scaling": scaling, "Degraded": degraded}


def _merge_conditions(
    new: Mapping[str, Condition], previous: Any, now_s: float
) -> list[dict[str, str]]:
    before = {}
    if isinstance(previous, list):
        before = {c.get("type"): c for c in previous if isinstance(c, Mapping)}
    out = []
    for kind in CONDITION_TYPES:
        status, reason, message = new[kind]
        old = before.get(kind) or {}
        changed = old.get("status") != status or not old.get("lastTransitionTime")
        out.append(
            {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": rfc3339(now_s)
                if changed
                else str(old.get("lastTransitionTime")),
            }
        )
    return out


def _summary_reason(outcome: TickOutcome) -> str:
    if outcome.held:
        return next(iter(outcome.held.values()))
    if outcome.ran_load and outcome.load_reason:
        return outcome.load_reason
    return outcome.throughput_reason or outcome.load_reason or "none"


def policy_status(
    outcome: TickOutcome,
    *,
    target: DeploymentRef,
    previous: Mapping[str, Any] | None,
    wall_now_s: float,
) -> dict[str, Any]:
    """The full ``status`` object after ``outcome`` (pure; times in Unix seconds)."""
    previous = previous or {}
    conditions = _merge_conditions(tick_conditions(outcome), previous.get("conditions"), wall_now_s)
    body: dict[str, Any] = {
        "target": str(target),
        "lastTickTime": rfc3339(wall_now_s),
        "conditions": conditions,
    }
    if outcome.problems:
        body["message"] = _clip("; ".join(p.render() for p in outcome.problems))
    elif outcome.message:
        body["message"] = _clip(outcome.message)
    status = outcome.status
    if status is not None:
        body["replicas"] = {
            role: {"desired": s.desired, "ready": s.ready, "gpusPerReplica": s.gpus_per_replica}
            for role, s in status.roles.items()
        }
        body["replicasSummary"] = ", ".join(
            f"{role} {s.ready}/{s.desired}" for role, s in status.roles.items()
        )
        body["gpusInUse"] = status.gpus_in_use
    if outcome.effects is not None:
        decision: dict[str, Any] = {
            "time": rfc3339(wall_now_s),
            "reason": _summary_reason(outcome),
            "advisory": outcome.advisory,
        }
        if outcome.scale_to:
            decision["scaleTo"] = dict(outcome.scale_to)
        if outcome.applied:
            decision["applied"] = dict(outcome.applied)
        if outcome.held:
            decision["held"] = dict(outcome.held)
        before = previous.get("lastDecision")
        unchanged = isinstance(before, Mapping) and {
            k: v for k, v in before.items() if k != "time"
        } == {k: v for k, v in decision.items() if k != "time"}
        if isinstance(before, Mapping) and (unchanged or not outcome.scale_to):
            # The same decision again keeps its time; a tick that recommended nothing keeps
            # the last real decision visible.
            body["lastDecision"] = dict(before)
        else:
            body["lastDecision"] = decision
        body["reasons"] = {"throughput": outcome.throughput_reason, "load": outcome.load_reason}
    snap = outcome.snapshot
    if snap is not None:
        body["gpuHours"] = round(snap.gpu_hours, 6)
        observed = {
            "requestsPerSecond": snap.observed_rps,
            "ttftMs": snap.observed_ttft_ms,
            "itlMs": snap.observed_itl_ms,
            "inputSequenceTokens": snap.observed_isl,
            "outputSequenceTokens": snap.observed_osl,
        }
        predicted = {
            "requestsPerSecond": snap.predicted_rps,
            "inputSequenceTokens": snap.predicted_isl,
            "outputSequenceTokens": snap.predicted_osl,
            "estimatedTtftMs": snap.estimated_ttft_ms,
            "estimatedItlMs": snap.estimated_itl_ms,
        }
        # A value this tick did not produce keeps the previous one (as the gauges do).
        for key, values in (("observed", observed), ("predicted", predicted)):
            kept = dict(previous.get(key) or {})
            kept.update({k: _round(v) for k, v in values.items() if v is not None})
            if kept:
                body[key] = kept
    return body


def _round(value: float) -> float:
    return round(float(value), 4)


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The RFC 7386 merge patch turning ``old`` into ``new`` (keys gone become null; lists
    and scalars are replaced whole)."""
    patch: dict[str, Any] = {}
    for key in old:
        if key not in new:
            patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            inner = merge_patch(before, value)
            if inner:
                patch[key] = inner
        elif before != value or key not in old:
            patch[key] = value
    return patch


class StatusWriter:
    """Writes a policy's status through the ``/status`` subresource (merge patch)."""

    def __init__(
        self,
        api_client: k8s_client.ApiClient,
        *,
        namespace: str,
        name: str,
        previous: Mapping[str, Any] | None = None,
        min_interval_s: float = 30.0,
        wall_clock: Callable[[], float] = time.time,
        request_timeout_s: float = 10.0,
    ) -> None:
        self._api = k8s_client.CustomObjectsApi(api_client)
        self.namespace = namespace
        self.name = name
        self._written: dict[str, Any] = dict(previous or {})
        self._written_at = float("-inf")
        self._min_interval_s = min_interval_s
        self._wall = wall_clock
        self._timeout = request_timeout_s
        self.writes = 0
        self.target: DeploymentRef | None = None
        last = self._written.get("lastDegraded")
        self._degraded: dict[str, str] | None = dict(last) if isinstance(last, Mapping) else None

    @property
    def written(self) -> Mapping[str, Any]:
        return self._written

    async def write_outcome(self, outcome: TickOutcome) -> None:
        """The status after a tick (the loop's ``on_outcome`` hook)."""
        assert self.target is not None, "set StatusWriter.target before the loop starts"
        now = self._wall()
        body = policy_status(outcome, target=self.target, previous=self._written, wall_now_s=now)
        await self._write(body, now)

    async def write_problem(self, problem: Problem, *, target: DeploymentRef | None) -> None:
        """The status while the policy cannot be planned (invalid spec, duplicate target)."""
        await self._write_conditions(
            problem_conditions(problem), target=target, message=problem.render()
        )

    async def write_starting(self, target: DeploymentRef) -> None:
        """The status from adoption until the first tick."""
        await self._write_conditions(
            starting_conditions(target), target=target, message=f"planning {target} shortly"
        )

    async def _write_conditions(
        self, conditions: Mapping[str, Condition], *, target: DeploymentRef | None, message: str
    ) -> None:
        now = self._wall()
        body: dict[str, Any] = {
            "lastTickTime": rfc3339(now),
            "message": _clip(message),
            "conditions": _merge_conditions(conditions, self._written.get("conditions"), now),
        }
        if target is not None:
            body["target"] = str(target)
        await self._write(body, now, force=True)

    def _follow_degraded(self, body: dict[str, Any], now: float) -> None:
        """Update the Degraded episode from ``body``'s condition and add it to ``body``."""
        conditions = body.get("conditions") or ()
        degraded = next((c for c in conditions if c.get("type") == "Degraded"), None)
        if degraded is not None and degraded.get("status") == "True":
            last = self._degraded
            if last is None or "until" in last or last.get("reason") != degraded.get("reason"):
                self._degraded = {
                    "reason": str(degraded.get("reason", "")),
                    "message": str(degraded.get("message", "")),
                    "since": rfc3339(now),
                }
        elif degraded is not None and self._degraded is not None and "until" not in self._degraded:
            self._degraded["until"] = rfc3339(now)
        if self._degraded is not None:
            body["lastDegraded"] = dict(self._degraded)

    async def _write(self, body: dict[str, Any], now: float, *, force: bool = False) -> None:
        self._follow_degraded(body, now)
        patch = merge_patch(self._written, body)
        if not patch:
            return
        significant = any(key not in _VOLATILE for key in patch)
        if not (force or significant) and now - self._written_at < self._min_interval_s:
            return
        try:
            await asyncio.to_thread(
                self._api.patch_namespaced_custom_object_status,
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                self.name,
                {"status": patch},
                _content_type="application/merge-patch+json",
                _request_timeout=self._timeout,
            )
        except ApiException as exc:
            # 404: the policy is being deleted; anything else: the next tick writes again.
            level = logging.DEBUG if exc.status == 404 else logging.WARNING
            log.log(level, "status of %s/%s not written: %s", self.namespace, self.name, exc.reason)
            return
        except (OSError, urllib3.exceptions.HTTPError) as exc:
            log.warning("status of %s/%s not written: %s", self.namespace, self.name, exc)
            return
        self._written = body
        self._written_at = now
        self.writes += 1
