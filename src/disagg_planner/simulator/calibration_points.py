"""The calibration points: public measurements, where each comes from, and how an engine model
computes each (the kinds of point are listed in :mod:`disagg_planner.simulator.calibration`,
which reports them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

from disagg_planner.predictors.traces import TraceRequest
from disagg_planner.simulator import aic_engine, catalogue, serving_bench
from disagg_planner.simulator.calibration_sources import SOURCES
from disagg_planner.simulator.engine_model import EngineModel
from disagg_planner.simulator.engines import engine_for
from disagg_planner.simulator.serving_bench import ServingSettings

ENGINE_MODELS = ("sim", "aic")
POINT_SETS = ("training", "validation")
# The targets: TTFT within 15%, ITL and throughput within 10%.
TARGET = {"ttft": 0.15, "itl": 0.10, "throughput": 0.10}
_METRIC_OF_KIND = {
    "prefill_ttft": "ttft",
    "prefill_thpt": "throughput",
    "decode_thpt_at_itl": "throughput",
    "decode_step": "itl",
    "offline_thpt": "throughput",
    # One closed-loop serving benchmark (serving_bench) reports all three; a point each.
    "serving_ttft": "ttft",
    "serving_tpot": "itl",
    "serving_thpt": "throughput",
}
SERVING_KINDS = tuple(kind for kind in _METRIC_OF_KIND if kind.startswith("serving_"))


@dataclass(frozen=True)
class CalibrationPoint:
    name: str
    engine: str  # the sim: spec; the aic: spec is derived from it (see ``spec``)
    kind: str  # a key of _METRIC_OF_KIND
    target: float  # the published reference value
    unit: str
    source: str  # a key of SOURCES
    point_set: str = "training"
    backend: str = "vllm"  # the engine the reference was measured on
    setting: str = ""  # what the reference ran (shown in the table)
    isl: int = 0
    context: float = 0.0
    batch: int = 0
    itl_ms: float = 0.0
    osl: int = 0  # offline_thpt: every request's output length (its input length: isl)
    requests: int = 0  # offline_thpt: queued at t = 0; serving_*: the client's prompts
    # serving_*: the client's concurrency, its random range ratio (lengths uniform in
    # [int(r * L), L] with L = isl, osl) and the seeds of the length draws (0 .. seeds - 1).
    concurrency: int = 0
    range_ratio: float = 0.0
    seeds: int = 3
    # Regression guard of the roofline on its own training points (see test_engine_model);
    # None: not a fitted point.
    tolerance: float | None = None
    assumptions: tuple[str, ...] = field(default=())
    # A training point the fit reports but does not fit to, and why (empty: fitted).
    outlier: str = ""

    def __post_init__(self) -> None:
        if self.kind not in _METRIC_OF_KIND:
            raise ValueError(f"calibration point {self.name!r}: unknown kind {self.kind!r}")
        if self.point_set not in POINT_SETS:
            raise ValueError(f"calibration point {self.name!r}: set {self.point_set!r}")
        if self.source not in SOURCES:
            raise ValueError(f"calibration point {self.name!r}: unknown source {self.source!r}")
        if not self.target > 0:
            raise ValueError(
                f"calibration point {self.name!r}: reference {self.target!r} {self.unit}: "
                "expected a positive number"
            )
        if self.kind == "offline_thpt" and min(self.isl, self.osl, self.requests) < 1:
            raise ValueError(
                f"calibration point {self.name!r}: an offline run needs its requests' fixed "
                f"lengths and count (isl={self.isl}, osl={self.osl}, requests={self.requests})"
            )
        if self.kind in SERVING_KINDS:
            self._check_serving()
        if self.outlier and self.point_set != "training":
            raise ValueError(
                f"calibration point {self.name!r}: outlier is a mark of training points only "
                f"(this one is in the {self.point_set} set, which nothing is fitted to)"
            )
        if self.outlier and self.tolerance is not None:
            raise ValueError(
                f"calibration point {self.name!r}: an outlier is not fitted, so it has no "
                f"regression tolerance (tolerance={self.tolerance})"
            )

    def _check_serving(self) -> None:
        fields = ("concurrency", "requests", "isl", "osl", "seeds")
        for name in fields:
            if getattr(self, name) < 1:
                raise ValueError(
                    f"calibration point {self.name!r}: a serving benchmark needs {name} >= 1 "
                    f"({name}={getattr(self, name)})"
                )
        if not 0.0 < self.range_ratio <= 1.0:
            raise ValueError(
                f"calibration point {self.name!r}: a serving benchmark needs its client's "
                f"range_ratio in (0, 1] (range_ratio={self.range_ratio})"
            )

    @property
    def serving(self) -> ServingSettings:
        """The client settings of a serving point."""
        return ServingSettings(
            self.concurrency, self.requests, self.isl, self.osl, self.range_ratio
        )

    def seed_spread(self, engine_model: str = "sim") -> tuple[float, float] | None:
        """A serving point's lowest and highest value over its seeds (None: not seeded)."""
        if self.kind not in SERVING_KINDS:
            return None
        values = _cached_runs(self.spec(engine_model), self.serving, self.seeds).values(self.metric)
        return min(values), max(values)

    @property
    def fitted(self) -> bool:
        """Whether the fit fits to this point (a training point not marked outlier)."""
        return self.point_set == "training" and not self.outlier

    @property
    def metric(self) -> str:
        return _METRIC_OF_KIND[self.kind]

    @property
    def target_tolerance(self) -> float:
        """The issue's target for this metric (15% TTFT, 10% ITL and throughput)."""
        return TARGET[self.metric]

    def spec(self, engine_model: str = "sim") -> str:
        """The engine spec this point runs on with ``engine_model`` (``sim`` or ``aic``)."""
        if engine_model == "sim":
            return self.engine
        if engine_model != "aic":
            raise ValueError(f"engine model {engine_model!r}: expected one of {ENGINE_MODELS}")
        head, *options = self.engine[len("sim:") :].split(":")
        # the sim spec names a non-vLLM backend as an option; the aic spec as a bare word
        # (and a vLLM release: the aic tables are of their own, vLLM 0.24.0)
        options = [o for o in options if not o.startswith(("backend=", "version="))]
        return ":".join(["aic:" + head, self.backend, *options])

    def model_value(self, engine_model: str = "sim") -> float:
        return _value(self, engine_model).value

    def extrapolated(self, engine_model: str = "sim") -> bool:
        """Whether ``engine_model`` answered outside its measured grid (aic only)."""
        return _value(self, engine_model).extrapolated

    def error(self, engine_model: str = "sim") -> float:
        """Relative error of the engine model, (model - reference) / reference."""
        return (self.model_value(engine_model) - self.target) / self.target


