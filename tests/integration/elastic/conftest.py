"""Elastic-EP servers on loopback ports, each following one real implementation, and
fixtures around them. :class:`FakeCurrentVllmEngine` (its own doc) follows current vLLM's
prepare/commit flow; the client still supports the older flow below, so it keeps its
stand-in.

:class:`FakeVllmEngine` follows **vLLM 0.17.0**'s API server
(``vllm/entrypoints/serve/elastic_ep/api_router.py``, its scaling middleware, and
``AsyncLLM.scale_elastic_ep``):

- ``POST /scale_elastic_ep``: 400 (FastAPI ``{"detail": ...}``) only for bad JSON and a missing
  or non-positive ``new_data_parallel_size`` or ``drain_timeout`` (default 120); the current
  size is a no-op 200; otherwise the router marks the engine as scaling and the engine
  resizes: it waits for in-flight requests only when started with
  ``VLLM_ELASTIC_EP_DRAIN_REQUESTS`` (``drain_requests``), a drain that does not finish is a
  ``TimeoutError``; the running engines are then told to reconfigure, and new engines that
  never start is a ``TimeoutError`` too, after which the reconfiguration stays active and
  every later resize fails ("Elastic EP reconfiguration is already active", in the log).
  Any ``TimeoutError`` answers 408 "Scale failed due to request drain timeout after N
  seconds"; any other error (a size beyond the engine's limit, a failed step) 500
  "Scale failed"; success 200 ``{"message": "Scaled to N data parallel engines"}``;
- while scaling, the middleware answers every request 503
  ``{"error": "The model is currently scaling. Please try again later."}``;
- ``POST /is_scaling_elastic_ep`` -> ``{"is_scaling_elastic_ep": bool}``.

:class:`FakeDynamoWorker` follows Dynamo's current vLLM worker's system-port control routes
(``components/src/dynamo/vllm/handlers.py``):

- ``POST /engine/control/scale_elastic_ep {"new_data_parallel_size": N}`` always answers 200:
  ``{"status": "ok", "message": ..., "new_data_parallel_size": N}``, or
  ``{"status": "error", "message": ...}`` for a missing or non-positive size, or during
  another resize "... already in progress; rejecting concurrent request ..." (every worker
  version; ``busy_status="busy"`` plays what only the operator's Go client expects). A failed
  grow either restarts the worker with no reply (fail-fast, the current handler) or answers
  ``{"status": "error", "recoverable": ..., "data_parallel_size": D}`` (the rollback variant);
- ``POST /engine/control/ep_capacity`` -> ``status``, ``data_parallel_size`` (live),
  ``tensor_parallel_size``, ``total_gpus``, ``available_gpus``, ``used_gpus`` and anonymous
  ``nodes: [{total_gpus, available_gpus}]`` (followers appear when
  :meth:`FakeDynamoWorker.join` is called);
- no ``is_scaling`` route and no ``drain_timeout`` (404 for any other path).

Both count calls and the most resizes they ever ran at once; ``on_scale`` runs (in the
server's thread) when a resize begins, so tests can look at the deployment at that moment.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

DRAIN_TIMEOUT_DEFAULT_S = 120  # the router's default


@dataclass(frozen=True)
class Call:
    path: str
    body: Any
    status: int


@dataclass(frozen=True)
class _ScaleBody:
    body: Any
    new_dp: int
    drain: int


def _router_checks(raw: bytes) -> _ScaleBody | tuple[int, Any, Any]:
    """vLLM's router's checks of a resize body: the 400 answer, or what passed them."""
    try:
        body = json.loads(raw)
    except ValueError:
        return 400, {"detail": "Invalid JSON format"}, None
    new_dp = body.get("new_data_parallel_size")
    drain = body.get("drain_timeout", DRAIN_TIMEOUT_DEFAULT_S)
    if new_dp is None:
        return 400, {"detail": "new_data_parallel_size is required"}, body
    if not isinstance(new_dp, int) or new_dp <= 0:
        return 400, {"detail": "new_data_parallel_size must be a positive integer"}, body
    if not isinstance(drain, int) or drain <= 0:
        return 400, {"detail": "drain_timeout must be a positive integer"}, body
    return _ScaleBody(body, new_dp, drain)


class _Server:
    """A threaded loopback HTTP server answering POSTs through ``self._post``."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.on_scale: Callable[[int], None] | None = None
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _post(self, path: str, raw: bytes) -> tuple[int, Any, Any]:
        raise NotImplementedError

    def _begin(self) -> None:
        self.active += 1
        self.max_active = max(self.max_active, self.active)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._answer(b"")

            def do_POST(self) -> None:
                self._answer(self.rfile.read(int(self.headers.get("Content-Length") or 0)))

            def _answer(self, raw: bytes) -> None:
                status, payload, body = server._post(self.path, raw)
                server.calls.append(Call(self.path, body, status))
                if status == 0:  # the process died mid-call: no reply at all
                    self.close_connection = True
                    return
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting (a test of lost answers)

        return Handler


