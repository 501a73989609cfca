"""The fluid bound: the fewest GPU-hours any policy could serve a trace's requests on (the
physical floor :mod:`disagg_planner.replay.bounds` compares a replay with, and what sizes the
initial replicas' sanity check)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from disagg_planner.profiles import Profile
from disagg_planner.simulator.request import RequestLike


def fluid_bound_gpu_hours(
    requests: Sequence[RequestLike],
    profile: Profile,
    *,
    ttft_ms: float = math.inf,
    itl_ms: float = math.inf,
) -> float:
    """GPU-hours of serving every request at the profile's best throughput per GPU.

    Without targets (the default, ``math.inf``) this is the physical floor: the saturated
    engine's throughput, which a policy that lets latency grow can reach and one holding the
    SLO cannot pass. With targets it is the best throughput meeting them (what serving under
    the SLO takes at least, for sizing).

    Prefill: a prompt of ``l`` tokens at the profiled tokens/s/GPU of its own length, or,
    when higher, of any profiled length from ``l`` up to ``max_num_batched_tokens`` whose
    TTFT meets the target (short prompts are batched together, and a batch of prompts costs
    at most what one prompt of their total length does). Decode: ``o`` output tokens at the
    highest tokens/s/GPU meeting the ITL target at the request's mean context ``l + o/2``
    (the lowest-ITL point's where none does). Lengths outside the profile take its edge
    values, which only lowers the bound for longer ones (their throughput falls with length).
    Requests the engines refuse on arrival cost nothing: pass only those they admit
    (:func:`admitted`).
    """
    if not requests:
        return 0.0
    isl = np.fromiter((r.input_length for r in requests), dtype=np.float64, count=len(requests))
    osl = np.fromiter(
        (max(1, r.output_length) for r in requests), dtype=np.float64, count=len(requests)
    )
    prefill_s = float(np.sum(isl / _best_prefill_thpt(profile, isl, ttft_ms)))
    contexts, where = np.unique(isl + osl / 2.0, return_inverse=True)
    best = profile.decode.find_best_many(itl_ms, contexts)
    thpt = np.where(best.feasible, best.thpt_per_gpu, best.lowest_itl_thpt_per_gpu)
    decode_s = float(np.sum(osl / thpt[where]))
    return (prefill_s + decode_s) / 3600.0


def _best_prefill_thpt(profile: Profile, isl: np.ndarray, ttft_ms: float) -> np.ndarray:
    own = profile.prefill.thpt_per_gpu_many(isl)
    manifest = profile.manifest
    budget = manifest.prefill_engine.max_num_batched_tokens if manifest is not None else None
    if budget is None:
        return own
    grid = np.unique(np.append(profile.prefill.data.isl, float(budget)))
    grid = grid[grid <= budget]
    thpt = np.where(profile.prefill.ttft_ms_many(grid) <= ttft_ms, 0.0, -np.inf)
    thpt = thpt + profile.prefill.thpt_per_gpu_many(grid)
    # the best over every grid length >= l: a running maximum from the long end
    from_here = np.maximum.accumulate(thpt[::-1])[::-1]
    i = np.searchsorted(grid, isl, side="left")
    batched = np.where(i < grid.size, from_here[np.minimum(i, grid.size - 1)], -np.inf)
    return np.maximum(own, batched)
