"""The DGD connector plus the elastic-EP *follower* service of Dynamo's design
(operator-elastic-ep-follower): follower pods parked at 0 replicas, each bringing
``elastic_ep_dp_step`` DP ranks, so ``DP = elastic_ep_min_dp + followers x step``.

It scales the followers (through their DGDSA ``/scale`` when one exists, else a merge patch
of ``spec.services.<follower>.replicas``) and keeps the progress of a resize in the DGD
annotation ``planner.nvidia.com/elastic-ep-resize`` (:mod:`.progress`).

Only the planner is assumed to change the follower replicas: the engine's DP size is not
observable through vLLM's API, so it is derived from the followers and the record.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s_client

from disagg_planner.connectors.dgd_shape import (
    dgd_services,
    ready_count,
    replicas_patch,
    service_path,
)
from disagg_planner.connectors.elastic_ep.coexistence import dynamo_reconciler_claim
from disagg_planner.connectors.elastic_ep.errors import FollowersNotEmpty
from disagg_planner.connectors.elastic_ep.progress import (
    BACKOFF_ANNOTATION,
    BACKOFF_TYPE,
    RECORD_ANNOTATION,
    ElasticFollowers,
    FollowerObservation,
    GrowBackoff,
    ResizeRecord,
)
from disagg_planner.connectors.kubernetes import (
    LEAVING_COST,
    POD_DELETION_COST,
    SERVICE_POD_LABEL,
    KubernetesConnector,
    KubernetesSettings,
)
from disagg_planner.connectors.kubernetes.cache import WatchCaches
from disagg_planner.errors import DeploymentError

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ElasticEpKubernetesSettings(KubernetesSettings):
    """The DGD connector's settings plus the follower service, built by the application
    (:func:`disagg_planner.runtime.connector_settings.elastic_ep_kubernetes_settings`)."""

    follower_service: str | None  # the DGD service of the follower pods; None: refused
    elastic_role: str | None = None  # the role whose engine the followers join (its leader)


class ElasticEpKubernetes(KubernetesConnector):
    """The DGD connector plus the elastic-EP follower service ``elastic_ep_follower_service``
    and the resize record annotation (a :class:`FollowerPool`).

    Kubernetes API calls added to the connector's (same retries, errors and RBAC table, plus):
    ``patch dynamographdeployments`` for the annotation and for the follower replicas
    without an adapter, ``patch dynamographdeploymentscalingadapters/scale`` with one.
    """

    def __init__(
        self,
        settings: ElasticEpKubernetesSettings,
        *,
        api_client: k8s_client.ApiClient | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        caches: WatchCaches | None = None,
    ) -> None:
        if not settings.follower_service:
            raise DeploymentError(
                "elastic EP on Kubernetes needs --elastic-ep-follower-service (the DGD service "
                "of the follower pods)"
            )
        super().__init__(settings, api_client=api_client, clock=clock, sleep=sleep, caches=caches)
        self.follower_service: str = settings.follower_service
        self.elastic_role = settings.elastic_role
        self._adapter_name = f"{self.dgd_name}-{self.follower_service.lower()}"

    def elastic_followers(self) -> ElasticFollowers:
        """This DGD's follower service: the driver raises it before a grow."""
        return self

    async def _get_follower_adapter(self) -> Mapping[str, Any] | None:
        return await self._api.get_adapter(self._adapter_name, self.follower_service)

    async def observe_followers(self) -> FollowerObservation:
        dgd = await self._api.get_dgd()
        services = dgd_services(dgd, self._ref)
        service = services.get(self.follower_service)
        if service is None:
            raise DeploymentError(
                f"DynamoGraphDeployment {self._ref} has no service '{self.follower_service}' "
                f"(elastic_ep_follower_service); services: {sorted(services)}"
            )
        adapter = await self._get_follower_adapter()
        if adapter is not None:
            desired = (adapter.get("spec") or {}).get("replicas")
            where = f"DynamoGraphDeploymentScalingAdapter {self._adapter_name} spec.replicas"
        else:
            desired = service.get("replicas", 0)
            where = f"DynamoGraphDeployment {self._ref} {service_path(dgd, self.follower_service)}"
        if isinstance(desired, bool) or not isinstance(desired, int) or desired < 0:
            raise DeploymentError(f"{where} = {desired!r}, expected an integer >= 0")
        annotations = (dgd.get("metadata") or {}).get("annotations") or {}
        text = annotations.get(RECORD_ANNOTATION) if isinstance(annotations, Mapping) else None
        record = None
        if text:
            where = f"DynamoGraphDeployment {self._ref} annotation {RECORD_ANNOTATION}"
            record = ResizeRecord.from_json(str(text), where=where)
        backoff = None
        text = annotations.get(BACKOFF_ANNOTATION) if isinstance(annotations, Mapping) else None
        if text:
            where = f"DynamoGraphDeployment {self._ref} annotation {BACKOFF_ANNOTATION}"
            backoff = GrowBackoff.from_json(str(text), where=where)
        return FollowerObservation(
            desired=desired,
            ready=ready_count(dgd, self.follower_service),
            record=record,
            backoff=backoff,
        )

    async def reconciler_claim(self, role: str) -> str | None:
        """Why Dynamo's elastic-EP reconciler drives ``role``'s engine on this DGD, or None
        (:func:`disagg_planner.connectors.elastic_ep.coexistence.dynamo_reconciler_claim`);
        the role's service is the one the last status read resolved."""
        service = self.role_services.get(role)
        if service is None:
            return None  # not resolved yet: the first status read does, before any resize
        return dynamo_reconciler_claim(await self._api.get_dgd(), leader_service=service)

    async def set_followers(self, replicas: int) -> None:
        if replicas < 0:
            raise ValueError(f"follower replicas must be >= 0, got {replicas}")
        if self._settings.advisory:
            log.info("advisory: not setting %s to %d replicas", self.follower_service, replicas)
            return
        if await self._get_follower_adapter() is not None:
            await self._api.patch_adapter_scale(self._adapter_name, replicas)
        else:
            content_type, body = replicas_patch(
                await self._api.get_dgd(), {self.follower_service: replicas}, {}, self._ref
            )
            await self._api.patch_dgd(
                body,
                what=f"follower replicas of {self.follower_service}",
                content_type=content_type,
            )
        log.info("DGD %s: %s -> %d follower replicas", self._ref, self.follower_service, replicas)

    async def write_record(self, record: ResizeRecord | None) -> None:
        if self._settings.advisory:
            return
        value = record.to_json() if record is not None else None  # null removes it
        await self._api.patch_dgd(
            {"metadata": {"annotations": {RECORD_ANNOTATION: value}}},
            what="elastic-EP resize record",
        )

    async def write_backoff(self, backoff: GrowBackoff | None) -> None:
        """Keep the failed grows' condition on the DGD (None clears it); a new failure is
        also a Warning Event on the DGD."""
        if self._settings.advisory:
            return
        value = backoff.to_json() if backoff is not None else None
        await self._api.patch_dgd(
            {"metadata": {"annotations": {BACKOFF_ANNOTATION: value}}},
            what="elastic-EP grow back-off",
        )
        if backoff is not None:
            await self._emit_event(BACKOFF_TYPE, "Warning", backoff.message[:1000])

    async def _service_pods(self, service: str) -> list[Any]:
        """The live (not terminating, not exited) pods of one DGD service."""
        return [
            pod
            for pod in await self._api.dgd_pods()
            if (pod.metadata.labels or {}).get(SERVICE_POD_LABEL) == service
            and pod.metadata.deletion_timestamp is None
            and not (pod.status is not None and pod.status.phase in ("Succeeded", "Failed"))
        ]

    async def leader_restarts(self) -> int | None:
        """The container restarts of the elastic role's (leader) pods; None when the role's
        service is not resolved yet."""
        role = self.elastic_role
        service = self.role_services.get(role) if role is not None else None
        if service is None:
            return None
        total = 0
        for pod in await self._service_pods(service):
            for status in (pod.status.container_statuses if pod.status else None) or ():
                total += int(status.restart_count or 0)
        return total

    async def retire_followers(
        self, count: int, *, empty_ips: frozenset[str] | None, empty_nodes: int
    ) -> list[str]:
        """Mark the ``count`` follower pods that leave with the lowest deletion cost, after
        checking they host no rank: with ``empty_ips`` (the Ray nodes without engine actors)
        the pods on those nodes; without (Dynamo's anonymous nodes) the newest pods (their
        ranks joined last, and a shrink removes the highest ranks), when ``empty_nodes``
        covers them. Raises FollowersNotEmpty, marking nothing, when that cannot be shown."""
        live = await self._service_pods(self.follower_service)
        if count <= 0 or not live:
            return []
        count = min(count, len(live))
        if empty_ips is not None:
            chosen = [
                p
                for p in live
                if p.status is not None
                and (p.status.pod_ip in empty_ips or p.status.host_ip in empty_ips)
            ][:count]
            why = f"{len(chosen)} follower pod(s) run on a Ray node with no engine"
        else:
            newest = sorted(live, key=_created, reverse=True)
            chosen = newest[:count] if empty_nodes >= count else []
            why = f"the engine reports {empty_nodes} node(s) with every GPU free"
        if len(chosen) < count:
            raise FollowersNotEmpty(
                f"elastic EP: {count} follower pod(s) of {self.follower_service} should leave, "
                f"but {why}: not lowering the followers until the removed ranks' pods are "
                "shown empty (asked again next tick)"
            )
        for pod in chosen:
            await self._api.annotate_pod(pod.metadata.name, {POD_DELETION_COST: LEAVING_COST})
        names = [p.metadata.name for p in chosen]
        log.info("DGD %s: follower pod(s) %s leave (they host no rank)", self._ref, names)
        return names


def _created(pod: Any) -> tuple[float, str]:
    """A pod's creation time (epoch s, 0 when not set) and name, to order pods by age."""
    stamp = pod.metadata.creation_timestamp
    return (stamp.timestamp() if stamp is not None else 0.0, pod.metadata.name)
