"""The DGD connector's face: :class:`KubernetesConnector`, the connector protocol over one
DynamoGraphDeployment (the model, the order of writes, drains, restart state and manual
edits are described in the package docstring, :mod:`disagg_planner.connectors.kubernetes`).

The API calls and their retries are in :mod:`.api`, the state annotation in :mod:`.state`, the
manual-edit policy in :mod:`.overrides`, the choice of the pods that leave in :mod:`.drain`.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kubernetes import client as k8s_client

from disagg_planner.connectors.base import (
    ConnectorSettings,
    Hold,
    HoldReason,
    ManualOverride,
    PodDiscovery,
    ScaleOutcome,
    WorkerLoads,
    advisory_holds,
    check_replicas,
)
from disagg_planner.connectors.dgd_shape import (
    ROLE_SUB_COMPONENT,
    ResolvedService,
    dgd_services,
    ready_count,
    replicas_of,
    resolve_service,
    running_count,
    service_gpus,
    service_model_name,
    services_stable,
)
from disagg_planner.connectors.kubernetes.api import (
    DGD_GROUP,
    DGD_KIND,
    DGD_PLURAL,
    DGD_VERSION,
    DGDSA_PLURAL,
    DgdApi,
    default_api_client,
    default_namespace,
)
from disagg_planner.connectors.kubernetes.cache import WatchCaches, WatchedResource, version_number
from disagg_planner.connectors.kubernetes.drain import (
    DRAIN_POLL_S,
    DrainEnd,
    busy_text,
    choose_leaving,
    drain_end,
    load_text,
    pod_marks,
    pod_ready,
)
from disagg_planner.connectors.kubernetes.overrides import judge_edits
from disagg_planner.connectors.kubernetes.state import (
    STATE_ANNOTATION,
    ForeignStateError,
    PlannerState,
    decode_state,
    encode_state,
    remaining_holds,
    resumed_baseline,
)
from disagg_planner.core.types import DeploymentStatus, RoleStatus
from disagg_planner.errors import ConnectorError, DeploymentError

log = logging.getLogger(__name__)

EVENT_COMPONENT = "planner"
_CONVERGING = HoldReason.AWAITING_CONVERGENCE


@dataclass(frozen=True, kw_only=True)
class KubernetesSettings(ConnectorSettings):
    """What the DGD connector reads, built by the application from its config
    (:func:`disagg_planner.runtime.connector_settings.kubernetes_settings`)."""

    dgd_name: str | None  # None: refused when the connector is built (nothing to manage)
    namespace: str | None  # the DGD's Kubernetes namespace; None: the pod's own
    backend: str  # a key of dgd_shape.LEGACY_SERVICE_NAMES
    manual_override: Literal["respect", "revert"]
    # How long a manually edited role is left alone (one adjustment interval, s).
    override_hold_s: float
    api_max_attempts: int  # per API call, for the retryable answers
    api_timeout_s: float  # of one API request
    api_backoff_s: float  # before the first retry; doubles per attempt
    # How long a change read back after a restart is waited for before planning resumes (s).
    convergence_timeout_s: float = 600.0
    # How long the workers chosen to leave may finish their requests before a decrease (s).
    drain_timeout_s: float = 30.0


# How long an own write may take to reach the watch cache when neither its version nor its
# content tells (then the cache is trusted again).
WRITE_SETTLE_S = 30.0


@dataclass(frozen=True)
class _OwnWrite:
    """A write this connector made, until the watch cache shows it: by the answer's
    resourceVersion when the server gave one, else by the content (``shows``), at the
    latest :data:`WRITE_SETTLE_S` after it."""

    version: int | None
    shows: Callable[[Mapping[str, Any]], bool]
    at_s: float

    def seen_in(self, obj: Mapping[str, Any] | None, now_s: float) -> bool:
        seen = version_number(obj)
        if self.version is not None and seen is not None:
            return seen >= self.version
        if obj is not None and self.shows(obj):
            return True
        return now_s - self.at_s >= WRITE_SETTLE_S


def _shows_replicas(count: int) -> Callable[[Mapping[str, Any]], bool]:
    """Whether a scaling adapter asks for ``count`` replicas."""
    return lambda adapter: (adapter.get("spec") or {}).get("replicas") == count


def _shows_state(state: str) -> Callable[[Mapping[str, Any]], bool]:
    """Whether a DGD carries the state annotation ``state`` (the text of one write: its
    time makes it unique)."""

    def shows(dgd: Mapping[str, Any]) -> bool:
        annotations = (dgd.get("metadata") or {}).get("annotations") or {}
        return isinstance(annotations, Mapping) and annotations.get(STATE_ANNOTATION) == state

    return shows


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


@dataclass(frozen=True)
class _Observation:
    """One read of the DGD (and its adapters) for the roles this planner scales."""

    dgd: Mapping[str, Any]
    services: Mapping[str, ResolvedService]
    adapters: Mapping[str, str | None]  # role -> adapter name, None: patch the DGD
    desired: Mapping[str, int]
    ready: Mapping[str, int]


# --- the connector ----------------------------------------------------------------------------


class KubernetesConnector:
    """The replicas of one DynamoGraphDeployment (see the module docstring for the model).

    ``api_client`` defaults to the in-cluster service account, else the kubeconfig.
    ``settings.namespace`` defaults to the pod's namespace. ``clock`` (monotonic seconds) and
    ``sleep`` are injectable for tests.
    """

    def __init__(
        self,
        settings: KubernetesSettings,
        *,
        api_client: k8s_client.ApiClient | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        wall_clock: Callable[[], float] = time.time,
        caches: WatchCaches | None = None,
    ) -> None:
        if not settings.dgd_name:
            raise DeploymentError(
                "no DynamoGraphDeployment to manage: set --dgd-name (or the environment "
                "variable DYN_PARENT_DGD_K8S_NAME)"
            )
        self._settings = settings
        self.dgd_name: str = settings.dgd_name
        self.namespace: str = settings.namespace or default_namespace()
        self._ref = f"{self.namespace}/{self.dgd_name}"
        self._roles: tuple[str, ...] = settings.roles
        self._api_client = api_client if api_client is not None else default_api_client()
        self._owns_client = api_client is None
        self._api = DgdApi(
            self._api_client,
            namespace=self.namespace,
            dgd_name=self.dgd_name,
            max_attempts=settings.api_max_attempts,
            timeout_s=settings.api_timeout_s,
            backoff_s=settings.api_backoff_s,
            sleep=sleep,
        )
        self._clock = clock
        self._sleep = sleep
        self._lock = asyncio.Lock()
        self._hold_s = settings.override_hold_s
        # What this planner last set (or first saw) per role: the baseline of manual edits.
        self._expected: dict[str, int] = {}
        # Writes whose outcome is unknown (the call failed): seeing them is not a manual edit.
        self._pending: dict[str, int] = {}
        self._holds: dict[str, Hold] = {}
        self._last_overrides: tuple[ManualOverride, ...] = ()
        self._model_name: str | None = settings.model_name
        self._uid: str | None = None
        self._role_services: dict[str, str] = {}
        self._instance = os.environ.get("HOSTNAME") or socket.gethostname()
        self._wall = wall_clock
        self._restored = False  # the state annotation was read (once per DGD uid)
        # The last write's time (Unix s) and targets, as recorded on the DGD.
        self._last_action: tuple[float, dict[str, int]] | None = None
        # A restored change still converging: (Unix time it was made, its targets).
        self._resumed_wait: tuple[float, dict[str, int]] | None = None
        self._worker_loads: WorkerLoads | None = None
        self._pending_drain: _PendingDrain | None = None
        # Watch caches of the DGDs and adapters (module cache.py); None: every read is a GET.
        self._caches = caches
        self._watched: dict[str, WatchedResource] = {}
        # Per object (plural/name) this connector wrote: the cache serves it again only once
        # it shows that write (module cache.py).
        self._written: dict[str, _OwnWrite] = {}

    # --- Connector protocol ---------------------------------------------------------------

    @property
    def model_name(self) -> str | None:
        return self._model_name

    @property
    def api_client(self) -> k8s_client.ApiClient:
        """The API client this connector talks through (FPM discovery reads the same
        cluster as the same identity)."""
        return self._api_client

    @property
    def role_services(self) -> Mapping[str, str]:
        """Role -> the DGD service carrying it, as of the last read (empty before any): what
        FPM discovery needs to tell a worker's role from its pod."""
        return dict(self._role_services)

    def pod_discovery(self) -> PodDiscovery:
        """Where the engines of this DGD run: FPM discovery reads the same cluster as the
        same identity (role -> service is known once :meth:`validate` read the DGD)."""
        return PodDiscovery(
            api_client=self._api_client,
            namespace=self.namespace,
            dgd_name=self.dgd_name,
            service_roles={svc: role for role, svc in self._role_services.items()},
        )

    def use_worker_loads(self, loads: WorkerLoads) -> None:
        """Where a scale-down reads the load of each pod (module doc: graceful scale-down);
        without it every pod's load is unknown."""
        self._worker_loads = loads

    async def validate(self) -> None:
        """Find the DGD, resolve every role's service, and check GPU and model facts."""
        async with self._lock:
            obs = await self._observe()
        names = {
            role: svc.model_name for role, svc in obs.services.items() if svc.model_name is not None
        }
        if len(set(names.values())) > 1:
            detail = ", ".join(
                f"{role} service '{obs.services[role].service}' serves '{name}'"
                for role, name in sorted(names.items())
            )
            raise DeploymentError(
                f"DynamoGraphDeployment {self._ref}: the model names disagree ({detail})"
            )
        found = next(iter(names.values()), None)
        wanted = self._settings.model_name
        if wanted and found and wanted != found:
            raise DeploymentError(
                f"DynamoGraphDeployment {self._ref} serves model '{found}', but model_name is "
                f"'{wanted}'"
            )
        self._model_name = wanted or found
        for role, svc in obs.services.items():
            log.info(
                "DGD %s: role %s -> service %s (by %s), %d GPU(s) per replica, %s",
                self._ref,
                role,
                svc.service,
                svc.matched_by,
                svc.gpus_per_replica,
                f"via adapter {obs.adapters[role]}" if obs.adapters[role] else "via DGD patch",
            )

    async def status(self) -> DeploymentStatus:
        """Desired/ready replicas and GPUs per replica of each role; handles manual edits."""
        async with self._lock:
            obs = await self._observe()
        return DeploymentStatus(
            roles={
                role: RoleStatus(
                    desired=obs.desired[role],
                    ready=obs.ready[role],
                    gpus_per_replica=obs.services[role].gpus_per_replica,
                )
                for role in self._roles
            }
        )

    async def set_replicas(
        self, replicas: Mapping[str, int], *, blocking: bool = False
    ) -> ScaleOutcome:
        targets = check_replicas(replicas, self._roles)
        async with self._lock:
            obs = await self._observe()
            holds = self._active_holds()
            held = {role: holds[role] for role in targets if role in holds}
            unchanged = tuple(
                role for role in targets if role not in held and obs.desired[role] == targets[role]
            )
            writes = {
                role: n for role, n in targets.items() if role not in held and role not in unchanged
            }
            if self._settings.advisory and writes:
                held.update(advisory_holds(writes))
                writes = {}
            for role, hold in held.items():
                log.info("DGD %s: not scaling %s: %s", self._ref, role, hold.detail)
            if writes:
                draining = await self._write_or_drain(obs, writes)
                held.update(draining)
                writes = {role: n for role, n in writes.items() if role not in draining}
        ready = None
        if blocking:
            ready = await self.wait_until_ready(self._settings.scaling_max_wait_s)
        return ScaleOutcome(
            requested=dict(targets), applied=writes, unchanged=unchanged, held=held, ready=ready
        )

    async def wait_until_ready(self, timeout_s: float) -> bool:
        """Poll until every non-planner service runs its desired replicas (and each adapter's
        value reached the DGD), or ``timeout_s`` passes."""
        deadline = self._clock() + timeout_s
        while True:
            obs = await self._read()
            if self._is_ready(obs):
                return True
            remaining = deadline - self._clock()
            if remaining <= 0:
                return False
            await self._sleep(min(self._settings.scaling_check_interval_s, remaining))

    def holds(self) -> Mapping[str, Hold]:
        return dict(self._active_holds())

    @property
    def last_manual_overrides(self) -> tuple[ManualOverride, ...]:
        """Manual edits found by the latest read (empty when there were none)."""
        return self._last_overrides

    def on_deployment_change(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` (from a watch thread) when the DGD appears or changes; returns
        the unsubscribe. Without watch caches: never called."""
        if self._caches is None:
            return lambda: None
        return self._watch(DGD_PLURAL).subscribe(self.dgd_name, callback)

    async def close(self) -> None:
        if self._pending_drain is not None:
            self._pending_drain.task.cancel()
        for cache in self._watched.values():
            assert self._caches is not None
            self._caches.release(cache)
        self._watched.clear()
        if self._owns_client:
            await asyncio.to_thread(self._api_client.close)

    # --- reading --------------------------------------------------------------------------

    def _watch(self, plural: str) -> WatchedResource:
        assert self._caches is not None
        if plural not in self._watched:
            self._watched[plural] = self._caches.acquire(self.namespace, plural)
        return self._watched[plural]

    def _cached(self, plural: str, name: str) -> tuple[bool, Mapping[str, Any] | None]:
        """(usable, object) from the watch cache: usable when synced and past this
        connector's own last write of the object."""
        if self._caches is None:
            return False, None
        synced, obj = self._watch(plural).get(name)
        if not synced:
            return False, None
        written = self._written.get(f"{plural}/{name}")
        if written is not None:
            if not written.seen_in(obj, self._clock()):
                return False, None
            del self._written[f"{plural}/{name}"]
        return True, obj

    def _note_write(
        self, plural: str, name: str, answer: Any, shows: Callable[[Mapping[str, Any]], bool]
    ) -> None:
        """Remember a write of ``name``: its version when the answer has one, else what the
        object shows once the write is in (``shows``)."""
        if self._caches is not None:
            version = version_number(answer if isinstance(answer, Mapping) else None)
            self._written[f"{plural}/{name}"] = _OwnWrite(version, shows, self._clock())

    async def _dgd(self) -> Mapping[str, Any]:
        usable, dgd = self._cached(DGD_PLURAL, self.dgd_name)
        if usable and dgd is not None:
            return dgd
        return await self._api.get_dgd()  # not cached yet, or missing: the GET says which

    async def _adapter(self, adapter_name: str, service: str) -> Mapping[str, Any] | None:
        usable, adapter = self._cached(DGDSA_PLURAL, adapter_name)
        if not usable:
            return await self._api.get_adapter(adapter_name, service)
        if adapter is not None:
            self._api.check_adapter(adapter, adapter_name, service)
        return adapter

    async def _read(self) -> _Observation:
        dgd = await self._dgd()
        uid = (dgd.get("metadata") or {}).get("uid")
        uid = uid if isinstance(uid, str) else None
        if self._uid is not None and uid is not None and uid != self._uid:
            # Re-created: what was set on the old object says nothing about this one.
            log.info(
                "DGD %s was re-created (uid %s -> %s): a new deployment, starting afresh",
                self._ref,
                self._uid,
                uid,
            )
            self._expected.clear()
            self._pending.clear()
            self._holds.clear()
            self._last_overrides = ()
            self._last_action = None
            self._resumed_wait = None
            self._restored = False
        self._uid = uid
        if not self._restored:
            self._restored = True
            self._restore(dgd)
        services = dgd_services(dgd, self._ref)
        resolved: dict[str, ResolvedService] = {}
        adapters: dict[str, str | None] = {}
        desired: dict[str, int] = {}
        ready: dict[str, int] = {}
        for role in self._roles:
            sub = ROLE_SUB_COMPONENT[role]
            name, matched_by = resolve_service(services, sub, self._settings.backend, self._ref)
            service = services[name]
            configured = self._settings.gpus_per_replica.get(role)
            gpus = configured or service_gpus(service, name, self._ref)
            if gpus is None:
                flag = "prefill_engine_num_gpu" if role == "prefill" else "decode_engine_num_gpu"
                raise DeploymentError(
                    f"DynamoGraphDeployment {self._ref}: GPUs per replica of role {role} are "
                    f"unknown: service '{name}' has no resources.limits.gpu or "
                    f"resources.requests.gpu; set {flag}"
                )
            resolved[role] = ResolvedService(
                role=role,
                service=name,
                sub_component_type=sub,
                matched_by=matched_by,
                gpus_per_replica=gpus,
                model_name=service_model_name(service),
            )
            adapter_name = f"{self.dgd_name}-{name.lower()}"
            adapter = await self._adapter(adapter_name, name)
            if adapter is not None:
                adapters[role] = adapter_name
                desired[role] = replicas_of(
                    (adapter.get("spec") or {}).get("replicas"),
                    f"DynamoGraphDeploymentScalingAdapter {adapter_name} spec.replicas",
                )
            else:
                adapters[role] = None
                desired[role] = replicas_of(
                    service.get("replicas"),
                    f"DynamoGraphDeployment {self._ref} spec.services.{name}.replicas",
                )
            ready[role] = ready_count(dgd, name)
        self._role_services = {role: svc.service for role, svc in resolved.items()}
        return _Observation(
            dgd=dgd, services=resolved, adapters=adapters, desired=desired, ready=ready
        )

    def _is_ready(self, obs: _Observation) -> bool:
        if not services_stable(obs.dgd, self._ref):
            return False
        services = dgd_services(obs.dgd, self._ref)
        for role, adapter in obs.adapters.items():
            # An adapter's value must have reached the DGD before the rollout can be judged.
            name = obs.services[role].service
            spec_value = replicas_of(services[name].get("replicas"), name)
            if adapter is not None and obs.desired[role] != spec_value:
                return False
        return True

    # --- manual edits -----------------------------------------------------------------------

    async def _observe(self) -> _Observation:
        """Read the DGD and apply the manual-override policy to what changed behind our back."""
        obs = await self._read()
        self._follow_resumed_wait(obs)
        verdict = judge_edits(
            roles=self._roles,
            observed=obs.desired,
            expected=self._expected,
            pending=self._pending,
            targets={
                role: obs.adapters[role] or f"spec.services.{obs.services[role].service}"
                for role in self._roles
            },
            policy=self._settings.manual_override,
            advisory=self._settings.advisory,
            now_s=self._clock(),
            hold_s=self._hold_s,
        )
        for role in self._roles:
            self._pending.pop(role, None)
        self._expected.update(verdict.expected)
        self._holds.update(verdict.holds)
        overrides, reverts = verdict.overrides, dict(verdict.reverts)
        self._last_overrides = overrides
        if overrides and not reverts:
            await self._record_state()  # a restarted planner keeps the hold
        for override in overrides:
            log.warning(
                "DGD %s: manual edit of %s (%s): %d -> %d, %s",
                self._ref,
                override.role,
                override.target,
                override.expected,
                override.observed,
                override.action,
            )
            await self._emit_override_event(override)
        if reverts:
            await self._write(obs, reverts)
            desired = dict(obs.desired)
            desired.update(reverts)
            obs = _Observation(obs.dgd, obs.services, obs.adapters, desired, obs.ready)
        return obs

    def _active_holds(self) -> dict[str, Hold]:
        now = self._clock()
        expired = [r for r, h in self._holds.items() if h.until_s is not None and h.until_s <= now]
        for role in expired:
            del self._holds[role]
        return self._holds

    async def _emit_override_event(self, override: ManualOverride) -> None:
        if override.action == "respected":
            reason, kind = "ManualScaleRespected", "Normal"
            tail = f"the planner will not scale {override.role} for {self._hold_s:g} s"
        else:
            reason, kind = "ManualScaleReverted", "Warning"
            tail = f"the planner wrote {override.expected} back (--manual-override revert)"
        message = (
            f"{override.target} replicas of role {override.role} changed from "
            f"{override.expected} (last set by the planner) to {override.observed} by someone "
            f"else; {tail}"
        )
        now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
        event = k8s_client.CoreV1Event(
            metadata=k8s_client.V1ObjectMeta(
                name=f"{self.dgd_name}.{secrets.token_hex(8)}", namespace=self.namespace
            ),
            involved_object=k8s_client.V1ObjectReference(
                api_version=f"{DGD_GROUP}/{DGD_VERSION}",
                kind=DGD_KIND,
                name=self.dgd_name,
                namespace=self.namespace,
                uid=self._uid,
            ),
            reason=reason,
            message=message,
            type=kind,
            source=k8s_client.V1EventSource(component=EVENT_COMPONENT),
            first_timestamp=now,
            last_timestamp=now,
            count=1,
            reporting_component=EVENT_COMPONENT,
            reporting_instance=self._instance,
        )
        # An Event is a courtesy to the humans: failing to post one must not stop scaling.
        try:
            await self._api.call(
                f"create Event for DynamoGraphDeployment {self._ref}",
                "create",
                "events",
                self._api.core.create_namespaced_event,
                self.namespace,
                event,
            )
        except (ConnectorError, DeploymentError) as exc:
            log.warning("could not record a Kubernetes Event (%s): %s", reason, exc)

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
        serving = await self._mark_leaving(obs, lower)
        end = drain_end(serving, self._loads(), waited_s=0.0, timeout_s=self._drain_budget_s())
        if end is not None:
            self._log_drain_end(serving, end, 0.0)
            await self._write(obs, writes, marked=True)
            return {}
        drain = _PendingDrain(
            targets=dict(writes),
            pods=tuple(serving),
            budget_s=self._drain_budget_s(),
            task=asyncio.create_task(self._follow_drain(dict(writes), tuple(serving))),
        )
        self._pending_drain = drain
        return drain.holds()

    def _drain_budget_s(self) -> float:
        return max(0.0, self._settings.drain_timeout_s)

    def _log_drain_end(self, pods: Sequence[str], end: DrainEnd, waited_s: float) -> None:
        level = logging.WARNING if end is DrainEnd.TIMEOUT else logging.INFO
        detail = {
            DrainEnd.IDLE: "no request in flight",
            DrainEnd.NO_LOAD_SIGNAL: "no per-worker load known (no FPM); Dynamo's workers leave "
            "routing on SIGTERM and serve what they hold within their shutdown budget",
            DrainEnd.NOTHING_SERVING: "no ready worker leaves",
            DrainEnd.TIMEOUT: f"drain timeout ({self._drain_budget_s():g} s): "
            f"{busy_text(pods, self._loads())}; lowering the replicas anyway (Dynamo serves "
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

    async def _follow_drain(self, writes: dict[str, int], pods: tuple[str, ...]) -> DrainEnd:
        """Wait (in the background) for ``pods`` to drain, then write ``writes`` if they are
        still what the deployment needs; a failure is logged (the next tick plans again)."""
        start, budget = self._clock(), self._drain_budget_s()
        while True:
            waited = self._clock() - start
            end = drain_end(pods, self._loads(), waited_s=waited, timeout_s=budget)
            if end is not None:
                break
            await self._sleep(min(DRAIN_POLL_S, budget - waited))
        self._log_drain_end(pods, end, waited)
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

    async def drained(self) -> DrainEnd | None:
        """Wait for the drain in progress (if any) to end and its writes to be made; which
        signal ended it (None: no drain)."""
        pending = self._pending_drain
        if pending is None:
            return None
        return await pending.task

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

    async def _mark_leaving(self, obs: _Observation, lower: Mapping[str, int]) -> list[str]:
        """Choose and mark the pods that leave (module doc: graceful scale-down); returns
        the ready ones (those with requests to finish)."""
        pods = await self._api.dgd_pods()
        loads = self._loads()
        leaving: dict[str, bool] = {}  # pod name -> ready
        for role, target in lower.items():
            chosen = choose_leaving(pods, obs.services[role].service, target, loads)
            for pod in chosen:
                leaving[pod.metadata.name] = pod_ready(pod)
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
        return [name for name, ready in leaving.items() if ready]

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
        """Write ``writes``: /scale per adapter, one merge patch for the rest. The state
        annotation travels in that merge patch; with adapters it is written first (a write
        recorded as pending and never made is not mistaken for a manual edit)."""
        patch_services: dict[str, dict[str, int]] = {}
        for role, count in writes.items():
            self._pending[role] = count
        if any(obs.adapters[role] is not None for role in writes):
            await self._record_state()
        for role, count in writes.items():
            adapter = obs.adapters[role]
            if adapter is None:
                patch_services[obs.services[role].service] = {"replicas": count}
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
            answer = await self._api.patch_dgd(
                {
                    "metadata": {"annotations": {STATE_ANNOTATION: state}},
                    "spec": {"services": patch_services},
                }
            )
            self._note_write(DGD_PLURAL, self.dgd_name, answer, _shows_state(state))
            for role, count in writes.items():
                if obs.adapters[role] is None:
                    self._settle(role, count, f"spec.services.{obs.services[role].service}")

    def _settle(self, role: str, count: int, target: str) -> None:
        self._pending.pop(role, None)
        self._expected[role] = count
        log.info("DGD %s: %s -> %d replicas (%s)", self._ref, role, count, target)

    # --- state that survives restarts -----------------------------------------------------------

    def _state_json(self) -> str:
        """What a restarted or failed-over planner needs, as the annotation's JSON: what the
        planner set (and is writing) per role, its last change and the manual-edit holds."""
        now, wall = self._clock(), self._wall()
        return encode_state(
            PlannerState(
                uid=self._uid,
                set=self._expected,
                pending=self._pending,
                holds={
                    role: wall + (hold.until_s - now)
                    for role, hold in self._holds.items()
                    if hold.reason is HoldReason.MANUAL_OVERRIDE and hold.until_s is not None
                },
                last_action=self._last_action,
            )
        )

    async def _record_state(self) -> None:
        """Patch the state annotation alone; a failure is logged (the next write retries).
        Advisory: nothing (a planner that never writes replicas writes nothing at all)."""
        if self._settings.advisory:
            return
        state = self._state_json()
        body = {"metadata": {"annotations": {STATE_ANNOTATION: state}}}
        try:
            answer = await self._api.patch_dgd(body, what="record the planner's state")
            self._note_write(DGD_PLURAL, self.dgd_name, answer, _shows_state(state))
        except (ConnectorError, DeploymentError) as exc:
            log.warning("DGD %s: could not record the planner's state: %s", self._ref, exc)

    def _restore(self, dgd: Mapping[str, Any]) -> None:
        """Read back the state annotation of the DGD as first seen by this process: the
        planner's own values (so that they are not taken for manual edits, and an edit
        made while no planner ran is one), the holds still running, and a change still
        converging (waited for, :meth:`_follow_resumed_wait`)."""
        annotations = (dgd.get("metadata") or {}).get("annotations") or {}
        raw = annotations.get(STATE_ANNOTATION) if isinstance(annotations, Mapping) else None
        if raw is None:
            return
        try:
            state = decode_state(raw, uid=self._uid, roles=self._roles)
        except ForeignStateError as exc:
            log.info(
                "DGD %s: annotation %s is of another object (uid %s); starting afresh",
                self._ref,
                STATE_ANNOTATION,
                exc.uid,
            )
            return
        except ValueError as exc:
            log.warning(
                "DGD %s: ignoring annotation %s (%s); starting afresh",
                self._ref,
                STATE_ANNOTATION,
                exc,
            )
            return
        now, wall = self._clock(), self._wall()
        holds = {
            role: Hold(
                role=role,
                reason=HoldReason.MANUAL_OVERRIDE,
                detail="replicas changed by someone else; respected for another "
                f"{remaining:.0f} s (read back after a restart)",
                until_s=now + remaining,
            )
            for role, remaining in remaining_holds(state, wall).items()
        }
        expected, pending = resumed_baseline(state)
        waiting = (
            None
            if state.last_action is None
            else (state.last_action[0], dict(state.last_action[1]))
        )
        self._pending.update(pending)
        self._expected.update(expected)
        self._holds.update(holds)
        self._last_action = waiting
        self._resumed_wait = waiting
        log.info(
            "DGD %s: resumed the planner's state: set %s%s%s",
            self._ref,
            expected,
            f", holding {sorted(holds)} after a manual edit" if holds else "",
            f", last change {waiting[1]} {wall - waiting[0]:.0f} s ago" if waiting else "",
        )

    def _follow_resumed_wait(self, obs: _Observation) -> None:
        """While a change read back after a restart has not converged (some role runs fewer
        ready replicas than it asks for) and is younger than the convergence timeout, hold
        every role: the planner that made it would have waited, so this one does too."""
        if self._resumed_wait is None:
            return
        at, targets = self._resumed_wait
        age = self._wall() - at
        not_ready = {
            role: f"{obs.ready[role]}/{obs.desired[role]}"
            for role in self._roles
            if obs.ready[role] != obs.desired[role]
        }
        timeout = self._settings.convergence_timeout_s
        if not not_ready or age >= timeout:
            if not_ready:
                log.warning(
                    "DGD %s: the change %s made before the restart did not converge within "
                    "%g s (%s ready); planning resumes",
                    self._ref,
                    targets,
                    timeout,
                    ", ".join(f"{r} {n}" for r, n in not_ready.items()),
                )
            self._resumed_wait = None
            for role in [r for r, h in self._holds.items() if h.reason is _CONVERGING]:
                del self._holds[role]
            return
        detail = (
            f"the change {targets} made {age:.0f} s ago, before this planner started, has not "
            f"converged ({', '.join(f'{r} {n} ready' for r, n in not_ready.items())}); waiting "
            f"up to {timeout - age:.0f} s more"
        )
        until = self._clock() + (timeout - age)
        for role in self._roles:
            current = self._holds.get(role)
            if current is None or current.reason is _CONVERGING:
                self._holds[role] = Hold(role, _CONVERGING, detail, until_s=until)
