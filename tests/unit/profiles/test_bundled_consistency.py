"""Every bundled profile agrees with the engine model it was swept from, within 5% wherever the
planner uses it (the SLA range: TTFT <= 2 s, ITL <= 50 ms): at its samples, between them (what
the interpolation adds), and in the answer the planner sizes from (the best throughput under an
ITL target). A profile left stale by a change to the engine model fails here; regenerate it
with the command in its ``profile.yaml``."""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np
import pytest

from disagg_planner.profiles import Profile, list_bundled, load_profile, resolve_profile
from disagg_planner.simulator.engine_model import EngineModel
from disagg_planner.simulator.engines import engine_for

SLA_TTFT_MS = 2000.0
SLA_ITL_MS = 50.0
TOLERANCE = 0.05
ITL_TARGETS_MS = (8.0, 10.0, 20.0, 35.0, 50.0)

BUNDLED = [name for name, _manifest in list_bundled()]


def test_every_bundled_profile_is_checked() -> None:
    assert len(BUNDLED) >= 4


@pytest.fixture(scope="module", params=BUNDLED)
def bundled(request: pytest.FixtureRequest) -> tuple[Profile, EngineModel]:
    profile = load_profile(resolve_profile(request.param))
    assert profile.manifest is not None and profile.manifest.source == "modelled"
    spec = profile.manifest.extra.get("engine_spec")
    assert isinstance(spec, str), f"{request.param}: profile.yaml records no engine_spec"
    return profile, engine_for(spec)


def engine_ttft_ms(model: EngineModel, isl: float) -> float:
    """What the simulator serves to one request on an idle engine: prefill plus the
    frontend's fixed overhead."""
    return 1000.0 * (model.prefill_time_s(round(isl)) + model.eff.ttft_overhead_s)


def engine_itl_ms(model: EngineModel, running: float, context: float) -> float:
    """Step time with ``running`` requests (the engine's total, a mean: linear between the
    whole batches around it) of ``context`` tokens each, per data-parallel rank."""
    per_rank = running / model.spec.dp
    lo = max(1, math.floor(per_rank))
    hi = max(lo, math.ceil(per_rank))
    t_lo = model.decode_step_time_s(lo, context)
    t_hi = model.decode_step_time_s(hi, context)
    w = 0.0 if hi == lo else (per_rank - lo) / (hi - lo)
    return 1000.0 * (t_lo * (1 - w) + t_hi * w)


def engine_best_thpt(model: EngineModel, itl_ms: float, context: float, kv_tokens: int) -> float:
    """The engine's best tokens/s/GPU with ITL <= target: the largest mean running batch
    (at least one request) meeting it, no more than the KV cache holds up to the sweep's
    KV-usage ceiling or max_num_seqs allows. A steady state's batch is a mean, so it is not
    rounded to whole requests (at a few long requests that alone is several percent)."""
    cap = min(kv_tokens / context, model.spec.max_num_seqs * model.spec.dp)
    if cap < 1 or engine_itl_ms(model, 1.0, context) > itl_ms:
        return 0.0
    lo, hi = 1.0, cap
    if engine_itl_ms(model, hi, context) <= itl_ms:
        lo = hi
    for _ in range(60):  # the step time rises with the batch
        mid = (lo + hi) / 2
        if engine_itl_ms(model, mid, context) <= itl_ms:
            lo = mid
        else:
            hi = mid
    return lo / (engine_itl_ms(model, lo, context) / 1000.0) / model.spec.gpus


def test_prefill_matches_the_engine_at_and_between_samples(
    bundled: tuple[Profile, EngineModel],
) -> None:
    profile, model = bundled
    isl = profile.prefill.data.isl
    between = np.sqrt(isl[:-1] * isl[1:])  # samples are spaced geometrically
    per_rank_gpus = model.spec.gpus / model.spec.dp
    checked = 0
    for x in np.concatenate([isl, between]):
        truth = engine_ttft_ms(model, x)
        if truth > SLA_TTFT_MS:
            continue
        point = profile.prefill.lookup(float(x))
        assert not point.extrapolated
        assert point.ttft_ms == pytest.approx(truth, rel=TOLERANCE), f"ISL {x:g}"
        thpt = round(x) / (truth / 1000.0) / per_rank_gpus
        assert point.thpt_per_gpu == pytest.approx(thpt, rel=TOLERANCE), f"ISL {x:g}"
        checked += 1
    assert checked >= 10


