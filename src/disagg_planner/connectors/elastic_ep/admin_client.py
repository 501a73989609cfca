"""The client of bare vLLM's elastic-EP admin route (the protocol every resize route's
client follows, :class:`ElasticEpAdmin`, is here too).

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

The other route, Dynamo's worker, is :mod:`.dynamo_admin`; the paths, the shared HTTP calls
and :func:`.routes.detect_api` are in :mod:`.routes`.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
import urllib.error
from dataclasses import dataclass
from typing import Any, Protocol

from disagg_planner.connectors.elastic_ep.errors import (
    DrainTimeout,
    ElasticEpError,
    NoAnswer,
    PartialReconfiguration,
    ResizeInFlight,
    ResizeRefused,
)
from disagg_planner.connectors.elastic_ep.routes import (
    IS_SCALING_PATH,
    SCALE_PATH,
    check_dp,
    check_url,
    error_detail,
    http_call,
    json_object,
    lost,
)
from disagg_planner.errors import ConnectorError

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
        self.base_url = check_url(base_url)
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
            body = http_call(self.base_url + IS_SCALING_PATH, {}, self.status_timeout_s)
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
            raise ConnectorError(
                f"{where}: HTTP {exc.code}: {error_detail(exc.read())}{hint}"
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            raise ConnectorError(f"{where}: cannot reach the engine: {exc}") from None
        reply = json_object(body, where, "{'is_scaling_elastic_ep': bool}")
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
                answer = http_call(self.base_url + SCALE_PATH, body, timeout_s)
            except urllib.error.HTTPError as exc:
                code, detail = exc.code, error_detail(exc.read())
                failed = True
            except TimeoutError as exc:
                raise NoAnswer(f"{where}: no answer within {timeout_s:g} s ({exc})") from None
            except (urllib.error.URLError, OSError) as exc:
                raise lost(where, timeout_s, exc) from None
            else:
                failed = False
        elapsed = time.monotonic() - started
        if failed:
            raise self._refusal(where, code, detail, elapsed, watch)
        self._measured = MeasuredResize(
            total_s=elapsed, pause_s=watch.pause_s if watch.reports_phase else None
        )
        message = json_object(answer, where, "a JSON object").get("message")
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
        check_dp(new_dp)
        return await asyncio.to_thread(self._scale, new_dp, timeout_s)
