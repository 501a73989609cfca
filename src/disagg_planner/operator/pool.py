"""``PlannerPool``: one GPU pool shared by the PlannerPolicies that name it.

Group ``planner.autoscaling.dev``, version ``v1alpha1``, kind ``PlannerPool`` (plural
``plannerpools``, short name ``plpool``), namespaced: its members are the policies of its
namespace whose spec names it (``pool``, with ``pool_priority``, ``pool_floor_gpus`` and
``pool_ceiling_gpus``). The spec (generated from :class:`PoolSpec`): ``maxTotalGpus``,
optional ``minTotalGpus``, ``stabilizationSeconds``.

Every :data:`POOL_PERIOD_S` the operator runs the pool's arbiter
(:func:`disagg_planner.core.fleet.arbitrate`) over its members' loops in this process: each
member's proposal is its planner's standing need (the throughput loop's sizing), what its
deployment holds (desired or ready replicas, whichever is more, plus the ones whose pods are
still terminating: starting and releasing GPUs both count) and its urgency
(:func:`disagg_planner.core.fleet.member_urgency`: a fast check's scale-up within its
throughput interval is an observed breach, a need above what it holds a forecast shortfall).
The grants go to the members' connectors (:class:`PooledConnector`: a scale-up beyond the
grant is cut to it), a member holding more than its grant is scaled down to it (a reclaim,
drained as any scale-down), and the pool's status shows each member's allocated, requested,
held and borrowed GPUs (its message ends with its urgency's reason), the totals and a Ready
condition. The arbiter's memory is kept in the status (``status.arbiter``), read back when the
operator restarts, so a restart withdraws nothing at once and forgets no window.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import kopf
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.connectors.base import (
    Connector,
    Hold,
    PodDiscovery,
    ScaleOutcome,
    WorkerLoads,
)
from disagg_planner.core.budget import gpus_of
from disagg_planner.core.fleet import (
    ArbiterMemory,
    Arbitration,
    FleetError,
    Grant,
    MemberProposal,
    PoolLimits,
    arbitrate,
    fit_to_grant,
    member_urgency,
)
from disagg_planner.core.types import DeploymentStatus
from disagg_planner.operator.conditions import conditions_schema

log = logging.getLogger(__name__)

POOL_KIND = "PlannerPool"
POOL_PLURAL = "plannerpools"
POOL_SINGULAR = "plannerpool"
POOL_SHORT_NAMES = ("plpool",)
POOL_PERIOD_S = 15.0


class PoolSpec(BaseModel):
    """The spec of a PlannerPool (camelCase on the object)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")
    max_total_gpus: int = Field(
        ge=1, description="Most GPUs the pool's members hold together at any moment."
    )
    min_total_gpus: int = Field(
        0, ge=0, description="The pool does not shrink below this many GPUs (0: no minimum)."
    )
    stabilization_seconds: float = Field(
        300.0,
        ge=0,
        description="How long a lower share must last before a member's grant is withdrawn.",
    )

    @property
    def limits(self) -> PoolLimits:
        return PoolLimits(self.max_total_gpus, self.min_total_gpus, self.stabilization_seconds)


def pool_spec(spec: Mapping[str, Any]) -> PoolSpec:
    """The spec validated; a :class:`FleetError` naming the field and value."""
    try:
        spec_model = PoolSpec.model_validate(dict(spec))
        _ = spec_model.limits  # min <= max
        return spec_model
    except ValidationError as exc:
        problems = [
            f"spec.{'.'.join(str(p) for p in e['loc'])} = {e.get('input')!r}: {e['msg']}"
            for e in exc.errors()
        ]
        raise FleetError("; ".join(problems)) from None


# --- the members' side --------------------------------------------------------------------------


