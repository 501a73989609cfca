"""Render the Helm chart with Helm itself (the Helm v4 library in the ``helm-sdkpy`` wheel).

Helm has no client-only render in that binding, so each case is a real ``helm install``
into its own fresh kmock API server (the in-memory release driver, ``HELM_DRIVER=memory``,
keeps Helm's release records out of kmock, which cannot parse their protobuf encoding).
Helm validates the values against values.schema.json, renders the templates, maps every
kind through discovery and creates the objects; the release's ``manifest`` is what
``helm template`` would print (CRDs from ``crds/`` are installed but not part of it).

Run in its own process (the Go runtime reads the environment once, when the library loads)::

    HELM_DRIVER=memory python -m tests.unit.deploy.helm_render CHART_DIR < cases.json

``cases.json``: ``[{"name": ..., "namespace": ..., "values": {...}}, ...]``; the output on
stdout is ``{"lint": <helm lint result>, "cases": [{"name": ..., "manifest": "..." | null,
"error": "..." | null}, ...]}``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Coroutine
from typing import Any

import kmock
import yaml

from tests.e2e.kmock_server import Emulator, declare_resources


class KmockLoop:
    """An event loop in a thread that serves kmock emulators on demand."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


async def _start(namespace: str) -> tuple[Any, Any, str]:
    emulator = Emulator()
    await emulator.__aenter__()
    server = kmock.Server(emulator, host="127.0.0.1", port=0)
    await server.__aenter__()
    declare_resources(emulator)
    emulator.objects["v1/namespaces", None, namespace] = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": namespace},
    }
    return emulator, server, str(server.url).rstrip("/")


async def _stop(emulator: Any, server: Any) -> None:
    await server.__aexit__(None, None, None)
    await emulator.__aexit__(None, None, None)


def kubeconfig(url: str, namespace: str) -> str:
    """A kubeconfig as YAML text (helm-sdkpy tells a YAML string from a path by its form)."""
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "kmock",
            "clusters": [{"name": "kmock", "cluster": {"server": url}}],
            "users": [{"name": "helm", "user": {"token": "helm"}}],
            "contexts": [
                {
                    "name": "kmock",
                    "context": {"cluster": "kmock", "user": "helm", "namespace": namespace},
                }
            ],
        }
    )


def render(chart: str, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    import helm_sdkpy

    loop = KmockLoop()
    results = []
    try:
        for case in cases:
            namespace = case.get("namespace", "planner")
            emulator, server, url = loop.run(_start(namespace))
            try:
                config = helm_sdkpy.Configuration(
                    namespace=namespace, kubeconfig=kubeconfig(url, namespace)
                )
                release = asyncio.run(
                    helm_sdkpy.Install(config).run(
                        case.get("release", "planner"),
                        chart,
                        values=case.get("values") or None,
                        wait=False,
                        timeout=60,
                    )
                )
                results.append(
                    {"name": case["name"], "manifest": release["manifest"], "error": None}
                )
            except helm_sdkpy.HelmError as exc:
                results.append({"name": case["name"], "manifest": None, "error": str(exc)})
            finally:
                loop.run(_stop(emulator, server))
    finally:
        loop.close()
    return results


def lint(chart: str) -> Any:
    """``helm lint`` of the chart with its default values."""
    import helm_sdkpy

    config = helm_sdkpy.Configuration(namespace="default")
    return asyncio.run(helm_sdkpy.Lint(config).run(chart))


def main() -> None:
    chart = sys.argv[1]
    cases = json.load(sys.stdin)
    json.dump({"lint": lint(chart), "cases": render(chart, cases)}, sys.stdout)


if __name__ == "__main__":
    main()
