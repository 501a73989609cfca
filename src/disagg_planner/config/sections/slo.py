"""SLOs and scaling loops: the TTFT/ITL targets, which loops run and how often, and the
rules the throughput loop sizes replicas by."""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, BaseModel, Field

from disagg_planner.config.sections.meta import field_meta

OptimizationTarget = Literal["sla", "throughput", "latency", "load"]


class SloSection(BaseModel):
    """The latency targets, the loops that meet them and the throughput loop's sizing."""

    ttft_ms: float = Field(
        500.0,
        gt=0,
        validation_alias=AliasChoices("ttft_ms", "ttft"),
        description="Time-to-first-token target in milliseconds.",
        json_schema_extra=field_meta("slo"),
    )
    itl_ms: float = Field(
        50.0,
        gt=0,
        validation_alias=AliasChoices("itl_ms", "itl"),
        description="Inter-token latency target in milliseconds.",
        json_schema_extra=field_meta("slo"),
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
        json_schema_extra=field_meta("slo"),
    )
    enable_throughput_scaling: bool = Field(
        True,
        description="Run the throughput-based loop (forecast + profile sizing).",
        json_schema_extra=field_meta("slo"),
    )
    enable_load_scaling: bool = Field(
        False,
        validation_alias=AliasChoices(
            "enable_load_scaling", "enable_loadbased_scaling", "enable_load_based_scaling"
        ),
        description="Run the load-based loop (per-iteration engine metrics, +-1 steps).",
        json_schema_extra=field_meta("slo"),
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
        json_schema_extra=field_meta("slo"),
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
        json_schema_extra=field_meta("slo"),
    )
    ttft_attainment_target: float | None = Field(
        0.99,
        gt=0,
        lt=1,
        description="Share of requests whose TTFT must meet the target: prefill is sized "
        "with the queueing headroom this needs (GI/G/1 waiting-time tail) instead of at 100 % "
        "utilisation as Dynamo does; null sizes at the profiled throughput.",
        json_schema_extra=field_meta("slo"),
    )
    no_correction: bool = Field(
        False,
        description="Do not correct profiled capacity by observed/expected TTFT and ITL.",
        json_schema_extra=field_meta("slo"),
    )
    max_throughput_scaling_replicas: int = Field(
        8,
        ge=1,
        description="Largest change of one role's replicas in one throughput tick.",
        json_schema_extra=field_meta("slo"),
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
        json_schema_extra=field_meta("slo"),
    )
    replica_startup_seconds: float = Field(
        120.0,
        ge=0,
        description="Time from ordering a replica to its serving, assumed until the planner "
        "has measured it (its own scale-ups, decision to ready): each decision sizes for the "
        "load expected over [now + time-to-ready, now + time-to-ready + interval].",
        json_schema_extra=field_meta("slo"),
    )
    fast_check_interval_seconds: float | None = Field(
        15.0,
        gt=0,
        description="Period of the fast path between throughput ticks: a Prometheus-only check "
        "of the frontend's recent TTFT tail, in-flight requests and arrival rate that scales "
        "up at once, by what the observed demand and backlog need, when the SLO is at risk; "
        "its windows also give the burst statistics. null turns it off; the default is "
        "skipped when the throughput interval is not longer (a set value must be shorter).",
        json_schema_extra=field_meta("slo"),
    )
    burst_quantile: float | None = Field(
        0.9,
        gt=0,
        lt=1,
        description="Size prefill for this upper quantile of the short-window (fast-check) "
        "arrival rate relative to its interval's level (its mean, or its trend where the rate "
        "rose or fell steadily through it), instead of the mean; null sizes for the mean.",
        json_schema_extra=field_meta("slo"),
    )
    burst_memory_seconds: float | None = Field(
        1800.0,
        gt=0,
        description="Learn from bursts already seen: once the short-window arrival rate has "
        "risen more than twofold within one time-to-ready (faster than new capacity can "
        "follow), keep capacity for the highest short-window rate of this many past seconds "
        "as a floor, instead of dropping to the quiet level before the next burst; forgotten "
        "this long after the last such rise. null turns it off.",
        json_schema_extra=field_meta("slo"),
    )
    backlog_drain_seconds: float = Field(
        60.0,
        gt=0,
        description="The work already waiting (in-flight requests beyond what the arrival "
        "rate and request duration explain, or FPM's queued prefill tokens) is added to the "
        "demand as that many tokens over this many seconds.",
        json_schema_extra=field_meta("slo"),
    )
    prefill_length_mix: bool = Field(
        True,
        description="Size prefill for the observed prompt lengths (the frontend's ISL "
        "histogram: each length at its own profiled throughput), not for as many prompts of "
        "the mean length; long prompts run at a lower throughput per GPU, so a mix with long "
        "prompts needs more prefill than its mean says. false sizes at the mean ISL.",
        json_schema_extra=field_meta("slo"),
    )
    prefill_queueing: Literal["pooled", "per_engine"] = Field(
        "pooled",
        description="Queueing model of the prefill headroom: 'pooled' (one GI/G/c queue over "
        "all engines, Erlang C; the router spreads requests over them) or 'per_engine' (a "
        "GI/G/1 queue per engine, more conservative).",
        json_schema_extra=field_meta("slo"),
    )
    prefill_batching: bool = Field(
        False,
        description="Size prefill engines at the throughput they reach under load, each "
        "iteration filled with several prompts up to the engine's max_num_batched_tokens "
        "(the config's, else the profiled engine's, else what the engines publish, else "
        "8192): the fixed cost and the GEMMs are shared by the chunk's prompts, attention "
        "stays within each (the profile's own prefill cost fit). A profile times one prompt "
        "at a time, which understates a loaded engine by about 20% at 2000-token prompts and "
        "3x at 250; each prompt's own TTFT stays as profiled. Off by default: that "
        "understatement is headroom the planner still relies on against rises no forecast "
        "saw (benchmarks/scorecard.py --policy planner --variant prefill_batching=true loses "
        "requests on the Azure workload). false: the lone-prompt throughput, as Dynamo's "
        "planner sizes.",
        json_schema_extra=field_meta("slo"),
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
        json_schema_extra=field_meta("slo"),
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
        json_schema_extra=field_meta("slo"),
    )
    speculative_accept_length: float | None = Field(
        None,
        ge=1,
        validation_alias=AliasChoices("speculative_accept_length", "accept_length"),
        description="Mean tokens a sequence emits per decode step with speculative decoding "
        "(1 + accepted drafts). null: the observed one, 1 until seen. Needs "
        "num_speculative_tokens.",
        json_schema_extra=field_meta("slo"),
    )
    scaling_convergence_timeout_seconds: float = Field(
        600.0,
        gt=0,
        description="How long to wait for replicas to become ready after a change before "
        "re-planning from what is observed.",
        json_schema_extra=field_meta("slo"),
    )

    @property
    def throughput_scaling_active(self) -> bool:
        """Whether the throughput loop runs (Dynamo's easy modes turn it off)."""
        return self.optimization_target == "sla" and self.enable_throughput_scaling

    @property
    def load_scaling_active(self) -> bool:
        """Whether the load loop runs (Dynamo's easy modes always turn it on)."""
        return self.optimization_target != "sla" or self.enable_load_scaling
