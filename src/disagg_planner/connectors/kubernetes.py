"""Kubernetes connector: the replicas of a DynamoGraphDeployment (DGD), changed the way the
Dynamo operator expects.

Model of the deployment (``nvidia.com/v1alpha1``, the DGD's storage version; the pure rules
over the object are in :mod:`disagg_planner.connectors.dgd_shape`):

- ``spec.services`` maps a service name to ``{subComponentType, replicas, resources, ...}``.
  A role resolves to the one service whose ``subComponentType`` is the role's (``prefill``;
  ``decode`` for both ``decode`` and ``agg``). Only when no service has it does the backend's
  legacy name (``VllmPrefillWorker`` ...) apply, and only to a service without a
  ``subComponentType``. Two services with the same ``subComponentType`` are an error.
- GPUs per replica: the config value when given, else ``resources.limits.gpu``, else
  ``resources.requests.gpu`` of the service.
- Desired replicas: ``spec.replicas`` of the service's DynamoGraphDeploymentScalingAdapter
  (DGDSA, named ``{dgd}-{service lower case}``) when it exists (the adapter controller then
  owns the DGD's field), else ``spec.services.<name>.replicas``. Ready replicas:
  ``status.services.<name>.availableReplicas``, else ``readyReplicas``.
- Writes: the DGDSA ``/scale`` subresource when the adapter exists, else one JSON merge patch
  ``{"spec": {"services": {<name>: {"replicas": n}}}}`` that touches nothing else (one patch
  for all roles without an adapter).
- Budget-safe order: when a change lowers some roles and raises others, the decreases are
  written first, and the increases only once no role runs more engines than it is asked for,
  counting the pods still terminating (the pods of a service carry Dynamo's labels
  ``nvidia.com/dynamo-graph-deployment-name`` and ``nvidia.com/dynamo-component``; the DGD's
  status counts only non-terminated replicas). So the engines x GPUs in use never exceed
  what the old or the new targets add up to, both within the budget. When the lowered roles
  have not let go within one adjustment interval (``override_hold_s``; at most
  ``scaling_max_wait_s``), the increases are not written and the call fails
  (:class:`ConnectorError`; the next tick plans again).

Graceful scale-down: before a role's replicas are lowered, the connector chooses the pods that
leave and marks them so that Kubernetes removes those and no others. It lists the service's
pods (not terminating) and ranks them the way a ReplicaSet ranks pods for deletion, with the
load the planner knows: pods not ready first (they serve nothing, and a ReplicaSet removes
them first whatever their cost), then ready pods by the requests in flight on their engines
(scheduled and queued, from each engine's latest ForwardPassMetrics; the runtime hands the
connector that reading, :meth:`KubernetesConnector.use_worker_loads`), least first, then the
pods whose load is unknown. Each chosen pod gets the annotation
``controller.kubernetes.io/pod-deletion-cost`` at the lowest value (a ReplicaSet deletes the
pods of lowest cost first) and ``planner.autoscaling.dev/draining-since`` (when, UTC); a pod
marked earlier that no longer leaves has both removed. Then the chosen ready pods are given
time to finish what they are serving: the count drops once each reports no request in flight,
or when ``drain_timeout_s`` has passed (a pod whose load is unknown is waited for until then;
0: no wait), with a log line saying which way it ended. Dynamo has no drain call of its own
(a worker drain admin API is proposed upstream, not released): on SIGTERM a worker leaves
discovery, so that no new request reaches it, and serves what it holds for its grace period
(``DYN_GRACEFUL_SHUTDOWN_GRACE_PERIOD_SECS``, 5 s by default) before the rest is cancelled
(Dynamo issue 13559). Choosing an idle worker is what keeps that cancellation empty.

State that survives restarts: the annotation ``planner.autoscaling.dev/state`` on the DGD
holds JSON with what the planner set per role (``set``), a write whose outcome is unknown
(``pending``), the last change (``lastActionAt``, Unix s, and ``waitingFor``) and the
manual-edit holds (``holds``: reason and end, Unix s), and the DGD's ``uid``. It travels in
the replicas merge patch itself; with a scaling adapter it is written before the ``/scale``
call. A connector reads it back when it first reads the DGD (a restarted or failed-over
planner): its predecessor's values are its own (not manual edits; an edit made while no
planner ran is one), the holds run on until their end, and while the last change has not
converged (a role with fewer ready replicas than desired) and is younger than
``convergence_timeout_s`` every role is held (``awaiting_convergence``). A state of another
uid, or one that cannot be read, is ignored with a log line. Advisory mode writes none.

A manual edit is a desired count that differs from what this planner last set (or first saw)
and is not a write of its own that merely reported failure. A DGD with another
``metadata.uid`` than the one read before is a new deployment (deleted and applied again):
its counts are the new baseline, with no Event, and the holds and unsettled writes of the
old one are forgotten. Policy ``respect`` adopts the
new value and holds the role for one adjustment interval; ``revert`` writes the planner's
value back. Both record a Kubernetes Event on the DGD. With ``advisory`` the connector
never writes replicas (``revert`` then behaves as ``respect``).

API errors: 409, 429, 5xx and connection failures are retried with exponential backoff
(a 429's ``Retry-After`` first), then reported as :class:`ConnectorError`; 404 of the DGD is a
:class:`DeploymentError`; 401/403 and other 4xx are :class:`ConnectorError` at once (403 names
the missing permission). The sync ``kubernetes`` client runs in worker threads.

Kubernetes API calls this connector makes (the Helm chart's RBAC; all namespaced):

========  ==============  =============================================  =====================
verb      API group       resource                                       when
========  ==============  =============================================  =====================
get       nvidia.com      dynamographdeployments                         validate, status,
                                                                         set_replicas, wait
patch     nvidia.com      dynamographdeployments                         scale without adapter,
                                                                         revert a manual edit
get       nvidia.com      dynamographdeploymentscalingadapters           every read (404 = none)
patch     nvidia.com      dynamographdeploymentscalingadapters/scale     scale with an adapter
list      "" (core v1)    pods                                           before an increase,
                                                                         before a decrease
patch     "" (core v1)    pods                                           mark the pods that
                                                                         leave (decrease)
create    "" (core v1)    events                                         manual edit detected
========  ==============  =============================================  =====================
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from disagg_planner.connectors.base import (
    ConnectorSettings,
    Hold,
    HoldReason,
    ManualOverride,
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
from disagg_planner.core.types import DeploymentStatus, RoleStatus
from disagg_planner.errors import ConnectorError, DeploymentError

log = logging.getLogger(__name__)

DGD_GROUP = "nvidia.com"
DGD_VERSION = "v1alpha1"
DGD_KIND = "DynamoGraphDeployment"
DGD_PLURAL = "dynamographdeployments"
DGDSA_PLURAL = "dynamographdeploymentscalingadapters"

# The service-account namespace file of an in-cluster pod.
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

EVENT_COMPONENT = "planner"
# The planner's state on the DGD (JSON; see "State that survives restarts" in the module doc).
STATE_ANNOTATION = "planner.autoscaling.dev/state"
STATE_VERSION = 1
# The labels the Dynamo operator puts on the pods of a DGD's service.
DGD_POD_LABEL = "nvidia.com/dynamo-graph-deployment-name"
SERVICE_POD_LABEL = "nvidia.com/dynamo-component"
# Kubernetes' ReplicaSet deletes the pods of lowest cost first (an int32; unset is 0).
POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
LEAVING_COST = str(-(2**31))
DRAINING_ANNOTATION = "planner.autoscaling.dev/draining-since"
# How often a drain reads the leaving workers' load (their FPM arrive every iteration).
DRAIN_POLL_S = 0.5
MAX_BACKOFF_S = 30.0
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


@dataclass(frozen=True)
class _Observation:
    """One read of the DGD (and its adapters) for the roles this planner scales."""

    dgd: Mapping[str, Any]
    services: Mapping[str, ResolvedService]
    adapters: Mapping[str, str | None]  # role -> adapter name, None: patch the DGD
    desired: Mapping[str, int]
    ready: Mapping[str, int]


class _Retryable(Exception):
    """An API answer worth another attempt; ``delay_s`` overrides the backoff when set."""

    def __init__(self, detail: str, delay_s: float | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.delay_s = delay_s


def _default_namespace() -> str:
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


def default_api_client() -> k8s_client.ApiClient:
    """An API client from the in-cluster service account, else the kubeconfig."""
    configuration = k8s_client.Configuration()
    try:
        k8s_config.load_incluster_config(client_configuration=configuration)
    except ConfigException:
        try:
            # The client captures $KUBECONFIG when it is imported; read it now instead.
            k8s_config.load_kube_config(
                config_file=os.environ.get("KUBECONFIG") or None,
                client_configuration=configuration,
            )
        except (ConfigException, OSError) as exc:
            raise ConnectorError(
                "cannot reach Kubernetes: not running in a pod with a service account, and no "
                f"usable kubeconfig ($KUBECONFIG or ~/.kube/config): {exc}"
            ) from exc
    return k8s_client.ApiClient(configuration)


def _server_message(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "")
    except ValueError:
        return (exc.body or exc.reason or "").strip()[:300]
    if isinstance(body, Mapping) and body.get("message"):
        return str(body["message"])
    return str(exc.reason or "")


def _retry_after(exc: ApiException) -> float | None:
    headers = exc.headers or {}
    raw = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        value = float(raw) if raw is not None else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) and value >= 0 else None


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
    ) -> None:
        if not settings.dgd_name:
            raise DeploymentError(
                "no DynamoGraphDeployment to manage: set --dgd-name (or the environment "
                "variable DYN_PARENT_DGD_K8S_NAME)"
            )
        self._settings = settings
        self.dgd_name: str = settings.dgd_name
        self.namespace: str = settings.namespace or _default_namespace()
        self._ref = f"{self.namespace}/{self.dgd_name}"
        self._roles: tuple[str, ...] = settings.roles
        self._api_client = api_client if api_client is not None else default_api_client()
        self._owns_client = api_client is None
        self._custom = k8s_client.CustomObjectsApi(self._api_client)
        self._core = k8s_client.CoreV1Api(self._api_client)
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
                await self._write(obs, writes)
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

    async def close(self) -> None:
        if self._owns_client:
            await asyncio.to_thread(self._api_client.close)

    # --- reading --------------------------------------------------------------------------

    async def _read(self) -> _Observation:
        dgd = await self._get_dgd()
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
            adapter = await self._get_adapter(adapter_name, name)
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

    def _check_adapter(self, adapter: Mapping[str, Any], adapter_name: str, service: str) -> None:
        ref = (adapter.get("spec") or {}).get("dgdRef") or {}
        if not isinstance(ref, Mapping):
            return
        if ref.get("name") not in (None, self.dgd_name) or ref.get("serviceName") not in (
            None,
            service,
        ):
            raise DeploymentError(
                f"DynamoGraphDeploymentScalingAdapter {self.namespace}/{adapter_name} refers to "
                f"{ref.get('name')}/{ref.get('serviceName')}, expected "
                f"{self.dgd_name}/{service}: refusing to scale through it"
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
        overrides: list[ManualOverride] = []
        reverts: dict[str, int] = {}
        for role in self._roles:
            observed = obs.desired[role]
            expected = self._expected.get(role)
            pending = self._pending.pop(role, None)
            if expected is None or observed in (expected, pending):
                self._expected[role] = observed
                continue
            target = obs.adapters[role] or f"spec.services.{obs.services[role].service}"
            if self._settings.manual_override == "revert" and not self._settings.advisory:
                reverts[role] = expected
                overrides.append(ManualOverride(role, target, expected, observed, "reverted"))
            else:
                self._expected[role] = observed
                until = self._clock() + self._hold_s
                self._holds[role] = Hold(
                    role=role,
                    reason=HoldReason.MANUAL_OVERRIDE,
                    detail=f"replicas changed by someone else from {expected} to {observed}; "
                    f"respected for {self._hold_s:g} s",
                    until_s=until,
                )
                overrides.append(ManualOverride(role, target, expected, observed, "respected"))
        self._last_overrides = tuple(overrides)
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
        await self._emit_event(reason, kind, message)

    async def _emit_event(self, reason: str, kind: str, message: str) -> None:
        """A Kubernetes Event on the DGD (``kind``: Normal or Warning)."""
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
            await self._call(
                f"create Event for DynamoGraphDeployment {self._ref}",
                "create",
                "events",
                self._core.create_namespaced_event,
                self.namespace,
                event,
            )
        except (ConnectorError, DeploymentError) as exc:
            log.warning("could not record a Kubernetes Event (%s): %s", reason, exc)

    # --- writing ----------------------------------------------------------------------------

    async def _write(self, obs: _Observation, writes: Mapping[str, int]) -> None:
        """Write ``writes`` (role -> replicas): the decreases, then the increases once every
        role's engines fit what it is asked for (module doc: budget-safe order)."""
        lower = {role: n for role, n in writes.items() if n < obs.desired[role]}
        higher = {role: n for role, n in writes.items() if role not in lower}
        self._last_action = (self._wall(), dict(writes))
        if lower:
            await self._drain(obs, lower)
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

    async def _drain(self, obs: _Observation, lower: Mapping[str, int]) -> None:
        """Choose and mark the pods that leave, then give the ready ones time to finish
        their requests (module doc: graceful scale-down)."""
        pods = await self._dgd_pods()
        loads = self._loads()
        leaving: dict[str, bool] = {}  # pod name -> ready
        for role, target in lower.items():
            service = obs.services[role].service
            live = [
                p
                for p in pods
                if (p.metadata.labels or {}).get(SERVICE_POD_LABEL) == service
                and p.metadata.deletion_timestamp is None
                and not (p.status is not None and p.status.phase in ("Succeeded", "Failed"))
            ]
            ranked = sorted(live, key=lambda p: _leave_rank(p, loads))
            chosen = ranked[: max(0, len(live) - target)]
            for pod in chosen:
                leaving[pod.metadata.name] = _pod_ready(pod)
            if chosen:
                log.info(
                    "DGD %s: %s %d -> %d: %s leave%s",
                    self._ref,
                    role,
                    obs.desired[role],
                    target,
                    ", ".join(f"{p.metadata.name} ({_load_text(p, loads)})" for p in chosen),
                    "s" if len(chosen) == 1 else "",
                )
        since = datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat()
        for pod in pods:
            name = pod.metadata.name
            annotations = pod.metadata.annotations or {}
            if name in leaving:
                if annotations.get(POD_DELETION_COST) != LEAVING_COST:
                    await self._annotate_pod(
                        name, {POD_DELETION_COST: LEAVING_COST, DRAINING_ANNOTATION: since}
                    )
            elif DRAINING_ANNOTATION in annotations and pod.metadata.deletion_timestamp is None:
                # Marked by an earlier scale-down that did not take it: it stays now.
                await self._annotate_pod(name, {POD_DELETION_COST: None, DRAINING_ANNOTATION: None})
        await self._wait_drained([name for name, ready in leaving.items() if ready])

    async def _wait_drained(self, pods: list[str]) -> None:
        """Return once every pod in ``pods`` reports no request in flight, or when the drain
        timeout passed."""
        timeout = self._settings.drain_timeout_s
        if not pods or timeout <= 0:
            return
        start = self._clock()
        while True:
            loads = self._loads()
            busy = {pod: loads.get(pod) for pod in pods if loads.get(pod) != 0}
            waited = self._clock() - start
            if not busy:
                log.info(
                    "DGD %s: %s drained (no request in flight) after %.1f s",
                    self._ref,
                    ", ".join(pods),
                    waited,
                )
                return
            if waited >= timeout:
                log.warning(
                    "DGD %s: drain timeout (%g s): %s; lowering the replicas anyway (Dynamo "
                    "serves them for its grace period after SIGTERM)",
                    self._ref,
                    timeout,
                    ", ".join(
                        f"{pod} {'load unknown' if n is None else f'{n} in flight'}"
                        for pod, n in busy.items()
                    ),
                )
                return
            await self._sleep(min(DRAIN_POLL_S, timeout - waited))

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
                dgd = await self._get_dgd()
            fresh = True
            excess = self._excess(obs, dgd, await self._terminating_pods(), desired)
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
            await self._patch_adapter_scale(adapter, count)
            self._settle(role, count, f"adapter {adapter}")
        if patch_services:
            await self._patch_dgd(
                {
                    "metadata": {"annotations": {STATE_ANNOTATION: self._state_json()}},
                    "spec": {"services": patch_services},
                }
            )
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
        holds = {
            role: {"reason": hold.reason.value, "until": wall + (hold.until_s - now)}
            for role, hold in self._holds.items()
            if hold.reason is HoldReason.MANUAL_OVERRIDE and hold.until_s is not None
        }
        state: dict[str, Any] = {
            "version": STATE_VERSION,
            "uid": self._uid,
            "set": dict(self._expected),
            "pending": dict(self._pending),
            "holds": holds,
        }
        if self._last_action is not None:
            state["lastActionAt"], state["waitingFor"] = self._last_action
        return json.dumps(state, sort_keys=True)

    async def _record_state(self) -> None:
        """Patch the state annotation alone; a failure is logged (the next write retries).
        Advisory: nothing (a planner that never writes replicas writes nothing at all)."""
        if self._settings.advisory:
            return
        body = {"metadata": {"annotations": {STATE_ANNOTATION: self._state_json()}}}
        try:
            await self._patch_dgd(body, what="record the planner's state")
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
            state = json.loads(raw)
            if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
                raise ValueError(f"expected an object with version {STATE_VERSION}")
            if state.get("uid") not in (None, self._uid):
                log.info(
                    "DGD %s: annotation %s is of another object (uid %s); starting afresh",
                    self._ref,
                    STATE_ANNOTATION,
                    state.get("uid"),
                )
                return
            roles = set(self._roles)
            expected = {r: int(n) for r, n in (state.get("set") or {}).items() if r in roles}
            pending = {r: int(n) for r, n in (state.get("pending") or {}).items() if r in roles}
            now, wall = self._clock(), self._wall()
            holds = {}
            for role, hold in (state.get("holds") or {}).items():
                remaining = float(hold["until"]) - wall
                if role in roles and remaining > 0:
                    holds[role] = Hold(
                        role=role,
                        reason=HoldReason.MANUAL_OVERRIDE,
                        detail="replicas changed by someone else; respected for another "
                        f"{remaining:.0f} s (read back after a restart)",
                        until_s=now + remaining,
                    )
            waiting = None
            if state.get("lastActionAt") is not None:
                targets = {
                    r: int(n) for r, n in (state.get("waitingFor") or {}).items() if r in roles
                }
                waiting = (float(state["lastActionAt"]), targets)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            log.warning(
                "DGD %s: ignoring annotation %s (%s); starting afresh",
                self._ref,
                STATE_ANNOTATION,
                exc,
            )
            return
        # The last value written is the baseline; the one before it is also the planner's
        # own while that write's outcome is unknown (it may never have landed).
        for role, count in pending.items():
            if role in expected and expected[role] != count:
                self._pending[role] = expected[role]
            expected[role] = count
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

    # --- the API calls on the DGD and its adapters ----------------------------------------------

    async def _get_dgd(self) -> Mapping[str, Any]:
        dgd = await self._call(
            f"get DynamoGraphDeployment {self._ref}",
            "get",
            DGD_PLURAL,
            self._custom.get_namespaced_custom_object,
            DGD_GROUP,
            DGD_VERSION,
            self.namespace,
            DGD_PLURAL,
            self.dgd_name,
        )
        if not isinstance(dgd, Mapping):
            raise ConnectorError(f"get DynamoGraphDeployment {self._ref}: answer is not an object")
        return dgd

    async def _get_adapter(self, adapter_name: str, service: str) -> Mapping[str, Any] | None:
        """The scaling adapter of ``service``, checked to refer to it; None when it has none."""
        adapter = await self._call(
            f"get DynamoGraphDeploymentScalingAdapter {self.namespace}/{adapter_name}",
            "get",
            DGDSA_PLURAL,
            self._custom.get_namespaced_custom_object,
            DGD_GROUP,
            DGD_VERSION,
            self.namespace,
            DGDSA_PLURAL,
            adapter_name,
            allow_404=True,
        )
        if isinstance(adapter, Mapping):
            self._check_adapter(adapter, adapter_name, service)
            return adapter
        return None

    async def _dgd_pods(self) -> list[Any]:
        """The pods of this DGD (``V1Pod``), by Dynamo's label."""
        pods = await self._call(
            f"list pods of DynamoGraphDeployment {self._ref}",
            "list",
            "pods",
            self._core.list_namespaced_pod,
            self.namespace,
            label_selector=f"{DGD_POD_LABEL}={self.dgd_name}",
        )
        # Checked here too: the selector is the server's to apply, the budget ours.
        return [
            pod
            for pod in getattr(pods, "items", None) or ()
            if (pod.metadata.labels or {}).get(DGD_POD_LABEL) == self.dgd_name
        ]

    async def _annotate_pod(self, name: str, annotations: Mapping[str, str | None]) -> None:
        """One merge patch of a pod's annotations (None removes one)."""
        await self._call(
            f"patch pod {self.namespace}/{name} (pod-deletion-cost)",
            "patch",
            "pods",
            self._core.patch_namespaced_pod,
            name,
            self.namespace,
            {"metadata": {"annotations": dict(annotations)}},
            _content_type="application/merge-patch+json",
        )

    async def _terminating_pods(self) -> dict[str, int]:
        """Pods of this DGD still terminating, by service (they hold their GPUs until gone)."""
        counts: dict[str, int] = {}
        for pod in await self._dgd_pods():
            labels = pod.metadata.labels or {}
            if pod.metadata.deletion_timestamp is None:
                continue
            if pod.status is not None and pod.status.phase in ("Succeeded", "Failed"):
                continue  # exited: its GPUs are free
            service = labels.get(SERVICE_POD_LABEL, "")
            counts[service] = counts.get(service, 0) + 1
        return counts

    async def _patch_adapter_scale(self, adapter_name: str, replicas: int) -> None:
        await self._call(
            f"patch scale of DynamoGraphDeploymentScalingAdapter {self.namespace}/{adapter_name}",
            "patch",
            f"{DGDSA_PLURAL}/scale",
            self._custom.patch_namespaced_custom_object_scale,
            DGD_GROUP,
            DGD_VERSION,
            self.namespace,
            DGDSA_PLURAL,
            adapter_name,
            {"spec": {"replicas": replicas}},
            _content_type="application/merge-patch+json",
        )

    async def _patch_dgd(self, body: Mapping[str, Any], *, what: str | None = None) -> None:
        """One JSON merge patch of the DGD; ``what`` names the change in errors."""
        await self._call(
            f"patch DynamoGraphDeployment {self._ref}" + (f" ({what})" if what else ""),
            "patch",
            DGD_PLURAL,
            self._custom.patch_namespaced_custom_object,
            DGD_GROUP,
            DGD_VERSION,
            self.namespace,
            DGD_PLURAL,
            self.dgd_name,
            body,
            _content_type="application/merge-patch+json",
        )

    # --- API calls with retries ---------------------------------------------------------------

    async def _call(
        self,
        what: str,
        verb: str,
        resource: str,
        fn: Callable[..., Any],
        *args: Any,
        allow_404: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Run one API call in a thread, retrying 409/429/5xx/connection failures.

        Returns None on 404 when ``allow_404``. Raises DeploymentError (404) or
        ConnectorError (everything else) with ``what`` and the server's message.
        """
        attempts = self._settings.api_max_attempts
        timeout = self._settings.api_timeout_s
        last = ""
        for attempt in range(1, attempts + 1):
            try:
                try:
                    return await asyncio.to_thread(fn, *args, _request_timeout=timeout, **kwargs)
                except ApiException as exc:
                    self._classify(exc, what, verb, resource, allow_404=allow_404)
                    return None  # an allowed 404: _classify raised for everything else
                except (urllib3.exceptions.HTTPError, OSError) as exc:
                    raise _Retryable(f"connection failed: {exc}") from exc
            except _Retryable as retry:
                last = retry.detail
                if attempt == attempts:
                    break
                delay = retry.delay_s
                if delay is None:
                    delay = min(
                        self._settings.api_backoff_s * 2 ** (attempt - 1),
                        MAX_BACKOFF_S,
                    )
                log.warning(
                    "%s: attempt %d/%d failed (%s); retrying in %.2f s",
                    what,
                    attempt,
                    attempts,
                    last,
                    delay,
                )
                await self._sleep(delay)
        raise ConnectorError(f"{what}: failed after {attempts} attempt(s); last: {last}")

    def _classify(
        self, exc: ApiException, what: str, verb: str, resource: str, *, allow_404: bool
    ) -> None:
        """Raise _Retryable for retryable answers, else the typed error; return only for an
        allowed 404."""
        status = exc.status or 0
        message = _server_message(exc)
        answer = f"{status} {exc.reason or ''}".strip() + (f": {message}" if message else "")
        if status in (409, 429) or status >= 500:
            delay = _retry_after(exc) if status == 429 else None
            raise _Retryable(answer, delay)
        if status == 404:
            if allow_404:
                return
            raise DeploymentError(
                f"{what}: not found ({answer}); check --dgd-name / DYN_PARENT_DGD_K8S_NAME and "
                f"--kubernetes-namespace, and that the {DGD_GROUP} CRDs are installed"
            )
        if status in (401, 403):
            raise ConnectorError(
                f"{what}: {'forbidden' if status == 403 else 'unauthorized'} ({answer}); the "
                f"planner's service account needs '{verb}' on '{resource}' in namespace "
                f"'{self.namespace}' (see the RBAC table in disagg_planner.connectors.kubernetes)"
            )
        raise ConnectorError(f"{what}: rejected ({answer})")


def _pod_ready(pod: Any) -> bool:
    conditions = (pod.status.conditions if pod.status is not None else None) or ()
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def _leave_rank(pod: Any, loads: Mapping[str, int]) -> tuple[bool, bool, int, str]:
    """Sort key of the pods that leave first: not ready, then the least requests in flight,
    then unknown load; the name keeps the order stable."""
    load = loads.get(pod.metadata.name)
    return (_pod_ready(pod), load is None, load or 0, pod.metadata.name)


def _load_text(pod: Any, loads: Mapping[str, int]) -> str:
    if not _pod_ready(pod):
        return "not ready"
    load = loads.get(pod.metadata.name)
    return "load unknown" if load is None else f"{load} in flight"
