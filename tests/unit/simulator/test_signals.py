"""Signals as production emits them: frontend metrics under Dynamo's names and labels (as a
Prometheus scrape at time t sees them) and ForwardPassMetrics with every field."""

from __future__ import annotations

import json
import math
from collections import defaultdict

import pytest
from prometheus_client.parser import text_string_to_metric_families

from disagg_planner.predictors.traces import TraceRequest
from disagg_planner.signals import fpm as fpm_wire
from disagg_planner.signals import frontend as names
from disagg_planner.simulator.cluster import Cluster
from disagg_planner.simulator.metrics import HistogramSample, MetricsSnapshot
from disagg_planner.simulator.request import RequestRecord
from disagg_planner.simulator.workloads import parse_workload

SPEC = "sim:llama-3.1-8b-fp8@h200_sxm:tp1"


def make_cluster(**kw) -> Cluster:
    return Cluster(
        engines={"prefill": SPEC, "decode": SPEC},
        replicas={"prefill": 1, "decode": 2},
        model_label="Llama-3.1-8B-FP8",
        namespace="prod-ns",
        **kw,
    )


def histogram(snap: MetricsSnapshot, name: str) -> HistogramSample:
    """The histogram ``name`` of ``snap``, which the frontend exports."""
    sample = snap.histogram(name)
    assert sample is not None, name
    return sample


def ttft_ms(record: RequestRecord) -> float:
    """The TTFT of a request that got its first token."""
    assert record.ttft_ms is not None, record
    return record.ttft_ms


def first_token_s(record: RequestRecord) -> float:
    """The time of the first token of a request that got one."""
    assert record.first_token_s is not None, record
    return record.first_token_s


def test_metric_names_labels_and_prometheus_text():
    c = make_cluster()
    c.submit(parse_workload("poisson:rate=8,isl=1000,osl=lognormal:100:0.5,duration=20", seed=1))
    c.run_until(math.inf)
    families = {
        f.name: f for f in text_string_to_metric_families(c.frontend.render_prometheus_text())
    }
    f = names.FRONTEND
    histograms = [
        f.ttft_seconds,
        f.itl_seconds,
        f.request_duration_seconds,
        f.input_tokens,
        f.output_tokens,
    ]
    for name in histograms:
        fam = families[name]
        assert fam.type == "histogram"
        labels = {s.labels[names.MODEL_LABEL] for s in fam.samples}
        assert labels == {"llama-3.1-8b-fp8"}  # lower-cased like Dynamo's frontend
        assert {s.labels[names.NAMESPACE_LABEL] for s in fam.samples} == {"prod-ns"}
        buckets = [s for s in fam.samples if s.name.endswith("_bucket")]
        values = [s.value for s in buckets]
        assert values == sorted(values)  # cumulative
        count = next(s.value for s in fam.samples if s.name.endswith("_count"))
        assert buckets[-1].labels["le"] == "+Inf" and buckets[-1].value == count
    # Counters: the parser strips the _total suffix from the family name.
    started = families[f.requests_started.removesuffix("_total")]
    finished = families[f.requests_finished.removesuffix("_total")]
    assert started.type == finished.type == "counter"
    n = len(c.records)
    assert started.samples[0].value == finished.samples[0].value == n
    snap = c.frontend.snapshot()
    assert histogram(snap, f.ttft_seconds).count == n
    assert histogram(snap, f.input_tokens).sum == 1000 * n
    assert histogram(snap, f.output_tokens).sum == sum(r.osl for r in c.records)
    ttft_sum = sum(ttft_ms(r) for r in c.records) / 1000
    assert histogram(snap, f.ttft_seconds).sum == pytest.approx(ttft_sum)
    bounds = [b for b, _ in histogram(snap, f.ttft_seconds).buckets[:-1]]
    assert tuple(bounds) == names.TTFT_BUCKETS_S
    plain = json.loads(json.dumps(snap.to_dict()))
    ttft = plain["metrics"][f.ttft_seconds]["series"][0]
    assert ttft["count"] == n and ttft["buckets"][-1] == ["+Inf", n]
    assert plain["metrics"][f.requests_started]["series"][0]["value"] == n


def test_metrics_are_cumulative_and_exact_at_each_scrape_time():
    reqs = list(parse_workload("poisson:rate=10,isl=800,osl=200,duration=60", seed=2))
    c = make_cluster()
    c.submit(reqs)
    previous = None
    f = names.FRONTEND
    for t in range(5, 90, 5):
        c.run_until(float(t))
        snap = c.frontend.snapshot()
        assert snap.time_s == t
        arrived = sum(1 for r in reqs if r.arrival_s <= t)
        done = [r for r in c.records if r.finish_s <= t]
        assert snap.counter(f.requests_started) == arrived
        assert snap.counter(f.requests_finished) == len(done) == len(c.records)
        first_tokens = sum(1 for r in c.records if first_token_s(r) <= t)
        assert histogram(snap, f.ttft_seconds).count >= first_tokens
        # ITL: one observation per token streamed after the first, including unfinished
        # requests, so never fewer than the finished requests account for.
        assert histogram(snap, f.itl_seconds).count >= sum(r.osl - 1 for r in done)
        if previous is not None:
            for name in (f.ttft_seconds, f.itl_seconds, f.request_duration_seconds):
                now_b = histogram(snap, name).buckets
                old_b = histogram(previous, name).buckets
                assert all(a[1] >= b[1] for a, b in zip(now_b, old_b, strict=True))
        previous = snap
    assert histogram(snap, f.itl_seconds).count == sum(r.osl - 1 for r in c.records)


