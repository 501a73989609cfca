"""Elastic expert parallelism (docs/elastic-ep.md): resizing one role's data-parallel size
instead of its replicas."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, Field, field_validator

from disagg_planner.config.sections.meta import field_meta, http_url


class ElasticEpSection(BaseModel):
    """Which role is elastic, its data-parallel range, the engine's admin API and the resize
    policy's windows."""

    elastic_ep: Literal["prefill", "decode", "agg"] | None = Field(
        None,
        description="Role whose capacity changes by resizing its engine's data-parallel (and "
        "expert-parallel) size in place with vLLM elastic EP, instead of its replica count.",
        json_schema_extra=field_meta("elastic"),
    )
    elastic_ep_mode: Literal["blocking", "async", "nixl"] = Field(
        "nixl",
        description="How the engine resizes: 'blocking' (serving paused for the whole resize), "
        "'async' (background preparation, paused for warm-up), 'nixl' (async with NIXL EP, "
        "paused ~1-2 s); sets the resize's lead time and downtime cost.",
        json_schema_extra=field_meta("elastic"),
    )
    elastic_ep_dp_step: int = Field(
        1,
        ge=1,
        description="Data-parallel ranks added or removed together: the ranks of one follower "
        "pod (e.g. 4 for one 4-GPU GB200 node at TP1).",
        json_schema_extra=field_meta("elastic"),
    )
    elastic_ep_min_dp: int = Field(
        1,
        ge=1,
        description="Smallest data-parallel size: the leader's ranks, never removed.",
        json_schema_extra=field_meta("elastic"),
    )
    elastic_ep_max_dp: int | None = Field(
        None,
        ge=1,
        description="Largest data-parallel size (required with --elastic-ep).",
        json_schema_extra=field_meta("elastic"),
    )
    elastic_ep_gpus_per_rank: int = Field(
        1,
        ge=1,
        description="GPUs per data-parallel rank: the engine's TP (EP size = DP x TP).",
        json_schema_extra=field_meta("elastic"),
    )
    elastic_ep_drain_timeout_seconds: int = Field(
        120,
        ge=1,
        description="drain_timeout sent with each bare-vLLM resize: how long vLLM waits for "
        "in-flight requests before it gives the resize up with HTTP 408; vLLM waits only with "
        "VLLM_ELASTIC_EP_DRAIN_REQUESTS=1 (elastic_ep_engine_drains_requests) (s).",
        json_schema_extra=field_meta("elastic"),
    )
    elastic_ep_resize_timeout_seconds: float = Field(
        900.0,
        gt=0,
        description="How long one resize call may run before the planner stops waiting for "
        "its answer and follows it until the engine is idle instead; also how long a resize "
        "in flight is waited for (s).",
        json_schema_extra=field_meta("elastic"),
    )
    elastic_ep_admin_url: str | None = Field(
        None,
        description="Base URL of the engine's resize route: vLLM's API server (e.g. "
        "http://leader:8000) or a Dynamo vLLM worker's system port (an unauthenticated admin "
        "API: keep it off public networks).",
        json_schema_extra=field_meta("elastic"),
    )
    elastic_ep_api: Literal["auto", "vllm", "dynamo"] = Field(
        "auto",
        description="Which resize route elastic_ep_admin_url serves: 'vllm' (vLLM's API server, "
        "/scale_elastic_ep), 'dynamo' (a Dynamo vLLM worker's system port, "
        "/engine/control/scale_elastic_ep), 'auto' (asked once at start).",
        json_schema_extra=field_meta("elastic"),
    )
    elastic_ep_engine_drains_requests: bool = Field(
        False,
        description="The engine runs with VLLM_ELASTIC_EP_DRAIN_REQUESTS=1: only then does vLLM "
        "wait elastic_ep_drain_timeout_seconds for in-flight requests, and a 408 in that window "
        "leaves its size unchanged.",
        json_schema_extra=field_meta("elastic"),
    )
    elastic_ep_ray_dashboard_url: str | None = Field(
        None,
        description="Ray dashboard of a bare-vLLM engine (e.g. http://leader:8265): a grow waits "
        "until the followers' GPUs have joined its Ray cluster, not only until the pods are "
        "Ready (Dynamo's worker reports this itself).",
        json_schema_extra=field_meta("elastic"),
    )
    elastic_ep_follower_ready_seconds: float = Field(
        180.0,
        ge=0,
        description="Follower start-up plus Ray join time the grow lead time adds with "
        "elastic_ep_follower_service, until the planner has measured its own (s).",
        json_schema_extra=field_meta("elastic"),
    )
    elastic_ep_frontend_retries: bool = Field(
        False,
        description="The frontend retries requests vLLM rejects (503) while a resize pauses "
        "serving: they are delayed, not lost, when the policy prices the pause.",
        json_schema_extra=field_meta("elastic"),
    )
    elastic_ep_follower_service: str | None = Field(
        None,
        description="DGD service of the elastic-EP follower pods (parked at 0 replicas): "
        "raised before a grow, lowered after a shrink; unset: GPUs are managed elsewhere.",
        json_schema_extra=field_meta("elastic"),
    )
    elastic_ep_timing: str | None = Field(
        None,
        description="Resize times measured on your deployment, replacing the mode's defaults: "
        "'UP_TOTAL,UP_DOWNTIME,DOWN_TOTAL,DOWN_DOWNTIME' in seconds.",
        json_schema_extra=field_meta("elastic"),
    )
    elastic_ep_trend_window_seconds: float = Field(
        300.0,
        gt=0,
        description="Traffic history the elastic policy fits its load trend on (s).",
        json_schema_extra=field_meta("elastic"),
    )
    elastic_ep_benefit_window_seconds: float = Field(
        600.0,
        gt=0,
        description="How far ahead the elastic policy counts the requests a scale-up saves "
        "from the SLO, against those its downtime costs (s).",
        json_schema_extra=field_meta("elastic"),
    )
    # elastic EP as current vLLM and Dynamo run it (issue 32)
    elastic_ep_shrink_abort_budget: float = Field(
        0.0,
        ge=0,
        description="Requests a shrink may abort: vLLM aborts the in-flight requests of the "
        "ranks a shrink removes. A shrink expected to abort more waits for quieter traffic, or "
        "goes ahead when the engine drains first (elastic_ep_engine_drains_requests).",
        json_schema_extra=field_meta("elastic"),
    )
    elastic_ep_grow_backoff_seconds: float = Field(
        300.0,
        gt=0,
        description="Wait after a failed grow (a Dynamo worker that restarted, a refused or "
        "unanswered resize) before the next grow; doubled per further failure, up to 8x; kept "
        "on the DGD so a restarted planner waits too (s).",
        json_schema_extra=field_meta("elastic"),
    )
    elastic_ep_followers_only_when_claimed: bool = Field(
        False,
        description="When Dynamo's own elastic-EP reconciler drives the engine (its follower "
        "service '<leader>-flw'), scale only the follower replicas on a grow and leave the "
        "resize to it (shrinks are held: Dynamo defers follower removal), instead of refusing "
        "the DGD.",
        json_schema_extra=field_meta("elastic"),
    )

    @field_validator("elastic_ep_timing")
    @classmethod
    def _elastic_ep_timing(cls, value: str | None) -> str | None:
        if value is not None:
            parse_elastic_ep_timing(value)
        return value

    @field_validator("elastic_ep_admin_url", "elastic_ep_ray_dashboard_url")
    @classmethod
    def _admin_url(cls, value: str | None) -> str | None:
        return None if value is None else http_url(value)


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
