"""``auto``: run several predictors in shadow and answer from the ones that have been best lately.

Every candidate sees every value and makes its own one-step forecast each interval. Its
*loss* in an interval is the relative error ``min(1, |actual - forecast| / actual)`` (an
interval with a zero actual scores nothing; the cap keeps one near-empty interval from
deciding); its *score* is the sum of its losses over the last ``window`` scored intervals.

Two ways to answer (``answer``):

- ``"blend"`` (the default): the forecast is the weighted mean of the candidates' forecasts,
  weight ``exp(-sharpness * (score - best score))``. With the default sharpness 10, a
  candidate whose (pooled) relative errors over the window add up to 0.3 more than the
  leader's (one percentage point worse over thirty intervals) keeps ``e^-3``, about 5%, of
  the leader's weight. The weights move a little each interval, so there is nothing to flip
  back and forth, and because the absolute error is convex the blend's error in an interval
  is never above the weighted mean of the candidates' errors. Before anything is scored all
  candidates weigh the same.
- ``"best"``: the forecast of the candidate with the lowest mean loss, changing only when
  another's is lower by more than the ``hysteresis`` fraction and only after ``min_scored``
  intervals have been scored.

The planner forecasts three series of one deployment (request count, mean ISL, mean OSL).
They come from the same traffic, so a candidate that reads this traffic well on one tends to
on the others: the three ``auto`` of a deployment share an :class:`EvidencePool`, and each
adds the other series' loss sums, times ``pool.weight``, to its own. With the default weight
1 the three weigh their candidates alike, from the errors on all three series: on short
histories (the first hour at the default 180 s interval is 20 points) this triples the
evidence the weights rest on, and it is what the planner's config can express anyway (one
``load_predictor`` for the three series).

Why blend by default (``benchmarks/RESULTS.md``: both shared traces at 30, 60 and 180 s,
where the settings were chosen, and at 45, 90, 120 and 240 s, where they were not): against
the best single predictor of each series, the blend is within 5% in 16 of 18 and 17 of 24
backtests (mean ratio 1.022 and 1.024, worst 1.08 and 1.12); answering with the best
candidate does as well where the settings were chosen (1.016) but not elsewhere (1.043,
worst 1.35): the best predictor leads by a few percent and shows it only in hindsight, and
a wrong pick is paid at full price where a blend pays part of it. Against the one predictor
a config can name for the three series, the blend is within 5% on 6 of 6 and 7 of 8
(Azure at 240 s, 13 intervals: 1.079).

The price is running every candidate: the step time is the sum of theirs.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Literal

from disagg_planner.predictors.base import (
    ERROR_WINDOW,
    MIN_ERRORS_FOR_QUANTILE,
    BasePredictor,
    Forecast,
    empirical_quantile,
)

AutoAnswer = Literal["blend", "best"]
# Weights below this share are left out of the forecast's note.
_NOTE_MIN_WEIGHT = 0.05


class EvidencePool:
    """The candidates' losses shared by the ``auto`` predictors of one deployment's series."""

    def __init__(self, weight: float = 1.0) -> None:
        if not (math.isfinite(weight) and weight >= 0.0):
            raise ValueError(f"auto pool weight = {weight!r}: expected a finite number >= 0")
        self.weight = float(weight)
        self.members: list[AutoPredictor] = []
        # bumped on every member's observe: a cached forecast of any member is then stale
        self.version = 0

    def join(self, member: AutoPredictor) -> None:
        if self.members and set(member.candidates) != set(self.members[0].candidates):
            raise ValueError(
                f"auto pool: candidates {sorted(member.candidates)} differ from the pool's "
                f"{sorted(self.members[0].candidates)}"
            )
        self.members.append(member)


def interval_loss(actual: float, error: float) -> float | None:
    """Relative error of one forecast, capped at 1; None when the actual is 0 (unscorable)."""
    if actual <= 0.0:
        return None
    return min(1.0, abs(error) / actual)


class AutoPredictor:
    """Shadow-run candidates; answer with their blend or the best recent one."""

    name = "auto"

    def __init__(
        self,
        candidates: Mapping[str, BasePredictor],
        *,
        answer: AutoAnswer = "blend",
        window: int = 48,
        sharpness: float = 10.0,
        pool: EvidencePool | None = None,
        initial: str | None = None,
        min_scored: int = 4,
        hysteresis: float = 0.05,
        quantile: float | None = None,
    ) -> None:
        if not candidates:
            raise ValueError("auto: expected at least one candidate predictor")
        if answer not in ("blend", "best"):
            raise ValueError(f"auto answer = {answer!r}: expected 'blend' or 'best'")
        if initial is not None and initial not in candidates:
            raise ValueError(f"auto initial = {initial!r}: expected one of {sorted(candidates)}")
        if not (1 <= min_scored <= window <= ERROR_WINDOW):
            raise ValueError(
                f"auto window = {window}, min_scored = {min_scored}: expected "
                f"1 <= min_scored <= window <= {ERROR_WINDOW}"
            )
        if not (math.isfinite(sharpness) and sharpness >= 0.0):
            raise ValueError(f"auto sharpness = {sharpness!r}: expected a finite number >= 0")
        if not 0.0 <= hysteresis < 1.0:
            raise ValueError(f"auto hysteresis = {hysteresis!r}: expected 0 <= h < 1")
        self.candidates = dict(candidates)
        self.answer: AutoAnswer = answer
        self.window = window
        self.sharpness = float(sharpness)
        self.min_scored = min_scored
        self.hysteresis = hysteresis
        self.quantile = quantile
        self.min_points = min(c.min_points for c in self.candidates.values())
        self.choice = initial if initial is not None else next(iter(self.candidates))
        self.switches = 0
        self.pool = pool if pool is not None else EvidencePool()
        self.pool.join(self)
        self._cached: tuple[int, Forecast] | None = None
        # auto's own one-step errors: the blend's upper quantile comes from them
        self._errors: deque[float] = deque(maxlen=ERROR_WINDOW)

    # --- scoring --------------------------------------------------------------------------
    def losses(self) -> dict[str, list[float]]:
        """Each candidate's losses over the last ``window`` scored intervals, oldest first."""
        out: dict[str, list[float]] = {}
        for name, cand in self.candidates.items():
            scored = [interval_loss(a, e) for a, e in cand.recent_errors]
            out[name] = [x for x in scored if x is not None][-self.window :]
        return out

    def evidence(self) -> dict[str, tuple[float, float]]:
        """Per candidate ``(loss sum, intervals)``: its own, plus the pool's other members'
        times the pool weight."""
        out = {name: (float(sum(ls)), float(len(ls))) for name, ls in self.losses().items()}
        for peer in self.pool.members:
            if peer is self or self.pool.weight == 0.0:
                continue
            for name, ls in peer.losses().items():
                total, count = out[name]
                out[name] = (total + self.pool.weight * sum(ls), count + self.pool.weight * len(ls))
        return out

    def scores(self) -> dict[str, float]:
        """Each candidate's mean recent (pooled) loss; inf while its own series has fewer
        than ``min_scored`` scored intervals."""
        own = {name: len(ls) for name, ls in self.losses().items()}
        return {
            name: total / count if own[name] >= self.min_scored and count > 0 else math.inf
            for name, (total, count) in self.evidence().items()
        }

    def weights(self) -> dict[str, float]:
        """The blend's weights (sum 1): ``exp(-sharpness * (loss sum - best loss sum))``."""
        sums = {name: total for name, (total, _) in self.evidence().items()}
        best = min(sums.values())
        raw = {name: math.exp(-self.sharpness * (s - best)) for name, s in sums.items()}
        total = sum(raw.values())
        return {name: w / total for name, w in raw.items()}

    # --- protocol -------------------------------------------------------------------------
    def observe(self, value: float) -> None:
        had_data = any(c.last_value is not None for c in self.candidates.values())
        mine = self.predict_next()
        self.pool.version += 1
        try:
            v = float(value)
        except (TypeError, ValueError):
            v = math.nan
        for cand in self.candidates.values():
            cand.predict_next()  # every candidate's forecast is scored, not only the choice's
            cand.observe(value)
        if had_data and math.isfinite(v) and v > 0.0:
            self._errors.append(v - mine.value)
        self._update_choice()

    def predict_next(self) -> Forecast:
        if self._cached is None or self._cached[0] != self.pool.version:
            forecast = self._blend() if self.answer == "blend" else self._best()
            self._cached = (self.pool.version, forecast)
        return self._cached[1]

    def reset_idle(self) -> None:
        for cand in self.candidates.values():
            cand.reset_idle()

    # --- internals ------------------------------------------------------------------------
    def _update_choice(self) -> None:
        if self.answer == "blend":
            weights = self.weights()
            leader = max(weights, key=lambda n: weights[n])
            if leader != self.choice:
                self.choice = leader
                self.switches += 1
            return
        scores = self.scores()
        best = min(scores, key=lambda n: scores[n])
        current = scores[self.choice]
        if (
            best != self.choice
            and math.isfinite(scores[best])
            and (not math.isfinite(current) or scores[best] < (1.0 - self.hysteresis) * current)
        ):
            self.choice = best
            self.switches += 1

    def _best(self) -> Forecast:
        inner = self.candidates[self.choice].predict_next()
        score = self.scores()[self.choice]
        scored = f"recent mean APE {score:.1%}" if math.isfinite(score) else "not yet scored"
        return Forecast(
            value=inner.value,
            upper=inner.upper,
            fallback=inner.fallback,
            note=f"auto -> {self.choice} ({scored}): {inner.note}",
        )

    def _blend(self) -> Forecast:
        weights = self.weights()
        inner = {name: cand.predict_next() for name, cand in self.candidates.items()}
        if all(c.last_value is None for c in self.candidates.values()):
            return Forecast(
                value=0.0, upper=self._upper(0.0, None), fallback=True, note="auto: no data yet"
            )
        value = float(sum(weights[n] * inner[n].value for n in inner))
        uppers = [inner[n].upper for n in inner]
        mixed_upper = (
            float(sum(weights[n] * u for n, u in zip(inner, uppers, strict=True) if u is not None))
            if all(u is not None for u in uppers)
            else None
        )
        parts = ", ".join(
            f"{n} {w:.0%}"
            for n, w in sorted(weights.items(), key=lambda kv: -kv[1])
            if w >= _NOTE_MIN_WEIGHT
        )
        return Forecast(
            value=max(0.0, value),
            upper=self._upper(value, mixed_upper),
            fallback=all(f.fallback for f in inner.values()),
            note=f"auto blend of {parts}",
        )

    def _upper(self, value: float, mixed_upper: float | None) -> float | None:
        """The configured upper quantile: from auto's own recent errors once there are
        enough, before that the weighted mean of the candidates' upper quantiles."""
        if self.quantile is None:
            return None
        if len(self._errors) >= MIN_ERRORS_FOR_QUANTILE:
            return max(0.0, value + empirical_quantile(list(self._errors), self.quantile))
        return max(0.0, mixed_upper if mixed_upper is not None else value)
