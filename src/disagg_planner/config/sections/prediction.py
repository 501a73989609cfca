"""Load prediction: the forecaster of the next interval's load and its parameters."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from disagg_planner.config.sections.meta import field_meta

LoadPredictorName = Literal["constant", "arima", "kalman", "prophet", "auto"]


class PredictionSection(BaseModel):
    """The load predictor and its parameters."""

    load_predictor: LoadPredictorName = Field(
        "arima",
        description="Forecaster of the next interval's request count, ISL and OSL.",
        json_schema_extra=field_meta("prediction"),
    )
    load_predictor_log1p: bool = Field(
        False,
        description="Model log1p(value) instead of the value (ARIMA, Kalman, Prophet).",
        json_schema_extra=field_meta("prediction"),
    )
    load_predictor_quantile: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="Provision for this upper quantile of the forecast instead of its mean "
        "(e.g. 0.9).",
        json_schema_extra=field_meta("prediction"),
    )
    load_predictor_warmup_trace: str | None = Field(
        None,
        description="Request trace (file, glob or directory) replayed into the predictors "
        "before the first live interval.",
        json_schema_extra=field_meta("prediction"),
    )
    prophet_window_size: int = Field(
        50,
        ge=2,
        description="Points of history Prophet fits on.",
        json_schema_extra=field_meta("prediction"),
    )
    kalman_q_level: float = Field(
        1.0,
        ge=0,
        description="Kalman process noise of the level.",
        json_schema_extra=field_meta("prediction"),
    )
    kalman_q_trend: float = Field(
        0.1,
        ge=0,
        description="Kalman process noise of the trend.",
        json_schema_extra=field_meta("prediction"),
    )
    kalman_r: float = Field(
        10.0,
        gt=0,
        description="Kalman measurement noise.",
        json_schema_extra=field_meta("prediction"),
    )
    kalman_min_points: int = Field(
        5,
        ge=1,
        description="Observations before the Kalman filter forecasts.",
        json_schema_extra=field_meta("prediction"),
    )
