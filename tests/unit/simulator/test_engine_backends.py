"""The roofline per phase and per backend: prefill and decode GEMMs at their own efficiencies,
TensorRT-LLM's KV-cache sizing and no-evict admission, and the fitted factors' file
(``engine_fit.yaml``) as the fitting tool writes it, with nothing fitted to validation points."""

from __future__ import annotations

import pytest
import yaml

from disagg_planner.predictors.traces import TraceRequest
from disagg_planner.simulator import catalogue, fit
from disagg_planner.simulator.calibration import POINTS
from disagg_planner.simulator.cluster import Cluster
from disagg_planner.simulator.engine_model import EngineModel
from disagg_planner.simulator.engine_spec import parse
from disagg_planner.simulator.engines import engine_for
from disagg_planner.simulator.errors import CatalogueError, EngineSpecError

H200_8B = "sim:llama-3.1-8b-fp8@h200_sxm:tp1"


def _with(path: str, value: float) -> dict:
    tree = fit.build({p.path: p.start for p in fit.PARAMS})
    fit._set(tree, path, value)
    return tree


def test_prefill_and_decode_gemms_have_their_own_efficiency() -> None:
    # 4,096 tokens are compute-bound either way; only the decode efficiency moves decode.
    base = fit.build({p.path: p.start for p in fit.PARAMS})
    faster_decode = _with("backends.vllm.gemm_decode.fp8", 0.9)
    with catalogue.trial_fit(base):
        m = engine_for(H200_8B)
        prefill, decode = m.iteration_time_s(4096, 0, 0, 0), m.iteration_time_s(0, 0, 4096, 0)
    with catalogue.trial_fit(faster_decode):
        m2 = engine_for(H200_8B)
        # Only the prompt's last (sampling) row of 4,096 runs at the decode efficiency.
        assert prefill > m2.iteration_time_s(4096, 0, 0, 0) > (1 - 1e-3) * prefill
        assert m2.iteration_time_s(0, 0, 4096, 0) < 0.8 * decode

        # A decode engine's one recomputed token per transferred request is a sampling row:
        # 4,096 one-token prefills speed up as 4,096 decodes do.
        def ones(model: EngineModel) -> float:
            return model.iteration_time_s(
                4096, 0, 0, 0, prefill_requests=4096, prefill_attention_pairs=4096.0
            )

        assert ones(m2) < 0.8 * ones(m)


def test_kv_read_efficiency_moves_decode_attention_only() -> None:
    slow_kv = _with("backends.vllm.kv_read", 0.4)
    fast_kv = _with("backends.vllm.kv_read", 0.9)
    with catalogue.trial_fit(slow_kv):
        slow = engine_for(H200_8B)
        s_long, s_short = slow.decode_step_time_s(64, 8000), slow.decode_step_time_s(64, 1)
    with catalogue.trial_fit(fast_kv):
        fast = engine_for(H200_8B)
        f_long, f_short = fast.decode_step_time_s(64, 8000), fast.decode_step_time_s(64, 1)
    assert f_long < 0.8 * s_long
    assert f_short == pytest.approx(s_short, rel=0.01)  # no KV: weights and overheads only


def test_backends_time_differently_and_sglang_uses_vllms_factors() -> None:
    vllm = engine_for(H200_8B)
    sglang = engine_for(H200_8B + ":backend=sglang")
    trtllm = engine_for(H200_8B + ":backend=trtllm")
    args = (0, 0, 512, 512 * 2000)
    assert sglang.iteration_time_s(*args) == vllm.iteration_time_s(*args)
    assert trtllm.iteration_time_s(*args) != vllm.iteration_time_s(*args)
    assert trtllm.backend_eff == catalogue.efficiency().backend("trtllm")


def test_trtllm_sizes_its_kv_cache_from_free_memory() -> None:
    # kv_cache_free_gpu_mem_fraction: 0.9 of what the weights and reserve leave.
    m = engine_for(H200_8B + ":backend=trtllm")
    expected = (141e9 - m.weight_bytes_per_gpu - 2e9) * 0.9 / 65536
    assert m.max_kv_tokens == pytest.approx(expected, rel=0.001)
    assert m.max_kv_tokens > engine_for(H200_8B).max_kv_tokens


