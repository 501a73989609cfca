"""ForwardPassMetrics (FPM): what an engine reports about each scheduler iteration.

Wire format: msgpack maps keyed by field name, as Dynamo's ``dynamo.common.forward_pass_metrics``
version 1 encodes them (plain msgspec Structs; unknown keys such as the native-vLLM copy's
``timing_scope`` are ignored). Positional msgpack arrays in field order are accepted too. One
message per iteration, plus an idle heartbeat (``wall_time == 0``) when an engine goes idle.
Decoding never raises to the caller's loop: :func:`decode` returns an :class:`FpmDecodeError`
describing the bad frame.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import msgspec

FPM_VERSION = 1
SUPPORTED_VERSIONS = frozenset({FPM_VERSION})


class ScheduledRequestMetrics(msgspec.Struct, frozen=True):
    """Work the engine ran in this iteration."""

    num_prefill_requests: int = 0
    sum_prefill_tokens: int = 0  # tokens freshly computed this iteration
    var_prefill_length: float = 0.0
    sum_prefill_kv_tokens: int = 0  # context read by those prefills (cache hits, prior chunks)
    num_decode_requests: int = 0
    sum_decode_kv_tokens: int = 0  # prompt + generated context of the decoding requests
    var_decode_kv_tokens: float = 0.0


class QueuedRequestMetrics(msgspec.Struct, frozen=True):
    """Work waiting in the engine at the end of this iteration."""

    num_prefill_requests: int = 0
    sum_prefill_tokens: int = 0
    var_prefill_length: float = 0.0
    num_decode_requests: int = 0  # preempted requests waiting to resume
    sum_decode_kv_tokens: int = 0
    var_decode_kv_tokens: float = 0.0


class ForwardPassMetrics(msgspec.Struct, frozen=True):
    """One scheduler iteration of one engine (one data-parallel rank)."""

    version: int
    worker_id: str
    dp_rank: int
    counter_id: int
    wall_time: float  # seconds; 0 marks an idle heartbeat, not a sample
    scheduled_requests: ScheduledRequestMetrics
    queued_requests: QueuedRequestMetrics

    @property
    def is_idle_heartbeat(self) -> bool:
        return self.wall_time == 0.0

    @property
    def engine_key(self) -> tuple[str, int]:
        return (self.worker_id, self.dp_rank)


@dataclass(frozen=True)
class FpmDecodeError:
    """Why a frame was dropped: ``kind`` is a bounded label (for a metric)."""

    kind: str  # "undecodable" | "wrong_type" | "unsupported_version" | "invalid_value"
    detail: str


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(ForwardPassMetrics)
_STRUCT_FIELDS = {
    ForwardPassMetrics: ForwardPassMetrics.__struct_fields__,
    "scheduled_requests": ScheduledRequestMetrics.__struct_fields__,
    "queued_requests": QueuedRequestMetrics.__struct_fields__,
}


def _positional_to_mapping(obj: object) -> object:
    """A positional (array) encoding of an FPM as the map encoding, for ``msgspec.convert``."""
    if not isinstance(obj, list):
        return obj
    fields = _STRUCT_FIELDS[ForwardPassMetrics]
    if len(obj) > len(fields):
        raise msgspec.ValidationError(f"Expected at most {len(fields)} fields, got {len(obj)}")
    out: dict[str, object] = dict(zip(fields, obj, strict=False))
    for name in ("scheduled_requests", "queued_requests"):
        inner = out.get(name)
        if isinstance(inner, list):
            names = _STRUCT_FIELDS[name]
            if len(inner) > len(names):
                raise msgspec.ValidationError(
                    f"Expected at most {len(names)} fields in `$.{name}`, got {len(inner)}"
                )
            out[name] = dict(zip(names, inner, strict=False))
    return out


def invalid_value_reason(fpm: ForwardPassMetrics) -> str | None:
    """Why a well-typed FPM still cannot be a measurement (NaN, negative counts)."""
    if not (math.isfinite(fpm.wall_time) and fpm.wall_time >= 0.0):
        return f"wall_time {fpm.wall_time!r}, expected a finite number of seconds >= 0"
    if fpm.dp_rank < 0:
        return f"dp_rank {fpm.dp_rank}, expected >= 0"
    for part in ("scheduled_requests", "queued_requests"):
        metrics = getattr(fpm, part)
        for name in metrics.__struct_fields__:
            value = getattr(metrics, name)
            if not (math.isfinite(value) and value >= 0):
                return f"{part}.{name} {value!r}, expected a finite number >= 0"
    return None


def encode(fpm: ForwardPassMetrics) -> bytes:
    return _encoder.encode(fpm)


def decode(frame: bytes) -> ForwardPassMetrics | FpmDecodeError:
    """Decode one frame; a bad frame gives an error value instead of an exception."""
    try:
        if frame[:1] and (0x90 <= frame[0] <= 0x9F or frame[0] in (0xDC, 0xDD)):  # array
            raw = msgspec.msgpack.decode(frame)
            fpm = msgspec.convert(_positional_to_mapping(raw), ForwardPassMetrics)
        else:
            fpm = _decoder.decode(frame)
    except msgspec.ValidationError as exc:
        return FpmDecodeError("wrong_type", str(exc))
    except msgspec.DecodeError as exc:
        return FpmDecodeError("undecodable", str(exc))
    if fpm.version not in SUPPORTED_VERSIONS:
        return FpmDecodeError(
            "unsupported_version",
            f"version {fpm.version}, expected one of {sorted(SUPPORTED_VERSIONS)}",
        )
    problem = invalid_value_reason(fpm)
    if problem is not None:
        return FpmDecodeError("invalid_value", problem)
    return fpm