class PooledConnector:
    """A member's connector under its pool's grant: what its loop sets is cut to the grant
    (:func:`disagg_planner.core.fleet.fit_to_grant`), and nothing grows before the pool's
    first grant; everything else passes through."""

    def __init__(self, inner: Connector, config: PlannerConfig) -> None:
        self.inner = inner
        self.config = config
        self.grant: Grant | None = None
        self.refused_gpus = 0  # the last scale-up's GPUs the grant did not cover

    @property
    def model_name(self) -> str | None:
        return self.inner.model_name

    async def validate(self) -> None:
        await self.inner.validate()

    async def status(self) -> DeploymentStatus:
        """The deployment's status with the replicas still terminating counted: the pool
        grants another member only GPUs that are free, not ones a scale-down is releasing."""
        status = await self.inner.status()
        releasing = await self.inner.releasing_replicas()
        if not any(releasing.values()):
            return status
        return DeploymentStatus(
            roles={
                role: replace(s, terminating=releasing.get(role, 0))
                for role, s in status.roles.items()
            }
        )

    async def releasing_replicas(self) -> Mapping[str, int]:
        return await self.inner.releasing_replicas()

    def holds(self) -> Mapping[str, Hold]:
        return self.inner.holds()

    async def close(self) -> None:
        await self.inner.close()

    def pod_discovery(self) -> PodDiscovery | None:
        return self.inner.pod_discovery()

    def use_worker_loads(self, loads: WorkerLoads) -> None:
        self.inner.use_worker_loads(loads)

    def on_deployment_change(self, callback: Callable[[], None]) -> Callable[[], None] | None:
        return self.inner.on_deployment_change(callback)

    def __getattr__(self, name: str) -> Any:
        # what the runtime may use of a particular connector (elastic EP)
        return getattr(self.inner, name)

    async def set_replicas(
        self, replicas: Mapping[str, int], *, blocking: bool = False
    ) -> ScaleOutcome:
        target = dict(replicas)
        status = await self.inner.status()
        per = {r: status.roles[r].gpus_per_replica for r in target}
        current = {r: status.desired(r) for r in target}
        if self.grant is None:
            # no grant yet (the pool has not arbitrated since this loop started): no growth
            fitted = {r: min(n, current[r]) for r, n in target.items()}
        else:
            floors = {r: self.config.min_endpoint_for(r) for r in target}
            fitted = fit_to_grant(
                target, current, gpus_per_replica=per, floors=floors, grant=self.grant
            )
        self.refused_gpus = max(0, gpus_of(target, per) - gpus_of(fitted, per))
        return await self.inner.set_replicas(fitted, blocking=blocking)


@dataclass
class PoolMember:
    """One member as the pool sees it: its name (the policy's), settings and loop's state."""

    name: str
    config: PlannerConfig
    connector: PooledConnector
    status: DeploymentStatus | None
    throughput_need: Mapping[str, int] = field(default_factory=dict)
    # when its planner's fast check last scaled up, and now, both on its loop's clock
    fast_scale_up_s: float | None = None
    now_s: float = 0.0

    def proposal(self) -> MemberProposal | None:
        """None until the member has read its deployment once."""
        if self.status is None:
            return None
        status = self.status
        per = {r: s.gpus_per_replica for r, s in status.roles.items()}
        held = status.gpus_in_use
        wanted = {r: self.throughput_need.get(r, status.desired(r)) for r in status.roles}
        need = gpus_of(wanted, per) + self.connector.refused_gpus
        floor = gpus_of({r: self.config.min_endpoint_for(r) for r in status.roles}, per)
        urgency, why = member_urgency(
            need,
            held,
            now_s=self.now_s,
            fast_scale_up_s=self.fast_scale_up_s,
            window_s=self.config.throughput_adjustment_interval_seconds,
        )
        return MemberProposal(
            name=self.name,
            priority=self.config.pool_priority,
            floor_gpus=self.config.pool_floor_gpus,
            need_gpus=max(need, floor),
            held_gpus=held,
            urgency=urgency,
            ceiling_gpus=self.config.pool_ceiling_gpus,
            urgency_reason=why,
        )


# --- one tick of a pool -------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolTick:
    arbitration: Arbitration | None
    status: dict[str, Any]
    reclaims: dict[str, Grant]


