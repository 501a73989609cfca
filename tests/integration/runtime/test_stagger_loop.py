"""The operator's loop on kmock and canned Prometheus ticks first at its own phase (issue 36);
a loop without ``stagger_ticks`` (replay, ``planner run``) one interval after its start;
either counts from when its set-up is done, and loops sharing a start-up gate set up a few
at a time."""

from __future__ import annotations

import asyncio

import pytest

from disagg_planner.core.schedule import staggered_start
from tests.integration.connectors.conftest import DGD_NAME, NS
from tests.integration.runtime.conftest import JumpClock
from tests.unit.runtime.conftest import loop_config

FAST_S = 15.0


async def test_the_operator_loop_first_ticks_at_its_phase_and_replay_at_one_interval(
    cluster, harness_factory
) -> None:
    config = loop_config(fast_check_interval_seconds=FAST_S)
    staggered = harness_factory(config, stagger_ticks=True)
    await staggered.start()
    plain = harness_factory(config)
    await plain.start()
    now = staggered.clock.now()
    assert staggered.loop.core is not None and plain.loop.core is not None

    expected = staggered_start(now, key=f"{NS}/{DGD_NAME}", period_s=FAST_S) + FAST_S
    assert staggered.loop.core.next_tick_at_s == pytest.approx(expected, abs=1e-6)
    assert now < staggered.loop.core.next_tick_at_s <= now + FAST_S
    # the default (replay, planner run): one interval after the start, as before
    assert plain.loop.core.next_tick_at_s == plain.clock.now() + FAST_S

    outcome = await staggered.next_tick()
    assert outcome is not None and outcome.t_s == pytest.approx(expected, abs=1e-6)
    assert staggered.loop.core.next_tick_at_s == pytest.approx(expected + FAST_S, abs=1e-6)


async def test_a_loop_whose_set_up_waited_its_turn_first_ticks_after_it_is_ready(
    cluster, harness_factory
) -> None:
    """A thousand loops starting together queue their set-up in the worker threads: the
    schedule starts when the loop is ready, so its first tick is ahead of it, never already
    due (and late) when the set-up ends."""
    config = loop_config(fast_check_interval_seconds=FAST_S)
    clocks: list[JumpClock] = []

    async def queued(fn, *args, **kwargs):  # each offloaded call waits 40 s for a thread
        clocks[0].now_s += 40.0
        return await asyncio.to_thread(fn, *args, **kwargs)

    for stagger in (True, False):
        clocks.clear()
        harness = harness_factory(config, stagger_ticks=stagger, offload=queued)
        clocks.append(harness.clock)
        began = harness.clock.now()
        await harness.start()
        ready = harness.clock.now()
        assert ready >= began + 40.0  # the build waited
        assert harness.loop.core is not None
        first = harness.loop.core.next_tick_at_s
        if stagger:
            expected = staggered_start(ready, key=f"{NS}/{DGD_NAME}", period_s=FAST_S) + FAST_S
            assert first == pytest.approx(expected, abs=1e-6)
            assert ready < first <= ready + FAST_S
        else:
            assert first == ready + FAST_S


async def test_loops_sharing_a_startup_gate_set_up_a_few_at_a_time(
    cluster, harness_factory
) -> None:
    """The operator's loops share one start-up gate: however many start together, at most
    its size validate and build at once (the rest wait their turn, in order), so the worker
    threads are not filled with set-ups ahead of the ticks of the loops already running."""
    gate = asyncio.Semaphore(2)
    building = 0
    most = 0

    async def offload(fn, *args, **kwargs):
        nonlocal building, most
        building += 1
        most = max(most, building)
        try:
            await asyncio.sleep(0.05)  # a set-up that takes a while
            return await asyncio.to_thread(fn, *args, **kwargs)
        finally:
            building -= 1

    harnesses = [
        harness_factory(loop_config(), stagger_ticks=True, offload=offload, startup_gate=gate)
        for _ in range(6)
    ]
    await asyncio.gather(*(h.start() for h in harnesses))

    assert all(h.loop.core is not None for h in harnesses)
    assert most == 2
