"""Virtual connector: Dynamo's decision-id protocol for orchestrators other than Kubernetes.

The planner publishes a decision ``(num_prefill, num_decode, decision_id)``; the external
system applies it and acknowledges by writing ``scaled_decision_id``. The planner issues its
next decision only after the acknowledgement (``scaled_decision_id >= decision_id``) or once
``scaling_max_wait_seconds`` (default 1800 s) passed since the decision, as in Dynamo.

etcd keys (``{root}`` = ``{virtual_etcd_key_prefix}/{namespace}/planner``, e.g.
``v1/dynamo/planner``):

- ``{root}/scaling_decision``: JSON ``{"num_prefill_workers", "num_decode_workers",
  "decision_id"}`` (Dynamo's newer atomic record);
- ``{root}/num_prefill_workers``, ``{root}/num_decode_workers``, ``{root}/decision_id``:
  the same as decimal integers (Dynamo's legacy keys), written in the same transaction so
  that old readers keep working; readers use them only when the record is absent;
- ``{root}/scaled_decision_id``: decimal integer written by the external system.

``decision_id`` starts at 0 and rises by one per decision; -1 means none yet. A restarted
planner continues from the stored id. Roles map to counts: ``prefill`` to
``num_prefill_workers``; ``decode`` and ``agg`` to ``num_decode_workers``. With
``advisory`` nothing is published.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from disagg_planner.connectors.base import (
    ConnectorDefaults,
    ConnectorSettings,
    Hold,
    HoldReason,
    ScaleOutcome,
    advisory_holds,
    check_replicas,
)
from disagg_planner.connectors.etcd import EtcdGateway, KeyValue, ModRevisionIs, Put
from disagg_planner.core.types import DeploymentStatus, RoleStatus
from disagg_planner.errors import ConnectorError

log = logging.getLogger(__name__)

RECORD_KEY = "scaling_decision"
LEGACY_PREFILL_KEY = "num_prefill_workers"
LEGACY_DECODE_KEY = "num_decode_workers"
LEGACY_ID_KEY = "decision_id"
SCALED_ID_KEY = "scaled_decision_id"
NO_DECISION = -1


@dataclass(frozen=True, kw_only=True)
class VirtualSettings(ConnectorSettings):
    """What the virtual connector reads, built by the application from its config
    (:func:`disagg_planner.runtime.connector_settings.virtual_settings`)."""

    namespace: str  # the Dynamo namespace: part of the key root
    etcd_endpoint: str  # etcd client URL (its v3 JSON gateway)
    etcd_key_prefix: str  # root of the keys: {prefix}/{namespace}/planner/...
    etcd_timeout_s: float  # of one etcd request


@dataclass(frozen=True)
class ScalingDecision:
    """One decision of the planner: worker counts and its id (rising from 0)."""

    num_prefill: int
    num_decode: int
    decision_id: int


def key_root(key_prefix: str, namespace: str) -> str:
    """The directory of the protocol's keys, without a trailing slash."""
    return f"{key_prefix.strip('/')}/{namespace}/planner"


@dataclass(frozen=True)
class _Snapshot:
    """The protocol's keys as read at one etcd revision."""

    revision: int
    decision: ScalingDecision | None
    record_revision: int  # mod revision of the record key, 0 when absent
    scaled_decision_id: int
    scaled_revision: int  # mod revision of scaled_decision_id, 0 when absent

    @property
    def decision_id(self) -> int:
        return self.decision.decision_id if self.decision else NO_DECISION

    @property
    def acknowledged(self) -> bool:
        return self.scaled_decision_id >= self.decision_id


def _int_value(kv: KeyValue) -> int:
    try:
        return int(kv.value.decode().strip())
    except ValueError:
        raise ConnectorError(f"etcd key {kv.key} = {kv.value!r}, expected an integer") from None


