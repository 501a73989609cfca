"""The operator's loops tick at a phase of their own (issue 36: a thousand policies in one
process): loops started together must not all fall due at the same instant, a restarted loop
keeps its phase, and a loop without ``stagger_ticks`` (replay, ``planner run``) starts its
schedule when it starts."""

from __future__ import annotations

from collections import Counter

import pytest

from disagg_planner.core.schedule import shortest_cadence_s, staggered_start
from tests.unit.runtime.conftest import START_S, loop_config

FAST_S = 15.0


def test_a_thousand_loops_started_together_spread_their_ticks_over_the_period() -> None:
    keys = [f"default/g{i:04d}" for i in range(1000)]
    firsts = [staggered_start(START_S, key=k, period_s=FAST_S) + FAST_S for k in keys]

    # every first tick is ahead, within one period
    assert all(START_S < t <= START_S + FAST_S for t in firsts)
    # at most twice the even share in any tenth of the period (the tick-lag target's width);
    # without the stagger all 1,000 would be due at START_S + 15
    per_tenth = Counter(int((t - START_S) / (FAST_S / 10)) for t in firsts)
    assert len(per_tenth) == 10 and max(per_tenth.values()) <= 200, per_tenth


@pytest.mark.parametrize("later_s", [0.0, 7.3, 15.0, 3600.2])
def test_a_loop_started_again_later_ticks_at_the_same_phase(later_s: float) -> None:
    first = staggered_start(START_S, key="team-a/llama", period_s=FAST_S)
    again = staggered_start(START_S + later_s, key="team-a/llama", period_s=FAST_S)
    assert START_S + later_s - FAST_S < again <= START_S + later_s
    periods = (again - first) / FAST_S
    assert periods == pytest.approx(round(periods), abs=1e-6)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"fast_check_interval_seconds": 15.0}, 15.0),
        ({"fast_check_interval_seconds": None}, 60.0),
        (
            {
                "fast_check_interval_seconds": None,
                "enable_load_scaling": True,
                "load_adjustment_interval_seconds": 5.0,
            },
            5.0,
        ),
    ],
)
def test_the_period_is_the_shortest_cadence_that_runs(
    overrides: dict[str, object], expected: float
) -> None:
    assert shortest_cadence_s(loop_config(**overrides)) == expected