class FakeVllmEngine(_Server):
    """vLLM 0.17.0's elastic-EP API server and engine (see the module doc)."""

    def __init__(
        self,
        *,
        dp: int = 16,
        max_dp: int = 64,
        resize_s: float = 0.05,
        drain_requests: bool = False,
    ) -> None:
        super().__init__()
        self.dp = dp
        self.max_dp = max_dp  # beyond it the engine raises (500 "Scale failed")
        self.resize_s = resize_s
        self.drain_requests = drain_requests  # VLLM_ELASTIC_EP_DRAIN_REQUESTS=1
        self.stuck_requests = False  # in-flight requests never finish
        self.new_engines_start_s: float | None = None  # None: start; else fail after this
        self.fail_next: list[str] = []  # engine errors for the next resizes, one each
        self.reconfiguration_active = False  # a failed reconfiguration left it so
        self.log: list[str] = []  # what the engine logs (vLLM hides it from the answer)
        self._scaling = False

    @property
    def scaling(self) -> bool:
        return self._scaling

    def scale_calls(self) -> list[Call]:
        return [c for c in self.calls if c.path == "/scale_elastic_ep"]

    def resize_in_background(self, new_dp: int, seconds: float) -> threading.Thread:
        """A resize someone else started (another client, a human with curl)."""

        def run() -> None:
            with self._lock:
                self._scaling = True
            time.sleep(seconds)
            with self._lock:
                self.dp = new_dp
                self._scaling = False

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def _engine_scale(self, new_dp: int, drain_timeout: int) -> None:
        """``AsyncLLM.scale_elastic_ep``: raises TimeoutError or another error."""
        if self.drain_requests and self.stuck_requests:
            time.sleep(drain_timeout)
            raise TimeoutError(f"Timeout reached after {drain_timeout} seconds")
        if self.reconfiguration_active:
            raise RuntimeError("Elastic EP reconfiguration is already active")
        if new_dp > self.max_dp:
            raise ValueError(f"Cannot scale to data_parallel_size {new_dp} > {self.max_dp}")
        if self.new_engines_start_s is not None:
            self.reconfiguration_active = True  # the running engines were told to
            time.sleep(self.new_engines_start_s)
            raise TimeoutError("new engine cores did not start")
        time.sleep(self.resize_s)
        if self.fail_next:
            raise RuntimeError(self.fail_next.pop(0))
        self.dp = new_dp

    def _post(self, path: str, raw: bytes) -> tuple[int, Any, Any]:
        if self._scaling:  # the scaling middleware
            return 503, {"error": "The model is currently scaling. Please try again later."}, None
        if path == "/is_scaling_elastic_ep":
            return 200, {"is_scaling_elastic_ep": self._scaling}, None
        if path != "/scale_elastic_ep":
            return 404, {"detail": "Not Found"}, None
        checked = _router_checks(raw)
        if isinstance(checked, tuple):
            return checked
        body, new_dp, drain = checked.body, checked.new_dp, checked.drain
        if new_dp == self.dp:
            return 200, {"message": f"Scaled to {new_dp} data parallel engines"}, body
        with self._lock:
            self._scaling = True
            self._begin()
        try:
            if self.on_scale is not None:
                self.on_scale(new_dp)
            self._engine_scale(new_dp, drain)
            return 200, {"message": f"Scaled to {new_dp} data parallel engines"}, body
        except TimeoutError:
            detail = f"Scale failed due to request drain timeout after {drain} seconds"
            return 408, {"detail": detail}, body
        except Exception as exc:
            self.log.append(f"Scale failed: {exc}")
            return 500, {"detail": "Scale failed"}, body
        finally:
            with self._lock:
                self.active -= 1
                self._scaling = False


