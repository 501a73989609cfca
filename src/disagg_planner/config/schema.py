"""``PlannerConfig``: the one definition of every planner setting.

Each field carries its type, default, validation and help text; command-line flags,
environment variables, ``config show`` and the CRD and Helm schemas are generated from it.
Field names follow Dynamo's newest planner config; Dynamo's older names are accepted as
aliases so that a Dynamo user's JSON or YAML config loads unchanged.

The fields live in ``config/sections/``, one file per ``--help`` group, each with the rules
of its own fields; this file assembles them and holds the rules that relate fields of
several sections (``cross_field_problems``).
"""

from __future__ import annotations

from pydantic import ConfigDict, ValidationInfo, model_validator

from disagg_planner.config.sections.budget import BudgetSection
from disagg_planner.config.sections.deployment import DeploymentSection
from disagg_planner.config.sections.elastic_ep import ElasticEpSection
from disagg_planner.config.sections.load import LoadSection
from disagg_planner.config.sections.prediction import PredictionSection
from disagg_planner.config.sections.profile import ProfileSection
from disagg_planner.config.sections.prometheus import PrometheusSection
from disagg_planner.config.sections.reporting import ReportingSection
from disagg_planner.config.sections.slo import SloSection
from disagg_planner.errors import ConfigProblem

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


# pydantic lists the fields of the last base first: the sections are named here in the reverse
# of the order the schema, the flags, `config show` and the CRD list them (deployment first).
class PlannerConfig(
    ReportingSection,
    ElasticEpSection,
    LoadSection,
    PrometheusSection,
    ProfileSection,
    PredictionSection,
    BudgetSection,
    SloSection,
    DeploymentSection,
):
    """Every setting of one planner (one managed DynamoGraphDeployment)."""

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        validate_default=True,
        frozen=True,
    )

    @model_validator(mode="after")
    def _cross_field(self, info: ValidationInfo) -> PlannerConfig:
        if info.context and info.context.get("skip_cross_field"):
            return self
        problems = cross_field_problems(self)
        if problems:
            raise ValueError("; ".join(p.render() for p in problems))
        return self


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
