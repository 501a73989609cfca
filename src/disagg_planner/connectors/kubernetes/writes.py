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
    SERVICE_POD_LABEL,
)
from disagg_planner.connectors.kubernetes.drain import (
    DRAIN_POLL_S,
    POD_DELETION_COST,
    SHUTDOWN_SCRAPE_TIMEOUT_S,
    DrainEnd,
    busy_text,
    choose_leaving,
    drain_end,
    literal_env,
    load_text,
    lowers_first,
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
    DEFAULT_TOTAL_BUDGET_S,
    NOT_SHUTTING_DOWN,
    SHUTDOWN_PREFIX,
    TOTAL_BUDGET_ENV,
    ShutdownReading,
    read_shutdown,
    total_budget_s,
)

log = logging.getLogger(__name__)


@dataclass
class _PendingDrain:
    """A scale-down waiting for its leaving workers (followed by ``task``): before its
    count is lowered (``lowered`` False: the roles of ``targets`` are held until it ends),
    or after (the count already written: the worker's own staged shutdown followed)."""

    targets: dict[str, int]
    pods: tuple[str, ...]
    budget_s: float
    task: asyncio.Task[DrainEnd]
    lowered: frozenset[str] = frozenset()  # the roles already written (lowered first)

    @property
    def waiting(self) -> dict[str, int]:
        """The targets not written yet."""
        return {role: n for role, n in self.targets.items() if role not in self.lowered}

    def holds(self) -> dict[str, Hold]:
        if self.lowered:  # the increases wait for the GPUs the shutting-down workers hold
            detail = (
                f"raised once {', '.join(self.pods)} (lowered first, in Dynamo's staged "
                f"shutdown) end their shutdown and release their GPUs"
            )
            return {
                role: Hold(role, HoldReason.DRAINING, detail)
                for role in self.targets
                if role not in self.lowered
            }
        detail = (
            f"waiting up to {self.budget_s:g} s for {', '.join(self.pods)} to finish their "
            f"requests before the count is lowered (no staged-shutdown metrics, "
            f"{SHUTDOWN_PREFIX}*); {self.targets} is written when the drain ends"
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
    when each pod runs out of its own shutdown budget, and the fallbacks already logged
    (once per pod and reason, not every poll). After a lowering (``lowered_at``, the clock
    then), also the services lowered, the pods already terminating before it, and the pods
    gone."""

    urls: dict[str, str | None]
    budget_ends_s: dict[str, float] = field(default_factory=dict)
    logged: set[tuple[str, str]] = field(default_factory=set)
    shutdown: dict[str, ShutdownReading] = field(default_factory=dict)
    lowered_at: float | None = None
    services: frozenset[str] = frozenset()
    terminating_before: frozenset[str] = frozenset()
    gone: set[str] = field(default_factory=set)

    @property
    def pods(self) -> tuple[str, ...]:
        return tuple(self.urls)

    def follow(self, pod: Any) -> None:
        """Follow ``pod``'s own shutdown: its page and its total budget (declared in its
        env, else Dynamo's default), counted from the lowering."""
        name = pod.metadata.name
        self.urls[name] = metrics_url(pod)
        declared = total_budget_s(literal_env(pod))
        self.budget_ends_s[name] = DEFAULT_TOTAL_BUDGET_S if declared is None else declared


class Writes(ConnectorParts):
    """Writing the replicas (a part of :class:`KubernetesConnector`)."""

    _pending_drain: _PendingDrain | None
    _last_drain_end: DrainEnd | None

    # --- writing ----------------------------------------------------------------------------

    async def _write_or_drain(
        self, obs: _Observation, writes: Mapping[str, int]
    ) -> dict[str, Hold]:
        """Write ``writes`` now, or, when a decrease must first let busy workers finish,
        start following that drain in the background and hold every role of the request
        (returned) until it ends; then the connector writes them itself. Workers with
        Dynamo's staged shutdown are lowered at once instead, and their shutdown followed."""
        pending = self._pending_drain
        if pending is not None and not pending.task.done():
            # the same plan (its lowered roles, already written, read as unchanged)
            if dict(writes) in (pending.targets, pending.waiting):
                return pending.holds()
            pending.task.cancel()  # the plan changed: this request replaces the drain's
            log.info(
                "DGD %s: the drain for %s is %s: %s asked",
                self._ref,
                pending.targets,
                "no longer followed" if pending.lowered else "abandoned",
                dict(writes),
            )
        self._pending_drain = None
        lower = {role: n for role, n in writes.items() if n < obs.desired[role]}
        if not lower:
            await self._write(obs, writes)
            return {}
        pods, leaving = await self._mark_leaving(obs, lower)
        watch = _DrainWatch({pod.metadata.name: metrics_url(pod) for pod in leaving})
        answers = await self._read_pages(watch)
        if leaving and all(lowers_first(pod, answers.get(pod.metadata.name)) for pod in leaving):
            await self._write(obs, lower, marked=True)
            watch.lowered_at = self._clock()
            watch.services = frozenset(obs.services[role].service for role in lower)
            watch.terminating_before = frozenset(
                p.metadata.name for p in pods if p.metadata.deletion_timestamp is not None
            )
            for pod in leaving:
                watch.follow(pod)
            log.info(
                "DGD %s: %s lowered first: %s shut down by Dynamo's staged shutdown (their "
                "own budget, %s), followed until their KV transfers are quiescent",
                self._ref,
                lower,
                ", ".join(watch.pods),
                ", ".join(f"{pod} {s:g} s" for pod, s in watch.budget_ends_s.items()),
            )
        lowered = watch.lowered_at is not None
        end = await self._drain_end(watch, 0.0, None if lowered else answers)
        if end is not None:
            self._log_drain_end(watch, end, 0.0)
            self._last_drain_end = end
            if not lowered or len(lower) < len(writes):
                await self._write(obs, writes, marked=True)
            return {}
        drain = _PendingDrain(
            targets=dict(writes),
            pods=watch.pods,
            budget_s=self._drain_budget_s(),
            task=asyncio.create_task(self._follow_drain(dict(writes), watch)),
            lowered=frozenset(lower) if lowered else frozenset(),
        )
        self._pending_drain = drain
        return drain.holds()

    def _drain_budget_s(self) -> float:
        return max(0.0, self._settings.drain_timeout_s)

    async def _drain_end(
        self,
        watch: _DrainWatch,
        waited_s: float,
        answers: dict[str, ShutdownReading | str] | None = None,
    ) -> DrainEnd | None:
        """Read the leaving pods (FPM, and the staged-shutdown metrics of those shutting
        down; ``answers``: their pages as just read) and apply :func:`drain_end`."""
        if watch.lowered_at is not None:
            await self._track_victims(watch)
        watch.shutdown = await self._shutdown_readings(watch, waited_s, answers)
        return drain_end(
            watch.pods,
            self._loads(),
            waited_s=waited_s,
            timeout_s=self._drain_budget_s(),
            shutdown=watch.shutdown,
            budget_ends_s=watch.budget_ends_s,
            gone=watch.gone,
            lowered=watch.lowered_at is not None,
        )

    async def _track_victims(self, watch: _DrainWatch) -> None:
        """After a lowering: the pods followed are those the operator made terminating (a
        PodClique of Grove ignores the deletion cost, so the marked pod may stay), and
        those no longer listed are gone."""
        pods = await self._api.dgd_pods()
        listed = {p.metadata.name for p in pods}
        watch.gone |= {name for name in watch.urls if name not in listed}
        removed = [
            p
            for p in pods
            if (p.metadata.labels or {}).get(SERVICE_POD_LABEL) in watch.services
            and p.metadata.deletion_timestamp is not None
            and p.metadata.name not in watch.terminating_before
        ]
        if not removed:
            return  # the operator has not acted yet: the marked pods are expected
        names = {p.metadata.name for p in removed}
        kept = [name for name in watch.urls if name in listed and name not in names]
        for name in kept:
            log.info(
                "DGD %s: %s was marked to leave but the operator removed %s (its pods' "
                "controller ignores %s): following those",
                self._ref,
                name,
                ", ".join(sorted(names)),
                POD_DELETION_COST,
            )
            del watch.urls[name]
            watch.budget_ends_s.pop(name, None)
        for pod in removed:
            if pod.metadata.name not in watch.urls:
                watch.follow(pod)

    async def _read_pages(self, watch: _DrainWatch) -> dict[str, ShutdownReading | str]:
        """Each leaving pod's page as read now (a reading, or why there is none), the pods
        without a known page left out."""
        known = {pod: url for pod, url in watch.urls.items() if url is not None}
        # Read at once, so that an unreachable page costs one timeout per poll, not one per pod.
        answers = await asyncio.gather(*(_read_page(url) for url in known.values()))
        return dict(zip(known, answers, strict=True))

    async def _shutdown_readings(
        self,
        watch: _DrainWatch,
        waited_s: float,
        answers: dict[str, ShutdownReading | str] | None = None,
    ) -> dict[str, ShutdownReading]:
        """The staged-shutdown readings of the leaving pods that report one now; a pod
        without one (no page, not shutting down, a missing or bad value) is judged by its
        FPM, with the reason logged once."""
        live = [pod for pod in watch.urls if pod not in watch.gone]
        for pod in sorted(p for p in live if watch.urls[p] is None):
            self._note_fallback(
                watch, pod, "no metrics page known (pod IP or a literal DYN_SYSTEM_PORT)"
            )
        if answers is None:
            answers = await self._read_pages(_DrainWatch({pod: watch.urls[pod] for pod in live}))
        readings: dict[str, ShutdownReading] = {}
        for pod, answer in answers.items():
            if isinstance(answer, str):
                self._note_fallback(watch, pod, answer)
                continue
            readings[pod] = answer
            # The remaining time is a snapshot at a stage transition, at or before this read.
            end = waited_s + answer.remaining_s
            watch.budget_ends_s[pod] = min(watch.budget_ends_s.get(pod, end), end)
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
        busy = busy_text(pods, self._loads(), watch.shutdown, watch.gone)
        after = "its count was lowered first" if watch.lowered_at is not None else ""
        detail = {
            DrainEnd.IDLE: "no request in flight (ForwardPassMetrics)",
            DrainEnd.KV_QUIESCENT: "no request in flight and KV transfers quiescent "
            "(staged-shutdown metrics)",
            DrainEnd.SHUTDOWN_STAGE: "past its serving stages (staged-shutdown metrics: "
            + ", ".join(f"{p} {r.stage_text}" for p, r in watch.shutdown.items())
            + ")",
            DrainEnd.INFLIGHT_ZERO: "no request in flight by its staged-shutdown metrics "
            "(KV quiescence unknown)",
            DrainEnd.POD_GONE: "its pod is gone",
            DrainEnd.NO_LOAD_SIGNAL: "no per-worker load known (no FPM); Dynamo's workers leave "
            "routing on SIGTERM and serve what they hold within their shutdown budget",
            DrainEnd.NOTHING_SERVING: "no ready worker leaves",
            DrainEnd.WORKER_BUDGET: f"every worker still busy has spent its own shutdown "
            f"budget ({TOTAL_BUDGET_ENV}) ({busy}); they cancel the rest and exit",
            DrainEnd.TIMEOUT: f"drain timeout ({self._drain_budget_s():g} s): {busy}; "
            + (
                "no longer followed (its GPUs count until its pod is gone)"
                if after
                else "lowering the replicas anyway (Dynamo serves them for its grace "
                "period after SIGTERM)"
            ),
        }[end]
        log.log(
            level,
            "DGD %s: drain of %s ended by %s after %.1f s%s: %s",
            self._ref,
            ", ".join(pods) or "no pod",
            end.value,
            waited_s,
            f" ({after})" if after else "",
            detail,
        )

    async def _follow_drain(self, writes: dict[str, int], watch: _DrainWatch) -> DrainEnd:
        """Wait (in the background) for the pods of ``watch`` to drain, then, unless the
        count was lowered first, write ``writes`` if they are still what the deployment
        needs; a failure is logged (the next tick plans again)."""
        start, budget = self._clock(), self._drain_budget_s()
        while True:
            waited = self._clock() - start
            end = await self._drain_end(watch, waited)
            if end is not None:
                break
            await self._sleep(min(DRAIN_POLL_S, budget - waited))
        self._log_drain_end(watch, end, waited)
        self._last_drain_end = end
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
    ) -> tuple[list[Any], list[Any]]:
        """Choose and mark the pods that leave (module doc: graceful scale-down); returns
        the DGD's pods as listed and the ready leaving ones (those with requests to finish)."""
        pods = await self._api.dgd_pods()
        loads = self._loads()
        leaving: dict[str, bool] = {}  # pod name -> ready
        ready: list[Any] = []
        for role, target in lower.items():
            chosen = choose_leaving(pods, obs.services[role].service, target, loads)
            for pod in chosen:
                leaving[pod.metadata.name] = pod_ready(pod)
                if pod_ready(pod):
                    ready.append(pod)
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
        return pods, ready

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
