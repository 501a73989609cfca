"""The pieces of the live end-to-end test, each a real process, socket or thread.

- :class:`KmockProcess`: kmock as the Kubernetes API server, in its own process on a real
  port (:mod:`tests.e2e.kmock_server`), logging every request it serves.
- :class:`SimulatedDeployment`: a simulated Dynamo deployment
(:class:`disagg_planner.simulator.cluster.
  Cluster`) advanced in wall-clock time by a thread. Its frontend serves Dynamo's metrics in
  the Prometheus text format over HTTP; each engine publishes its ForwardPassMetrics on a ZMQ
  PUB socket (one socket per worker slot, so that the planner's endpoints are known before
  the workers exist), with an idle heartbeat every second as Dynamo's engines do. Requests
  arrive at a constant rate (evenly spaced, so a throughput window holds a predictable count)
  that the test changes while it runs.
- :class:`DynamoOperatorSim`: a small stand-in for the Dynamo operator: it watches the DGD's
  replicas, starts and stops simulated workers (they serve after a startup delay) and writes
  the DGD's status the way the Dynamo operator does. On a scale-down it removes the pods a
  ReplicaSet would (not ready first, then the lowest ``controller.kubernetes.io/
  pod-deletion-cost``, then the most recently ready); a removed worker is SIGTERMed as Dynamo's
  are: it leaves discovery at once (no new request) and what it still serves after
  ``DYNAMO_GRACE_S`` is cut (:attr:`SimulatedDeployment.cut`).
- :class:`OperatorProcess`: ``planner operator`` as its own process, with its log in a file.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import zmq
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from disagg_planner.observe.fpm_discovery import FPM_TOPIC
from disagg_planner.signals.fpm import (
    ForwardPassMetrics,
    QueuedRequestMetrics,
    ScheduledRequestMetrics,
    encode,
)
from disagg_planner.simulator.cluster import Cluster, ReplicaState
from tests.integration.conftest import free_port, poll
from tests.kube_dynamo import DWM_PLURAL

REPO = Path(__file__).resolve().parents[2]
# The processes run this checkout's package (src layout) and tests, whatever is installed.
PYTHONPATH = os.pathsep.join((str(REPO / "src"), str(REPO)))
DGD_GROUP, DGD_VERSION, DGD_PLURAL = "nvidia.com", "v1alpha1", "dynamographdeployments"
HEARTBEAT_S = 1.0
STEP_S = 0.02
# Dynamo cancels what a SIGTERMed worker still serves after its grace period
# (DYN_GRACEFUL_SHUTDOWN_GRACE_PERIOD_SECS, 5 s by default); shorter here, so that removing a
# busy worker shows in a scenario whose requests are short.
DYNAMO_GRACE_S = 1.0
POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"


# --- kmock ------------------------------------------------------------------------------------


class KmockProcess:
    """``python -m tests.e2e.kmock_server`` on a free port; ``requests()`` reads its log."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.request_log = workdir / "kmock-requests.jsonl"
        self.output = workdir / "kmock.log"
        self.faults_file = workdir / "kmock-faults.json"
        self.url = ""
        self._process: subprocess.Popen[bytes] | None = None

    def start(
        self,
        timeout_s: float = 30.0,
        *,
        port: int = 0,
        objects: Sequence[tuple[str, Mapping[str, Any]]] = (),
    ) -> None:
        """Serve on ``port`` (0: a free one, from this xdist worker's own ports; a restart
        passes the one it had), holding ``objects`` (``(group/version/plural, object)``) from
        the first request on."""
        if port == 0:
            port = free_port()
        held = self.workdir / "kmock-objects.json"
        held.write_text(
            json.dumps([{"resource": resource, "object": obj} for resource, obj in objects])
        )
        with self.output.open("wb") as out:
            self._process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.e2e.kmock_server",
                    "--request-log",
                    str(self.request_log),
                    "--faults",
                    str(self.faults_file),
                    "--objects",
                    str(held),
                    f"--port={port}",
                ],
                cwd=REPO,
                env={**os.environ, "PYTHONPATH": PYTHONPATH},
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

        def url() -> str | None:
            if self._process is not None and self._process.poll() is not None:
                raise RuntimeError(f"kmock exited:\n{self.output.read_text(errors='replace')}")
            match = re.search(r"KMOCK_URL=(\S+)", self.output.read_text(errors="replace"))
            return match.group(1) if match else None

        self.url = poll(url, timeout_s=timeout_s, what="kmock to serve")

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def kill(self) -> None:
        """SIGKILL: the API server is gone at once, with everything it held in memory."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(timeout=10)

    def inject(self, *rules: dict[str, Any]) -> None:
        """Faults from now on (tests.e2e.kmock_server's module doc); none: clear them."""
        tmp = self.faults_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(list(rules)))
        tmp.replace(self.faults_file)

    def requests(self) -> list[dict[str, Any]]:
        if not self.request_log.exists():
            return []
        lines = self.request_log.read_text(encoding="utf-8").splitlines()
        # the last line may be half-written while the server runs
        return [json.loads(line) for line in lines if line.endswith("}")]

    def kubeconfig(self, path: Path, *, token: str, namespace: str = "default") -> Path:
        """A kubeconfig for this server; the token names the client in the request log."""
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "kmock",
                    "clusters": [{"name": "kmock", "cluster": {"server": self.url}}],
                    "users": [{"name": "client", "user": {"token": token}}],
                    "contexts": [
                        {
                            "name": "kmock",
                            "context": {
                                "cluster": "kmock",
                                "user": "client",
                                "namespace": namespace,
                            },
                        }
                    ],
                }
            )
        )
        return path

    def api_client(self, *, token: str) -> k8s_client.ApiClient:
        configuration = k8s_client.Configuration()
        configuration.host = self.url
        configuration.api_key = {"authorization": token}
        configuration.api_key_prefix = {"authorization": "Bearer"}
        return k8s_client.ApiClient(configuration)