@dataclass(frozen=True)
class _Answer:
    value: float
    extrapolated: bool


@cache
def _value(point: CalibrationPoint, engine_model: str) -> _Answer:
    spec = point.spec(engine_model)
    if engine_model == "aic":
        # Each point's extrapolation flag is its own (the answers are shared by spec).
        aic_engine.forget_answers()
    if point.kind in SERVING_KINDS:
        runs = _cached_runs(spec, point.serving, point.seeds)
        return _Answer(_seed_mean(point, runs), runs.extrapolations > 0)
    value, model = _evaluate(point, spec)
    # Only the aic engine model has a measured grid to leave.
    outside = sum(getattr(model, "extrapolations", {}).values())
    return _Answer(value, outside > 0)


# One simulation per (engine spec, client settings, seeds): a serving benchmark's three
# metrics are three points that share it.
_cached_runs = cache(serving_bench.seeded_runs)


def _seed_mean(point: CalibrationPoint, runs: serving_bench.SeededRuns) -> float:
    """A serving point's model value: its metric's mean over the seeds."""
    values = runs.values(point.metric)
    return sum(values) / len(values)


def _evaluate(point: CalibrationPoint, spec: str) -> tuple[float, EngineModel]:
    if point.kind == "offline_thpt":
        return _offline(point, spec)
    model = engine_for(spec)
    return _compute(point, model), model


def compute_sim(point: CalibrationPoint) -> float:
    """The roofline's value for ``point`` with the efficiency factors in force now (not
    cached: the fitting tool calls it inside ``catalogue.trial_fit``)."""
    spec = point.spec("sim")
    if point.kind in SERVING_KINDS:
        return _seed_mean(point, serving_bench.seeded_runs(spec, point.serving, point.seeds))
    return _evaluate(point, spec)[0]


