"""A test exporter serving Dynamo frontend traffic metrics with values the test sets.

Metrics are real ``prometheus_client`` counters and histograms in the exporter's own
registry, named from ``disagg_planner.signals.frontend``. Changes become visible only at
:meth:`publish`,
which swaps the served text in one step and bumps a generation gauge, so every scrape sees
one consistent state and a test can find, from the gauge's samples, the exact scrape
timestamps at which each state was read. A window whose ends are two such timestamps has
no extrapolation in ``increase()``, so the expected values are exact.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from disagg_planner.signals.frontend import (
    DURATION_BUCKETS_S,
    FRONTEND,
    ITL_BUCKETS_S,
    MODEL_LABEL,
    NAMESPACE_LABEL,
    SPEC_DECODE_ACCEPTED_TOKENS,
    SPEC_DECODE_COUNTERS,
    SPEC_DECODE_DRAFTS,
    TOKEN_BUCKETS,
    TTFT_BUCKETS_S,
    TrafficMetricNames,
)

GENERATION_METRIC = "planner_test_exporter_generation"
POD_LABEL = "pod"  # a second frontend of the same model: a separate series to be summed
LABELS = (MODEL_LABEL, NAMESPACE_LABEL, POD_LABEL)


@dataclass(frozen=True)
class Requests:
    """``n`` requests that all saw the same latencies and lengths."""

    n: int
    ttft_s: float
    itl_s: float
    isl: float
    osl: float
    duration_s: float


class _Metrics:
    def __init__(self, names: TrafficMetricNames) -> None:
        self.registry = CollectorRegistry()
        reg = self.registry
        self.started = Counter(names.requests_started, "Requests started", LABELS, registry=reg)
        # The router source counts requests with one counter for both.
        self.finished = (
            self.started
            if names.requests_finished == names.requests_started
            else Counter(names.requests_finished, "Requests done", LABELS, registry=reg)
        )
        self.ttft = Histogram(
            names.ttft_seconds, "TTFT", LABELS, buckets=TTFT_BUCKETS_S, registry=reg
        )
        self.itl = Histogram(names.itl_seconds, "ITL", LABELS, buckets=ITL_BUCKETS_S, registry=reg)
        self.isl = Histogram(
            names.input_tokens, "Input length", LABELS, buckets=TOKEN_BUCKETS, registry=reg
        )
        self.osl = Histogram(
            names.output_tokens, "Output length", LABELS, buckets=TOKEN_BUCKETS, registry=reg
        )
        self.duration = Histogram(
            names.request_duration_seconds,
            "Request duration",
            LABELS,
            buckets=DURATION_BUCKETS_S,
            registry=reg,
        )


def _counter(name: str, registry: CollectorRegistry, *extra: str) -> Counter:
    # prometheus_client adds the ``_total`` the table's names end in
    return Counter(name.removesuffix("_total"), name, (*LABELS, *extra), registry=registry)


class _EngineMetrics:
    """The engines' speculative-decoding counters, vLLM's, SGLang's and TensorRT-LLM's
    (their own process: they restart without the frontend)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        reg = self.registry
        self.drafts = _counter(SPEC_DECODE_DRAFTS, reg)
        self.accepted = _counter(SPEC_DECODE_ACCEPTED_TOKENS, reg)
        self.sglang = {
            c.part: _counter(c.name, reg)
            for c in SPEC_DECODE_COUNTERS.values()
            if c.name.startswith("sglang:")
        }
        trtllm = [c.name for c in SPEC_DECODE_COUNTERS.values() if c.name.startswith("trtllm_")]
        self.trtllm = {n: _counter(n, reg, "token_position") for n in trtllm}


