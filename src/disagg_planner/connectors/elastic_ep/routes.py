"""The elastic-EP admin routes' paths, the plain HTTP calls their clients share, and
:func:`detect_api`: which of the two routes an engine's URL serves.

The routes and what they answer are in :mod:`.admin_client` (bare vLLM) and
:mod:`.dynamo_admin` (Dynamo's vLLM worker); the readouts of joined GPUs in
:mod:`.join_probe`.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from disagg_planner.connectors.elastic_ep.errors import ConnectionLost, NoAnswer
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


def error_detail(body: bytes) -> str:
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


def is_stuck(detail: str) -> bool:
    low = detail.lower()
    return any(marker in low for marker in _STUCK_MARKERS)


def check_url(base_url: str) -> str:
    if not base_url.startswith(("http://", "https://")):
        raise ValueError(f"admin URL must be http:// or https://, got {base_url!r}")
    return base_url.rstrip("/")


def http_call(url: str, body: Mapping[str, Any] | None, timeout_s: float) -> bytes:
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


def json_object(body: bytes, where: str, expected: str) -> Mapping[str, Any]:
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if not isinstance(parsed, Mapping):
        raise ConnectorError(f"{where}: expected {expected}, got {body[:200]!r}")
    return parsed


def lost(where: str, timeout_s: float, exc: BaseException) -> Exception:
    """A resize call's transport failure: unreachable (nothing happened) or no answer."""
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, ConnectionRefusedError):
        return ConnectorError(f"{where}: cannot reach the engine: {reason}")
    if isinstance(reason, TimeoutError):
        return NoAnswer(f"{where}: no answer within {timeout_s:g} s")
    return ConnectionLost(f"{where}: connection lost: {reason}")


def check_dp(new_dp: int) -> None:
    if isinstance(new_dp, bool) or not isinstance(new_dp, int) or new_dp < 1:
        raise ValueError(f"new_data_parallel_size must be an integer >= 1, got {new_dp!r}")


def _answers(url: str, timeout_s: float) -> int | None:
    """The HTTP status a POST {} to ``url`` gets, None when unreachable."""
    try:
        http_call(url, {}, timeout_s)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None
    return 200


async def detect_api(base_url: str, *, timeout_s: float = 10.0) -> str:
    """Which route ``base_url`` serves (``elastic_ep_api = "auto"``): "vllm" when
    ``/is_scaling_elastic_ep`` answers (200, or 503 while scaling), "dynamo" when
    ``/engine/control/ep_capacity`` does; ConnectorError naming both otherwise."""
    base = check_url(base_url)
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