def _compute(p: CalibrationPoint, model: EngineModel) -> float:
    if p.kind in ("prefill_ttft", "prefill_thpt"):
        ttft = model.prefill_time_s(p.isl) + catalogue.efficiency().ttft_overhead_s
        if p.kind == "prefill_ttft":
            return ttft * 1000.0
        return p.isl / ttft / model.spec.gpus
    if p.kind == "decode_step":
        return model.decode_step_time_s(p.batch, p.context) * 1000.0
    if p.kind == "decode_thpt_at_itl":
        best = 0.0
        for b in range(1, model.max_decode_batch(p.context) + 1):
            step = model.decode_step_time_s(b, p.context)
            if step * 1000.0 > p.itl_ms:
                break
            best = b / step / model.spec.gpus
        return best
    raise ValueError(f"calibration point {p.name!r}: {p.kind} is not an engine-model formula")


def _offline(p: CalibrationPoint, spec: str) -> tuple[float, EngineModel]:
    # Imported here: the cluster pulls in the whole scheduler, which the other kinds skip.
    from disagg_planner.simulator.cluster import Cluster

    cluster = Cluster(engines={"agg": spec}, mode="agg", replicas={"agg": 1})
    cluster.submit(TraceRequest(0.0, p.isl, p.osl) for _ in range(p.requests))
    cluster.run_to_completion()
    records = cluster.records
    failed = [r for r in records if not r.ok]
    if failed or len(records) != p.requests:
        raise RuntimeError(
            f"calibration point {p.name!r}: {len(failed)} of {p.requests} requests failed "
            f"({failed[0].error if failed else 'missing records'})"
        )
    span = max(r.finish_s for r in records)
    model = cluster.engine_model("agg")
    return sum(r.osl for r in records) / span / model.spec.gpus, model


_H200_8B_FP8 = "sim:llama-3.1-8b-fp8@h200_sxm:tp1"
# The vLLM nightly benchmark's build 9515 does not publish its release. Its batch-8 steps are
# 1.4-1.7 ms (8B) and 3.3-3.6 ms (70B TP4) above vLLM 0.24.0's measured kernels at the same
# shapes (the aic column), about 45 us per layer in both: the CPU work vLLM's V0 engine exposed
# between GPU steps (vLLM's v0.6.0 blog: GPU execution was 38% of a step before 0.6). A V0
# release is assumed; the fit gives its per-layer overhead from these four points alone.
_NIGHTLY = ":version=0.6"
_NIGHTLY_NOTE = (
    "vLLM release of the nightly build 9515 not published: a V0-engine release (0.6) assumed"
)
# trtllm-bench max-throughput runs large batches (CUDA graphs padded up to batch 8192).
_TRTLLM_BENCH = ":seqs=2048:mnbt=8192"


def _trtllm(
    model: str,
    label: str,
    isl: int,
    osl: int,
    tok_s: float,
    n: int,
    point_set: str = "validation",
    gpu: str = "h200_sxm",
    tp: int = 1,
) -> CalibrationPoint:
    """A perf-overview row: ``tok_s`` is the page's output tokens/s of the TP group."""
    group = f", {tok_s:,.0f} tok/s for the TP{tp} group" if tp > 1 else ""
    return CalibrationPoint(
        f"{gpu.split('_')[0].upper()} {label} TP{tp} offline output throughput, {isl}/{osl} "
        "(TensorRT-LLM)",
        f"sim:{model}@{gpu}:tp{tp}{_TRTLLM_BENCH}:backend=trtllm",
        "offline_thpt",
        tok_s / tp,
        "tok/s/GPU",
        "trtllm",
        point_set=point_set,
        backend="trtllm",
        setting=f"{n:,} requests {isl}/{osl}, max batch 2048{group}",
        isl=isl,
        osl=osl,
        requests=n,
        tolerance=0.15 if point_set == "training" else None,
    )


_DYNAMO_OUTLIER = (
    "the profiler's loaded operating point, not a lone request: its own raw profile gives 27 ms "
    "and AIConfigurator's measured vLLM tables 54 ms for the same request, and no FP8 prefill "
    "efficiency meets 80 ms and the aic-vllm prefill points together"
)
_RAW_OUTLIER = (
    "below what the FP8 dense peak allows: 3000 tokens of an 8B model are 48 TFLOP, 1.8 PFLOPS "
    "in 27 ms (90% of the peak, before attention and the frontend); the roofline at the "
    "largest plausible efficiency (0.95) still takes 39 ms"
)


