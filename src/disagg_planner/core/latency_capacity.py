"""The prefill capacity correction the frontend's mean TTFT says, where no engine reports a
busy fraction (the load loop off, the default): the ``c`` (work per token over the
profile's) for which the profile's mean TTFT at the observed load equals the observed one,

    T(c) = c S + rho / (1 - rho) x (1 + cs2) / 2 x c S,   rho = c x offered / ready

(the prompt's own prefill ``S`` at ``c`` times the profile's work, plus Kingman's mean wait
for Poisson arrivals, ``cs2`` the prompts' variability), found by bisection within
:data:`disagg_planner.core.feedback.CORRECTION_BOUNDS`. Two readings, by the load the
profile predicts per ready engine:

- :func:`latency_capacity_estimate`, at light load (up to
  :data:`MAX_LATENCY_LEARN_UTILISATION`): ``T ~= c S``, the engine's own speed, never
  below 1;
- :func:`loaded_capacity_estimate`, above it, while the tail is calm: the wait dominates,
  and a mean TTFT well under what the profile's queue predicts says the engines carry more
  than profiled, below 1 only.

No I/O, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from disagg_planner.core.feedback import CORRECTION_BOUNDS

# Above this predicted utilisation (per ready engine, at the profile) the mean TTFT is mostly
# queueing, whose model is least right near saturation (a batching engine serves a queue
# faster than one prompt at a time): the light-load estimate learns below it only, the
# loaded one above it.
MAX_LATENCY_LEARN_UTILISATION = 0.5


@dataclass(frozen=True)
class TtftReading:
    """One window's mean TTFT against the profile: ``ttft_ms`` observed, ``own_ms`` the
    prompt's own prefill at the profile (``S``), ``offered_engines`` the load in engines'
    worth of profiled work, ``ready`` prefill engines, ``service_scv`` the prompts' work
    variability, and ``first_token_ms``, what the first token costs after the prefill (a
    disaggregated deployment's first decode step, which the frontend's TTFT includes)."""

    ttft_ms: float | None
    own_ms: float
    offered_engines: float
    ready: int
    service_scv: float = 1.0
    first_token_ms: float = 0.0

    @property
    def per_engine(self) -> float | None:
        """The profiled work per ready engine; None where nothing can be read (no TTFT, no
        load, no ready engine, no profiled prefill)."""
        if (
            self.ttft_ms is None
            or self.ttft_ms <= 0
            or self.own_ms <= 0
            or self.ready <= 0
            or self.offered_engines <= 0
        ):
            return None
        return self.offered_engines / self.ready

    @property
    def prefill_ms(self) -> float:
        """The observed mean TTFT less the first token's cost (0 without a TTFT)."""
        return (self.ttft_ms or 0.0) - max(0.0, self.first_token_ms)


def latency_capacity_estimate(reading: TtftReading) -> float | None:
    """The capacity correction the mean TTFT says at light load (the module's ``T(c)``).
    None where nothing can be read, or above :data:`MAX_LATENCY_LEARN_UTILISATION`
    predicted (there the wait, not the engine, makes the TTFT:
    :func:`loaded_capacity_estimate`). Never below 1: a TTFT under the profile's at low load
    says one prompt prefills faster, not that an engine carries more load (the mean over
    mixed prompt lengths errs by some 15 % either way).

    At low load ``T ~= c S``: an engine twice as slow as profiled shows twice the TTFT,
    long before any burst shows it as a breach."""
    per_engine = reading.per_engine
    if per_engine is None or per_engine > MAX_LATENCY_LEARN_UTILISATION:
        return None
    lo, hi = CORRECTION_BOUNDS
    return max(
        1.0,
        _solve(reading.prefill_ms, reading.own_ms, per_engine, reading.service_scv, lo, hi),
    )


def loaded_capacity_estimate(reading: TtftReading) -> float | None:
    """The capacity correction the mean TTFT says above :data:`MAX_LATENCY_LEARN_UTILISATION`
    predicted per engine, where the profile's queue predicts more than the observed mean
    (``T(1) > ttft``): the ``c`` below 1 of the module's ``T(c)``, down to
    :data:`disagg_planner.core.feedback.CORRECTION_BOUNDS`'s floor. None at light load,
    where nothing can be read, where the observation shows no less than the profile
    predicts (a TTFT over it at load is the queue's, which the breach rules answer), or no
    wait at all beyond the prompt's own prefill ``S``: the estimate reads the queue, and a
    mean at or under ``S`` shows none to read (one prompt prefilling faster than profiled,
    which the light-load rule does not believe either).

    The profile's throughput is a lone prompt's; an engine that batches the prompts waiting
    at an iteration pays its fixed cost once for all of them, so under load it serves more
    than that, most of all for short prompts (ServeGen's 700-token mix: the profile's
    39k tok/s at ISL 676 against 58k at its 8192-token chunk). The caller believes it only
    while the tail is calm (under the scale-down margin), as the busy fraction's."""
    per_engine = reading.per_engine
    if per_engine is None or per_engine <= MAX_LATENCY_LEARN_UTILISATION:
        return None
    seen, own, scv = reading.prefill_ms, reading.own_ms, reading.service_scv
    if seen <= own or _mean_ttft(1.0, own, per_engine, scv) <= seen:
        return None
    return _solve(seen, own, per_engine, scv, CORRECTION_BOUNDS[0], 1.0)


def _mean_ttft(c: float, own_ms: float, per_engine: float, service_scv: float) -> float:
    """The module's ``T(c)``."""
    rho = c * per_engine
    if rho >= 1.0:
        return math.inf
    spread = (1.0 + max(0.0, service_scv)) / 2.0
    return c * own_ms * (1.0 + rho / (1.0 - rho) * spread)


def _solve(
    ttft_ms: float, own_ms: float, per_engine: float, service_scv: float, lo: float, hi: float
) -> float:
    """The ``c`` in ``[lo, hi]`` with ``T(c) = ttft_ms`` (T rises with c: bisection), or the
    bound it lies beyond."""
    hi = min(hi, 0.999 / per_engine)
    if hi <= lo:  # the profile's work alone at lo saturates the engines
        return lo
    if _mean_ttft(lo, own_ms, per_engine, service_scv) >= ttft_ms:
        return lo
    if _mean_ttft(hi, own_ms, per_engine, service_scv) <= ttft_ms:
        return hi
    for _ in range(50):
        mid = (lo + hi) / 2
        below = _mean_ttft(mid, own_ms, per_engine, service_scv) < ttft_ms
        lo, hi = (mid, hi) if below else (lo, mid)
    return (lo + hi) / 2
