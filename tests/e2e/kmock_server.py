"""kmock as a stand-alone Kubernetes API server on a real port (kmock 0.8 has no server CLI).

Run as ``python -m tests.e2e.kmock_server [--port N] [--request-log FILE]``; it prints
``KMOCK_URL=http://127.0.0.1:<port>`` once it serves and stops on SIGTERM/SIGINT. It serves
the built-in resources (``load_bundled()``: kopf waits for ``v1/events`` and Helm maps kinds
through discovery), the ``default`` namespace, and the resources the planner meets:
DynamoGraphDeployments and their scaling adapters (``nvidia.com/v1alpha1``), PlannerPolicies,
kopf's peering objects, and the Prometheus operator's ServiceMonitor/PodMonitor (so that a Helm
install of the chart can map every kind it renders).

Two kmock gaps are closed here (see ../shared/reference/stack-notes.md, section 2):

- ``/api/v1`` answers ``"groupVersion": "/v1"``; Helm's REST mapper then finds no core
  kinds ("no matches for kind ConfigMap in version v1"). It answers ``v1`` here.
- the requests are kept in memory only; with ``--request-log`` each one is also appended to
  a JSON-lines file (method, Kubernetes action, group, version, plural, subresource,
  namespace, name, the bearer token, the JSON body), so that a test in another process can
  check which API calls a client made.

Faults on demand (``--faults FILE``, for the chaos tests): the file holds a JSON list of rules
``{"token", "plural", "method", "count", "status", "delay_s"}`` (all but ``count`` optional;
an absent key matches everything). A request matching a rule with ``count`` left waits
``delay_s``, then is answered ``status`` (or served, without one, even when its client went
away meanwhile), and uses one up. The file
is read again whenever it changes, each new version starting its counts afresh.

Objects held at start (``--objects FILE``, a JSON list of ``{"resource":
"<group>/<version>/<plural>", "object": {...}}``): stored before the first request is served,
so that a restart (the chaos tests) comes back with what it held, as a real API server comes
back with etcd's objects; writing them back after the restart would leave a window in which
the server answers that they do not exist, which a real restart never does.

Gaps that remain (tests that depend on them say so): creates answer 200 instead of 201 (the
``kubernetes`` client then returns no body), no ``resourceVersion``/``uid``/``generation``,
``/status`` patches merge into the whole object, watches never end server-side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import kmock

from disagg_planner.operator.crd import GROUP as POLICY_GROUP
from disagg_planner.operator.crd import KIND as POLICY_KIND
from disagg_planner.operator.crd import PLURAL as POLICY_PLURAL
from disagg_planner.operator.crd import SHORT_NAMES as POLICY_SHORT_NAMES
from disagg_planner.operator.crd import SINGULAR as POLICY_SINGULAR
from disagg_planner.operator.crd import VERSION as POLICY_VERSION
from tests.kube_dynamo import declare_dynamo_resources

POLICY = f"{POLICY_GROUP}/{POLICY_VERSION}/{POLICY_PLURAL}"
PEERING = "kopf.dev/v1/kopfpeerings"
CLUSTER_PEERING = "kopf.dev/v1/clusterkopfpeerings"
SERVICE_MONITOR = "monitoring.coreos.com/v1/servicemonitors"
POD_MONITOR = "monitoring.coreos.com/v1/podmonitors"

_VERBS = frozenset({"get", "list", "watch", "create", "patch", "update", "delete"})


@dataclass
class Faults:
    """The rules of ``--faults FILE`` (module doc), read again when the file changes."""

    path: Path | None
    rules: list[dict[str, Any]] = field(default_factory=list)
    _version: float | None = None

    def take(self, seen: dict[str, Any]) -> dict[str, Any] | None:
        """The rule ``seen`` (a :func:`describe` record) meets, one use of it spent."""
        if self.path is None:
            return None
        try:
            version = self.path.stat().st_mtime_ns
        except OSError:
            return None
        if version != self._version:
            self._version = version
            self.rules = json.loads(self.path.read_text() or "[]")
        for rule in self.rules:
            if rule.get("count", 0) > 0 and all(
                seen.get(key) == rule[key] for key in ("token", "plural", "method") if key in rule
            ):
                rule["count"] -= 1
                return rule
        return None


class Emulator(kmock.KubernetesEmulator):
    """kmock's emulator with correct core discovery, an optional request log and faults."""

    def __init__(
        self,
        *args: Any,
        request_log: IO[str] | None = None,
        faults: Path | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._request_log = request_log
        self._faults = Faults(faults)

    async def _serve_version(self, request: Any) -> Any:
        doc = await super()._serve_version(request)
        if isinstance(doc, dict) and str(doc.get("groupVersion", "")).startswith("/"):
            doc["groupVersion"] = doc["groupVersion"][1:]  # the core group is "" -> "v1"
        return doc

    async def _handle(self, request: Any) -> Any:
        seen = describe(request)
        if self._request_log is not None:
            self._request_log.write(json.dumps(seen) + "\n")
            self._request_log.flush()
        fault = self._faults.take(seen)
        if fault is None:
            return await super()._handle(request)
        # Shielded: a request held on the wire is still served when its client went away
        # meanwhile, as an API server may commit a write whose answer nobody reads.
        return await asyncio.shield(self._faulty(fault, request))

    async def _faulty(self, fault: dict[str, Any], request: Any) -> Any:
        await asyncio.sleep(float(fault.get("delay_s", 0.0)))
        if fault.get("status"):
            raise kmock.KubernetesError(
                status=int(fault["status"]), reason="Injected", message="injected fault"
            )
        return await super()._handle(request)


def describe(request: Any) -> dict[str, Any]:
    """One request as plain JSON: what an authorizer would see, plus the body."""
    resource = request.resource
    auth = str(request.headers.get("Authorization", ""))
    return {
        "method": request.method.value,
        "action": request.action.value if request.action is not None else None,
        "group": resource.group if resource is not None else None,
        "version": resource.version if resource is not None else None,
        "plural": resource.plural if resource is not None else None,
        "subresource": request.subresource,
        "namespace": request.namespace,
        "name": request.name,
        "watch": request.params.get("watch") in ("true", "1"),
        "path": request.url.path,
        "token": auth.split(" ", 1)[1] if auth.lower().startswith("bearer ") else None,
        "data": request.data if isinstance(request.data, dict | list) else None,
    }


def declare_resources(k8s: Any) -> None:
    """The built-ins plus every custom resource the planner, kopf and the chart use."""
    k8s.resources.load_bundled()
    verbs = set(_VERBS)
    declare_dynamo_resources(k8s.resources, verbs=verbs)
    k8s.resources[POLICY] = kmock.ResourceInfo(
        kind=POLICY_KIND,
        singular=POLICY_SINGULAR,
        namespaced=True,
        verbs=verbs,
        shortnames=set(POLICY_SHORT_NAMES),
        subresources={"status"},
    )
    k8s.resources[PEERING] = kmock.ResourceInfo(
        kind="KopfPeering", singular="kopfpeering", namespaced=True, verbs=verbs
    )
    k8s.resources[CLUSTER_PEERING] = kmock.ResourceInfo(
        kind="ClusterKopfPeering", singular="clusterkopfpeering", namespaced=False, verbs=verbs
    )
    k8s.resources[SERVICE_MONITOR] = kmock.ResourceInfo(
        kind="ServiceMonitor", singular="servicemonitor", namespaced=True, verbs=verbs
    )
    k8s.resources[POD_MONITOR] = kmock.ResourceInfo(
        kind="PodMonitor", singular="podmonitor", namespaced=True, verbs=verbs
    )


async def serve(
    *,
    host: str,
    port: int,
    namespaces: list[str],
    request_log: Path | None,
    faults: Path | None = None,
    objects: Path | None = None,
) -> None:
    held = json.loads(objects.read_text(encoding="utf-8")) if objects is not None else []
    log_file = request_log.open("a", encoding="utf-8") if request_log is not None else None
    try:
        async with (
            Emulator(request_log=log_file, faults=faults) as k8s,
            kmock.Server(k8s, host=host, port=port) as server,
        ):
            declare_resources(k8s)
            for namespace in namespaces:
                k8s.objects["v1/namespaces", None, namespace] = {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": namespace},
                }
            # No await since the server started listening: nothing is served before these.
            for entry in held:
                obj = entry["object"]
                key = (entry["resource"], obj["metadata"].get("namespace"), obj["metadata"]["name"])
                k8s.objects[key] = obj
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            print(f"KMOCK_URL={str(server.url).rstrip('/')}", flush=True)
            await stop.wait()
    finally:
        if log_file is not None:
            log_file.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    parser.add_argument(
        "--namespace", action="append", default=None, help="namespaces to create (default: default)"
    )
    parser.add_argument("--request-log", type=Path, default=None, help="JSON-lines request log")
    parser.add_argument("--faults", type=Path, default=None, help="fault rules (module doc)")
    parser.add_argument(
        "--objects", type=Path, default=None, help="objects held at start (module doc)"
    )
    args = parser.parse_args(argv)
    asyncio.run(
        serve(
            host=args.host,
            port=args.port,
            namespaces=args.namespace or ["default"],
            request_log=args.request_log,
            faults=args.faults,
            objects=args.objects,
        )
    )


if __name__ == "__main__":
    main()
