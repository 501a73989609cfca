"""Fit the roofline's per-phase efficiency factors to the training points (engine_fit.yaml).

``python -m disagg_planner.simulator.fit`` prints the fitted values and each training point's
error; ``--write`` also rewrites ``engine_fit.yaml`` (the one place the engine model reads its
fitted factors from; each value carries a comment naming what it was fitted to). The fit is
deterministic (scipy's trust-region least squares on log errors, fixed start, finite
differences) and only ever reads points of the **training** set of ``calibration.POINTS``:
the validation points judge the result and are never fitted (``stage_points`` refuses a
stage that selects one), and training points marked ``outlier`` are reported, not fitted.

It runs in stages, one phase at a time, each stage fitting a few factors to the points that
pin them down, with the factors of earlier stages held:

1. ``vllm-decode``: small-batch decode is weight streaming plus fixed costs, so
   AIConfigurator's measured vLLM 0.24.0 tables, composed into decode steps at batch 8 and 32
   (8B TP1 and 70B TP4, BF16 and FP8, H100 and H200), fix the weight-stream efficiency per
   GPU, vLLM's step overhead, the TP all-reduce latency and the FP8 activation-quantisation
   overhead per layer;
2. ``decode-latency``: vLLM's nightly batch-8 latencies (the same models and GPUs, an older
   V0-engine build: ``version=0.6``) fix the V0 engine's per-layer overhead;
3. ``trtllm-loaded``: TensorRT-LLM's published max-throughput rows at the shapes kept for
   training (H200, 8B and 70B FP8) fix TRT-LLM's prefill and decode FP8 GEMM efficiencies,
   its KV-read efficiency and its step and per-request overheads (offline simulator runs);
4. ``vllm-prefill``: AIConfigurator's measured vLLM kernel tables, composed into lone
   requests' prefill at ISL 1k, 4k and 16k (8B on H100 and H200, 70B TP4 on H200), fix vLLM's
   FP8 prefill GEMM efficiency and its prefill-attention efficiency (the long prompts separate
   the two). Dynamo's "80 ms TTFT at ISL 3000" and the 27 ms of its raw profile are in the
   stage as outliers: reported with their residuals, not fitted (``CalibrationPoint.outlier``
   says why), and the fit fails if it meets a point marked outlier after all;
5. ``vllm-prefill-bf16``: the same prefills of the BF16 models fix vLLM's BF16 GEMM
   efficiency (attention held);
6. ``vllm-kv``: Dynamo's H200 8B-FP8 profile (10k tok/s/GPU at 10 ms ITL) fixes vLLM's
   KV-read efficiency.

What no training point separates is a prior or tied (``PRIORS``, ``TIES``): FP4 GEMM
efficiencies, TRT-LLM's BF16 ones, SGLang (no public SGLang point here: it uses vLLM's
factors), vLLM's large-batch FP8 and BF16 decode GEMMs (FP8 tied to TRT-LLM's: both run
CUTLASS FP8 GEMMs; BF16 to its prefill GEMMs; no vLLM training point has decode batches large
enough to be compute-bound).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from disagg_planner.simulator import catalogue, engine_spec
from disagg_planner.simulator.calibration import POINTS, CalibrationPoint

FIT_FILE = Path(__file__).with_name("engine_fit.yaml")


def _weight_dtype(point: CalibrationPoint) -> str:
    return engine_spec.parse(point.engine).model.weight_dtype


@dataclass(frozen=True)
class Param:
    path: str  # dotted key in engine_fit.yaml
    start: float
    low: float
    high: float
    stage: str
    meaning: str


@dataclass(frozen=True)
class Stage:
    name: str
    selects: Callable[[CalibrationPoint], bool]
    why: str


class FitError(ValueError):
    """The training data contradicts the fit's rules (a validation point selected, an outlier
    mark the fit does not bear out)."""


STAGES: tuple[Stage, ...] = (
    Stage(
        "vllm-decode",
        lambda p: p.source == "aic-vllm" and p.kind == "decode_step",
        "AIConfigurator's measured vLLM 0.24.0 tables, decode steps at batch 8 and 32",
    ),
    Stage(
        "decode-latency",
        lambda p: p.source == "vllm-latency",
        "vLLM nightly batch-8 decode latencies (a V0-engine build)",
    ),
    Stage(
        "trtllm-loaded",
        lambda p: p.source == "trtllm" and p.point_set == "training",
        "TensorRT-LLM perf-overview rows kept for training",
    ),
    Stage(
        "vllm-prefill",
        lambda p: (
            (p.source == "aic-vllm" and p.kind == "prefill_ttft" and _weight_dtype(p) == "fp8")
            or (p.source in ("dynamo", "dynamo-raw") and p.kind.startswith("prefill"))
        ),
        "AIConfigurator's measured vLLM tables, lone-request prefill at ISL 1k-16k",
    ),
    Stage(
        "vllm-prefill-bf16",
        lambda p: (
            p.source == "aic-vllm" and p.kind == "prefill_ttft" and _weight_dtype(p) == "bf16"
        ),
        "AIConfigurator's measured vLLM tables, lone-request BF16 prefill at ISL 1k-16k",
    ),
    Stage(
        "vllm-kv",
        lambda p: p.source == "dynamo" and p.kind == "decode_thpt_at_itl",
        "Dynamo's H200 8B-FP8 profile (10k tok/s/GPU at 10 ms ITL)",
    ),
)

PARAMS: tuple[Param, ...] = (
    Param("hbm.default", 0.75, 0.3, 0.95, "vllm-decode", "weight stream, H100 and others"),
    Param("hbm.h200_sxm", 0.66, 0.3, 0.95, "vllm-decode", "weight stream, H200"),
    Param("backends.vllm.step_overhead_us", 500.0, 20.0, 3000.0, "vllm-decode", "per step"),
    Param("allreduce_latency_us", 8.0, 1.0, 40.0, "vllm-decode", "one TP all-reduce"),
    Param("backends.vllm.fp8_layer_overhead_us", 10.0, 0.0, 100.0, "vllm-decode", "FP8 per layer"),
    Param(
        "backends.vllm.legacy_layer_overhead_us",
        40.0,
        0.0,
        200.0,
        "decode-latency",
        "V0 engine per layer",
    ),
    Param("backends.trtllm.gemm_prefill.fp8", 0.45, 0.15, 0.95, "trtllm-loaded", "prefill GEMM"),
    Param("backends.trtllm.gemm_decode.fp8", 0.45, 0.15, 0.95, "trtllm-loaded", "decode GEMM"),
    Param("backends.trtllm.kv_read", 0.75, 0.3, 0.98, "trtllm-loaded", "KV-cache reads"),
    Param("backends.trtllm.step_overhead_us", 300.0, 20.0, 3000.0, "trtllm-loaded", "per step"),
    Param("backends.trtllm.request_overhead_us", 2.0, 0.0, 20.0, "trtllm-loaded", "per request"),
    Param("backends.vllm.gemm_prefill.fp8", 0.45, 0.15, 0.95, "vllm-prefill", "prefill GEMM"),
    Param("backends.vllm.attention", 0.45, 0.15, 0.95, "vllm-prefill", "prefill attention"),
    Param(
        "backends.vllm.gemm_prefill.bf16",
        0.62,
        0.15,
        0.95,
        "vllm-prefill-bf16",
        "BF16 prefill GEMM",
    ),
    Param("backends.vllm.kv_read", 0.66, 0.3, 0.98, "vllm-kv", "KV-cache reads"),
)

# Values no training point pins down: (value, where it comes from).
_AS_VLLM = "prior: as vllm (no TRT-LLM point at this precision)"
PRIORS: dict[str, tuple[float, str]] = {
    "hbm.b200": (0.70, "prior: no B200 training point (Azure GB200 HBM microbenchmark 92%)"),
    "hbm.gb200": (0.70, "prior: as b200"),
    "backends.vllm.gemm_prefill.fp4": (0.30, "prior: TRT-LLM B200 FP4 70B, >= 34% of FP4 dense"),
    "backends.vllm.gemm_decode.fp4": (0.30, "prior: as gemm_prefill.fp4"),
    "backends.vllm.request_overhead_us": (4.0, "prior: BLIS's fitted vLLM value, ~4 us/request"),
    "backends.trtllm.gemm_prefill.bf16": (0.62, _AS_VLLM),
    "backends.trtllm.gemm_prefill.fp4": (0.30, _AS_VLLM),
    "backends.trtllm.gemm_decode.bf16": (0.62, _AS_VLLM),
    "backends.trtllm.gemm_decode.fp4": (0.30, _AS_VLLM),
    "backends.trtllm.fp8_layer_overhead_us": (
        0.0,
        "prior: none (TensorRT-LLM fuses the FP8 activation quantisation into the kernel before)",
    ),
    "backends.trtllm.legacy_layer_overhead_us": (0.0, "prior: none (a vLLM V0 engine term)"),
    "backends.trtllm.attention": (
        0.45,
        "prior: as vllm (the training rows are too short to fix it)",
    ),
}
# Values that follow a fitted one: path -> (the fitted path, why).
TIES: dict[str, tuple[str, str]] = {
    "backends.vllm.gemm_decode.bf16": (
        "backends.vllm.gemm_prefill.bf16",
        "tied to the BF16 prefill GEMMs (no BF16 training point decodes compute-bound batches)",
    ),
    "backends.vllm.gemm_decode.fp8": (
        "backends.trtllm.gemm_decode.fp8",
        "tied to TRT-LLM's (CUTLASS FP8 GEMMs in both; no vLLM training point decodes "
        "batches large enough to be compute-bound)",
    ),
}
# Backends without a point of their own: they use another backend's factors.
SAME_AS: dict[str, tuple[str, str]] = {
    "sglang": ("vllm", "no public SGLang point in the training set: vLLM's factors"),
}


def _set(tree: dict[str, Any], path: str, value: float) -> None:
    *heads, last = path.split(".")
    for key in heads:
        tree = tree.setdefault(key, {})
    tree[last] = value


def _get(tree: dict[str, Any], path: str) -> float:
    for key in path.split("."):
        tree = tree[key]
    return float(tree)  # type: ignore[arg-type]


def build(values: dict[str, float]) -> dict[str, Any]:
    """The ``engine_fit.yaml`` layout for the fitted ``values`` plus priors and ties."""
    tree: dict[str, Any] = {}
    for path, (value, _) in PRIORS.items():
        _set(tree, path, value)
    for path, value in values.items():
        _set(tree, path, value)
    for path, (source, _) in TIES.items():
        _set(tree, path, _get(tree, source))
    for name, (other, _) in SAME_AS.items():
        tree["backends"][name] = {"same_as": other}
    return tree


def stage_points(
    stage: Stage, points: Sequence[CalibrationPoint] = POINTS
) -> list[CalibrationPoint]:
    """The points ``stage`` fits to: those it selects, less the outliers. A stage that selects
    a validation point is refused: the validation set judges the fit and is never in it."""
    selected = [p for p in points if stage.selects(p)]
    held_out = [p.name for p in selected if p.point_set != "training"]
    if held_out:
        raise FitError(
            f"fit stage {stage.name!r} selects validation points {held_out}: the fit reads "
            "training points only (move a point to the training set in calibration.py to fit it)"
        )
    fitted = [p for p in selected if p.fitted]
    if not fitted:
        raise FitError(f"fit stage {stage.name!r}: no training point to fit (outliers aside)")
    return fitted


def stage_outliers(
    stage: Stage, points: Sequence[CalibrationPoint] = POINTS
) -> list[CalibrationPoint]:
    """The training points ``stage`` selects but reports only (marked outlier)."""
    return [p for p in points if stage.selects(p) and p.point_set == "training" and p.outlier]


def check_outliers(residuals: dict[str, float], points: Sequence[CalibrationPoint]) -> None:
    """An outlier mark must be borne out: a point the fitted model meets within its target
    was reconcilable after all and belongs in the fit."""
    for p in points:
        if p.outlier and abs(residuals[p.name]) <= p.target_tolerance:
            raise FitError(
                f"training point {p.name!r} is marked outlier, but the fit meets it "
                f"({residuals[p.name]:+.1%}, target {p.target_tolerance:.0%}): fit it instead"
            )


def _model_value(point: CalibrationPoint, fit: dict[str, Any]) -> float:
    from disagg_planner.simulator import calibration

    with catalogue.trial_fit(fit):
        return calibration.compute_sim(point)


def fit(
    log: Callable[[str], None] = lambda _: None,
) -> tuple[dict[str, float], dict[str, float]]:
    """Fitted values by path, and each training point's relative error at them."""
    values = {p.path: p.start for p in PARAMS}
    for stage in STAGES:
        params = [p for p in PARAMS if p.stage == stage.name]
        points = stage_points(stage)
        lo = np.array([p.low for p in params])
        hi = np.array([p.high for p in params])
        x0 = np.array([values[p.path] for p in params])

        def residuals(
            x: np.ndarray, params: list[Param] = params, points: list[CalibrationPoint] = points
        ) -> np.ndarray:
            trial = dict(values)
            trial.update({p.path: float(v) for p, v in zip(params, x, strict=True)})
            tree = build(trial)
            return np.array([math.log(_model_value(pt, tree) / pt.target) for pt in points])

        result = least_squares(
            residuals,
            x0,
            bounds=(lo, hi),
            x_scale=np.maximum(np.abs(x0), 1e-3),
            diff_step=0.02,  # the offline runs are step functions of the factors at fine steps
            xtol=1e-3,
            ftol=1e-4,
            max_nfev=10,
        )
        values.update({p.path: float(v) for p, v in zip(params, result.x, strict=True)})
        log(
            f"stage {stage.name}: {len(points)} points, cost {result.cost:.4g}, "
            f"{result.nfev} evaluations: "
            + ", ".join(f"{p.path}={values[p.path]:.4g}" for p in params)
        )
    tree = build(values)
    errors = {}
    outliers = []
    for stage in STAGES:
        for pt in stage_points(stage) + stage_outliers(stage):
            errors[pt.name] = _model_value(pt, tree) / pt.target - 1.0
        outliers += stage_outliers(stage)
    check_outliers(errors, outliers)
    return values, errors