class FrontendMetrics:
    """Frontend traffic metrics in a private registry, and their text exposition (with the
    engines' speculative-decoding counters where a test records them)."""

    def __init__(self, names: TrafficMetricNames = FRONTEND) -> None:
        self._names = names
        self._metrics = _Metrics(names)
        self._engines = _EngineMetrics()

    def record_spec_decode(
        self, *, drafts: int, accepted: int, model: str, namespace: str, pod: str = "a"
    ) -> None:
        """Add speculative steps (``drafts``) and the draft tokens kept (``accepted``)."""
        labels = (model, namespace, pod)
        self._engines.drafts.labels(*labels).inc(drafts)
        self._engines.accepted.labels(*labels).inc(accepted)

    def record_sglang(
        self, *, verify: int | None, generated: int, requests: int, model: str, namespace: str
    ) -> None:
        """SGLang's counters of finished requests: verify passes (None: an engine that does
        not speculate, without that series), output tokens, requests."""
        labels = (model, namespace, "a")
        for part, value in (
            ("spec_sglang_verify", verify),
            ("spec_sglang_generated", generated),
            ("spec_sglang_requests", requests),
        ):
            if value is not None:
                self._engines.sglang[part].labels(*labels).inc(value)

    def record_trtllm(
        self, *, drafted: list[int], accepted: list[int], model: str, namespace: str
    ) -> None:
        """TensorRT-LLM's per-position counters: draft tokens drafted and accepted at each
        draft position (index = ``token_position``)."""
        counters = self._engines.trtllm
        for pos, (d, a) in enumerate(zip(drafted, accepted, strict=True)):
            labels = (model, namespace, "a", str(pos))
            counters["trtllm_spec_decode_drafted_tokens_total"].labels(*labels).inc(d)
            counters["trtllm_spec_decode_accepted_tokens_total"].labels(*labels).inc(a)

    def restart_engines(self) -> None:
        """The engines restart (their counters start again from 0); the frontend does not."""
        self._engines = _EngineMetrics()

    def record(
        self,
        requests: Requests,
        *,
        model: str,
        namespace: str,
        pod: str = "a",
        count_started: bool = True,
    ) -> None:
        """Add finished requests (``count_started=False``: a frontend without that counter).

        ``Requests(n=0, ...)`` creates the series with zero values.
        """
        m = self._metrics
        labels = (model, namespace, pod)
        if count_started and m.started is not m.finished:
            m.started.labels(*labels).inc(requests.n)
        m.finished.labels(*labels).inc(requests.n)
        for histogram, value in (
            (m.ttft, requests.ttft_s),
            (m.itl, requests.itl_s),
            (m.isl, requests.isl),
            (m.osl, requests.osl),
            (m.duration, requests.duration_s),
        ):
            child = histogram.labels(*labels)
            for _ in range(requests.n):
                child.observe(value)

    def reset(self) -> None:
        """Forget every value, as a restarted frontend does (counters restart from 0)."""
        self._metrics = _Metrics(self._names)

    def text(self) -> str:
        """The current values in Prometheus text exposition format."""
        return (
            generate_latest(self._metrics.registry) + generate_latest(self._engines.registry)
        ).decode()


class FrontendExporter(FrontendMetrics):
    """Serves ``/metrics`` on a loopback port; ``target`` is what Prometheus scrapes."""

    def __init__(self, names: TrafficMetricNames = FRONTEND) -> None:
        super().__init__(names)
        self._lock = threading.Lock()
        self._generation = 0
        self._body = b""
        self.texts: dict[int, str] = {}
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with exporter._lock:
                    body = exporter._body
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )
        self._thread.start()
        self.publish()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self._server.server_address[1]}"

    @property
    def generation(self) -> int:
        return self._generation

    def publish(self) -> int:
        """Serve the current values from now on; returns the new generation number.

        ``texts[generation]`` keeps what was served, without the generation gauge.
        """
        self._generation += 1
        registry = CollectorRegistry()
        Gauge(GENERATION_METRIC, "Published state", registry=registry).set(self._generation)
        text = self.text()
        body = (text + generate_latest(registry).decode()).encode()
        with self._lock:
            self._body = body
        self.texts[self._generation] = text
        return self._generation

    def close(self) -> None:
        """Stop serving (idempotent): to Prometheus the frontend is gone."""
        if not self._thread.is_alive():
            return
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
