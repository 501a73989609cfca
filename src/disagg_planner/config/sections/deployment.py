"""Deployment: where replicas are changed (a Kubernetes DGD or the virtual connector's etcd
keys), which roles are scaled and what the connectors' calls may take."""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, BaseModel, Field, field_validator

from disagg_planner.config.sections.meta import field_meta, http_url

Environment = Literal["kubernetes", "virtual"]
Backend = Literal["vllm", "sglang", "trtllm", "mocker"]
Mode = Literal["disagg", "prefill", "decode", "agg"]


class DeploymentSection(BaseModel):
    """Where replicas are changed and which roles are scaled."""

    environment: Environment = Field(
        "kubernetes",
        description="Where replicas are changed: a Kubernetes DGD, or the virtual "
        "decision-id protocol for other orchestrators.",
        json_schema_extra=field_meta("deployment"),
    )
    namespace: str = Field(
        "dynamo",
        min_length=1,
        description="Dynamo logical namespace of the graph (the dynamo_namespace metric label).",
        json_schema_extra=field_meta("deployment", env=("DYN_NAMESPACE",)),
    )
    kubernetes_namespace: str | None = Field(
        None,
        description="Kubernetes namespace of the DGD; default: the pod's own namespace.",
        json_schema_extra=field_meta("deployment", env=("POD_NAMESPACE",)),
    )
    dgd_name: str | None = Field(
        None,
        description="Name of the DynamoGraphDeployment to manage.",
        json_schema_extra=field_meta("deployment", env=("DYN_PARENT_DGD_K8S_NAME",)),
    )
    backend: Backend = Field(
        "vllm",
        description="Inference engine of the workers; selects the legacy component names.",
        json_schema_extra=field_meta("deployment"),
    )
    mode: Mode = Field(
        "disagg",
        description="Which roles the planner scales: prefill and decode (disagg), one of "
        "them, or aggregated workers (agg).",
        json_schema_extra=field_meta("deployment"),
    )
    model_name: str | None = Field(
        None,
        description="Served model name used to filter metrics (case-insensitive); "
        "default: read from the deployment.",
        json_schema_extra=field_meta("deployment"),
    )
    prefill_engine_num_gpu: int | None = Field(
        None,
        ge=1,
        description="GPUs per prefill replica; default: read from the DGD "
        "(required outside Kubernetes).",
        json_schema_extra=field_meta("deployment"),
    )
    decode_engine_num_gpu: int | None = Field(
        None,
        ge=1,
        description="GPUs per decode (or aggregated) replica; default: read from the DGD "
        "(required outside Kubernetes).",
        json_schema_extra=field_meta("deployment"),
    )
    advisory: bool = Field(
        False,
        validation_alias=AliasChoices("advisory", "no_operation"),
        description="Compute, log and export recommendations but never change replicas.",
        json_schema_extra=field_meta("deployment"),
    )
    manual_override: Literal["respect", "revert"] = Field(
        "respect",
        description="What to do when someone else changed a role's replicas since the planner "
        "last set them: 'respect' keeps their value and pauses that role for one adjustment "
        "interval, 'revert' writes the planner's value back; both emit a Kubernetes Event.",
        json_schema_extra=field_meta("deployment"),
    )
    scaling_max_wait_seconds: float = Field(
        1800.0,
        gt=0,
        description="How long a blocking scale waits for the deployment to become ready, and "
        "how long the virtual connector waits for a decision's acknowledgement before it "
        "issues the next decision anyway (s).",
        json_schema_extra=field_meta("deployment", env=("SCALING_MAX_WAIT_TIME",)),
    )
    scaling_check_interval_seconds: float = Field(
        10.0,
        gt=0,
        description="Polling period while waiting for readiness or an acknowledgement (s).",
        json_schema_extra=field_meta("deployment", env=("SCALING_CHECK_INTERVAL",)),
    )
    kubernetes_api_max_attempts: int = Field(
        5,
        ge=1,
        description="Attempts per Kubernetes API call when it answers 409, 429 or 5xx or the "
        "connection fails, before the error is reported.",
        json_schema_extra=field_meta("deployment"),
    )
    kubernetes_api_backoff_seconds: float = Field(
        1.0,
        ge=0,
        description="Delay before the first retry of a Kubernetes API call (s); it doubles per "
        "attempt up to 30 s, and a 429's Retry-After header takes precedence.",
        json_schema_extra=field_meta("deployment"),
    )
    kubernetes_api_timeout_seconds: float = Field(
        30.0,
        gt=0,
        description="Timeout of one Kubernetes API request (s).",
        json_schema_extra=field_meta("deployment"),
    )
    kubernetes_drain_timeout_seconds: float = Field(
        30.0,
        ge=0,
        description="The longest a scale-down on Kubernetes waits for the workers chosen "
        "to leave (the least loaded, marked with controller.kubernetes.io/pod-deletion-cost) "
        "(s). A worker with Dynamo's staged shutdown (its DYN_SYSTEM_PORT metrics page "
        "carries the dynamo_component_shutdown_* gauges, or its container declares "
        "DYN_WORKER_SHUTDOWN_TOTAL_TIMEOUT_SECS) has its count lowered first and is followed "
        "through its stages until it reports no request in flight and its KV transfers "
        "quiescent, a stage past serving, or its own total budget is spent "
        "(DYN_WORKER_SHUTDOWN_TOTAL_TIMEOUT_SECS, else its legacy alias, else Dynamo's "
        "30 s), at most this long; its GPUs count until its pod is gone. Any other worker "
        "is given this long to finish its in-flight requests, as its ForwardPassMetrics "
        "report them, before the count drops. 0: lower at once without following.",
        json_schema_extra=field_meta("deployment"),
    )
    virtual_etcd_endpoint: str = Field(
        "http://127.0.0.1:2379",
        description="etcd client URL of the virtual connector (spoken through etcd's v3 JSON "
        "gateway).",
        json_schema_extra=field_meta("deployment"),
    )
    virtual_etcd_key_prefix: str = Field(
        "v1",
        min_length=1,
        description="Root of the virtual connector's keys: {prefix}/{namespace}/planner/...",
        json_schema_extra=field_meta("deployment"),
    )
    virtual_etcd_timeout_seconds: float = Field(
        5.0,
        gt=0,
        description="Timeout of one etcd request of the virtual connector (s).",
        json_schema_extra=field_meta("deployment"),
    )

    @field_validator("model_name")
    @classmethod
    def _lower_model_name(cls, value: str | None) -> str | None:
        return value.lower() if value else value

    @field_validator("virtual_etcd_endpoint")
    @classmethod
    def _endpoint_url(cls, value: str) -> str:
        return http_url(value)

    @property
    def roles(self) -> tuple[str, ...]:
        """The roles this planner scales, in the order budgets are shared out."""
        return {
            "disagg": ("prefill", "decode"),
            "prefill": ("prefill",),
            "decode": ("decode",),
            "agg": ("agg",),
        }[self.mode]

    def engine_num_gpu_for(self, role: str) -> int | None:
        """GPUs per replica of ``role`` as configured (None: read from the deployment)."""
        return self.prefill_engine_num_gpu if role == "prefill" else self.decode_engine_num_gpu
