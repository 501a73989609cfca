"""Which signal ends a scale-down drain (``connectors/kubernetes/drain.drain_end``): one table
of named rows, each checking the signal (None: wait on). ``lowered``: the count was lowered
first and the terminating worker's own staged shutdown is followed (issue 35)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from disagg_planner.connectors.kubernetes.drain import DrainEnd, drain_end
from disagg_planner.signals.shutdown import ShutdownReading


def reading(
    inflight: int, kv: bool | None, *, stage: str = "inflight", outcome: str = "started"
) -> ShutdownReading:
    return ShutdownReading(
        inflight=inflight, kv_quiescent=kv, remaining_s=20.0, stage=stage, outcome=outcome
    )


@dataclass(frozen=True)
class Row:
    name: str
    expected: DrainEnd | None
    pods: tuple[str, ...] = ("a",)
    loads: Mapping[str, int] = field(default_factory=dict)
    shutdown: Mapping[str, ShutdownReading] = field(default_factory=dict)
    budgets: Mapping[str, float] = field(default_factory=dict)
    gone: frozenset[str] = frozenset()
    waited_s: float = 1.0
    lowered: bool = False


ROWS = [
    Row("no ready pod leaves", DrainEnd.NOTHING_SERVING, pods=()),
    Row("before lowering, no signal at all: nothing to wait for", DrainEnd.NO_LOAD_SIGNAL),
    Row("after lowering, no signal yet: wait for the worker", None, lowered=True),
    Row("FPM idle", DrainEnd.IDLE, loads={"a": 0}),
    Row("FPM busy", None, loads={"a": 2}),
    Row("KV quiescent, none in flight", DrainEnd.KV_QUIESCENT, shutdown={"a": reading(0, True)}),
    Row(
        "KV busy holds whatever the FPM say",
        None,
        loads={"a": 0},
        shutdown={"a": reading(0, False)},
    ),
    Row(
        "past serving (a teardown stage) though KV unknown",
        DrainEnd.SHUTDOWN_STAGE,
        shutdown={"a": reading(3, None, stage="cleanup")},
    ),
    Row("none in flight, KV unknown", DrainEnd.INFLIGHT_ZERO, shutdown={"a": reading(0, None)}),
    Row(
        "in flight by a stale snapshot, KV unknown: the FPM decide",
        DrainEnd.IDLE,
        loads={"a": 0},
        shutdown={"a": reading(2, None)},
    ),
    Row("the pod is gone", DrainEnd.POD_GONE, gone=frozenset({"a"}), lowered=True),
    Row(
        "several pods: the weakest evidence names the end",
        DrainEnd.IDLE,
        pods=("a", "b"),
        loads={"b": 0},
        shutdown={"a": reading(0, True)},
    ),
    Row(
        "the worker's own budget is spent",
        DrainEnd.WORKER_BUDGET,
        shutdown={"a": reading(2, False)},
        budgets={"a": 8.0},
        waited_s=8.0,
        lowered=True,
    ),
    Row(
        "one busy pod without a known budget keeps the drain going",
        None,
        pods=("a", "b"),
        loads={"b": 1},
        shutdown={"a": reading(2, False)},
        budgets={"a": 8.0},
        waited_s=9.0,
    ),
    Row("the drain timeout", DrainEnd.TIMEOUT, loads={"a": 1}, waited_s=30.0),
]


@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
def test_drain_end(row: Row) -> None:
    end = drain_end(
        row.pods,
        row.loads,
        waited_s=row.waited_s,
        timeout_s=30.0,
        shutdown=row.shutdown,
        budget_ends_s=row.budgets,
        gone=row.gone,
        lowered=row.lowered,
    )
    assert end is row.expected, f"{row.name}: {end} (expected {row.expected})"
