"""The collector is kept off a simulation's objects only while it runs (simulator/heap.py)."""

from __future__ import annotations

import gc
import weakref

import pytest

from disagg_planner.predictors.traces import TraceRequest
from disagg_planner.simulator.cluster import Cluster
from disagg_planner.simulator.heap import COLLECT_EVERY, FrozenHeap
from disagg_planner.simulator.oracle import fork, run_watched

ENGINE = "sim:llama-3.1-8b-fp8@h200_sxm:tp1"


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cluster() -> Cluster:
    cluster = Cluster(
        engines={"prefill": ENGINE, "decode": ENGINE}, replicas={"prefill": 1, "decode": 1}
    )
    cluster.submit(
        [TraceRequest(arrival_s=0.1 * i, input_length=500, output_length=20) for i in range(20)]
    )
    return cluster


@pytest.mark.slow
def test_a_cycle_made_during_the_simulation_is_collected_after_it() -> None:
    assert gc.isenabled()
    cluster = _cluster()
    with FrozenHeap() as heap:
        a, b = _Node(), _Node()
        a.other, b.other = b, a
        probe = weakref.ref(a)
        del a, b
        heap.advance(cluster, 60.0)
        # frozen: the collector does not look at the cycle while the simulation runs
        assert gc.get_freeze_count() > 0
        gc.collect()
        assert probe() is not None
        assert gc.isenabled(), "the collector is back on between slices"
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert probe() is None, "the cycle is garbage once the simulation is over"
    assert len(cluster.records) == 20


def test_the_outermost_span_unfreezes_and_the_collectors_state_is_kept() -> None:
    cluster = _cluster()
    gc.disable()
    try:
        with FrozenHeap() as outer:
            with FrozenHeap() as inner:
                inner.advance(cluster, 1.0)
            assert gc.get_freeze_count() > 0, "an inner span leaves the outer's freeze"
            outer.advance(cluster, 60.0)
            assert not gc.isenabled(), "a collector that was off stays off"
        assert gc.get_freeze_count() == 0
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_an_error_inside_a_slice_still_restores_the_collector() -> None:
    cluster = _cluster()
    cluster.run_until(5.0)
    with pytest.raises(Exception, match="already"), FrozenHeap() as heap:
        heap.advance(cluster, 1.0)  # earlier than the clock: refused
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0


@pytest.mark.slow
def test_a_search_of_many_throwaway_simulations_keeps_only_a_few_alive() -> None:
    """A search forks a cluster per candidate and drops it: each is cyclic garbage (an engine
    holds its cluster) that the outermost span's end collects every COLLECT_EVERY spans, with
    no full collection of the caller's (the Mooncake trace at 8x load reached 21.7 GB)."""
    base = _cluster()
    base.run_until(1.0)
    gc.collect()
    alive: list[weakref.ref[Cluster]] = []
    for _ in range(5 * COLLECT_EVERY):
        trial = fork(base)
        alive.append(weakref.ref(trial))
        run_watched(trial, 5.0, lambda _records: False)
        del trial
    left = sum(1 for ref in alive if ref() is not None)
    assert left <= COLLECT_EVERY, f"{left} of {len(alive)} dropped simulations still alive"
