"""Engines publish ForwardPassMetrics over real sockets; the subscriber collects them, the
regression learns from them, and the load decision goes up, down or holds.

Each engine follows a known wall-time law with 3 % noise; its first iterations after start
are 8x slower (cold start) and must not matter. The virtual clock only drives staleness.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import zmq

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.core.load_scaling import (
    LoadDecision,
    decide_load,
    make_load_model,
    resolve_engine_limits,
)
from disagg_planner.core.types import LoadReason, Role
from disagg_planner.observe.fpm_subscriber import FpmSubscriber
from disagg_planner.regression.models import LoadModel
from tests.integration.fpm.conftest import VirtualClock
from tests.integration.fpm.engines import EnginePublisher, connect, wait_for
from tests.unit.regression.fpm_factory import decode_law, prefill_law

CONFIG = PlannerConfig(
    enable_load_scaling=True,
    ttft_ms=500.0,
    itl_ms=50.0,
    load_scaling_down_sensitivity=80,
    fpm_staleness_seconds=10.0,
    max_kv_tokens=2_000_000,
)
WARMUP = CONFIG.fpm_warmup_iterations


class Cluster:
    """One role's engines, their subscriber and model, and the tick that decides."""

    def __init__(self, context: zmq.Context, clock: VirtualClock, role: Role, engines: int) -> None:
        self.role = role
        self.rng = np.random.default_rng(42)
        self.publishers = [EnginePublisher(context, worker=f"{role}-{i}") for i in range(engines)]
        self.subscriber = FpmSubscriber(
            endpoints=[p.endpoint for p in self.publishers],
            staleness_s=CONFIG.fpm_staleness_seconds,
            clock=clock,
            name=role,
        )
        self.model: LoadModel = make_load_model(role, CONFIG)
        self.clock = clock
        self.sent = 0

    def start(self) -> None:
        self.subscriber.start()
        for pub in self.publishers:
            connect(pub, self.subscriber)
        # the connect heartbeats count too; from here every frame is accounted
        self.sent = self.subscriber.counters()["received"]

    def run_iterations(self, pub: EnginePublisher, count: int, **queue: int) -> None:
        """``count`` busy iterations of one engine, the last one's queue as given."""
        for _ in range(count):
            slow = 8.0 if pub.counter < WARMUP else 1.0
            noise = 1.0 + self.rng.normal(0.0, 0.03)
            if self.role == "prefill":
                tokens = int(self.rng.integers(256, 8192))
                pub.report(
                    wall=prefill_law(tokens) * noise * slow,
                    prefill_reqs=1,
                    prefill_tokens=tokens,
                    **queue,
                )
            else:
                num = int(self.rng.integers(1, 200))
                kv = int(num * self.rng.uniform(1000, 3000))
                pub.report(
                    wall=decode_law(num, kv) * noise * slow, decode_reqs=num, decode_kv=kv, **queue
                )
            self.sent += 1

    def last_report(self, pub: EnginePublisher, **fields: int) -> None:
        """The engine's current state: one more iteration with these scheduled/queued values."""
        wall = (
            prefill_law(fields.get("prefill_tokens", 0))
            if self.role == "prefill"
            else decode_law(fields.get("decode_reqs", 0), fields.get("decode_kv", 0))
        )
        pub.report(wall=wall, **fields)
        self.sent += 1

    def tick(self, *, ready: int) -> LoadDecision:
        """What the shell does every load interval."""
        wait_for(
            lambda: True if self.subscriber.counters()["received"] >= self.sent else None,
            what=f"{self.sent} frames",
        )
        self.model.observe_all(self.subscriber.drain_samples())
        engines = self.subscriber.snapshot(self.clock())
        return decide_load(
            role=self.role,
            now_s=self.clock(),
            engines=engines,
            model=self.model,
            ready_replicas=ready,
            desired_replicas=ready,
            dp_size=1,
            config=CONFIG,
            engine_limits=resolve_engine_limits(CONFIG),
            throughput_floor=None,
            last_seen_s=self.subscriber.last_seen(),
        )

    def close(self) -> None:
        self.subscriber.stop()
        for pub in self.publishers:
            pub.close()


