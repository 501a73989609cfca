"""FpmSubscriber against real ZMQ PUB sockets on loopback."""

from __future__ import annotations

import asyncio
import logging
import math

import msgspec
import pytest
import zmq

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.observe.fpm_subscriber import DROP_KINDS, FpmSubscriber
from disagg_planner.signals.fpm import ForwardPassMetrics, encode
from tests.integration.fpm.conftest import VirtualClock
from tests.integration.fpm.engines import EnginePublisher, connect, free_port, wait_for
from tests.unit.regression.fpm_factory import fpm


def _received(sub: FpmSubscriber, count: int) -> bool | None:
    return True if sub.counters()["received"] >= count else None


def test_latest_report_per_engine_and_busy_samples_in_order(
    zmq_context: zmq.Context, clock: VirtualClock
) -> None:
    # worker "a" runs two data-parallel ranks, each with its own publisher; "b" one
    a0 = EnginePublisher(zmq_context, worker="a", dp_rank=0)
    a1 = EnginePublisher(zmq_context, worker="a", dp_rank=1)
    b0 = EnginePublisher(zmq_context, worker="b")
    with FpmSubscriber(endpoints=[p.endpoint for p in (a0, a1, b0)], clock=clock) as sub:
        for pub in (a0, a1, b0):
            connect(pub, sub)
        sub.drain_samples()
        before = sub.counters()["received"]
        sent = []
        for i in range(20):
            for pub in (a0, a1, b0):
                sent.append(pub.report(wall=0.02, prefill_reqs=1, prefill_tokens=100 + i))
        b0.heartbeat()  # idle: updates the latest report, is no sample
        wait_for(lambda: _received(sub, before + 61), what="61 frames")

        snap = sub.snapshot()
        assert set(snap) == {("a", 0), ("a", 1), ("b", 0)}
        assert snap[("a", 1)].scheduled_requests.sum_prefill_tokens == 119
        assert snap[("b", 0)].is_idle_heartbeat
        samples = sub.drain_samples()
        assert sorted(samples, key=lambda f: (f.worker_id, f.dp_rank, f.counter_id)) == sorted(
            sent, key=lambda f: (f.worker_id, f.dp_rank, f.counter_id)
        )
        per_engine = [f.counter_id for f in samples if f.engine_key == ("a", 0)]
        assert per_engine == sorted(per_engine)  # arrival order is kept per publisher
        assert sub.drain_samples() == []
        assert sub.counters()["missed"] == 0
    for pub in (a0, a1, b0):
        pub.close()


def test_garbage_frames_are_counted_by_kind_and_never_stop_the_subscriber(
    zmq_context: zmq.Context, caplog: pytest.LogCaptureFixture
) -> None:
    pub = EnginePublisher(zmq_context, worker="g")
    with FpmSubscriber(endpoints=[pub.endpoint], warn_interval_s=3600) as sub:
        connect(pub, sub)
        caplog.set_level(logging.WARNING, logger="disagg_planner.observe.fpm_subscriber")
        before = sub.counters()["received"]
        for _ in range(5):
            pub.send_payload(b"\xc1 not msgpack")  # undecodable
        pub.send_object({"version": 1, "worker_id": 7})  # wrong type
        pub.send_object([1, "g", 0])  # wrong type: positional and too short
        good = fpm(worker="g", counter=pub.counter, wall=0.01, prefill_reqs=1, prefill_tokens=5)
        pub.send_payload(encode(msgspec.structs.replace(good, version=2)))  # unknown version
        pub.send_payload(encode(msgspec.structs.replace(good, wall_time=math.nan)))
        pub.send_payload(encode(msgspec.structs.replace(good, dp_rank=-1)))
        pub.send_raw(b"")  # a lone empty frame: undecodable too
        pub.report(wall=0.01, prefill_reqs=1, prefill_tokens=42)  # and life goes on
        wait_for(lambda: _received(sub, before + 1), what="the good frame after the garbage")

        assert sub.dropped == {
            "undecodable": 6,
            "wrong_type": 2,
            "unsupported_version": 1,
            "invalid_value": 2,
            "sample_overflow": 0,
        }
        assert set(DROP_KINDS) <= set(sub.dropped)
        assert sub.snapshot()[("g", 0)].scheduled_requests.sum_prefill_tokens == 42
        assert sub.running
        # one warning per kind, the repeats rate-limited; each names the sender
        warnings = [r.getMessage() for r in caplog.records if "dropped an FPM frame" in r.message]
        assert len([w for w in warnings if "(undecodable)" in w]) == 1
        assert len(warnings) == 4
        assert all(pub.endpoint in w for w in warnings)
    pub.close()


