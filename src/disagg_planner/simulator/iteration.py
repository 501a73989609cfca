"""What one iteration of an engine rank schedules and reports: the scheduler's named records.

- :class:`PrefillChunk`: one request's prompt tokens computed in an iteration;
- :class:`Scheduled`: the iteration's scheduled work (the FPM's scheduled section, less the
  decode contexts' variance, which is kept as a :data:`VarSource` until an FPM is built);
- :class:`QueueTotals`: the waiting queue's totals, kept up to date, and :class:`Queued`, their
  value at one moment (the FPM's queued section before its variances);
- :class:`PassOutcome`: what a scheduling pass did besides scheduling (preempted, admitted);
- :class:`Step`: the single iteration in progress (a planned run of decode-only iterations is
  a :class:`~disagg_planner.simulator.decode_run.DecodeRun`);
- :class:`LastIteration`: the figures of the latest iteration (rewritten in place), from
  which its FPM is built on demand (:func:`build_fpm`): a replay reads only the latest FPM of
  each rank once per tick, so most FPMs (and most variances) are never needed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from disagg_planner.signals.fpm import (
    FPM_VERSION,
    ForwardPassMetrics,
    QueuedRequestMetrics,
    ScheduledRequestMetrics,
)
from disagg_planner.simulator.request import SimRequest

# The decode contexts' variance of an iteration, or what to compute it from when an FPM is
# built: (values, offset), the contexts being ``value + offset``.
VarSource = float | tuple[list[int], int]


def variance(values: list[int]) -> float:
    """Population variance (0 for fewer than two values)."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return sum((v - mean) ** 2 for v in values) / n


def variance_of(src: VarSource) -> float:
    if isinstance(src, float):
        return src
    values, offset = src
    return variance([v + offset for v in values] if offset else values)


class PrefillChunk(NamedTuple):
    """``tokens`` prompt tokens of ``req`` computed in one iteration, after ``context``
    tokens already in its KV cache (earlier chunks, prefix-cache hits)."""

    req: SimRequest
    tokens: int
    context: int


class Scheduled(NamedTuple):
    """The work of one iteration (Dynamo's ``ScheduledRequestMetrics`` without the decode
    variance)."""

    prefill_requests: float
    prefill_tokens: float
    prefill_length_var: float
    prefill_kv_tokens: float
    decode_requests: float
    decode_kv_tokens: float


