"""Clients of the two elastic-EP admin routes, and of the readouts that say new GPUs joined.

**Bare vLLM** (:class:`VllmElasticEpAdmin`, ``elastic_ep_api = "vllm"``), the API server's
unauthenticated admin endpoints, as vLLM 0.17.0 serves them
(``vllm/entrypoints/serve/elastic_ep/api_router.py`` and its scaling middleware)::

    POST /scale_elastic_ep {"new_data_parallel_size": N, "drain_timeout": S}
      200 {"message": "Scaled to N data parallel engines"}   the resize is complete
      400 bad JSON, a missing or non-positive integer (validation only)
      408 "Scale failed due to request drain timeout after S seconds": any TimeoutError of
          the resize. The drain (and so ``drain_timeout``) happens only when the engine runs
          with VLLM_ELASTIC_EP_DRAIN_REQUESTS=1; otherwise a 408 means the new engines did
          not start after the running ones were told to reconfigure
      500 "Scale failed": any other engine error (the reason is only in the engine's log)
      503 every request while a resize runs (the scaling middleware)
    POST /is_scaling_elastic_ep -> {"is_scaling_elastic_ep": true|false}

Asking for the current size is a no-op 200.

**Dynamo's worker** (:class:`DynamoElasticEpAdmin`, ``elastic_ep_api = "dynamo"``), the vLLM
worker's system port (``DYN_SYSTEM_PORT``), where there is no vLLM API server::

    POST /engine/control/scale_elastic_ep {"new_data_parallel_size": N}
      200 {"status": "ok", "message": ..., "new_data_parallel_size": N}
      200 {"status": "error", "message": ...}   refused, failed, or (older workers) a resize
          already in progress ("... already in progress; rejecting concurrent request ...")
      200 {"status": "busy", ...}              a resize in progress (what Dynamo's operator
          reconciler expects)
    POST /engine/control/ep_capacity {} -> {"status": "ok", "data_parallel_size": D,
          "total_gpus": G, "nodes": [{"node_ip": ..., "total_gpus": g}, ...], ...}

No ``is_scaling`` route and no ``drain_timeout``: single flight rests on the controller's lock
and on "busy" answers; a reply is a success only with ``"status": "ok"`` and the size asked.

**Joined GPUs** (:class:`JoinProbe`): a follower pod being Ready proves nothing until its GPUs
are in the engine's Ray cluster (vLLM places new engines as Ray actors). Dynamo's worker
reports them (``ep_capacity``, the readout Dynamo's own elastic-EP reconciler uses); on bare
vLLM the Ray dashboard's state API does (:class:`RayDashboardJoinProbe`,
``GET /api/v0/nodes``: alive nodes' ``resources_total.GPU``).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any, Protocol

from disagg_planner.connectors.elastic_ep.errors import (
    DrainTimeout,
    ElasticEpError,
    NoAnswer,
    PartialReconfiguration,
    ResizeInFlight,
    ResizeRefused,
)
from disagg_planner.errors import ConnectorError

SCALE_PATH = "/scale_elastic_ep"
IS_SCALING_PATH = "/is_scaling_elastic_ep"
DYNAMO_SCALE_PATH = "/engine/control/scale_elastic_ep"
DYNAMO_CAPACITY_PATH = "/engine/control/ep_capacity"
RAY_NODES_PATH = "/api/v0/nodes"

# What vLLM says (in a 400 of newer versions, or through Dynamo's "error" message) when an
# earlier prepare or commit failed and left a reconfiguration active.
_STUCK_MARKERS = ("reconfiguration is already active", "scaling is already prepared")
# Dynamo workers that predate the "busy" status say this for a concurrent resize.
_DYNAMO_CONCURRENT_MARKER = "already in progress"
# A drain 408 arrives drain_timeout after the call; allow this much more before reading a 408
# as a failure after reconfiguration started (s).
DRAIN_408_GRACE_S = 5.0


class ElasticEpAdmin(Protocol):
    """What the controller needs of an engine's resize route."""

    base_url: str
    api: str  # "vllm" or "dynamo" (the elastic_ep_api value)
    reports_scaling: bool  # whether is_scaling() asks the engine

    async def is_scaling(self) -> bool: ...

    async def scale(self, new_dp: int, *, timeout_s: float) -> str: ...

    async def engine_dp(self) -> int | None:
        """The DP size the engine reports, None when its route reports none."""
        ...


