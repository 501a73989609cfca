"""The DGD connector's writes: the budget-safe order (decreases, then increases once the
engines let go), and the graceful scale-down followed in the background."""

from __future__ import annotations

import asyncio
import datetime
import http.client
import logging
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from disagg_planner.connectors.base import (
    Hold,
    HoldReason,
)
from disagg_planner.connectors.dgd_shape import (
    replicas_patch,
    running_count,
    service_path,
)
from disagg_planner.connectors.kubernetes.api import (
    DGD_PLURAL,
    DGDSA_PLURAL,
)
from disagg_planner.connectors.kubernetes.drain import (
    DRAIN_POLL_S,
    SHUTDOWN_SCRAPE_TIMEOUT_S,
    DrainEnd,
    busy_text,
    choose_leaving,
    drain_end,
    load_text,
    metrics_url,
    pod_marks,
    pod_ready,
)
from disagg_planner.connectors.kubernetes.parts import (
    ConnectorParts,
    _Observation,
    _shows_replicas,
    _shows_state,
)
from disagg_planner.connectors.kubernetes.state import (
    STATE_ANNOTATION,
)
from disagg_planner.errors import ConnectorError, DeploymentError
from disagg_planner.signals.shutdown import (
    NOT_SHUTTING_DOWN,
    TOTAL_BUDGET_ENV,
    ShutdownReading,
    read_shutdown,
)

log = logging.getLogger(__name__)


@dataclass
class _PendingDrain:
    """A scale-down waiting for its leaving workers (followed by ``task``)."""

    targets: dict[str, int]
    pods: tuple[str, ...]
    budget_s: float
    task: asyncio.Task[DrainEnd]

    def holds(self) -> dict[str, Hold]:
        detail = (
            f"waiting up to {self.budget_s:g} s for {', '.join(self.pods)} to finish their "
            f"requests; {self.targets} is written when the drain ends"
        )
        return {role: Hold(role, HoldReason.DRAINING, detail) for role in self.targets}


def _fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=SHUTDOWN_SCRAPE_TIMEOUT_S) as answer:
        return str(answer.read().decode("utf-8", errors="replace"))


async def _read_page(url: str) -> ShutdownReading | str:
    """The shutdown reading of the page at ``url``, or why there is none."""
    try:
        return read_shutdown(await asyncio.to_thread(_fetch, url))
    # URLError, refused connections and timeouts are OSErrors; a cut answer an HTTPException.
    except (OSError, ValueError, http.client.HTTPException) as exc:
        return f"{url} unreachable ({exc})"


@dataclass
class _DrainWatch:
    """What one drain follows: the ready leaving pods, where each serves its metrics page,
    when each pod seen shutting down runs out of its own budget, and the fallbacks already
    logged (once per pod and reason, not every poll)."""

    urls: dict[str, str | None]
    budget_ends_s: dict[str, float] = field(default_factory=dict)
    logged: set[tuple[str, str]] = field(default_factory=set)
    shutdown: dict[str, ShutdownReading] = field(default_factory=dict)

    @property
    def pods(self) -> tuple[str, ...]:
        return tuple(self.urls)


