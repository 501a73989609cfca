"""Engine timing model: physical monotonicity, vectorised = scalar, KV capacity, and the
calibration targets of CALIBRATION.md."""

from __future__ import annotations

import numpy as np
import pytest

from disagg_planner.simulator.calibration import POINTS
from disagg_planner.simulator.engines import engine_for

H200_8B = "sim:llama-3.1-8b-fp8@h200_sxm:tp1"


@pytest.mark.parametrize(
    "point", [p for p in POINTS if p.tolerance is not None], ids=lambda p: p.name
)
def test_calibration_targets_within_tolerance(point):
    assert abs(point.error()) <= point.tolerance, (
        f"{point.name}: model {point.model_value():.1f} vs target {point.target} {point.unit}"
    )


def test_required_h200_8b_points_are_targets():
    names = {p.name for p in POINTS if p.tolerance == 0.15 and "H200 8B-FP8" in p.name}
    assert any("prefill TTFT, ISL 4096" in n for n in names)
    assert any("decode throughput at ITL 10 ms" in n for n in names)
    # Dynamo's prefill sentence is reported, not fitted: the roofline misses it on purpose.
    dynamo = [p for p in POINTS if p.source == "dynamo" and p.kind.startswith("prefill")]
    assert dynamo and all(p.outlier and abs(p.error()) > p.target_tolerance for p in dynamo)


def test_prefill_time_grows_with_tokens_and_context():
    m = engine_for(H200_8B)
    times = [m.iteration_time_s(p, 0, 0, 0) for p in (16, 256, 1024, 4096, 8192)]
    assert times == sorted(times) and times[0] < times[-1] / 20
    assert m.iteration_time_s(2048, 8192, 0, 0) > m.iteration_time_s(2048, 0, 0, 0)
    # Chunking a long prompt costs more than one pass (weights are read once per chunk).
    assert m.prefill_time_s(16000) > m.iteration_time_s(16000, 0, 0, 0)


def test_decode_step_grows_with_batch_and_kv():
    m = engine_for(H200_8B)
    by_batch = [m.decode_step_time_s(b, 1000) for b in (1, 8, 64, 256)]
    by_context = [m.decode_step_time_s(32, c) for c in (100, 1000, 8000, 32000)]
    assert by_batch == sorted(by_batch)
    assert by_context == sorted(by_context)
    # Small batches are weight-streaming bound: 1 and 8 requests cost almost the same.
    assert by_batch[1] / by_batch[0] < 1.1


def test_vectorised_decode_times_equal_scalar_calls():
    m = engine_for("sim:llama-3.3-70b-fp8@h100_sxm:tp4")
    kv = np.arange(1000.0, 200000.0, 7919.0)
    vec = m.iteration_time_s(0, 0, 48, kv)
    scalar = [m.iteration_time_s(0, 0, 48, float(k)) for k in kv]
    np.testing.assert_allclose(vec, scalar, rtol=1e-12)


def test_tensor_parallelism_speeds_up_but_adds_communication():
    tp1 = engine_for("sim:llama-3.3-70b-fp8@h200_sxm:tp1")
    tp4 = engine_for("sim:llama-3.3-70b-fp8@h200_sxm:tp4")
    t1, t4 = tp1.decode_step_time_s(32, 2000), tp4.decode_step_time_s(32, 2000)
    assert t4 < t1 < 4 * t4  # faster, but not 4x (all-reduce, fixed overheads)


def test_kv_capacity_from_memory():
    m = engine_for(H200_8B)
    # 141 GB * 0.9 - 8 GB of FP8 weights - 2 GB reserve, 64 KiB per token (FP8 KV).
    expected = (141e9 * 0.9 - m.weight_bytes_per_gpu - 2e9) / 65536
    assert m.max_kv_tokens == pytest.approx(expected, rel=0.001)
    assert m.max_kv_tokens % m.spec.block_size == 0
    assert m.capabilities.total_kv_blocks * 16 == m.max_kv_tokens
    assert m.max_model_len == 131072
    small = engine_for("sim:llama-3.1-8b-fp8@h100_sxm:tp1:mem=0.14")
    assert small.max_model_len == small.max_kv_tokens < 131072


def test_moe_wide_ep_reads_only_touched_experts():
    m = engine_for("sim:deepseek-r1@gb200:tp1:dp16")
    # One token touches 8 of 256 experts: a lone decode is much cheaper than a big batch.
    assert m.decode_step_time_s(1, 1000) < 0.5 * m.decode_step_time_s(256, 1000)
    assert m.max_kv_tokens > 100_000


def test_negative_input_is_rejected():
    with pytest.raises(ValueError, match="negative input"):
        engine_for(H200_8B).iteration_time_s(-1, 0, 0, 0)