def test_dynamo_wire_forms_are_accepted(zmq_context: zmq.Context) -> None:
    """Dynamo's structs encode as msgpack maps; a native-vLLM copy adds ``timing_scope``;
    older producers send positional arrays. All three decode."""
    pub = EnginePublisher(zmq_context, worker="v")
    with FpmSubscriber(endpoints=[pub.endpoint]) as sub:
        connect(pub, sub)
        sub.drain_samples()
        scheduled = {"num_prefill_requests": 1, "sum_prefill_tokens": 300}
        pub.send_object(
            {
                "version": 1,
                "worker_id": "v",
                "dp_rank": 0,
                "counter_id": pub.counter,
                "timing_scope": "execute_model_cuda",
                "wall_time": 0.01,
                "scheduled_requests": scheduled,
                "queued_requests": {},
            }
        )
        pub.send_object([1, "v", 0, pub.counter, 0.02, [1, 600, 0.0, 0, 0, 0, 0.0], []])
        samples: list[ForwardPassMetrics] = []

        def both() -> bool | None:
            samples.extend(sub.drain_samples())
            return True if len(samples) == 2 else None

        wait_for(both, what="both frames")
    assert [s.scheduled_requests.sum_prefill_tokens for s in samples] == [300, 600]
    assert sub.dropped["wrong_type"] == 0
    pub.close()


def test_a_dead_publisher_expires_after_the_staleness_timeout(
    zmq_context: zmq.Context, clock: VirtualClock
) -> None:
    alive = EnginePublisher(zmq_context, worker="alive")
    dying = EnginePublisher(zmq_context, worker="dying")
    with FpmSubscriber(
        endpoints=[alive.endpoint, dying.endpoint], staleness_s=10.0, clock=clock
    ) as sub:
        connect(alive, sub)
        connect(dying, sub)
        dying.close()  # the engine process dies
        clock.advance(6.0)
        alive.heartbeat()
        wait_for(
            lambda: True if sub.last_seen()[alive.key] == clock.now_s else None,
            what="the live engine's heartbeat",
        )
        assert set(sub.snapshot()) == {alive.key, dying.key}  # 6 s silence is not yet stale
        clock.advance(5.0)
        assert set(sub.snapshot()) == {alive.key}  # 11 s silence: gone
        assert sub.counters()["expired_engines"] == 1
        assert dying.key not in sub.last_seen()
    alive.close()


def test_a_late_publisher_and_a_restarted_one_are_picked_up(zmq_context: zmq.Context) -> None:
    # the subscriber connects first, to a port nothing listens on yet
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    with FpmSubscriber(endpoints=[endpoint]) as sub:
        assert sub.snapshot() == {}
        late = EnginePublisher(zmq_context, worker="late", port=port)  # the engine starts
        connect(late, sub)
        for _ in range(3):
            late.report(wall=0.01, prefill_reqs=1, prefill_tokens=10)
        wait_for(
            lambda: True if sub.snapshot()[late.key].counter_id == late.counter - 1 else None,
            what="the late engine's reports",
        )
        late.close()

        # it restarts on the same port under a new id, its counter back at 0
        restarted = EnginePublisher(zmq_context, worker="late-2", port=port)
        connect(restarted, sub, timeout_s=15.0)
        assert sub.endpoints == frozenset({endpoint})
    restarted.close()


