"""The clairvoyant lower bound: the fewest replicas per window that meet the SLO for the true
load, from the engine model, started one startup delay ahead.

For each window of ``window_s`` seconds the oracle takes the true request rate and mean
ISL/OSL of the requests arriving in it, asks the engine model how many requests per second
one replica sustains within the TTFT and ITL targets
(:func:`disagg_planner.simulator.oracle.capacity`:
batched prefill as a queue whose waiting-time tail keeps 99 % of requests within the TTFT
target, the largest decode batch whose step meets the ITL), and needs
``ceil(rate / capacity)`` replicas (at least the min endpoints).

Two uses:

- :func:`lower_bound_gpu_hours`: the GPU-hours of exactly those replicas over exactly those
  windows, with no startup or drain time and no headroom: no policy that serves the trace
  within the SLO under the engine model can use fewer.
- :class:`OraclePolicy`: the same plan run in the simulator, with each scale-up issued one
  startup delay early (at time ``t`` it holds ``max(need[j])`` over every window that
  ``[t, t + startup_delay]`` touches), to show what the plan achieves in practice.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from disagg_planner.replay.policies import PolicyStep
from disagg_planner.simulator import oracle as capacity_model
from disagg_planner.simulator.cluster import Cluster
from disagg_planner.simulator.engine_spec import EngineSpec
from disagg_planner.simulator.request import RequestLike


@dataclass(frozen=True)
class WindowNeed:
    start_s: float
    rate_rps: float
    mean_isl: float
    mean_osl: float
    replicas: dict[str, int]


def _round2(x: float) -> int:
    """Two significant digits: capacity barely changes within them, and caching works."""
    if x <= 0:
        return 1
    digits = max(0, math.floor(math.log10(x)) - 1)
    return int(round(x, -digits))


# The oracle meets the TTFT target for this share of requests (the SLO attainment a good
# policy is held to), not merely on average.
ORACLE_TTFT_QUANTILE = 0.99


@lru_cache(maxsize=4096)
def _capacity(
    spec: EngineSpec, isl: int, osl: int, ttft_ms: float, itl_ms: float, bw: float
) -> capacity_model.EngineCapacity:
    return capacity_model.capacity(
        spec,
        isl=isl,
        osl=osl,
        ttft_ms=ttft_ms,
        itl_ms=itl_ms,
        kv_transfer_bandwidth_bps=bw,
        ttft_quantile=ORACLE_TTFT_QUANTILE,
    )


def plan_needs(
    requests: Iterable[RequestLike],
    *,
    specs: dict[str, EngineSpec],
    mode: str,
    window_s: float,
    duration_s: float,
    ttft_ms: float,
    itl_ms: float,
    floors: dict[str, int],
    kv_transfer_bandwidth_bps: float,
) -> list[WindowNeed]:
    """Replicas each window needs for its true load (see the module doc)."""
    n_windows = max(1, math.ceil(duration_s / window_s))
    count = [0] * n_windows
    isl_sum = [0.0] * n_windows
    osl_sum = [0.0] * n_windows
    for r in requests:
        k = min(int(r.arrival_s // window_s), n_windows - 1)
        count[k] += 1
        isl_sum[k] += r.input_length
        osl_sum[k] += r.output_length
    needs: list[WindowNeed] = []
    for k in range(n_windows):
        rate = count[k] / window_s
        isl = isl_sum[k] / count[k] if count[k] else 0.0
        osl = osl_sum[k] / count[k] if count[k] else 0.0
        replicas: dict[str, int] = {}
        if count[k]:
            if mode == "agg":
                cap = _capacity(
                    specs["agg"],
                    _round2(isl),
                    _round2(osl),
                    ttft_ms,
                    itl_ms,
                    kv_transfer_bandwidth_bps,
                )
                # an aggregated engine time-shares both phases: capacities combine harmonically
                per = (
                    1.0 / (1.0 / cap.prefill_rps + 1.0 / cap.decode_rps)
                    if cap.prefill_rps > 0 and cap.decode_rps > 0
                    else 0.0
                )
                replicas["agg"] = capacity_model.replicas_needed(rate, per)
            else:
                cap_p = _capacity(
                    specs["prefill"],
                    _round2(isl),
                    _round2(osl),
                    ttft_ms,
                    itl_ms,
                    kv_transfer_bandwidth_bps,
                )
                cap_d = _capacity(
                    specs["decode"],
                    _round2(isl),
                    _round2(osl),
                    ttft_ms,
                    itl_ms,
                    kv_transfer_bandwidth_bps,
                )
                replicas["prefill"] = capacity_model.replicas_needed(rate, cap_p.prefill_rps)
                replicas["decode"] = capacity_model.replicas_needed(rate, cap_d.decode_rps)
        for role, floor in floors.items():
            replicas[role] = max(replicas.get(role, 0), floor)
        needs.append(WindowNeed(k * window_s, rate, isl, osl, replicas))
    return needs


def lower_bound_gpu_hours(
    needs: Sequence[WindowNeed], *, window_s: float, duration_s: float, gpus: dict[str, int]
) -> float:
    total = 0.0
    for need in needs:
        span = min(window_s, max(0.0, duration_s - need.start_s))
        total += sum(n * gpus[role] for role, n in need.replicas.items()) * span
    return total / 3600.0


def initial_replicas(
    needs: Sequence[WindowNeed], *, window_s: float, lead_s: float
) -> dict[str, int]:
    """Replicas to start with: what the first ``lead_s`` seconds need (a warm deployment)."""
    return _max_over(needs, 0.0, lead_s, window_s)


def _max_over(needs: Sequence[WindowNeed], t0: float, t1: float, window_s: float) -> dict[str, int]:
    first = max(0, int(t0 // window_s))
    last = min(len(needs) - 1, int(t1 // window_s))
    chosen = needs[first : last + 1] or needs[-1:]
    roles = chosen[0].replicas.keys()
    return {role: max(n.replicas[role] for n in chosen) for role in roles}


class OraclePolicy:
    """Runs the clairvoyant plan: at each window boundary, and one startup delay before it."""

    def __init__(self, needs: Sequence[WindowNeed], *, window_s: float, startup_delay_s: float):
        self.name = "oracle"
        self.needs = list(needs)
        self.window_s = window_s
        self.delay = startup_delay_s
        times = set()
        for k in range(len(self.needs) + 1):
            times.add(k * window_s)
            if k * window_s - startup_delay_s > 0:
                times.add(k * window_s - startup_delay_s)
        self._times = sorted(times)
        self._i = 0

    def next_wakeup_s(self) -> float:
        return self._times[self._i] if self._i < len(self._times) else math.inf

    def wake(self, cluster: Cluster) -> PolicyStep:
        now = cluster.now
        while self._i < len(self._times) and self._times[self._i] <= now + 1e-9:
            self._i += 1
        target = _max_over(self.needs, now, now + self.delay + 1e-6, self.window_s)
        changed = any(target[r] != cluster.desired_replicas(r) for r in target)
        return PolicyStep(now, target if changed else None, "oracle")
