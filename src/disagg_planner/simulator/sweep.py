"""The profiling sweep in the manner of Dynamo's pre-deployment profiler, against the simulated
engine or a real OpenAI-compatible endpoint, dense enough to cover the SLA range.

- **Prefill**: ``granularity_prefill`` ISLs spaced geometrically from ``min_isl`` to the
  engine's context (the model's, 128k for Llama 3.1), so short prompts, where most traffic
  and the TTFT targets are, get as many samples as long ones; at each, requests with one
  output token are sent one at a time (one per data-parallel rank at once), giving TTFT and
  ``thpt_per_gpu = ISL / TTFT / GPUs-per-rank``.
- **Decode**: ``granularity_decode`` context lengths spaced geometrically from
  ``min_context`` (256) to the engine's context; at each, ``granularity_concurrency``
  concurrencies spaced geometrically from 1 to what keeps the KV cache at
  ``max_kv_usage`` (0.95) -- or less where ``max_num_seqs`` stops it, which the sweep
  reports. A closed loop keeps that many requests in flight; each point records the mean ITL
  of the requests that ran wholly in the steady state, ``context_length = ISL + OSL/2``,
  ``kv_usage = concurrency * context_length / max_kv_tokens`` and
  ``thpt_per_gpu = concurrency / ITL / GPUs``. The OSL is a tenth of the context (or
  ``decode_osl`` if shorter): a request's KV grows to ``ISL + OSL`` while its mean context is
  ``ISL + OSL/2``, so only an OSL short against the context lets the mean KV usage reach 0.95
  without preemption, and one proportional to the context keeps the share of a request's
  life spent in prefill and KV transfer (out of the decode batch) about the same at 256 and
  at 128k tokens.

The result is written in Dynamo's NPZ layout with ``disagg_planner.profiles.write_profile`` plus a
``profile.yaml`` manifest (``source: modelled`` for the simulator, ``measured`` for an
endpoint).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from disagg_planner.profiles import ProfileManifest, write_profile
from disagg_planner.simulator.errors import ProfilingError

DEFAULT_GRANULARITY_PREFILL = 24
DEFAULT_GRANULARITY_DECODE = 16
DEFAULT_GRANULARITY_CONCURRENCY = 20
DEFAULT_MIN_CONTEXT = 256
DEFAULT_MAX_KV_USAGE = 0.95
# The decode OSL is at most this share of the context (see the module doc).
_OSL_SHARE_OF_CONTEXT = 0.1


@dataclass(frozen=True)
class SweepConfig:
    """What to sweep. ``max_context_length`` None: the engine's context."""

    granularity_prefill: int = DEFAULT_GRANULARITY_PREFILL
    granularity_decode: int = DEFAULT_GRANULARITY_DECODE
    granularity_concurrency: int = DEFAULT_GRANULARITY_CONCURRENCY
    max_context_length: int | None = None
    min_isl: int = 100
    min_context: int = DEFAULT_MIN_CONTEXT
    max_kv_usage: float = DEFAULT_MAX_KV_USAGE
    decode_osl: int | None = None
    decode_rounds: float = 2.0  # measured requests per concurrency slot, after one warm-up wave

    def __post_init__(self) -> None:
        if min(self.granularity_prefill, self.granularity_decode, self.granularity_concurrency) < 2:
            raise ProfilingError(
                f"granularity must be >= 2 (prefill {self.granularity_prefill}, "
                f"decode {self.granularity_decode}, concurrency {self.granularity_concurrency})"
            )
        if self.min_isl < 1 or (self.decode_osl or 2) < 2 or self.min_context < 4:
            raise ProfilingError(
                f"min_isl={self.min_isl} must be >= 1, decode_osl={self.decode_osl} >= 2 and "
                f"min_context={self.min_context} >= 4"
            )
        if not 0.0 < self.max_kv_usage <= 1.0:
            raise ProfilingError(f"max_kv_usage={self.max_kv_usage} must be in (0, 1]")
        if self.decode_rounds <= 0:
            raise ProfilingError("decode_rounds must be > 0")

    def decode_osl_at(self, context: float) -> int:
        """Output length of the decode requests at ``context`` (see the module doc)."""
        share = round(_OSL_SHARE_OF_CONTEXT * context)
        return max(2, share if self.decode_osl is None else min(self.decode_osl, share))