class FakeCurrentVllmEngine(_Server):
    """Current vLLM's elastic-EP API server and engine: prepare, then commit.

    Follows ``AsyncLLM._scale_elastic_ep`` (``vllm/v1/engine/async_llm.py``), the newest
    router and middleware (``vllm/entrypoints/serve/elastic_ep/{api_router,middleware}.py``):

    - a resize first *prepares* (``prepare_s``; the engine keeps serving, no 503, the
      scaling flag unset, ``phase`` "idle"). A size under the engine's minimum is a
      ``ValueError`` there ("Cannot scale to data_parallel_size N, minimum is M"), which the
      router answers 400 with its text; a prepare that times out is a ``TimeoutError``
      (408) with nothing changed;
    - then the scaling flag is set (503 on every path but ``/health`` and
      ``/is_scaling_elastic_ep``; ``phase`` "committing"), the optional drain runs
      (``drain_requests``: VLLM_ELASTIC_EP_DRAIN_REQUESTS); a drain that times out resets
      the flag and keeps the size (408);
    - then the commit (``commit_s``); a commit that fails (``commit_fails``: a
      ``TimeoutError``) leaves the flag set: the engine stays "committing" (408);
    - a second resize queues on the engine's lock (no 503 during a preparation);
    - ``POST /is_scaling_elastic_ep`` -> ``{"is_scaling_elastic_ep": bool, "phase": ...}``;
    - any other engine error is 500 "Scale failed" (the reason only in ``log``).

    ``shrink_aborted`` counts the requests ``in_flight`` on removed ranks when a shrink
    commits (they are aborted, not moved).
    """

    def __init__(
        self,
        *,
        dp: int = 16,
        min_dp: int = 1,
        prepare_s: float = 0.05,
        commit_s: float = 0.05,
        drain_requests: bool = False,
    ) -> None:
        super().__init__()
        self.dp = dp
        self.min_dp = min_dp
        self.prepare_s = prepare_s
        self.commit_s = commit_s
        self.drain_requests = drain_requests
        self.stuck_requests = False  # in-flight requests never finish
        self.prepare_times_out = False
        self.commit_fails = False
        self.fail_next: list[str] = []
        self.log: list[str] = []
        self.in_flight_per_rank = 0
        self.shrink_aborted = 0
        self._flag = False
        self._resize_lock = threading.Lock()

    @property
    def phase(self) -> str:
        return "committing" if self._flag else "idle"

    def scale_calls(self) -> list[Call]:
        return [c for c in self.calls if c.path == "/scale_elastic_ep"]

    def _engine_scale(self, new_dp: int, drain_timeout: int) -> None:
        if new_dp < self.min_dp:
            raise ValueError(
                f"Cannot scale to data_parallel_size {new_dp}, minimum is {self.min_dp}"
            )
        time.sleep(self.prepare_s)
        if self.prepare_times_out:
            raise TimeoutError("new engines did not become ready during preparation")
        if self.fail_next:
            raise RuntimeError(self.fail_next.pop(0))
        self._flag = True
        if self.drain_requests and self.stuck_requests:
            time.sleep(drain_timeout)
            self._flag = False  # the drain failure resets the flag; the size is kept
            raise TimeoutError(f"Timeout reached after {drain_timeout} seconds")
        time.sleep(self.commit_s)
        if self.commit_fails:
            raise TimeoutError("commit: new engines did not report READY")  # flag stays
        if new_dp < self.dp and not self.drain_requests:
            self.shrink_aborted += (self.dp - new_dp) * self.in_flight_per_rank
        self.dp = new_dp
        self._flag = False

    def _post(self, path: str, raw: bytes) -> tuple[int, Any, Any]:
        if self._flag and path not in ("/health", "/is_scaling_elastic_ep"):
            return 503, {"error": "The model is currently scaling. Please try again later."}, None
        if path == "/health":
            return 200, {}, None
        if path == "/is_scaling_elastic_ep":
            return 200, {"is_scaling_elastic_ep": self._flag, "phase": self.phase}, None
        if path != "/scale_elastic_ep":
            return 404, {"detail": "Not Found"}, None
        checked = _router_checks(raw)
        if isinstance(checked, tuple):
            return checked
        body, new_dp, drain = checked.body, checked.new_dp, checked.drain
        with self._resize_lock:  # AsyncLLM's _elastic_ep_lock: a second call queues
            if new_dp == self.dp:
                return 200, {"message": f"Scaled to {new_dp} data parallel engines"}, body
            with self._lock:
                self._begin()
            try:
                if self.on_scale is not None:
                    self.on_scale(new_dp)
                self._engine_scale(new_dp, drain)
                return 200, {"message": f"Scaled to {new_dp} data parallel engines"}, body
            except TimeoutError:
                detail = f"Scale failed due to request drain timeout after {drain} seconds"
                return 408, {"detail": detail}, body
            except ValueError as exc:
                return 400, {"detail": str(exc)}, body
            except Exception as exc:
                self.log.append(f"Scale failed: {exc}")
                return 500, {"detail": "Scale failed"}, body
            finally:
                with self._lock:
                    self.active -= 1


