"""A small analytic engine used to make profiles with known answers for the tests.

Prefill: TTFT grows quadratically with ISL (attention), ``ttft = a + b*isl + c*isl^2`` ms, on
one GPU, so throughput per GPU is ``isl / ttft * 1000``.

Decode: one iteration takes ``itl = base + per_kv * kv_tokens + per_seq * concurrency`` ms,
``kv_tokens = concurrency * context``; throughput is ``concurrency / itl * 1000`` tokens/s on
one GPU. The sampled points follow Dynamo's profiler: for each context length, a sweep of
concurrency from 1 up to what fits in the KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAX_KV_TOKENS = 200_000
PREFILL_ISL = np.array([100.0, 500.0, 1000.0, 2000.0, 4000.0, 8000.0, 16000.0])
DECODE_CONTEXTS = (512.0, 1024.0, 2048.0, 4096.0, 8192.0, 12288.0, 16384.0)


@dataclass(frozen=True)
class Engine:
    ttft_base_ms: float = 8.0
    ttft_per_token_ms: float = 0.022
    ttft_quadratic_ms: float = 1e-6
    itl_base_ms: float = 6.0
    itl_per_kv_token_ms: float = 3e-5
    itl_per_seq_ms: float = 0.02
    max_kv_tokens: int = MAX_KV_TOKENS

    def ttft_ms(self, isl: np.ndarray) -> np.ndarray:
        return self.ttft_base_ms + self.ttft_per_token_ms * isl + self.ttft_quadratic_ms * isl**2

    def prefill_thpt(self, isl: np.ndarray) -> np.ndarray:
        return isl / self.ttft_ms(isl) * 1000

    def decode_itl_ms(self, kv_usage: np.ndarray, context: np.ndarray) -> np.ndarray:
        concurrency = kv_usage * self.max_kv_tokens / context
        return (
            self.itl_base_ms
            + self.itl_per_kv_token_ms * kv_usage * self.max_kv_tokens
            + self.itl_per_seq_ms * concurrency
        )

    def decode_thpt(self, kv_usage: np.ndarray, context: np.ndarray) -> np.ndarray:
        concurrency = kv_usage * self.max_kv_tokens / context
        return concurrency / self.decode_itl_ms(kv_usage, context) * 1000

    def best_decode_thpt(self, itl_target_ms: float, context: float) -> float:
        """True best throughput at an ITL target: the largest concurrency meeting it,
        capped by the KV cache."""
        per_seq = self.itl_per_kv_token_ms * context + self.itl_per_seq_ms
        concurrency = min(
            (itl_target_ms - self.itl_base_ms) / per_seq, self.max_kv_tokens / context
        )
        itl = self.itl_base_ms + per_seq * concurrency
        return concurrency / itl * 1000

    def decode_samples(
        self, contexts: tuple[float, ...] = DECODE_CONTEXTS, per_context: int = 8
    ) -> tuple[np.ndarray, np.ndarray]:
        kv, ctx = [], []
        for c in contexts:
            for n in np.unique(np.round(np.linspace(1, self.max_kv_tokens // c, per_context))):
                kv.append(n * c / self.max_kv_tokens)
                ctx.append(c)
        return np.array(kv), np.array(ctx)

    def arrays(self) -> dict[str, np.ndarray]:
        """The profile in Dynamo's key names, prefill and decode together."""
        kv, ctx = self.decode_samples()
        return {
            "prefill_isl": PREFILL_ISL,
            "prefill_ttft": self.ttft_ms(PREFILL_ISL),
            "prefill_thpt_per_gpu": self.prefill_thpt(PREFILL_ISL),
            "x_kv_usage": kv,
            "y_context_length": ctx,
            "z_itl": self.decode_itl_ms(kv, ctx),
            "z_thpt_per_gpu": self.decode_thpt(kv, ctx),
            "max_kv_tokens": np.array([self.max_kv_tokens]),
        }


PREFILL_NPZ_KEYS = ("prefill_isl", "prefill_ttft", "prefill_thpt_per_gpu")
DECODE_NPZ_KEYS = ("x_kv_usage", "y_context_length", "z_itl", "z_thpt_per_gpu", "max_kv_tokens")


def write_dynamo_layout(directory: Path, arrays: dict[str, np.ndarray]) -> Path:
    """Write ``arrays`` the way Dynamo's profiler does, with plain ``np.savez`` (independent
    of the library's writer, so a reader test does not just read back its own writer)."""
    prefill = directory / "selected_prefill_interpolation"
    decode = directory / "selected_decode_interpolation"
    prefill.mkdir(parents=True, exist_ok=True)
    decode.mkdir(parents=True, exist_ok=True)
    # numpy's stubs: a ** dict of arrays could fill savez's ``allow_pickle: bool`` as well.
    prefill_arrays = {k: arrays[k] for k in PREFILL_NPZ_KEYS if k in arrays}
    decode_arrays = {k: arrays[k] for k in DECODE_NPZ_KEYS if k in arrays}
    np.savez(prefill / "raw_data.npz", **prefill_arrays)  # type: ignore[arg-type]
    np.savez(decode / "raw_data.npz", **decode_arrays)  # type: ignore[arg-type]
    return directory