@pytest.mark.parametrize(
    ("backend", "mem", "preempts"), [("vllm", 0.17, True), ("trtllm", 0.05, False)]
)
def test_trtllm_admission_never_evicts(backend: str, mem: float, preempts: bool) -> None:
    # A KV cache of ~50k tokens (the memory fraction is of the whole GPU for vLLM, of what
    # the weights leave for TRT-LLM) and 200 requests of 100 + 1,000 tokens: admitting on the
    # prompt alone (vLLM) overcommits and preempts; TRT-LLM reserves the whole request.
    spec = f"sim:llama-3.1-8b-fp8@h100_sxm:tp1:mem={mem}:seqs=512:backend={backend}"
    cluster = Cluster(engines={"agg": spec}, mode="agg", replicas={"agg": 1})
    assert 30_000 < cluster.engine_model("agg").max_kv_tokens < 80_000
    cluster.submit(TraceRequest(0.0, 100, 1000) for _ in range(200))
    cluster.run_to_completion()
    records = cluster.records
    assert len(records) == 200 and all(r.ok for r in records)
    assert (sum(r.preemptions for r in records) > 0) is preempts


def test_the_fit_reads_training_points_only() -> None:
    for stage in fit.STAGES:
        points = fit.stage_points(stage)
        assert points and all(p.point_set == "training" for p in points)
    fitted = {p.path for p in fit.PARAMS}
    assert not fitted & set(fit.PRIORS) and not fitted & set(fit.TIES)


def test_a_stage_that_selects_a_validation_point_is_refused() -> None:
    # The validation set judges the fit; one of its points in a stage would make it training.
    held_out = next(p for p in POINTS if p.point_set == "validation")
    stage = fit.Stage("leaky", lambda p: p is held_out or p.source == "vllm-latency", "test")
    with pytest.raises(fit.FitError, match="selects validation points"):
        fit.stage_points(stage)


def test_outliers_are_reported_not_fitted_and_the_mark_must_hold() -> None:
    stage = next(s for s in fit.STAGES if s.name == "vllm-prefill")
    fitted, outliers = fit.stage_points(stage), fit.stage_outliers(stage)
    assert outliers and not set(outliers) & set(fitted)
    assert all(p.outlier and p.tolerance is None for p in outliers)
    far = {p.name: 0.30 for p in outliers}
    fit.check_outliers(far, outliers)  # beyond every target: the marks hold
    near = dict(far, **{outliers[0].name: 0.05})
    with pytest.raises(fit.FitError, match="marked outlier, but the fit meets it"):
        fit.check_outliers(near, outliers)


def test_vllm_prefill_is_fitted_to_more_than_one_figure() -> None:
    # Issue 31: one sentence (Dynamo's 80 ms) set vLLM's FP8 prefill; now prompts from 1k to
    # 16k tokens on two GPUs and two parallelisms, which also separates attention from GEMMs.
    stage = next(s for s in fit.STAGES if s.name == "vllm-prefill")
    points = fit.stage_points(stage)
    assert len({p.isl for p in points}) >= 3 and len({p.engine for p in points}) >= 3
    assert {p.path for p in fit.PARAMS if p.stage == stage.name} == {
        "backends.vllm.gemm_prefill.fp8",
        "backends.vllm.attention",
    }


def test_engine_fit_yaml_is_what_the_fitting_tool_writes() -> None:
    data = yaml.safe_load(fit.FIT_FILE.read_text())
    values = {p.path: fit._get(data, p.path) for p in fit.PARAMS}
    # Priors, ties and shared backends are the tool's, and the text is its rendering.
    assert fit.build(values) == data
    assert fit.FIT_FILE.read_text() == fit.render(values)
    for p in fit.PARAMS:
        assert p.low <= values[p.path] <= p.high, p.path
    # Each fitted value names its points, which are training points.
    for line in fit.FIT_FILE.read_text().splitlines():
        if "# fitted" in line:
            numbers = line.split("points ", 1)[1].split(" of ")[0].split(", ")
            assert all(POINTS[int(n) - 1].point_set == "training" for n in numbers)


def test_a_backend_copying_an_unknown_one_is_refused() -> None:
    tree = fit.build({p.path: p.start for p in fit.PARAMS})
    tree["backends"]["sglang"] = {"same_as": "nope"}
    with pytest.raises(CatalogueError, match=r"same_as='nope'"):
        catalogue.efficiency_from(tree)
    del tree["backends"]["trtllm"]["kv_read"]
    tree["backends"]["sglang"] = {"same_as": "vllm"}
    with pytest.raises(CatalogueError, match=r"backends\.trtllm lacks field 'kv_read'"):
        catalogue.efficiency_from(tree)


