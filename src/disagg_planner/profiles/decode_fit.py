"""The cost fit a decode profile extrapolates with, outside its samples (see
:mod:`disagg_planner.profiles.decode`).

The fit is the form of a decode step in a roofline engine model: with ``B`` requests of
context ``c`` decoding (``B = kv_usage * max_kv_tokens / c``), ``ITL = t0 + t_seq * B +
t_kv * B * c + t_knee * max(0, B - B_knee)`` -- weights read and step overhead, per-request
work (sampling, activations), attention reading the KV cache, and the GEMM rows once the
batch is past the knee where the GEMMs turn compute-bound -- with non-negative coefficients
fitted by least squares to the samples (the knee chosen among the sampled batches).
Throughput follows from its definition, ``B / ITL / GPUs``, with the GPUs per engine
recovered from the samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from disagg_planner.profiles.storage import DecodeData, FloatArray

__all__ = ["DecodeCostFit"]


@dataclass(frozen=True)
class DecodeCostFit:
    """``ITL_ms = base_ms + per_seq_ms * B + per_kv_token_ms * B * context
    + per_seq_above_knee_ms * max(0, B - knee_batch)`` fitted to the samples, and ``gpus``
    with ``thpt_per_gpu = B / ITL / gpus`` (see the module doc). The knee is where the GEMMs
    turn from reading the weights (memory-bound, flat in ``B``) to compute-bound (each request
    adds its rows); it is chosen among the sampled batches by the least residual, 0 when no
    knee fits better."""

    base_ms: float
    per_seq_ms: float
    per_kv_token_ms: float
    gpus: float
    max_kv_tokens: int
    knee_batch: float = 0.0
    per_seq_above_knee_ms: float = 0.0

    @classmethod
    def of(cls, data: DecodeData) -> DecodeCostFit:
        batch = data.kv_usage * data.max_kv_tokens / data.context_length
        kv_tokens = data.kv_usage * data.max_kv_tokens
        # Relative least squares: every sample counts alike, short ITLs as much as long.
        weights = 1.0 / data.itl_ms
        target = data.itl_ms * weights
        linear = np.column_stack([np.ones_like(batch), batch, kv_tokens])
        coef, residual = nnls(linear * weights[:, None], target)
        knee, coef = 0.0, np.append(coef, 0.0)
        inner = np.unique(batch)[1:-1]  # a knee at an end is no knee
        for candidate in inner:
            design = np.column_stack([linear, np.maximum(batch - candidate, 0.0)])
            c, r = nnls(design * weights[:, None], target)
            if c[3] > 0 and r < residual * (1 - 1e-9):
                residual, knee, coef = r, float(candidate), c
        gpus = float(np.median(batch * 1000.0 / (data.itl_ms * data.thpt_per_gpu)))
        return cls(
            base_ms=float(coef[0]),
            per_seq_ms=float(coef[1]),
            per_kv_token_ms=float(coef[2]),
            gpus=gpus,
            max_kv_tokens=data.max_kv_tokens,
            knee_batch=knee,
            per_seq_above_knee_ms=float(coef[3]),
        )

    def batch(self, kv_usage: FloatArray, context_length: FloatArray) -> FloatArray:
        return np.asarray(kv_usage * self.max_kv_tokens / context_length, dtype=np.float64)

    def itl_ms(self, kv_usage: FloatArray, context_length: FloatArray) -> FloatArray:
        b = self.batch(kv_usage, context_length)
        return np.asarray(
            self.base_ms
            + self.per_seq_ms * b
            + self.per_kv_token_ms * b * context_length
            + self.per_seq_above_knee_ms * np.maximum(b - self.knee_batch, 0.0),
            dtype=np.float64,
        )

    def thpt_per_gpu(
        self, kv_usage: FloatArray, context_length: FloatArray, itl_ms: FloatArray
    ) -> FloatArray:
        """Throughput per GPU of the batch at that point running at ``itl_ms`` (0 with no
        batch, or where a fit without a base cost gives no time at all)."""
        tokens_per_s = self.batch(kv_usage, context_length) * 1000.0
        steps = np.asarray(itl_ms * self.gpus, dtype=np.float64)
        tokens_per_s, steps = np.broadcast_arrays(tokens_per_s, steps)
        out = np.zeros(steps.shape)
        np.divide(tokens_per_s, steps, out=out, where=steps > 0)
        return out