@dataclass(frozen=True)
class SweepResult:
    """The measured points, in the units of Dynamo's NPZ files."""

    prefill_isl: list[float]
    prefill_ttft_ms: list[float]
    prefill_thpt_per_gpu: list[float]
    decode_kv_usage: list[float]
    decode_context_length: list[float]
    decode_itl_ms: list[float]
    decode_thpt_per_gpu: list[float]
    max_kv_tokens: int
    details: dict[str, Any] = field(default_factory=dict)

    def write(self, directory: str | Path, *, manifest: ProfileManifest | None) -> Path:
        return write_profile(
            directory,
            prefill_isl=self.prefill_isl,
            prefill_ttft_ms=self.prefill_ttft_ms,
            prefill_thpt_per_gpu=self.prefill_thpt_per_gpu,
            decode_kv_usage=self.decode_kv_usage,
            decode_context_length=self.decode_context_length,
            decode_itl_ms=self.decode_itl_ms,
            decode_thpt_per_gpu=self.decode_thpt_per_gpu,
            max_kv_tokens=self.max_kv_tokens,
            manifest=manifest,
        )


@dataclass(frozen=True)
class DecodeMeasurement:
    """One decode point: the mean ITL and how many requests were decoding on average.

    ``running`` is below the closed loop's concurrency by the requests between two decode
    phases (in prefill or KV transfer); a target that cannot see it reports the concurrency.
    """

    itl_ms: float
    running: float
    # Requests preempted (KV recomputed) while it was measured: such a point times recompute
    # passes, not a steady batch, and the sweep leaves it out. 0 where a target cannot see it.
    preemptions: int = 0


class SweepTarget(Protocol):
    """An engine to profile."""

    gpus: int  # GPUs of one engine
    dp: int  # data-parallel ranks (requests sent at once for a prefill point)
    max_kv_tokens: int  # whole engine
    max_context: int
    max_num_seqs: int | None  # whole engine

    def prefill_ttft_ms(self, isl: int, *, concurrent: int) -> float:
        """Mean TTFT of ``concurrent`` simultaneous requests of ``isl`` tokens, one output."""

    def decode_point(
        self, isl: int, osl: int, *, concurrency: int, measured: int
    ) -> DecodeMeasurement:
        """Mean ITL while ``concurrency`` requests stay in flight (closed loop)."""


def _geometric_grid(lo: int, hi: int, n: int) -> list[int]:
    """About ``n`` distinct integers from ``lo`` to ``hi`` (both included), evenly spaced on a
    log scale; where rounding would repeat an integer the next one is taken instead."""
    if hi <= lo:
        return [lo]
    out: list[int] = []
    for x in np.geomspace(lo, hi, n):
        v = max(round(float(x)), out[-1] + 1 if out else lo)
        if v <= hi:
            out.append(v)
    if out[-1] != hi:
        out.append(hi)
    return out