@pytest.fixture
def prefill(zmq_context: zmq.Context, clock: VirtualClock) -> Iterator[Cluster]:
    cluster = Cluster(zmq_context, clock, "prefill", engines=3)
    cluster.start()
    yield cluster
    cluster.close()


@pytest.fixture
def decode(zmq_context: zmq.Context, clock: VirtualClock) -> Iterator[Cluster]:
    cluster = Cluster(zmq_context, clock, "decode", engines=2)
    cluster.start()
    yield cluster
    cluster.close()


def test_prefill_engines_drive_up_down_and_hold(prefill: Cluster, clock: VirtualClock) -> None:
    # warm-up plus steady work; the model is not ready before any busy sample arrives
    first = prefill.tick(ready=3)
    assert first.reason is LoadReason.INSUFFICIENT_DATA
    # counter_id counts every message, the connect heartbeats included
    cold = sum(max(0, WARMUP - pub.counter) for pub in prefill.publishers)
    for pub in prefill.publishers:
        prefill.run_iterations(pub, WARMUP + 30)

    # every engine has ~30k prompt tokens queued: TTFT ~0.9 s > 500 ms everywhere
    for pub in prefill.publishers:
        prefill.last_report(
            pub,
            prefill_reqs=1,
            prefill_tokens=4000,
            queued_prefill_reqs=8,
            queued_prefill_tokens=30_000,
        )
    up = prefill.tick(ready=3)
    # up by what the latency over the SLA asks for: 3 x ~870 / 500 = 5.2 -> 6
    assert (up.replicas, up.reason) == (6, LoadReason.SCALE_UP), up.message
    assert prefill.model.skipped["warmup"] == cold
    assert up.max_ttft_ms is not None and up.max_ttft_ms > 500

    # one engine still backed up, two empty: not all over, not all under -> hold
    for pub, queued in zip(prefill.publishers, (30_000, 0, 0), strict=True):
        prefill.last_report(pub, prefill_reqs=1, prefill_tokens=4000, queued_prefill_tokens=queued)
    hold = prefill.tick(ready=3)
    assert (hold.replicas, hold.reason) == (3, LoadReason.NO_CHANGE), hold.message

    # all queues empty and 3 -> 2 still fits: scale down
    for pub in prefill.publishers:
        prefill.last_report(pub, prefill_reqs=1, prefill_tokens=4000)
    down = prefill.tick(ready=3)
    assert (down.replicas, down.reason) == (2, LoadReason.SCALE_DOWN), down.message

    # an engine dies; the other two heartbeat; once it is stale the count no longer matches
    prefill.publishers[2].close()
    clock.advance(11.0)
    for pub in prefill.publishers[:2]:
        pub.heartbeat()
        prefill.sent += 1
    gone = prefill.tick(ready=3)
    assert (gone.replicas, gone.reason) == (3, LoadReason.WORKER_COUNT_MISMATCH), gone.message


def test_decode_engines_drive_up_and_consolidation_aware_down(decode: Cluster) -> None:
    for pub in decode.publishers:
        decode.run_iterations(pub, WARMUP + 40)
    for pub in decode.publishers:
        decode.last_report(pub, decode_reqs=150, decode_kv=300_000)
    up = decode.tick(ready=2)
    # up by what the latency over the SLA asks for: 2 x 83.6 / 50 = 3.3 -> 4
    assert (up.replicas, up.reason) == (4, LoadReason.SCALE_UP), up.message

    # light enough that 2 -> 1 still keeps ITL under 0.8 x 50 ms
    for pub in decode.publishers:
        decode.last_report(pub, decode_reqs=10, decode_kv=20_000)
    down = decode.tick(ready=2)
    assert (down.replicas, down.reason) == (1, LoadReason.SCALE_DOWN), down.message

    # light now (ITL ~28 ms < 40 ms) but doubled onto one engine it would be ~48 ms: refuse
    for pub in decode.publishers:
        decode.last_report(pub, decode_reqs=40, decode_kv=80_000)
    refused = decode.tick(ready=2)
    assert (refused.replicas, refused.reason) == (
        2,
        LoadReason.SCALE_DOWN_REFUSED_CONSOLIDATION,
    ), refused.message
