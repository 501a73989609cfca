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