def run_sweep(
    target: SweepTarget,
    config: SweepConfig,
    *,
    progress: Callable[[str], None] | None = None,
) -> SweepResult:
    """Sweep ``target`` (see the module doc)."""
    say = progress or (lambda _msg: None)
    max_ctx = min(config.max_context_length or target.max_context, target.max_context)
    if max_ctx <= max(config.min_isl, config.min_context):
        raise ProfilingError(
            f"max context {max_ctx} must exceed min_isl {config.min_isl} and min_context "
            f"{config.min_context}"
        )
    per_rank_gpus = target.gpus / target.dp
    p_isl, p_ttft, p_thpt = [], [], []
    for isl in _geometric_grid(config.min_isl, max_ctx - 1, config.granularity_prefill):
        ttft = target.prefill_ttft_ms(isl, concurrent=target.dp)
        p_isl.append(float(isl))
        p_ttft.append(ttft)
        p_thpt.append(isl / (ttft / 1000.0) / per_rank_gpus)
        say(f"prefill ISL {isl}: TTFT {ttft:.1f} ms")
    d_kv, d_ctx, d_itl, d_thpt = [], [], [], []
    cut_by_max_num_seqs: list[str] = []
    top_context = max_ctx - config.decode_osl_at(max_ctx) // 2
    for context_target in _geometric_grid(
        config.min_context, top_context, config.granularity_decode
    ):
        osl = config.decode_osl_at(context_target)
        isl = max(1, min(context_target - osl // 2, max_ctx - osl))
        context = isl + osl / 2.0
        # At most max_kv_usage of the cache by mean context, and never more than the cache
        # holds at the requests' final length (no preemption).
        cap = min(
            int(config.max_kv_usage * target.max_kv_tokens // context),
            int(target.max_kv_tokens // (isl + osl)),
        )
        if target.max_num_seqs is not None and target.max_num_seqs < cap:
            cap = target.max_num_seqs
            cut_by_max_num_seqs.append(
                f"context {context:g} stops at KV usage {cap * context / target.max_kv_tokens:.2f}"
            )
        if cap < 1:
            continue
        for conc in _geometric_grid(1, cap, config.granularity_concurrency):
            measured = max(2, math.ceil(conc * config.decode_rounds))
            point = target.decode_point(isl, osl, concurrency=conc, measured=measured)
            if point.preemptions:
                # The cap keeps the whole cache from overflowing, not each data-parallel
                # rank: a rank holding a few more requests than its share preempts, and the
                # point would time recompute (DeepSeek-V3 DP16 at the top of a row: +5%).
                say(
                    f"decode ISL {isl} OSL {osl} concurrency {conc}: left out, "
                    f"{point.preemptions} preemptions"
                )
                continue
            d_kv.append(min(1.0, point.running * context / target.max_kv_tokens))
            d_ctx.append(context)
            d_itl.append(point.itl_ms)
            d_thpt.append(point.running / (point.itl_ms / 1000.0) / target.gpus)
            say(
                f"decode ISL {isl} OSL {osl} concurrency {conc} ({point.running:.1f} "
                f"decoding): ITL {point.itl_ms:.2f} ms"
            )
    if cut_by_max_num_seqs:
        say(
            f"max_num_seqs {target.max_num_seqs} cuts the decode sweep short of KV usage "
            f"{config.max_kv_usage:g}: " + "; ".join(cut_by_max_num_seqs)
        )
    if len(d_kv) < 3:
        raise ProfilingError(
            f"only {len(d_kv)} decode points fit the KV cache ({target.max_kv_tokens} tokens); "
            "lower --max-context-length"
        )
    return SweepResult(
        prefill_isl=p_isl,
        prefill_ttft_ms=p_ttft,
        prefill_thpt_per_gpu=p_thpt,
        decode_kv_usage=d_kv,
        decode_context_length=d_ctx,
        decode_itl_ms=d_itl,
        decode_thpt_per_gpu=d_thpt,
        max_kv_tokens=int(target.max_kv_tokens),
        details={
            "max_context_length": max_ctx,
            "decode_osl": config.decode_osl,
            "cut_by_max_num_seqs": cut_by_max_num_seqs,
        },
    )


__all__ = [
    "DEFAULT_GRANULARITY_CONCURRENCY",
    "DEFAULT_GRANULARITY_DECODE",
    "DEFAULT_GRANULARITY_PREFILL",
    "DEFAULT_MAX_KV_USAGE",
    "DEFAULT_MIN_CONTEXT",
    "DecodeMeasurement",
    "SweepConfig",
    "SweepResult",
    "SweepTarget",
    "run_sweep",
]