class FakeDynamoWorker(_Server):
    """Dynamo's vLLM worker's elastic-EP control routes (see the module doc).

    ``failure`` picks the worker variant for a grow the engine fails (``fail_next``):
    ``"fail_fast"`` (the current handler: the worker process exits and restarts, the call
    gets no reply; ``restarts`` counts it and the restarted worker reports its old size) or
    ``"rollback"`` (``{"status": "error", "recoverable": ..., "data_parallel_size": D}``).
    ``nodes`` are anonymous, with ``total_gpus`` and ``available_gpus`` as the current
    handler reports them; the engine's ranks use ``tensor_parallel_size`` GPUs each on one
    node (``place_ranks=False``: GPUs are not tracked, for tests of the route alone)."""

    def __init__(
        self,
        *,
        dp: int = 16,
        gpus_per_rank: int = 1,
        resize_s: float = 0.05,
        busy_status: str = "error",
        failure: str = "fail_fast",
        place_ranks: bool = True,
    ) -> None:
        super().__init__()
        self.place_ranks = place_ranks  # False: GPUs are not tracked (no followers)
        self.dp = dp
        self.gpus_per_rank = gpus_per_rank
        self.resize_s = resize_s
        self.busy_status = busy_status
        self.failure = failure
        self.recoverable = True
        self.restarts = 0
        self.fail_next: list[str] = []  # engine errors for the next resizes
        self.echo_size: int | None = None  # answer ok for this size instead of the asked one
        head = float(dp * gpus_per_rank)
        self.nodes: list[dict[str, Any]] = [{"total_gpus": head, "available_gpus": 0.0}]
        self._in_progress = False

    def join(self, node_ip: str, gpus: float) -> None:
        """A follower's raylet joined the leader's Ray cluster (its GPUs free)."""
        del node_ip  # the current handler reports nodes anonymously
        with self._lock:
            self.nodes.append({"total_gpus": gpus, "available_gpus": gpus})

    def scale_calls(self) -> list[Call]:
        return [c for c in self.calls if c.path == "/engine/control/scale_elastic_ep"]

    def _place(self, ranks: int) -> None:
        """New ranks take ``gpus_per_rank`` GPUs each on one node (vLLM's placement)."""
        for node in self.nodes:
            while ranks > 0 and node["available_gpus"] >= self.gpus_per_rank:
                node["available_gpus"] -= self.gpus_per_rank
                ranks -= 1
        if ranks:
            raise RuntimeError("no node has tensor_parallel_size free GPUs for a new rank")

    def _release(self, ranks: int) -> None:
        for node in reversed(self.nodes):
            while ranks > 0 and node["available_gpus"] + self.gpus_per_rank <= node["total_gpus"]:
                node["available_gpus"] += self.gpus_per_rank
                ranks -= 1

    def _capacity(self, body: Any) -> tuple[int, Any, Any]:
        with self._lock:
            total = sum(n["total_gpus"] for n in self.nodes)
            free = sum(n["available_gpus"] for n in self.nodes)
            reply = {
                "status": "ok",
                "data_parallel_size": self.dp,
                "tensor_parallel_size": self.gpus_per_rank,
                "data_parallel_backend": "ray",
                "data_parallel_external_lb": False,
                "total_gpus": total,
                "available_gpus": free,
                "used_gpus": total - free,
                "nodes": [dict(n) for n in self.nodes],
            }
        return 200, reply, body

    def _post(self, path: str, raw: bytes) -> tuple[int, Any, Any]:
        body = json.loads(raw) if raw else {}
        if path == "/engine/control/ep_capacity":
            return self._capacity(body)
        if path != "/engine/control/scale_elastic_ep":
            return 404, {"detail": "Not Found"}, body
        new_dp = body.get("new_data_parallel_size")
        if new_dp is None:
            return (
                200,
                {"status": "error", "message": "Missing required field: new_data_parallel_size"},
                body,
            )
        if not isinstance(new_dp, int) or new_dp < 1:
            message = "new_data_parallel_size must be a positive integer"
            return 200, {"status": "error", "message": message}, body
        with self._lock:
            if self._in_progress:
                if self.busy_status == "busy":  # what the operator's client expects
                    return 200, {"status": "busy", "message": "scale in progress"}, body
                message = (
                    "A scale_elastic_ep operation is already in progress; rejecting "
                    f"concurrent request for new_data_parallel_size={new_dp}"
                )
                return 200, {"status": "error", "message": message}, body
            self._in_progress = True
            self._begin()
        try:
            if self.on_scale is not None:
                self.on_scale(new_dp)
            if new_dp != self.dp:
                time.sleep(self.resize_s)
                if self.fail_next:
                    reason = self.fail_next.pop(0)
                    if self.failure == "fail_fast":
                        self.restarts += 1  # os._exit(1): the pod restarts, no reply
                        return 0, None, body
                    return (
                        200,
                        {
                            "status": "error",
                            "message": reason,
                            "recoverable": self.recoverable,
                            "data_parallel_size": self.dp,
                        },
                        body,
                    )
                with self._lock:
                    if not self.place_ranks:
                        pass
                    elif new_dp > self.dp:
                        self._place(new_dp - self.dp)
                    else:
                        self._release(self.dp - new_dp)
                self.dp = new_dp
            echoed = self.echo_size if self.echo_size is not None else new_dp
            return (
                200,
                {
                    "status": "ok",
                    "message": f"Scaled to data_parallel_size={echoed}",
                    "new_data_parallel_size": echoed,
                },
                body,
            )
        finally:
            with self._lock:
                self.active -= 1
                self._in_progress = False


