"""Issue 29, "learn the model's error, both ways", for decode: Dynamo's ITL ratio (observed
ITL over the profile's at the observed per-engine concurrency) below 1 says the engines
decode faster than profiled (speculative decoding the profile was not told of, a faster
engine version). The sizing believes it, down to half the profile's time per token, only
while the decode tail is calm, and at the slowest ratio of the recent tick windows."""

from __future__ import annotations

import pytest

from disagg_planner.core.fast_check import fast_check
from disagg_planner.core.sizing import FASTEST_DECODE_CORRECTION
from disagg_planner.core.throughput import ThroughputDecision, ThroughputPlanner
from disagg_planner.profiles import Profile
from tests.unit.core.test_feedback import ttft, window
from tests.unit.core.test_throughput import planner, status, traffic

# 40 req/s at ISL/OSL 3000/300 for 4 s each: 40 in flight on each of 4 decode engines, whose
# profiled ITL there is 12.7 ms (the SLO 30 ms)
PROFILED_ITL_MS = 12.67


def _tick(tp: ThroughputPlanner, end_s: float, itl_ms: float) -> ThroughputDecision:
    obs = traffic(end_s, 2400, ttft_histogram=ttft(0.1), itl_ms=itl_ms, request_duration_s=4.0)
    return tp.tick(end_s, obs, status(6, 4))


def _decode_sentence(message: str) -> str:
    return next(p for p in message.split("; ") if p.startswith("decode:"))


@pytest.mark.parametrize(
    ("itl_ms", "decode", "says"),
    [
        # as profiled: the profile's count
        (PROFILED_ITL_MS, 4, "decode: 12000 tok/s / 3998 tok/s/GPU at 80% / 1 GPU -> 4"),
        # 0.65 of the profile's: its batch at ITL 30 / 0.65 runs at 30 ms, 1 / 0.65 as fast
        (8.3, 3, "decode: 12000 tok/s / 6149 tok/s/GPU at 80% / 1 GPU -> 3"),
        # 0.39 and 0.16: both believed only down to half the profile's time per token
        (5.0, 2, "decode: 12000 tok/s / 8053 tok/s/GPU at 80% / 1 GPU -> 2"),
        (2.0, 2, "decode: 12000 tok/s / 8053 tok/s/GPU at 80% / 1 GPU -> 2"),
    ],
)
def test_decode_is_sized_at_an_itl_ratio_below_one_while_its_tail_is_calm(
    h200_like_profile: Profile, itl_ms: float, decode: int, says: str
) -> None:
    tp = planner(h200_like_profile, scale_down_stabilization_seconds=0.0)
    decision = _tick(tp, 60, itl_ms)
    assert decision.replicas is not None
    assert (decision.replicas["decode"], _decode_sentence(decision.message)) == (
        decode,
        says + f", after guards {decode}",
    )


def test_the_itl_ratio_believed_is_the_slowest_recent_one_and_only_while_calm(
    h200_like_profile: Profile,
) -> None:
    tp = planner(h200_like_profile, scale_down_stabilization_seconds=0.0)
    _tick(tp, 60, 0.9 * PROFILED_ITL_MS)
    _tick(tp, 120, 0.6 * PROFILED_ITL_MS)
    # the last window says 0.6, the one before it 0.9: the sizing plans with the slower
    assert tp.latency.decode == pytest.approx(0.6, rel=0.01)
    assert tp.corrections.decode == pytest.approx(0.9, rel=0.01)
    # a fast window whose ITL has used 90% of its SLO: the ratio is not believed until the
    # tail is calm again
    fast_check(tp, 135, window(135, 40, itl_ms=27.0), status(6, 4))
    assert tp.corrections.decode == 1.0
    fast_check(tp, 150, window(150, 40, itl_ms=10.0), status(6, 4))
    assert tp.corrections.decode == pytest.approx(0.9, rel=0.01)
    # half an hour on, the slower windows are forgotten (size_decode bounds what is left)
    _tick(tp, 2000, 0.3 * PROFILED_ITL_MS)
    assert tp.corrections.decode == pytest.approx(0.3, rel=0.01)
    assert tp.corrections.decode < FASTEST_DECODE_CORRECTION
