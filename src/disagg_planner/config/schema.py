"""``PlannerConfig``: the one definition of every planner setting.

Each field carries its type, default, validation and help text; command-line flags,
environment variables, ``config show`` and (later) the CRD and Helm schemas are generated
from it. Field names follow Dynamo's newest planner config; Dynamo's older names are
accepted as aliases so that a Dynamo user's JSON or YAML config loads unchanged.

Extra metadata per field lives in ``json_schema_extra``:

- ``flags``: additional command-line spellings (Dynamo's legacy argparse flags);
- ``env``: additional environment variables (Dynamo's own names, e.g. ``PROMETHEUS_ENDPOINT``);
- ``group``: the heading the flag is listed under in ``--help``.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qsl

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from disagg_planner.errors import ConfigProblem

Environment = Literal["kubernetes", "virtual"]
Backend = Literal["vllm", "sglang", "trtllm", "mocker"]
Mode = Literal["disagg", "prefill", "decode", "agg"]
OptimizationTarget = Literal["sla", "throughput", "latency", "load"]
LoadPredictorName = Literal["constant", "arima", "kalman", "prophet", "auto"]
ThroughputMetricsSource = Literal["frontend", "router"]

DEFAULT_PROMETHEUS_ENDPOINT = (
    "http://prometheus-kube-prometheus-prometheus.monitoring.svc.cluster.local:9090"
)
_ZMQ_ENDPOINT = re.compile(r"tcp://[^\s:/]+:\d{1,5}|tcp://\[[0-9a-fA-F:]+\]:\d{1,5}|ipc://\S+")

# Keys of Dynamo's planner config that configure subsystems this planner does not have
# (AIConfigurator sweeps, the plugin gateway, power capping ...). A Dynamo config that sets
# them still loads; they are reported as ignored instead of rejected as unknown.
DYNAMO_KEYS_NOT_APPLICABLE: frozenset[str] = frozenset(
    {
        "pre_deployment_sweeping_mode",
        "aic_interpolation",
        "aic_perf_model",
        "control_api_port",
        "global_planner_namespace",
        "live_dashboard_port",
        "scheduling",
        "batch_scheduling",
        "plugin_registration",
        "enable_power_awareness",
        "total_gpu_power_limit",
        "speculative_nextn",
        "log_dir",
        "prefill_scale_up_queue_tokens",
        "prefill_scale_down_queue_tokens",
        "decode_scale_up_kv_rate",
        "decode_scale_down_kv_rate",
        "load_router_metrics_url",
        "loadbased_router_metrics_url",
        "load_learning_window",
        "loadbased_learning_window",
        "load_metric_samples",
        "loadbased_metric_samples",
        "load_prediction_window_size",
    }
)


def _extra(group: str, *, flags: tuple[str, ...] = (), env: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"group": group, "flags": list(flags), "env": list(env)}


class PlannerConfig(BaseModel):
    """Every setting of one planner (one managed DynamoGraphDeployment)."""

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        validate_default=True,
        frozen=True,
    )

    # --- deployment -------------------------------------------------------------------
    environment: Environment = Field(
        "kubernetes",
        description="Where replicas are changed: a Kubernetes DGD, or the virtual "
        "decision-id protocol for other orchestrators.",
        json_schema_extra=_extra("deployment"),
    )
    namespace: str = Field(
        "dynamo",
        min_length=1,
        description="Dynamo logical namespace of the graph (the dynamo_namespace metric label).",
        json_schema_extra=_extra("deployment", env=("DYN_NAMESPACE",)),
    )
    kubernetes_namespace: str | None = Field(
        None,
        description="Kubernetes namespace of the DGD; default: the pod's own namespace.",
        json_schema_extra=_extra("deployment", env=("POD_NAMESPACE",)),
    )
    dgd_name: str | None = Field(
        None,
        description="Name of the DynamoGraphDeployment to manage.",
        json_schema_extra=_extra("deployment", env=("DYN_PARENT_DGD_K8S_NAME",)),
    )
    backend: Backend = Field(
        "vllm",
        description="Inference engine of the workers; selects the legacy component names.",
        json_schema_extra=_extra("deployment"),
    )
    mode: Mode = Field(
        "disagg",
        description="Which roles the planner scales: prefill and decode (disagg), one of "
        "them, or aggregated workers (agg).",
        json_schema_extra=_extra("deployment"),
    )
    model_name: str | None = Field(
        None,
        description="Served model name used to filter metrics (case-insensitive); "
        "default: read from the deployment.",
        json_schema_extra=_extra("deployment"),
    )
    prefill_engine_num_gpu: int | None = Field(
        None,
        ge=1,
        description="GPUs per prefill replica; default: read from the DGD "
        "(required outside Kubernetes).",
        json_schema_extra=_extra("deployment"),
    )
    decode_engine_num_gpu: int | None = Field(
        None,
        ge=1,
        description="GPUs per decode (or aggregated) replica; default: read from the DGD "
        "(required outside Kubernetes).",
        json_schema_extra=_extra("deployment"),
    )
    advisory: bool = Field(
        False,
        validation_alias=AliasChoices("advisory", "no_operation"),
        description="Compute, log and export recommendations but never change replicas.",
        json_schema_extra=_extra("deployment"),
    )
    manual_override: Literal["respect", "revert"] = Field(
        "respect",
        description="What to do when someone else changed a role's replicas since the planner "
        "last set them: 'respect' keeps their value and pauses that role for one adjustment "
        "interval, 'revert' writes the planner's value back; both emit a Kubernetes Event.",
        json_schema_extra=_extra("deployment"),
    )
    scaling_max_wait_seconds: float = Field(
        1800.0,
        gt=0,
        description="How long a blocking scale waits for the deployment to become ready, and "
        "how long the virtual connector waits for a decision's acknowledgement before it "
        "issues the next decision anyway (s).",
        json_schema_extra=_extra("deployment", env=("SCALING_MAX_WAIT_TIME",)),
    )
    scaling_check_interval_seconds: float = Field(
        10.0,
        gt=0,
        description="Polling period while waiting for readiness or an acknowledgement (s).",
        json_schema_extra=_extra("deployment", env=("SCALING_CHECK_INTERVAL",)),
    )
    kubernetes_api_max_attempts: int = Field(
        5,
        ge=1,
        description="Attempts per Kubernetes API call when it answers 409, 429 or 5xx or the "
        "connection fails, before the error is reported.",
        json_schema_extra=_extra("deployment"),
    )
    kubernetes_api_backoff_seconds: float = Field(
        1.0,
        ge=0,
        description="Delay before the first retry of a Kubernetes API call (s); it doubles per "
        "attempt up to 30 s, and a 429's Retry-After header takes precedence.",
        json_schema_extra=_extra("deployment"),
    )
    kubernetes_api_timeout_seconds: float = Field(
        30.0,
        gt=0,
        description="Timeout of one Kubernetes API request (s).",
        json_schema_extra=_extra("deployment"),
    )
    kubernetes_drain_timeout_seconds: float = Field(
        30.0,
        ge=0,
        description="Before a role's replicas are lowered on Kubernetes, how long the "
        "least-loaded workers chosen to leave (marked with "
        "controller.kubernetes.io/pod-deletion-cost) are given to finish their in-flight "
        "requests, as their ForwardPassMetrics report them, before the count drops (s); 0: "
        "mark and lower at once.",
        json_schema_extra=_extra("deployment"),
    )
    virtual_etcd_endpoint: str = Field(
        "http://127.0.0.1:2379",
        description="etcd client URL of the virtual connector (spoken through etcd's v3 JSON "
        "gateway).",
        json_schema_extra=_extra("deployment"),
    )
    virtual_etcd_key_prefix: str = Field(
        "v1",
        min_length=1,
        description="Root of the virtual connector's keys: {prefix}/{namespace}/planner/...",
        json_schema_extra=_extra("deployment"),
    )
    virtual_etcd_timeout_seconds: float = Field(
        5.0,
        gt=0,
        description="Timeout of one etcd request of the virtual connector (s).",
        json_schema_extra=_extra("deployment"),
    )

    # --- SLOs and loops ---------------------------------------------------------------
    ttft_ms: float = Field(
        500.0,
        gt=0,
        validation_alias=AliasChoices("ttft_ms", "ttft"),
        description="Time-to-first-token target in milliseconds.",
        json_schema_extra=_extra("slo"),
    )
    itl_ms: float = Field(
        50.0,
        gt=0,
        validation_alias=AliasChoices("itl_ms", "itl"),
        description="Inter-token latency target in milliseconds.",
        json_schema_extra=_extra("slo"),
    )
    optimization_target: OptimizationTarget = Field(
        "sla",
        description="'sla' sizes for the TTFT/ITL targets with the loops enabled below; "
        "Dynamo's easy modes (throughput, latency, load) run load-based scaling only. Where "
        "ours differ from Dynamo's: Dynamo's throughput and latency modes scale on static "
        "thresholds of queue depth and KV-cache utilisation (latency's tighter) and its load "
        "mode on user-given prefill-queue-token and decode KV-utilisation thresholds; here all "
        "three run the same load loop, which steps on the TTFT/ITL it estimates per engine "
        "from the ForwardPassMetrics regression against ttft/itl, so the three modes behave "
        "alike and the latency targets are the thresholds.",
        json_schema_extra=_extra("slo"),
    )
    enable_throughput_scaling: bool = Field(
        True,
        description="Run the throughput-based loop (forecast + profile sizing).",
        json_schema_extra=_extra("slo"),
    )
    enable_load_scaling: bool = Field(
        False,
        validation_alias=AliasChoices(
            "enable_load_scaling", "enable_loadbased_scaling", "enable_load_based_scaling"
        ),
        description="Run the load-based loop (per-iteration engine metrics, +-1 steps).",
        json_schema_extra=_extra("slo"),
    )
    throughput_adjustment_interval_seconds: float = Field(
        180.0,
        gt=0,
        validation_alias=AliasChoices(
            "throughput_adjustment_interval_seconds",
            "throughput_adjustment_interval",
            "adjustment_interval",
        ),
        description="Period of the throughput loop and width of its Prometheus window (s).",
        json_schema_extra=_extra("slo"),
    )
    load_adjustment_interval_seconds: float = Field(
        5.0,
        gt=0,
        validation_alias=AliasChoices(
            "load_adjustment_interval_seconds",
            "load_adjustment_interval",
            "loadbased_adjustment_interval",
        ),
        description="Period of the load loop (s); must be shorter than the throughput "
        "interval when both loops run.",
        json_schema_extra=_extra("slo"),
    )
    ttft_attainment_target: float | None = Field(
        0.99,
        gt=0,
        lt=1,
        description="Share of requests whose TTFT must meet the target: prefill is sized "
        "with the queueing headroom this needs (GI/G/1 waiting-time tail) instead of at 100 % "
        "utilisation as Dynamo does; null sizes at the profiled throughput.",
        json_schema_extra=_extra("slo"),
    )
    no_correction: bool = Field(
        False,
        description="Do not correct profiled capacity by observed/expected TTFT and ITL.",
        json_schema_extra=_extra("slo"),
    )
    max_throughput_scaling_replicas: int = Field(
        8,
        ge=1,
        description="Largest change of one role's replicas in one throughput tick.",
        json_schema_extra=_extra("slo"),
    )
    scale_down_stabilization_seconds: float = Field(
        600.0,
        ge=0,
        description="Scale a role down only to the highest throughput recommendation of this "
        "many past seconds (the HPA's scale-down stabilisation); 0 scales down at once. A "
        "role is also never scaled down within one time-to-ready of its last scale-up, and the "
        "replicas found at the planner's first tick count as a recommendation at that time "
        "(as the HPA controller records its first sight), so a restarted planner does not "
        "cut a running deployment within one window. A role whose observed tail over the "
        "interval is under half its SLO remembers its need for one time-to-ready instead "
        "(the observation is the evidence the window stands in for; a cut that then "
        "breaches is restored at once and kept for this window).",
        json_schema_extra=_extra("slo"),
    )
    replica_startup_seconds: float = Field(
        120.0,
        ge=0,
        description="Time from ordering a replica to its serving, assumed until the planner "
        "has measured it (its own scale-ups, decision to ready): each decision sizes for the "
        "load expected over [now + time-to-ready, now + time-to-ready + interval].",
        json_schema_extra=_extra("slo"),
    )
    fast_check_interval_seconds: float | None = Field(
        15.0,
        gt=0,
        description="Period of the fast path between throughput ticks: a Prometheus-only check "
        "of the frontend's recent TTFT tail, in-flight requests and arrival rate that scales "
        "up at once, by what the observed demand and backlog need, when the SLO is at risk; "
        "its windows also give the burst statistics. null turns it off; the default is "
        "skipped when the throughput interval is not longer (a set value must be shorter).",
        json_schema_extra=_extra("slo"),
    )
    burst_quantile: float | None = Field(
        0.9,
        gt=0,
        lt=1,
        description="Size prefill for this upper quantile of the short-window (fast-check) "
        "arrival rate relative to its interval's mean rate, instead of the mean; null sizes "
        "for the mean.",
        json_schema_extra=_extra("slo"),
    )
    burst_memory_seconds: float | None = Field(
        1800.0,
        gt=0,
        description="Learn from bursts already seen: once the short-window arrival rate has "
        "risen more than twofold within one time-to-ready (faster than new capacity can "
        "follow), keep capacity for the highest short-window rate of this many past seconds "
        "as a floor, instead of dropping to the quiet level before the next burst; forgotten "
        "this long after the last such rise. null turns it off.",
        json_schema_extra=_extra("slo"),
    )
    backlog_drain_seconds: float = Field(
        60.0,
        gt=0,
        description="The work already waiting (in-flight requests beyond what the arrival "
        "rate and request duration explain, or FPM's queued prefill tokens) is added to the "
        "demand as that many tokens over this many seconds.",
        json_schema_extra=_extra("slo"),
    )
    prefill_length_mix: bool = Field(
        True,
        description="Size prefill for the observed prompt lengths (the frontend's ISL "
        "histogram: each length at its own profiled throughput), not for as many prompts of "
        "the mean length; long prompts run at a lower throughput per GPU, so a mix with long "
        "prompts needs more prefill than its mean says. false sizes at the mean ISL.",
        json_schema_extra=_extra("slo"),
    )
    prefill_queueing: Literal["pooled", "per_engine"] = Field(
        "pooled",
        description="Queueing model of the prefill headroom: 'pooled' (one GI/G/c queue over "
        "all engines, Erlang C; the router spreads requests over them) or 'per_engine' (a "
        "GI/G/1 queue per engine, more conservative).",
        json_schema_extra=_extra("slo"),
    )
    kv_hit_rate: float | None = Field(
        None,
        ge=0,
        lt=1,
        validation_alias=AliasChoices("kv_hit_rate", "prefix_hit_rate"),
        description="Share of prompt tokens served from the engines' prefix cache: the "
        "throughput loop sizes prefill for the tokens that miss it only (num_req x ISL x "
        "(1 - rate)). null: the router's observed mean (dynamo_component_router_kv_hit_rate), "
        "no discount while none is seen. The load loop discounts the queued prompts' tokens "
        "by it (an engine's queue counts whole prompts).",
        json_schema_extra=_extra("slo"),
    )
    num_speculative_tokens: int | None = Field(
        None,
        ge=1,
        le=16,
        validation_alias=AliasChoices(
            "num_speculative_tokens", "speculative_num_tokens", "nextn", "speculative_nextn"
        ),
        description="Draft tokens per decode step when the engines run speculative decoding "
        "(MTP nextn, EAGLE steps): decode capacity is multiplied by the accept length, "
        "clamped to [1, nextn + 1]. null: no speculative decoding.",
        json_schema_extra=_extra("slo"),
    )
    speculative_accept_length: float | None = Field(
        None,
        ge=1,
        validation_alias=AliasChoices("speculative_accept_length", "accept_length"),
        description="Mean tokens a sequence emits per decode step with speculative decoding "
        "(1 + accepted drafts). null: the observed one, 1 until seen. Needs "
        "num_speculative_tokens.",
        json_schema_extra=_extra("slo"),
    )
    scaling_convergence_timeout_seconds: float = Field(
        600.0,
        gt=0,
        description="How long to wait for replicas to become ready after a change before "
        "re-planning from what is observed.",
        json_schema_extra=_extra("slo"),
    )

    # --- budgets and floors -----------------------------------------------------------
    max_gpu_budget: int = Field(
        8,
        description="Most GPUs the managed roles may use together; -1 for no limit.",
        json_schema_extra=_extra("budget"),
    )
    min_gpu_budget: int = Field(
        -1,
        description="Fewest GPUs the managed roles keep together; -1 for no floor.",
        json_schema_extra=_extra("budget"),
    )
    min_endpoint: int = Field(
        1,
        ge=0,
        description="Fewest replicas of each scaled role (0 allows scale to zero).",
        json_schema_extra=_extra("budget"),
    )
    prefill_min_endpoint: int | None = Field(
        None,
        ge=1,
        description="Fewest prefill replicas; overrides --min-endpoint for prefill.",
        json_schema_extra=_extra("budget"),
    )
    decode_min_endpoint: int | None = Field(
        None,
        ge=1,
        description="Fewest decode replicas; overrides --min-endpoint for decode.",
        json_schema_extra=_extra("budget"),
    )

    # --- fleet: a GPU pool shared with other deployments (operator) --------------------
    pool: str | None = Field(
        None,
        min_length=1,
        description="Name of the PlannerPool (in the policy's namespace) whose GPUs this "
        "deployment shares with the pool's other members; its arbiter grants this "
        "deployment's GPUs by floor, priority and urgency, and max_gpu_budget still caps it. "
        "Served by `planner operator` only (`planner run` and single replays refuse it; "
        "`planner replay --fleet` replays a pool).",
        json_schema_extra=_extra("budget"),
    )
    pool_priority: int = Field(
        0,
        description="Priority in the pool: needs above floors are served higher first.",
        json_schema_extra=_extra("budget"),
    )
    pool_floor_gpus: int = Field(
        0,
        ge=0,
        description="GPUs of the pool this deployment is guaranteed (its floor): served "
        "first, lent to equal or higher priorities while idle, reclaimed at once.",
        json_schema_extra=_extra("budget"),
    )
    pool_ceiling_gpus: int | None = Field(
        None,
        ge=0,
        description="Most GPUs of the pool this deployment is granted (null: the pool's).",
        json_schema_extra=_extra("budget"),
    )

    # --- load prediction --------------------------------------------------------------
    load_predictor: LoadPredictorName = Field(
        "arima",
        description="Forecaster of the next interval's request count, ISL and OSL.",
        json_schema_extra=_extra("prediction"),
    )
    load_predictor_log1p: bool = Field(
        False,
        description="Model log1p(value) instead of the value (ARIMA, Kalman, Prophet).",
        json_schema_extra=_extra("prediction"),
    )
    load_predictor_quantile: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="Provision for this upper quantile of the forecast instead of its mean "
        "(e.g. 0.9).",
        json_schema_extra=_extra("prediction"),
    )
    load_predictor_warmup_trace: str | None = Field(
        None,
        description="Request trace (file, glob or directory) replayed into the predictors "
        "before the first live interval.",
        json_schema_extra=_extra("prediction"),
    )
    prophet_window_size: int = Field(
        50,
        ge=2,
        description="Points of history Prophet fits on.",
        json_schema_extra=_extra("prediction"),
    )
    kalman_q_level: float = Field(
        1.0,
        ge=0,
        description="Kalman process noise of the level.",
        json_schema_extra=_extra("prediction"),
    )
    kalman_q_trend: float = Field(
        0.1,
        ge=0,
        description="Kalman process noise of the trend.",
        json_schema_extra=_extra("prediction"),
    )
    kalman_r: float = Field(
        10.0,
        gt=0,
        description="Kalman measurement noise.",
        json_schema_extra=_extra("prediction"),
    )
    kalman_min_points: int = Field(
        5,
        ge=1,
        description="Observations before the Kalman filter forecasts.",
        json_schema_extra=_extra("prediction"),
    )

    # --- profiles ---------------------------------------------------------------------
    profile_results_dir: str = Field(
        "profiling_results",
        description="Directory of pre-deployment profiling results (Dynamo's NPZ layout).",
        json_schema_extra=_extra("profile"),
    )
    profile: str | None = Field(
        None,
        description="Name of a bundled profile (e.g. h200_sxm/vllm/llama-3.1-8b-fp8/tp1); "
        "takes the place of --profile-results-dir.",
        json_schema_extra=_extra("profile"),
    )

    # --- metrics in -------------------------------------------------------------------
    metric_pulling_prometheus_endpoint: str = Field(
        DEFAULT_PROMETHEUS_ENDPOINT,
        description="URL of the Prometheus server holding the frontend metrics.",
        json_schema_extra=_extra("prometheus", env=("PROMETHEUS_ENDPOINT",)),
    )
    metric_pulling_prometheus_token: str | None = Field(
        None,
        description="Bearer token sent to Prometheus.",
        json_schema_extra=_extra("prometheus", env=("PROMETHEUS_TOKEN",)),
    )
    metric_pulling_prometheus_token_file: str | None = Field(
        None,
        description="File holding the bearer token; re-read on every request.",
        json_schema_extra=_extra("prometheus", env=("PROMETHEUS_TOKEN_FILE",)),
    )
    metric_pulling_prometheus_ssl_verify: bool = Field(
        True,
        description="Verify Prometheus' TLS certificate.",
        json_schema_extra=_extra("prometheus", env=("PROMETHEUS_SSL_VERIFY",)),
    )
    metric_pulling_prometheus_ca_bundle: str | None = Field(
        None,
        description="CA bundle (PEM file) to verify Prometheus' certificate with.",
        json_schema_extra=_extra("prometheus", env=("PROMETHEUS_CA_BUNDLE",)),
    )
    metric_pulling_prometheus_extra_query_params: str | None = Field(
        None,
        description="URL query string added to every PromQL request (e.g. 'dedup=true').",
        json_schema_extra=_extra("prometheus", env=("PROMETHEUS_EXTRA_QUERY_PARAMS",)),
    )
    metric_pulling_prometheus_request_timeout_seconds: float = Field(
        10.0,
        gt=0,
        description="Timeout of one PromQL request (s).",
        json_schema_extra=_extra(
            "prometheus", env=("DYN_PLANNER_PROMETHEUS_REQUEST_TIMEOUT_SECONDS",)
        ),
    )
    throughput_metrics_source: ThroughputMetricsSource = Field(
        "frontend",
        description="Read traffic from the frontend's metrics or the router's.",
        json_schema_extra=_extra("prometheus"),
    )

    # --- load-based scaling -----------------------------------------------------------
    load_scaling_down_sensitivity: int = Field(
        80,
        ge=0,
        le=100,
        validation_alias=AliasChoices(
            "load_scaling_down_sensitivity", "loadbased_scaling_down_sensitivity"
        ),
        description="0 never scales down on load, 100 scales down as soon as the estimates allow.",
        json_schema_extra=_extra("load"),
    )
    load_min_observations: int = Field(
        5,
        ge=1,
        validation_alias=AliasChoices("load_min_observations", "loadbased_min_observations"),
        description="Iteration samples before the wall-time regression is trusted.",
        json_schema_extra=_extra("load"),
    )
    max_num_fpm_samples: int = Field(
        64,
        ge=4,
        description="Iteration samples kept per regression model.",
        json_schema_extra=_extra("load"),
    )
    fpm_sample_bucket_size: int = Field(
        16,
        ge=1,
        description="Buckets over the load range used to retire old samples (a perfect "
        "square, so 2-D models get sqrt buckets per axis).",
        json_schema_extra=_extra("load"),
    )
    fpm_warmup_iterations: int = Field(
        10,
        ge=0,
        description="An engine's first iterations after it starts (cold caches, graph "
        "capture) that are not regression samples.",
        json_schema_extra=_extra("load"),
    )
    fpm_staleness_seconds: float = Field(
        10.0,
        gt=0,
        description="An engine that sent no ForwardPassMetrics (idle engines heartbeat every "
        "second) for this long is treated as gone (s).",
        json_schema_extra=_extra("load"),
    )
    prefill_fpm_endpoints: tuple[str, ...] = Field(
        (),
        description="ZMQ endpoints (tcp://host:port, one per DP rank) of the prefill "
        "engines' ForwardPassMetrics publishers, comma-separated; default: discovered.",
        json_schema_extra=_extra("load"),
    )
    decode_fpm_endpoints: tuple[str, ...] = Field(
        (),
        description="ZMQ endpoints of the decode (or aggregated) engines' ForwardPassMetrics "
        "publishers, comma-separated; default: discovered.",
        json_schema_extra=_extra("load"),
    )
    max_num_batched_tokens: int | None = Field(
        None,
        ge=1,
        description="Engine token budget per iteration; default: the DynamoWorkerMetadata, "
        "else 8192.",
        json_schema_extra=_extra("load"),
    )
    max_num_seqs: int | None = Field(
        None,
        ge=1,
        description="Most requests in an engine's running batch; default: the "
        "DynamoWorkerMetadata, else 512.",
        json_schema_extra=_extra("load"),
    )
    max_kv_tokens: int | None = Field(
        None,
        ge=1,
        description="KV cache capacity of one engine in tokens; default: the "
        "DynamoWorkerMetadata, else unknown (KV checks skipped).",
        json_schema_extra=_extra("load"),
    )

    # --- elastic expert parallelism (docs/elastic-ep.md) ---------------------------------
    elastic_ep: Literal["prefill", "decode", "agg"] | None = Field(
        None,
        description="Role whose capacity changes by resizing its engine's data-parallel (and "
        "expert-parallel) size in place with vLLM elastic EP, instead of its replica count.",
        json_schema_extra=_extra("elastic"),
    )
    elastic_ep_mode: Literal["blocking", "async", "nixl"] = Field(
        "nixl",
        description="How the engine resizes: 'blocking' (serving paused for the whole resize), "
        "'async' (background preparation, paused for warm-up), 'nixl' (async with NIXL EP, "
        "paused ~1-2 s); sets the resize's lead time and downtime cost.",
        json_schema_extra=_extra("elastic"),
    )
    elastic_ep_dp_step: int = Field(
        1,
        ge=1,
        description="Data-parallel ranks added or removed together: the ranks of one follower "
        "pod (e.g. 4 for one 4-GPU GB200 node at TP1).",
        json_schema_extra=_extra("elastic"),
    )
    elastic_ep_min_dp: int = Field(
        1,
        ge=1,
        description="Smallest data-parallel size: the leader's ranks, never removed.",
        json_schema_extra=_extra("elastic"),
    )
    elastic_ep_max_dp: int | None = Field(
        None,
        ge=1,
        description="Largest data-parallel size (required with --elastic-ep).",
        json_schema_extra=_extra("elastic"),
    )
    elastic_ep_gpus_per_rank: int = Field(
        1,
        ge=1,
        description="GPUs per data-parallel rank: the engine's TP (EP size = DP x TP).",
        json_schema_extra=_extra("elastic"),
    )
    elastic_ep_drain_timeout_seconds: int = Field(
        120,
        ge=1,
        description="drain_timeout sent with each bare-vLLM resize: how long vLLM waits for "
        "in-flight requests before it gives the resize up with HTTP 408; vLLM waits only with "
        "VLLM_ELASTIC_EP_DRAIN_REQUESTS=1 (elastic_ep_engine_drains_requests) (s).",
        json_schema_extra=_extra("elastic"),
    )
    elastic_ep_resize_timeout_seconds: float = Field(
        900.0,
        gt=0,
        description="How long one resize call may run before the planner stops waiting for "
        "its answer and follows it until the engine is idle instead; also how long a resize "
        "in flight is waited for (s).",
        json_schema_extra=_extra("elastic"),
    )
    elastic_ep_admin_url: str | None = Field(
        None,
        description="Base URL of the engine's resize route: vLLM's API server (e.g. "
        "http://leader:8000) or a Dynamo vLLM worker's system port (an unauthenticated admin "
        "API: keep it off public networks).",
        json_schema_extra=_extra("elastic"),
    )
    elastic_ep_api: Literal["auto", "vllm", "dynamo"] = Field(
        "auto",
        description="Which resize route elastic_ep_admin_url serves: 'vllm' (vLLM's API server, "
        "/scale_elastic_ep), 'dynamo' (a Dynamo vLLM worker's system port, "
        "/engine/control/scale_elastic_ep), 'auto' (asked once at start).",
        json_schema_extra=_extra("elastic"),
    )
    elastic_ep_engine_drains_requests: bool = Field(
        False,
        description="The engine runs with VLLM_ELASTIC_EP_DRAIN_REQUESTS=1: only then does vLLM "
        "wait elastic_ep_drain_timeout_seconds for in-flight requests, and a 408 in that window "
        "leaves its size unchanged.",
        json_schema_extra=_extra("elastic"),
    )
    elastic_ep_ray_dashboard_url: str | None = Field(
        None,
        description="Ray dashboard of a bare-vLLM engine (e.g. http://leader:8265): a grow waits "
        "until the followers' GPUs have joined its Ray cluster, not only until the pods are "
        "Ready (Dynamo's worker reports this itself).",
        json_schema_extra=_extra("elastic"),
    )
    elastic_ep_follower_ready_seconds: float = Field(
        180.0,
        ge=0,
        description="Follower start-up plus Ray join time the grow lead time adds with "
        "elastic_ep_follower_service, until the planner has measured its own (s).",
        json_schema_extra=_extra("elastic"),
    )
    elastic_ep_frontend_retries: bool = Field(
        False,
        description="The frontend retries requests vLLM rejects (503) while a resize pauses "
        "serving: they are delayed, not lost, when the policy prices the pause.",
        json_schema_extra=_extra("elastic"),
    )
    elastic_ep_follower_service: str | None = Field(
        None,
        description="DGD service of the elastic-EP follower pods (parked at 0 replicas): "
        "raised before a grow, lowered after a shrink; unset: GPUs are managed elsewhere.",
        json_schema_extra=_extra("elastic"),
    )
    elastic_ep_timing: str | None = Field(
        None,
        description="Resize times measured on your deployment, replacing the mode's defaults: "
        "'UP_TOTAL,UP_DOWNTIME,DOWN_TOTAL,DOWN_DOWNTIME' in seconds.",
        json_schema_extra=_extra("elastic"),
    )
    elastic_ep_trend_window_seconds: float = Field(
        300.0,
        gt=0,
        description="Traffic history the elastic policy fits its load trend on (s).",
        json_schema_extra=_extra("elastic"),
    )
    elastic_ep_benefit_window_seconds: float = Field(
        600.0,
        gt=0,
        description="How far ahead the elastic policy counts the requests a scale-up saves "
        "from the SLO, against those its downtime costs (s).",
        json_schema_extra=_extra("elastic"),
    )
    # elastic EP as current vLLM and Dynamo run it (issue 32)
    elastic_ep_shrink_abort_budget: float = Field(
        0.0,
        ge=0,
        description="Requests a shrink may abort: vLLM aborts the in-flight requests of the "
        "ranks a shrink removes. A shrink expected to abort more waits for quieter traffic, or "
        "goes ahead when the engine drains first (elastic_ep_engine_drains_requests).",
        json_schema_extra=_extra("elastic"),
    )
    elastic_ep_grow_backoff_seconds: float = Field(
        300.0,
        gt=0,
        description="Wait after a failed grow (a Dynamo worker that restarted, a refused or "
        "unanswered resize) before the next grow; doubled per further failure, up to 8x; kept "
        "on the DGD so a restarted planner waits too (s).",
        json_schema_extra=_extra("elastic"),
    )
    elastic_ep_followers_only_when_claimed: bool = Field(
        False,
        description="When Dynamo's own elastic-EP reconciler drives the engine (its follower "
        "service '<leader>-flw'), scale only the follower replicas on a grow and leave the "
        "resize to it (shrinks are held: Dynamo defers follower removal), instead of refusing "
        "the DGD.",
        json_schema_extra=_extra("elastic"),
    )

    # --- metrics out and reports ------------------------------------------------------
    metric_reporting_prometheus_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Port of the planner's own /metrics, /healthz and /readyz (0 = off).",
        json_schema_extra=_extra("reporting", env=("PLANNER_PROMETHEUS_PORT",)),
    )
    report_interval_hours: float | None = Field(
        24.0,
        description="Write an HTML diagnostics report this often (hours); null disables.",
        json_schema_extra=_extra("reporting"),
    )
    report_output_dir: str = Field(
        "./planner_reports",
        description="Directory of the HTML diagnostics reports.",
        json_schema_extra=_extra("reporting"),
    )
    report_filename: str | None = Field(
        None,
        description="Fixed report file name instead of a timestamped one.",
        json_schema_extra=_extra("reporting"),
    )
    report_write_gzip_log: bool = Field(
        True,
        description="Write a gzip JSONL log of every tick next to each report.",
        json_schema_extra=_extra("reporting"),
    )
    # Diagnostics bounded by time and bytes (an operator runs for months).
    report_window_hours: float = Field(
        24.0,
        gt=0,
        allow_inf_nan=False,
        description="How far back the diagnostics keep ticks (hours): what a report shows, "
        "on demand (/report/<namespace>/<name> on the metrics port, planner report --live) "
        "or on schedule. Older ticks are dropped, so the memory they take stays bounded.",
        json_schema_extra=_extra("reporting"),
    )
    report_keep_files: int = Field(
        3,
        ge=1,
        description="Scheduled reports kept per deployment (each an HTML file and its log); "
        "older ones are deleted.",
        json_schema_extra=_extra("reporting"),
    )
    report_max_bytes: int = Field(
        768 * 1024 * 1024,
        ge=1024 * 1024,
        description="Bytes all reports under report_output_dir may take together (every "
        "deployment of the process); the oldest are deleted beyond it. Keep it below the "
        "volume's size (the Helm chart's reportsSizeLimit, 1 GiB).",
        json_schema_extra=_extra("reporting"),
    )

    # --- field rules --------------------------------------------------------------------
    @field_validator("model_name")
    @classmethod
    def _lower_model_name(cls, value: str | None) -> str | None:
        return value.lower() if value else value

    @field_validator("max_gpu_budget", "min_gpu_budget")
    @classmethod
    def _budget(cls, value: int) -> int:
        if value != -1 and value < 1:
            raise ValueError("must be -1 (no limit) or a positive number of GPUs")
        return value

    @field_validator("report_interval_hours")
    @classmethod
    def _report_interval(cls, value: float | None) -> float | None:
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ValueError("must be a positive, finite number of hours, or null")
        return value

    @field_validator("fpm_sample_bucket_size")
    @classmethod
    def _perfect_square(cls, value: int) -> int:
        if math.isqrt(value) ** 2 != value:
            raise ValueError("must be a perfect square (1, 4, 9, 16, ...)")
        return value

    @field_validator("prefill_fpm_endpoints", "decode_fpm_endpoints", mode="before")
    @classmethod
    def _zmq_endpoints(cls, value: Any) -> Any:
        if isinstance(value, str):  # flags and environment variables: "a,b"
            value = [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, list | tuple):
            for endpoint in value:
                if not (isinstance(endpoint, str) and _ZMQ_ENDPOINT.fullmatch(endpoint)):
                    raise ValueError(
                        f"{endpoint!r} is not a ZMQ endpoint such as tcp://10.0.0.5:20380 "
                        "or ipc:///tmp/fpm.sock"
                    )
        return value

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

    @field_validator("elastic_ep_timing")
    @classmethod
    def _elastic_ep_timing(cls, value: str | None) -> str | None:
        if value is not None:
            parse_elastic_ep_timing(value)
        return value

    @field_validator("elastic_ep_admin_url", "elastic_ep_ray_dashboard_url")
    @classmethod
    def _admin_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value.rstrip("/") if value else value

    @field_validator("metric_pulling_prometheus_endpoint", "virtual_etcd_endpoint")
    @classmethod
    def _endpoint_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _cross_field(self, info: ValidationInfo) -> PlannerConfig:
        if info.context and info.context.get("skip_cross_field"):
            return self
        problems = cross_field_problems(self)
        if problems:
            raise ValueError("; ".join(p.render() for p in problems))
        return self

    # --- derived ------------------------------------------------------------------------
    @property
    def throughput_scaling_active(self) -> bool:
        """Whether the throughput loop runs (Dynamo's easy modes turn it off)."""
        return self.optimization_target == "sla" and self.enable_throughput_scaling

    @property
    def load_scaling_active(self) -> bool:
        """Whether the load loop runs (Dynamo's easy modes always turn it on)."""
        return self.optimization_target != "sla" or self.enable_load_scaling

    @property
    def roles(self) -> tuple[str, ...]:
        """The roles this planner scales, in the order budgets are shared out."""
        return {
            "disagg": ("prefill", "decode"),
            "prefill": ("prefill",),
            "decode": ("decode",),
            "agg": ("agg",),
        }[self.mode]

    def min_endpoint_for(self, role: str) -> int:
        """The replica floor of ``role`` (per-role setting, else the global one)."""
        if role == "prefill" and self.prefill_min_endpoint is not None:
            return self.prefill_min_endpoint
        if role == "decode" and self.decode_min_endpoint is not None:
            return self.decode_min_endpoint
        return self.min_endpoint

    def engine_num_gpu_for(self, role: str) -> int | None:
        """GPUs per replica of ``role`` as configured (None: read from the deployment)."""
        return self.prefill_engine_num_gpu if role == "prefill" else self.decode_engine_num_gpu


def cross_field_problems(cfg: PlannerConfig) -> list[ConfigProblem]:
    """Rules that relate several fields; each problem names the field it blames."""
    problems: list[ConfigProblem] = []
    if not (cfg.throughput_scaling_active or cfg.load_scaling_active):
        problems.append(
            ConfigProblem(
                "enable_throughput_scaling",
                cfg.enable_throughput_scaling,
                "at least one scaling loop must be enabled (throughput or load)",
            )
        )
    if (
        cfg.throughput_scaling_active
        and cfg.load_scaling_active
        and cfg.load_adjustment_interval_seconds >= cfg.throughput_adjustment_interval_seconds
    ):
        problems.append(
            ConfigProblem(
                "load_adjustment_interval_seconds",
                cfg.load_adjustment_interval_seconds,
                "must be shorter than throughput_adjustment_interval_seconds "
                f"({cfg.throughput_adjustment_interval_seconds:g}) when both loops run",
            )
        )
    if (
        cfg.throughput_scaling_active
        and "fast_check_interval_seconds" in cfg.model_fields_set  # the default adapts
        and cfg.fast_check_interval_seconds is not None
        and cfg.fast_check_interval_seconds >= cfg.throughput_adjustment_interval_seconds
    ):
        problems.append(
            ConfigProblem(
                "fast_check_interval_seconds",
                cfg.fast_check_interval_seconds,
                "must be shorter than throughput_adjustment_interval_seconds "
                f"({cfg.throughput_adjustment_interval_seconds:g}), or null to turn the fast "
                "path off",
            )
        )
    if cfg.speculative_accept_length is not None and cfg.num_speculative_tokens is None:
        problems.append(
            ConfigProblem(
                "speculative_accept_length",
                cfg.speculative_accept_length,
                "needs num_speculative_tokens (the draft tokens per step that bound it)",
            )
        )
    elif (
        cfg.speculative_accept_length is not None
        and cfg.num_speculative_tokens is not None
        and cfg.speculative_accept_length > cfg.num_speculative_tokens + 1
    ):
        problems.append(
            ConfigProblem(
                "speculative_accept_length",
                cfg.speculative_accept_length,
                f"must be <= num_speculative_tokens + 1 ({cfg.num_speculative_tokens + 1})",
            )
        )
    if -1 not in (cfg.min_gpu_budget, cfg.max_gpu_budget) and (
        cfg.min_gpu_budget > cfg.max_gpu_budget
    ):
        problems.append(
            ConfigProblem(
                "min_gpu_budget",
                cfg.min_gpu_budget,
                f"must not exceed max_gpu_budget ({cfg.max_gpu_budget})",
            )
        )
    roles = cfg.roles
    if cfg.prefill_min_endpoint is not None and "prefill" not in roles:
        problems.append(
            ConfigProblem(
                "prefill_min_endpoint",
                cfg.prefill_min_endpoint,
                f"is only allowed in modes with a prefill role, not mode={cfg.mode}",
            )
        )
    if cfg.decode_min_endpoint is not None and "decode" not in roles:
        problems.append(
            ConfigProblem(
                "decode_min_endpoint",
                cfg.decode_min_endpoint,
                f"is only allowed in modes with a decode role, not mode={cfg.mode}",
            )
        )
    if cfg.max_gpu_budget != -1:
        footprint = 0
        known = True
        for role in roles:
            gpus = cfg.engine_num_gpu_for(role)
            if gpus is None:
                known = False
                gpus = 1  # the smallest possible engine: a lower bound of the footprint
            footprint += cfg.min_endpoint_for(role) * gpus
        if footprint > cfg.max_gpu_budget:
            detail = "" if known else " (counting 1 GPU per replica where not configured)"
            problems.append(
                ConfigProblem(
                    "max_gpu_budget",
                    cfg.max_gpu_budget,
                    f"is below the GPUs the minimum endpoints need ({footprint}){detail}",
                )
            )
    if cfg.environment == "virtual" and cfg.throughput_scaling_active:
        for role in roles:
            if cfg.engine_num_gpu_for(role) is None:
                field = "prefill_engine_num_gpu" if role == "prefill" else "decode_engine_num_gpu"
                problems.append(
                    ConfigProblem(
                        field,
                        None,
                        "is required with environment=virtual "
                        "(there is no deployment to read it from)",
                    )
                )
    problems.extend(_elastic_ep_problems(cfg))
    if cfg.metric_pulling_prometheus_token and cfg.metric_pulling_prometheus_token_file:
        problems.append(
            ConfigProblem(
                "metric_pulling_prometheus_token_file",
                cfg.metric_pulling_prometheus_token_file,
                "give either a token or a token file, not both",
            )
        )
    return problems


def parse_elastic_ep_timing(text: str) -> tuple[float, float, float, float]:
    """``'UP_TOTAL,UP_DOWNTIME,DOWN_TOTAL,DOWN_DOWNTIME'`` (seconds) -> four floats.

    Raises ValueError naming the item and what was expected.
    """
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 4:
        raise ValueError(
            f"{text!r}: expected four comma-separated seconds "
            "UP_TOTAL,UP_DOWNTIME,DOWN_TOTAL,DOWN_DOWNTIME"
        )
    names = ("UP_TOTAL", "UP_DOWNTIME", "DOWN_TOTAL", "DOWN_DOWNTIME")
    values: list[float] = []
    for name, part in zip(names, parts, strict=True):
        try:
            value = float(part)
        except ValueError:
            raise ValueError(f"{name} = {part!r} is not a number of seconds") from None
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} = {part!r} must be a finite number >= 0")
        values.append(value)
    up_total, up_down, down_total, down_down = values
    return up_total, up_down, down_total, down_down


