"""The planner's own metrics (``dynamo_planner_*``) and its health endpoints.

Gauge and enum names follow Dynamo's planner so existing dashboards work; every series is
labelled with ``namespace`` and ``dgd`` because one operator process manages many
deployments. Metrics live in an injected registry, never the process-global default.
``/readyz`` turns ready after the first successful observation (instead of a fixed start
delay); ``/healthz`` answers while the process serves.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Enum, Gauge
from prometheus_client.exposition import generate_latest

from disagg_planner.core.types import LoadReason, ThroughputReason
from disagg_planner.report.snapshot import TickSnapshot

log = logging.getLogger(__name__)

PREFIX = "dynamo_planner"
LABELS = ("namespace", "dgd")

# gauge suffix -> (help, TickSnapshot attribute or None when set explicitly)
_SNAPSHOT_GAUGES: dict[str, tuple[str, str]] = {
    "observed_requests_per_second": ("Observed request rate (req/s)", "observed_rps"),
    "observed_ttft_ms": ("Observed mean time to first token (ms)", "observed_ttft_ms"),
    "observed_itl_ms": ("Observed mean inter-token latency (ms)", "observed_itl_ms"),
    "observed_input_sequence_tokens": ("Observed mean input length", "observed_isl"),
    "observed_output_sequence_tokens": ("Observed mean output length", "observed_osl"),
    "predicted_requests_per_second": ("Forecast request rate (req/s)", "predicted_rps"),
    "predicted_input_sequence_tokens": ("Forecast mean input length", "predicted_isl"),
    "predicted_output_sequence_tokens": ("Forecast mean output length", "predicted_osl"),
    "prefill_correction_factor": ("Observed / profiled TTFT", "prefill_correction"),
    "decode_correction_factor": ("Observed / profiled ITL", "decode_correction"),
    "estimated_ttft_ms": ("Estimated TTFT, max over engines (ms)", "estimated_ttft_ms"),
    "estimated_itl_ms": ("Estimated ITL, max over engines (ms)", "estimated_itl_ms"),
    "gpu_hours": ("Cumulative GPU-hours of the scaled roles", "gpu_hours"),
    "gpus_in_use": ("GPUs of the scaled roles now", "gpus_in_use"),
}

_ROLE_GAUGE_NAMES = {"prefill": "prefill", "decode": "decode", "agg": "agg"}


class PlannerMetrics:
    """All planner gauges for every managed deployment, in one registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.snapshot_gauges = {
            suffix: Gauge(f"{PREFIX}_{suffix}", text, LABELS, registry=r)
            for suffix, (text, _) in _SNAPSHOT_GAUGES.items()
        }
        self.replicas = {
            role: Gauge(
                f"{PREFIX}_num_{name}_replicas", f"Ready {role} replicas", LABELS, registry=r
            )
            for role, name in _ROLE_GAUGE_NAMES.items()
        }
        self.desired_replicas = {
            role: Gauge(
                f"{PREFIX}_desired_num_{name}_replicas",
                f"Desired {role} replicas in the deployment spec",
                LABELS,
                registry=r,
            )
            for role, name in _ROLE_GAUGE_NAMES.items()
        }
        self.predicted_replicas = {
            role: Gauge(
                f"{PREFIX}_predicted_num_{name}_replicas",
                f"{role} replicas the planner last recommended",
                LABELS,
                registry=r,
            )
            for role, name in _ROLE_GAUGE_NAMES.items()
        }
        self.sla_ttft = Gauge(f"{PREFIX}_sla_target_ttft_ms", "TTFT SLO (ms)", LABELS, registry=r)
        self.sla_itl = Gauge(f"{PREFIX}_sla_target_itl_ms", "ITL SLO (ms)", LABELS, registry=r)
        self.scaling_latency = Gauge(
            f"{PREFIX}_scaling_latency_seconds",
            "Time from a scaling decision to the new replicas being ready",
            (*LABELS, "role"),
            registry=r,
        )
        engine_labels = (*LABELS, "role", "worker_id", "dp_rank")
        self.engine_queued_prefill = Gauge(
            f"{PREFIX}_engine_queued_prefill_tokens",
            "Prefill tokens queued in an engine",
            engine_labels,
            registry=r,
        )
        self.engine_queued_decode = Gauge(
            f"{PREFIX}_engine_queued_decode_kv_tokens",
            "KV tokens of preempted decode requests queued in an engine",
            engine_labels,
            registry=r,
        )
        self.engine_inflight_decode = Gauge(
            f"{PREFIX}_engine_inflight_decode_kv_tokens",
            "KV tokens of decode requests running in an engine",
            engine_labels,
            registry=r,
        )
        self.throughput_decision = Enum(
            f"{PREFIX}_throughput_scaling_decision",
            "Outcome of the last throughput-loop tick",
            LABELS,
            states=[reason.value for reason in ThroughputReason],
            registry=r,
        )
        self.load_decision = Enum(
            f"{PREFIX}_load_scaling_decision",
            "Outcome of the last load-loop tick",
            LABELS,
            states=[reason.value for reason in LoadReason],
            registry=r,
        )
        self.fpm_dropped = Counter(
            f"{PREFIX}_fpm_frames_dropped",
            "ForwardPassMetrics frames dropped, by why",
            (*LABELS, "kind"),
            registry=r,
        )
        self.observation_failures = Counter(
            f"{PREFIX}_observation_failures",
            "Observations that could not be made, by reason",
            (*LABELS, "source", "reason"),
            registry=r,
        )
        self._engines_seen: dict[tuple[str, str], set[tuple[str, str, str]]] = {}

    def set_slo(self, namespace: str, dgd: str, *, ttft_ms: float, itl_ms: float) -> None:
        self.sla_ttft.labels(namespace, dgd).set(ttft_ms)
        self.sla_itl.labels(namespace, dgd).set(itl_ms)

    def publish(self, namespace: str, dgd: str, snapshot: TickSnapshot) -> None:
        """Set the gauges from one tick; a value not produced this tick is left as it was."""
        for suffix, (_, attr) in _SNAPSHOT_GAUGES.items():
            value = getattr(snapshot, attr)
            if value is not None:
                self.snapshot_gauges[suffix].labels(namespace, dgd).set(value)
        for role, n in snapshot.ready.items():
            self.replicas[role].labels(namespace, dgd).set(n)
        for role, n in snapshot.desired.items():
            self.desired_replicas[role].labels(namespace, dgd).set(n)
        if snapshot.scale_to:
            for role, n in snapshot.scale_to.items():
                self.predicted_replicas[role].labels(namespace, dgd).set(n)
        if snapshot.throughput_reason:
            self.throughput_decision.labels(namespace, dgd).state(snapshot.throughput_reason)
        if snapshot.load_reason:
            self.load_decision.labels(namespace, dgd).state(snapshot.load_reason)
        for role, seconds in snapshot.extra.get("scaling_latency_s", {}).items():
            self.scaling_latency.labels(namespace, dgd, role).set(seconds)
        self._publish_engines(namespace, dgd, snapshot)

    def _publish_engines(self, namespace: str, dgd: str, snapshot: TickSnapshot) -> None:
        now: set[tuple[str, str, str]] = set()
        for e in snapshot.engines:
            key = (e.role, e.worker_id, str(e.dp_rank))
            now.add(key)
            self.engine_queued_prefill.labels(namespace, dgd, *key).set(e.queued_prefill_tokens)
            self.engine_queued_decode.labels(namespace, dgd, *key).set(e.queued_decode_kv_tokens)
            self.engine_inflight_decode.labels(namespace, dgd, *key).set(
                e.inflight_decode_kv_tokens
            )
        # engines that went away must not keep exporting their last queue forever
        for key in self._engines_seen.get((namespace, dgd), set()) - now:
            for gauge in (
                self.engine_queued_prefill,
                self.engine_queued_decode,
                self.engine_inflight_decode,
            ):
                gauge.remove(namespace, dgd, *key)
        self._engines_seen[(namespace, dgd)] = now

    def forget(self, namespace: str, dgd: str) -> None:
        """Drop every series of a deployment the planner no longer manages."""
        for collector in self._labelled_collectors():
            for labels in list(_label_sets(collector)):
                if labels[:2] == (namespace, dgd):
                    collector.remove(*labels)
        self._engines_seen.pop((namespace, dgd), None)

    def _labelled_collectors(self) -> Iterable[Any]:
        yield from self.snapshot_gauges.values()
        yield from self.replicas.values()
        yield from self.desired_replicas.values()
        yield from self.predicted_replicas.values()
        yield from (
            self.sla_ttft,
            self.sla_itl,
            self.scaling_latency,
            self.engine_queued_prefill,
            self.engine_queued_decode,
            self.engine_inflight_decode,
            self.throughput_decision,
            self.load_decision,
            self.fpm_dropped,
            self.observation_failures,
        )


