"""A light stand-in for the Kubernetes API server, the Dynamo operator and Prometheus, for
``benchmarks/operator_scale.py`` at 1,000 deployments.

Why not kmock: kmock matches every request against its whole in-memory request log and
serves one request at a time (tens of milliseconds a request on a loaded 2-core machine); it
saturates near 100 DGDs, long before the planner does. This server keeps each object in a
dict, answers each request in well under a millisecond, and counts requests by kind instead
of keeping them.

Run as ``python benchmarks/light_cluster.py``; it prints ``URL=http://127.0.0.1:<port>``
once it serves and stops on SIGTERM. It serves, for any group/version/plural and namespace:

- list, get, create, merge patch (and ``/status``) of namespaced custom objects, with a
  ``resourceVersion`` that grows by one per write; ``?watch=true`` streams ADDED/MODIFIED/
  DELETED events from the list's version on (what the planner's watch caches use);
- the Dynamo operator's part, at once: a patch of a DGD's ``spec.services.*.replicas``
  makes that service's ``status.services.*.replicas``/``readyReplicas`` follow (the steady
  state: every scale converges at the next read);
- the discovery document of a group/version (``GET /apis/<group>/<version>``): the plurals
  it holds objects of;
- core ``events`` (created, counted, not kept) and ``pods`` (an empty list);
- Prometheus' ``/api/v1/query``: every planner part at ``--rate`` requests/s (the tests'
  window: ISL 3000, OSL 150, TTFT 80 ms, ITL 20 ms) over the query's own window (its
  ``[...ms]`` range), so that every window reads the same steady load;
- ``GET /_stats``: the requests counted by ``METHOD plural[/subresource][ watch]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import signal
import sys
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.unit.runtime.conftest import traffic_parts  # noqa: E402  (the tests' window)

_WINDOW = re.compile(r"\[(\d+)ms\]")


def merge(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    """RFC 7386 merge patch, in place."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            merge(target[key], value)
        else:
            target[key] = json.loads(json.dumps(value))