# --- the simulated deployment -----------------------------------------------------------------


@dataclass(frozen=True)
class Arrival:
    """One request of the load (the simulator's ``RequestLike``)."""

    arrival_s: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] | None = None


class ConstantRate:
    """Evenly spaced arrivals at ``rate`` requests/s; the rate may change at any time (the
    next gap uses the new one). Sim time starts at 0 when the deployment starts."""

    def __init__(self, rate: float, *, isl: int, osl: int) -> None:
        self.rate = rate
        self.isl = isl
        self.osl = osl

    def __iter__(self) -> Iterator[Arrival]:
        t = 0.0
        while True:
            t += 1.0 / self.rate
            yield Arrival(arrival_s=t, input_length=self.isl, output_length=self.osl)


@dataclass
class _Slot:
    """One FPM publisher socket of a role; a worker holds it while it runs."""

    endpoint: str
    socket: Any
    sequence: int = 0
    worker: str | None = None
    last_sent_s: float = -math.inf


@dataclass
class SimulatedDeployment:
    """A simulated disaggregated deployment in wall-clock time (see the module doc)."""

    engine: str
    model: str
    dynamo_namespace: str
    isl: int
    osl: int
    rate: float
    startup_delay_s: float
    slots_per_role: int = 4
    initial: Mapping[str, int] = field(default_factory=lambda: {"prefill": 1, "decode": 1})

    def __post_init__(self) -> None:
        self.errors: list[str] = []
        # Requests a SIGTERMed worker still held after DYNAMO_GRACE_S: (worker, count).
        self.cut: list[tuple[str, int]] = []
        self._graced: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._load = ConstantRate(self.rate, isl=self.isl, osl=self.osl)
        self._context = zmq.Context()
        self._slots: dict[str, list[_Slot]] = {}
        for role in ("prefill", "decode"):
            slots = []
            for _ in range(self.slots_per_role):
                sock = self._context.socket(zmq.PUB)
                sock.setsockopt(zmq.LINGER, 0)
                port = sock.bind_to_random_port("tcp://127.0.0.1")
                slots.append(_Slot(f"tcp://127.0.0.1:{port}", sock))
            self._slots[role] = slots
        self.cluster = Cluster(
            engines={"prefill": self.engine, "decode": self.engine},
            replicas=dict(self.initial),
            startup_delay_s=self.startup_delay_s,
            model_label=self.model,
            namespace=self.dynamo_namespace,
            on_fpm=self._publish,
        )
        self.cluster.submit(iter(self._load))
        self._t0 = 0.0
        self._thread = threading.Thread(target=self._run, name="sim-cluster", daemon=True)
        deployment = self

        class Frontend(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with deployment._lock:
                    body = deployment.cluster.frontend.render_prometheus_text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Frontend)
        self._http.daemon_threads = True
        self._http_thread = threading.Thread(
            target=self._http.serve_forever, args=(0.1,), name="sim-frontend", daemon=True
        )

    # -- what the planner and Prometheus are told ----------------------------------------
    @property
    def frontend_target(self) -> str:
        return f"127.0.0.1:{self._http.server_address[1]}"

    def fpm_endpoints(self, role: str) -> list[str]:
        return [slot.endpoint for slot in self._slots[role]]

    # -- control --------------------------------------------------------------------------
    def start(self) -> None:
        self._t0 = time.monotonic()
        self._thread.start()
        self._http_thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self._http.shutdown()
        self._http.server_close()
        for slots in self._slots.values():
            for slot in slots:
                slot.socket.close(linger=0)
        self._context.term()

    def set_rate(self, rate: float) -> None:
        self._load.rate = rate

    def set_replicas(self, role: str, n: int, *, leaving: tuple[str, ...] = ()) -> None:
        """``leaving``: the workers whose pods Kubernetes deletes (they drain first)."""
        with self._lock:
            self.cluster.set_replicas(role, n, leaving=leaving)

    def workers(self) -> dict[str, tuple[str, bool, str]]:
        """Every worker that holds its GPUs (starting, ready or draining): worker id ->
        (role, ready, its FPM publisher's endpoint), as its pod and worker metadata say."""
        out: dict[str, tuple[str, bool, str]] = {}
        with self._lock:
            for replica in self.cluster.replicas:
                if replica.state is ReplicaState.STOPPED:
                    continue
                slot = self._slot_of(replica.role, replica.worker_id)
                if slot is not None:
                    ready = replica.state is ReplicaState.READY
                    out[replica.worker_id] = (replica.role, ready, slot.endpoint)
        return out

    def counts(self, role: str) -> tuple[int, int]:
        """(desired, ready) replicas of ``role``."""
        with self._lock:
            return self.cluster.desired_replicas(role), self.cluster.ready_replicas(role)

    # -- the clock thread -----------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                try:
                    self.cluster.run_until(time.monotonic() - self._t0)
                    self._cut_after_grace()
                    self._release_stopped_workers()
                    self._heartbeats()
                except Exception as exc:  # surfaced by the test, never swallowed
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    return
            self._stop.wait(STEP_S)

    def _slot_of(self, role: str, worker: str) -> _Slot | None:
        slots = self._slots[role]
        for slot in slots:
            if slot.worker == worker:
                return slot
        for slot in slots:
            if slot.worker is None:
                slot.worker = worker
                slot.last_sent_s = -math.inf
                return slot
        self.errors.append(f"no free FPM slot for {worker} ({len(slots)} per role)")
        return None

    def _send(self, slot: _Slot, fpm: ForwardPassMetrics) -> None:
        # Dynamo's wire format: [topic, sequence (8 bytes, big-endian), msgpack payload]
        slot.socket.send_multipart([b"", slot.sequence.to_bytes(8, "big"), encode(fpm)])
        slot.sequence += 1
        slot.last_sent_s = time.monotonic()

    def _publish(self, fpm: ForwardPassMetrics) -> None:
        role = fpm.worker_id.rsplit("-", 1)[0]
        slot = self._slot_of(role, fpm.worker_id)
        if slot is not None:
            self._send(slot, fpm)

    def _cut_after_grace(self) -> None:
        """Dynamo's grace period: a draining worker still serving after it is cut."""
        now = self.cluster.now
        for replica in self.cluster.replicas:
            if (
                replica.state is ReplicaState.DRAINING
                and replica.drain_s is not None
                and now - replica.drain_s > DYNAMO_GRACE_S
                and replica.worker_id not in self._graced
            ):
                self._graced.add(replica.worker_id)
                held = sum(engine.num_requests for engine in replica.ranks)
                if held:
                    self.cut.append((replica.worker_id, held))

    def _release_stopped_workers(self) -> None:
        stopped = {x.worker_id for x in self.cluster.replicas if x.state is ReplicaState.STOPPED}
        for slots in self._slots.values():
            for slot in slots:
                if slot.worker in stopped:
                    slot.worker = None

    def _heartbeats(self) -> None:
        """An idle engine says so every second (a busy one reports every iteration)."""
        now = time.monotonic()
        for replica in self.cluster.replicas:
            if replica.state is not ReplicaState.READY:
                continue
            for engine in replica.ranks:
                slot = self._slot_of(replica.role, engine.worker_id)
                if slot is None or now - slot.last_sent_s < HEARTBEAT_S:
                    continue
                self._send(
                    slot,
                    ForwardPassMetrics(
                        version=1,
                        worker_id=engine.worker_id,
                        dp_rank=engine.dp_rank,
                        counter_id=engine.counter_id,
                        wall_time=0.0,
                        scheduled_requests=ScheduledRequestMetrics(),
                        queued_requests=QueuedRequestMetrics(),
                    ),
                )


