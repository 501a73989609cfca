"""The reconcile loop against kmock (real connector), a canned Prometheus (real observer) and
a real profile: what a tick reads, decides, writes, reports and survives."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from disagg_planner.core.types import ThroughputReason
from disagg_planner.report.recorder import DiagnosticsRecorder
from disagg_planner.runtime.outcome import ProblemKind
from tests.integration.connectors.conftest import DGD_PLURAL, Cluster, frontend, worker
from tests.integration.runtime.conftest import spec_replicas
from tests.kube_dynamo import BETA
from tests.unit.observe.canned_prometheus import CannedPrometheus, Reply, vector_reply
from tests.unit.runtime.conftest import loop_config, traffic_parts


async def test_a_throughput_tick_scales_the_dgd_and_reports_it(
    cluster, harness_factory, tmp_path
) -> None:
    recorder = DiagnosticsRecorder(output_dir=tmp_path, report_interval_hours=None)
    h = harness_factory(recorder=recorder)
    await h.start()
    assert not h.health.ready  # nothing observed yet

    outcome = await h.next_tick()

    assert outcome.ran_throughput and outcome.problems == ()
    assert outcome.throughput_reason == ThroughputReason.SCALE
    target = outcome.effects.scale_to
    changed = {r: n for r, n in target.items() if n != 1}
    assert changed, "10 req/s of ISL 3000 needs more than one prefill replica"
    assert outcome.applied == changed
    assert spec_replicas(cluster) == target  # the merge patch reached the DGD
    # what was read before the write, the window observed and the forecast are reported
    assert outcome.snapshot.desired == {"prefill": 1, "decode": 1}
    assert outcome.snapshot.observed_rps == pytest.approx(10.0)
    assert outcome.snapshot.observed_isl == pytest.approx(3000.0)
    assert outcome.snapshot.predicted_rps == pytest.approx(10.0)  # constant predictor
    assert h.sample("dynamo_planner_observed_requests_per_second") == pytest.approx(10.0)
    for role, n in target.items():
        assert h.sample(f"dynamo_planner_predicted_num_{role}_replicas") == n
    assert (
        h.sample(
            "dynamo_planner_throughput_scaling_decision",
            dynamo_planner_throughput_scaling_decision="scale",
        )
        == 1
    )
    assert h.health.ready  # the first successful observation
    assert [s.t_s for s in recorder.snapshots] == [outcome.t_s]
    assert h.outcomes[-1] is outcome


async def test_a_v1beta1_dgd_is_planned_and_scaled_by_the_loop(kmock, harness_factory) -> None:
    # issue 35: a cluster that serves DGDs only as v1beta1 (spec.components)
    cluster = Cluster(kmock, version=BETA)
    cluster.add_dgd(
        {"Frontend": frontend(), "prefill": worker("prefill", 1), "decode": worker("decode", 1)}
    )
    h = harness_factory()
    await h.start()

    outcome = await h.next_tick()

    assert outcome.throughput_reason == ThroughputReason.SCALE and outcome.problems == ()
    target = outcome.effects.scale_to
    assert outcome.applied == {r: n for r, n in target.items() if n != 1}
    assert {r: cluster.replicas(r) for r in ("prefill", "decode")} == target
    (patch,) = cluster.requests("PATCH", DGD_PLURAL)
    assert patch.resource.version == BETA and isinstance(patch.data, list)  # a JSON patch


async def test_the_traffic_window_ends_at_the_tick_and_spans_the_interval(
    cluster, harness_factory, prometheus: CannedPrometheus
) -> None:
    h = harness_factory()
    await h.start()
    outcome = await h.next_tick()
    request = prometheus.requests[-1]
    assert float(request.param("time")) == pytest.approx(outcome.t_s)
    assert "[60000ms]" in request.param("query")  # the throughput interval
    assert outcome.t_s == pytest.approx(h.clock.now_s)


async def test_prometheus_failing_holds_with_a_reason_and_stays_unready(
    cluster, harness_factory, prometheus: CannedPrometheus
) -> None:
    prometheus.reply = Reply(status=500, body=b'{"status":"error","error":"boom"}')
    h = harness_factory()
    await h.start()

    outcome = await h.next_tick()

    assert outcome.throughput_reason == ThroughputReason.NO_TRAFFIC_DATA
    assert outcome.scale_to is None and outcome.applied == {}
    problem = outcome.problem(ProblemKind.TRAFFIC_MISSING)
    assert problem is not None and problem.reason == "prometheus_error"
    assert cluster.requests("PATCH", DGD_PLURAL) == []  # never scales on missing data
    assert not h.health.ready
    assert (
        h.sample(
            "dynamo_planner_observation_failures_total", source="traffic", reason="prometheus_error"
        )
        == 1
    )
    # replicas are still exported: the deployment itself was read
    assert h.sample("dynamo_planner_num_prefill_replicas") == 1


async def test_connector_failures_are_problems_with_growing_pauses_then_recovery(
    cluster, harness_factory
) -> None:
    h = harness_factory()
    await h.start()
    interval = 60.0
    cluster.fail("GET", DGD_PLURAL, [403] * 3)

    first = await h.next_tick()
    assert first.problem(ProblemKind.CONNECTOR_ERROR) is not None
    assert "forbidden" in first.problem().detail
    assert first.status is None and first.applied == {}
    # the first failure keeps the cadence ...
    assert h.loop._not_before_s == float("-inf")
    second = await h.next_tick()
    assert second.problem(ProblemKind.CONNECTOR_ERROR) is not None
    # ... further ones pause longer, doubling from the shortest interval
    assert h.loop._not_before_s == pytest.approx(second.t_s + 2 * interval)
    third = await h.next_tick()
    assert third.t_s == pytest.approx(second.t_s + 2 * interval)
    assert h.loop._not_before_s == pytest.approx(third.t_s + 4 * interval)

    recovered = await h.next_tick()
    assert recovered.problems == ()
    assert recovered.applied  # the loop acts again
    assert h.loop._not_before_s == float("-inf")


class ExplodingEngines:
    """An FPM source with a bug: its first snapshot raises."""

    def __init__(self) -> None:
        self.calls = 0
        self.dropped: dict[str, int] = {}

    def start(self) -> None: ...
    def stop(self, timeout_s: float = 5.0) -> None: ...
    def last_seen(self) -> dict[Any, float]:
        return {}

    def drain_samples(self) -> list[Any]:
        return []

    def snapshot(self, now_s: float | None = None) -> dict[Any, Any]:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("bug in an observer")
        return {}


async def test_an_exception_in_a_tick_is_logged_and_the_next_tick_runs(
    cluster, harness_factory, caplog: pytest.LogCaptureFixture
) -> None:
    config = loop_config(
        enable_throughput_scaling=False,
        enable_load_scaling=True,
        load_adjustment_interval_seconds=5.0,
    )
    engines = ExplodingEngines()
    h = harness_factory(config, engine_sources={"prefill": engines, "decode": engines})
    await h.start()

    with caplog.at_level(logging.ERROR, logger="disagg_planner.runtime.loop"):
        failed = await h.next_tick()
    assert failed.problem(ProblemKind.TICK_FAILED).detail == "bug in an observer"
    assert any(r.exc_info for r in caplog.records)  # with its traceback

    next_one = await h.next_tick()
    assert next_one.t_s == pytest.approx(failed.t_s + 5.0)  # on schedule
    assert next_one.problems == ()
    assert next_one.load_reason == "no_fpm_data"  # held: no engine reported


async def test_a_manual_edit_is_respected_and_reported_as_a_hold(cluster, harness_factory) -> None:
    h = harness_factory()
    await h.start()
    first = await h.next_tick()
    decode = first.effects.scale_to["decode"]
    prefill = first.effects.scale_to["prefill"]
    cluster.set_ready("prefill", prefill)
    cluster.set_ready("decode", decode)
    # someone scales decode by hand; the planner still wants its own number
    cluster.edit_dgd({"spec": {"services": {"decode": {"replicas": decode + 3}}}})
    cluster.set_ready("decode", decode + 3)

    held = await h.next_tick()

    assert held.held == {"decode": "manual_override"}
    assert held.throughput_reason == ThroughputReason.MANUAL_OVERRIDE_HOLD
    assert spec_replicas(cluster)["decode"] == decode + 3  # respected
    assert (
        h.sample(
            "dynamo_planner_throughput_scaling_decision",
            dynamo_planner_throughput_scaling_decision="manual_override_hold",
        )
        == 1
    )


async def test_advisory_mode_recommends_but_never_writes(cluster, harness_factory) -> None:
    h = harness_factory(loop_config(advisory=True))
    await h.start()

    outcome = await h.next_tick()

    assert outcome.scale_to and outcome.applied == {}
    assert set(outcome.held.values()) == {"advisory"}
    assert outcome.throughput_reason == ThroughputReason.ADVISORY
    assert cluster.requests("PATCH", DGD_PLURAL) == []
    assert spec_replicas(cluster) == {"prefill": 1, "decode": 1}
    for role, n in outcome.scale_to.items():  # the recommendation is still exported
        assert h.sample(f"dynamo_planner_predicted_num_{role}_replicas") == n


async def test_start_retries_until_the_dgd_exists_with_doubling_pauses(
    kmock, harness_factory
) -> None:
    from tests.integration.connectors.conftest import Cluster, frontend, worker

    cluster = Cluster(kmock)  # no DGD yet
    h = harness_factory()
    started = asyncio.create_task(h.loop.start(h.stop))
    for _ in range(500):
        if len(h.outcomes) >= 3:
            break
        await asyncio.sleep(0.01)
    failures = list(h.outcomes)
    assert len(failures) >= 3
    assert all(o.problem(ProblemKind.DEPLOYMENT_INVALID) for o in failures)
    assert "not found" in failures[0].problem().detail
    waits = [s for s in h.clock.sleeps if s > 0][:3]
    assert waits == [60.0, 120.0, 240.0]
    assert (
        h.sample(
            "dynamo_planner_observation_failures_total",
            source="validate",
            reason="deployment_error",
        )
        >= 3
    )

    cluster.add_dgd(
        {"Frontend": frontend(), "prefill": worker("prefill", 1), "decode": worker("decode", 1)}
    )
    assert await asyncio.wait_for(started, timeout=10)
    assert h.loop.core is not None


async def test_gpu_hours_accumulate_the_gpus_in_use_over_time(cluster, harness_factory) -> None:
    h = harness_factory(loop_config(advisory=True))  # replicas stay at 1 + 1 GPU
    await h.start()
    first = await h.next_tick()
    second = await h.next_tick()
    assert first.snapshot.gpu_hours == 0.0
    assert second.snapshot.gpu_hours == pytest.approx(2 * 60.0 / 3600.0)
    assert h.sample("dynamo_planner_gpu_hours") == pytest.approx(2 * 60.0 / 3600.0)


async def test_run_ticks_until_stopped_and_releases_what_it_started(
    cluster, harness_factory
) -> None:
    config = loop_config(
        enable_load_scaling=True,
        load_adjustment_interval_seconds=5.0,
        prefill_fpm_endpoints=("tcp://127.0.0.1:1",),
        decode_fpm_endpoints=("tcp://127.0.0.1:2",),
    )
    h = harness_factory(config)

    async def stop_after_three(outcome: Any) -> None:
        h.outcomes.append(outcome)
        if len(h.outcomes) == 3:
            h.stop.set()

    h.loop._on_outcome = stop_after_three
    await asyncio.wait_for(h.loop.run(h.stop), timeout=20)

    assert len(h.outcomes) == 3 and h.loop.ticks == 3
    subscribers = list(h.loop.engine_sources.values())
    assert len(subscribers) == 2 and not any(s.running for s in subscribers)
    # load ticks every 5 s, a throughput tick at 60 s
    assert [o.ran_load for o in h.outcomes] == [True, True, True]


async def test_load_ticks_learn_from_real_fpm_frames_and_export_engine_queues(
    cluster, harness_factory
) -> None:
    import zmq

    from tests.integration.fpm.engines import EnginePublisher, connect, wait_for
    from tests.unit.regression.fpm_factory import prefill_law

    context = zmq.Context()
    prefill = EnginePublisher(context, worker="prefill-0")
    decode = EnginePublisher(context, worker="decode-0")
    config = loop_config(
        enable_throughput_scaling=False,
        enable_load_scaling=True,
        load_adjustment_interval_seconds=5.0,
        prefill_fpm_endpoints=(prefill.endpoint,),
        decode_fpm_endpoints=(decode.endpoint,),
    )
    h = harness_factory(config)
    try:
        await h.start()
        subscribers = h.loop.engine_sources
        await asyncio.to_thread(connect, prefill, subscribers["prefill"])
        await asyncio.to_thread(connect, decode, subscribers["decode"])
        busy = 40
        for i in range(busy):
            tokens = 256 + 64 * i
            prefill.report(wall=prefill_law(tokens), prefill_reqs=1, prefill_tokens=tokens)
        prefill.report(
            wall=prefill_law(512), prefill_reqs=1, prefill_tokens=512, queued_prefill_tokens=7000
        )
        decode.report(wall=0.01, decode_reqs=4, decode_kv=9000)
        await asyncio.to_thread(
            wait_for,
            lambda: True if subscribers["prefill"].counters()["received"] >= busy + 2 else None,
            what="prefill frames",
        )
        await asyncio.to_thread(
            wait_for,
            lambda: True if subscribers["decode"].counters()["received"] >= 2 else None,
            what="decode frames",
        )

        outcome = await h.next_tick()

        assert outcome.ran_load and not outcome.ran_throughput
        # the busy frames reached the regression (the first ones are engine warm-up)
        learned = h.loop.core.load_models["prefill"].num_observations
        assert learned >= busy - config.fpm_warmup_iterations
        assert outcome.problems == ()
        assert outcome.load_reason is not None
        queues = {(e.role, e.worker_id): e for e in outcome.snapshot.engines}
        assert queues[("prefill", "prefill-0")].queued_prefill_tokens == 7000
        assert queues[("decode", "decode-0")].inflight_decode_kv_tokens == 9000
        assert (
            h.sample(
                "dynamo_planner_engine_queued_prefill_tokens",
                role="prefill",
                worker_id="prefill-0",
                dp_rank="0",
            )
            == 7000
        )
    finally:
        prefill.close()
        decode.close()
        await h.loop.close()
        context.destroy(linger=0)


async def test_a_refused_write_is_reported_and_the_loop_carries_on(
    cluster, harness_factory, caplog
) -> None:
    h = harness_factory()
    await h.start()
    cluster.fail("PATCH", DGD_PLURAL, [403])

    with caplog.at_level(logging.INFO, logger="disagg_planner.runtime.loop"):
        refused = await h.next_tick()
    (summary,) = [r.getMessage() for r in caplog.records if "[summary]" in r.getMessage()]
    # issue 36 item 7: it read "not written: connector_error ... scale: connector_error
    # (connector_error)"
    assert (
        "not written: the scale call failed (connector_error)" in summary
        and "connector_error (connector_error)" not in summary
    ), summary
    problem = refused.problem(ProblemKind.CONNECTOR_ERROR)
    assert problem is not None and (problem.source, problem.reason) == ("scale", "connector_error")
    assert "forbidden" in problem.detail and "patch" in problem.detail
    assert refused.applied == {}
    assert refused.scale_to  # the recommendation is still reported

    # kmock stores a PATCH body before answering it with the injected error (as a real server
    # whose answer was lost): the connector must not take its own write for a manual edit.
    following = await h.next_tick()
    assert following.problems == ()
    assert following.held == {}
    assert spec_replicas(cluster) == refused.scale_to


async def test_a_traffic_outage_stays_degraded_between_throughput_ticks(
    cluster, harness_factory, prometheus: CannedPrometheus
) -> None:
    # Found by the live e2e: load-only ticks between two throughput ticks cleared Degraded
    # while Prometheus was still down, so the condition flapped.
    healthy = prometheus.reply
    prometheus.reply = Reply(status=500, body=b'{"status":"error","error":"boom"}')
    h = harness_factory(
        loop_config(enable_load_scaling=True, load_adjustment_interval_seconds=20.0)
    )
    await h.start()
    outcomes = [await h.next_tick() for _ in range(3)]  # 20 s, 40 s (load), 60 s (both)
    assert outcomes[-1].problem(ProblemKind.TRAFFIC_MISSING) is not None
    after = await h.next_tick()  # 80 s: load only, Prometheus still down
    assert after.problem(ProblemKind.TRAFFIC_MISSING) is not None
    prometheus.reply = healthy
    for _ in range(2):
        await h.next_tick()  # 100 s load, 120 s both: traffic read again
    recovered = await h.next_tick()  # 140 s: load only
    assert recovered.problem(ProblemKind.TRAFFIC_MISSING) is None


async def test_histograms_missing_while_requests_are_counted_is_degraded_naming_them(
    cluster, harness_factory, prometheus: CannedPrometheus
) -> None:
    """Issue 36 item 7: counters present, histograms dropped (a scrape relabelling): the
    averages were None and nothing said why."""
    parts = traffic_parts(10.0, 60.0)
    for key in ("ttft_sum", "ttft_count", "itl_sum", "itl_count"):
        del parts[key]
    prometheus.reply = vector_reply(parts)
    h = harness_factory()
    await h.start()
    outcome = await h.next_tick()
    problem = outcome.problem(ProblemKind.INPUT_INCOMPLETE)
    assert problem is not None, outcome.problems
    assert (problem.reason, problem.source, outcome.observed_ok) == (
        "histograms_missing",
        "traffic",
        True,  # still Ready: the deployment and the counters were read
    )
    assert (
        "dynamo_frontend_time_to_first_token_seconds" in problem.detail
        and "dynamo_frontend_inter_token_latency_seconds" in problem.detail
        and "input_sequence" not in problem.detail
    ), problem.detail


async def test_the_fast_check_reads_a_short_window_between_throughput_ticks(
    cluster, harness_factory, prometheus: CannedPrometheus
) -> None:
    h = harness_factory(config=loop_config(fast_check_interval_seconds=15.0))
    await h.start()
    outcome = await h.next_tick()
    assert not outcome.ran_throughput  # 15 s in: the fast check, not the 60 s tick
    queries = [r.param("query") for r in prometheus.requests]
    traffic_query = next(q for q in reversed(queries) if "planner_part" in q)
    assert "[15000ms]" in traffic_query
    assert '"in_flight"' in traffic_query  # the requests in flight at the window's end
    assert outcome.message.startswith("throughput: ")
    assert "fast check" in outcome.message
