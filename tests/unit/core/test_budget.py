"""The one GPU-budget rule (``core.budget.apply_gpu_budget``): a row per case, asserting the
replicas and the reason, then the same configuration through the three loops that call it
(throughput, load, elastic EP), which must give the same cap."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from disagg_planner.config import PlannerConfig
from disagg_planner.core.budget import apply_gpu_budget, gpus_of
from disagg_planner.core.elastic import ElasticPlanner, ElasticReason
from disagg_planner.core.load_scaling import LoadDecision
from disagg_planner.core.planner import PlannerCore
from disagg_planner.core.throughput import ThroughputPlanner
from disagg_planner.core.types import (
    DeploymentStatus,
    LoadReason,
    Role,
    RoleStatus,
    ThroughputReason,
    TrafficObservation,
)
from disagg_planner.predictors import make_predictors
from disagg_planner.profiles import Profile
from tests.unit.elastic.test_policy import PROFILE as ELASTIC_PROFILE
from tests.unit.elastic.test_policy import config as elastic_config

ORDER: tuple[Role, Role] = ("prefill", "decode")
MAX, MIN, FOOT = "max_gpu_budget", "min_gpu_budget", "min_footprint"


@dataclass(frozen=True)
class Row:
    """``wanted``/``current``/``expect`` are (prefill, decode) replicas; ``limited_by`` and
    ``reconcile`` the reason the rule gives."""

    name: str
    wanted: tuple[int, int]
    expect: tuple[int, int]
    limited_by: str | None
    current: tuple[int, int] | None = None
    reconcile: bool = False
    gpus: tuple[int, int] = (1, 1)
    floors: tuple[int, int] = (1, 1)
    max_gpus: int = -1
    min_gpus: int = -1
    other_gpus: int = 0
    message: str = ""


ROWS = [
    Row("no bounds: untouched", (40, 60), (40, 60), None),
    Row("within the band: untouched", (3, 4), (3, 4), None, current=(1, 1), max_gpus=8),
    Row(
        "ceiling, nothing held: growth shared, prefill first, decode the rest",
        (6, 10),
        (3, 5),
        MAX,
        max_gpus=8,
        message="16 GPUs wanted, max_gpu_budget is 8",
    ),
    Row(
        "ceiling: each role keeps what it has, the headroom goes to the growth",
        (6, 10),
        (3, 5),
        MAX,
        current=(2, 2),
        max_gpus=8,
    ),
    Row(
        "ceiling: a decode scale-up takes no prefill replica",
        (4, 5),
        (4, 4),
        MAX,
        current=(4, 4),
        max_gpus=8,
    ),
    Row(
        "ceiling: a prefill scale-up takes no decode replica",
        (5, 4),
        (4, 4),
        MAX,
        current=(4, 4),
        max_gpus=8,
    ),
    Row(
        "ceiling: a rebalance the roles asked for goes through",
        (3, 6),
        (3, 5),
        MAX,
        current=(4, 4),
        max_gpus=8,
    ),
    Row(
        "ceiling: both growing at a full budget hold",
        (8, 6),
        (3, 5),
        MAX,
        current=(3, 5),
        max_gpus=8,
    ),
    Row(
        "ceiling, multi-GPU engines: never above it",
        (4, 4),
        (2, 3),
        MAX,
        current=(1, 1),
        gpus=(2, 4),
        max_gpus=16,
    ),
    Row(
        "ceiling: an allocation above it is reconciled, same share above the floors",
        (5, 2),
        (3, 2),
        MAX,
        current=(5, 2),
        reconcile=True,
        max_gpus=5,
        message="7 GPUs held, max_gpu_budget is 5; reconciling",
    ),
    Row(
        "ceiling: reconciling keeps a wanted shrink",
        (5, 4),
        (3, 3),
        MAX,
        current=(6, 4),
        reconcile=True,
        max_gpus=6,
    ),
    Row(
        "ceiling: floors above it hold instead of scaling to zero",
        (5, 5),
        (5, 5),
        FOOT,
        current=(5, 5),
        gpus=(4, 4),
        max_gpus=6,
        message="the minimum endpoints need 8 GPUs, above max_gpu_budget 6",
    ),
    Row(
        "ceiling: GPUs of roles not sized here count",
        (4, 4),
        (3, 3),
        MAX,
        current=(1, 1),
        max_gpus=8,
        other_gpus=2,
        message="10 GPUs wanted",
    ),
    Row(
        "ceiling: other roles can leave no room for the floors",
        (1, 1),
        (1, 1),
        FOOT,
        current=(1, 1),
        max_gpus=8,
        other_gpus=7,
        message="the minimum endpoints and the other roles need 9 GPUs",
    ),
    Row(
        "floor, nothing held: the roles grow by the same factor",
        (1, 1),
        (3, 3),
        MIN,
        reconcile=True,
        max_gpus=10,
        min_gpus=6,
        message="2 GPUs wanted, min_gpu_budget is 6",
    ),
    Row(
        "floor: a current allocation below it is reconciled",
        (1, 1),
        (2, 2),
        MIN,
        current=(1, 1),
        reconcile=True,
        min_gpus=4,
    ),
    Row(
        "floor: a prefill scale-down stops at it",
        (3, 4),
        (4, 4),
        MIN,
        current=(4, 4),
        min_gpus=8,
    ),
    Row(
        "floor: a decode scale-down stops at it and grows no prefill replica",
        (4, 3),
        (4, 4),
        MIN,
        current=(4, 4),
        min_gpus=8,
    ),
    Row(
        "floor: two shrinks each keep the same share",
        (2, 2),
        (3, 3),
        MIN,
        current=(4, 4),
        min_gpus=6,
    ),
    Row(
        "floor gives way where reaching it would cross the ceiling",
        (1, 1),
        (1, 1),
        None,
        gpus=(4, 4),
        max_gpus=9,
        min_gpus=9,
        message="raising to min_gpu_budget would cross max_gpu_budget",
    ),
]


def pair(values: tuple[int, int]) -> dict[str, int]:
    return dict(zip(ORDER, values, strict=True))


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_rule(row: Row) -> None:
    result = apply_gpu_budget(
        pair(row.wanted),
        gpus_per_replica=pair(row.gpus),
        floors=pair(row.floors),
        max_gpus=row.max_gpus,
        min_gpus=row.min_gpus,
        order=ORDER,
        current=None if row.current is None else pair(row.current),
        other_gpus=row.other_gpus,
    )
    assert result.replicas == pair(row.expect), result.message
    assert (result.limited_by, result.reconcile) == (row.limited_by, row.reconcile)
    assert result.hold == (row.limited_by == FOOT)
    assert row.message in result.message
    if row.max_gpus != -1 and not result.hold:
        assert gpus_of(result.replicas, pair(row.gpus)) + row.other_gpus <= row.max_gpus


# --- one configuration, one cap: the three loops --------------------------------------------


def status(p: int, d: int, *, gpus: int = 1) -> DeploymentStatus:
    return DeploymentStatus({"prefill": RoleStatus(p, p, gpus), "decode": RoleStatus(d, d, gpus)})


def throughput_tick(
    profile: Profile, current: tuple[int, int], num_req: float, **cfg: Any
) -> tuple[dict[str, int] | None, ThroughputReason, str]:
    planner = ThroughputPlanner(
        config=PlannerConfig(
            throughput_adjustment_interval_seconds=60,
            itl_ms=30,
            max_throughput_scaling_replicas=100,
            **cfg,
        ),
        profile=profile,
        predictor_factory=lambda series: make_predictors("constant", series),
    )
    obs = TrafficObservation(end_s=60, duration_s=60, num_req=num_req, isl=3000, osl=300)
    decision = planner.tick(60, obs, status(*current))
    return decision.replicas, decision.reason, decision.message


def load_tick(
    current: tuple[int, int], proposed: tuple[int, int], **cfg: Any
) -> tuple[dict[str, int] | None, LoadReason | None]:
    """The load loop's proposals through the planner's combine step, where the budget acts."""
    core = PlannerCore(
        config=PlannerConfig(
            enable_throughput_scaling=False, enable_load_scaling=True, itl_ms=30, **cfg
        ),
        start_s=0.0,
    )
    load: dict[str, LoadDecision] = {
        role: LoadDecision(role, n, LoadReason.SCALE_UP if n > now else LoadReason.NO_CHANGE)
        for role, n, now in zip(ORDER, proposed, current, strict=True)
    }
    effects = core._combine(10.0, 15.0, status(*current), None, load)
    return effects.scale_to, effects.load_reason


@dataclass(frozen=True)
class LoopRow:
    name: str
    current: tuple[int, int]
    throughput: tuple[tuple[int, int] | None, ThroughputReason]  # at a load far above 8 GPUs
    load: tuple[tuple[int, int] | None, LoadReason | None]  # decode +1
    cfg: tuple[tuple[str, int], ...]


LOOP_ROWS = [
    LoopRow(
        "room under the ceiling: both loops grow into it (throughput: 39 and 46 wanted, "
        "prefill pooled over its engines)",
        (1, 1),
        ((3, 5), ThroughputReason.SCALE),
        ((1, 2), LoadReason.SCALE_UP),
        (("max_gpu_budget", 8),),
    ),
    LoopRow(
        "at the ceiling: neither loop grows, neither takes a replica from the other role",
        (4, 4),
        ((4, 4), ThroughputReason.GPU_BUDGET_GUARD_HOLD),
        (None, LoadReason.GPU_BUDGET_GUARD_HOLD),
        (("max_gpu_budget", 8),),
    ),
    LoopRow(
        "above the ceiling: both loops reconcile to the same allocation",
        (5, 4),
        ((2, 3), ThroughputReason.GPU_BUDGET_RECONCILE),
        ((2, 3), LoadReason.GPU_BUDGET_RECONCILE),
        (("max_gpu_budget", 5),),
    ),
]


@pytest.mark.parametrize("row", LOOP_ROWS, ids=[r.name for r in LOOP_ROWS])
def test_loops_share_the_cap(h200_like_profile: Profile, row: LoopRow) -> None:
    cfg = dict(row.cfg)
    replicas, reason, message = throughput_tick(h200_like_profile, row.current, 30000, **cfg)
    want, want_reason = row.throughput
    assert (replicas, reason) == (pair(want) if want else None, want_reason), message
    scale_to, load_reason = load_tick(row.current, (row.current[0], row.current[1] + 1), **cfg)
    want_load, want_load_reason = row.load
    assert (scale_to, load_reason) == (pair(want_load) if want_load else None, want_load_reason)


def test_min_budget_stops_a_load_scale_down() -> None:
    scale_to, reason = load_tick((4, 4), (4, 3), min_gpu_budget=8, max_gpu_budget=16)
    assert (scale_to, reason) == (None, LoadReason.GPU_BUDGET_GUARD_HOLD)


def elastic(**overrides: Any) -> ElasticPlanner:
    """The elastic policy tests' engine (DP 16, steps of 4), here up to DP 28."""
    overrides.setdefault("elastic_ep_max_dp", 28)
    return ElasticPlanner(config=elastic_config(**overrides), profile=ELASTIC_PROFILE)


