"""TTFT/ITL estimators against hand-computed values on exactly known laws."""

from __future__ import annotations

import math

import pytest

from disagg_planner.regression.estimators import (
    EngineLimits,
    agg_itl_ms,
    agg_ttft_ms,
    chunked_prefill_time_s,
    decode_itl_ms,
    prefill_ttft_ms,
)
from disagg_planner.regression.models import AggModel, DecodeModel, PrefillModel
from tests.unit.regression.fpm_factory import agg_law, decode_law, fpm, heartbeat, prefill_law

LIMITS = EngineLimits(max_num_batched_tokens=8192, max_num_seqs=256, max_kv_tokens=500_000)


def _prefill_model(isl: int = 3000) -> PrefillModel:
    # a spread of sizes identifies the law; then 64 iterations of `isl` make that the average
    model = PrefillModel(max_samples=64)
    sizes = (500, 1500, 3000, 4500, 6000, 8192)
    for i, tokens in enumerate(sizes):
        model.observe(
            fpm(counter=1000 + i, wall=prefill_law(tokens), prefill_reqs=1, prefill_tokens=tokens)
        )
    for i in range(64):
        model.observe(
            fpm(counter=2000 + i, wall=prefill_law(isl), prefill_reqs=1, prefill_tokens=isl)
        )
    return model


def _decode_model(context: int = 2000) -> DecodeModel:
    model = DecodeModel()
    for i, num in enumerate(range(1, 200, 3)):  # 67 iterations; the window keeps 64
        kv = num * (context + (500 if i % 2 else -500))  # per-request context varies
        model.observe(
            fpm(counter=1000 + i, wall=decode_law(num, kv), decode_reqs=num, decode_kv=kv)
        )
    return model


def test_chunked_prefill_sums_full_chunks_and_remainder() -> None:
    law = prefill_law
    assert chunked_prefill_time_s(20_000, chunk_tokens=8192, wall_time=law) == pytest.approx(
        2 * law(8192) + law(20_000 - 2 * 8192)
    )
    assert chunked_prefill_time_s(0, chunk_tokens=8192, wall_time=law) == 0.0
    # an average like 8192.3 tokens needs a second (one-token) chunk, never a 0.3-token one
    assert chunked_prefill_time_s(8192.3, chunk_tokens=8192, wall_time=law) == pytest.approx(
        law(8192) + law(1)
    )
    with pytest.raises(ValueError, match="chunk_tokens > 0"):
        chunked_prefill_time_s(10, chunk_tokens=0, wall_time=law)


def test_prefill_ttft_simulates_queue_plus_own_prompt() -> None:
    model = _prefill_model(isl=3000)
    isl = model.averages().isl
    assert isl is not None
    report = fpm(
        counter=5000,
        wall=0.05,
        prefill_reqs=1,
        prefill_tokens=3000,
        queued_prefill_reqs=5,
        queued_prefill_tokens=15_000,
    )
    total = 15_000 + isl
    expected = 1000 * (2 * prefill_law(8192) + prefill_law(math.ceil(total) - 2 * 8192))
    assert prefill_ttft_ms(model, report, limits=LIMITS) == pytest.approx(expected, rel=1e-6)
    # own prompt only (queue_scale=0), and the consolidated queue (queue_scale=2)
    own = prefill_ttft_ms(model, report, limits=LIMITS, queue_scale=0.0)
    assert own == pytest.approx(1000 * prefill_law(math.ceil(isl)), rel=1e-6)
    doubled = prefill_ttft_ms(model, report, limits=LIMITS, queue_scale=2.0)
    assert doubled is not None and doubled > expected


def test_kv_hit_rate_discount_is_clamped_and_unknown_means_none() -> None:
    model = _prefill_model()
    report = fpm(counter=5000, queued_prefill_tokens=10_000)
    full = prefill_ttft_ms(model, report, limits=LIMITS)
    half = prefill_ttft_ms(model, report, limits=LIMITS, kv_hit_rate=0.5)
    assert full is not None and half is not None and half < full
    assert prefill_ttft_ms(model, report, limits=LIMITS, kv_hit_rate=1.7) == 0.0
    assert prefill_ttft_ms(model, report, limits=LIMITS, kv_hit_rate=-1.0) == full
    assert prefill_ttft_ms(model, report, limits=LIMITS, kv_hit_rate=float("nan")) == full


def test_estimates_are_none_until_the_model_is_ready() -> None:
    report = fpm(queued_prefill_tokens=10_000)
    assert prefill_ttft_ms(PrefillModel(), report, limits=LIMITS) is None
    assert decode_itl_ms(DecodeModel(), report) is None
    assert agg_ttft_ms(AggModel(), report, limits=LIMITS) is None
    assert agg_itl_ms(AggModel(), report, limits=LIMITS) is None