def _elastic_ep_problems(cfg: PlannerConfig) -> list[ConfigProblem]:
    """Rules of the elastic-EP settings (only checked when a role is elastic)."""
    if cfg.elastic_ep is None:
        return []
    problems: list[ConfigProblem] = []
    if cfg.elastic_ep not in cfg.roles:
        problems.append(
            ConfigProblem(
                "elastic_ep",
                cfg.elastic_ep,
                f"must be a role this planner scales ({', '.join(cfg.roles)}, mode={cfg.mode})",
            )
        )
    if cfg.elastic_ep_max_dp is None:
        problems.append(
            ConfigProblem("elastic_ep_max_dp", None, "is required when elastic_ep is set")
        )
    elif cfg.elastic_ep_max_dp < cfg.elastic_ep_min_dp:
        problems.append(
            ConfigProblem(
                "elastic_ep_max_dp",
                cfg.elastic_ep_max_dp,
                f"must not be below elastic_ep_min_dp ({cfg.elastic_ep_min_dp})",
            )
        )
    elif (cfg.elastic_ep_max_dp - cfg.elastic_ep_min_dp) % cfg.elastic_ep_dp_step:
        problems.append(
            ConfigProblem(
                "elastic_ep_max_dp",
                cfg.elastic_ep_max_dp,
                f"must be elastic_ep_min_dp ({cfg.elastic_ep_min_dp}) plus a whole number of "
                f"elastic_ep_dp_step ({cfg.elastic_ep_dp_step}) ranks",
            )
        )
    if cfg.elastic_ep_api == "dynamo":
        # Dynamo's route takes no drain_timeout and reports joined GPUs itself.
        for name in ("elastic_ep_drain_timeout_seconds", "elastic_ep_ray_dashboard_url"):
            if name in cfg.model_fields_set:
                problems.append(
                    ConfigProblem(
                        name,
                        getattr(cfg, name),
                        "is not used with elastic_ep_api=dynamo (the worker's route takes no "
                        "drain_timeout and reports joined GPUs through ep_capacity)",
                    )
                )
    elif (
        "elastic_ep_drain_timeout_seconds" in cfg.model_fields_set
        and not cfg.elastic_ep_engine_drains_requests
    ):
        problems.append(
            ConfigProblem(
                "elastic_ep_drain_timeout_seconds",
                cfg.elastic_ep_drain_timeout_seconds,
                "is honoured by vLLM only with VLLM_ELASTIC_EP_DRAIN_REQUESTS=1; set that on "
                "the engine and elastic_ep_engine_drains_requests=true",
            )
        )
    if cfg.elastic_ep_follower_service is not None and cfg.environment != "kubernetes":
        problems.append(
            ConfigProblem(
                "elastic_ep_follower_service",
                cfg.elastic_ep_follower_service,
                "needs environment=kubernetes (the followers are a DGD service)",
            )
        )
    return problems