def _aic_prefill(engine: str, label: str, isl: int, ms: float) -> CalibrationPoint:
    return CalibrationPoint(
        f"{label} prefill TTFT, ISL {isl} (AIConfigurator vLLM tables)",
        engine,
        "prefill_ttft",
        ms,
        "ms",
        "aic-vllm",
        setting="one request alone",
        isl=isl,
        tolerance=0.15,
    )


def _aic_decode(engine: str, label: str, batch: int, context: int, ms: float) -> CalibrationPoint:
    return CalibrationPoint(
        f"{label} decode step, batch {batch}, context {context} (AIConfigurator vLLM tables)",
        engine,
        "decode_step",
        ms,
        "ms",
        "aic-vllm",
        setting=f"batch {batch}, context {context}",
        batch=batch,
        context=context,
        tolerance=0.15,
    )


# InferenceX's vLLM v0.10.2 server (a V1 release) as its H100 Llama-70B FP8 script runs it.
_INFERENCEX = ":seqs=64:mnbt=8192:max_model_len=10240:prefix_caching=off:version=0.10.2"
_INFERENCEX_NOTES = (
    "client lengths uniform in [0.8 L, L] per request (the random dataset's older "
    "--random-range-ratio semantics; the fork's sampling code was not checked), drawn with "
    "3 seeds: the model value is their mean, their spread is listed",
    "vLLM v0.10.2's timing is the V1 engine model's (fitted to vLLM 0.24.0's kernel tables); "
    "its async scheduling is not modelled beyond that",
)


def _inferencex(
    isl: int, tp: int, *, thpt: float, ttft: float, tpot: float
) -> tuple[CalibrationPoint, ...]:
    """One InferenceX H100 row (conc 64, 640 prompts, output 1k): its three metrics."""
    # Little's law on the row's own figures, at the mean lengths (0.9 of the nominal): 64 in
    # flight over one request's e2e is the request rate; its tokens over the per-GPU figure
    # are the GPUs.
    e2e_s = (ttft + 0.9 * 1023 * tpot) / 1000.0
    tokens_s = 64 / e2e_s * 0.9 * (isl + 1024)
    derivation = (
        f"64 in flight / e2e {e2e_s:.1f} s x {0.9 * (isl + 1024):,.0f} mean tokens = "
        f"{tokens_s:,.0f} tok/s, / {thpt:,.1f} per GPU = {tokens_s / thpt:.2f} GPUs"
    )
    shape = f"{isl // 1024}k/1k"
    note = f"TP not published: TP{tp} derived by Little's law from the row's figures ({derivation})"
    return tuple(
        CalibrationPoint(
            f"H100 Llama-3.3-70B FP8 TP{tp} serving {label}, {shape}, conc 64 (vLLM)",
            f"sim:llama-3.3-70b-fp8@h100_sxm:tp{tp}{_INFERENCEX}",
            kind,
            target,
            unit,
            "inferencex",
            point_set="validation",
            setting=f"closed loop, conc 64, 640 prompts, random {isl}/1024 x [0.8, 1]",
            isl=isl,
            osl=1024,
            requests=640,
            concurrency=64,
            range_ratio=0.8,
            assumptions=(note, *_INFERENCEX_NOTES),
        )
        for kind, label, target, unit in (
            ("serving_ttft", "median TTFT", ttft, "ms"),
            ("serving_tpot", "median TPOT", tpot, "ms"),
            ("serving_thpt", "throughput", thpt, "tok/s/GPU"),
        )
    )


