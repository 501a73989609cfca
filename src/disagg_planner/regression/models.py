"""Online regression of one scheduler iteration's wall time on the work it ran.

Three linear laws, each fitted by least squares with non-negative slopes
(:mod:`disagg_planner.regression.fit`) on a bucketed window of recent iterations
(:mod:`disagg_planner.regression.window`):

========================  =====================================================  ===========
model                     law (seconds)                                          samples
========================  =====================================================  ===========
:class:`PrefillModel`     ``a + b * sum_prefill_tokens``                         iterations
                                                                                 with prefill
:class:`DecodeModel`      ``a + b * num_decode_requests + c * sum_decode_kv``    pure decode
                          (``b`` is dropped to 0 when the window cannot support  iterations
                          a non-negative value)
:class:`AggModel`         ``a + b * sum_prefill_tokens + c * sum_decode_kv``     all busy
                                                                                 iterations
========================  =====================================================  ===========

A model is ``ready`` once it holds ``min_observations`` samples and its fit is accepted.
Iterations an engine runs right after it starts (cold caches, graph capture, lazy
compilation) are far slower than the law and would poison the fit (Dynamo issue #12430):
reports with ``counter_id < warmup_iterations`` (the engine's own iteration counter, which
starts at 0) are not regression samples. Idle heartbeats (``wall_time == 0``) are never
samples. Every skipped report is counted by reason in :attr:`skipped`.

Each model also keeps moving averages per engine and for all engines together
(:mod:`disagg_planner.regression.averages`), which the estimators in
:mod:`disagg_planner.regression.estimators` use.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import ClassVar

from disagg_planner.regression.averages import IterationAverages, LoadAverages
from disagg_planner.regression.fit import FitRejected, LinearFit, fit_wall_time
from disagg_planner.regression.protocols import EngineKey, IterationReport
from disagg_planner.regression.window import BucketedWindow

DEFAULT_WARMUP_ITERATIONS = 10


class ModelNotReadyError(RuntimeError):
    """A prediction was asked of a model that has no accepted fit yet."""


@dataclass(frozen=True)
class ModelStatus:
    """Whether a model can predict, and if not, why (``reason`` is a bounded label)."""

    ready: bool
    num_observations: int
    reason: str  # "ready" | "too_few_samples" | FitRejected.reason
    detail: str


class WallTimeModel:
    """Common machinery of the three models: sample filter, window, fit, averages."""

    FEATURES: ClassVar[tuple[str, ...]]
    CLIPPABLE: ClassVar[frozenset[str]] = frozenset()
    BUCKET_AXES: ClassVar[tuple[int, ...]]

    def __init__(
        self,
        *,
        max_samples: int = 64,
        bucket_count: int = 16,
        min_observations: int = 5,
        warmup_iterations: int = DEFAULT_WARMUP_ITERATIONS,
    ) -> None:
        if min_observations < 1:
            raise ValueError(f"min_observations must be >= 1, got {min_observations}")
        if warmup_iterations < 0:
            raise ValueError(f"warmup_iterations must be >= 0, got {warmup_iterations}")
        self.min_observations = min_observations
        self.warmup_iterations = warmup_iterations
        self._window = BucketedWindow(
            capacity=max_samples,
            bucket_count=bucket_count,
            num_features=len(self.FEATURES),
            bucket_axes=self.BUCKET_AXES,
        )
        self._average_window = max_samples
        self._fit: LinearFit | FitRejected | None = None
        self._engines: dict[EngineKey, IterationAverages] = {}
        self._all = IterationAverages(max_samples)
        self.skipped: dict[str, int] = {
            "idle": 0,
            "warmup": 0,
            "not_applicable": 0,
            "invalid": 0,
        }

    # --- observing ------------------------------------------------------------------------
    def _features(self, report: IterationReport) -> tuple[float, ...] | None:
        raise NotImplementedError

    def observe(self, report: IterationReport) -> bool:
        """Learn from one iteration report; True if it became a regression sample."""
        wall = report.wall_time
        if not (isinstance(wall, int | float) and math.isfinite(wall) and wall >= 0.0):
            self.skipped["invalid"] += 1
            return False
        if wall == 0.0:
            self.skipped["idle"] += 1
            return False
        key = (report.worker_id, report.dp_rank)
        engine = self._engines.get(key)
        if engine is None:
            engine = self._engines[key] = IterationAverages(self._average_window)
        engine.add(report)
        self._all.add(report)
        if report.counter_id < self.warmup_iterations:
            self.skipped["warmup"] += 1
            return False
        features = self._features(report)
        if features is None:
            self.skipped["not_applicable"] += 1
            return False
        self._window.add(features, wall)
        self._fit = None
        return True

    def observe_all(self, reports: Iterable[IterationReport]) -> int:
        """Observe many reports in order; returns how many became samples."""
        return sum(self.observe(r) for r in reports)

    def retain(self, engines: Collection[EngineKey]) -> None:
        """Forget the per-engine averages of engines not in ``engines`` (they left)."""
        for key in [k for k in self._engines if k not in engines]:
            del self._engines[key]

    # --- state ----------------------------------------------------------------------------
    @property
    def num_observations(self) -> int:
        return len(self._window)

    @property
    def fit(self) -> LinearFit | FitRejected:
        """The current fit, recomputed after new samples."""
        if self._fit is None:
            self._fit = fit_wall_time(
                self._window.features(),
                self._window.wall_times(),
                feature_names=self.FEATURES,
                clippable=self.CLIPPABLE,
                min_samples=self.min_observations,
            )
        return self._fit

    @property
    def ready(self) -> bool:
        return isinstance(self.fit, LinearFit)

    def status(self) -> ModelStatus:
        fit = self.fit
        if isinstance(fit, LinearFit):
            coef = ", ".join(
                f"{n}={s:.3g}" for n, s in zip(fit.feature_names, fit.slopes, strict=True)
            )
            return ModelStatus(
                True,
                self.num_observations,
                "ready",
                f"wall_time = {fit.intercept_s:.3g} s + ({coef}) s/unit",
            )
        return ModelStatus(False, self.num_observations, fit.reason, fit.detail)

    def engine_averages(self, engine: EngineKey) -> LoadAverages | None:
        """Moving averages of ``engine``, None if it has not reported an iteration."""
        tracker = self._engines.get(engine)
        return tracker.snapshot() if tracker is not None else None

    def averages(self, engine: EngineKey | None = None) -> LoadAverages:
        """Moving averages of ``engine``, or of all engines when None or unknown."""
        if engine is not None and engine in self._engines:
            return self._engines[engine].snapshot()
        return self._all.snapshot()

    def _predict(self, x: tuple[float, ...]) -> float:
        fit = self.fit
        if not isinstance(fit, LinearFit):
            raise ModelNotReadyError(
                f"{type(self).__name__} is not ready ({fit.reason}): {fit.detail}"
            )
        return fit.predict(x)


class PrefillModel(WallTimeModel):
    """Prefill iteration wall time (s) from ``sum_prefill_tokens`` (tokens computed)."""

    FEATURES = ("sum_prefill_tokens",)
    BUCKET_AXES = (0,)

    def _features(self, report: IterationReport) -> tuple[float, ...] | None:
        sched = report.scheduled_requests
        if sched.num_prefill_requests <= 0 or sched.sum_prefill_tokens <= 0:
            return None
        return (float(sched.sum_prefill_tokens),)

    def predict_wall_time(self, prefill_tokens: float) -> float:
        """Wall time (s) of one iteration computing ``prefill_tokens`` fresh tokens."""
        return self._predict((prefill_tokens,))


class DecodeModel(WallTimeModel):
    """Decode iteration wall time (s) from ``num_decode_requests`` and
    ``sum_decode_kv_tokens``; only iterations without prefill are samples."""

    FEATURES = ("num_decode_requests", "sum_decode_kv_tokens")
    CLIPPABLE = frozenset({"num_decode_requests"})
    BUCKET_AXES = (1,)

    def _features(self, report: IterationReport) -> tuple[float, ...] | None:
        sched = report.scheduled_requests
        if sched.num_decode_requests <= 0 or sched.num_prefill_requests > 0:
            return None
        return (float(sched.num_decode_requests), float(sched.sum_decode_kv_tokens))

    def predict_wall_time(self, *, num_decode_requests: float, decode_kv_tokens: float) -> float:
        """Wall time (s) of one decode step of that many requests holding that much KV."""
        return self._predict((num_decode_requests, decode_kv_tokens))


class AggModel(WallTimeModel):
    """Aggregated (chunked-prefill) iteration wall time (s) from ``sum_prefill_tokens``
    and ``sum_decode_kv_tokens``; buckets are laid over both axes."""

    FEATURES = ("sum_prefill_tokens", "sum_decode_kv_tokens")
    BUCKET_AXES = (0, 1)

    def _features(self, report: IterationReport) -> tuple[float, ...] | None:
        sched = report.scheduled_requests
        if sched.sum_prefill_tokens <= 0 and sched.num_decode_requests <= 0:
            return None
        return (float(sched.sum_prefill_tokens), float(sched.sum_decode_kv_tokens))

    def predict_wall_time(self, *, prefill_tokens: float, decode_kv_tokens: float) -> float:
        """Wall time (s) of one iteration mixing a prefill chunk with decode work."""
        return self._predict((prefill_tokens, decode_kv_tokens))


LoadModel = PrefillModel | DecodeModel | AggModel