def test_decode_itl_adds_one_request_of_average_context() -> None:
    model = _decode_model(context=2000)
    context = model.averages().decode_context
    assert context is not None and context == pytest.approx(2000, rel=0.01)
    report = fpm(
        counter=5000,
        wall=0.03,
        decode_reqs=40,
        decode_kv=80_000,
        queued_decode_reqs=2,
        queued_decode_kv=5000,
    )
    expected = 1000 * decode_law(40 + 2 + 1, 80_000 + 5000 + context)
    assert decode_itl_ms(model, report) == pytest.approx(expected, rel=1e-6)
    consolidated = 1000 * decode_law(2 * 42 + 1, 2 * 85_000 + context)
    assert decode_itl_ms(model, report, decode_scale=2.0) == pytest.approx(consolidated, rel=1e-6)
    assert decode_itl_ms(model, report, accept_length=2.0) == pytest.approx(expected / 2, rel=1e-6)
    with pytest.raises(ValueError, match="decode_scale"):
        decode_itl_ms(model, report, decode_scale=float("nan"))


def _agg_model() -> AggModel:
    model = AggModel()
    counter = 1000
    for prefill in (0, 1024, 4096, 8000):
        for num in (4, 32, 96):
            kv = num * 1500
            model.observe(
                fpm(
                    counter=counter,
                    wall=agg_law(prefill, kv),
                    prefill_reqs=1 if prefill else 0,
                    prefill_tokens=prefill,
                    decode_reqs=num,
                    decode_kv=kv,
                )
            )
            counter += 1
    return model


def test_agg_estimates_use_the_engines_time_averages() -> None:
    model = _agg_model()
    # the engine alternates a prefill chunk iteration with a pure decode iteration
    engine = "agg-0"
    for i in range(32):
        chunk = 6000 if i % 2 == 0 else 0
        model.observe(
            fpm(
                worker=engine,
                counter=3000 + i,
                wall=agg_law(chunk, 30 * 1500),
                prefill_reqs=2 if chunk else 0,
                prefill_tokens=chunk,
                decode_reqs=30,
                decode_kv=30 * 1500,
                queued_prefill_tokens=8000,
            )
        )
    latest = fpm(
        worker=engine,
        counter=4000,
        wall=agg_law(0, 30 * 1500),
        decode_reqs=30,
        decode_kv=30 * 1500,
        queued_prefill_tokens=8000,
    )
    averages = model.averages((engine, 0))
    assert averages.prefill_tokens_per_iteration == 3000  # not the latest iteration's 0
    isl = averages.isl
    assert isl == 3000
    budget = 8192 - 30
    total = 8000 + isl  # two chunks: the budget left after 30 decode tokens, then the rest
    expected_ttft = 1000 * (agg_law(budget, 45_000) + agg_law(total - budget, 45_000))
    assert agg_ttft_ms(model, latest, limits=LIMITS) == pytest.approx(expected_ttft, rel=1e-6)
    context = averages.decode_context
    assert context is not None and context == 1500
    expected_itl = 1000 * agg_law(3000, 45_000 + 8000 + context)
    assert agg_itl_ms(model, latest, limits=LIMITS) == pytest.approx(expected_itl, rel=1e-6)


def test_agg_estimates_read_an_idle_heartbeat_as_empty_queues() -> None:
    model = _agg_model()
    for i in range(16):  # busy history with a deep queue
        model.observe(
            fpm(
                worker="agg-1",
                counter=3000 + i,
                wall=0.2,
                prefill_reqs=1,
                prefill_tokens=8000,
                decode_reqs=10,
                decode_kv=15_000,
                queued_prefill_tokens=50_000,
            )
        )
    busy = fpm(worker="agg-1", counter=3100, wall=0.2, queued_prefill_tokens=50_000)
    idle = heartbeat(worker="agg-1", counter=3101)
    busy_ttft = agg_ttft_ms(model, busy, limits=LIMITS)
    idle_ttft = agg_ttft_ms(model, idle, limits=LIMITS)
    assert busy_ttft is not None and idle_ttft is not None
    assert idle_ttft < busy_ttft / 5


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens must be >= 1"),
        ({"max_num_seqs": 0}, "max_num_seqs must be >= 1"),
        ({"max_kv_tokens": 0}, "max_kv_tokens must be >= 1 or None"),
    ],
)
def test_engine_limits_validate(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineLimits(**kwargs)
