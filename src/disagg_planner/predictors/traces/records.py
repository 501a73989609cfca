"""The request record every trace format is read into."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace.

    ``arrival_s``: seconds since the first request of the trace (>= 0; for ServeGen, since the
    replayed span's start). ``input_length`` and
    ``output_length``: tokens. ``hash_ids``: prefix-block hashes where the format has them
    (Mooncake: one id per 512-token block; Dynamo: sequence hashes), else None.
    """

    arrival_s: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] | None = None