IDLE = Scheduled(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


class Queued(NamedTuple):
    """The waiting queue's totals at one moment (what an FPM's queued section is computed
    from). A preempted request that had generated output counts as a queued decode of its
    whole prompt (its KV is recomputed); any other as a queued prefill of the prompt tokens it
    has left."""

    prefill_requests: int
    prefill_tokens: int
    prefill_tokens_sq: int
    decode_requests: int
    decode_kv_tokens: int
    decode_kv_tokens_sq: int

    def metrics(self) -> QueuedRequestMetrics:
        n_pf, s_pf, ss_pf = self.prefill_requests, self.prefill_tokens, self.prefill_tokens_sq
        n_dc, s_dc, ss_dc = self.decode_requests, self.decode_kv_tokens, self.decode_kv_tokens_sq
        var_pf = ss_pf / n_pf - (s_pf / n_pf) ** 2 if n_pf > 1 else 0.0
        var_dc = ss_dc / n_dc - (s_dc / n_dc) ** 2 if n_dc > 1 else 0.0
        return QueuedRequestMetrics(
            num_prefill_requests=int(n_pf),
            sum_prefill_tokens=int(s_pf),
            var_prefill_length=float(max(0.0, var_pf)),
            num_decode_requests=int(n_dc),
            sum_decode_kv_tokens=int(s_dc),
            var_decode_kv_tokens=float(max(0.0, var_dc)),
        )


@dataclass(slots=True)
class QueueTotals:
    """The waiting queue's totals kept up to date in place as requests join and leave it (a
    request joins and leaves several queues on its way: an immutable record per change would
    cost more than the changes); :meth:`snapshot` is the :class:`Queued` an FPM keeps."""

    prefill_requests: int = 0
    prefill_tokens: int = 0
    prefill_tokens_sq: int = 0
    decode_requests: int = 0
    decode_kv_tokens: int = 0
    decode_kv_tokens_sq: int = 0

    def add(self, req: SimRequest, sign: int) -> None:
        """Count ``req`` in (``sign`` 1) or out (-1) as :class:`Queued` says."""
        if req.preemptions and req.generated:
            v = req.prompt_len
            self.decode_requests += sign
            self.decode_kv_tokens += sign * v
            self.decode_kv_tokens_sq += sign * v * v
        else:
            v = req.prompt_len - req.computed
            self.prefill_requests += sign
            self.prefill_tokens += sign * v
            self.prefill_tokens_sq += sign * v * v

    def snapshot(self) -> Queued:
        return Queued(
            self.prefill_requests,
            self.prefill_tokens,
            self.prefill_tokens_sq,
            self.decode_requests,
            self.decode_kv_tokens,
            self.decode_kv_tokens_sq,
        )


EMPTY_QUEUE = Queued(0, 0, 0, 0, 0, 0)


class PassOutcome(NamedTuple):
    """Whether a scheduling pass preempted a running request or admitted a waiting one (a
    pass that did neither and scheduled only decodes may plan a run)."""

    preempted: bool
    admitted: bool


NOTHING_NEW = PassOutcome(preempted=False, admitted=False)
PREEMPTED = PassOutcome(preempted=True, admitted=False)
ADMITTED = PassOutcome(preempted=False, admitted=True)


@dataclass(slots=True)
class Step:
    """The single iteration in progress (one per rank, rewritten by each pass): its prefill
    chunks and decodes (``grouped``: the decodes are the decode group's members, not listed),
    their count, the decode contexts' sum ``k`` and what their variance comes from, the
    scheduled work, and when it ends."""

    prefill: list[PrefillChunk] = field(default_factory=list)
    decode: list[SimRequest] = field(default_factory=list)
    n_decode: int = 0
    grouped: bool = False
    k: int = 0
    var: VarSource = 0.0
    scheduled: Scheduled = IDLE
    dur: float = 0.0
    end: float = 0.0


@dataclass(slots=True)
class LastIteration:
    """The latest iteration (or idle heartbeat) of a rank, its FPM not yet built. One per
    rank, rewritten in place by each iteration: a replay runs millions of iterations and
    builds the FPM of few."""

    wall: float = 0.0
    scheduled: Scheduled = IDLE
    var: VarSource = 0.0
    queued: Queued = EMPTY_QUEUE


def build_fpm(
    *,
    worker_id: str,
    dp_rank: int,
    counter: int,
    wall: float,
    scheduled: Scheduled,
    var: VarSource,
    queued: QueuedRequestMetrics,
) -> ForwardPassMetrics:
    """The FPM of one iteration (``queued``: :meth:`Queued.metrics` of the queue then)."""
    return ForwardPassMetrics(
        version=FPM_VERSION,
        worker_id=worker_id,
        dp_rank=dp_rank,
        counter_id=counter,
        wall_time=wall,
        scheduled_requests=ScheduledRequestMetrics(
            num_prefill_requests=int(scheduled.prefill_requests),
            sum_prefill_tokens=int(scheduled.prefill_tokens),
            var_prefill_length=float(scheduled.prefill_length_var),
            sum_prefill_kv_tokens=int(scheduled.prefill_kv_tokens),
            num_decode_requests=int(scheduled.decode_requests),
            sum_decode_kv_tokens=int(scheduled.decode_kv_tokens),
            var_decode_kv_tokens=float(variance_of(var)),
        ),
        queued_requests=queued,
    )


__all__ = [
    "ADMITTED",
    "EMPTY_QUEUE",
    "IDLE",
    "NOTHING_NEW",
    "PREEMPTED",
    "LastIteration",
    "PassOutcome",
    "PrefillChunk",
    "QueueTotals",
    "Queued",
    "Scheduled",
    "Step",
    "VarSource",
    "build_fpm",
    "variance",
    "variance_of",
]
