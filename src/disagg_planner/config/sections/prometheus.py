"""Traffic metrics in: the Prometheus server the traffic windows are read from."""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import parse_qsl

from pydantic import BaseModel, Field, field_validator

from disagg_planner.config.sections.meta import field_meta, http_url

ThroughputMetricsSource = Literal["frontend", "router"]

DEFAULT_PROMETHEUS_ENDPOINT = (
    "http://prometheus-kube-prometheus-prometheus.monitoring.svc.cluster.local:9090"
)


class PrometheusSection(BaseModel):
    """The Prometheus server, its credentials and which metrics give the throughput."""

    metric_pulling_prometheus_endpoint: str = Field(
        DEFAULT_PROMETHEUS_ENDPOINT,
        description="URL of the Prometheus server holding the frontend metrics.",
        json_schema_extra=field_meta("prometheus", env=("PROMETHEUS_ENDPOINT",)),
    )
    metric_pulling_prometheus_token: str | None = Field(
        None,
        description="Bearer token sent to Prometheus.",
        json_schema_extra=field_meta("prometheus", env=("PROMETHEUS_TOKEN",)),
    )
    metric_pulling_prometheus_token_file: str | None = Field(
        None,
        description="File holding the bearer token; re-read on every request.",
        json_schema_extra=field_meta("prometheus", env=("PROMETHEUS_TOKEN_FILE",)),
    )
    metric_pulling_prometheus_ssl_verify: bool = Field(
        True,
        description="Verify Prometheus' TLS certificate.",
        json_schema_extra=field_meta("prometheus", env=("PROMETHEUS_SSL_VERIFY",)),
    )
    metric_pulling_prometheus_ca_bundle: str | None = Field(
        None,
        description="CA bundle (PEM file) to verify Prometheus' certificate with.",
        json_schema_extra=field_meta("prometheus", env=("PROMETHEUS_CA_BUNDLE",)),
    )
    metric_pulling_prometheus_extra_query_params: str | None = Field(
        None,
        description="URL query string added to every PromQL request (e.g. 'dedup=true').",
        json_schema_extra=field_meta("prometheus", env=("PROMETHEUS_EXTRA_QUERY_PARAMS",)),
    )
    metric_pulling_prometheus_request_timeout_seconds: float = Field(
        10.0,
        gt=0,
        description="Timeout of one PromQL request (s).",
        json_schema_extra=field_meta(
            "prometheus", env=("DYN_PLANNER_PROMETHEUS_REQUEST_TIMEOUT_SECONDS",)
        ),
    )
    throughput_metrics_source: ThroughputMetricsSource = Field(
        "frontend",
        description="Read traffic from the frontend's metrics or the router's.",
        json_schema_extra=field_meta("prometheus"),
    )

    @field_validator("metric_pulling_prometheus_extra_query_params")
    @classmethod
    def _query_string(cls, value: str | None) -> str | None:
        if value:
            try:
                parse_qsl(value, strict_parsing=True)
            except ValueError as exc:
                raise ValueError("must be a URL query string such as 'a=1&b=2'") from exc
        return value

    @field_validator("metric_pulling_prometheus_ca_bundle")
    @classmethod
    def _ca_bundle_exists(cls, value: str | None) -> str | None:
        if value and not Path(value).is_file():
            raise ValueError("must name an existing PEM file")
        return value

    @field_validator("metric_pulling_prometheus_endpoint")
    @classmethod
    def _endpoint_url(cls, value: str) -> str:
        return http_url(value)
