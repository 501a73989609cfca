"""Names of the traffic metrics Dynamo's frontend (and router) export, and their labels.

This is the one table of metric names: the simulator emits them, the Prometheus observer
queries them, tests serve them. Histograms expose ``<name>_sum``, ``<name>_count`` and
``<name>_bucket``; counters end in ``_total``.
"""

from __future__ import annotations

from dataclasses import dataclass

MODEL_LABEL = "model"
NAMESPACE_LABEL = "dynamo_namespace"


@dataclass(frozen=True)
class TrafficMetricNames:
    """The metric family of each traffic input, for one source (frontend or router)."""

    requests_started: str
    requests_finished: str
    ttft_seconds: str
    itl_seconds: str
    request_duration_seconds: str
    input_tokens: str
    output_tokens: str
    # The KV router's share of each request's prompt blocks already cached on the worker it
    # chose (a histogram of ratios in [0, 1]); absent where no KV router runs.
    kv_hit_rate: str = ""


# Exported by the KV router, whether it runs inside the frontend or as its own component.
ROUTER_KV_HIT_RATE = "dynamo_component_router_kv_hit_rate"

FRONTEND = TrafficMetricNames(
    requests_started="dynamo_frontend_requests_started_total",
    # Completed requests: the fallback count, which undercounts demand under backpressure.
    requests_finished="dynamo_frontend_requests_total",
    ttft_seconds="dynamo_frontend_time_to_first_token_seconds",
    itl_seconds="dynamo_frontend_inter_token_latency_seconds",
    request_duration_seconds="dynamo_frontend_request_duration_seconds",
    input_tokens="dynamo_frontend_input_sequence_tokens",
    output_tokens="dynamo_frontend_output_sequence_tokens",
    kv_hit_rate=ROUTER_KV_HIT_RATE,
)

ROUTER = TrafficMetricNames(
    requests_started="dynamo_component_router_requests_total",
    requests_finished="dynamo_component_router_requests_total",
    ttft_seconds="dynamo_component_router_time_to_first_token_seconds",
    itl_seconds="dynamo_component_router_inter_token_latency_seconds",
    request_duration_seconds="dynamo_component_request_duration_seconds",
    input_tokens="dynamo_component_router_input_sequence_tokens",
    output_tokens="dynamo_component_router_output_sequence_tokens",
    kv_hit_rate=ROUTER_KV_HIT_RATE,
)

SOURCES: dict[str, TrafficMetricNames] = {"frontend": FRONTEND, "router": ROUTER}

# vLLM's speculative-decoding counters, exported by the decode (and aggregated) engines,
# whichever traffic source is read; Dynamo's planner reads the same two
# (``get_avg_spec_decode_accept_length``): one draft per sequence per speculative step, and
# the draft tokens the target model kept, so the mean tokens a sequence emits per step is
# ``1 + increase(accepted) / increase(drafts)``. Read with the traffic selector (model,
# namespace); absent where no engine speculates.
SPEC_DECODE_ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens_total"
SPEC_DECODE_DRAFTS = "vllm:spec_decode_num_drafts_total"


@dataclass(frozen=True)
class EngineCounter:
    """One counter of an engine's speculative-decoding set: its name, extra label matchers
    (exact values) and the tag of its increase in the observer's query."""

    name: str
    part: str
    labels: tuple[tuple[str, str], ...] = ()

    @property
    def shown(self) -> str:
        """The counter as messages name it, e.g. ``x_total{token_position="0"}``."""
        inner = ",".join(f'{k}="{v}"' for k, v in self.labels)
        return f"{self.name}{{{inner}}}" if inner else self.name


