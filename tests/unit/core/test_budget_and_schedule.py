"""GPU budget split, floors, per-tick caps and tick scheduling."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from disagg_planner.core.budget import apply_gpu_budget, cap_change, gpus_of
from disagg_planner.core.schedule import MERGE_TOLERANCE_S, TickSchedule, staggered_start

ORDER = ("prefill", "decode")


def budget(p: int, d: int, *, pg: int = 1, dg: int = 1, mx: int = -1, mn: int = -1, floor: int = 1):
    return apply_gpu_budget(
        {"prefill": p, "decode": d},
        gpus_per_replica={"prefill": pg, "decode": dg},
        floors={"prefill": floor, "decode": floor},
        max_gpus=mx,
        min_gpus=mn,
        order=ORDER,
    )


def test_within_budget_is_untouched() -> None:
    result = budget(3, 4, mx=8)
    assert result.replicas == {"prefill": 3, "decode": 4} and result.limited_by is None


def test_over_budget_prefill_gets_its_share_first_decode_the_rest() -> None:
    # 6 prefill + 10 decode GPUs wanted, 8 allowed: scale 0.5 -> prefill 3, decode 5
    result = budget(6, 10, mx=8)
    assert result.replicas == {"prefill": 3, "decode": 5}
    assert result.limited_by == "max_gpu_budget"


def test_over_budget_with_multi_gpu_engines() -> None:
    result = budget(4, 4, pg=2, dg=4, mx=16)  # 24 GPUs wanted
    assert gpus_of(result.replicas, {"prefill": 2, "decode": 4}) <= 16
    assert result.replicas["prefill"] >= 1 and result.replicas["decode"] >= 1


def test_min_footprint_above_budget_holds_instead_of_zero() -> None:
    result = budget(5, 5, pg=4, dg=4, mx=6)
    assert result.limited_by == "min_footprint"
    assert result.replicas == {"prefill": 5, "decode": 5}


def test_under_min_budget_grows_proportionally() -> None:
    result = budget(1, 1, mn=6, mx=10)
    assert gpus_of(result.replicas, {"prefill": 1, "decode": 1}) >= 6
    assert result.limited_by == "min_gpu_budget"


def test_min_budget_never_crosses_max() -> None:
    result = budget(1, 1, pg=4, dg=4, mn=9, mx=9)
    assert gpus_of(result.replicas, {"prefill": 4, "decode": 4}) <= 9


@given(
    p=st.integers(0, 60),
    d=st.integers(0, 60),
    pg=st.integers(1, 8),
    dg=st.integers(1, 8),
    mx=st.integers(2, 200),
    floor=st.integers(0, 3),
)
def test_never_above_budget_when_floors_fit(p, d, pg, dg, mx, floor) -> None:
    result = budget(max(p, floor), max(d, floor), pg=pg, dg=dg, mx=mx, floor=floor)
    if floor * (pg + dg) <= mx:
        assert gpus_of(result.replicas, {"prefill": pg, "decode": dg}) <= mx
        assert min(result.replicas.values()) >= floor


@given(p=st.integers(1, 40), d=st.integers(1, 40), extra=st.integers(0, 40), mx=st.integers(2, 64))
def test_budgeted_replicas_never_fall_as_demand_rises(p, d, extra, mx) -> None:
    low = budget(p, d, mx=mx).replicas
    high = budget(p, d + extra, mx=mx).replicas
    assert sum(high.values()) >= sum(low.values())


def test_cap_change_limits_steps_but_restores_floor() -> None:
    floors = {"prefill": 2, "decode": 1}
    assert cap_change(
        {"prefill": 20, "decode": 1}, {"prefill": 2, "decode": 9}, max_step=4, floors=floors
    ) == {"prefill": 6, "decode": 5}
    # below the floor: lifted to it in one step even past the cap
    assert (
        cap_change(
            {"prefill": 2, "decode": 1}, {"prefill": 0, "decode": 1}, max_step=1, floors=floors
        )["prefill"]
        == 2
    )


def test_schedule_merges_close_ticks_and_skips_missed_ones() -> None:
    sched = TickSchedule(start_s=0.0, throughput_interval_s=60.0, load_interval_s=5.0)
    assert sched.next_at_s == 5.0
    assert sched.pop_due(4.0) is None
    tick = sched.pop_due(5.0)
    assert tick is not None and tick.run_load and not tick.run_throughput
    while sched.next_at_s < 60.0:
        t = sched.pop_due(sched.next_at_s)
        assert t is not None and not t.run_throughput
    both = sched.pop_due(60.0)
    assert both is not None and both.run_load and both.run_throughput
    # a stall of about 10 minutes runs each loop once, then resumes its cadence at the
    # phase it had (whole intervals after the missed tick), not from the instant it woke
    late = sched.pop_due(703.0)
    assert late is not None and late.run_throughput and late.run_load
    assert sched.next_load_s == 705.0 and sched.next_throughput_s == 720.0


@pytest.mark.parametrize(
    ("start_s", "interval_s", "woke_s", "next_s"),
    [
        (0.0, 15.0, 15.0, 30.0),  # on time: the next interval
        (0.0, 15.0, 15.4, 30.0),  # late within the merge tolerance
        (0.0, 15.0, 29.0, 30.0),  # late by most of an interval: still at its phase
        (0.0, 15.0, 29.6, 45.0),  # the next is within the tolerance of now: the one after
        (0.0, 15.0, 30.0, 45.0),  # a whole interval missed: not replayed
        (3.7, 15.0, 3600.2, 3603.7),  # an hour's outage: the phase 3.7 of 15 s kept
        (1.7e9 + 2.25, 60.0, 1.7e9 + 7261.0, 1.7e9 + 7262.25),  # at Unix-time magnitudes
    ],
)
def test_a_late_tick_keeps_its_phase(
    start_s: float, interval_s: float, woke_s: float, next_s: float
) -> None:
    sched = TickSchedule(start_s=start_s, throughput_interval_s=None, load_interval_s=interval_s)
    tick = sched.pop_due(woke_s)
    assert tick is not None and tick.run_load
    assert sched.next_load_s is not None
    assert sched.next_load_s == pytest.approx(next_s, abs=1e-6)
    assert sched.next_load_s > woke_s + MERGE_TOLERANCE_S


def test_loops_woken_together_after_an_outage_keep_their_stagger() -> None:
    """Loops at distinct phases, all stalled by one outage and woken at the same instant,
    still fall due at their distinct phases afterwards."""
    interval_s = 15.0
    starts = [
        staggered_start(1000.0, key=f"default/g{i:04d}", period_s=interval_s) for i in range(50)
    ]
    scheds = [
        TickSchedule(start_s=s, throughput_interval_s=None, load_interval_s=interval_s)
        for s in starts
    ]
    for sched in scheds:
        assert sched.pop_due(1900.0) is not None  # the outage ends for all at once
    after = [sched.next_at_s for sched in scheds]
    assert all(1900.0 + MERGE_TOLERANCE_S < t <= 1915.0 + MERGE_TOLERANCE_S for t in after)
    assert [t % interval_s for t in after] == pytest.approx(
        [(s + interval_s) % interval_s for s in starts]
    )
    assert len({round(t, 6) for t in after}) == 50