class JoinProbe(Protocol):
    """How many GPUs the engine's Ray cluster has now (its own and joined followers')."""

    where: str

    async def joined_gpus(self) -> int: ...


def _detail(body: bytes) -> str:
    """The human part of an error body (FastAPI's ``detail``, the middleware's ``error``)."""
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


def _is_stuck(detail: str) -> bool:
    low = detail.lower()
    return any(marker in low for marker in _STUCK_MARKERS)


def _check_url(base_url: str) -> str:
    if not base_url.startswith(("http://", "https://")):
        raise ValueError(f"admin URL must be http:// or https://, got {base_url!r}")
    return base_url.rstrip("/")


def _request(url: str, body: Mapping[str, Any] | None, timeout_s: float) -> bytes:
    """POST ``body`` as JSON (GET when None) and return the answer's bytes."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url,
        data=data,
        headers={"Content-Type": "application/json"} if data is not None else {},
        method="POST" if data is not None else "GET",
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        payload: bytes = response.read()
        return payload


def _json_object(body: bytes, where: str, expected: str) -> Mapping[str, Any]:
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if not isinstance(parsed, Mapping):
        raise ConnectorError(f"{where}: expected {expected}, got {body[:200]!r}")
    return parsed


def _lost(where: str, timeout_s: float, exc: BaseException) -> Exception:
    """A resize call's transport failure: unreachable (nothing happened) or no answer."""
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, ConnectionRefusedError):
        return ConnectorError(f"{where}: cannot reach the engine: {reason}")
    if isinstance(reason, TimeoutError):
        return NoAnswer(f"{where}: no answer within {timeout_s:g} s")
    return NoAnswer(f"{where}: connection lost: {reason}")


