"""The DGD connector's reads: the DGD and its adapters (from the watch caches, else a GET),
the manual-edit policy applied to what changed behind its back, and the Events about it."""

from __future__ import annotations

import datetime
import logging
import secrets
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client as k8s_client

from disagg_planner.connectors.base import (
    Hold,
    ManualOverride,
)
from disagg_planner.connectors.dgd_shape import (
    ROLE_SUB_COMPONENT,
    V1ALPHA1,
    ResolvedService,
    claim_template_gpus,
    dgd_services,
    dgd_version,
    gpu_claim_templates,
    pods_per_replica,
    ready_count,
    replicas_of,
    resolve_service,
    service_gpus,
    service_model_name,
    service_path,
    services_stable,
)
from disagg_planner.connectors.kubernetes.api import (
    DGD_GROUP,
    DGD_KIND,
    DGD_PLURAL,
    DGD_VERSION,
    DGDSA_PLURAL,
)
from disagg_planner.connectors.kubernetes.cache import WatchedResource, version_number
from disagg_planner.connectors.kubernetes.overrides import judge_edits
from disagg_planner.connectors.kubernetes.parts import (
    EVENT_COMPONENT,
    ConnectorParts,
    _Observation,
    _OwnWrite,
)
from disagg_planner.errors import ConnectorError, DeploymentError

log = logging.getLogger(__name__)


class Reads(ConnectorParts):
    """Reading the deployment (a part of :class:`KubernetesConnector`)."""

    # --- reading --------------------------------------------------------------------------

    def _watch(self, plural: str) -> WatchedResource:
        """The watch cache of ``plural`` in the DGD's version (resolved before the first
        read: :meth:`_dgd`)."""
        assert self._caches is not None and self._api.version is not None
        cache = self._watched.get(plural)
        if cache is not None and cache.version != self._api.version:
            self._follow_version()
        if plural not in self._watched:
            self._watched[plural] = self._caches.acquire(self.namespace, plural, self._api.version)
        return self._watched[plural]

    def _follow_version(self) -> None:
        """Keep the watch caches on the DGD version in use: a cache of a version no longer
        used (withdrawn, the DGD resolved again: ``DgdApi.get_dgd``) is released, its stream
        given up, and the DGD's subscribers (:meth:`on_deployment_change`) follow the new
        version's watch; else a re-created DGD would never wake its loop again."""
        if self._caches is None or self._api.version is None:
            return
        for plural, cache in list(self._watched.items()):
            if cache.version == self._api.version:
                continue
            log.info(
                "DGD %s: following %s in %s instead of %s",
                self._ref,
                plural,
                self._api.version,
                cache.version,
            )
            if plural == DGD_PLURAL and self._relay is not None:
                self._relay()
                self._relay = None
            del self._watched[plural]
            self._caches.release(cache)
        if self._deployment_callbacks and self._relay is None:
            self._relay = self._watch(DGD_PLURAL).subscribe(self.dgd_name, self._deployment_changed)

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
        if self._api.version is None:
            await self._api.resolve_version()
            self._follow_version()
        usable, dgd = self._cached(DGD_PLURAL, self.dgd_name)
        if usable and dgd is not None:
            return dgd
        try:
            return await self._api.get_dgd()  # not cached yet, or missing: the GET says which
        finally:
            self._follow_version()  # the GET may have resolved the version again

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
        version = dgd_version(dgd)
        resolved: dict[str, ResolvedService] = {}
        adapters: dict[str, str | None] = {}
        desired: dict[str, int] = {}
        ready: dict[str, int] = {}
        for role in self._roles:
            sub = ROLE_SUB_COMPONENT[role]
            name, matched_by = resolve_service(services, sub, self._settings.backend, self._ref)
            service = services[name]
            configured = self._settings.gpus_per_replica.get(role)
            gpus = configured or await self._deployment_gpus(service, name)
            if gpus is None:
                flag = "prefill_engine_num_gpu" if role == "prefill" else "decode_engine_num_gpu"
                where = (
                    "resources.limits.gpu or resources.requests.gpu"
                    if version == V1ALPHA1
                    else "nvidia.com/gpu in podTemplate's main container resources"
                )
                where += " and no DRA claim of a GPU device class"
                raise DeploymentError(
                    f"DynamoGraphDeployment {self._ref}: GPUs per replica of role {role} are "
                    f"unknown: service '{name}' has no {where}; set {flag}"
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
                    f"DynamoGraphDeployment {self._ref} {service_path(dgd, name)}.replicas",
                )
            ready[role] = ready_count(dgd, name)
        self._role_services = {role: svc.service for role, svc in resolved.items()}
        return _Observation(
            dgd=dgd, services=resolved, adapters=adapters, desired=desired, ready=ready
        )

    async def _deployment_gpus(self, service: Mapping[str, Any], name: str) -> int | None:
        """GPUs per replica as the DGD declares them: per pod from the main container's
        resources, else from its DRA claims' templates; times the pods of a multinode
        replica. None when it declares none."""
        per_pod = service_gpus(service, name, self._ref)
        if per_pod is None:
            templates = gpu_claim_templates(service, name, self._ref)
            for template in templates:
                if template not in self._claim_gpus:
                    # A template's spec is immutable: read once per connector.
                    read = await self._api.get_claim_template(template)
                    self._claim_gpus[template] = claim_template_gpus(read, template)
            per_pod = sum(self._claim_gpus[t] for t in templates) or None
        return per_pod * pods_per_replica(service) if per_pod is not None else None

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
                role: obs.adapters[role] or service_path(obs.dgd, obs.services[role].service)
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
        await self._emit_event(reason, kind, message)

    async def _emit_event(self, reason: str, kind: str, message: str) -> None:
        """A Kubernetes Event on the DGD (``kind``: Normal or Warning)."""
        now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
        event = k8s_client.CoreV1Event(
            metadata=k8s_client.V1ObjectMeta(
                name=f"{self.dgd_name}.{secrets.token_hex(8)}", namespace=self.namespace
            ),
            involved_object=k8s_client.V1ObjectReference(
                api_version=f"{DGD_GROUP}/{self._api.version or DGD_VERSION}",
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