def tick_pool(
    spec: Mapping[str, Any],
    previous_status: Mapping[str, Any],
    members: list[PoolMember],
    now: datetime.datetime,
) -> PoolTick:
    """Arbitrate the pool (the arbiter's memory read from and written to the status) and
    the status to write; a bad spec or membership is a Ready=False condition, never an
    exception that stops the operator."""
    now_s = now.timestamp()
    stamp = now.isoformat()
    waiting = sorted(m.name for m in members if m.status is None)
    if waiting:
        # a member not read yet holds GPUs the pool cannot count: grant nothing new (the
        # grants stand, a member without one does not grow) until every member is read
        message = f"waiting for the first reading of {', '.join(waiting)}"
        return PoolTick(
            None,
            {
                "lastArbitrationTime": stamp,
                "memberCount": len(members),
                "message": message,
                "conditions": [_condition("Ready", "False", "WaitingForMembers", message, stamp)],
            },
            {},
        )
    try:
        limits = pool_spec(spec).limits
        proposals = [p for p in (m.proposal() for m in members) if p is not None]
        memory = ArbiterMemory.from_dict(previous_status.get("arbiter"))
        arbitration = arbitrate(proposals, limits, memory, now_s) if proposals else None
    except FleetError as exc:
        return PoolTick(
            None,
            {
                "lastArbitrationTime": stamp,
                "message": str(exc),
                "conditions": [_condition("Ready", "False", "InvalidPool", str(exc), stamp)],
            },
            {},
        )
    grants = arbitration.grants if arbitration is not None else {}
    urgency = {p.name: p.urgency_reason for p in proposals}
    reclaims = {}
    for m in members:
        grant = grants.get(m.name)
        m.connector.grant = grant
        if grant is not None and grant.reclaiming:
            reclaims[m.name] = grant
    member_status = {
        name: {
            "allocated": g.gpus,
            "requested": g.need_gpus,
            "held": g.held_gpus,
            "borrowed": g.borrowed_gpus,
            "floor": g.floor_gpus,
            "priority": g.priority,
            "reason": g.reason.value,
            "message": f"{g.message}; {urgency[name]}" if urgency.get(name) else g.message,
        }
        for name, g in grants.items()
    }
    allocated = sum(g.gpus for g in grants.values())
    held = sum(g.held_gpus for g in grants.values())
    message = f"{allocated} GPUs allocated, {held} held, of {limits.max_total_gpus}"
    status = {
        "lastArbitrationTime": stamp,
        "members": member_status,
        "memberCount": len(members),
        "totalAllocated": allocated,
        "totalHeld": held,
        "totalBorrowed": sum(g.borrowed_gpus for g in grants.values()),
        "message": message,
        "arbiter": arbitration.memory.to_dict() if arbitration is not None else {},
        "conditions": [_condition("Ready", "True", "Arbitrated", message, stamp)],
    }
    return PoolTick(arbitration, status, reclaims)


def _condition(kind: str, status: str, reason: str, message: str, stamp: str) -> dict[str, str]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message[:1024],
        "lastTransitionTime": stamp,
    }


# --- the CRD ------------------------------------------------------------------------------------