def _decode_record(kv: KeyValue) -> ScalingDecision:
    try:
        data = json.loads(kv.value)
        decision = ScalingDecision(
            num_prefill=int(data["num_prefill_workers"]),
            num_decode=int(data["num_decode_workers"]),
            decision_id=int(data["decision_id"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise ConnectorError(
            f"etcd key {kv.key} = {kv.value!r}, expected JSON with integer "
            f"num_prefill_workers, num_decode_workers and decision_id ({exc})"
        ) from None
    return decision


def _read_snapshot(gateway: EtcdGateway, root: str) -> _Snapshot:
    revision, kvs = gateway.range_prefix(root + "/")
    record = kvs.get(f"{root}/{RECORD_KEY}")
    decision: ScalingDecision | None = None
    if record is not None:
        decision = _decode_record(record)
    elif f"{root}/{LEGACY_ID_KEY}" in kvs:
        legacy_id = _int_value(kvs[f"{root}/{LEGACY_ID_KEY}"])
        if legacy_id > NO_DECISION:
            prefill = kvs.get(f"{root}/{LEGACY_PREFILL_KEY}")
            decode = kvs.get(f"{root}/{LEGACY_DECODE_KEY}")
            decision = ScalingDecision(
                num_prefill=_int_value(prefill) if prefill else 0,
                num_decode=_int_value(decode) if decode else 0,
                decision_id=legacy_id,
            )
    scaled = kvs.get(f"{root}/{SCALED_ID_KEY}")
    return _Snapshot(
        revision=revision,
        decision=decision,
        record_revision=record.mod_revision if record else 0,
        scaled_decision_id=_int_value(scaled) if scaled else NO_DECISION,
        scaled_revision=scaled.mod_revision if scaled else 0,
    )


class VirtualConnector(ConnectorDefaults):
    """The planner's side of the decision-id protocol (see the module docstring).

    ``clock`` (monotonic s) and ``sleep`` are injectable for tests.
    """

    def __init__(
        self,
        settings: VirtualSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._settings = settings
        self._roles = settings.roles
        self.root = key_root(settings.etcd_key_prefix, settings.namespace)
        self._gateway = EtcdGateway(settings.etcd_endpoint, timeout_s=settings.etcd_timeout_s)
        self._clock = clock
        self._sleep = sleep
        self._lock = asyncio.Lock()
        self._max_wait_s = settings.scaling_max_wait_s
        self._snapshot: _Snapshot | None = None
        # When the planner first saw the current decision unacknowledged (monotonic s).
        self._unacked_since: tuple[int, float] | None = None
        # Counts of the newest acknowledged decision: what the external system runs.
        self._acked: ScalingDecision | None = None

    @property
    def model_name(self) -> str | None:
        return self._settings.model_name

    async def validate(self) -> None:
        """Check that etcd answers and its keys are well-formed; no deployment to inspect."""
        await self._refresh()
        for role in self._roles:
            if role not in self._settings.gpus_per_replica:
                log.warning(
                    "virtual connector: GPUs per %s replica not configured; counting 1", role
                )

    async def status(self) -> DeploymentStatus:
        """Desired: the latest decision's counts. Ready: the newest acknowledged decision's
        counts (0 before any acknowledgement seen by this planner)."""
        snap = await self._refresh()
        desired = snap.decision or ScalingDecision(0, 0, NO_DECISION)
        ready = self._acked or ScalingDecision(0, 0, NO_DECISION)
        return DeploymentStatus(
            roles={
                role: RoleStatus(
                    desired=self._count(desired, role),
                    ready=self._count(ready, role),
                    gpus_per_replica=self._settings.gpus_per_replica.get(role) or 1,
                )
                for role in self._roles
            }
        )

    async def set_replicas(
        self, replicas: Mapping[str, int], *, blocking: bool = False
    ) -> ScaleOutcome:
        targets = check_replicas(replicas, self._roles)
        async with self._lock:
            snap = await self._refresh()
            current = snap.decision or ScalingDecision(0, 0, NO_DECISION)
            prefill = targets.get("prefill", current.num_prefill)
            decode = targets.get("decode", targets.get("agg", current.num_decode))
            changed = {r: n for r, n in targets.items() if self._count(current, r) != n}
            if snap.decision is not None and not changed:
                return ScaleOutcome(requested=dict(targets), unchanged=tuple(targets))
            if self._settings.advisory:
                return ScaleOutcome(
                    requested=dict(targets),
                    unchanged=tuple(r for r in targets if r not in changed),
                    held=advisory_holds(changed),
                )
            holds = self._ack_holds(snap)
            if holds:
                detail = next(iter(holds.values())).detail
                log.info("virtual connector: not publishing %s: %s", dict(targets), detail)
                return ScaleOutcome(
                    requested=dict(targets), held={role: holds[role] for role in targets}
                )
            if not snap.acknowledged:
                log.warning(
                    "virtual connector: decision %d not acknowledged within %g s; "
                    "publishing the next one anyway",
                    snap.decision_id,
                    self._max_wait_s,
                )
            decision = ScalingDecision(prefill, decode, snap.decision_id + 1)
            await self._publish(snap, decision)
        ready = None
        if blocking:
            ready = await self.wait_until_ready(self._max_wait_s)
        return ScaleOutcome(
            requested=dict(targets),
            applied=changed,
            unchanged=tuple(r for r in targets if r not in changed),
            ready=ready,
        )

    async def wait_until_ready(self, timeout_s: float) -> bool:
        """Poll until the latest decision is acknowledged; False after ``timeout_s``."""
        deadline = self._clock() + timeout_s
        while True:
            snap = await self._refresh()
            if snap.acknowledged:
                return True
            remaining = deadline - self._clock()
            if remaining <= 0:
                return False
            await self._sleep(min(self._settings.scaling_check_interval_s, remaining))

    def holds(self) -> Mapping[str, Hold]:
        return self._ack_holds(self._snapshot) if self._snapshot else {}

    async def close(self) -> None:
        return None

    # --- internals --------------------------------------------------------------------------

    @staticmethod
    def _count(decision: ScalingDecision, role: str) -> int:
        return decision.num_prefill if role == "prefill" else decision.num_decode

    async def _refresh(self) -> _Snapshot:
        snap = await asyncio.to_thread(_read_snapshot, self._gateway, self.root)
        self._snapshot = snap
        if snap.decision is not None and snap.acknowledged:
            self._acked = snap.decision
            self._unacked_since = None
        elif snap.decision is not None and (
            self._unacked_since is None or self._unacked_since[0] != snap.decision_id
        ):
            self._unacked_since = (snap.decision_id, self._clock())
        return snap

    def _ack_holds(self, snap: _Snapshot) -> dict[str, Hold]:
        """Every role is held while the latest decision is unacknowledged and younger than
        the max wait."""
        if snap.acknowledged or self._unacked_since is None:
            return {}
        until = self._unacked_since[1] + self._max_wait_s
        if self._clock() >= until:
            return {}
        detail = (
            f"decision {snap.decision_id} not acknowledged yet "
            f"(scaled_decision_id={snap.scaled_decision_id})"
        )
        return {
            role: Hold(role, HoldReason.AWAITING_ACKNOWLEDGEMENT, detail, until)
            for role in self._roles
        }

    async def _publish(self, snap: _Snapshot, decision: ScalingDecision) -> None:
        record = json.dumps(
            {
                "num_prefill_workers": decision.num_prefill,
                "num_decode_workers": decision.num_decode,
                "decision_id": decision.decision_id,
            }
        ).encode()
        puts = [
            Put(f"{self.root}/{RECORD_KEY}", record),
            Put(f"{self.root}/{LEGACY_PREFILL_KEY}", str(decision.num_prefill).encode()),
            Put(f"{self.root}/{LEGACY_DECODE_KEY}", str(decision.num_decode).encode()),
            Put(f"{self.root}/{LEGACY_ID_KEY}", str(decision.decision_id).encode()),
        ]
        # Compare-and-swap on the record: two planners on one graph must not both publish.
        guard = [ModRevisionIs(f"{self.root}/{RECORD_KEY}", snap.record_revision)]
        applied = await asyncio.to_thread(self._gateway.txn, guard, puts)
        if not applied:
            raise ConnectorError(
                f"etcd key {self.root}/{RECORD_KEY} changed while publishing decision "
                f"{decision.decision_id}: is another planner driving namespace "
                f"'{self._settings.namespace}'?"
            )
        self._unacked_since = (decision.decision_id, self._clock())
        log.info(
            "virtual connector: published decision %d (prefill=%d, decode=%d)",
            decision.decision_id,
            decision.num_prefill,
            decision.num_decode,
        )


class ExternalScalerClient:
    """The external system's side: read the planner's decisions and acknowledge them.

    Typical loop::

        client = ExternalScalerClient("http://etcd:2379", "dynamo")
        while True:
            decision = await client.wait()
            scale_my_workers(decision.num_prefill, decision.num_decode)
            await client.complete(decision)
    """

    def __init__(
        self,
        etcd_url: str,
        namespace: str,
        *,
        key_prefix: str = "v1",
        timeout_s: float = 5.0,
        watch_slice_s: float = 1.0,
    ) -> None:
        self.root = key_root(key_prefix, namespace)
        self._gateway = EtcdGateway(etcd_url, timeout_s=timeout_s)
        # A watch is re-opened this often, which bounds how long a cancelled wait() keeps its
        # worker thread.
        self._watch_slice_s = watch_slice_s

    async def get(self) -> ScalingDecision | None:
        """The planner's latest decision, or None before its first."""
        snap = await asyncio.to_thread(_read_snapshot, self._gateway, self.root)
        return snap.decision

    async def wait(self, timeout_s: float | None = None) -> ScalingDecision:
        """The latest decision once it is not acknowledged yet (at once if it already waits).

        Raises TimeoutError when ``timeout_s`` passes first.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            snap = await asyncio.to_thread(_read_snapshot, self._gateway, self.root)
            if snap.decision is not None and not snap.acknowledged:
                return snap.decision
            slice_s = self._watch_slice_s
            if deadline is not None:
                slice_s = min(slice_s, deadline - time.monotonic())
                if slice_s <= 0:
                    raise TimeoutError(f"no new decision under {self.root} within {timeout_s:g} s")
            await asyncio.to_thread(
                self._gateway.watch, self.root + "/", snap.revision + 1, slice_s
            )

    async def complete(self, decision: ScalingDecision) -> None:
        """Acknowledge ``decision``: ``scaled_decision_id`` rises to its id (never falls)."""
        key = f"{self.root}/{SCALED_ID_KEY}"
        for _ in range(10):
            snap = await asyncio.to_thread(_read_snapshot, self._gateway, self.root)
            if decision.decision_id > snap.decision_id:
                raise ValueError(
                    f"decision {decision.decision_id} was never issued "
                    f"(latest is {snap.decision_id})"
                )
            if snap.scaled_decision_id >= decision.decision_id:
                return
            # Compare-and-swap against the value just read, so the id can only rise.
            applied = await asyncio.to_thread(
                self._gateway.txn,
                [ModRevisionIs(key, snap.scaled_revision)],
                [Put(key, str(decision.decision_id).encode())],
            )
            if applied:
                return
        raise ConnectorError(f"etcd key {key}: could not acknowledge: it keeps changing")