def test_every_fpm_field_is_emitted_with_meaning():
    seen: dict[tuple[str, int], list[fpm_wire.ForwardPassMetrics]] = defaultdict(list)

    def on_fpm(m: fpm_wire.ForwardPassMetrics) -> None:
        # Over the wire and back, as the planner's subscriber receives it.
        decoded = fpm_wire.decode(fpm_wire.encode(m))
        assert decoded == m
        seen[m.engine_key].append(m)

    # Small KV and a 512-token budget: chunked prefill, queueing and preemption all happen.
    spec = "sim:llama-3.1-8b-fp8@h100_sxm:tp1:mem=0.14:mnbt=512:seqs=48"
    c = Cluster(mode="agg", engines={"agg": spec}, replicas={"agg": 1}, on_fpm=on_fpm)
    shared = tuple(range(3))  # a shared 1,536-token prefix
    reqs = [
        TraceRequest(0.05 * i, 2000 + 37 * (i % 7), 200 + 13 * (i % 5), (*shared, 1000 + i))
        for i in range(150)
    ]
    c.submit(reqs)
    c.run_until(math.inf)
    assert all(r.ok for r in c.records) and len(c.records) == 150
    [(key, msgs)] = seen.items()
    assert key == ("agg-0", 0)
    assert [m.counter_id for m in msgs] == list(range(1, len(msgs) + 1))
    assert all(m.version == fpm_wire.FPM_VERSION and m.worker_id == "agg-0" for m in msgs)
    work = [m for m in msgs if not m.is_idle_heartbeat]
    assert msgs[-1].is_idle_heartbeat and msgs[-1].scheduled_requests.num_decode_requests == 0
    assert all(m.wall_time > 0 for m in work)
    engine = c.engines("agg")[0]
    assert sum(m.wall_time for m in work) == pytest.approx(engine.busy_time_s)
    s = [m.scheduled_requests for m in work]
    q = [m.queued_requests for m in work]
    assert max(x.sum_prefill_tokens + x.num_decode_requests for x in s) <= 512  # token budget
    assert max(x.num_prefill_requests for x in s) >= 2
    assert max(x.var_prefill_length for x in s) > 0
    assert max(x.sum_prefill_kv_tokens for x in s) > 0  # later chunks and prefix-cache hits
    assert sum(x.sum_prefill_tokens for x in s) == engine.prefill_tokens_computed
    assert max(x.num_decode_requests for x in s) <= 48
    capacity = engine.total_blocks * engine.block_size
    assert capacity >= max(x.sum_decode_kv_tokens for x in s) > 0.5 * capacity
    assert max(x.var_decode_kv_tokens for x in s) > 0
    assert max(x.num_prefill_requests for x in q) > 10
    assert max(x.sum_prefill_tokens for x in q) > 10 * 2000
    assert max(x.var_prefill_length for x in q) > 0
    assert max(x.num_decode_requests for x in q) > 0  # preempted, waiting to resume
    assert max(x.sum_decode_kv_tokens for x in q) > 0
    assert max(x.var_decode_kv_tokens for x in q) >= 0
    assert sum(r.cached_tokens for r in c.records) > 0
    assert sum(r.preemptions for r in c.records) > 0
    # Decode tokens in the FPMs add up to the tokens the engine generated.
    decode_tokens = sum(x.num_decode_requests for x in s)
    first_tokens = len(c.records) + sum(r.preemptions for r in c.records)
    assert decode_tokens + first_tokens >= engine.tokens_generated >= decode_tokens


def test_latest_fpm_matches_the_per_iteration_stream():
    reqs = list(parse_workload("poisson:rate=12,isl=1500,osl=300,duration=30", seed=3))
    last: dict[tuple[str, int], fpm_wire.ForwardPassMetrics] = {}
    with_cb = make_cluster(on_fpm=lambda m: last.__setitem__(m.engine_key, m))
    without = make_cluster()
    with_cb.submit(reqs)
    without.submit(reqs)
    for t in (3.0, 7.5, 12.25, 20.0, 45.0):
        with_cb.run_until(t)
        without.run_until(t)
        latest = without.latest_fpm()
        assert latest == with_cb.latest_fpm() == last
        assert set(latest) == {("prefill-0", 0), ("decode-0", 0), ("decode-1", 0)}
    assert set(without.latest_fpm("decode")) == {("decode-0", 0), ("decode-1", 0)}


def test_the_exposition_samples_are_what_a_scrape_of_the_page_parses():
    """A replay reads its simulated frontend through ``exposition_samples`` (no text written
    and parsed each tick): the snapshot must be the one a real scrape of the page gives."""
    from disagg_planner.observe.window import snapshot_from_samples, snapshot_from_text

    c = make_cluster()
    c.submit(parse_workload("poisson:rate=8,isl=1000,osl=lognormal:100:0.5,duration=20", seed=3))
    for t in (0.0, 7.5, 15.0, math.inf):
        c.run_until(t)
        parsed = snapshot_from_text(c.frontend.render_prometheus_text())
        direct = snapshot_from_samples(c.frontend.exposition_samples())
        assert direct == parsed
        assert any(v > 0 for v in direct.values()) or t == 0.0
        assert len(direct) > 20  # every bucket of the five histograms and both counters
