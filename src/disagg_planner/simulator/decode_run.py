"""Planned runs of decode-only iterations: many iterations of one engine rank at once.

When a scheduling pass schedules only decodes, admits nothing and preempts nothing, the next
iterations are identical except that every context grows by one token, until a request
finishes, a request arrives or KV runs out. The engine then plans that whole run at once:
iteration times come from one vectorised call (``EngineModel.decode_run_s``), and a later
arrival cuts the run after the iteration in progress (:meth:`DecodeRun.cut_after`). Results
are the same as stepping one iteration at a time.

A run is at most :data:`MAX_RUN` iterations and no longer than the first request's remaining
tokens; when the KV blocks the run would need do not fit, it is cut to the longest run that
fits (:func:`fit_run`).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from disagg_planner.simulator.decode_group import DecodeGroup
from disagg_planner.simulator.iteration import VarSource, variance_of
from disagg_planner.simulator.metrics import ItlSink
from disagg_planner.simulator.request import SimRequest

MAX_RUN = 4096
_EPS = 1e-9


@dataclass(slots=True)
class DecodeRun:
    """A planned run: each iteration's duration and end time (plain lists: a run is a few
    iterations long, and bisect on a list beats numpy's per-call overhead), how many are
    accounted (``done``), the decode contexts' sum at its first iteration ``k0`` and what
    their variance comes from (``ctx``; every iteration adds one token to each context, so
    the variance is the whole run's, computed once)."""

    ends: list[float]
    durs: list[float]
    start: float
    k0: int
    ctx: VarSource
    done: int = 0
    var: float | None = None

    @classmethod
    def planned(cls, now: float, durs: list[float], k0: int, ctx: VarSource) -> DecodeRun:
        # ``now + cumsum(durs)``: numpy's cumsum adds in order, as this loop does.
        ends = []
        elapsed = 0.0
        for d in durs:
            elapsed += d
            ends.append(now + elapsed)
        return cls(ends, durs, now, k0, ctx)

    def decode_var(self) -> float:
        if self.var is None:
            self.var = variance_of(self.ctx)
        return self.var

    def cut_after(self, now: float) -> float | None:
        """End the run after the iteration in progress at ``now``: its end, or None when
        that iteration was already the last."""
        ends = self.ends
        j = max(bisect_left(ends, now), self.done)
        if j + 1 < len(ends):
            self.ends = ends[: j + 1]
            self.durs = self.durs[: j + 1]
            return ends[j]
        return None

    def ended_by(self, now: float) -> int:
        """How many iterations of the run have ended by ``now``."""
        return bisect_right(self.ends, now)


def fit_run(k: int, extra_blocks: Callable[[int], int], free: int) -> int:
    """The longest run of at most ``k`` steps whose KV blocks fit in ``free``."""
    if extra_blocks(k) <= free:
        return k
    lo, hi = 1, k  # extra_blocks(1) == 0: step 1 is already allocated
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if extra_blocks(mid) <= free:
            lo = mid
        else:
            hi = mid - 1
    return lo


def grouped_run_length(group: DecodeGroup, *, free: int, block_size: int) -> int:
    """Iterations of a run of the decode group's members, ``free`` KV blocks left."""
    b = group.n
    bs = block_size
    k = max(min(group.first_finish() - group.epoch, MAX_RUN), 1)
    # Step ``s`` of the run needs ceil((c + s - 1) / bs) blocks per member and the pass
    # allocated ceil(c / bs), so k steps need at most ceil((k - 1) / bs) more each: when
    # that fits, KV does not cut the run and the exact count is not needed.
    if b * -(-(k - 1) // bs) > free:
        held = group.blocks_at(group.epoch)

        def extra_blocks(steps: int) -> int:
            return group.blocks_at(group.epoch + steps - 1) - held

        k = fit_run(k, extra_blocks, free)
    return k


def stepped_run_length(
    running: list[SimRequest], contexts: list[int], *, free: int, block_size: int
) -> int:
    """Iterations of a run of ``running`` (whose previous tokens came at different times,
    so no decode group), each at its context in ``contexts``, ``free`` KV blocks left."""
    b = len(running)
    bs = block_size
    k = min(min([r.target - r.generated for r in running]), MAX_RUN)
    k = max(k, 1)
    if b * -(-(k - 1) // bs) > free:  # the bound of ``grouped_run_length``
        ctx_arr = np.asarray(contexts, dtype=np.int64)
        held = int(((ctx_arr + (bs - 1)) // bs).sum())  # == sum of r.blocks

        def extra_blocks(steps: int) -> int:
            return int(((ctx_arr + (steps - 1 + bs - 1)) // bs).sum()) - held

        k = fit_run(k, extra_blocks, free)
    return k


def account_stepped(
    run: DecodeRun,
    running: list[SimRequest],
    *,
    m: int,
    final: bool,
    itl: ItlSink,
    block_size: int,
    free: int,
) -> tuple[list[SimRequest], int]:
    """Per-request accounting of the next ``m`` iterations of ``run`` (no decode group):
    tokens, inter-token gaps, KV blocks. Returns the requests that generated their last
    token and the KV blocks left free."""
    ends, durs, c = run.ends, run.durs, run.done
    seg_start = ends[c - 1] if c else run.start
    first_end = ends[c]
    last_end = ends[c + m - 1]
    bs = block_size
    # Blocks for the next iteration (partial commit) or the last one run (final).
    shift = 1 if final else 0
    done: list[SimRequest] = []
    for req in running:
        last = req.last_token_s
        if last - seg_start > _EPS or seg_start - last > _EPS:
            # This request's previous token came earlier than the run's start (it was
            # starved or just admitted): its first gap is longer than the iteration.
            itl.observe(durs[c], -1)
            itl.observe(first_end - last)
        gen = req.generated + m
        req.generated = gen
        req.last_token_s = last_end
        need = -(-(req.prompt_len + gen - req.gen_base - shift) // bs)
        blocks = req.blocks
        if need > blocks:
            free -= need - blocks
            req.blocks = need
        if gen >= req.target:
            done.append(req)
    return done, free


__all__ = [
    "MAX_RUN",
    "DecodeRun",
    "account_stepped",
    "fit_run",
    "grouped_run_length",
    "stepped_run_length",
]
