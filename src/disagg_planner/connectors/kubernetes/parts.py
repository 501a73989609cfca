"""What the parts of the DGD connector share: its settings, one read of the DGD, the record
of its own writes the watch cache must show, and the state every part reads and changes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from disagg_planner.connectors.base import (
    ConnectorSettings,
    Hold,
    HoldReason,
    ManualOverride,
    WorkerLoads,
)
from disagg_planner.connectors.dgd_shape import (
    ResolvedService,
)
from disagg_planner.connectors.kubernetes.api import (
    DgdApi,
)
from disagg_planner.connectors.kubernetes.cache import WatchCaches, WatchedResource, version_number
from disagg_planner.connectors.kubernetes.state import (
    STATE_ANNOTATION,
)

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


@dataclass(frozen=True)
class _Observation:
    """One read of the DGD (and its adapters) for the roles this planner scales."""

    dgd: Mapping[str, Any]
    services: Mapping[str, ResolvedService]
    adapters: Mapping[str, str | None]  # role -> adapter name, None: patch the DGD
    desired: Mapping[str, int]
    ready: Mapping[str, int]


# --- the connector ----------------------------------------------------------------------------


class ConnectorParts:
    """What the parts of :class:`KubernetesConnector` share: its state (set in its
    ``__init__``) and the steps one part calls in another."""

    _settings: KubernetesSettings
    dgd_name: str
    namespace: str
    _ref: str
    _roles: tuple[str, ...]
    _api: DgdApi
    _clock: Callable[[], float]
    _wall: Callable[[], float]
    _sleep: Callable[[float], Awaitable[None]]
    _lock: asyncio.Lock
    _hold_s: float
    _expected: dict[str, int]
    _pending: dict[str, int]
    _holds: dict[str, Hold]
    _last_overrides: tuple[ManualOverride, ...]
    _uid: str | None
    _role_services: dict[str, str]
    _instance: str
    _restored: bool
    _last_action: tuple[float, dict[str, int]] | None
    _resumed_wait: tuple[float, dict[str, int]] | None
    _worker_loads: WorkerLoads | None
    _caches: WatchCaches | None
    _watched: dict[str, WatchedResource]
    _written: dict[str, _OwnWrite]
    _claim_gpus: dict[str, int]  # ResourceClaimTemplate -> GPUs of one claim
    _deployment_callbacks: list[Callable[[], None]]
    _relay: Callable[[], None] | None

    async def _observe(self) -> _Observation:
        raise NotImplementedError

    def _follow_version(self) -> None:
        raise NotImplementedError

    def _deployment_changed(self) -> None:
        raise NotImplementedError

    def _active_holds(self) -> dict[str, Hold]:
        raise NotImplementedError

    def _note_write(
        self, plural: str, name: str, answer: Any, shows: Callable[[Mapping[str, Any]], bool]
    ) -> None:
        raise NotImplementedError

    async def _write(
        self, obs: _Observation, writes: Mapping[str, int], *, marked: bool = False
    ) -> None:
        raise NotImplementedError

    def _state_json(self) -> str:
        raise NotImplementedError

    async def _record_state(self) -> None:
        raise NotImplementedError

    def _restore(self, dgd: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def _follow_resumed_wait(self, obs: _Observation) -> None:
        raise NotImplementedError