POINTS: tuple[CalibrationPoint, ...] = (
    # ---- training: the roofline's efficiency factors were fitted to these -------------------
    CalibrationPoint(
        "H200 8B-FP8 prefill TTFT, ISL 3000",
        _H200_8B_FP8,
        "prefill_ttft",
        80.0,
        "ms",
        "dynamo",
        setting="one request alone",
        isl=3000,
        outlier=_DYNAMO_OUTLIER,
    ),
    CalibrationPoint(
        "H200 8B-FP8 prefill TTFT, ISL 3000, raw profile",
        _H200_8B_FP8,
        "prefill_ttft",
        27.0,
        "ms",
        "dynamo-raw",
        setting="one request alone",
        isl=3000,
        outlier=_RAW_OUTLIER,
    ),
    CalibrationPoint(
        "H200 8B-FP8 prefill throughput, ISL 3000",
        _H200_8B_FP8,
        "prefill_thpt",
        40000.0,
        "tok/s/GPU",
        "dynamo",
        setting="ISL / TTFT",
        isl=3000,
        outlier=_DYNAMO_OUTLIER,
    ),
    CalibrationPoint(
        "H200 8B-FP8 decode throughput at ITL 10 ms, context 3075",
        _H200_8B_FP8,
        "decode_thpt_at_itl",
        10000.0,
        "tok/s/GPU",
        "dynamo",
        setting="largest batch within 10 ms",
        context=3075,
        itl_ms=10.0,
        tolerance=0.15,
    ),
    CalibrationPoint(
        "H100 Llama-3.1-8B BF16 TP1 decode step, batch 8",
        "sim:llama-3.1-8b@h100_sxm:tp1" + _NIGHTLY,
        "decode_step",
        7.8,
        "ms",
        "vllm-latency",
        setting="batch 8, context 96",
        batch=8,
        context=96,
        tolerance=0.15,
        assumptions=(_NIGHTLY_NOTE,),
    ),
    CalibrationPoint(
        "H200 Llama-3.1-8B BF16 TP1 decode step, batch 8",
        "sim:llama-3.1-8b@h200_sxm:tp1" + _NIGHTLY,
        "decode_step",
        6.5,
        "ms",
        "vllm-latency",
        setting="batch 8, context 96",
        batch=8,
        context=96,
        tolerance=0.15,
        assumptions=(_NIGHTLY_NOTE,),
    ),
    CalibrationPoint(
        "H100 Llama-3-70B BF16 TP4 decode step, batch 8",
        "sim:llama-3.3-70b@h100_sxm:tp4" + _NIGHTLY,
        "decode_step",
        19.1,
        "ms",
        "vllm-latency",
        setting="batch 8, context 96",
        batch=8,
        context=96,
        tolerance=0.15,
        assumptions=(_NIGHTLY_NOTE,),
    ),
    CalibrationPoint(
        "H200 Llama-3-70B BF16 TP4 decode step, batch 8",
        "sim:llama-3.3-70b@h200_sxm:tp4" + _NIGHTLY,
        "decode_step",
        16.2,
        "ms",
        "vllm-latency",
        setting="batch 8, context 96",
        batch=8,
        context=96,
        tolerance=0.15,
        assumptions=(_NIGHTLY_NOTE,),
    ),
    # vLLM's FP8 prefill by AIConfigurator's measured vLLM tables: short, middle and long
    # prompts (GEMMs against attention) on both GPUs and at TP4 (values: --aic-references).
    _aic_prefill(_H200_8B_FP8, "H200 8B-FP8 TP1", 1024, 21.18),
    _aic_prefill(_H200_8B_FP8, "H200 8B-FP8 TP1", 4096, 67.88),
    _aic_prefill(_H200_8B_FP8, "H200 8B-FP8 TP1", 16384, 323.6),
    _aic_prefill("sim:llama-3.1-8b-fp8@h100_sxm:tp1", "H100 8B-FP8 TP1", 1024, 23.29),
    _aic_prefill("sim:llama-3.1-8b-fp8@h100_sxm:tp1", "H100 8B-FP8 TP1", 4096, 77.07),
    _aic_prefill("sim:llama-3.1-8b-fp8@h100_sxm:tp1", "H100 8B-FP8 TP1", 16384, 353.31),
    _aic_prefill("sim:llama-3.3-70b-fp8@h200_sxm:tp4", "H200 70B-FP8 TP4", 1024, 56.79),
    _aic_prefill("sim:llama-3.3-70b-fp8@h200_sxm:tp4", "H200 70B-FP8 TP4", 4096, 196.84),
    _aic_prefill("sim:llama-3.3-70b-fp8@h200_sxm:tp4", "H200 70B-FP8 TP4", 16384, 833.11),
    # ... and its BF16 prefill by the same tables (the BF16 GEMM efficiency was a prior).
    _aic_prefill("sim:llama-3.1-8b@h200_sxm:tp1", "H200 8B BF16 TP1", 1024, 27.18),
    _aic_prefill("sim:llama-3.1-8b@h200_sxm:tp1", "H200 8B BF16 TP1", 4096, 98.83),
    _aic_prefill("sim:llama-3.1-8b@h200_sxm:tp1", "H200 8B BF16 TP1", 16384, 454.62),
    _aic_prefill("sim:llama-3.1-8b@h100_sxm:tp1", "H100 8B BF16 TP1", 1024, 28.11),
    _aic_prefill("sim:llama-3.1-8b@h100_sxm:tp1", "H100 8B BF16 TP1", 4096, 96.07),
    _aic_prefill("sim:llama-3.1-8b@h100_sxm:tp1", "H100 8B BF16 TP1", 16384, 455.7),
    _aic_prefill("sim:llama-3.3-70b@h200_sxm:tp4", "H200 70B BF16 TP4", 1024, 71.72),
    _aic_prefill("sim:llama-3.3-70b@h200_sxm:tp4", "H200 70B BF16 TP4", 4096, 272.62),
    _aic_prefill("sim:llama-3.3-70b@h200_sxm:tp4", "H200 70B BF16 TP4", 16384, 1154.35),
    # vLLM 0.24.0's decode steps by the same tables: BF16 and FP8 weights, 8B TP1 and 70B TP4,
    # both GPUs, at the nightly latency test's shape and a larger batch (values:
    # --aic-references); the nightly build's own steps (above) are an older engine.
    _aic_decode("sim:llama-3.1-8b@h100_sxm:tp1", "H100 8B BF16 TP1", 8, 96, 6.4),
    _aic_decode("sim:llama-3.1-8b@h100_sxm:tp1", "H100 8B BF16 TP1", 32, 512, 7.69),
    _aic_decode("sim:llama-3.1-8b@h200_sxm:tp1", "H200 8B BF16 TP1", 8, 96, 4.84),
    _aic_decode("sim:llama-3.1-8b@h200_sxm:tp1", "H200 8B BF16 TP1", 32, 512, 5.83),
    _aic_decode("sim:llama-3.1-8b-fp8@h100_sxm:tp1", "H100 8B-FP8 TP1", 8, 96, 4.6),
    _aic_decode("sim:llama-3.1-8b-fp8@h100_sxm:tp1", "H100 8B-FP8 TP1", 32, 512, 5.22),
    _aic_decode(_H200_8B_FP8, "H200 8B-FP8 TP1", 8, 96, 3.82),
    _aic_decode(_H200_8B_FP8, "H200 8B-FP8 TP1", 32, 512, 4.74),
    _aic_decode("sim:llama-3.3-70b@h100_sxm:tp4", "H100 70B BF16 TP4", 8, 96, 15.83),
    _aic_decode("sim:llama-3.3-70b@h100_sxm:tp4", "H100 70B BF16 TP4", 32, 512, 16.7),
    _aic_decode("sim:llama-3.3-70b@h200_sxm:tp4", "H200 70B BF16 TP4", 8, 96, 12.58),
    _aic_decode("sim:llama-3.3-70b@h200_sxm:tp4", "H200 70B BF16 TP4", 32, 512, 13.27),
    _aic_decode("sim:llama-3.3-70b-fp8@h100_sxm:tp4", "H100 70B-FP8 TP4", 8, 96, 10.22),
    _aic_decode("sim:llama-3.3-70b-fp8@h100_sxm:tp4", "H100 70B-FP8 TP4", 32, 512, 12.16),
    _aic_decode("sim:llama-3.3-70b-fp8@h200_sxm:tp4", "H200 70B-FP8 TP4", 8, 96, 8.85),
    _aic_decode("sim:llama-3.3-70b-fp8@h200_sxm:tp4", "H200 70B-FP8 TP4", 32, 512, 11.21),
    # TensorRT-LLM's perf-overview rows at the shapes kept for training (the request counts
    # are the page's own); the shapes the issue names are in the validation set below.
    _trtllm("llama-3.1-8b-fp8", "8B-FP8", 500, 2000, 20770.0, 3000, "training"),
    _trtllm("llama-3.1-8b-fp8", "8B-FP8", 1000, 1000, 17744.0, 3000, "training"),
    _trtllm("llama-3.1-8b-fp8", "8B-FP8", 5000, 500, 3902.0, 1500, "training"),
    _trtllm("llama-3.3-70b-fp8", "70B-FP8", 500, 2000, 3666.0, 3000, "training"),
    _trtllm("llama-3.3-70b-fp8", "70B-FP8", 1000, 1000, 2909.0, 3000, "training"),
    _trtllm("llama-3.3-70b-fp8", "70B-FP8", 5000, 500, 566.0, 1500, "training"),
    # ---- validation: fitted to neither engine model ---------------------------------------
    CalibrationPoint(
        "H200 Llama-3.1-8B decode step, batch 32, context 4224 (agg itl_p50)",
        "sim:llama-3.1-8b@h200_sxm:tp1",
        "decode_step",
        9.3,
        "ms",
        "aic-queueing",
        point_set="validation",
        setting="batch 32, context 4096 + 256/2",
        batch=32,
        context=4224,
        assumptions=("precision not stated by the source; BF16 assumed",),
    ),
    # The same page's H100 rows (8B TP1, 70B TP2) at the two shapes engine-calibration.md
    # names as the best single anchors, prefill-heavy 2048/128 and decode-heavy 128/2048: the
    # other GPU and TP > 1 on the TRT-LLM backend, which was fitted on H200 TP1 rows only.
    # They replace vLLM's nightly ShareGPT throughput rows, whose 200 prompts' lengths are not
    # published (an assumed spread decided them: CALIBRATION.md).
    _trtllm("llama-3.1-8b-fp8", "8B-FP8", 128, 2048, 22714.0, 3000, gpu="h100_sxm"),
    _trtllm("llama-3.1-8b-fp8", "8B-FP8", 2048, 128, 3450.0, 3000, gpu="h100_sxm"),
    _trtllm("llama-3.3-70b-fp8", "70B-FP8", 128, 2048, 6651.0, 3000, gpu="h100_sxm", tp=2),
    _trtllm("llama-3.3-70b-fp8", "70B-FP8", 2048, 128, 762.0, 3000, gpu="h100_sxm", tp=2),
    # 128/128 ran 30,000 requests; 10,000 keep the run as steady (batch <= 2048) and shorter.
    _trtllm("llama-3.1-8b-fp8", "8B-FP8", 128, 128, 27911.0, 10000),
    _trtllm("llama-3.1-8b-fp8", "8B-FP8", 128, 2048, 26221.0, 3000),
    _trtllm("llama-3.1-8b-fp8", "8B-FP8", 2048, 128, 3538.0, 3000),
    _trtllm("llama-3.1-8b-fp8", "8B-FP8", 2048, 2048, 12194.0, 1500),
    _trtllm("llama-3.3-70b-fp8", "70B-FP8", 128, 128, 3803.0, 10000),
    _trtllm("llama-3.3-70b-fp8", "70B-FP8", 128, 2048, 4336.0, 3000),
    _trtllm("llama-3.3-70b-fp8", "70B-FP8", 2048, 128, 442.0, 3000),
    _trtllm("llama-3.3-70b-fp8", "70B-FP8", 2048, 2048, 2003.0, 1500),
    _trtllm("llama-3.1-8b-fp8", "8B-FP8", 128, 4096, 18027.0, 1500),
    _trtllm("llama-3.1-8b-fp8", "8B-FP8", 1000, 2000, 16828.0, 1500),
    _trtllm("llama-3.1-8b-fp8", "8B-FP8", 20000, 2000, 1804.0, 1000),
    _trtllm("llama-3.3-70b-fp8", "70B-FP8", 128, 4096, 2872.0, 1500),
    _trtllm("llama-3.3-70b-fp8", "70B-FP8", 1000, 2000, 2994.0, 1500),
    _trtllm("llama-3.3-70b-fp8", "70B-FP8", 20000, 2000, 283.0, 1000),
    # vLLM serving under load (InferenceX, H100, Llama-3.3-70B FP8; appended so the numbers
    # above stay): TTFT, TPOT and throughput of one closed-loop benchmark each.
    *_inferencex(1024, 2, thpt=2123.1, ttft=135.7, tpot=29.1),
    *_inferencex(8192, 4, thpt=2568.0, ttft=466.2, tpot=55.0),
)


__all__ = [
    "ENGINE_MODELS",
    "POINTS",
    "POINT_SETS",
    "SERVING_KINDS",
    "SOURCES",
    "TARGET",
    "CalibrationPoint",
    "compute_sim",
]