@dataclass(frozen=True)
class SpecDecodeCounters:
    """One engine's speculative-decoding counters, from which the accept length (the tokens
    a sequence emits per speculative step, the bonus token included) over a window is
    ``A = 1 + accepted / steps``: ``steps`` counts one per sequence per speculative step,
    ``accepted`` is the signed sum of the ``accepted`` counters' increases (the draft tokens
    kept). ``generic`` counters exist whether or not the engine speculates: only the others'
    series say that it does."""

    engine: str
    steps: EngineCounter
    accepted: tuple[tuple[float, EngineCounter], ...]
    generic: tuple[EngineCounter, ...] = ()

    @property
    def counters(self) -> tuple[EngineCounter, ...]:
        return tuple(dict.fromkeys((self.steps, *(c for _, c in self.accepted))))


_VLLM_DRAFTS = EngineCounter(SPEC_DECODE_DRAFTS, "spec_drafts")
# SGLang (python/sglang/srt/metrics/collector.py, TokenizerMetricsCollector): per finished
# request, its verify passes (one speculative step each), its output tokens and the request;
# the first output token comes from prefill, every verify pass emits 1 + the drafts kept, so
# accepted = generated - requests - verify passes. (Its gauge sglang:spec_accept_length is
# the last batch's, not a window's mean: not read.)
_SGLANG_VERIFY = EngineCounter("sglang:spec_verify_calls_total", "spec_sglang_verify")
_SGLANG_GENERATED = EngineCounter("sglang:generation_tokens_total", "spec_sglang_generated")
_SGLANG_REQUESTS = EngineCounter("sglang:num_requests_total", "spec_sglang_requests")
# TensorRT-LLM (tensorrt_llm/metrics/collector.py, MetricsCollector, with
# return_perf_metrics): per finished request, the drafted and accepted draft tokens of each
# draft position (label token_position); position 0 is drafted once per speculative step.
# (Its iteration counters trtllm_spec_decode_num_{draft,accepted}_tokens_total count draft
# tokens, not steps: they give the accept length only with a fixed draft length.)
_TRTLLM_DRAFTED_FIRST = EngineCounter(
    "trtllm_spec_decode_drafted_tokens_total",
    "spec_trtllm_drafted_first",
    (("token_position", "0"),),
)
_TRTLLM_ACCEPTED = EngineCounter("trtllm_spec_decode_accepted_tokens_total", "spec_trtllm_accepted")

SPEC_DECODE_ENGINES: tuple[SpecDecodeCounters, ...] = (
    SpecDecodeCounters(
        "vllm",
        _VLLM_DRAFTS,
        ((1.0, EngineCounter(SPEC_DECODE_ACCEPTED_TOKENS, "spec_accepted")),),
    ),
    SpecDecodeCounters(
        "sglang",
        _SGLANG_VERIFY,
        ((1.0, _SGLANG_GENERATED), (-1.0, _SGLANG_REQUESTS), (-1.0, _SGLANG_VERIFY)),
        generic=(_SGLANG_GENERATED, _SGLANG_REQUESTS),
    ),
    SpecDecodeCounters("trtllm", _TRTLLM_DRAFTED_FIRST, ((1.0, _TRTLLM_ACCEPTED),)),
)
# every counter of the table once, by its query tag
SPEC_DECODE_COUNTERS: dict[str, EngineCounter] = {
    c.part: c for e in SPEC_DECODE_ENGINES for c in e.counters
}

# Histogram bucket bounds the simulator and test exporters use. Production frontends have
# their own; the observer reads whatever `le` values it finds.
TTFT_BUCKETS_S: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
ITL_BUCKETS_S: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.015,
    0.02,
    0.025,
    0.035,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    1.0,
)
# The KV router's hit-rate histogram observes ratios in [0, 1].
KV_HIT_BUCKETS: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
DURATION_BUCKETS_S: tuple[float, ...] = (0.1, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)
TOKEN_BUCKETS: tuple[float, ...] = (
    16,
    32,
    64,
    128,
    256,
    512,
    1024,
    2048,
    4096,
    8192,
    16384,
    32768,
    65536,
    131072,
)
