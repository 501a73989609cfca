"""Speculative decoding in the simulated engine (issue 35): a decode iteration emits the
accept length's tokens per sequence, at a cost that grows with the draft length."""

from __future__ import annotations

import math

import pytest

from disagg_planner.core.types import TrafficObservation
from disagg_planner.observe import snapshot_from_samples, snapshot_from_text, traffic_from_snapshots
from disagg_planner.predictors.traces import TraceRequest
from disagg_planner.signals.frontend import NAMESPACE_LABEL, SPEC_DECODE_DRAFTS
from disagg_planner.simulator.cluster import Cluster
from disagg_planner.simulator.engine_spec import parse
from disagg_planner.simulator.engines import engine_for
from disagg_planner.simulator.errors import EngineSpecError

PLAIN = "sim:llama-3.1-8b-fp8@h200_sxm:tp1"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (":nextn=3:accept=4.5", r"must be in \[1, nextn \+ 1 = 4\]"),
        (":nextn=3:accept=0.5", r"must be in \[1, nextn \+ 1 = 4\]"),
        (":nextn=3", r"accept=0 must be in \[1, nextn \+ 1 = 4\]"),
        (":accept=2", "needs nextn"),
        (":nextn=17:accept=2", r"nextn=17 must be in \[0, 16\]"),
    ],
)
def test_an_accept_length_outside_one_to_nextn_plus_one_is_refused(
    options: str, message: str
) -> None:
    with pytest.raises(EngineSpecError, match=message):
        parse(PLAIN + options)


def test_the_spec_round_trips_and_counts_iterations_per_request() -> None:
    spec = parse(PLAIN + ":nextn=3:accept=2.5")
    assert parse(str(spec)) == spec
    # the first token comes with the prefill; the other 299 at 2.5 per iteration
    assert spec.decode_iterations(300) == 1 + math.ceil(299 / 2.5)
    assert spec.decode_iterations(1) == 1
    assert parse(PLAIN).decode_iterations(300) == 300


def test_a_step_costs_more_the_longer_the_draft_and_nothing_without_one() -> None:
    plain = engine_for(PLAIN)
    same = engine_for(PLAIN + ":nextn=1:accept=1")  # a draft accepted never still costs
    short, long = engine_for(PLAIN + ":nextn=3:accept=2"), engine_for(PLAIN + ":nextn=7:accept=2")
    for batch in (1, 16, 128):
        steps = [e.decode_step_time_s(batch, 3000) for e in (plain, same, short, long)]
        assert steps == sorted(steps) and len(set(steps)) == 4
    # the vectorised decode runs time a speculative step as the single call does
    run = long.decode_run_s(8, 8 * 3000, 70)
    assert run[0] == pytest.approx(long.iteration_time_s(0, 0, 8, 8 * 3000), rel=1e-12)
    assert run[69] == pytest.approx(long.iteration_time_s(0, 0, 8, 8 * 3000 + 8 * 69), rel=1e-12)


def _lone_request(spec: str, osl: int) -> tuple[int, float]:
    cluster = Cluster(engines={"agg": spec}, mode="agg", replicas={"agg": 1})
    cluster.submit([TraceRequest(0.0, 1000, osl)])
    cluster.run_to_completion()
    (record,) = cluster.records
    assert record.ok and record.osl == osl and record.itl_ms is not None
    # the frontend's ITL histogram counts the same per-token cadence as the request's record
    itl = cluster.frontend.itl
    assert itl.sum / itl.count * 1000.0 == pytest.approx(record.itl_ms, rel=1e-9)
    return sum(e.iterations for e in cluster.engines("agg")), record.itl_ms


def test_a_request_decodes_in_fewer_iterations_at_a_lower_itl() -> None:
    plain_iters, plain_itl = _lone_request(PLAIN, 301)
    spec_iters, spec_itl = _lone_request(PLAIN + ":nextn=3:accept=2.5", 301)
    # 300 tokens after the first: 300 iterations plainly, 120 at 2.5 tokens each
    assert plain_iters - spec_iters == 300 - 120
    # each iteration costs more, but a token less than half the plain one at batch 1
    assert plain_itl / 2.5 < spec_itl < plain_itl / 2


def test_a_disaggregated_decode_engine_runs_the_speculative_iterations() -> None:
    # The prefill engine emits the first token; the decode engine's spec decides the rest.
    spec = PLAIN + ":nextn=3:accept=2.5"
    cluster = Cluster(
        engines={"prefill": PLAIN, "decode": spec}, replicas={"prefill": 1, "decode": 1}
    )
    cluster.submit([TraceRequest(0.0, 1000, 301), TraceRequest(0.0, 2000, 101)])
    cluster.run_to_completion()
    assert all(r.ok for r in cluster.records)
    decode_iterations = sum(e.iterations for e in cluster.engines("decode"))
    # one iteration samples the first request's first token from the transferred KV, then
    # its other 300 tokens take 120 at 2.5 each; the second request (its 100 tokens in 40)
    # joins them, its own first token in one of them
    assert decode_iterations == 1 + math.ceil(300 / 2.5)


def test_the_frontend_page_carries_vllms_speculative_counters_for_the_accept_length() -> None:
    # The replay observes the accept length from the page, as the live planner does.
    spec = PLAIN + ":nextn=3:accept=2.5"
    cluster = Cluster(
        engines={"prefill": PLAIN, "decode": spec}, replicas={"prefill": 1, "decode": 1}
    )
    before = snapshot_from_samples(cluster.frontend.exposition_samples())
    cluster.submit([TraceRequest(0.0, 1000, 301), TraceRequest(0.0, 2000, 101)])
    cluster.run_to_completion()
    after = snapshot_from_samples(cluster.frontend.exposition_samples())
    obs = traffic_from_snapshots(
        start=before,
        end=after,
        start_s=0.0,
        end_s=60.0,
        model_name=None,
        namespace=cluster.frontend.labels[NAMESPACE_LABEL],
    )
    assert isinstance(obs, TrafficObservation), obs
    # 300 tokens after the first in 120 steps, 100 in 40: 160 drafts, 240 draft tokens kept
    assert cluster.frontend.spec_drafts == 160 and cluster.frontend.spec_accepted == 240
    assert obs.accept_length == pytest.approx(1 + 240 / 160)
    text = cluster.frontend.render_prometheus_text()
    assert snapshot_from_text(text) == after
    # engines that do not speculate export no such counters: nothing to observe
    plain = Cluster(
        engines={"prefill": PLAIN, "decode": PLAIN}, replicas={"prefill": 1, "decode": 1}
    )
    assert SPEC_DECODE_DRAFTS not in plain.frontend.render_prometheus_text()