def test_decode_matches_the_engine_at_and_between_samples(
    bundled: tuple[Profile, EngineModel],
) -> None:
    profile, model = bundled
    dec = profile.decode
    d = dec.data
    k = d.max_kv_tokens
    points = [(float(x), float(c)) for x, c in zip(d.kv_usage, d.context_length, strict=True)]
    contexts = np.unique(d.context_length)
    for c in contexts:  # between KV samples along a row
        kv = np.sort(d.kv_usage[d.context_length == c])
        points += [(float(x), float(c)) for x in (kv[:-1] + kv[1:]) / 2]
    for c0, c1 in pairwise(contexts):  # between rows
        top = min(d.kv_usage[d.context_length == c].max() for c in (c0, c1))
        mid = float(np.sqrt(c0 * c1))
        points += [(float(x), mid) for x in np.geomspace(1.5 * mid / k, top, 8)]
    checked = 0
    for x, c in points:
        running = x * k / c
        truth = engine_itl_ms(model, running, c)
        if truth > SLA_ITL_MS or running < 1:
            continue
        point = dec.lookup(x, c)
        where = f"KV usage {x:.4f}, context {c:g} ({running:.1f} running)"
        assert not point.extrapolated, where
        assert point.itl_ms == pytest.approx(truth, rel=TOLERANCE), where
        thpt = running / (truth / 1000.0) / model.spec.gpus
        assert point.thpt_per_gpu == pytest.approx(thpt, rel=TOLERANCE), where
        checked += 1
    assert checked >= 50


def test_best_decode_throughput_matches_the_engine(bundled: tuple[Profile, EngineModel]) -> None:
    profile, model = bundled
    dec = profile.decode
    contexts = np.unique(dec.data.context_length)
    kv_ceiling = int(dec.data.kv_usage.max() * dec.max_kv_tokens)
    checked = 0
    for c in np.concatenate([contexts, np.sqrt(contexts[:-1] * contexts[1:])]):
        for target in ITL_TARGETS_MS:
            truth = engine_best_thpt(model, target, float(c), kv_ceiling)
            if truth == 0.0:
                continue
            best = dec.find_best_throughput_per_gpu(target, float(c))
            where = f"context {c:g}, ITL <= {target:g} ms"
            assert best.feasible, where
            assert best.thpt_per_gpu == pytest.approx(truth, rel=TOLERANCE), where
            checked += 1
    assert checked >= 20


def test_the_lookup_never_answers_more_requests_than_the_engine_seats() -> None:
    """At a short context the KV cache would hold far more requests than max_num_seqs lets
    run: the sweep stops at the full batch, and the best throughput the planner sizes from
    must stop there too, not extend the surface to a KV usage no batch reaches."""
    from disagg_planner.profiles.decode import DecodeInterpolator

    profile = load_profile(resolve_profile("gb200/vllm/deepseek-v3/tp1-dp16-ep16"))
    decode = profile.decode
    assert decode.max_running == 512 * 16  # max_num_seqs on each of the 16 DP ranks
    seated = decode.find_best_throughput_per_gpu(50.0, 256.0)
    running = seated.kv_usage * decode.max_kv_tokens / 256.0
    assert running <= decode.max_running * (1 + 1e-9)
    unbounded = DecodeInterpolator(decode.data).find_best_throughput_per_gpu(50.0, 256.0)
    assert unbounded.kv_usage * decode.max_kv_tokens / 256.0 > decode.max_running
    assert seated.thpt_per_gpu < unbounded.thpt_per_gpu
    with pytest.raises(ValueError, match="max_running"):
        DecodeInterpolator(decode.data, max_running=0.5)
