"""A synthetic profile in Dynamo's NPZ layout, shaped like H200 TP1 Llama-3.1-8B-FP8 data:
about 40,000 prefill tokens/s/GPU at ISL 3000 (TTFT ~80 ms) and decode whose ITL grows with
the KV cache in use."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from disagg_planner.profiles import Profile, load_profile, write_profile

MAX_KV_TOKENS = 400_000


def write_h200_like_profile(directory: Path) -> Path:
    isl = np.array([128, 512, 1024, 2048, 3000, 4096, 8192, 16384], dtype=float)
    thpt = np.array([20000, 32000, 37000, 39500, 40000, 39000, 35000, 28000], dtype=float)
    ttft = isl / thpt * 1000.0 + 5.0
    kv, ctx = np.meshgrid(
        np.linspace(0.05, 1.0, 12), np.array([500, 1000, 2000, 3500, 6000, 12000, 16000])
    )
    kv, ctx = kv.ravel(), ctx.ravel()
    batch = kv * MAX_KV_TOKENS / ctx
    itl = 4.0 + 0.02 * batch + 25.0 * kv  # ms: per-request cost plus KV reads
    decode_thpt = batch / (itl / 1000.0)
    return write_profile(
        directory,
        prefill_isl=isl,
        prefill_ttft_ms=ttft,
        prefill_thpt_per_gpu=thpt,
        decode_kv_usage=kv,
        decode_context_length=ctx,
        decode_itl_ms=itl,
        decode_thpt_per_gpu=decode_thpt,
        max_kv_tokens=MAX_KV_TOKENS,
    )


@pytest.fixture(scope="session")
def h200_like_profile(tmp_path_factory: pytest.TempPathFactory) -> Profile:
    return load_profile(write_h200_like_profile(tmp_path_factory.mktemp("profile")))