def test_endpoints_change_while_running(zmq_context: zmq.Context) -> None:
    one = EnginePublisher(zmq_context, worker="one")
    two = EnginePublisher(zmq_context, worker="two")
    with FpmSubscriber(endpoints=[one.endpoint]) as sub:
        connect(one, sub)
        sub.add_endpoint(two.endpoint)
        connect(two, sub)
        sub.remove_endpoint(one.endpoint)
        assert set(sub.snapshot()) == {two.key}  # forgotten at once, no staleness wait
        sub.set_endpoints([one.endpoint])  # discovery's new view: only "one"
        assert set(sub.snapshot()) == set()
        connect(one, sub)
        two.heartbeat()
        assert set(sub.snapshot()) == {one.key}
    one.close()
    two.close()


def test_gaps_in_counter_ids_are_counted_as_missed(zmq_context: zmq.Context) -> None:
    pub = EnginePublisher(zmq_context, worker="gap")
    with FpmSubscriber(endpoints=[pub.endpoint]) as sub:
        connect(pub, sub)
        pub.heartbeat()
        pub.counter += 7  # the engine's own queue overflowed: 7 messages never sent
        pub.heartbeat()
        wait_for(lambda: True if sub.counters()["missed"] == 7 else None, what="7 missed")
    pub.close()


def test_sample_window_is_bounded_and_overflow_counted(zmq_context: zmq.Context) -> None:
    pub = EnginePublisher(zmq_context, worker="busy")
    with FpmSubscriber(endpoints=[pub.endpoint], max_samples=10) as sub:
        connect(pub, sub)
        sub.drain_samples()
        for i in range(25):
            pub.report(wall=0.01, prefill_reqs=1, prefill_tokens=i + 1)
        wait_for(lambda: True if sub.dropped["sample_overflow"] == 15 else None, what="overflow")
        samples = sub.drain_samples()
    assert [s.scheduled_requests.sum_prefill_tokens for s in samples] == list(range(16, 26))
    pub.close()


async def test_runs_beside_an_event_loop_and_stops_cleanly(zmq_context: zmq.Context) -> None:
    pub = EnginePublisher(zmq_context, worker="async")
    sub = FpmSubscriber(endpoints=[pub.endpoint])
    sub.start()
    ticks = 0
    for _ in range(500):  # the loop keeps turning while the thread receives
        await asyncio.sleep(0.01)
        ticks += 1
        pub.heartbeat()
        if pub.key in sub.snapshot():
            break
    assert pub.key in sub.snapshot() and ticks >= 1
    sub.stop()
    assert not sub.running
    sub.stop()  # idempotent
    pub.close()


def test_from_config_and_bad_endpoints() -> None:
    config = PlannerConfig(
        enable_load_scaling=True,
        prefill_fpm_endpoints=("tcp://10.0.0.5:20380",),
        decode_fpm_endpoints=("tcp://10.0.0.6:20380", "tcp://10.0.0.6:20381"),
        fpm_staleness_seconds=3.0,
    )
    decode = FpmSubscriber.from_config(config, "decode")
    assert decode.endpoints == frozenset({"tcp://10.0.0.6:20380", "tcp://10.0.0.6:20381"})
    assert decode.staleness_s == 3.0
    assert FpmSubscriber.from_config(config, "agg").endpoints == decode.endpoints
    assert FpmSubscriber.from_config(config, "prefill").endpoints == {"tcp://10.0.0.5:20380"}
    with pytest.raises(ValueError, match="'http://x:1' is not a ZMQ endpoint"):
        FpmSubscriber(endpoints=["http://x:1"])
    with pytest.raises(ValueError, match="staleness_s must be > 0"):
        FpmSubscriber(staleness_s=0)


def test_a_subscriber_without_endpoints_sleeps_instead_of_spinning() -> None:
    # Found in CI: zmq.Poller with nothing registered returns at once, so an idle subscriber
    # (load loop on, no engine reachable yet) burned a whole core and starved other threads.
    import time

    from disagg_planner.observe.fpm_subscriber import FpmSubscriber

    sub = FpmSubscriber(endpoints=(), name="idle")
    sub.start()
    try:
        before = time.process_time()
        time.sleep(1.0)
        used = time.process_time() - before
    finally:
        sub.stop()
    assert used < 0.5  # a spinning receiver thread uses about 1 CPU-second per second
