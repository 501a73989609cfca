"""``auto``: run several predictors in shadow and answer with the one that has been best lately.

Every candidate sees every value and makes its own one-step forecast each interval. A
candidate's score is its weighted absolute percentage error over the last ``window``
scored intervals, ``sum |actual - forecast| / sum actual`` (robust to single small actuals,
unlike a plain MAPE). The current choice changes only when another candidate's score is
lower by more than the ``hysteresis`` fraction, and only after ``min_scored`` intervals have
been scored, so two near-equal candidates do not make the forecast flip back and forth.

The price is running every candidate: its step time is the sum of theirs. The defaults
(24 intervals, 4 scored before any switch, 5% hysteresis, starting on the constant
predictor) were not tuned per trace: a sweep over the shared traces moved the mean ratio to
the best single predictor by under 1%. On those traces auto comes within 5% of the best
single predictor in 12 of 18 backtests (``benchmarks/RESULTS.md``); the misses are series
where the best predictor leads by a few percent and only shows it in hindsight.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from predictors.base import ERROR_WINDOW, BasePredictor, Forecast


class AutoPredictor:
    """Shadow-run candidates, answer with the best recent one (with hysteresis)."""

    name = "auto"

    def __init__(
        self,
        candidates: Mapping[str, BasePredictor],
        *,
        initial: str | None = None,
        window: int = 24,
        min_scored: int = 4,
        hysteresis: float = 0.05,
    ) -> None:
        if not candidates:
            raise ValueError("auto: expected at least one candidate predictor")
        if initial is not None and initial not in candidates:
            raise ValueError(f"auto initial = {initial!r}: expected one of {sorted(candidates)}")
        if not (1 <= min_scored <= window <= ERROR_WINDOW):
            raise ValueError(
                f"auto window = {window}, min_scored = {min_scored}: expected "
                f"1 <= min_scored <= window <= {ERROR_WINDOW}"
            )
        if not 0.0 <= hysteresis < 1.0:
            raise ValueError(f"auto hysteresis = {hysteresis!r}: expected 0 <= h < 1")
        self.candidates = dict(candidates)
        self.window = window
        self.min_scored = min_scored
        self.hysteresis = hysteresis
        self.min_points = min(c.min_points for c in self.candidates.values())
        self.choice = initial if initial is not None else next(iter(self.candidates))
        self.switches = 0
        self._cached: Forecast | None = None

    def scores(self) -> dict[str, float]:
        """Each candidate's recent weighted APE (inf while fewer than ``min_scored``)."""
        out: dict[str, float] = {}
        for name, cand in self.candidates.items():
            recent = cand.recent_errors[-self.window :]
            total = sum(abs(a) for a, _ in recent)
            if len(recent) < self.min_scored:
                out[name] = math.inf
            elif total > 0:
                out[name] = sum(abs(e) for _, e in recent) / total
            else:
                out[name] = sum(abs(e) for _, e in recent)
        return out

    def observe(self, value: float) -> None:
        self._cached = None
        for cand in self.candidates.values():
            cand.predict_next()  # every candidate's forecast is scored, not only the choice's
            cand.observe(value)
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

    def predict_next(self) -> Forecast:
        if self._cached is None:
            inner = self.candidates[self.choice].predict_next()
            score = self.scores()[self.choice]
            scored = f"recent wAPE {score:.1%}" if math.isfinite(score) else "not yet scored"
            self._cached = Forecast(
                value=inner.value,
                upper=inner.upper,
                fallback=inner.fallback,
                note=f"auto -> {self.choice} ({scored}): {inner.note}",
            )
        return self._cached

    def reset_idle(self) -> None:
        for cand in self.candidates.values():
            cand.reset_idle()
