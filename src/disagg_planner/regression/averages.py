"""Moving averages of what engines report per iteration (the estimators' inputs).

The TTFT and ITL estimators need quantities one iteration does not show reliably: the
average prompt length of a new request, the average context of a decoding request, and, for
aggregated engines whose iterations alternate between prefill chunks and pure decode, the
per-worker time average of scheduled and queued work. Each average is an arithmetic mean over
the last ``window`` non-idle iterations (idle heartbeats are not iterations). A ratio such
as the prompt length is averaged only over iterations where it is defined (at least one
prefill request), so leading idle or decode-only iterations do not drag it to zero.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from disagg_planner.regression.protocols import IterationReport

# Per-iteration quantities averaged, in this order.
_FIELDS = (
    "prefill_tokens_per_iteration",
    "num_decode_requests",
    "decode_kv_tokens",
    "queued_prefill_tokens",
    "queued_decode_requests",
    "queued_decode_kv_tokens",
)


@dataclass(frozen=True)
class LoadAverages:
    """Means over recent non-idle iterations of one engine (or of all engines of a role).

    ``isl``: freshly computed prefill tokens per scheduled prefill request (tokens; a prompt
    split into chunks counts per chunk, prefix-cache hits are not included). ``decode_context``:
    KV tokens per decoding request. Both are None until an iteration defined them. The other
    fields are per-iteration means (tokens or requests).
    """

    iterations: int
    isl: float | None
    decode_context: float | None
    prefill_tokens_per_iteration: float
    num_decode_requests: float
    decode_kv_tokens: float
    queued_prefill_tokens: float
    queued_decode_requests: float
    queued_decode_kv_tokens: float


EMPTY_AVERAGES = LoadAverages(0, None, None, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


class _Mean:
    """Mean of the last ``window`` values (summed when read: reads are per tick, rare)."""

    def __init__(self, window: int) -> None:
        self._values: deque[float] = deque(maxlen=window)

    def add(self, value: float) -> None:
        self._values.append(value)

    def __len__(self) -> int:
        return len(self._values)

    def mean(self) -> float | None:
        if not self._values:
            return None
        return sum(self._values) / len(self._values)


class IterationAverages:
    """Running means of one stream of iteration reports."""

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self._fields = {name: _Mean(window) for name in _FIELDS}
        self._isl = _Mean(window)
        self._context = _Mean(window)
        self._iterations = 0

    def add(self, report: IterationReport) -> None:
        """Account one non-idle iteration (callers skip idle heartbeats)."""
        sched, queued = report.scheduled_requests, report.queued_requests
        values = (
            sched.sum_prefill_tokens,
            sched.num_decode_requests,
            sched.sum_decode_kv_tokens,
            queued.sum_prefill_tokens,
            queued.num_decode_requests,
            queued.sum_decode_kv_tokens,
        )
        for name, value in zip(_FIELDS, values, strict=True):
            self._fields[name].add(float(value))
        if sched.num_prefill_requests > 0 and sched.sum_prefill_tokens > 0:
            self._isl.add(sched.sum_prefill_tokens / sched.num_prefill_requests)
        if sched.num_decode_requests > 0:
            self._context.add(sched.sum_decode_kv_tokens / sched.num_decode_requests)
        self._iterations += 1

    def snapshot(self) -> LoadAverages:
        if self._iterations == 0:
            return EMPTY_AVERAGES
        means = {name: self._fields[name].mean() or 0.0 for name in _FIELDS}
        return LoadAverages(
            iterations=len(self._fields[_FIELDS[0]]),
            isl=self._isl.mean(),
            decode_context=self._context.mean(),
            **means,
        )
