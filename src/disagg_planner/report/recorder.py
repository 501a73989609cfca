"""Per-tick snapshots of what the planner saw and decided, and the reports made from them.

The same recorder serves the live controller (an HTML report every ``report_interval_hours``
of its clock, optionally with a gzip JSONL log) and replay (one report at the end). Times are
the caller's clock (wall or simulated), never read here.
"""

from __future__ import annotations

import gzip
import json
import logging
import math
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from disagg_planner.signals.fpm import ForwardPassMetrics

log = logging.getLogger(__name__)

MAX_SNAPSHOTS = 50_000


@dataclass(frozen=True)
class EngineQueues:
    """Queues one engine (worker, DP rank) reported in its latest ForwardPassMetrics."""

    role: str
    worker_id: str
    dp_rank: int
    queued_prefill_tokens: int
    queued_decode_kv_tokens: int
    inflight_decode_kv_tokens: int

    @classmethod
    def of(cls, role: str, fpm: ForwardPassMetrics) -> EngineQueues:
        """The queues of one engine's report."""
        return cls(
            role=role,
            worker_id=fpm.worker_id,
            dp_rank=fpm.dp_rank,
            queued_prefill_tokens=fpm.queued_requests.sum_prefill_tokens,
            queued_decode_kv_tokens=fpm.queued_requests.sum_decode_kv_tokens,
            inflight_decode_kv_tokens=fpm.scheduled_requests.sum_decode_kv_tokens,
        )


@dataclass(frozen=True)
class TickSnapshot:
    """Everything one tick saw and decided; every field is plain data (JSON-able)."""

    t_s: float
    desired: dict[str, int]
    ready: dict[str, int]
    gpus_in_use: int
    gpu_hours: float
    scale_to: dict[str, int] | None = None
    throughput_reason: str | None = None
    load_reason: str | None = None
    message: str = ""
    observed_rps: float | None = None
    observed_ttft_ms: float | None = None
    observed_itl_ms: float | None = None
    observed_isl: float | None = None
    observed_osl: float | None = None
    predicted_rps: float | None = None
    predicted_isl: float | None = None
    predicted_osl: float | None = None
    prefill_correction: float | None = None
    decode_correction: float | None = None
    estimated_ttft_ms: float | None = None
    estimated_itl_ms: float | None = None
    engines: tuple[EngineQueues, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return _finite(asdict(self))


def _finite(value: Any) -> Any:
    """JSON has no NaN/inf: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


class DiagnosticsRecorder:
    """Keeps the last ``MAX_SNAPSHOTS`` ticks; writes HTML reports and a gzip JSONL log."""

    def __init__(
        self,
        *,
        output_dir: str | Path,
        report_interval_hours: float | None = None,
        filename: str | None = None,
        write_gzip_log: bool = True,
        ttft_slo_ms: float | None = None,
        itl_slo_ms: float | None = None,
        title: str = "Planner diagnostics",
    ) -> None:
        self.output_dir = Path(output_dir)
        self.report_interval_s = (
            report_interval_hours * 3600.0 if report_interval_hours is not None else None
        )
        self.filename = filename
        self.write_gzip_log = write_gzip_log
        self.ttft_slo_ms = ttft_slo_ms
        self.itl_slo_ms = itl_slo_ms
        self.title = title
        self.snapshots: deque[TickSnapshot] = deque(maxlen=MAX_SNAPSHOTS)
        self._last_report_s: float | None = None
        self._logged_until_s = -math.inf  # snapshots up to this time are in the gzip log

    def record(self, snapshot: TickSnapshot) -> Path | None:
        """Store a snapshot; write a periodic report when one is due (returns its path)."""
        self.snapshots.append(snapshot)
        if self._last_report_s is None:
            self._last_report_s = snapshot.t_s
        if (
            self.report_interval_s is not None
            and snapshot.t_s - self._last_report_s >= self.report_interval_s
        ):
            self._last_report_s = snapshot.t_s
            return self.write_report()
        return None

    def write_report(self, **sections: Any) -> Path | None:
        """Write the HTML report (and the gzip log) of the snapshots so far; ``sections`` are
        what the caller adds to it (keyword arguments of
        :func:`disagg_planner.report.html.render_report`: replay's score, latency, load)."""
        if not self.snapshots:
            return None
        from disagg_planner.report.html import render_report

        self.output_dir.mkdir(parents=True, exist_ok=True)
        last_t = self.snapshots[-1].t_s
        base = self.filename or f"planner-report-{int(last_t)}s"
        base = base.removesuffix(".html")
        path = self.output_dir / f"{base}.html"
        html = render_report(
            list(self.snapshots),
            title=self.title,
            ttft_slo_ms=self.ttft_slo_ms,
            itl_slo_ms=self.itl_slo_ms,
            **sections,
        )
        path.write_text(html, encoding="utf-8")
        if self.write_gzip_log:
            self._append_log(self.output_dir / f"{base}.log.jsonl.gz")
        log.info("wrote report %s (%d ticks)", path, len(self.snapshots))
        return path

    def _append_log(self, path: Path) -> None:
        with gzip.open(path, "at", encoding="utf-8") as handle:
            for snapshot in self.snapshots:
                if snapshot.t_s > self._logged_until_s:
                    handle.write(json.dumps(snapshot.to_json()) + "\n")
        self._logged_until_s = self.snapshots[-1].t_s

    def finalize(self) -> Path | None:
        """Write a last report on shutdown."""
        return self.write_report()
