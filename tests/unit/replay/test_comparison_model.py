"""What the comparison page says (replay/comparison_model.py): the winner by its stated rule,
each policy's one-line verdict and its reason, the unservable ceiling, the tally of each
policy's ticks, and the offered load. Tables of named rows, each checking the answer and the
reason the page gives for it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from disagg_planner.errors import SpecError
from disagg_planner.replay.comparison_model import (
    TickReason,
    WinnerRule,
    compare,
    offered_load,
    pick_winner,
    verdict_of,
)
from disagg_planner.replay.replay_summary import ReplaySummary
from disagg_planner.report.decisions import ReasonCount


def summary(
    policy: str,
    both: float,
    gpu_hours: float,
    *,
    ttft: float | None = None,
    itl: float | None = None,
    target: float | None = 0.99,
    failed: int = 0,
    unservable: int | None = None,
) -> ReplaySummary:
    """A summary.json of 1,000 requests scored against TTFT 500 ms / ITL 50 ms and
    ``target`` (None: written before replays recorded their targets)."""
    data: dict[str, Any] = {
        "policy": policy,
        "requests": 1000,
        "completed": 1000 - failed,
        "failed": failed,
        "slo_attainment": {
            "ttft": both if ttft is None else ttft,
            "itl": 1.0 if itl is None else itl,
            "both": both,
        },
        "ttft_ms": {"p50": 40.0, "p90": 300.0, "p95": 400.0, "p99": 510.0},
        "itl_ms": {"p50": 5.0, "p90": 7.0, "p95": 8.0, "p99": 9.0},
        "unfinished": 0,
        "gpu_hours": gpu_hours,
        "gpu_hours_by_role": {"prefill": gpu_hours},
        "replica_hours": {"prefill": gpu_hours},
        "metered_span_s": 3600.0,
        "last_arrival_s": 3500.0,
        "scale_actions": {"prefill": 0},
        "drain": {"grace_s": 60.0, "cancelled": 0, "migrated": 0},
        "rejected": 0,
        "flaps": {"prefill": 0},
        "flap_window_s": 600.0,
        "max_replicas": {"prefill": 3},
        "duration_s": 3600.0,
        "wall_s": 1.0,
        "startup_delay_s": None,
        "initial_replicas": {"prefill": 2},
    }
    if target is not None:
        data["slo"] = {"ttft_ms": 500.0, "itl_ms": 50.0, "attainment_target": target}
    if unservable is not None:
        data |= {
            "slo_target": 0.99,
            "unservable_requests": unservable,
            "oracle_plan": "windows",
            "oracle_gpu_hours": 1.0,
            "oracle_slo_attainment": 0.9,
            "gpu_hours_ratio_to_oracle": gpu_hours,
            "best_static": {
                "replicas": {"prefill": 3},
                "gpu_hours": 2.0,
                "slo_attainment": 0.9,
                "meets_target": False,
                "qualifies": True,
            },
            "gpu_hours_ratio_to_best_static": gpu_hours / 2.0,
            "fluid_bound_gpu_hours": None,
            "gpu_hours_ratio_to_fluid_bound": None,
        }
    return ReplaySummary.from_json(data)


@dataclass(frozen=True)
class WinnerCase:
    name: str
    runs: tuple[ReplaySummary, ...]
    winner: str
    rule: WinnerRule
    why: str  # a phrase the page's reason must hold


WINNER_CASES = (
    WinnerCase(
        "the cheapest of the policies meeting the target",
        (
            summary("planner", 0.995, 2.0),
            summary("hpa", 0.992, 1.8),
            summary("dynamo-default", 0.98, 1.0),  # cheapest, but misses
        ),
        "hpa",
        WinnerRule.CHEAPEST_MEETING_TARGET,
        "the fewest GPU-hours (1.80) of the 2 policies meeting the target",
    ),
    WinnerCase(
        "the only policy meeting the target, however dear",
        (summary("planner", 0.995, 5.0), summary("hpa", 0.98, 1.0)),
        "planner",
        WinnerRule.CHEAPEST_MEETING_TARGET,
        "the only policy meeting the target",
    ),
    WinnerCase(
        "none meets: the highest attainment, however dear",
        (summary("planner", 0.90, 3.0), summary("hpa", 0.95, 5.0)),
        "hpa",
        WinnerRule.HIGHEST_ATTAINMENT,
        "no policy meets the target; the highest attainment (95.00%, on 5.00 GPU-h)",
    ),
    WinnerCase(
        "equal GPU-hours among those meeting: the higher attainment",
        (summary("a", 0.991, 2.0), summary("b", 0.999, 2.0)),
        "b",
        WinnerRule.CHEAPEST_MEETING_TARGET,
        "of the 2 policies meeting",
    ),
    WinnerCase(
        "equal attainment and none meets: the fewer GPU-hours",
        (summary("a", 0.90, 3.0), summary("b", 0.90, 2.0)),
        "b",
        WinnerRule.HIGHEST_ATTAINMENT,
        "(90.00%, on 2.00 GPU-h)",
    ),
    WinnerCase(
        "the oracle is a yardstick: cheaper and meeting, it does not win",
        (summary("oracle", 1.0, 1.0), summary("planner", 0.995, 2.0)),
        "planner",
        WinnerRule.CHEAPEST_MEETING_TARGET,
        "the only policy meeting the target",
    ),
    WinnerCase(
        "best-static is a yardstick too, even when no policy meets",
        (summary("best-static", 0.999, 1.0), summary("planner", 0.90, 2.0)),
        "planner",
        WinnerRule.HIGHEST_ATTAINMENT,
        "no policy meets the target",
    ),
    WinnerCase(
        "only references replayed: chosen among them, and the page says so",
        (summary("oracle", 0.995, 1.0), summary("best-static", 0.999, 2.0)),
        "oracle",
        WinnerRule.CHEAPEST_MEETING_TARGET,
        "only references were replayed",
    ),
    WinnerCase(
        "summaries without a target meet none: the highest attainment",
        (summary("a", 0.999, 1.0, target=None), summary("b", 0.95, 0.5, target=None)),
        "a",
        WinnerRule.HIGHEST_ATTAINMENT,
        "no policy meets the target",
    ),
    WinnerCase(
        "each policy is held to its own target",
        (summary("a", 0.995, 1.0, target=0.999), summary("b", 0.995, 2.0, target=0.99)),
        "b",
        WinnerRule.CHEAPEST_MEETING_TARGET,
        "the only policy meeting the target",
    ),
)


@pytest.mark.parametrize("case", WINNER_CASES, ids=lambda c: c.name)
def test_the_winner_by_the_stated_rule(case: WinnerCase) -> None:
    baseline = next((s for s in case.runs if s.policy == "hpa"), None)
    winner = pick_winner([verdict_of(s, baseline=baseline) for s in case.runs])
    assert (winner.policy, winner.rule) == (case.winner, case.rule)
    assert case.why in winner.why


@dataclass(frozen=True)
class VerdictCase:
    name: str
    run: ReplaySummary
    line: str
    reason: str  # a phrase the reason must hold
    meets: bool | None


HPA = summary("hpa", 0.999, 2.0)

VERDICT_CASES = (
    VerdictCase(
        "meets: the target, the GPU-hours and their ratio to hpa's",
        summary("planner", 0.995, 1.84),
        "meets the 99% target on 1.84 GPU-h, 0.92x hpa",
        "99.50% of requests within TTFT 500 ms and ITL 50 ms",
        True,
    ),
    VerdictCase(
        "hpa itself is compared with nothing",
        HPA,
        "meets the 99% target on 2.00 GPU-h",
        "99.90% of requests",
        True,
    ),
    VerdictCase(
        "exactly on the target meets it",
        summary("planner", 0.99, 1.0),
        "meets the 99% target on 1.00 GPU-h, 0.50x hpa",
        "99.00%",
        True,
    ),
    VerdictCase(
        "TTFT binds",
        summary("planner", 0.90, 3.0, ttft=0.90, itl=0.999),
        "misses the 99% target: 90.00% on 3.00 GPU-h, 1.50x hpa",
        "TTFT binds (TTFT <= 500 ms for 90.00%; ITL <= 50 ms for 99.90%)",
        False,
    ),
    VerdictCase(
        "ITL binds",
        summary("planner", 0.95, 1.0, ttft=0.999, itl=0.95),
        "misses the 99% target: 95.00% on 1.00 GPU-h, 0.50x hpa",
        "ITL binds (ITL <= 50 ms for 95.00%; TTFT <= 500 ms for 99.90%)",
        False,
    ),
    VerdictCase(
        "both bind",
        summary("planner", 0.90, 1.0, ttft=0.95, itl=0.93),
        "misses the 99% target: 90.00% on 1.00 GPU-h, 0.50x hpa",
        "both latency targets bind",
        False,
    ),
    VerdictCase(
        "each target alone passes, not on the same requests",
        summary("planner", 0.985, 1.0, ttft=0.993, itl=0.992),
        "misses the 99% target: 98.50% on 1.00 GPU-h, 0.50x hpa",
        "each target alone passes",
        False,
    ),
    VerdictCase(
        "failed requests are named",
        summary("planner", 0.97, 1.0, ttft=0.97, failed=30),
        "misses the 99% target: 97.00% on 1.00 GPU-h, 0.50x hpa",
        "30 of 1000 requests failed or never finished",
        False,
    ),
    VerdictCase(
        "a target that is not a whole percent keeps its decimal",
        summary("planner", 0.995, 1.0, target=0.999),
        "misses the 99.9% target: 99.50% on 1.00 GPU-h, 0.50x hpa",
        "TTFT binds",
        False,
    ),
    VerdictCase(
        "a summary without a target says so",
        summary("planner", 0.995, 1.0, target=None),
        "scored without an attainment target: 99.50% within both on 1.00 GPU-h, 0.50x hpa",
        "names no SLO target",
        None,
    ),
)


@pytest.mark.parametrize("case", VERDICT_CASES, ids=lambda c: c.name)
def test_each_policy_verdict_in_one_line_with_its_reason(case: VerdictCase) -> None:
    verdict = verdict_of(case.run, baseline=HPA)
    assert verdict.line == case.line
    assert case.reason in verdict.reason
    assert verdict.meets is case.meets
    assert verdict.meets is case.run.meets_target  # the summary's own verdict, not a second


def test_without_hpa_the_verdicts_compare_with_nothing() -> None:
    model = compare([summary("planner", 0.995, 1.0), summary("oracle", 1.0, 0.5)], {})
    assert model.baseline is None
    assert [v.line for v in model.verdicts] == [
        "meets the 99% target on 1.00 GPU-h",
        "meets the 99% target on 0.50 GPU-h",
    ]


@pytest.mark.parametrize(
    ("unservable", "line"),
    [
        (
            150,
            "150 of 1000 requests (15.00%) miss the latency targets even alone on an idle "
            "cluster: 85.00% is the most any policy reaches, under the 99% target: no policy "
            "can meet it here",
        ),
        (
            5,
            "5 of 1000 requests (0.50%) miss the latency targets even alone on an idle "
            "cluster: 99.50% is the most any policy reaches",
        ),
        (0, None),
    ],
    ids=["under the target", "above the target", "none"],
)
def test_requests_no_policy_can_serve_cap_every_policy(unservable: int, line: str | None) -> None:
    model = compare(
        [summary("planner", 0.84, 2.0, unservable=unservable), summary("hpa", 0.8, 1.0)], {}
    )
    assert (None if model.unservable is None else model.unservable.line) == line


def test_each_policy_ticks_are_tallied_by_reason() -> None:
    ticks = {
        "planner": [
            TickReason("no_change", False),
            TickReason("scale", True),
            TickReason("no_change", False),
            TickReason("", False),
        ],
        "hpa": [TickReason("hpa", True), TickReason("hpa", False)],
    }
    model = compare([summary("planner", 0.995, 1.0), summary("hpa", 0.99, 1.0)], ticks)
    assert model.tallies == {
        "planner": (
            ReasonCount("no_change", 2, 0),
            ReasonCount("no reason recorded", 1, 0),
            ReasonCount("scale", 1, 1),
        ),
        "hpa": (ReasonCount("hpa", 2, 1),),
    }


def test_a_policy_given_twice_is_refused_by_name() -> None:
    with pytest.raises(SpecError, match="policy planner appears more than once"):
        compare([summary("planner", 0.99, 1.0), summary("planner", 0.98, 1.0)], {})
    with pytest.raises(SpecError, match="nothing to compare"):
        compare([], {})


def test_the_offered_load_counts_arrivals_per_window_from_time_zero() -> None:
    arrival = np.array([0.0, 10.0, 59.9, 60.0, 185.0])
    isl = np.array([100.0, 200.0, 300.0, 600.0, 60.0])
    load = offered_load(arrival, isl, window_s=60.0)
    assert load.t_s == (0.0, 60.0, 120.0, 180.0)
    # the window 120-180 s had no arrival: a zero, not a gap
    assert load.requests_per_s == pytest.approx((3 / 60, 1 / 60, 0.0, 1 / 60))
    assert load.prompt_tokens_per_s == pytest.approx((10.0, 10.0, 0.0, 1.0))
    assert offered_load(np.array([]), np.array([])).requests_per_s == (0.0,)