# --- the Dynamo operator's part ---------------------------------------------------------------


class DynamoOperatorSim:
    """Follows the DGD's worker replicas and reports the simulated workers in its status.

    ``history`` records every desired count it saw change, as ``(monotonic time, service,
    replicas)``; the first entry per service is the initial spec.
    """

    def __init__(
        self,
        api: k8s_client.ApiClient,
        deployment: SimulatedDeployment,
        *,
        namespace: str,
        name: str,
        services: Mapping[str, str],
        poll_s: float = 0.2,
    ) -> None:
        self._api = k8s_client.CustomObjectsApi(api)
        self._core = k8s_client.CoreV1Api(api)
        self._deployment = deployment
        self.namespace = namespace
        self.name = name
        self.services = dict(services)  # role -> DGD service name
        self.poll_s = poll_s
        self.history: list[tuple[float, str, int]] = []
        self.errors: list[str] = []
        self._desired: dict[str, int] = {}
        self._reported: dict[str, Any] | None = None
        self._pods: dict[str, bool] = {}  # pod name -> ready, as last written
        self._ready_since: dict[str, float] = {}  # pod name -> when it became ready
        # Every pod removed on a scale-down: (pod name, its pod-deletion-cost annotation).
        self.removed: list[tuple[str, str | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dynamo-operator", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def spec_replicas(self) -> dict[str, int]:
        """The last desired count per role seen in the DGD."""
        return dict(self._desired)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._reconcile()
            except (ApiException, OSError) as exc:  # the test reads these
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(self.poll_s)

    def _reconcile(self) -> None:
        dgd: dict[str, Any] = self._api.get_namespaced_custom_object(  # type: ignore[assignment]
            DGD_GROUP, DGD_VERSION, self.namespace, DGD_PLURAL, self.name
        )
        services: dict[str, Any] = dgd["spec"]["services"]
        for role, service in self.services.items():
            wanted = int(services[service].get("replicas", 1))
            if self._desired.get(role) != wanted:
                before = self._desired.get(role)
                self._desired[role] = wanted
                self.history.append((time.monotonic(), role, wanted))
                leaving: tuple[str, ...] = ()
                if before is not None and wanted < before:
                    leaving = self._replica_set_choice(role, before - wanted)
                self._deployment.set_replicas(role, wanted, leaving=leaving)
        self._sync_workers()
        reported: dict[str, Any] = {}
        for name, service in services.items():
            wanted = int(service.get("replicas", 1))
            ready = wanted
            owner = next((r for r, s in self.services.items() if s == name), None)
            if owner is not None:
                ready = self._deployment.counts(owner)[1]
            reported[name] = {
                "replicas": wanted,
                "updatedReplicas": wanted,
                "readyReplicas": ready,
                "availableReplicas": ready,
            }
        if reported != self._reported:
            stable = all(s["availableReplicas"] == s["replicas"] for s in reported.values())
            self._api.patch_namespaced_custom_object_status(
                DGD_GROUP,
                DGD_VERSION,
                self.namespace,
                DGD_PLURAL,
                self.name,
                {
                    "status": {
                        "state": "successful" if stable else "pending",
                        "services": reported,
                    }
                },
            )
            self._reported = reported

    def _replica_set_choice(self, role: str, count: int) -> tuple[str, ...]:
        """The ``count`` workers of ``role`` whose pods a ReplicaSet deletes: not ready first,
        then the lowest pod-deletion-cost, then the most recently ready."""
        ranked = []
        for pod in self._core.list_namespaced_pod(self.namespace).items:
            metadata = pod.metadata
            assert metadata is not None and metadata.name is not None
            name = metadata.name
            labels = metadata.labels or {}
            if (
                labels.get("nvidia.com/dynamo-graph-deployment-name") != self.name
                or labels.get("nvidia.com/dynamo-component") != self.services[role]
            ):
                continue
            annotations = metadata.annotations or {}
            cost = annotations.get(POD_DELETION_COST)
            ready = self._pods.get(name, False)
            ranked.append(((ready, int(cost or 0), -self._ready_since.get(name, 0.0)), name, cost))
        ranked.sort()
        chosen = ranked[:count]
        self.removed.extend((name, cost) for _, name, cost in chosen)
        prefix = f"{self.name}-"
        return tuple(name.removeprefix(prefix) for _, name, _ in chosen)

    def _sync_workers(self) -> None:
        """Each worker's Pod (labelled as Dynamo labels them, ready once it serves) and its
        DynamoWorkerMetadata (its FPM channel on the ZMQ event plane), as Dynamo's operator
        and workers write them: what the planner's discovery reads."""
        workers = self._deployment.workers()
        for worker, (role, ready, endpoint) in workers.items():
            name = self._pod_name(worker)
            if name not in self._pods:
                # The client's pydantic validate_call turns the dict into a V1Pod; its
                # annotation admits only the model.
                self._core.create_namespaced_pod(
                    self.namespace,
                    worker_pod(name, self.name, self.services[role], self.namespace),  # type: ignore[arg-type]
                )
                self._api.create_namespaced_custom_object(
                    DGD_GROUP,
                    DGD_VERSION,
                    self.namespace,
                    DWM_PLURAL,
                    worker_metadata(name, endpoint, self.namespace),
                )
                self._pods[name] = False
            if self._pods[name] != ready:
                condition = {"type": "Ready", "status": "True" if ready else "False"}
                self._core.patch_namespaced_pod_status(
                    name, self.namespace, {"status": {"conditions": [condition]}}
                )
                self._pods[name] = ready
                if ready:
                    self._ready_since[name] = time.monotonic()
        gone = set(self._pods) - {self._pod_name(w) for w in workers}
        for name in gone:
            # Kubernetes garbage-collects a pod's DynamoWorkerMetadata (owned by the pod).
            self._core.delete_namespaced_pod(name, self.namespace)
            self._api.delete_namespaced_custom_object(
                DGD_GROUP, DGD_VERSION, self.namespace, DWM_PLURAL, f"{name}-main"
            )
            del self._pods[name]
            self._ready_since.pop(name, None)

    def _pod_name(self, worker: str) -> str:
        return f"{self.name}-{worker}"


def worker_pod(name: str, dgd: str, service: str, namespace: str) -> dict[str, Any]:
    """A worker's Pod with the labels Dynamo's operator puts on it; not ready yet."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                "nvidia.com/dynamo-graph-deployment-name": dgd,
                "nvidia.com/dynamo-component": service,
            },
        },
        "spec": {"containers": [{"name": "main"}]},
        "status": {"conditions": [{"type": "Ready", "status": "False"}]},
    }


def worker_metadata(pod: str, endpoint: str, namespace: str) -> dict[str, Any]:
    """The DynamoWorkerMetadata a worker writes (container mode: ``<pod>-<container>``,
    owned by its pod), with its FPM relay's channel on the ZMQ event plane."""
    return {
        "apiVersion": f"{DGD_GROUP}/{DGD_VERSION}",
        "kind": "DynamoWorkerMetadata",
        "metadata": {
            "name": f"{pod}-main",
            "namespace": namespace,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": pod}],
        },
        "spec": {
            "data": {
                "event_channels": {
                    "dyn/backend/forward-pass-metrics": {
                        "type": "EventChannel",
                        "namespace": namespace,
                        "component": "backend",
                        "topic": FPM_TOPIC,
                        "instance_id": 1,
                        "transport": {"kind": "Zmq", "config": {"endpoint": endpoint}},
                    }
                }
            }
        },
    }


# --- planner operator -------------------------------------------------------------------------

_SUMMARY = re.compile(
    r"\[summary\] (?P<action>\S+)(?: \((?P<why>[^)]*)\))? \| "
    r"current: (?P<current>[^|]*)\| recommended: "
    r"(?P<recommended>[^|]*)\| throughput_reason=(?P<throughput>\S+) load_reason=(?P<load>\S+)"
)


@dataclass(frozen=True)
class Tick:
    """One ``[summary]`` line of the operator's log."""

    action: str
    current: str
    recommended: str
    throughput_reason: str | None
    load_reason: str | None
    line: str


class OperatorProcess:
    """``python -m disagg_planner ... operator ...`` with its own kubeconfig, log in a file."""

    def __init__(self, args: list[str], *, kubeconfig: Path, log_path: Path) -> None:
        self.args = args
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("PLANNER_", "PROMETHEUS_", "DYN_", "KUBECONFIG", "POD_"))
        }
        env.update(KUBECONFIG=str(self.kubeconfig), PYTHONPATH=PYTHONPATH, PYTHONUNBUFFERED="1")
        with self.log_path.open("ab") as log:
            log.write(f"\n===== start {time.strftime('%H:%M:%S')} =====\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                [sys.executable, "-m", "disagg_planner", *self.args],
                cwd=self.log_path.parent,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs (a crashed or evicted pod)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def stop(self, timeout_s: float = 20.0) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        return self.process.returncode

    def log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def log_text(self, since: int = 0) -> str:
        if not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as f:
            f.seek(since)
            return f.read().decode(errors="replace")

    def ticks(self, since: int = 0) -> list[Tick]:
        out = []
        for line in self.log_text(since).splitlines():
            match = _SUMMARY.search(line)
            if match is None:
                continue
            tp, load = match.group("throughput"), match.group("load")
            out.append(
                Tick(
                    action=match.group("action"),
                    current=match.group("current").strip(),
                    recommended=match.group("recommended").strip(),
                    throughput_reason=None if tp == "-" else tp,
                    load_reason=None if load == "-" else load,
                    line=line,
                )
            )
        return out

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])