def validation_errors(values: dict[str, float]) -> dict[str, float]:
    """Each validation point's relative error at the fitted ``values`` (the roofline)."""
    tree = build(values)
    return {
        p.name: _model_value(p, tree) / p.target - 1.0
        for p in POINTS
        if p.point_set == "validation"
    }


def _report_line(point: CalibrationPoint, err: float) -> str:
    verdict = "met" if abs(err) <= point.target_tolerance else "MISSED"
    mark = " (outlier, not fitted)" if point.outlier else ""
    return f"  {err:+7.1%}  {verdict:<6} {point.name}{mark}"


def _fitted_to(stage_name: str) -> str:
    stage = next(s for s in STAGES if s.name == stage_name)
    numbers = [str(POINTS.index(p) + 1) for p in stage_points(stage)]
    return f"fitted ({stage.name}): {stage.why}, points {', '.join(numbers)} of CALIBRATION.md"


def render(values: dict[str, float]) -> str:
    """``engine_fit.yaml``'s text: every value with a comment naming its origin."""
    comments: dict[str, str] = {p.path: _fitted_to(p.stage) for p in PARAMS}
    comments.update({path: why for path, (_, why) in PRIORS.items()})
    comments.update({path: f"= {src}: {why}" for path, (src, why) in TIES.items()})
    tree = build({k: round(v, 4) for k, v in values.items()})
    lines = [
        "# Fitted factors of the roofline engine model (engine_model.py): written by",
        "#   python -m disagg_planner.simulator.fit --write",
        "# from the training points of calibration.py (never the validation points); see",
        "# CALIBRATION.md. Edit the fit (fit.py), not this file.",
        "# hbm: fraction of the HBM peak weight and activation streams reach, per GPU.",
        "# backends.*: gemm_prefill / gemm_decode: fraction of the dense peak of the weight dtype",
        "# the GEMMs of prefill / decode tokens reach end to end; attention: fraction of the BF16",
        "# peak of prefill attention; kv_read: fraction of the HBM peak of KV-cache reads.",
    ]

    def emit(node: dict[str, Any], prefix: str, indent: int) -> None:
        for key, value in node.items():
            path = f"{prefix}{key}"
            pad = "  " * indent
            if isinstance(value, dict):
                if "same_as" in value:
                    why = SAME_AS[key][1]
                    lines.append(f"{pad}{key}: {{same_as: {value['same_as']}}}  # {why}")
                    continue
                lines.append(f"{pad}{key}:")
                emit(value, path + ".", indent + 1)
            else:
                text = f"{pad}{key}: {value:g}"
                lines.append(f"{text:<40}# {comments[path]}")

    ordered = {
        "hbm": tree["hbm"],
        "allreduce_latency_us": tree["allreduce_latency_us"],
        "backends": tree["backends"],
    }
    emit(ordered, "", 0)
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    flags = {"--write", "--no-validation"}
    if not set(args) <= flags or len(set(args)) != len(args):
        print(
            "usage: python -m disagg_planner.simulator.fit [--write] [--no-validation]",
            file=sys.stderr,
        )
        return 2
    values, errors = fit(log=lambda line: print(line, flush=True))
    by_name = {p.name: p for p in POINTS}
    print("training residuals (target: TTFT 15%, ITL and throughput 10%):")
    for name, err in errors.items():
        print(_report_line(by_name[name], err))
    if "--no-validation" not in args:
        print("validation residuals (never fitted):", flush=True)
        for name, err in validation_errors(values).items():
            print(_report_line(by_name[name], err), flush=True)
    text = render(values)
    if "--write" in args:
        FIT_FILE.write_text(text)
        print(f"wrote {FIT_FILE}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
