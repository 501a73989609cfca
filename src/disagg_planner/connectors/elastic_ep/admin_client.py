"""Clients of the two elastic-EP admin routes, and of the readouts that say new GPUs joined.

**Bare vLLM** (:class:`VllmElasticEpAdmin`, ``elastic_ep_api = "vllm"``), the API server's
unauthenticated admin endpoints. Current vLLM resizes in two steps, *prepare* then *commit*
(``AsyncLLM._scale_elastic_ep``, ``vllm/v1/engine/async_llm.py``)::

    POST /scale_elastic_ep {"new_data_parallel_size": N, "drain_timeout": S}
      1. prepare (new engines start, weights and expert map move): the engine keeps
         serving, no 503, ``phase`` "idle" (about 92 s for 16 -> 20 in vLLM's post);
      2. the scaling flag is set (``phase`` "committing"; every path but ``/health`` and
         ``/is_scaling_elastic_ep`` answers 503); with VLLM_ELASTIC_EP_DRAIN_REQUESTS=1 the
         engine waits up to S s for in-flight requests, and a drain that times out resets
         the flag and keeps the size;
      3. commit (the pause: 0.8 s up / 1.96 s down with NIXL EP): on a shrink the removed
         ranks pause with mode="abort", so their in-flight requests are aborted.
      200 {"message": "Scaled to N data parallel engines"}   the resize is complete
      400 bad JSON, a missing or non-positive integer, or any ValueError with its text, e.g.
          "Cannot scale to data_parallel_size N, minimum is M" (the shrink floor)
      408 any TimeoutError (prepare, drain or commit), always worded as a drain timeout
      500 "Scale failed": any other engine error (the reason is only in the engine's log)
    POST /is_scaling_elastic_ep -> {"is_scaling_elastic_ep": bool, "phase": "idle" |
          "committing" (| "preparing" with an external load balancer)}

What a 408 or 500 left behind is read from the phase right after it: back to "idle" means
the engine reset its flag and keeps its size; still "committing" means the commit failed
part-way (the flag is never reset then), a :class:`PartialReconfiguration`. While the call
runs the client polls the phase (``phase_poll_s``): how long it was "committing" is the
measured pause (:attr:`VllmElasticEpAdmin.last_measured`).

vLLM 0.17.0 (the older flow, still supported): the router set the flag for the whole call
(503 everywhere, ``is_scaling_elastic_ep`` included) and ``is_scaling_elastic_ep`` has no
``phase``; there a 408 is read by elapsed time (within ``drain_timeout + grace`` with
draining on: the drain, size kept; otherwise the new engines never started after the
running ones were told to reconfigure).

Asking for the current size is a no-op 200.

**Dynamo's worker** (:class:`DynamoElasticEpAdmin`, ``elastic_ep_api = "dynamo"``), the vLLM
worker's system port (``DYN_SYSTEM_PORT``), where there is no vLLM API server::

    POST /engine/control/scale_elastic_ep {"new_data_parallel_size": N}
      200 {"status": "ok", "message": ..., "new_data_parallel_size": N}
      200 {"status": "error", "message": ...}   refused, or a resize already in progress
          ("... already in progress; rejecting concurrent request ...", every worker
          version; "busy" is only what Dynamo's operator client expects, also accepted)
      no reply: the current worker fails fast on a failed grow (the process exits and its
          pod restarts; :class:`NoAnswer` here, the controller then reads the size back)
      200 {"status": "error", "recoverable": bool, "data_parallel_size": D}   the rollback
          variant of the worker: the engine is at D; not recoverable means it needs a restart
    POST /engine/control/ep_capacity {} -> {"status": "ok", "data_parallel_size": D,
          "tensor_parallel_size": T, "total_gpus": G, "available_gpus": F,
          "nodes": [{"total_gpus": g, "available_gpus": f}, ...], ...}

No ``is_scaling`` route and no ``drain_timeout``: single flight rests on the controller's lock
and on "in progress" answers; a reply is a success only with ``"status": "ok"`` and the size
asked. A grow fits only when the nodes' free GPUs hold each new rank's
``tensor_parallel_size`` GPUs on one node (the worker's own rule).

**Joined GPUs** (:class:`JoinProbe`): a follower pod being Ready proves nothing until its GPUs
are in the engine's Ray cluster (vLLM places each new engine as a Ray actor whose
``tensor_parallel_size`` GPUs are on one node). Dynamo's worker reports the nodes' free GPUs
(``ep_capacity``); on bare vLLM the Ray dashboard's state API reports the alive nodes' GPUs
(:class:`RayDashboardJoinProbe`, ``GET /api/v0/nodes``, ``resources_total.GPU``). Both
answer :meth:`JoinProbe.placeable_ranks`: how many ranks of ``gpus_per_rank`` GPUs fit, node
by node.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from disagg_planner.connectors.elastic_ep.errors import (
    ConnectionLost,
    DrainTimeout,
    ElasticEpError,
    GrowFailed,
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
RAY_ACTORS_PATH = "/api/v0/actors"

# What vLLM says, through Dynamo's "error" message (the worker passes the exception's text
# on; bare vLLM hides it behind a 500 "Scale failed"), when an earlier prepare or commit
# failed and left a reconfiguration active.
_STUCK_MARKERS = ("reconfiguration is already active", "scaling is already prepared")
# Every Dynamo worker version says this for a concurrent resize.
_DYNAMO_CONCURRENT_MARKER = "already in progress"
# vLLM's shrink floor (a ValueError of the engine client, answered 400 with its text).
_MINIMUM_DP = re.compile(r"Cannot scale to data_parallel_size (\d+), minimum is (\d+)")
# Phases of a resize in which the engine pauses serving (vLLM's is_scaling_elastic_ep).
SCALING_PHASES = ("preparing", "committing")
# How often a vLLM resize call's phase is polled while it runs (s).
DEFAULT_PHASE_POLL_S = 0.25
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

    def measured(self) -> MeasuredResize | None:
        """The timing of the last completed resize call, None when none was measured."""
        ...


@dataclass(frozen=True)
class MeasuredResize:
    """How long one resize call took (``total_s``) and how long the engine paused serving
    during it (``pause_s``: the time its phase read "committing", to the poll interval; None
    when the route reports no phase)."""

    total_s: float
    pause_s: float | None


class JoinProbe(Protocol):
    """How many GPUs the engine's Ray cluster has now (its own and joined followers')."""

    where: str

    async def joined_gpus(self) -> int: ...

    async def placeable_ranks(self, gpus_per_rank: int, *, current_dp: int) -> int:
        """How many ranks beyond the ``current_dp`` running ones fit, each on one node with
        ``gpus_per_rank`` GPUs."""
        ...

    async def empty_nodes(self) -> tuple[int, frozenset[str] | None]:
        """Nodes of the engine's Ray cluster hosting no rank: how many, and their addresses
        where the readout names them (None: anonymous nodes)."""
        ...


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
    return ConnectionLost(f"{where}: connection lost: {reason}")


class _PhaseWatch:
    """Polls a vLLM engine's phase in a thread while one resize call runs, and remembers
    how long it read "committing" (the pause)."""

    def __init__(self, status: Any, poll_s: float) -> None:
        self._status = status
        self._poll_s = poll_s
        self._stop = threading.Event()
        self.reports_phase = False
        self._committing_since: float | None = None
        self.pause_s = 0.0
        self.saw_committing = False
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _PhaseWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if self._committing_since is not None:  # committing until the answer came
            self.pause_s += time.monotonic() - self._committing_since
            self._committing_since = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                _, phase = self._status()
            except ConnectorError:
                phase = None
            now = time.monotonic()
            if phase is not None:
                self.reports_phase = True
                if phase in SCALING_PHASES and self._committing_since is None:
                    self._committing_since = now
                    self.saw_committing = True
                elif phase not in SCALING_PHASES and self._committing_since is not None:
                    self.pause_s += now - self._committing_since
                    self._committing_since = None
            self._stop.wait(self._poll_s)


class VllmElasticEpAdmin:
    """Client of one vLLM API server's elastic-EP endpoints (see the module doc).

    ``drain_timeout_s`` is sent with every resize; ``drains_requests`` says whether the engine
    runs with ``VLLM_ELASTIC_EP_DRAIN_REQUESTS=1`` (config
    ``elastic_ep_engine_drains_requests``). What a 408 or 500 left behind is read from the
    engine's phase right after it (current vLLM); an engine that reports no phase (vLLM
    0.17.0) gets the older elapsed-time rule (``drain_grace_s``). Blocking I/O runs in
    worker threads.
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
        phase_poll_s: float = DEFAULT_PHASE_POLL_S,
    ) -> None:
        if isinstance(drain_timeout_s, bool) or drain_timeout_s < 1:
            raise ValueError(f"drain_timeout must be an integer >= 1, got {drain_timeout_s!r}")
        self.base_url = _check_url(base_url)
        self.drain_timeout_s = int(drain_timeout_s)
        self.drains_requests = drains_requests
        self.drain_grace_s = drain_grace_s
        self.status_timeout_s = status_timeout_s
        self.phase_poll_s = phase_poll_s
        self._measured: MeasuredResize | None = None

    def _status(self) -> tuple[bool, str | None]:
        """(scaling, phase): phase None where the engine reports none (vLLM 0.17.0, or its
        middleware's 503 to this route)."""
        where = f"POST {self.base_url}{IS_SCALING_PATH}"
        try:
            body = _request(self.base_url + IS_SCALING_PATH, {}, self.status_timeout_s)
        except urllib.error.HTTPError as exc:
            if exc.code == 503:
                return True, None  # the older middleware answers everything with 503
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
        reply = _json_object(body, where, "{'is_scaling_elastic_ep': bool}")
        value = reply.get("is_scaling_elastic_ep")
        if not isinstance(value, bool):
            raise ConnectorError(
                f"{where}: expected {{'is_scaling_elastic_ep': bool}}, got {body[:200]!r}"
            )
        phase = reply.get("phase")
        return value, phase if isinstance(phase, str) else None

    def _scale(self, new_dp: int, timeout_s: float) -> str:
        where = f"POST {self.base_url}{SCALE_PATH} new_data_parallel_size={new_dp}"
        body = {"new_data_parallel_size": new_dp, "drain_timeout": self.drain_timeout_s}
        started = time.monotonic()
        self._measured = None
        with _PhaseWatch(self._status, self.phase_poll_s) as watch:
            try:
                answer = _request(self.base_url + SCALE_PATH, body, timeout_s)
            except urllib.error.HTTPError as exc:
                code, detail = exc.code, _detail(exc.read())
                failed = True
            except TimeoutError as exc:
                raise NoAnswer(f"{where}: no answer within {timeout_s:g} s ({exc})") from None
            except (urllib.error.URLError, OSError) as exc:
                raise _lost(where, timeout_s, exc) from None
            else:
                failed = False
        elapsed = time.monotonic() - started
        if failed:
            raise self._refusal(where, code, detail, elapsed, watch)
        self._measured = MeasuredResize(
            total_s=elapsed, pause_s=watch.pause_s if watch.reports_phase else None
        )
        message = _json_object(answer, where, "a JSON object").get("message")
        return message if isinstance(message, str) else answer.decode(errors="replace")[:200]

    def _phase_after(self) -> str | None:
        """The phase right after a failed call (None: not reported, or unreachable)."""
        try:
            return self._status()[1]
        except ConnectorError:
            return None

    def _refusal(
        self, where: str, status: int, detail: str, elapsed_s: float, watch: _PhaseWatch
    ) -> Exception:
        """The typed error of a non-200 answer (see the module doc for what each means)."""
        if status == 503:
            return ResizeInFlight(f"{where}: 503: the engine is resizing ({detail})")
        if status in (408, 500):
            phase = self._phase_after() if watch.reports_phase or status == 408 else None
            if phase is not None:
                return self._by_phase(where, status, detail, phase)
            if status == 408:  # vLLM 0.17.0: no phase to read, only the elapsed time
                return self._by_elapsed_time(where, detail, elapsed_s)
        if status in (400, 500):
            floor = _MINIMUM_DP.search(detail) if status == 400 else None
            meaning = "rejected the request" if status == 400 else "failed to resize"
            return ResizeRefused(
                f"{where}: {status}: the engine {meaning} ({detail}); it keeps its size",
                status=status,
                detail=detail,
                minimum_dp=int(floor.group(2)) if floor else None,
            )
        hint = " (not a vLLM elastic-EP API server?)" if status == 404 else ""
        return ElasticEpError(f"{where}: unexpected HTTP {status}: {detail}{hint}")

    def _by_phase(self, where: str, status: int, detail: str, phase: str) -> Exception:
        """A 408/500 of current vLLM, read from the phase the engine is left in."""
        if phase in SCALING_PHASES:
            return PartialReconfiguration(
                f"{where}: {status} ({detail}) and the engine still reports phase {phase!r}: "
                "its commit failed part-way and it keeps pausing; the engine may be half "
                "reconfigured and needs a restart before it resizes again"
            )
        if status == 408 and self.drains_requests:
            return DrainTimeout(
                f"{where}: 408 ({detail}) and the engine is back to phase {phase!r}: "
                f"in-flight requests did not drain within {self.drain_timeout_s} s (or the "
                "preparation timed out); the engine keeps its size"
            )
        return ResizeRefused(
            f"{where}: {status} ({detail}) and the engine is back to phase {phase!r}: the "
            "preparation or the commit failed before anything changed; it keeps its size",
            status=status,
            detail=detail,
        )

    def _by_elapsed_time(self, where: str, detail: str, elapsed_s: float) -> Exception:
        """A 408 of vLLM 0.17.0 (no phase): the drain only within the drain window."""
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

    def measured(self) -> MeasuredResize | None:
        return self._measured

    async def is_scaling(self) -> bool:
        """Whether the engine is resizing now. Raises ConnectorError when unreachable."""
        return (await asyncio.to_thread(self._status))[0]

    async def phase(self) -> str | None:
        """The engine's resize phase ("idle", "committing", ...), None where not reported."""
        return (await asyncio.to_thread(self._status))[1]

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
        self._measured: MeasuredResize | None = None

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
        if status == "error" and "recoverable" in reply and not _is_stuck(message):
            raise self._rolled_back(where, new_dp, message, reply)
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

    @staticmethod
    def _rolled_back(
        where: str, new_dp: int, message: str, reply: Mapping[str, Any]
    ) -> ElasticEpError:
        """The rollback variant's error: the engine at ``data_parallel_size``, or not
        recoverable (it needs a restart)."""
        dp = reply.get("data_parallel_size")
        if reply.get("recoverable") is not True:
            return PartialReconfiguration(
                f"{where}: error, not recoverable ({message}); engine at DP {dp!r}: restart "
                "the engine before resizing it again"
            )
        if isinstance(dp, int) and not isinstance(dp, bool) and dp != new_dp:
            return GrowFailed(
                f"{where}: error: the engine did not resize ({message}); the worker rolled "
                f"back and keeps its size (DP {dp})",
                status=200,
                detail=message,
            )
        return ResizeRefused(
            f"{where}: error: the engine did not resize ({message}); it keeps its size",
            status=200,
            detail=message,
        )

    async def scale(self, new_dp: int, *, timeout_s: float) -> str:
        """Resize to ``new_dp`` ranks; the worker's message once done. Raises as
        :meth:`VllmElasticEpAdmin.scale` ("busy" is :class:`ResizeInFlight`)."""
        _check_dp(new_dp)
        started = time.monotonic()
        self._measured = None
        message = await asyncio.to_thread(self._scale, new_dp, timeout_s)
        self._measured = MeasuredResize(total_s=time.monotonic() - started, pause_s=None)
        return message

    def measured(self) -> MeasuredResize | None:
        return self._measured

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

    async def placeable_ranks(self, gpus_per_rank: int, *, current_dp: int) -> int:
        """New ranks the nodes' free GPUs hold, ``gpus_per_rank`` on one node each (the
        worker's running ranks already hold theirs)."""
        del current_dp
        reply = await self.capacity()
        return _ranks_per_node(
            reply.get("nodes"), self.where, key="available_gpus", alive=None, per=gpus_per_rank
        )

    async def empty_nodes(self) -> tuple[int, frozenset[str] | None]:
        """Nodes whose GPUs are all free (the current handler's nodes are anonymous)."""
        reply = await self.capacity()
        nodes = reply.get("nodes")
        totals = _node_gpus(nodes, self.where, key="total_gpus", alive=None)
        free = _node_gpus(nodes, self.where, key="available_gpus", alive=None)
        return sum(1 for t, f in zip(totals, free, strict=True) if t > 0 and f >= t), None

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

    def _nodes(self, path: str = RAY_NODES_PATH) -> Any:
        where = f"GET {self.base_url}{path}"
        try:
            body = _request(self.base_url + path, None, self.timeout_s)
        except urllib.error.HTTPError as exc:
            raise ConnectorError(f"{where}: HTTP {exc.code}: {_detail(exc.read())}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise ConnectorError(f"{where}: cannot reach the Ray dashboard: {exc}") from None
        reply = _json_object(body, where, "the state API's {'data': {'result': ...}}")
        data = reply.get("data")
        result = data.get("result") if isinstance(data, Mapping) else None
        if isinstance(result, Mapping):  # list APIs wrap the rows once more
            result = result.get("result")
        return result

    async def joined_gpus(self) -> int:
        rows = await asyncio.to_thread(self._nodes)
        return _sum_gpus(rows, self.where, key="resources_total", alive="ALIVE")

    async def placeable_ranks(self, gpus_per_rank: int, *, current_dp: int) -> int:
        """Ranks the alive nodes hold, ``gpus_per_rank`` GPUs on one node each, less the
        ``current_dp`` running (the state API reports totals, not what is free)."""
        rows = await asyncio.to_thread(self._nodes)
        fits = _ranks_per_node(
            rows, self.where, key="resources_total", alive="ALIVE", per=gpus_per_rank
        )
        return max(0, fits - current_dp)

    async def empty_nodes(self) -> tuple[int, frozenset[str] | None]:
        """Alive nodes with GPUs and no alive actor (vLLM's engines are Ray actors)."""
        nodes = await asyncio.to_thread(self._nodes)
        actors = await asyncio.to_thread(self._nodes, RAY_ACTORS_PATH)
        if not isinstance(nodes, list) or not isinstance(actors, list):
            raise ConnectorError(f"{self.where}: expected lists of nodes and actors")
        busy = {
            a.get("node_id") for a in actors if isinstance(a, Mapping) and a.get("state") == "ALIVE"
        }
        empty = frozenset(
            str(n.get("node_ip"))
            for n in nodes
            if isinstance(n, Mapping)
            and n.get("state") == "ALIVE"
            and n.get("node_id") not in busy
            and ((n.get("resources_total") or {}).get("GPU") or 0) > 0
        )
        return len(empty), empty


def _sum_gpus(rows: Any, where: str, *, key: str, alive: str | None) -> int:
    """Total GPUs of ``rows`` (alive ones only when ``alive`` names the state)."""
    return int(sum(_node_gpus(rows, where, key=key, alive=alive)) + 1e-9)


def _ranks_per_node(rows: Any, where: str, *, key: str, alive: str | None, per: int) -> int:
    """Ranks of ``per`` GPUs that fit, each within one node (a rank never spans nodes)."""
    if per < 1:
        raise ValueError(f"gpus per rank must be >= 1, got {per}")
    return sum(int(g / per + 1e-9) for g in _node_gpus(rows, where, key=key, alive=alive))


def _node_gpus(rows: Any, where: str, *, key: str, alive: str | None) -> list[float]:
    """Each node's ``key`` GPUs (alive ones only when ``alive`` names the state)."""
    if not isinstance(rows, list):
        raise ConnectorError(f"{where}: expected a list of nodes, got {rows!r:.200}")
    gpus: list[float] = []
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
        gpus.append(float(value))
    return gpus


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
