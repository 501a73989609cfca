"""ForwardPassMetrics (FPM): what an engine reports about each scheduler iteration.

Wire format: msgpack arrays in field order (msgspec ``array_like`` Structs), compatible with
Dynamo's ``dynamo.common.forward_pass_metrics`` version 1. One message per iteration, plus an
idle heartbeat (``wall_time == 0``) when an engine goes idle. Decoding never raises to the
caller's loop: :func:`decode` returns an :class:`FpmDecodeError` describing the bad frame.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

FPM_VERSION = 1
SUPPORTED_VERSIONS = frozenset({FPM_VERSION})


class ScheduledRequestMetrics(msgspec.Struct, array_like=True, frozen=True):
    """Work the engine ran in this iteration."""

    num_prefill_requests: int = 0
    sum_prefill_tokens: int = 0  # tokens freshly computed this iteration
    var_prefill_length: float = 0.0
    sum_prefill_kv_tokens: int = 0  # context read by those prefills (cache hits, prior chunks)
    num_decode_requests: int = 0
    sum_decode_kv_tokens: int = 0  # prompt + generated context of the decoding requests
    var_decode_kv_tokens: float = 0.0


class QueuedRequestMetrics(msgspec.Struct, array_like=True, frozen=True):
    """Work waiting in the engine at the end of this iteration."""

    num_prefill_requests: int = 0
    sum_prefill_tokens: int = 0
    var_prefill_length: float = 0.0
    num_decode_requests: int = 0  # preempted requests waiting to resume
    sum_decode_kv_tokens: int = 0
    var_decode_kv_tokens: float = 0.0


class ForwardPassMetrics(msgspec.Struct, array_like=True, frozen=True):
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

    kind: str  # "undecodable" | "wrong_type" | "unsupported_version"
    detail: str


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(ForwardPassMetrics)


def encode(fpm: ForwardPassMetrics) -> bytes:
    return _encoder.encode(fpm)


def decode(frame: bytes) -> ForwardPassMetrics | FpmDecodeError:
    """Decode one frame; a bad frame gives an error value instead of an exception."""
    try:
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
    return fpm
