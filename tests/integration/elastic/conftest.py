"""A vLLM-like elastic-EP admin server on a loopback port, and fixtures around it.

:class:`FakeVllmEngine` answers ``POST /scale_elastic_ep`` and ``POST /is_scaling_elastic_ep``
the way vLLM's API server does (``vllm/frontend/entrypoints/serve/elastic_ep``):

- 400 for bad JSON, a missing or non-positive ``new_data_parallel_size`` or ``drain_timeout``
  (FastAPI ``{"detail": ...}`` bodies), and for a size the engine refuses (a ValueError);
- the current size is a no-op 200;
- a resize marks the engine as scaling, drains (408 "Scale failed due to request drain
  timeout after N seconds" when requests are stuck, after ``drain_timeout`` seconds), then
  reconfigures for ``resize_s`` seconds (500 "Scale failed" when told to fail) and answers
  200 ``{"message": "Scaled to N data parallel engines"}``;
- while scaling, with ``middleware_503`` (older vLLM's ScalingMiddleware) every request gets
  503 ``{"error": "The model is currently scaling. Please try again later."}``; without it
  ``/is_scaling_elastic_ep`` answers true and a second resize is refused with 400.

It counts calls and the most resizes it ever ran at once, and ``on_scale`` runs (in the
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


@dataclass(frozen=True)
class Call:
    path: str
    body: Any
    status: int


class FakeVllmEngine:
    def __init__(
        self,
        *,
        dp: int = 16,
        max_dp: int = 64,
        resize_s: float = 0.05,
        middleware_503: bool = True,
    ) -> None:
        self.dp = dp
        self.max_dp = max_dp
        self.resize_s = resize_s
        self.middleware_503 = middleware_503
        self.stuck_requests = False  # drain never finishes -> 408
        self.fail_next: list[int] = []  # 500 for the next resizes, one each
        self.on_scale: Callable[[int], None] | None = None
        self.calls: list[Call] = []
        self.active = 0
        self.max_active = 0
        self._scaling = False
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

    @property
    def scaling(self) -> bool:
        return self._scaling

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

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

    # --- the resize, as the engine runs it --------------------------------------------

    def _resize(self, new_dp: int, drain_timeout: int) -> tuple[int, dict[str, Any]]:
        with self._lock:
            if new_dp == self.dp:
                return 200, {"message": f"Scaled to {new_dp} data parallel engines"}
            if self._scaling:  # newer vLLM without the middleware: the engine refuses
                return 400, {"detail": "a scale operation is already in progress"}
            if new_dp > self.max_dp:
                return 400, {
                    "detail": f"new_data_parallel_size {new_dp} exceeds the {self.max_dp} "
                    "GPUs available to the Ray cluster"
                }
            self._scaling = True
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            if self.on_scale is not None:
                self.on_scale(new_dp)
            if self.stuck_requests:
                time.sleep(drain_timeout)
                return 408, {
                    "detail": "Scale failed due to request drain timeout "
                    f"after {drain_timeout} seconds"
                }
            time.sleep(self.resize_s)
            with self._lock:
                if self.fail_next:
                    return self.fail_next.pop(0), {"detail": "Scale failed"}
                self.dp = new_dp
            return 200, {"message": f"Scaled to {new_dp} data parallel engines"}
        finally:
            with self._lock:
                self.active -= 1
                self._scaling = False

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _answer(self, status: int, payload: Any, body: Any) -> None:
                engine.calls.append(Call(self.path, body, status))
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting (a test of lost answers)

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if engine.middleware_503 and engine.scaling:
                    self._answer(
                        503,
                        {"error": "The model is currently scaling. Please try again later."},
                        None,
                    )
                    return
                if self.path == "/is_scaling_elastic_ep":
                    self._answer(200, {"is_scaling_elastic_ep": engine.scaling}, None)
                    return
                if self.path != "/scale_elastic_ep":
                    self._answer(404, {"detail": "Not Found"}, None)
                    return
                try:
                    body = json.loads(raw)
                except ValueError:
                    self._answer(400, {"detail": "Invalid JSON format"}, None)
                    return
                new_dp = body.get("new_data_parallel_size")
                drain = body.get("drain_timeout", 120)
                if new_dp is None:
                    self._answer(400, {"detail": "new_data_parallel_size is required"}, body)
                    return
                if not isinstance(new_dp, int) or new_dp <= 0:
                    self._answer(
                        400, {"detail": "new_data_parallel_size must be a positive integer"}, body
                    )
                    return
                if not isinstance(drain, int) or drain <= 0:
                    self._answer(400, {"detail": "drain_timeout must be a positive integer"}, body)
                    return
                status, payload = engine._resize(new_dp, drain)
                self._answer(status, payload, body)

        return Handler


@pytest.fixture
def engine_factory() -> Iterator[Callable[..., FakeVllmEngine]]:
    """``start(**kwargs)`` -> a running :class:`FakeVllmEngine`, stopped after the test."""
    engines: list[FakeVllmEngine] = []

    def start(**kwargs: Any) -> FakeVllmEngine:
        engine = FakeVllmEngine(**kwargs)
        engine.start()
        engines.append(engine)
        return engine

    try:
        yield start
    finally:
        for engine in engines:
            engine.stop()
