"""Public measurements the engine model is calibrated against, and the model's value for each.

``python -m disagg_planner.simulator.calibration`` prints the table that ``CALIBRATION.md``
reproduces. Each point says how the model value is computed so that the comparison is like for like:

- ``prefill_ttft``: TTFT of one request alone (frontend latency plus the chunked prefill);
- ``prefill_thpt``: ``ISL / TTFT`` per GPU (Dynamo's profiler definition);
- ``decode_thpt_at_itl``: tokens/s/GPU of the largest decode batch whose step time at the
  given context stays within the ITL target;
- ``decode_step``: one decode step of ``batch`` requests at ``context`` tokens each.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from disagg_planner.simulator import catalogue
from disagg_planner.simulator.engine_model import EngineModel


@dataclass(frozen=True)
class CalibrationPoint:
    name: str
    engine: str
    kind: str  # prefill_ttft | prefill_thpt | decode_thpt_at_itl | decode_step
    target: float
    unit: str
    source: str
    isl: int = 0
    context: float = 0.0
    batch: int = 0
    itl_ms: float = 0.0
    tolerance: float | None = 0.15  # None: reported, not a target (another engine, or unclear)

    def model_value(self) -> float:
        model = EngineModel(self.engine)
        if self.kind in ("prefill_ttft", "prefill_thpt"):
            ttft = model.prefill_time_s(self.isl) + catalogue.efficiency().ttft_overhead_s
            if self.kind == "prefill_ttft":
                return ttft * 1000.0
            return self.isl / ttft / model.spec.gpus
        if self.kind == "decode_step":
            return model.decode_step_time_s(self.batch, self.context) * 1000.0
        if self.kind == "decode_thpt_at_itl":
            best = 0.0
            for b in range(1, model.max_decode_batch(self.context) + 1):
                step = model.decode_step_time_s(b, self.context)
                if step * 1000.0 > self.itl_ms:
                    break
                best = b / step / model.spec.gpus
            return best
        raise ValueError(f"unknown calibration kind {self.kind!r}")

    def error(self) -> float:
        """Relative error of the model, (model - target) / target."""
        return (self.model_value() - self.target) / self.target


_DYNAMO = (
    "Dynamo profiler test data for nvidia/Llama-3.1-8B-Instruct-FP8, H200 TP1P/TP1D, "
    "ISL/OSL 3000/150: '40k tokens/s/gpu prefill with 80ms TTFT and 10k tokens/s/gpu decode "
    "with 10ms ITL' (ai-dynamo/dynamo tests/planner/README.md)"
)
_NIGHTLY = (
    "vLLM nightly performance benchmark, latency test (input 32, output 128, batch 8), "
    "buildkite vllm/performance-benchmark build 9515: mean latency / 128 steps"
)
_TRTLLM = (
    "TensorRT-LLM perf-overview (trtllm-bench max throughput), 2048/128 output tok/s x 16 "
    "= prefill lower bound; a different engine than the vLLM the model represents"
)

POINTS: tuple[CalibrationPoint, ...] = (
    CalibrationPoint(
        "H200 8B-FP8 prefill TTFT, ISL 3000",
        "sim:llama-3.1-8b-fp8@h200_sxm:tp1",
        "prefill_ttft",
        80.0,
        "ms",
        _DYNAMO,
        isl=3000,
    ),
    CalibrationPoint(
        "H200 8B-FP8 prefill throughput, ISL 3000",
        "sim:llama-3.1-8b-fp8@h200_sxm:tp1",
        "prefill_thpt",
        40000.0,
        "tok/s/GPU",
        _DYNAMO,
        isl=3000,
    ),
    CalibrationPoint(
        "H200 8B-FP8 decode throughput at ITL 10 ms, context 3075",
        "sim:llama-3.1-8b-fp8@h200_sxm:tp1",
        "decode_thpt_at_itl",
        10000.0,
        "tok/s/GPU",
        _DYNAMO,
        context=3075,
        itl_ms=10.0,
    ),
    CalibrationPoint(
        "H100 Llama-3.1-8B BF16 TP1 decode step, batch 8",
        "sim:llama-3.1-8b@h100_sxm:tp1",
        "decode_step",
        7.8,
        "ms",
        _NIGHTLY + " (997.5 ms on H100)",
        batch=8,
        context=96,
    ),
    CalibrationPoint(
        "H200 Llama-3.1-8B BF16 TP1 decode step, batch 8",
        "sim:llama-3.1-8b@h200_sxm:tp1",
        "decode_step",
        6.5,
        "ms",
        _NIGHTLY + " (833.4 ms on H200)",
        batch=8,
        context=96,
    ),
    CalibrationPoint(
        "H100 Llama-3-70B BF16 TP4 decode step, batch 8",
        "sim:llama-3.3-70b@h100_sxm:tp4",
        "decode_step",
        19.1,
        "ms",
        _NIGHTLY + " (2,444.5 ms on H100)",
        batch=8,
        context=96,
    ),
    CalibrationPoint(
        "H200 Llama-3-70B BF16 TP4 decode step, batch 8",
        "sim:llama-3.3-70b@h200_sxm:tp4",
        "decode_step",
        16.2,
        "ms",
        _NIGHTLY + " (2,077.5 ms on H200)",
        batch=8,
        context=96,
    ),
    CalibrationPoint(
        "H200 Llama-3.1-8B decode step, batch 32, context 4224 (agg itl_p50)",
        "sim:llama-3.1-8b@h200_sxm:tp1",
        "decode_step",
        9.3,
        "ms",
        "AIConfigurator queueing-model validation, vLLM 0.24.0, ISL/OSL 4096/256, "
        "concurrency 32: itl_p50 9.3 ms (precision not stated; BF16 assumed)",
        batch=32,
        context=4224,
        tolerance=None,
    ),
    CalibrationPoint(
        "H200 8B-FP8 prefill throughput, ISL 2048 (TensorRT-LLM)",
        "sim:llama-3.1-8b-fp8@h200_sxm:tp1",
        "prefill_thpt",
        56600.0,
        "tok/s/GPU",
        _TRTLLM + " (3,538 tok/s)",
        isl=2048,
        tolerance=None,
    ),
    CalibrationPoint(
        "H200 70B-FP8 TP1 prefill throughput, ISL 2048 (TensorRT-LLM)",
        "sim:llama-3.3-70b-fp8@h200_sxm:tp1",
        "prefill_thpt",
        7070.0,
        "tok/s/GPU",
        _TRTLLM + " (442 tok/s)",
        isl=2048,
        tolerance=None,
    ),
)


def table() -> str:
    """The calibration table as Markdown."""
    lines = [
        "| # | point | target | model | error | target? |",
        "|---|---|---|---|---|---|",
    ]
    for i, p in enumerate(POINTS, 1):
        value = p.model_value()
        role = f"within {p.tolerance:.0%}" if p.tolerance is not None else "reference"
        lines.append(
            f"| {i} | {p.name} | {p.target:,.1f} {p.unit} | {value:,.1f} {p.unit} | "
            f"{p.error():+.1%} | {role} |"
        )
    return "\n".join(lines)


def main() -> int:
    print(table())
    print()
    for i, p in enumerate(POINTS, 1):
        print(f"{i}. {p.source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