@pytest.mark.parametrize(
    ("name", "cfg", "other_gpus", "bounds"),
    [
        ("no budget: the configured sizes", {}, 0, (16, 28)),
        ("ceiling: lowered to a whole step", {"max_gpu_budget": 27}, 0, (16, 24)),
        ("ceiling: the other roles' GPUs count", {"max_gpu_budget": 27}, 4, (16, 20)),
        ("floor: raised to a whole step", {"min_gpu_budget": 21}, 0, (24, 28)),
        ("floor: the other roles' GPUs count", {"min_gpu_budget": 21}, 4, (20, 28)),
        (
            "floor never above the ceiling",
            {"min_gpu_budget": 40, "max_gpu_budget": 40},
            20,
            (20, 20),
        ),
    ],
)
def test_elastic_sizes_within_the_budget(
    name: str, cfg: dict[str, int], other_gpus: int, bounds: tuple[int, int]
) -> None:
    planner = elastic(**cfg)
    got = (planner.min_dp_within_budget(other_gpus), planner.max_dp_within_budget(other_gpus))
    assert got == bounds, name


def test_elastic_holds_when_not_even_the_leader_fits() -> None:
    planner = elastic(max_gpu_budget=20)
    obs = TrafficObservation(
        end_s=30.0, duration_s=30.0, num_req=30, ttft_ms=800.0, isl=9000, osl=2000
    )
    decision = planner.tick(30.0, obs, current_dp=20, other_gpus=8)
    assert (decision.target_dp, decision.reason) == (None, ElasticReason.GPU_BUDGET_GUARD_HOLD)
    assert "the minimum endpoints and the other roles need 24 GPUs" in decision.message


def test_elastic_reconciles_up_to_the_min_budget() -> None:
    obs = TrafficObservation(end_s=30.0, duration_s=30.0, num_req=0)
    decision = elastic(min_gpu_budget=24).tick(30.0, obs, current_dp=16)
    assert (decision.target_dp, decision.reason) == (24, ElasticReason.RECONCILE_TO_BOUNDS)