class Cluster:
    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.version = 1
        self.objects: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {}
        self.watchers: dict[tuple[str, str, str], list[asyncio.Queue[bytes]]] = {}
        self.stats: Counter[str] = Counter()

    def _count(self, request: web.Request, plural: str, sub: str = "") -> None:
        watch = request.query.get("watch") in ("true", "1")
        self.stats[
            f"{request.method} {plural}{'/' + sub if sub else ''}{' watch' if watch else ''}"
        ] += 1

    def _emit(self, key: tuple[str, str, str], kind: str, obj: Mapping[str, Any]) -> None:
        line = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
        for queue in self.watchers.get(key, ()):
            queue.put_nowait(line)

    def _store(self, key: tuple[str, str, str], obj: dict[str, Any], kind: str) -> None:
        self.version += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.version)
        self.objects.setdefault(key, {})[obj["metadata"]["name"]] = obj
        self._emit(key, kind, obj)

    async def collection(self, request: web.Request) -> web.StreamResponse:
        m = request.match_info
        key = (m["group"] + "/" + m["version"], m["ns"], m["plural"])
        self._count(request, m["plural"])
        if request.method == "POST":
            obj = await request.json()
            if obj["metadata"]["name"] in self.objects.get(key, {}):
                return web.json_response({"kind": "Status", "code": 409}, status=409)
            self._store(key, obj, "ADDED")
            return web.json_response(obj, status=201)
        if request.query.get("watch") in ("true", "1"):
            return await self._watch(request, key)
        items = list(self.objects.get(key, {}).values())
        return web.json_response(
            {"items": items, "metadata": {"resourceVersion": str(self.version)}}
        )

    async def _watch(self, request: web.Request, key: tuple[str, str, str]) -> web.StreamResponse:
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        since = int(request.query.get("resourceVersion") or 0)
        for obj in self.objects.get(key, {}).values():
            if int(obj["metadata"]["resourceVersion"]) > since:
                queue.put_nowait(json.dumps({"type": "MODIFIED", "object": obj}).encode() + b"\n")
        self.watchers.setdefault(key, []).append(queue)
        response = web.StreamResponse()
        response.content_type = "application/json"
        await response.prepare(request)
        timeout = float(request.query.get("timeoutSeconds") or 600)
        try:
            async with asyncio.timeout(timeout):
                while True:
                    await response.write(await queue.get())
        except (TimeoutError, ConnectionResetError):
            pass
        finally:
            self.watchers[key].remove(queue)
        return response

    async def item(self, request: web.Request) -> web.Response:
        m = request.match_info
        key = (m["group"] + "/" + m["version"], m["ns"], m["plural"])
        sub = m.get("sub") or ""
        self._count(request, m["plural"], sub)
        obj = self.objects.get(key, {}).get(m["name"])
        if obj is None:
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        if request.method == "GET":
            return web.json_response(obj)
        patch = await request.json()
        if isinstance(patch, list):  # a JSON patch: only "replace"/"add" of plain paths
            for op in patch:
                *parents, last = op["path"].strip("/").split("/")
                node = obj
                for part in parents:
                    node = node.setdefault(part, {})
                node[last] = op.get("value")
        else:
            merge(obj, patch)
        if m["plural"] == "dynamographdeployments" and not sub:
            self._converge(obj)
        self._store(key, obj, "MODIFIED")
        return web.json_response(obj)

    def _converge(self, dgd: dict[str, Any]) -> None:
        services = (dgd.get("status") or {}).setdefault("services", {})
        for name, service in ((dgd.get("spec") or {}).get("services") or {}).items():
            replicas = int(service.get("replicas", 1))
            services[name] = {
                "replicas": replicas,
                "updatedReplicas": replicas,
                "readyReplicas": replicas,
                "availableReplicas": replicas,
            }
        dgd["status"]["state"] = "successful"

    async def core(self, request: web.Request) -> web.Response:
        self._count(request, request.match_info["plural"])
        if request.method == "POST":
            return web.json_response(await request.json(), status=201)
        if request.method == "GET":
            return web.json_response({"items": [], "metadata": {"resourceVersion": "1"}})
        return web.json_response({"kind": "Status", "code": 404}, status=404)

    async def query(self, request: web.Request) -> web.Response:
        self.stats["prometheus query"] += 1
        params: dict[str, Any] = dict(request.query)
        if request.method == "POST":
            params.update(await request.post())
        promql = str(params.get("query", ""))
        found = _WINDOW.search(promql)
        window_s = int(found.group(1)) / 1000 if found else 60.0
        at = float(params.get("time") or time.time())
        if "increase(" in promql:  # the parts' increases: an instant vector
            result: list[dict[str, Any]] = [
                {"metric": {"planner_part": part}, "value": [at, str(value)]}
                for part, value in traffic_parts(self.rate, window_s).items()
            ]
            kind = "vector"
        else:  # a counter's raw samples in the window (one frontend scraped every 5 s)
            steps = max(1, int(window_s // 5))
            values = [
                [at - window_s + k * window_s / steps, str(1e6 + self.rate * k * window_s / steps)]
                for k in range(steps + 1)
            ]
            result = [{"metric": {"instance": "frontend"}, "values": values}]
            kind = "matrix"
        return web.json_response(
            {"status": "success", "data": {"resultType": kind, "result": result}}
        )

    async def discovery(self, request: web.Request) -> web.Response:
        """The group/version's discovery document: the plurals it holds objects of (the
        connector resolves the DGD version it reads and writes from it)."""
        m = request.match_info
        self._count(request, "discovery")
        group_version = m["group"] + "/" + m["version"]
        plurals = sorted({plural for (gv, _, plural) in self.objects if gv == group_version})
        if not plurals:
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        resources = [
            {
                "name": plural,
                "singularName": plural.removesuffix("s"),
                "namespaced": True,
                "kind": plural,
                "verbs": ["get", "list", "watch", "create", "patch"],
            }
            for plural in plurals
        ]
        return web.json_response(
            {"kind": "APIResourceList", "groupVersion": group_version, "resources": resources}
        )

    async def stats_view(self, request: web.Request) -> web.Response:
        return web.json_response(dict(self.stats))


def app(cluster: Cluster) -> web.Application:
    application = web.Application()
    base = "/apis/{group}/{version}/namespaces/{ns}/{plural}"
    application.router.add_get("/apis/{group}/{version}", cluster.discovery)
    application.router.add_route("*", base, cluster.collection)
    application.router.add_route("*", base + "/{name}", cluster.item)
    application.router.add_route("*", base + "/{name}/{sub}", cluster.item)
    application.router.add_route("*", "/api/v1/namespaces/{ns}/{plural}", cluster.core)
    application.router.add_route("*", "/api/v1/namespaces/{ns}/{plural}/{name}", cluster.core)
    application.router.add_route("*", "/api/v1/query", cluster.query)
    application.router.add_get("/_stats", cluster.stats_view)
    return application


async def serve(port: int, rate: float) -> None:
    runner = web.AppRunner(app(Cluster(rate)), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, backlog=4096)
    await site.start()
    bound = runner.addresses[0][1]
    print(f"URL=http://127.0.0.1:{bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    # the watches never end by themselves: close without waiting for them
    with contextlib.suppress(Exception):
        await asyncio.wait_for(runner.cleanup(), timeout=2.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--rate", type=float, default=10.0)
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.rate))


if __name__ == "__main__":
    main()