def pool_crd(group: str, version: str, structural: Any) -> dict[str, Any]:
    """The PlannerPool CRD, its spec generated from :class:`PoolSpec` (``structural`` turns
    a pydantic field schema into a Kubernetes structural one: ``operator.crd``'s rule)."""
    schema = PoolSpec.model_json_schema(by_alias=True)
    properties = {}
    for key, field_schema in schema["properties"].items():
        out = structural(key, field_schema)
        default = field_schema.get("default")
        if default is not None:
            out["description"] = f"{out.get('description', '')} Default: {default}.".strip()
        properties[key] = out
    member = {
        "type": "object",
        "properties": {
            "allocated": {"type": "integer", "description": "GPUs granted."},
            "requested": {"type": "integer", "description": "GPUs its planner wants."},
            "held": {"type": "integer", "description": "GPUs it holds (starting included)."},
            "borrowed": {"type": "integer", "description": "GPUs granted above its floor."},
            "floor": {"type": "integer"},
            "priority": {"type": "integer"},
            "reason": {"type": "string"},
            "message": {"type": "string"},
        },
    }
    status = {
        "type": "object",
        "properties": {
            "lastArbitrationTime": {"type": "string", "format": "date-time"},
            "members": {
                "type": "object",
                "description": "Per member (policy name): its grant and why.",
                "additionalProperties": member,
            },
            "memberCount": {"type": "integer"},
            "totalAllocated": {"type": "integer"},
            "totalHeld": {"type": "integer"},
            "totalBorrowed": {"type": "integer"},
            "message": {"type": "string"},
            "arbiter": {
                "type": "object",
                "description": "The arbiter's memory (grants, windows), kept across restarts.",
                "x-kubernetes-preserve-unknown-fields": True,
            },
            "conditions": conditions_schema(),
        },
    }
    columns = [
        {"name": "Max", "type": "integer", "jsonPath": ".spec.maxTotalGpus"},
        {"name": "Allocated", "type": "integer", "jsonPath": ".status.totalAllocated"},
        {"name": "Held", "type": "integer", "jsonPath": ".status.totalHeld"},
        {"name": "Borrowed", "type": "integer", "jsonPath": ".status.totalBorrowed"},
        {"name": "Members", "type": "integer", "jsonPath": ".status.memberCount"},
        {
            "name": "Ready",
            "type": "string",
            "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
        },
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        {"name": "Message", "type": "string", "jsonPath": ".status.message", "priority": 1},
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{POOL_PLURAL}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {
                "kind": POOL_KIND,
                "listKind": f"{POOL_KIND}List",
                "plural": POOL_PLURAL,
                "singular": POOL_SINGULAR,
                "shortNames": list(POOL_SHORT_NAMES),
                "categories": ["dynamo"],
            },
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "A GPU pool shared by the PlannerPolicies that name it.",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": {
                                    "type": "object",
                                    "required": ["maxTotalGpus"],
                                    "properties": properties,
                                },
                                "status": status,
                            },
                        }
                    },
                }
            ],
        },
    }


# --- the operator's handler ---------------------------------------------------------------------


MembersOf = Callable[[str, str], list[PoolMember]]


def register_pool_handlers(
    registry: kopf.OperatorRegistry,
    *,
    group: str,
    version: str,
    members_of: MembersOf,
    period_s: float = POOL_PERIOD_S,
    labels: Mapping[str, str] | None = None,
) -> None:
    """A timer per PlannerPool (those with ``labels``, for a sharded operator): arbitrate
    its members every ``period_s``, scale a member holding more than its grant down to it,
    write the pool's status."""

    @kopf.timer(
        group,
        version,
        POOL_PLURAL,
        id="pool",
        interval=period_s,
        registry=registry,
        labels=dict(labels) if labels else None,
    )
    async def pool_timer(
        namespace: str | None,
        name: str,
        spec: kopf.Spec,
        status: kopf.Status,
        patch: kopf.Patch,
        **_: Any,
    ) -> None:
        assert namespace is not None  # PlannerPool is namespaced
        members = members_of(namespace, name)
        now = datetime.datetime.now(datetime.UTC)
        tick = tick_pool(dict(spec), dict(status), members, now)
        for key, value in tick.status.items():
            patch.status[key] = value
        for member in members:
            grant = tick.reclaims.get(member.name)
            if grant is None or member.status is None:
                continue
            await _reclaim(member, grant, f"{namespace}/{name}")


async def _reclaim(member: PoolMember, grant: Grant, pool: str) -> None:
    """Scale ``member`` down to its grant (drained as any scale-down)."""
    assert member.status is not None
    status = member.status
    per = {r: s.gpus_per_replica for r, s in status.roles.items()}
    current = {r: status.desired(r) for r in status.roles}
    floors = {r: member.config.min_endpoint_for(r) for r in status.roles}
    target = fit_to_grant(current, current, gpus_per_replica=per, floors=floors, grant=grant)
    if target == current:
        return
    log.info(
        "%s %s: reclaiming for pool %s: %s (%s)", POOL_KIND, member.name, pool, target,
        grant.message,
    )  # fmt: skip
    try:
        await member.connector.inner.set_replicas(target, blocking=False)
    except Exception as exc:  # the next tick retries; the pool never stops on one member
        log.warning("%s %s: reclaim for pool %s failed: %s", POOL_KIND, member.name, pool, exc)
