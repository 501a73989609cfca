"""Client of vLLM's elastic-EP admin API on the engine's API server.

Unauthenticated admin endpoints: keep them on the cluster network::

    POST /scale_elastic_ep {"new_data_parallel_size": N, "drain_timeout": S}
      200 {"message": "Scaled to N data parallel engines"}   the resize is complete
      400 bad JSON, a non-positive integer, or the engine refused the size (ValueError)
      408 in-flight requests did not drain within S seconds; the engine keeps its size
      500 "Scale failed" (any other engine error)
      503 while a resize runs, older vLLM answers every request so (ScalingMiddleware)
    POST /is_scaling_elastic_ep -> {"is_scaling_elastic_ep": true|false}

The resize call answers when the resize is over (seconds to minutes); asking for the
current size is a no-op.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from disagg_planner.connectors.elastic_ep.errors import (
    DrainTimeout,
    ElasticEpError,
    NoAnswer,
    ResizeInFlight,
    ResizeRefused,
)
from disagg_planner.errors import ConnectorError

SCALE_PATH = "/scale_elastic_ep"
IS_SCALING_PATH = "/is_scaling_elastic_ep"


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
            raise NoAnswer(f"{where}: no answer within {timeout_s:g} s ({exc})") from None
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, TimeoutError):
                raise NoAnswer(f"{where}: no answer within {timeout_s:g} s") from None
            if isinstance(reason, ConnectionRefusedError):
                raise ConnectorError(f"{where}: cannot reach the engine: {reason}") from None
            raise NoAnswer(f"{where}: connection lost: {reason}") from None
        except (ConnectionError, OSError) as exc:
            raise NoAnswer(f"{where}: connection lost: {exc}") from None
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
        ``NoAnswer`` when the outcome is unknown (the controller handles it).
        """
        if isinstance(new_dp, bool) or not isinstance(new_dp, int) or new_dp < 1:
            raise ValueError(f"new_data_parallel_size must be an integer >= 1, got {new_dp!r}")
        if isinstance(drain_timeout_s, bool) or drain_timeout_s < 1:
            raise ValueError(f"drain_timeout must be an integer >= 1, got {drain_timeout_s!r}")
        return await asyncio.to_thread(self._scale, new_dp, int(drain_timeout_s), timeout_s)
