"""The client of Dynamo's elastic-EP control route, on the vLLM worker.

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
"""

from __future__ import annotations

import asyncio
import time
import urllib.error
from collections.abc import Mapping
from typing import Any

from disagg_planner.connectors.elastic_ep.admin_client import MeasuredResize
from disagg_planner.connectors.elastic_ep.errors import (
    ElasticEpError,
    GrowFailed,
    NoAnswer,
    PartialReconfiguration,
    ResizeInFlight,
    ResizeRefused,
)
from disagg_planner.connectors.elastic_ep.join_probe import node_gpus, ranks_per_node, sum_gpus
from disagg_planner.connectors.elastic_ep.routes import (
    DYNAMO_CAPACITY_PATH,
    DYNAMO_SCALE_PATH,
    check_dp,
    check_url,
    error_detail,
    http_call,
    is_stuck,
    json_object,
    lost,
)
from disagg_planner.errors import ConnectorError

# Every Dynamo worker version says this for a concurrent resize.
_DYNAMO_CONCURRENT_MARKER = "already in progress"


class DynamoElasticEpAdmin:
    """Client of one Dynamo vLLM worker's control routes (see the module doc): the resize
    and ``ep_capacity`` (a :class:`JoinProbe`)."""

    api = "dynamo"
    reports_scaling = False

    def __init__(self, base_url: str, *, status_timeout_s: float = 10.0) -> None:
        self.base_url = check_url(base_url)
        self.status_timeout_s = status_timeout_s
        self.where = f"POST {self.base_url}{DYNAMO_CAPACITY_PATH}"
        self._measured: MeasuredResize | None = None

    async def is_scaling(self) -> bool:
        """Dynamo has no such route: a resize in flight shows as a "busy" answer."""
        return False

    def _scale(self, new_dp: int, timeout_s: float) -> str:
        where = f"POST {self.base_url}{DYNAMO_SCALE_PATH} new_data_parallel_size={new_dp}"
        try:
            answer = http_call(
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
                f"{where}: unexpected HTTP {exc.code}: {error_detail(exc.read())}{hint}"
            ) from None
        except TimeoutError as exc:
            raise NoAnswer(f"{where}: no answer within {timeout_s:g} s ({exc})") from None
        except (urllib.error.URLError, OSError) as exc:
            raise lost(where, timeout_s, exc) from None
        reply = json_object(answer, where, "{'status': 'ok' | 'busy' | 'error', ...}")
        status = reply.get("status")
        message = str(reply.get("message") or "")
        if status == "error" and "recoverable" in reply and not is_stuck(message):
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
            if is_stuck(message):
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
        check_dp(new_dp)
        started = time.monotonic()
        self._measured = None
        message = await asyncio.to_thread(self._scale, new_dp, timeout_s)
        self._measured = MeasuredResize(total_s=time.monotonic() - started, pause_s=None)
        return message

    def measured(self) -> MeasuredResize | None:
        return self._measured

    def _capacity(self) -> Mapping[str, Any]:
        try:
            body = http_call(self.base_url + DYNAMO_CAPACITY_PATH, {}, self.status_timeout_s)
        except urllib.error.HTTPError as exc:
            raise ConnectorError(
                f"{self.where}: HTTP {exc.code}: {error_detail(exc.read())}"
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            raise ConnectorError(f"{self.where}: cannot reach the worker: {exc}") from None
        reply = json_object(body, self.where, "{'status': 'ok', 'nodes': [...], ...}")
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
        return sum_gpus(reply.get("nodes"), self.where, key="total_gpus", alive=None)

    async def placeable_ranks(self, gpus_per_rank: int, *, current_dp: int) -> int:
        """New ranks the nodes' free GPUs hold, ``gpus_per_rank`` on one node each (the
        worker's running ranks already hold theirs)."""
        del current_dp
        reply = await self.capacity()
        return ranks_per_node(
            reply.get("nodes"), self.where, key="available_gpus", alive=None, per=gpus_per_rank
        )

    async def empty_nodes(self) -> tuple[int, frozenset[str] | None]:
        """Nodes whose GPUs are all free (the current handler's nodes are anonymous)."""
        reply = await self.capacity()
        nodes = reply.get("nodes")
        totals = node_gpus(nodes, self.where, key="total_gpus", alive=None)
        free = node_gpus(nodes, self.where, key="available_gpus", alive=None)
        return sum(1 for t, f in zip(totals, free, strict=True) if t > 0 and f >= t), None

    async def engine_dp(self) -> int:
        """The engine's DP size (``ep_capacity``'s ``data_parallel_size``)."""
        value = (await self.capacity()).get("data_parallel_size")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConnectorError(f"{self.where}: data_parallel_size = {value!r}, expected >= 1")
        return value
