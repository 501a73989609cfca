"""Metrics out and reports: the planner's own Prometheus port and its scheduled HTML reports."""

from __future__ import annotations

import math

from pydantic import BaseModel, Field, field_validator

from disagg_planner.config.sections.meta import field_meta


class ReportingSection(BaseModel):
    """The planner's metrics port and its reports' schedule, place and size limits."""

    metric_reporting_prometheus_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Port of the planner's own /metrics, /healthz and /readyz (0 = off).",
        json_schema_extra=field_meta("reporting", env=("PLANNER_PROMETHEUS_PORT",)),
    )
    report_interval_hours: float | None = Field(
        24.0,
        description="Write an HTML diagnostics report this often (hours); null disables.",
        json_schema_extra=field_meta("reporting"),
    )
    report_output_dir: str = Field(
        "./planner_reports",
        description="Directory of the HTML diagnostics reports.",
        json_schema_extra=field_meta("reporting"),
    )
    report_filename: str | None = Field(
        None,
        description="Fixed report file name instead of a timestamped one.",
        json_schema_extra=field_meta("reporting"),
    )
    report_write_gzip_log: bool = Field(
        True,
        description="Write a gzip JSONL log of every tick next to each report.",
        json_schema_extra=field_meta("reporting"),
    )
    # Diagnostics bounded by time and bytes (an operator runs for months).
    report_window_hours: float = Field(
        24.0,
        gt=0,
        allow_inf_nan=False,
        description="How far back the diagnostics keep ticks (hours): what a report shows, "
        "on demand (/report/<namespace>/<name> on the metrics port, planner report --live) "
        "or on schedule. Older ticks are dropped, so the memory they take stays bounded.",
        json_schema_extra=field_meta("reporting"),
    )
    report_keep_files: int = Field(
        3,
        ge=1,
        description="Scheduled reports kept per deployment (each an HTML file and its log); "
        "older ones are deleted.",
        json_schema_extra=field_meta("reporting"),
    )
    report_max_bytes: int = Field(
        768 * 1024 * 1024,
        ge=1024 * 1024,
        description="Bytes all reports under report_output_dir may take together (every "
        "deployment of the process); the oldest are deleted beyond it. Keep it below the "
        "volume's size (the Helm chart's reportsSizeLimit, 1 GiB).",
        json_schema_extra=field_meta("reporting"),
    )

    @field_validator("report_interval_hours")
    @classmethod
    def _report_interval(cls, value: float | None) -> float | None:
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ValueError("must be a positive, finite number of hours, or null")
        return value
