"""What one tick of the planner saw and decided, as plain data: the record the diagnostics
recorder keeps (:mod:`disagg_planner.report.recorder`), the report draws
(:mod:`disagg_planner.report.html`), the report's child process reads back
(:mod:`disagg_planner.report.child`) and the exporter serves. Its own module so that the
report reads it without importing the recorder, which renders reports."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from disagg_planner.signals.fpm import ForwardPassMetrics


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

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TickSnapshot:
        """The snapshot :meth:`to_json` wrote (a non-finite number comes back as None)."""
        fields = dict(data)
        fields["engines"] = tuple(EngineQueues(**e) for e in fields.get("engines") or ())
        return cls(**fields)


def _finite(value: Any) -> Any:
    """JSON has no NaN/inf: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
