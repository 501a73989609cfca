"""benchmarks/fleet.py: the verdict on the high-priority target (>= 99 % wherever the
member's own best static reaches it within what the pool can grant it) and its cause, on
rows of the shape ``planner replay --fleet`` writes. The runs themselves take minutes."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from tests.unit.benchmarks.scripts import load_script


@pytest.fixture(scope="module")
def fleet() -> ModuleType:
    return load_script("fleet")


def row(split: str, attainment: float, *, ceiling: int = 24) -> dict[str, Any]:
    return {
        "fleet": "pair",
        "split": split,
        "pool": {"max_total_gpus": ceiling},
        "members": {
            "hi": {"floor_gpus": 8, "slo_attainment": {"both": attainment}},
            "lo": {"floor_gpus": 8, "slo_attainment": {"both": 1.0}},
        },
    }


def best(gpus: int, attainment: float = 1.0, qualifies: bool = True) -> dict[str, Any]:
    return {
        "fleet": "pair",
        "member": "hi",
        "replicas": {"prefill": gpus // 4 - 1, "decode": 1},
        "gpus": gpus,
        "gpu_hours": 3.0,
        "attainment": attainment,
        "qualifies": qualifies,
    }


@pytest.mark.parametrize(
    ("shared", "unbounded", "own", "verdict"),
    [
        (
            0.995,
            1.0,
            best(16),
            "within the 16 GPUs the pool can grant it; shared 99.50% >= 99%: met",
        ),
        (0.95, 1.0, best(16), "MISSED (cause: the pool; without a ceiling it reaches 100.00%)"),
        (
            0.95,
            0.96,
            best(16),
            "MISSED (cause: its own planner without a ceiling reaches only 96.00%",
        ),
        # the ceiling (24) less the other member's floor (8) is 16: 20 GPUs are beyond it
        (0.5, 1.0, best(20), "on more than the pool can grant it (16 GPUs"),
        (0.5, 1.0, best(16, 0.97, qualifies=False), "under 99%: target not applicable"),
    ],
    ids=["met", "missed by the pool", "missed by its own planner", "beyond the pool", "no static"],
)
def test_the_high_priority_target_applies_where_the_best_static_fits(
    fleet: ModuleType, shared: float, unbounded: float, own: dict[str, Any], verdict: str
) -> None:
    group = {"shared": row("shared", shared), "unbounded": row("unbounded", unbounded)}
    line = fleet._best_static_target(group, own)
    assert verdict in line, line
    assert ("MISSED" in line) == (own["gpus"] <= 16 and own["qualifies"] and shared < 0.99)


def spent(gpu_hours: float, attainment: float, *late: dict[str, Any]) -> dict[str, Any]:
    return {
        "gpu_hours": gpu_hours,
        "slo_attainment": {"both": attainment},
        "last_arrival_s": 899.998,
        "ready_after_last_arrival": list(late),
    }


def test_the_gpu_hour_cause_names_every_member_and_capacity_ready_after_the_traffic(
    fleet: ModuleType,
) -> None:
    """The shared pool's extra GPU-hours against the static split, member by member (those
    that spent less too), and the part that is a replica ready only after the last arrival
    (one the static run also started is not counted)."""
    late = {"role": "decode", "gpus": 4, "start_s": 840.0, "ready_s": 900.0, "gpu_hours": 0.068}
    both = {"role": "prefill", "gpus": 4, "start_s": 700.0, "ready_s": 901.0, "gpu_hours": 0.2}
    static = {
        "members": {
            "large": spent(4.0, 0.85),
            "mid": spent(2.0, 1.0),
            "small": spent(1.6, 1.0, both),
        }
    }
    shared = {
        "members": {
            "large": spent(4.133, 1.0),
            "mid": spent(1.8, 1.0),
            "small": spent(1.669, 1.0, both, late),
        }
    }
    cause = fleet._gpu_hours_cause(shared, static)
    assert cause == (
        " (cause, per member, shared against static: large +0.133 GPU-h, attainment 85.00% -> "
        "100.00%; mid -0.200 GPU-h, attainment 100.00% in both; small +0.069 GPU-h, attainment "
        "100.00% in both, of which 0.068 GPU-h is capacity ready only after its last arrival "
        "(899.998 s): 4 GPUs of decode ordered at 840 s, ready at 900 s)"
    )
