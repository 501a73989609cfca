"""The DGD connector's face: :class:`KubernetesConnector`, the connector protocol over one
DynamoGraphDeployment (the model, the order of writes, drains, restart state and manual
edits are described in the package docstring, :mod:`disagg_planner.connectors.kubernetes`).

The API calls and their retries are in :mod:`.api`, the state annotation in :mod:`.state`, the
manual-edit policy in :mod:`.overrides`, the choice of the pods that leave in :mod:`.drain`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING

from kubernetes import client as k8s_client

from disagg_planner.connectors.base import (
    Hold,
    ManualOverride,
    PodDiscovery,
    ScaleOutcome,
    WorkerLoads,
    advisory_holds,
    check_replicas,
)
from disagg_planner.connectors.kubernetes.api import (
    DgdApi,
    default_api_client,
    default_namespace,
)
from disagg_planner.connectors.kubernetes.cache import WatchCaches, WatchedResource
from disagg_planner.connectors.kubernetes.drain import (
    DrainEnd,
)
from disagg_planner.connectors.kubernetes.parts import (
    KubernetesSettings,
    _OwnWrite,
)
from disagg_planner.connectors.kubernetes.reads import Reads
from disagg_planner.connectors.kubernetes.resume import Resume
from disagg_planner.connectors.kubernetes.writes import Writes, _PendingDrain
from disagg_planner.core.types import DeploymentStatus, RoleStatus
from disagg_planner.errors import ConnectorError, DeploymentError

if TYPE_CHECKING:
    # Type-only: the elastic_ep package's __init__ imports this connector (its subclass).
    from disagg_planner.connectors.elastic_ep.progress import ElasticFollowers

log = logging.getLogger(__name__)

__all__ = ["KubernetesConnector", "KubernetesSettings"]


class KubernetesConnector(Reads, Writes, Resume):
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
        self._last_drain_end: DrainEnd | None = None  # which signal ended the latest drain
        # Watch caches of the DGDs and adapters (module cache.py); None: every read is a GET.
        self._caches = caches
        self._watched: dict[str, WatchedResource] = {}
        # Who wants to hear of the DGD's changes (on_deployment_change), and this connector's
        # one subscription to the DGD cache of the version in use that calls them.
        self._deployment_callbacks: list[Callable[[], None]] = []
        self._relay: Callable[[], None] | None = None
        self._resolving: asyncio.Task[None] | None = None
        self._claim_gpus: dict[str, int] = {}
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

    def elastic_followers(self) -> ElasticFollowers | None:
        """None: an elastic engine's GPUs are someone else's (ElasticEpKubernetes, the
        connector with a follower service, answers its follower pods)."""
        return None

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

    async def releasing_replicas(self) -> dict[str, int]:
        """Pods of each role marked for deletion and not yet exited (by Dynamo's labels)."""
        async with self._lock:
            obs = await self._observe()
        by_service = await self._api.terminating_pods()
        return {role: by_service.get(obs.services[role].service, 0) for role in self._roles}

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
        the unsubscribe. Without watch caches: never called.

        The watch follows the DGD's version: subscribed once discovery has told it (the DGD
        may not exist yet; its appearance is what the callback is for), and moved to the
        new version's watch when the version in use is withdrawn (:meth:`_follow_version`)."""
        if self._caches is None:
            return lambda: None
        self._deployment_callbacks.append(callback)
        if self._api.version is not None:
            self._follow_version()
        elif self._resolving is None:
            self._resolving = asyncio.get_running_loop().create_task(self._resolve_then_follow())

        def unsubscribe() -> None:
            if callback in self._deployment_callbacks:
                self._deployment_callbacks.remove(callback)
            if not self._deployment_callbacks and self._relay is not None:
                self._relay()
                self._relay = None

        return unsubscribe

    def _deployment_changed(self) -> None:
        """The DGD cache's callback (its watch thread): every subscriber of this connector."""
        for callback in list(self._deployment_callbacks):
            callback()

    async def _resolve_then_follow(self) -> None:
        try:
            await self._api.resolve_version()
        except (ConnectorError, DeploymentError) as exc:
            # The first read resolves it again and subscribes then.
            log.warning("DGD %s: the served versions are unknown yet (%s)", self._ref, exc)
            return
        finally:
            self._resolving = None
        self._follow_version()

    async def close(self) -> None:
        if self._pending_drain is not None:
            self._pending_drain.task.cancel()
        if self._resolving is not None:
            self._resolving.cancel()
        if self._relay is not None:
            self._relay()
            self._relay = None
        for cache in self._watched.values():
            assert self._caches is not None
            self._caches.release(cache)
        self._watched.clear()
        if self._owns_client:
            await asyncio.to_thread(self._api_client.close)

    async def drained(self) -> DrainEnd | None:
        """Wait for the drain in progress (if any) to end and its writes to be made; which
        signal ended it, or the latest drain (None: no drain yet)."""
        pending = self._pending_drain
        if pending is None:
            return self._last_drain_end
        return await pending.task