def test_a_v0_engine_release_pays_its_per_layer_overhead_on_every_step() -> None:
    # Issue 31: vLLM's nightly build (an older engine) and vLLM 0.24.0's measured kernels
    # disagree by ~45 us per layer at the same shapes; the spec's release says which it is.
    eff = catalogue.efficiency().backend("vllm")
    assert eff.legacy_layer_overhead_s > 0
    for spec in ("sim:llama-3.1-8b@h200_sxm:tp1", "sim:llama-3.3-70b@h100_sxm:tp4"):
        current, v0 = engine_for(spec), engine_for(spec + ":version=0.6")
        layers = current.spec.model.layers
        for batch, context in ((1, 100), (64, 2048)):
            extra = v0.decode_step_time_s(batch, context) - current.decode_step_time_s(
                batch, context
            )
            assert extra == pytest.approx(layers * eff.legacy_layer_overhead_s, rel=1e-9)
        # V1 the default from 0.8.0: no extra
        v1 = engine_for(spec + ":version=0.8.0")
        assert v1.decode_step_time_s(8, 96) == current.decode_step_time_s(8, 96)


def test_fp8_weights_pay_the_activation_quantisation_per_layer_on_vllm_only() -> None:
    vllm, trt = catalogue.efficiency().backend("vllm"), catalogue.efficiency().backend("trtllm")
    assert vllm.fp8_layer_overhead_s > 0 and trt.fp8_layer_overhead_s == 0
    fp8 = engine_for(H200_8B)
    without = dict(fit.build({p.path: fit._get(catalogue.fit_data(), p.path) for p in fit.PARAMS}))
    fit._set(without, "backends.vllm.fp8_layer_overhead_us", 0.0)
    with catalogue.trial_fit(without):
        bare = engine_for(H200_8B)
    assert fp8.decode_step_time_s(8, 96) - bare.decode_step_time_s(8, 96) == pytest.approx(
        fp8.spec.model.layers * vllm.fp8_layer_overhead_s, rel=1e-9
    )


def test_vllm_decode_is_fitted_to_the_release_of_its_points() -> None:
    # The default release's decode factors come from vLLM 0.24.0's tables (BF16 and FP8, two
    # GPUs, TP1 and TP4); the nightly build's latencies fit only the V0 term.
    by_stage = {s.name: fit.stage_points(s) for s in fit.STAGES}
    tables = by_stage["vllm-decode"]
    assert {p.engine for p in tables} >= {
        "sim:llama-3.1-8b@h200_sxm:tp1",
        "sim:llama-3.1-8b-fp8@h200_sxm:tp1",
        "sim:llama-3.3-70b@h100_sxm:tp4",
        "sim:llama-3.3-70b-fp8@h100_sxm:tp4",
    }
    assert all(not parse(p.engine).legacy_engine for p in tables)
    assert all(parse(p.engine).legacy_engine for p in by_stage["decode-latency"])
    assert [p.path for p in fit.PARAMS if p.stage == "decode-latency"] == [
        "backends.vllm.legacy_layer_overhead_us"
    ]
    # the validation ITL's shape is not among the training shapes
    itl = next(p for p in POINTS if p.point_set == "validation" and p.kind == "decode_step")
    assert all((p.batch, p.context) != (itl.batch, itl.context) for p in tables)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("sim:llama-3.1-8b@h200_sxm:version=latest", "must be a vLLM release X.Y"),
        ("sim:llama-3.1-8b@h200_sxm:backend=trtllm:version=0.6", "only a sim: vLLM engine"),
    ],
)
def test_a_release_that_is_not_a_vllm_one_is_refused(spec: str, message: str) -> None:
    with pytest.raises(EngineSpecError, match=message):
        parse(spec)


def test_the_release_round_trips_through_the_spec_text() -> None:
    spec = parse("sim:llama-3.1-8b@h200_sxm:tp1:version=0.6")
    assert str(spec) == "sim:llama-3.1-8b@h200_sxm:tp1:version=0.6"
    assert parse(str(spec)) == spec and spec.vllm_version == (0, 6, 0)
    assert parse("sim:llama-3.1-8b@h200_sxm").vllm_version == (0, 24, 0)