class VllmElasticEpAdmin:
    """Client of one vLLM API server's elastic-EP endpoints (see the module doc).

    ``drain_timeout_s`` is sent with every resize; ``drains_requests`` says whether the engine
    runs with ``VLLM_ELASTIC_EP_DRAIN_REQUESTS=1`` (config
    ``elastic_ep_engine_drains_requests``), which decides what a 408 means: with it, a 408
    within ``drain_timeout_s + drain_grace_s`` of the call is the drain (the engine keeps its
    size), a later one came after reconfiguration began; without it every 408 did. Blocking
    I/O runs in worker threads.
    """

    api = "vllm"
    reports_scaling = True

    def __init__(
        self,
        base_url: str,
        *,
        drain_timeout_s: int = 120,
        drains_requests: bool = False,
        drain_grace_s: float = DRAIN_408_GRACE_S,
        status_timeout_s: float = 10.0,
    ) -> None:
        if isinstance(drain_timeout_s, bool) or drain_timeout_s < 1:
            raise ValueError(f"drain_timeout must be an integer >= 1, got {drain_timeout_s!r}")
        self.base_url = _check_url(base_url)
        self.drain_timeout_s = int(drain_timeout_s)
        self.drains_requests = drains_requests
        self.drain_grace_s = drain_grace_s
        self.status_timeout_s = status_timeout_s

    def _is_scaling(self) -> bool:
        where = f"POST {self.base_url}{IS_SCALING_PATH}"
        try:
            body = _request(self.base_url + IS_SCALING_PATH, {}, self.status_timeout_s)
        except urllib.error.HTTPError as exc:
            if exc.code == 503:
                return True  # the scaling middleware answers everything with 503
            hint = ""
            if exc.code == 404:
                hint = (
                    " (no elastic-EP endpoints here: vLLM must run with --enable-elastic-ep "
                    "--enable-eplb, and elastic_ep_admin_url must name its API server; under "
                    "Dynamo set elastic_ep_api=dynamo and name the worker's system port)"
                )
            raise ConnectorError(f"{where}: HTTP {exc.code}: {_detail(exc.read())}{hint}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise ConnectorError(f"{where}: cannot reach the engine: {exc}") from None
        value = _json_object(body, where, "{'is_scaling_elastic_ep': bool}").get(
            "is_scaling_elastic_ep"
        )
        if not isinstance(value, bool):
            raise ConnectorError(
                f"{where}: expected {{'is_scaling_elastic_ep': bool}}, got {body[:200]!r}"
            )
        return value

    def _scale(self, new_dp: int, timeout_s: float) -> str:
        where = f"POST {self.base_url}{SCALE_PATH} new_data_parallel_size={new_dp}"
        body = {"new_data_parallel_size": new_dp, "drain_timeout": self.drain_timeout_s}
        started = time.monotonic()
        try:
            answer = _request(self.base_url + SCALE_PATH, body, timeout_s)
        except urllib.error.HTTPError as exc:
            elapsed = time.monotonic() - started
            raise self._refusal(where, exc.code, _detail(exc.read()), elapsed) from None
        except TimeoutError as exc:
            raise NoAnswer(f"{where}: no answer within {timeout_s:g} s ({exc})") from None
        except (urllib.error.URLError, OSError) as exc:
            raise _lost(where, timeout_s, exc) from None
        message = _json_object(answer, where, "a JSON object").get("message")
        return message if isinstance(message, str) else answer.decode(errors="replace")[:200]

    def _refusal(self, where: str, status: int, detail: str, elapsed_s: float) -> Exception:
        """The typed error of a non-200 answer (see the module doc for what each means)."""
        if status == 408:
            drain_window = self.drain_timeout_s + self.drain_grace_s
            if self.drains_requests and elapsed_s <= drain_window:
                return DrainTimeout(
                    f"{where}: 408 after {elapsed_s:.0f} s: in-flight requests did not drain "
                    f"within {self.drain_timeout_s} s ({detail}); the engine keeps its size"
                )
            why = (
                "the engine does not drain (VLLM_ELASTIC_EP_DRAIN_REQUESTS unset, "
                "elastic_ep_engine_drains_requests=false)"
                if not self.drains_requests
                else f"it came {elapsed_s:.0f} s after the call, past the drain window"
            )
            return PartialReconfiguration(
                f"{where}: 408 ({detail}), but {why}: the new engines did not start after the "
                "running ones were told to reconfigure; the engine may be half reconfigured "
                "and will refuse later resizes until it is restarted"
            )
        if status == 503:
            return ResizeInFlight(f"{where}: 503: the engine is resizing ({detail})")
        if status in (400, 500):
            if _is_stuck(detail):
                return PartialReconfiguration(
                    f"{where}: {status}: {detail}: an earlier resize left a reconfiguration "
                    "active; restart the engine before resizing it again"
                )
            meaning = "rejected the request" if status == 400 else "failed to resize"
            return ResizeRefused(
                f"{where}: {status}: the engine {meaning} ({detail}); it keeps its size",
                status=status,
                detail=detail,
            )
        hint = " (not a vLLM elastic-EP API server?)" if status == 404 else ""
        return ElasticEpError(f"{where}: unexpected HTTP {status}: {detail}{hint}")

    async def is_scaling(self) -> bool:
        """Whether the engine is resizing now. Raises ConnectorError when unreachable."""
        return await asyncio.to_thread(self._is_scaling)

    async def engine_dp(self) -> int | None:
        """vLLM's API server does not report its DP size."""
        return None

    async def scale(self, new_dp: int, *, timeout_s: float) -> str:
        """Resize to ``new_dp`` ranks and return vLLM's message once the resize is done.

        Raises :class:`ResizeRefused`, :class:`DrainTimeout`, :class:`PartialReconfiguration`,
        :class:`ResizeInFlight` (503), ConnectorError when unreachable; an internal
        ``NoAnswer`` when the outcome is unknown (the controller handles it).
        """
        _check_dp(new_dp)
        return await asyncio.to_thread(self._scale, new_dp, timeout_s)


class DynamoElasticEpAdmin:
    """Client of one Dynamo vLLM worker's control routes (see the module doc): the resize
    and ``ep_capacity`` (a :class:`JoinProbe`)."""

    api = "dynamo"
    reports_scaling = False

    def __init__(self, base_url: str, *, status_timeout_s: float = 10.0) -> None:
        self.base_url = _check_url(base_url)
        self.status_timeout_s = status_timeout_s
        self.where = f"POST {self.base_url}{DYNAMO_CAPACITY_PATH}"

    async def is_scaling(self) -> bool:
        """Dynamo has no such route: a resize in flight shows as a "busy" answer."""
        return False

    def _scale(self, new_dp: int, timeout_s: float) -> str:
        where = f"POST {self.base_url}{DYNAMO_SCALE_PATH} new_data_parallel_size={new_dp}"
        try:
            answer = _request(
                self.base_url + DYNAMO_SCALE_PATH, {"new_data_parallel_size": new_dp}, timeout_s
            )
        except urllib.error.HTTPError as exc:
            hint = ""
            if exc.code == 404:
                hint = (
                    " (no elastic-EP control route: elastic_ep_admin_url must name the Dynamo "
                    "vLLM worker's system port, DYN_SYSTEM_PORT)"
                )
            raise ElasticEpError(
                f"{where}: unexpected HTTP {exc.code}: {_detail(exc.read())}{hint}"
            ) from None
        except TimeoutError as exc:
            raise NoAnswer(f"{where}: no answer within {timeout_s:g} s ({exc})") from None
        except (urllib.error.URLError, OSError) as exc:
            raise _lost(where, timeout_s, exc) from None
        reply = _json_object(answer, where, "{'status': 'ok' | 'busy' | 'error', ...}")
        status = reply.get("status")
        message = str(reply.get("message") or "")
        if status == "ok":
            echoed = reply.get("new_data_parallel_size")
            if echoed != new_dp:
                raise ElasticEpError(
                    f"{where}: answered ok for new_data_parallel_size={echoed!r}, not {new_dp}; "
                    "the engine's size is unknown"
                )
            return message or f"DP {new_dp}"
        if status == "busy" or (status == "error" and _DYNAMO_CONCURRENT_MARKER in message):
            raise ResizeInFlight(f"{where}: {status}: the engine is resizing ({message})")
        if status == "error":
            if _is_stuck(message):
                raise PartialReconfiguration(
                    f"{where}: error: {message}: an earlier resize left a reconfiguration "
                    "active; restart the engine before resizing it again"
                )
            raise ResizeRefused(
                f"{where}: error: the engine did not resize ({message}); it keeps its size",
                status=200,
                detail=message,
            )
        raise ElasticEpError(
            f"{where}: status = {status!r}, expected 'ok', 'busy' or 'error': {answer[:200]!r}"
        )

    async def scale(self, new_dp: int, *, timeout_s: float) -> str:
        """Resize to ``new_dp`` ranks; the worker's message once done. Raises as
        :meth:`VllmElasticEpAdmin.scale` ("busy" is :class:`ResizeInFlight`)."""
        _check_dp(new_dp)
        return await asyncio.to_thread(self._scale, new_dp, timeout_s)

    def _capacity(self) -> Mapping[str, Any]:
        try:
            body = _request(self.base_url + DYNAMO_CAPACITY_PATH, {}, self.status_timeout_s)
        except urllib.error.HTTPError as exc:
            raise ConnectorError(f"{self.where}: HTTP {exc.code}: {_detail(exc.read())}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise ConnectorError(f"{self.where}: cannot reach the worker: {exc}") from None
        reply = _json_object(body, self.where, "{'status': 'ok', 'nodes': [...], ...}")
        if reply.get("status") != "ok":
            raise ConnectorError(
                f"{self.where}: status = {reply.get('status')!r} ({reply.get('message')!r})"
            )
        return reply

    async def capacity(self) -> Mapping[str, Any]:
        """The worker's ``ep_capacity`` readout (status "ok"), else ConnectorError."""
        return await asyncio.to_thread(self._capacity)

    async def joined_gpus(self) -> int:
        reply = await self.capacity()
        return _sum_gpus(reply.get("nodes"), self.where, key="total_gpus", alive=None)

    async def engine_dp(self) -> int:
        """The engine's DP size (``ep_capacity``'s ``data_parallel_size``)."""
        value = (await self.capacity()).get("data_parallel_size")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConnectorError(f"{self.where}: data_parallel_size = {value!r}, expected >= 1")
        return value


class RayDashboardJoinProbe:
    """GPUs of the alive nodes of a Ray cluster, from its dashboard's state API
    (``elastic_ep_ray_dashboard_url``, e.g. ``http://leader:8265``)."""

    def __init__(self, base_url: str, *, timeout_s: float = 10.0) -> None:
        self.base_url = _check_url(base_url)
        self.timeout_s = timeout_s
        self.where = f"GET {self.base_url}{RAY_NODES_PATH}"

    def _nodes(self) -> Any:
        try:
            body = _request(self.base_url + RAY_NODES_PATH, None, self.timeout_s)
        except urllib.error.HTTPError as exc:
            raise ConnectorError(f"{self.where}: HTTP {exc.code}: {_detail(exc.read())}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise ConnectorError(f"{self.where}: cannot reach the Ray dashboard: {exc}") from None
        reply = _json_object(body, self.where, "the state API's {'data': {'result': ...}}")
        data = reply.get("data")
        result = data.get("result") if isinstance(data, Mapping) else None
        if isinstance(result, Mapping):  # list APIs wrap the rows once more
            result = result.get("result")
        return result

    async def joined_gpus(self) -> int:
        rows = await asyncio.to_thread(self._nodes)
        return _sum_gpus(rows, self.where, key="resources_total", alive="ALIVE")


def _sum_gpus(rows: Any, where: str, *, key: str, alive: str | None) -> int:
    """Total GPUs of ``rows`` (alive ones only when ``alive`` names the state)."""
    if not isinstance(rows, list):
        raise ConnectorError(f"{where}: expected a list of nodes, got {rows!r:.200}")
    total = 0.0
    for row in rows:
        if not isinstance(row, Mapping):
            raise ConnectorError(f"{where}: a node is {row!r:.100}, expected an object")
        if alive is not None and row.get("state") != alive:
            continue
        value = row.get(key)
        if isinstance(value, Mapping):  # Ray's resources_total
            value = value.get("GPU", 0)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ConnectorError(f"{where}: node {row.get('node_ip')!r} {key} = {value!r}")
        total += float(value)
    return int(total + 1e-9)


def _check_dp(new_dp: int) -> None:
    if isinstance(new_dp, bool) or not isinstance(new_dp, int) or new_dp < 1:
        raise ValueError(f"new_data_parallel_size must be an integer >= 1, got {new_dp!r}")


def _answers(url: str, timeout_s: float) -> int | None:
    """The HTTP status a POST {} to ``url`` gets, None when unreachable."""
    try:
        _request(url, {}, timeout_s)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None
    return 200


async def detect_api(base_url: str, *, timeout_s: float = 10.0) -> str:
    """Which route ``base_url`` serves (``elastic_ep_api = "auto"``): "vllm" when
    ``/is_scaling_elastic_ep`` answers (200, or 503 while scaling), "dynamo" when
    ``/engine/control/ep_capacity`` does; ConnectorError naming both otherwise."""
    base = _check_url(base_url)
    vllm = await asyncio.to_thread(_answers, base + IS_SCALING_PATH, timeout_s)
    if vllm in (200, 503):
        return "vllm"
    dynamo = await asyncio.to_thread(_answers, base + DYNAMO_CAPACITY_PATH, timeout_s)
    if dynamo == 200:
        return "dynamo"
    if vllm is None and dynamo is None:
        raise ConnectorError(
            f"elastic_ep_admin_url {base}: cannot reach the engine to tell its route "
            "(elastic_ep_api=auto); asked again next tick"
        )
    raise ConnectorError(
        f"elastic_ep_admin_url {base}: neither vLLM's {IS_SCALING_PATH} (got "
        f"{vllm if vllm is not None else 'no answer'}) nor Dynamo's {DYNAMO_CAPACITY_PATH} "
        f"(got {dynamo if dynamo is not None else 'no answer'}) answers; name vLLM's API "
        "server or the Dynamo worker's system port, or set elastic_ep_api"
    )
