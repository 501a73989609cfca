"""What the oracle's and best-static's searches share: the targets a plan is held to
(:class:`Slo`), the clusters they simulate candidates on (:data:`ClusterFactory`), the requests
no replica count serves (:class:`LoneLimits`, found by :func:`lone_limits`), the misses a
candidate adds (:class:`MissTally`), and their progress lines (:class:`SearchLog`)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from disagg_planner.predictors.traces import TraceRequest
from disagg_planner.simulator import oracle as capacity_model
from disagg_planner.simulator.cluster import Cluster
from disagg_planner.simulator.request import RequestLike, RequestRecord

log = logging.getLogger(__name__)

# The share of requests meeting both targets that "meets the SLO" means, unless told.
DEFAULT_SLO_TARGET = 0.99
# A long search logs where it is this often (s of wall time): with stderr in a file or a
# pipe, that is all that shows a search of many minutes is alive.
SEARCH_LOG_EVERY_S = 30.0


class SearchLog:
    """When a search's next progress line is due (at most every SEARCH_LOG_EVERY_S)."""

    def __init__(self, *, every_s: float = SEARCH_LOG_EVERY_S) -> None:
        self.every_s = every_s
        self.started = time.perf_counter()
        self._last = self.started

    def due(self) -> bool:
        now = time.perf_counter()
        if now - self._last < self.every_s:
            return False
        self._last = now
        return True

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started


@dataclass(frozen=True)
class Slo:
    """The targets a plan is held to: TTFT and ITL, met together by ``target`` of requests."""

    ttft_ms: float
    itl_ms: float
    target: float = DEFAULT_SLO_TARGET

    def allowed_misses(self, n: int) -> int:
        """Misses ``n`` (servable) requests may have and still meet the target."""
        return math.floor((1.0 - self.target) * n + 1e-9)

    def met(self, record: RequestRecord) -> bool:
        return capacity_model.meets_slo(record, ttft_ms=self.ttft_ms, itl_ms=self.itl_ms)


# A cluster ready with the given replicas at time 0, no request submitted; a replica added
# later must serve at once (startup delay 0): the plan orders it one delay ahead.
ClusterFactory = Callable[[Mapping[str, int]], Cluster]


@dataclass(frozen=True)
class LoneLimits:
    """The longest prompt that meets the TTFT target and the longest context (prompt plus
    output) that meets the ITL target when the request is served alone on an idle cluster
    (``math.inf``: every request of the trace does). A longer request misses at any replica
    count, so the searches do not chase it: they hold the SLO target over the others."""

    max_isl: float = math.inf
    max_context: float = math.inf

    def servable(self, isl: int, osl: int) -> bool:
        return isl <= self.max_isl and isl + osl <= self.max_context

    def unservable_count(self, requests: Iterable[RequestLike]) -> int:
        return sum(1 for r in requests if not self.servable(r.input_length, r.output_length))


def lone_limits(
    requests: Sequence[RequestLike], *, build: ClusterFactory, roles: Sequence[str], slo: Slo
) -> LoneLimits:
    """:class:`LoneLimits` of ``requests``, by simulating single requests: the lone TTFT
    grows with the prompt and the lone ITL with the context, so a binary search over the
    trace's lengths finds each limit (the ITL one at the output length of the trace's
    longest-context request)."""
    if not requests:
        return LoneLimits()

    def alone(isl: int, osl: int) -> RequestRecord:
        cluster = build(dict.fromkeys(roles, 1))
        cluster.submit([TraceRequest(arrival_s=0.0, input_length=isl, output_length=osl)])
        cluster.run_until(math.inf)
        return cluster.records[-1]

    def ttft_ok(isl: int) -> bool:
        r = alone(isl, 2)
        return r.ok and r.ttft_ms is not None and r.ttft_ms <= slo.ttft_ms

    max_isl = _largest(ttft_ok, max(r.input_length for r in requests))
    longest = max(
        (r for r in requests if r.input_length <= max_isl and r.output_length > 1),
        key=lambda r: r.input_length + r.output_length,
        default=None,
    )
    if longest is None:
        return LoneLimits(max_isl=max_isl)
    osl = longest.output_length

    def itl_ok(context: int) -> bool:
        r = alone(context - osl, osl)
        return r.ok and (r.itl_ms is None or r.itl_ms <= slo.itl_ms)

    high = longest.input_length + osl
    max_context = _largest(itl_ok, high, low=osl + 1)
    return LoneLimits(max_isl=max_isl, max_context=max_context)


def _largest(ok: Callable[[int], bool], high: int, *, low: int = 1) -> float:
    """The largest ``n`` in ``[low, high]`` with ``ok(n)`` (monotone: true, then false);
    ``inf`` when ``ok(high)``, ``low - 1`` when not even ``ok(low)``."""
    if ok(high):
        return math.inf
    if not ok(low):
        return float(low - 1)
    good, bad = low, high
    while bad - good > 1:
        mid = (good + bad) // 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return float(good)


@dataclass
class MissTally:
    """Misses among finished requests, by kind; requests rejected on arrival apart."""

    slo: Slo
    limits: LoneLimits = field(default_factory=LoneLimits)
    misses: int = 0  # requests served late (or failed after arrival)
    ttft_misses: int = 0
    itl_misses: int = 0
    rejected: int = 0
    rejected_unservable: int = 0

    def add(self, records: Iterable[RequestRecord]) -> None:
        for r in records:
            if self.slo.met(r):
                continue
            if capacity_model.rejected_on_arrival(r):
                self.rejected += 1
                self.rejected_unservable += not self.limits.servable(r.isl, r.osl)
                continue
            self.misses += 1
            if r.ttft_ms is None or r.ttft_ms > self.slo.ttft_ms:
                self.ttft_misses += 1
            if r.itl_ms is not None and r.itl_ms > self.slo.itl_ms:
                self.itl_misses += 1

    def allowance(self, n: int, unservable: int) -> int:
        """Misses (rejections apart) ``n`` requests with ``unservable`` of them may have:
        every unservable one served, and the target's share of the servable others. It only
        shrinks as rejections appear, so a count over it is over it for good."""
        late = unservable - self.rejected_unservable  # unservable, served, so a miss
        return late + self.slo.allowed_misses(n - late - self.rejected)