class FakeRayDashboard(_Server):
    """A Ray dashboard's state API: ``GET /api/v0/nodes`` lists the cluster's nodes
    (``{"result": true, "msg": ..., "data": {"result": {"total": n, "result": [node, ...]}}}``,
    each node with ``node_ip``, ``state`` and ``resources_total``)."""

    def __init__(self, *, head_gpus: float = 16.0) -> None:
        super().__init__()
        self.nodes: list[dict[str, Any]] = [
            {
                "node_id": "n-10.0.0.1",
                "node_ip": "10.0.0.1",
                "state": "ALIVE",
                "resources_total": {"GPU": head_gpus},
            }
        ]
        # ``GET /api/v0/actors``: the engine's actors (vLLM's engines), by node
        self.actors: list[dict[str, Any]] = [
            {"actor_id": "a0", "state": "ALIVE", "node_id": "n-10.0.0.1"}
        ]

    def join(self, node_ip: str, gpus: float, state: str = "ALIVE") -> None:
        with self._lock:
            self.nodes.append(
                {
                    "node_id": f"n-{node_ip}",
                    "node_ip": node_ip,
                    "state": state,
                    "resources_total": {"CPU": 8.0, "GPU": gpus},
                }
            )

    def place(self, node_ip: str, alive: bool = True) -> None:
        """An engine actor on ``node_ip`` (alive), or its actors gone (not alive)."""
        with self._lock:
            if alive:
                actor = {"actor_id": node_ip, "state": "ALIVE", "node_id": f"n-{node_ip}"}
                self.actors.append(actor)
            else:
                self.actors = [a for a in self.actors if a["node_id"] != f"n-{node_ip}"]

    def _post(self, path: str, raw: bytes) -> tuple[int, Any, Any]:
        route = path.split("?")[0]
        if route not in ("/api/v0/nodes", "/api/v0/actors"):
            return 404, {"detail": "Not Found"}, None
        with self._lock:
            rows = list(self.nodes if route == "/api/v0/nodes" else self.actors)
        data = {"result": {"total": len(rows), "num_after_truncation": len(rows), "result": rows}}
        return 200, {"result": True, "msg": "", "data": data}, None


def _factory(cls: type[_Server]) -> Iterator[Callable[..., Any]]:
    servers: list[_Server] = []

    def start(**kwargs: Any) -> Any:
        server = cls(**kwargs)
        server.start()
        servers.append(server)
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def engine_factory() -> Iterator[Callable[..., FakeVllmEngine]]:
    """``start(**kwargs)`` -> a running :class:`FakeVllmEngine`, stopped after the test."""
    yield from _factory(FakeVllmEngine)


@pytest.fixture
def current_engine_factory() -> Iterator[Callable[..., FakeCurrentVllmEngine]]:
    """``start(**kwargs)`` -> a running :class:`FakeCurrentVllmEngine`, stopped after the
    test."""
    yield from _factory(FakeCurrentVllmEngine)


@pytest.fixture
def dynamo_factory() -> Iterator[Callable[..., FakeDynamoWorker]]:
    """``start(**kwargs)`` -> a running :class:`FakeDynamoWorker`, stopped after the test."""
    yield from _factory(FakeDynamoWorker)


@pytest.fixture
def ray_factory() -> Iterator[Callable[..., FakeRayDashboard]]:
    """``start(**kwargs)`` -> a running :class:`FakeRayDashboard`, stopped after the test."""
    yield from _factory(FakeRayDashboard)
