"""Building the decision core from a config: one place for what live, replay and ``plan``
share (profile resolution, predictor settings, engine limits)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import partial

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.core.load_scaling import EngineLimits
from disagg_planner.core.planner import PlannerCore
from disagg_planner.core.throughput import PredictorFactory
from disagg_planner.errors import TraceError
from disagg_planner.predictors import make_predictors
from disagg_planner.predictors.base import LoadPredictor
from disagg_planner.predictors.traces import TraceError as LibraryTraceError
from disagg_planner.predictors.warmup import WarmupReport, warm_up
from disagg_planner.profiles import Profile, load_profile, resolve_profile

log = logging.getLogger(__name__)


def predictor_factory(config: PlannerConfig) -> PredictorFactory:
    """New predictors for the given series (num_req, isl, osl), configured as the config says."""
    return partial(
        make_predictors,
        config.load_predictor,
        log1p=config.load_predictor_log1p,
        quantile=config.load_predictor_quantile,
        prophet_window_size=config.prophet_window_size,
        kalman_q_level=config.kalman_q_level,
        kalman_q_trend=config.kalman_q_trend,
        kalman_r=config.kalman_r,
        kalman_min_points=config.kalman_min_points,
        interval_s=config.throughput_adjustment_interval_seconds,
    )


def profile_for(config: PlannerConfig) -> Profile:
    """The profile named by ``--profile`` (bundled) or ``--profile-results-dir``."""
    return load_profile(resolve_profile(config.profile or config.profile_results_dir))


def build_core(
    config: PlannerConfig,
    *,
    start_s: float,
    profile: Profile | None = None,
    engine_limits: EngineLimits | None = None,
) -> PlannerCore:
    """A PlannerCore for ``config``; the profile is loaded only when the throughput loop
    needs one."""
    if config.throughput_scaling_active and profile is None:
        profile = profile_for(config)
    core = PlannerCore(
        config=config,
        start_s=start_s,
        profile=profile,
        predictor_factory=predictor_factory(config) if config.throughput_scaling_active else None,
        engine_limits=engine_limits,
        decode_max_num_seqs=decode_max_num_seqs(config, profile),
        prefill_chunk_tokens=prefill_chunk_tokens(config, profile, engine_limits),
    )
    if core.throughput is not None and config.load_predictor_warmup_trace:
        warm_up_predictors(core.throughput.predictors, config)
    return core


def warm_up_predictors(
    predictors: Mapping[str, LoadPredictor],
    config: PlannerConfig,
    *,
    interval_s: float | None = None,
) -> WarmupReport:
    """Feed the predictors the trace of ``--load-predictor-warmup-trace``, bucketed with
    ``interval_s`` (default: the throughput interval; ``planner backtest --interval`` passes
    its own). Raises TraceError naming the setting, the file and what is wrong."""
    path = config.load_predictor_warmup_trace
    assert path is not None
    interval = config.throughput_adjustment_interval_seconds if interval_s is None else interval_s
    try:
        report = warm_up(predictors, path, interval_s=interval)
    except LibraryTraceError as exc:
        raise TraceError(f"load_predictor_warmup_trace = {path!r}: {exc}") from exc
    log.info(
        "predictor warm-up: %d intervals of %g s from %s (%s, %d requests)",
        report.intervals,
        interval,
        path,
        report.trace_format,
        report.requests,
    )
    if report.intervals == 0:
        log.warning("predictor warm-up: %s has no complete interval of %g s", path, interval)
    return report


def decode_max_num_seqs(config: PlannerConfig, profile: Profile | None) -> int | None:
    """Sequence slots of one decode (or aggregated) engine: the config's value, else the
    profiled engine's (manifest), else unknown."""
    if config.max_num_seqs is not None:
        return config.max_num_seqs
    manifest = profile.manifest if profile is not None else None
    if manifest is None:
        return None
    return manifest.decode_engine.max_num_seqs or manifest.engine.max_num_seqs


def prefill_chunk_tokens(
    config: PlannerConfig, profile: Profile | None, engine_limits: EngineLimits | None
) -> int:
    """Token budget of one prefill (or aggregated) engine's iteration: the config's
    ``max_num_batched_tokens``, else the profiled engine's (manifest), else what the engines
    publish, else the load loop's default (:class:`EngineLimits`)."""
    if config.max_num_batched_tokens is not None:
        return config.max_num_batched_tokens
    manifest = profile.manifest if profile is not None else None
    if manifest is not None:
        # the prefill engine's shape has the manifest's top-level keys under its overrides
        shape = manifest.prefill_engine if config.mode != "agg" else manifest.engine
        if shape.max_num_batched_tokens is not None:
            return shape.max_num_batched_tokens
    return (engine_limits or EngineLimits()).max_num_batched_tokens


def gpus_per_replica(config: PlannerConfig, profile: Profile | None, role: str) -> int:
    """GPUs of one replica of ``role`` where no deployment says: the config's value, else the
    profiled engine's shape (manifest), else 1."""
    configured = config.engine_num_gpu_for(role)
    if configured is not None:
        return configured
    manifest = profile.manifest if profile is not None else None
    if manifest is not None:
        shape = manifest.prefill_engine if role == "prefill" else manifest.decode_engine
        if shape.gpus != 1 or manifest.engine.gpus == 1:
            return shape.gpus
        return manifest.engine.gpus
    return 1