class Writes(ConnectorParts):
    """Writing the replicas (a part of :class:`KubernetesConnector`)."""

    _pending_drain: _PendingDrain | None

    # --- writing ----------------------------------------------------------------------------

    async def _write_or_drain(
        self, obs: _Observation, writes: Mapping[str, int]
    ) -> dict[str, Hold]:
        """Write ``writes`` now, or, when a decrease must first let busy workers finish,
        start following that drain in the background and hold every role of the request
        (returned) until it ends; then the connector writes them itself."""
        pending = self._pending_drain
        if pending is not None and not pending.task.done():
            if dict(writes) == pending.targets:
                return pending.holds()
            pending.task.cancel()  # the plan changed: this request replaces the drain's
            log.info(
                "DGD %s: the drain for %s is abandoned: %s asked",
                self._ref,
                pending.targets,
                dict(writes),
            )
        self._pending_drain = None
        lower = {role: n for role, n in writes.items() if n < obs.desired[role]}
        if not lower:
            await self._write(obs, writes)
            return {}
        watch = _DrainWatch(await self._mark_leaving(obs, lower))
        end = await self._drain_end(watch, 0.0)
        if end is not None:
            self._log_drain_end(watch, end, 0.0)
            await self._write(obs, writes, marked=True)
            return {}
        drain = _PendingDrain(
            targets=dict(writes),
            pods=watch.pods,
            budget_s=self._drain_budget_s(),
            task=asyncio.create_task(self._follow_drain(dict(writes), watch)),
        )
        self._pending_drain = drain
        return drain.holds()

    def _drain_budget_s(self) -> float:
        return max(0.0, self._settings.drain_timeout_s)

    async def _drain_end(self, watch: _DrainWatch, waited_s: float) -> DrainEnd | None:
        """Read the leaving pods (FPM, and the staged-shutdown metrics of those shutting
        down) and apply :func:`drain_end`."""
        watch.shutdown = await self._shutdown_readings(watch, waited_s)
        return drain_end(
            watch.pods,
            self._loads(),
            waited_s=waited_s,
            timeout_s=self._drain_budget_s(),
            shutdown=watch.shutdown,
            budget_ends_s=watch.budget_ends_s,
        )

    async def _shutdown_readings(
        self, watch: _DrainWatch, waited_s: float
    ) -> dict[str, ShutdownReading]:
        """The staged-shutdown readings of the leaving pods that report one now; a pod
        without one (no page, not shutting down, a missing or bad value, KV quiescence
        unknown) is judged by its FPM, with the reason logged once."""
        known = {pod: url for pod, url in watch.urls.items() if url is not None}
        for pod in sorted(watch.urls.keys() - known.keys()):
            self._note_fallback(
                watch, pod, "no metrics page known (pod IP or a literal DYN_SYSTEM_PORT)"
            )
        # Read at once, so that an unreachable page costs one timeout per poll, not one per pod.
        answers = await asyncio.gather(*(_read_page(url) for url in known.values()))
        readings: dict[str, ShutdownReading] = {}
        for pod, answer in zip(known, answers, strict=True):
            if isinstance(answer, str):
                self._note_fallback(watch, pod, answer)
                continue
            readings[pod] = answer
            # The remaining time is a snapshot at a stage transition, at or before this read.
            watch.budget_ends_s.setdefault(pod, waited_s + answer.remaining_s)
            if answer.kv_quiescent is None:
                self._note_fallback(watch, pod, "KV quiescence unknown (-1)")
        return readings

    def _note_fallback(self, watch: _DrainWatch, pod: str, reason: str) -> None:
        if (pod, reason) in watch.logged:
            return
        watch.logged.add((pod, reason))
        # A worker not yet told to stop (SIGTERM follows the drain) is the usual case.
        log.log(
            logging.DEBUG if reason == NOT_SHUTTING_DOWN else logging.INFO,
            "DGD %s: drain of %s: its staged-shutdown metrics are not used (%s); its "
            "ForwardPassMetrics decide",
            self._ref,
            pod,
            reason,
        )

    def _log_drain_end(self, watch: _DrainWatch, end: DrainEnd, waited_s: float) -> None:
        pods = watch.pods
        level = logging.WARNING if end is DrainEnd.TIMEOUT else logging.INFO
        busy = busy_text(pods, self._loads(), watch.shutdown)
        detail = {
            DrainEnd.IDLE: "no request in flight",
            DrainEnd.SHUTDOWN_IDLE: "no request in flight and KV transfers quiescent "
            "(staged-shutdown metrics where the worker reports them, else FPM)",
            DrainEnd.NO_LOAD_SIGNAL: "no per-worker load known (no FPM); Dynamo's workers leave "
            "routing on SIGTERM and serve what they hold within their shutdown budget",
            DrainEnd.NOTHING_SERVING: "no ready worker leaves",
            DrainEnd.WORKER_BUDGET: f"every worker still busy has spent its own shutdown "
            f"budget ({TOTAL_BUDGET_ENV}) ({busy}); they cancel the rest and exit",
            DrainEnd.TIMEOUT: f"drain timeout ({self._drain_budget_s():g} s): "
            f"{busy}; lowering the replicas anyway (Dynamo serves "
            "them for its grace period after SIGTERM)",
        }[end]
        log.log(
            level,
            "DGD %s: drain of %s ended by %s after %.1f s: %s",
            self._ref,
            ", ".join(pods) or "no pod",
            end.value,
            waited_s,
            detail,
        )

    async def _follow_drain(self, writes: dict[str, int], watch: _DrainWatch) -> DrainEnd:
        """Wait (in the background) for the pods of ``watch`` to drain, then write ``writes``
        if they are still what the deployment needs; a failure is logged (the next tick
        plans again)."""
        start, budget = self._clock(), self._drain_budget_s()
        while True:
            waited = self._clock() - start
            end = await self._drain_end(watch, waited)
            if end is not None:
                break
            await self._sleep(min(DRAIN_POLL_S, budget - waited))
        self._log_drain_end(watch, end, waited)
        try:
            async with self._lock:
                obs = await self._observe()
                holds = self._active_holds()
                still = {
                    role: n
                    for role, n in writes.items()
                    if role not in holds and obs.desired[role] != n
                }
                if still and not self._settings.advisory:
                    await self._write(obs, still, marked=True)
        except (ConnectorError, DeploymentError) as exc:
            log.warning("DGD %s: writing %s after the drain failed: %s", self._ref, writes, exc)
        return end

    async def _write(
        self, obs: _Observation, writes: Mapping[str, int], *, marked: bool = False
    ) -> None:
        """Write ``writes`` (role -> replicas): the decreases, then the increases once every
        role's engines fit what it is asked for (module doc: budget-safe order). The pods
        that leave are marked first unless ``marked``."""
        lower = {role: n for role, n in writes.items() if n < obs.desired[role]}
        higher = {role: n for role, n in writes.items() if role not in lower}
        self._last_action = (self._wall(), dict(writes))
        if lower:
            if not marked:
                await self._mark_leaving(obs, lower)
            await self._write_roles(obs, lower)
        if higher:
            await self._wait_released(obs, {**obs.desired, **lower}, fresh=bool(lower))
            await self._write_roles(obs, higher)

    # --- graceful scale-down ------------------------------------------------------------------

    def _loads(self) -> Mapping[str, int]:
        if self._worker_loads is None:
            return {}
        try:
            return dict(self._worker_loads())
        except Exception as exc:  # a reading that fails is an unknown load, never a crash
            log.warning("DGD %s: the workers' load could not be read: %s", self._ref, exc)
            return {}

    async def _mark_leaving(
        self, obs: _Observation, lower: Mapping[str, int]
    ) -> dict[str, str | None]:
        """Choose and mark the pods that leave (module doc: graceful scale-down); returns
        the ready ones (those with requests to finish), each with where its worker serves
        its metrics page (:func:`metrics_url`)."""
        pods = await self._api.dgd_pods()
        loads = self._loads()
        leaving: dict[str, bool] = {}  # pod name -> ready
        urls: dict[str, str | None] = {}
        for role, target in lower.items():
            chosen = choose_leaving(pods, obs.services[role].service, target, loads)
            for pod in chosen:
                leaving[pod.metadata.name] = pod_ready(pod)
                urls[pod.metadata.name] = metrics_url(pod)
            if chosen:
                log.info(
                    "DGD %s: %s %d -> %d: %s leave%s",
                    self._ref,
                    role,
                    obs.desired[role],
                    target,
                    ", ".join(f"{p.metadata.name} ({load_text(p, loads)})" for p in chosen),
                    "s" if len(chosen) == 1 else "",
                )
        since = datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat()
        for name, marks in pod_marks(pods, leaving, since):
            await self._api.annotate_pod(name, marks)
        return {name: urls[name] for name, ready in leaving.items() if ready}

    async def _wait_released(
        self, obs: _Observation, desired: Mapping[str, int], *, fresh: bool
    ) -> None:
        """Return once no role runs more engines (terminating pods included) than
        ``desired``; raise ConnectorError after one adjustment interval."""
        # Longer would stall the loop past its next tick, which plans again anyway.
        timeout = min(self._settings.scaling_max_wait_s, self._hold_s)
        deadline = self._clock() + timeout
        dgd = obs.dgd
        while True:
            if fresh:  # what was read before a decrease no longer tells
                dgd = await self._api.get_dgd()
            fresh = True
            excess = self._excess(obs, dgd, await self._api.terminating_pods(), desired)
            if not excess:
                return
            remaining = deadline - self._clock()
            if remaining <= 0:
                raise ConnectorError(
                    f"DynamoGraphDeployment {self._ref}: {'; '.join(excess)} after "
                    f"{timeout:g} s; the increases were not written, so as not to exceed the "
                    "GPU budget"
                )
            await self._sleep(min(self._settings.scaling_check_interval_s, remaining))

    def _excess(
        self,
        obs: _Observation,
        dgd: Mapping[str, Any],
        terminating: Mapping[str, int],
        desired: Mapping[str, int],
    ) -> list[str]:
        """The roles running more engines than ``desired``, described."""
        excess = []
        for role in self._roles:
            service = obs.services[role].service
            running, leaving = running_count(dgd, service), terminating.get(service, 0)
            if running + leaving > desired[role]:
                excess.append(
                    f"role {role} (service {service}) still runs {running} engine(s) and "
                    f"{leaving} terminating, more than its {desired[role]}"
                )
        return excess

    async def _write_roles(self, obs: _Observation, writes: Mapping[str, int]) -> None:
        """Write ``writes``: /scale per adapter, one patch of the DGD for the rest (a merge
        patch of v1alpha1's services map, a JSON patch of v1beta1's components list:
        :func:`replicas_patch`). The state annotation travels in that patch; with adapters it
        is written first (a write recorded as pending and never made is not mistaken for a
        manual edit)."""
        patch_services: dict[str, int] = {}
        for role, count in writes.items():
            self._pending[role] = count
        if any(obs.adapters[role] is not None for role in writes):
            await self._record_state()
        for role, count in writes.items():
            adapter = obs.adapters[role]
            if adapter is None:
                patch_services[obs.services[role].service] = count
                continue
            answer = await self._api.patch_adapter_scale(adapter, count)
            self._note_write(
                DGDSA_PLURAL,
                adapter,
                answer,
                _shows_replicas(count),
            )
            self._settle(role, count, f"adapter {adapter}")
        if patch_services:
            state = self._state_json()
            content_type, body = replicas_patch(
                obs.dgd, patch_services, {STATE_ANNOTATION: state}, self._ref
            )
            answer = await self._api.patch_dgd(body, content_type=content_type)
            self._note_write(DGD_PLURAL, self.dgd_name, answer, _shows_state(state))
            for role, count in writes.items():
                if obs.adapters[role] is None:
                    self._settle(role, count, service_path(obs.dgd, obs.services[role].service))

    def _settle(self, role: str, count: int, target: str) -> None:
        self._pending.pop(role, None)
        self._expected[role] = count
        log.info("DGD %s: %s -> %d replicas (%s)", self._ref, role, count, target)
