"""Elastic expert parallelism: resize a running vLLM engine's data-parallel group.

Three pieces:

- :class:`VllmElasticEpAdmin`, a client of vLLM's admin API on the engine's API server
  (unauthenticated admin endpoints: keep them on the cluster network)::

      POST /scale_elastic_ep {"new_data_parallel_size": N, "drain_timeout": S}
        200 {"message": "Scaled to N data parallel engines"}   the resize is complete
        400 bad JSON, a non-positive integer, or the engine refused the size (ValueError)
        408 in-flight requests did not drain within S seconds; the engine keeps its size
        500 "Scale failed" (any other engine error)
        503 while a resize runs, older vLLM answers every request so (ScalingMiddleware)
      POST /is_scaling_elastic_ep -> {"is_scaling_elastic_ep": true|false}

  The resize call answers when the resize is over (seconds to minutes); asking for the
  current size is a no-op.
- :class:`ElasticEpKubernetes`, the DGD connector plus the elastic-EP *follower* service of
  Dynamo's design (operator-elastic-ep-follower): follower pods parked at 0 replicas, each
  bringing ``elastic_ep_dp_step`` DP ranks, so ``DP = elastic_ep_min_dp + followers x step``.
  It scales the followers (through their DGDSA ``/scale`` when one exists, else a merge patch
  of ``spec.services.<follower>.replicas``) and keeps the progress of a resize in the DGD
  annotation ``planner.nvidia.com/elastic-ep-resize``, a condition-like JSON record.
- :class:`ElasticEpController`, single-flight resizes of one engine:

  - grow: record ``AddingFollowers``; raise the followers; wait until they are ready
    (``scaling_max_wait_seconds``, else lower them again); record ``Resizing``; call the
    resize; clear the record;
  - shrink: record ``Resizing``; call the resize; record ``RemovingFollowers``; lower the
    followers; clear the record;
  - a refused resize (400, 408, 500) rolls the followers back and raises a typed error;
  - never two resizes at once: callers queue on a lock, and a resize the engine reports in
    flight (someone else's) is waited for (``elastic_ep_resize_timeout_seconds``);
  - a resize call that gets no answer in ``elastic_ep_resize_timeout_seconds`` (or loses its
    connection) is followed through ``/is_scaling_elastic_ep`` and then re-issued once: a
    completed resize makes it a no-op;
  - :meth:`ElasticEpController.recover` (called by every resize, and by a restarted
    controller) finishes or rolls back what the record says was in progress: followers not
    ready by the recorded deadline are lowered again; an interrupted resize call is waited
    for and re-issued; an interrupted follower removal is completed. A resize whose outcome
    stays unknown keeps its record (with the reason in ``message``), so nothing is left
    half-done without a record saying so.

Only the planner is assumed to change the follower replicas: the engine's DP size is not
observable through vLLM's API, so it is derived from the followers and the record.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Protocol

from kubernetes import client as k8s_client

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.connectors.kubernetes import (
    DGD_GROUP,
    DGD_PLURAL,
    DGD_VERSION,
    DGDSA_PLURAL,
    KubernetesConnector,
    dgd_services,
    ready_count,
)
from disagg_planner.errors import ConnectorError, DeploymentError

log = logging.getLogger(__name__)

SCALE_PATH = "/scale_elastic_ep"
IS_SCALING_PATH = "/is_scaling_elastic_ep"
RECORD_ANNOTATION = "planner.nvidia.com/elastic-ep-resize"
RECORD_TYPE = "ElasticEpResizing"
# How often the controller asks /is_scaling_elastic_ep while it waits on a resize (s).
DEFAULT_POLL_S = 5.0
# 503 answers (another resize started between our check and our call) waited out per call.
MAX_BUSY_RETRIES = 3


# --- errors -----------------------------------------------------------------------------------


class ElasticEpError(ConnectorError):
    """A resize did not happen as asked; the message says what state the engine is in."""


class ResizeRefused(ElasticEpError):
    """The engine answered 400 or 500: it did not resize and keeps its old size."""

    def __init__(self, message: str, *, status: int, detail: str) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail


class DrainTimeout(ElasticEpError):
    """The engine answered 408: in-flight requests did not drain within ``drain_timeout``;
    the engine keeps its old size."""


class ResizeInFlight(ElasticEpError):
    """The engine is resizing (someone else's resize) and did not finish in time."""


class ResizeOutcomeUnknown(ElasticEpError):
    """No answer to a resize and the engine never reported it finished; the record stays."""


class FollowersNotReady(ElasticEpError):
    """The follower pods a grow needs were not ready in time; they were lowered again."""


class _NoAnswer(Exception):
    """The resize call timed out or lost its connection: the outcome is unknown."""


# --- the admin API client ---------------------------------------------------------------------


def _detail(body: bytes) -> str:
    """The human part of a vLLM error body (FastAPI's ``detail`` or the middleware's ``error``)."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        parsed = json.loads(text)
    except ValueError:
        return text[:300]
    if isinstance(parsed, Mapping):
        for key in ("detail", "error", "message"):
            value = parsed.get(key)
            if isinstance(value, str):
                return value
            if isinstance(value, Mapping) and isinstance(value.get("message"), str):
                return str(value["message"])
    return text[:300]


def _hint(status: int) -> str:
    if status == 404:
        return (
            " (the server has no elastic-EP endpoints: vLLM must run with --enable-elastic-ep "
            "--enable-eplb, and elastic_ep_admin_url must name its API server)"
        )
    return ""


class VllmElasticEpAdmin:
    """Client of one vLLM API server's elastic-EP endpoints (see the module doc).

    ``status_timeout_s`` bounds ``/is_scaling_elastic_ep``; a resize call's timeout is given
    per call. Blocking I/O runs in worker threads.
    """

    def __init__(self, base_url: str, *, status_timeout_s: float = 10.0) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"admin URL must be http:// or https://, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.status_timeout_s = status_timeout_s

    def _post(self, path: str, body: Mapping[str, Any] | None, timeout_s: float) -> bytes:
        data = json.dumps(body if body is not None else {}).encode()
        request = urllib.request.Request(
            self.base_url + path,
            data=data,
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            payload: bytes = response.read()
            return payload

    def _is_scaling(self) -> bool:
        where = f"POST {self.base_url}{IS_SCALING_PATH}"
        try:
            body = self._post(IS_SCALING_PATH, None, self.status_timeout_s)
        except urllib.error.HTTPError as exc:
            if exc.code == 503:
                return True  # older vLLM: the scaling middleware answers everything with 503
            raise ConnectorError(
                f"{where}: HTTP {exc.code}: {_detail(exc.read())}{_hint(exc.code)}"
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            raise ConnectorError(f"{where}: cannot reach the engine: {exc}") from None
        try:
            value = json.loads(body).get("is_scaling_elastic_ep")
        except (ValueError, AttributeError):
            value = None
        if not isinstance(value, bool):
            raise ConnectorError(
                f"{where}: expected {{'is_scaling_elastic_ep': bool}}, got {body[:200]!r}"
            )
        return value

    def _scale(self, new_dp: int, drain_timeout_s: int, timeout_s: float) -> str:
        where = f"POST {self.base_url}{SCALE_PATH} new_data_parallel_size={new_dp}"
        body = {"new_data_parallel_size": new_dp, "drain_timeout": drain_timeout_s}
        try:
            answer = self._post(SCALE_PATH, body, timeout_s)
        except urllib.error.HTTPError as exc:
            detail = _detail(exc.read())
            if exc.code == 408:
                raise DrainTimeout(
                    f"{where}: 408: in-flight requests did not drain within {drain_timeout_s} s "
                    f"({detail}); the engine keeps its size"
                ) from None
            if exc.code == 503:
                raise ResizeInFlight(f"{where}: 503: the engine is resizing ({detail})") from None
            if exc.code in (400, 500):
                meaning = "rejected the request" if exc.code == 400 else "failed to resize"
                raise ResizeRefused(
                    f"{where}: {exc.code}: the engine {meaning} ({detail}); it keeps its size",
                    status=exc.code,
                    detail=detail,
                ) from None
            raise ElasticEpError(
                f"{where}: unexpected HTTP {exc.code}: {detail}{_hint(exc.code)}"
            ) from None
        except TimeoutError as exc:
            raise _NoAnswer(f"{where}: no answer within {timeout_s:g} s ({exc})") from None
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, TimeoutError):
                raise _NoAnswer(f"{where}: no answer within {timeout_s:g} s") from None
            if isinstance(reason, ConnectionRefusedError):
                raise ConnectorError(f"{where}: cannot reach the engine: {reason}") from None
            raise _NoAnswer(f"{where}: connection lost: {reason}") from None
        except (ConnectionError, OSError) as exc:
            raise _NoAnswer(f"{where}: connection lost: {exc}") from None
        try:
            message = json.loads(answer).get("message")
        except (ValueError, AttributeError):
            message = None
        return message if isinstance(message, str) else answer.decode(errors="replace")[:200]

    async def is_scaling(self) -> bool:
        """Whether the engine is resizing now. Raises ConnectorError when unreachable."""
        return await asyncio.to_thread(self._is_scaling)

    async def scale(self, new_dp: int, *, drain_timeout_s: int, timeout_s: float) -> str:
        """Resize to ``new_dp`` ranks and return vLLM's message once the resize is done.

        Raises :class:`ResizeRefused` (400/500), :class:`DrainTimeout` (408),
        :class:`ResizeInFlight` (503), ConnectorError when unreachable; an internal
        ``_NoAnswer`` when the outcome is unknown (the controller handles it).
        """
        if isinstance(new_dp, bool) or not isinstance(new_dp, int) or new_dp < 1:
            raise ValueError(f"new_data_parallel_size must be an integer >= 1, got {new_dp!r}")
        if isinstance(drain_timeout_s, bool) or drain_timeout_s < 1:
            raise ValueError(f"drain_timeout must be an integer >= 1, got {drain_timeout_s!r}")
        return await asyncio.to_thread(self._scale, new_dp, int(drain_timeout_s), timeout_s)


# --- the progress record ----------------------------------------------------------------------


class ResizePhase(StrEnum):
    """Where a resize stands (the record's ``reason``)."""

    ADDING_FOLLOWERS = "AddingFollowers"
    RESIZING = "Resizing"
    REMOVING_FOLLOWERS = "RemovingFollowers"


@dataclass(frozen=True)
class ResizeRecord:
    """The progress of one resize, kept where a restarted controller finds it.

    Times are wall-clock epoch seconds; ``deadline_s`` is when followers being added must be
    ready.
    """

    phase: ResizePhase
    from_dp: int
    to_dp: int
    from_followers: int
    to_followers: int
    started_s: float
    deadline_s: float
    message: str = ""

    @property
    def grow(self) -> bool:
        return self.to_dp > self.from_dp

    def to_json(self) -> str:
        return json.dumps(
            {
                "type": RECORD_TYPE,
                "status": "True",
                "reason": self.phase.value,
                "message": self.message,
                "fromDp": self.from_dp,
                "toDp": self.to_dp,
                "fromFollowers": self.from_followers,
                "toFollowers": self.to_followers,
                "startedAt": self.started_s,
                "deadline": self.deadline_s,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str, *, where: str) -> ResizeRecord:
        """Parse a record; DeploymentError naming ``where`` and the bad key otherwise."""
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise DeploymentError(f"{where}: not JSON ({exc}): {text[:200]!r}") from None
        if not isinstance(raw, Mapping):
            raise DeploymentError(f"{where}: expected a JSON object, got {text[:200]!r}")
        try:
            phase = ResizePhase(str(raw.get("reason")))
        except ValueError:
            known = ", ".join(p.value for p in ResizePhase)
            raise DeploymentError(
                f"{where}: reason = {raw.get('reason')!r}, expected one of {known}"
            ) from None
        ints: dict[str, int] = {}
        for key in ("fromDp", "toDp", "fromFollowers", "toFollowers"):
            value = raw.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise DeploymentError(f"{where}: {key} = {value!r}, expected an integer >= 0")
            ints[key] = value
        times: dict[str, float] = {}
        for key in ("startedAt", "deadline"):
            value = raw.get(key)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise DeploymentError(f"{where}: {key} = {value!r}, expected epoch seconds")
            times[key] = float(value)
        return cls(
            phase=phase,
            from_dp=ints["fromDp"],
            to_dp=ints["toDp"],
            from_followers=ints["fromFollowers"],
            to_followers=ints["toFollowers"],
            started_s=times["startedAt"],
            deadline_s=times["deadline"],
            message=str(raw.get("message") or ""),
        )


@dataclass(frozen=True)
class FollowerObservation:
    """The follower service as the deployment reports it, and the resize record if any."""

    desired: int
    ready: int
    record: ResizeRecord | None


class FollowerPool(Protocol):
    """Where the follower pods and the resize record live (a DGD, or a test double)."""

    async def observe_followers(self) -> FollowerObservation: ...

    async def set_followers(self, replicas: int) -> None: ...

    async def write_record(self, record: ResizeRecord | None) -> None: ...


# --- Kubernetes -------------------------------------------------------------------------------


class ElasticEpKubernetes(KubernetesConnector):
    """The DGD connector plus the elastic-EP follower service ``elastic_ep_follower_service``
    and the resize record annotation (a :class:`FollowerPool`).

    Kubernetes API calls added to the connector's (same retries, errors and RBAC table, plus):
    ``patch dynamographdeployments`` for the annotation and for the follower replicas
    without an adapter, ``patch dynamographdeploymentscalingadapters/scale`` with one.
    """

    def __init__(
        self,
        config: PlannerConfig,
        *,
        api_client: k8s_client.ApiClient | None = None,
        namespace: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if not config.elastic_ep_follower_service:
            raise DeploymentError(
                "elastic EP on Kubernetes needs --elastic-ep-follower-service (the DGD service "
                "of the follower pods)"
            )
        super().__init__(
            config, api_client=api_client, namespace=namespace, clock=clock, sleep=sleep
        )
        self.follower_service: str = config.elastic_ep_follower_service
        self._adapter_name = f"{self.dgd_name}-{self.follower_service.lower()}"

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

    async def _get_adapter(self) -> Mapping[str, Any] | None:
        adapter = await self._call(
            f"get DynamoGraphDeploymentScalingAdapter {self.namespace}/{self._adapter_name}",
            "get",
            DGDSA_PLURAL,
            self._custom.get_namespaced_custom_object,
            DGD_GROUP,
            DGD_VERSION,
            self.namespace,
            DGDSA_PLURAL,
            self._adapter_name,
            allow_404=True,
        )
        if isinstance(adapter, Mapping):
            self._check_adapter(adapter, self._adapter_name, self.follower_service)
            return adapter
        return None

    async def observe_followers(self) -> FollowerObservation:
        dgd = await self._get_dgd()
        services = dgd_services(dgd, self._ref)
        service = services.get(self.follower_service)
        if service is None:
            raise DeploymentError(
                f"DynamoGraphDeployment {self._ref} has no service '{self.follower_service}' "
                f"(elastic_ep_follower_service); services: {sorted(services)}"
            )
        adapter = await self._get_adapter()
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

    async def set_followers(self, replicas: int) -> None:
        if replicas < 0:
            raise ValueError(f"follower replicas must be >= 0, got {replicas}")
        if self._config.advisory:
            log.info("advisory: not setting %s to %d replicas", self.follower_service, replicas)
            return
        adapter = await self._get_adapter()
        if adapter is not None:
            await self._call(
                f"patch scale of DynamoGraphDeploymentScalingAdapter "
                f"{self.namespace}/{self._adapter_name}",
                "patch",
                f"{DGDSA_PLURAL}/scale",
                self._custom.patch_namespaced_custom_object_scale,
                DGD_GROUP,
                DGD_VERSION,
                self.namespace,
                DGDSA_PLURAL,
                self._adapter_name,
                {"spec": {"replicas": replicas}},
                _content_type="application/merge-patch+json",
            )
        else:
            await self._patch_dgd(
                {"spec": {"services": {self.follower_service: {"replicas": replicas}}}},
                what=f"follower replicas of {self.follower_service}",
            )
        log.info("DGD %s: %s -> %d follower replicas", self._ref, self.follower_service, replicas)

    async def write_record(self, record: ResizeRecord | None) -> None:
        if self._config.advisory:
            return
        value = record.to_json() if record is not None else None  # null removes it
        await self._patch_dgd(
            {"metadata": {"annotations": {RECORD_ANNOTATION: value}}},
            what="elastic-EP resize record",
        )

    async def _patch_dgd(self, body: Mapping[str, Any], *, what: str) -> None:
        await self._call(
            f"patch DynamoGraphDeployment {self._ref} ({what})",
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


# --- the controller ---------------------------------------------------------------------------


class ResizeOutcome(StrEnum):
    RESIZED = "resized"
    UNCHANGED = "unchanged"
    ROLLED_BACK = "rolled_back"


@dataclass(frozen=True)
class ResizeResult:
    """What a resize (or a recovery) did; ``dp`` is the engine's size afterwards."""

    outcome: ResizeOutcome
    from_dp: int
    to_dp: int
    dp: int
    message: str


class ElasticEpController:
    """Single-flight resizes of one engine (see the module doc).

    ``followers`` (a :class:`FollowerPool`, e.g. :class:`ElasticEpKubernetes`) enables the
    two-stage flow; without it only the engine is resized and ``initial_dp`` (default
    ``elastic_ep_min_dp``) is its size at start. ``clock`` (monotonic) bounds waits,
    ``wall_clock`` (epoch) stamps records, ``sleep`` waits; all injectable for tests.
    """

    def __init__(
        self,
        config: PlannerConfig,
        *,
        admin: VllmElasticEpAdmin,
        followers: FollowerPool | None = None,
        initial_dp: int | None = None,
        poll_interval_s: float = DEFAULT_POLL_S,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if config.elastic_ep is None or config.elastic_ep_max_dp is None:
            raise ValueError("ElasticEpController needs a config with elastic_ep set")
        self.config = config
        self.admin = admin
        self.followers = followers
        self.min_dp = config.elastic_ep_min_dp
        self.max_dp: int = config.elastic_ep_max_dp
        self.step = config.elastic_ep_dp_step
        self.poll_interval_s = poll_interval_s
        self._clock = clock
        self._wall = wall_clock
        self._sleep = sleep
        self._lock = asyncio.Lock()
        self._dp = initial_dp if initial_dp is not None else self.min_dp

    # --- state ----------------------------------------------------------------------------

    @property
    def in_flight(self) -> bool:
        """Whether this controller is resizing now."""
        return self._lock.locked()

    def followers_for(self, dp: int) -> int:
        return (dp - self.min_dp) // self.step

    def dp_for(self, followers: int) -> int:
        return self.min_dp + followers * self.step

    async def current_dp(self) -> int:
        """The engine's DP size as far as can be told: from the followers and the record
        (the size before a resize that is not confirmed), else the last resize's."""
        if self.followers is None:
            return self._dp
        obs = await self.followers.observe_followers()
        record = obs.record
        if record is None:
            return self.dp_for(obs.desired)
        return record.to_dp if record.phase is ResizePhase.REMOVING_FOLLOWERS else record.from_dp

    async def is_resizing(self) -> bool:
        """A resize of ours is running, one is recorded unfinished, or the engine says so."""
        if self.in_flight:
            return True
        if self.followers is not None and (await self.followers.observe_followers()).record:
            return True
        return await self.admin.is_scaling()

    # --- resize ---------------------------------------------------------------------------

    def _check_target(self, new_dp: int) -> None:
        if isinstance(new_dp, bool) or not isinstance(new_dp, int):
            raise ValueError(f"new DP size must be an integer, got {new_dp!r}")
        if not self.min_dp <= new_dp <= self.max_dp:
            raise ValueError(
                f"new DP size {new_dp} is outside [{self.min_dp}, {self.max_dp}] "
                "(elastic_ep_min_dp, elastic_ep_max_dp)"
            )
        if self.followers is not None and (new_dp - self.min_dp) % self.step:
            raise ValueError(
                f"new DP size {new_dp} is not elastic_ep_min_dp ({self.min_dp}) plus whole "
                f"followers of elastic_ep_dp_step ({self.step}) ranks"
            )

    async def resize(self, new_dp: int) -> ResizeResult:
        """Resize the engine to ``new_dp`` ranks (see the module doc for the flow).

        Waits for a resize already in flight (ours or the engine's) first. Raises
        :class:`ResizeRefused`, :class:`DrainTimeout`, :class:`FollowersNotReady` (each after
        rolling back), :class:`ResizeInFlight` or :class:`ResizeOutcomeUnknown` (the record
        stays) or ConnectorError/DeploymentError from the backends.
        """
        self._check_target(new_dp)
        async with self._lock:
            await self._recover_locked()
            await self._wait_engine_idle()
            current = await self.current_dp()
            if new_dp == current:
                return ResizeResult(
                    ResizeOutcome.UNCHANGED, current, new_dp, current, f"already at DP {current}"
                )
            if self.followers is None:
                message = await self._scale(new_dp)
                old, self._dp = self._dp, new_dp
                return ResizeResult(ResizeOutcome.RESIZED, old, new_dp, new_dp, message)
            obs = await self.followers.observe_followers()
            now = self._wall()
            record = ResizeRecord(
                phase=(ResizePhase.ADDING_FOLLOWERS if new_dp > current else ResizePhase.RESIZING),
                from_dp=current,
                to_dp=new_dp,
                from_followers=obs.desired,
                to_followers=self.followers_for(new_dp),
                started_s=now,
                deadline_s=now + self.config.scaling_max_wait_seconds,
                message=f"DP {current} -> {new_dp}",
            )
            await self.followers.write_record(record)
            log.info("elastic EP: DP %d -> %d started (%s)", current, new_dp, record.phase)
            return await self._continue(record)

    async def recover(self) -> ResizeResult | None:
        """Finish or roll back a resize recorded as unfinished (e.g. by a controller that was
        restarted); None when there was none."""
        async with self._lock:
            return await self._recover_locked()

    async def _recover_locked(self) -> ResizeResult | None:
        if self.followers is None:
            return None
        record = (await self.followers.observe_followers()).record
        if record is None:
            return None
        log.warning(
            "elastic EP: resuming an unfinished resize DP %d -> %d at %s",
            record.from_dp,
            record.to_dp,
            record.phase.value,
        )
        return await self._continue(record)

    async def _continue(self, record: ResizeRecord) -> ResizeResult:
        """Drive ``record`` from its phase to the end (or a rollback)."""
        pool = self.followers
        assert pool is not None
        if record.phase is ResizePhase.ADDING_FOLLOWERS:
            await pool.set_followers(record.to_followers)
            if not await self._wait_followers_ready(record):
                await self._roll_back(record)
                raise FollowersNotReady(
                    f"elastic EP: {record.to_followers} follower pod(s) of DP {record.to_dp} "
                    f"were not ready by the deadline ({self.config.scaling_max_wait_seconds:g} s"
                    f" after the start); followers lowered to {record.from_followers}, engine "
                    f"stays at DP {record.from_dp}"
                )
            record = replace(record, phase=ResizePhase.RESIZING)
            await pool.write_record(record)
        if record.phase is ResizePhase.RESIZING:
            try:
                await self._wait_engine_idle()  # e.g. the call a restarted controller made
                message = await self._scale(record.to_dp)
            except (ResizeRefused, DrainTimeout):
                await self._roll_back(record)
                raise
            except ResizeOutcomeUnknown as exc:
                await pool.write_record(replace(record, message=f"outcome unknown: {exc}"))
                raise
            if record.grow:
                await pool.write_record(None)
                self._dp = record.to_dp
                return ResizeResult(
                    ResizeOutcome.RESIZED, record.from_dp, record.to_dp, record.to_dp, message
                )
            record = replace(record, phase=ResizePhase.REMOVING_FOLLOWERS, message=message)
            await pool.write_record(record)
        await pool.set_followers(record.to_followers)
        await pool.write_record(None)
        self._dp = record.to_dp
        return ResizeResult(
            ResizeOutcome.RESIZED,
            record.from_dp,
            record.to_dp,
            record.to_dp,
            record.message or f"DP {record.to_dp}",
        )

    async def _roll_back(self, record: ResizeRecord) -> None:
        """Undo a resize that did not happen: the engine is at ``from_dp``."""
        assert self.followers is not None
        if record.grow:
            await self.followers.set_followers(record.from_followers)
        await self.followers.write_record(None)
        self._dp = record.from_dp
        log.warning(
            "elastic EP: DP %d -> %d rolled back; engine at DP %d",
            record.from_dp,
            record.to_dp,
            record.from_dp,
        )

    async def _wait_followers_ready(self, record: ResizeRecord) -> bool:
        assert self.followers is not None
        remaining_wall = record.deadline_s - self._wall()
        deadline = self._clock() + max(0.0, remaining_wall)
        while True:
            obs = await self.followers.observe_followers()
            if obs.ready >= record.to_followers:
                return True
            left = deadline - self._clock()
            if left <= 0:
                return False
            await self._sleep(min(self.config.scaling_check_interval_seconds, left))

    async def _wait_engine_idle(self) -> None:
        """Wait until the engine reports no resize in flight."""
        timeout = self.config.elastic_ep_resize_timeout_seconds
        deadline = self._clock() + timeout
        while await self.admin.is_scaling():
            left = deadline - self._clock()
            if left <= 0:
                raise ResizeInFlight(
                    f"elastic EP: the engine at {self.admin.base_url} has been resizing for more "
                    f"than {timeout:g} s (elastic_ep_resize_timeout_seconds); not starting "
                    "another resize"
                )
            await self._sleep(min(self.poll_interval_s, left))

    async def _scale(self, new_dp: int) -> str:
        """One resize call, made safe: a 503 (someone else resizing) is waited out; a call
        without an answer is followed until the engine is idle, then re-issued once."""
        cfg = self.config
        reissued = False
        busy = 0
        while True:
            try:
                return await self.admin.scale(
                    new_dp,
                    drain_timeout_s=cfg.elastic_ep_drain_timeout_seconds,
                    timeout_s=cfg.elastic_ep_resize_timeout_seconds,
                )
            except ResizeInFlight:
                busy += 1
                if busy > MAX_BUSY_RETRIES:
                    raise
                await self._wait_engine_idle()
            except _NoAnswer as exc:
                if reissued:
                    raise ResizeOutcomeUnknown(
                        f"elastic EP: DP {new_dp}: {exc}; re-issued once without an answer"
                    ) from None
                log.warning("elastic EP: %s; following it through %s", exc, IS_SCALING_PATH)
                try:
                    await self._wait_engine_idle()
                except ResizeInFlight as still:
                    raise ResizeOutcomeUnknown(f"elastic EP: DP {new_dp}: {exc}; {still}") from None
                # A completed resize makes this a no-op; a failed one is tried once more.
                reissued = True
