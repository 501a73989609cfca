"""Load-based scaling: the loop that steps replicas by the TTFT/ITL it estimates per engine
from the ForwardPassMetrics, and where those metrics come from."""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import AliasChoices, BaseModel, Field, field_validator

from disagg_planner.config.sections.meta import field_meta

_ZMQ_ENDPOINT = re.compile(r"tcp://[^\s:/]+:\d{1,5}|tcp://\[[0-9a-fA-F:]+\]:\d{1,5}|ipc://\S+")


class LoadSection(BaseModel):
    """The load loop, its regression's samples and the engines' ForwardPassMetrics."""

    load_scaling_down_sensitivity: int = Field(
        80,
        ge=0,
        le=100,
        validation_alias=AliasChoices(
            "load_scaling_down_sensitivity", "loadbased_scaling_down_sensitivity"
        ),
        description="0 never scales down on load, 100 scales down as soon as the estimates allow.",
        json_schema_extra=field_meta("load"),
    )
    load_min_observations: int = Field(
        5,
        ge=1,
        validation_alias=AliasChoices("load_min_observations", "loadbased_min_observations"),
        description="Iteration samples before the wall-time regression is trusted.",
        json_schema_extra=field_meta("load"),
    )
    max_num_fpm_samples: int = Field(
        64,
        ge=4,
        description="Iteration samples kept per regression model.",
        json_schema_extra=field_meta("load"),
    )
    fpm_sample_bucket_size: int = Field(
        16,
        ge=1,
        description="Buckets over the load range used to retire old samples (a perfect "
        "square, so 2-D models get sqrt buckets per axis).",
        json_schema_extra=field_meta("load"),
    )
    fpm_warmup_iterations: int = Field(
        10,
        ge=0,
        description="An engine's first iterations after it starts (cold caches, graph "
        "capture) that are not regression samples.",
        json_schema_extra=field_meta("load"),
    )
    fpm_staleness_seconds: float = Field(
        10.0,
        gt=0,
        description="An engine that sent no ForwardPassMetrics (idle engines heartbeat every "
        "second) for this long is treated as gone (s).",
        json_schema_extra=field_meta("load"),
    )
    prefill_fpm_endpoints: tuple[str, ...] = Field(
        (),
        description="ZMQ endpoints (tcp://host:port, one per DP rank) of the prefill "
        "engines' ForwardPassMetrics publishers, comma-separated; default: discovered.",
        json_schema_extra=field_meta("load"),
    )
    decode_fpm_endpoints: tuple[str, ...] = Field(
        (),
        description="ZMQ endpoints of the decode (or aggregated) engines' ForwardPassMetrics "
        "publishers, comma-separated; default: discovered.",
        json_schema_extra=field_meta("load"),
    )
    max_num_batched_tokens: int | None = Field(
        None,
        ge=1,
        description="Engine token budget per iteration; default: the DynamoWorkerMetadata, "
        "else 8192.",
        json_schema_extra=field_meta("load"),
    )
    max_num_seqs: int | None = Field(
        None,
        ge=1,
        description="Most requests in an engine's running batch; default: the "
        "DynamoWorkerMetadata, else 512.",
        json_schema_extra=field_meta("load"),
    )
    max_kv_tokens: int | None = Field(
        None,
        ge=1,
        description="KV cache capacity of one engine in tokens; default: the "
        "DynamoWorkerMetadata, else unknown (KV checks skipped).",
        json_schema_extra=field_meta("load"),
    )

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
