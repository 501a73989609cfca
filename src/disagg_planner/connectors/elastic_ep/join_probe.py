"""How many GPUs an engine's Ray cluster has joined, and how many ranks they hold.

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
import urllib.error
from collections.abc import Mapping
from typing import Any, Protocol

from disagg_planner.connectors.elastic_ep.routes import (
    RAY_ACTORS_PATH,
    RAY_NODES_PATH,
    check_url,
    error_detail,
    http_call,
    json_object,
)
from disagg_planner.errors import ConnectorError


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


class RayDashboardJoinProbe:
    """GPUs of the alive nodes of a Ray cluster, from its dashboard's state API
    (``elastic_ep_ray_dashboard_url``, e.g. ``http://leader:8265``)."""

    def __init__(self, base_url: str, *, timeout_s: float = 10.0) -> None:
        self.base_url = check_url(base_url)
        self.timeout_s = timeout_s
        self.where = f"GET {self.base_url}{RAY_NODES_PATH}"

    def _nodes(self, path: str = RAY_NODES_PATH) -> Any:
        where = f"GET {self.base_url}{path}"
        try:
            body = http_call(self.base_url + path, None, self.timeout_s)
        except urllib.error.HTTPError as exc:
            raise ConnectorError(f"{where}: HTTP {exc.code}: {error_detail(exc.read())}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise ConnectorError(f"{where}: cannot reach the Ray dashboard: {exc}") from None
        reply = json_object(body, where, "the state API's {'data': {'result': ...}}")
        data = reply.get("data")
        result = data.get("result") if isinstance(data, Mapping) else None
        if isinstance(result, Mapping):  # list APIs wrap the rows once more
            result = result.get("result")
        return result

    async def joined_gpus(self) -> int:
        rows = await asyncio.to_thread(self._nodes)
        return sum_gpus(rows, self.where, key="resources_total", alive="ALIVE")

    async def placeable_ranks(self, gpus_per_rank: int, *, current_dp: int) -> int:
        """Ranks the alive nodes hold, ``gpus_per_rank`` GPUs on one node each, less the
        ``current_dp`` running (the state API reports totals, not what is free)."""
        rows = await asyncio.to_thread(self._nodes)
        fits = ranks_per_node(
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


def sum_gpus(rows: Any, where: str, *, key: str, alive: str | None) -> int:
    """Total GPUs of ``rows`` (alive ones only when ``alive`` names the state)."""
    return int(sum(node_gpus(rows, where, key=key, alive=alive)) + 1e-9)


def ranks_per_node(rows: Any, where: str, *, key: str, alive: str | None, per: int) -> int:
    """Ranks of ``per`` GPUs that fit, each within one node (a rank never spans nodes)."""
    if per < 1:
        raise ValueError(f"gpus per rank must be >= 1, got {per}")
    return sum(int(g / per + 1e-9) for g in node_gpus(rows, where, key=key, alive=alive))


def node_gpus(rows: Any, where: str, *, key: str, alive: str | None) -> list[float]:
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