def _label_sets(collector: Any) -> Iterable[tuple[str, ...]]:
    # prometheus_client keeps children by label values; there is no public accessor.
    with collector._lock:
        return list(collector._metrics.keys())


class HealthState:
    """Liveness and readiness as the HTTP endpoints report them."""

    def __init__(self) -> None:
        self._ready = threading.Event()
        self.detail = "waiting for the first successful observation"

    def mark_ready(self) -> None:
        self._ready.set()
        self.detail = "ok"

    @property
    def ready(self) -> bool:
        return self._ready.is_set()


ReportSource = Callable[[str, str], str | None]
"""(namespace, name) -> the HTML report of that deployment's ticks, None when it has none."""


class MetricsServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` on one port, served from a thread, and
    ``/report/<namespace>/<name>`` (a deployment's diagnostics, rendered on demand) when
    given ``reports``."""

    def __init__(
        self,
        metrics: PlannerMetrics,
        health: HealthState,
        *,
        host: str = "0.0.0.0",
        port: int,
        reports: ReportSource | None = None,
    ) -> None:
        registry = metrics.registry

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                parts = path.strip("/").split("/")
                if reports is not None and len(parts) == 3 and parts[0] == "report":
                    # Rendered here, on demand, from the deployment's rolling window of ticks.
                    try:
                        html = reports(parts[1], parts[2])
                    except Exception as exc:  # a failed render is an answer, not a dead server
                        log.exception("rendering the report of %s/%s failed", *parts[1:])
                        self._send(500, f"report failed: {exc}\n".encode(), "text/plain")
                        return
                    if html is None:
                        body = f"no report of {parts[1]}/{parts[2]}: not planned here, or no tick\n"
                        self._send(404, body.encode(), "text/plain")
                    else:
                        self._send(200, html.encode(), "text/html; charset=utf-8")
                elif path == "/metrics":
                    self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
                elif path == "/healthz":
                    self._send(200, b"ok\n", "text/plain")
                elif path == "/readyz":
                    code = 200 if health.ready else 503
                    self._send(code, (health.detail + "\n").encode(), "text/plain")
                else:
                    self._send(404, b"not found\n", "text/plain")

            def _send(self, code: int, body: bytes, content_type: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return  # scrapes every few seconds would flood the log

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="planner-metrics", daemon=True
        )

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
