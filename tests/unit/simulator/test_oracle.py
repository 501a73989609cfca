"""The capacity oracle agrees with the simulator: below the capacity it computes the targets
hold, above it they break."""

from __future__ import annotations

import math
import statistics

import pytest

from disagg_planner.simulator.cluster import Cluster
from disagg_planner.simulator.oracle import capacity, replicas_needed
from disagg_planner.simulator.workloads import parse_workload

SPEC = "sim:llama-3.1-8b-fp8@h200_sxm:tp1"
TTFT_MS, ITL_MS = 300.0, 20.0


@pytest.fixture(scope="module")
def cap():
    return capacity(
        SPEC, isl=3000, osl=150, ttft_ms=TTFT_MS, itl_ms=ITL_MS, kv_transfer_bandwidth_bps=64e9
    )


def simulate(rate: float, *, p: int, d: int) -> tuple[float, float]:
    c = Cluster(engines={"prefill": SPEC, "decode": SPEC}, replicas={"prefill": p, "decode": d})
    c.submit(parse_workload(f"poisson:rate={rate},isl=3000,osl=150,duration=120", seed=1))
    c.run_until(math.inf)
    ttft_ms: list[float] = []
    itl_ms: list[float] = []
    for r in c.records:
        assert r.ttft_ms is not None and r.itl_ms is not None, r
        ttft_ms.append(r.ttft_ms)
        itl_ms.append(r.itl_ms)
    return statistics.fmean(ttft_ms), statistics.fmean(itl_ms)


def test_prefill_capacity_matches_simulation(cap):
    assert cap.prefill_ttft_ms < TTFT_MS
    assert simulate(0.85 * cap.prefill_rps, p=1, d=4)[0] <= TTFT_MS
    assert simulate(1.3 * cap.prefill_rps, p=1, d=4)[0] > TTFT_MS


@pytest.mark.slow
def test_decode_capacity_matches_simulation(cap):
    assert 0 < cap.decode_itl_ms <= ITL_MS and cap.decode_batch > 1
    assert simulate(0.9 * cap.decode_rps, p=8, d=1)[1] <= ITL_MS
    assert simulate(1.3 * cap.decode_rps, p=8, d=1)[1] > ITL_MS


def test_infeasible_targets_and_replica_counts():
    tight = capacity(SPEC, isl=16000, osl=100, ttft_ms=50, itl_ms=1)
    assert tight.prefill_rps == 0 and tight.decode_rps == 0
    assert replicas_needed(0, 5) == 0
    assert replicas_needed(10, 5) == 2
    assert replicas_needed(10.1, 5) == 3
    assert replicas_needed(1, 0) == 1_000_000
