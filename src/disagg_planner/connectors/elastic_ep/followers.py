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

from disagg_planner.connectors.dgd_shape import dgd_services, ready_count
from disagg_planner.connectors.elastic_ep.coexistence import dynamo_reconciler_claim
from disagg_planner.connectors.elastic_ep.progress import (
    RECORD_ANNOTATION,
    FollowerObservation,
    ResizeRecord,
)
from disagg_planner.connectors.kubernetes import KubernetesConnector, KubernetesSettings
from disagg_planner.connectors.kubernetes.cache import WatchCaches
from disagg_planner.errors import DeploymentError

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ElasticEpKubernetesSettings(KubernetesSettings):
    """The DGD connector's settings plus the follower service, built by the application
    (:func:`disagg_planner.runtime.connector_settings.elastic_ep_kubernetes_settings`)."""

    follower_service: str | None  # the DGD service of the follower pods; None: refused


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
        self._adapter_name = f"{self.dgd_name}-{self.follower_service.lower()}"

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
            where = f"DynamoGraphDeployment {self._ref} spec.services.{self.follower_service}"
        if isinstance(desired, bool) or not isinstance(desired, int) or desired < 0:
            raise DeploymentError(f"{where} = {desired!r}, expected an integer >= 0")
        annotations = (dgd.get("metadata") or {}).get("annotations") or {}
        text = annotations.get(RECORD_ANNOTATION) if isinstance(annotations, Mapping) else None
        record = None
        if text:
            where = f"DynamoGraphDeployment {self._ref} annotation {RECORD_ANNOTATION}"
            record = ResizeRecord.from_json(str(text), where=where)
        return FollowerObservation(
            desired=desired, ready=ready_count(dgd, self.follower_service), record=record
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
            await self._api.patch_dgd(
                {"spec": {"services": {self.follower_service: {"replicas": replicas}}}},
                what=f"follower replicas of {self.follower_service}",
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
