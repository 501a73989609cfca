"""Traffic from two cumulative snapshots (the replay path) and the shared definitions."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from disagg_planner.core.types import Histogram, MissingObservation, TrafficObservation
from disagg_planner.observe import (
    MissingReason,
    snapshot_from_samples,
    snapshot_from_text,
    traffic_from_snapshots,
)
from disagg_planner.observe.window import (
    WindowIncreases,
    histogram_from_cumulative,
    history_start,
    observation_from_increases,
    sample_key,
)
from disagg_planner.signals.frontend import ROUTER
from tests.integration.prometheus.exporter import FrontendMetrics, Requests

R_A = Requests(n=1, ttft_s=0.25, itl_s=1 / 64, isl=1000, osl=200, duration_s=4.25)
R_B = Requests(n=1, ttft_s=0.5, itl_s=1 / 32, isl=3000, osl=100, duration_s=3.5)


def times(requests: Requests, n: int) -> Requests:
    return Requests(n, requests.ttft_s, requests.itl_s, requests.isl, requests.osl,
                    requests.duration_s)  # fmt: skip


def window(
    metrics: FrontendMetrics, before: str, *, model: str | None = "llama-3.1-8b", **kw: str
) -> TrafficObservation | MissingObservation:
    """Traffic between the text ``before`` and ``metrics`` now, over 60 s."""
    return traffic_from_snapshots(
        start=snapshot_from_text(before),
        end=snapshot_from_text(metrics.text()),
        start_s=1000.0,
        end_s=1060.0,
        model_name=model,
        namespace=kw.get("namespace", "dyn-a"),
        source=kw.get("source", "frontend"),
    )


def traffic(obs: object) -> TrafficObservation:
    assert isinstance(obs, TrafficObservation), obs
    return obs


@pytest.fixture
def metrics() -> FrontendMetrics:
    """Several models, namespaces and frontends, all with history."""
    m = FrontendMetrics()
    m.record(times(R_A, 10), model="Llama-3.1-8B", namespace="dyn-a", pod="a")
    m.record(times(R_B, 4), model="Llama-3.1-8B", namespace="dyn-a", pod="b")
    m.record(times(R_B, 7), model="Llama-3.1-8B", namespace="dyn-b")
    m.record(times(R_B, 5), model="llama-3x1-8b", namespace="dyn-a")
    m.record(times(R_B, 9), model="Llama-3.1-8B-Instruct", namespace="dyn-a")
    return m


def add_window_traffic(m: FrontendMetrics) -> None:
    m.record(times(R_A, 6), model="Llama-3.1-8B", namespace="dyn-a", pod="a")
    m.record(times(R_B, 2), model="Llama-3.1-8B", namespace="dyn-a", pod="b")
    m.record(times(R_B, 3), model="Llama-3.1-8B", namespace="dyn-b")
    m.record(times(R_B, 40), model="llama-3x1-8b", namespace="dyn-a")
    m.record(times(R_B, 50), model="Llama-3.1-8B-Instruct", namespace="dyn-a")


def test_known_traffic_over_two_frontends(metrics: FrontendMetrics) -> None:
    before = metrics.text()
    add_window_traffic(metrics)
    obs = traffic(window(metrics, before))
    assert (obs.end_s, obs.duration_s, obs.num_req) == (1060.0, 60.0, 8)
    assert obs.ttft_ms == pytest.approx((6 * 250 + 2 * 500) / 8)
    assert obs.itl_ms == pytest.approx((6 * 1000 / 64 + 2 * 1000 / 32) / 8)
    assert obs.isl == pytest.approx(1500)
    assert obs.osl == pytest.approx(175)
    assert obs.request_duration_s == pytest.approx((6 * 4.25 + 2 * 3.5) / 8)
    assert obs.isl_histogram is not None and obs.osl_histogram is not None
    isl = dict(zip(obs.isl_histogram.bounds, obs.isl_histogram.counts, strict=True))
    assert {b: c for b, c in isl.items() if c} == {1024.0: 6, 4096.0: 2}
    assert obs.isl_histogram.overflow == 0
    assert obs.request_rate == pytest.approx(8 / 60)


@pytest.mark.parametrize(
    ("model", "namespace", "num_req"),
    [
        pytest.param("llama-3.1-8b", "dyn-b", 3, id="other namespace"),
        pytest.param("LLAMA-3.1-8B", "dyn-a", 8, id="case-insensitive"),
        pytest.param("llama-3x1-8b", "dyn-a", 40, id="dot is literal"),
        pytest.param("llama-3.1-8b-instruct", "dyn-a", 50, id="exact, not prefix"),
        pytest.param(None, "dyn-a", 98, id="no model filter"),
    ],
)
def test_filters(
    metrics: FrontendMetrics, model: str | None, namespace: str, num_req: float
) -> None:
    before = metrics.text()
    add_window_traffic(metrics)
    assert traffic(window(metrics, before, model=model, namespace=namespace)).num_req == num_req


def test_zero_traffic_is_an_observation(metrics: FrontendMetrics) -> None:
    # Dynamo issue #6985: idle must reach the planner as 0 requests, not as missing data.
    obs = traffic(window(metrics, metrics.text()))
    assert obs.num_req == 0
    assert (obs.ttft_ms, obs.itl_ms, obs.isl, obs.osl, obs.request_duration_s) == (None,) * 5
    assert obs.isl_histogram is not None and obs.isl_histogram.total == 0


def partial(obs: object) -> MissingObservation:
    assert isinstance(obs, MissingObservation), obs
    assert obs.reason == MissingReason.PARTIAL_WINDOW, obs
    return obs


def test_counter_reset_in_the_window_is_missing_not_low_traffic(metrics: FrontendMetrics) -> None:
    # Issue 19: the requests between the last scrape before the restart and the restart
    # are counted nowhere; what remains would read as low traffic.
    before = metrics.text()
    metrics.reset()  # the frontends restarted
    metrics.record(times(R_A, 3), model="Llama-3.1-8B", namespace="dyn-a", pod="a")
    metrics.record(times(R_B, 1), model="Llama-3.1-8B", namespace="dyn-a", pod="b")
    obs = partial(window(metrics, before))
    assert "dynamo_frontend_requests_started_total{" in obs.detail
    assert "0% covered" in obs.detail and "60 s window" in obs.detail


def test_series_that_appeared_in_the_window_is_missing(metrics: FrontendMetrics) -> None:
    # A frontend newly scraped: its requests before its first scrape are counted nowhere.
    before = metrics.text()
    metrics.record(times(R_B, 5), model="Llama-3.1-8B", namespace="dyn-a", pod="new")
    metrics.record(times(R_A, 1), model="Llama-3.1-8B", namespace="dyn-a", pod="a")
    assert 'pod="new"' in partial(window(metrics, before)).detail
    # Other models' and namespaces' new series do not matter.
    assert traffic(window(metrics, before, namespace="dyn-b")).num_req == 0


def every(step_s: float, start_s: float, end_s: float) -> tuple[tuple[float, float], ...]:
    """A counter scraped every ``step_s`` from ``start_s`` to ``end_s``, rising by 1 a scrape."""
    n = round((end_s - start_s) / step_s)
    return tuple((start_s + i * step_s, float(i)) for i in range(n + 1))


@pytest.mark.parametrize(
    ("samples", "expected"),
    [
        pytest.param(every(15, 1014, 1059), None, id="first scrape within an interval"),
        pytest.param(every(15, 1016.4, 1046.4), None, id="within 1.1 intervals"),
        pytest.param(every(15, 1017, 1047), 1017, id="beyond 1.1 intervals"),
        pytest.param(every(1, 1050, 1060), 1050, id="Prometheus back 50 s in"),
        pytest.param(((1000, 5.0), (1060, 9.0)), None, id="two scrapes at the ends"),
        pytest.param(((1000, 5.0),), None, id="lone sample at the start"),
        pytest.param(((1060, 5.0),), 1060, id="lone sample at the end"),
        pytest.param(((1000, 50.0), (1030, 60.0), (1045, 2.0), (1060, 9.0)), 1045, id="reset"),
        pytest.param((), None, id="no samples"),
    ],
)
def test_history_start_follows_increase_extrapolation(
    samples: tuple[tuple[float, float], ...], expected: float | None
) -> None:
    assert history_start(samples, 1000.0) == expected


def test_first_window_of_a_new_model_is_missing(metrics: FrontendMetrics) -> None:
    before = metrics.text()
    metrics.record(times(R_A, 5), model="new-model", namespace="dyn-a")
    obs = window(metrics, before, model="new-model")
    assert isinstance(obs, MissingObservation)
    assert obs.reason == MissingReason.NO_SERIES
    assert "new-model" in obs.detail


def test_falls_back_to_finished_requests() -> None:
    m = FrontendMetrics()
    m.record(times(R_A, 2), model="legacy", namespace="dyn-a", count_started=False)
    before = m.text()
    m.record(times(R_A, 5), model="legacy", namespace="dyn-a", count_started=False)
    assert traffic(window(m, before, model="legacy")).num_req == 5


def test_router_source_and_namespace_with_underscores() -> None:
    m = FrontendMetrics(ROUTER)
    m.record(times(R_A, 1), model="llama", namespace="team_a_graph")
    before = m.text()
    m.record(times(R_A, 7), model="llama", namespace="team_a_graph")
    obs = window(m, before, model="llama", namespace="team-a-graph", source="router")
    assert traffic(obs).num_req == 7
    assert isinstance(
        window(m, before, model="llama", namespace="team-a-graph"), MissingObservation
    )


def test_samples_and_text_give_the_same_snapshot(metrics: FrontendMetrics) -> None:
    families = text_string_to_metric_families(metrics.text())
    from_samples = snapshot_from_samples(s for f in families for s in f.samples)
    assert from_samples == snapshot_from_text(metrics.text())
    key = sample_key(
        "dynamo_frontend_requests_started_total",
        {"pod": "b", "model": "Llama-3.1-8B", "dynamo_namespace": "dyn-a"},
    )
    assert from_samples[key] == 4


@pytest.mark.parametrize(
    ("call", "message"),
    [
        pytest.param(lambda: snapshot_from_text("metric{ 1\n"), "exposition", id="bad text"),
        pytest.param(lambda: snapshot_from_text("a_total 1\na_total 2\n"), "twice", id="duplicate"),
        pytest.param(
            lambda: traffic_from_snapshots(
                start={}, end={}, start_s=5, end_s=5, model_name=None, namespace="n"
            ),
            "end_s",
            id="empty window",
        ),
        pytest.param(
            lambda: traffic_from_snapshots(
                start={}, end={}, start_s=0, end_s=5, model_name=None, namespace="n", source="x"
            ),
            "source",
            id="unknown source",
        ),
    ],
)
def test_bad_input_is_a_clear_error(call: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()  # type: ignore[operator]


def test_bad_bucket_bound_names_the_metric() -> None:
    name = "dynamo_frontend_input_sequence_tokens_bucket"
    labels = {"dynamo_namespace": "n", "le": "big"}
    start = {sample_key(name, labels): 0.0}
    end = {sample_key(name, labels): 1.0}
    with pytest.raises(ValueError, match=r"input_sequence_tokens_bucket.*'big'"):
        traffic_from_snapshots(
            start=start, end=end, start_s=0, end_s=1, model_name=None, namespace="n"
        )


def test_histogram_from_cumulative_clamps_mixed_layouts() -> None:
    # Two frontends with different bounds summed by le: 10 <= 5 is not monotonic.
    hist = histogram_from_cumulative({5.0: 4.0, 10.0: 3.0, 20.0: 9.0, math.inf: 11.0})
    assert hist == Histogram(bounds=(5.0, 10.0, 20.0), counts=(4.0, 0.0, 5.0), overflow=2.0)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0])
def test_non_finite_or_negative_increase_is_bad_data(bad: float) -> None:
    increases = WindowIncreases(
        requests_started=3.0, requests_finished=3.0, sums={"ttft": bad}, counts={"ttft": 3.0}
    )
    obs = observation_from_increases(increases, end_s=60.0, duration_s=60.0)
    assert isinstance(obs, MissingObservation)
    assert obs.reason == MissingReason.BAD_RESPONSE
    assert "ttft_sum" in obs.detail


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=20), min_size=2, max_size=5))
def test_windows_add_up(batches: list[int]) -> None:
    """Consecutive windows' request counts add up to the count over their union."""
    m = FrontendMetrics()
    m.record(times(R_A, 0), model="m", namespace="n")
    texts = [m.text()]
    for n in batches:
        m.record(times(R_A, n), model="m", namespace="n")
        texts.append(m.text())
    snaps = [snapshot_from_text(t) for t in texts]

    def num_req(i: int, j: int) -> float:
        obs = traffic_from_snapshots(
            start=snaps[i], end=snaps[j], start_s=i, end_s=j, model_name="m", namespace="n"
        )
        return traffic(obs).num_req

    parts = [num_req(i, i + 1) for i in range(len(batches))]
    assert parts == batches
    assert num_req(0, len(batches)) == sum(parts)


def test_the_router_kv_hit_rate_is_the_mean_of_its_histogram() -> None:
    # issue 35: the KV router observes each request's cached share of its prompt blocks
    increases = WindowIncreases(
        requests_started=10.0,
        requests_finished=10.0,
        sums={"kv_hit": 3.0},
        counts={"kv_hit": 10.0},
    )
    obs = traffic(observation_from_increases(increases, end_s=60.0, duration_s=60.0))
    assert obs.kv_hit_rate == pytest.approx(0.3)
    # no KV router: no reading, and not a gap in the data either
    bare = WindowIncreases(requests_started=10.0, requests_finished=10.0)
    assert (
        traffic(observation_from_increases(bare, end_s=60.0, duration_s=60.0)).kv_hit_rate is None
    )


def test_the_simulated_router_hit_rate_reaches_the_observation() -> None:
    # the replay path: the simulator's metrics page, two snapshots, one observation
    from disagg_planner.simulator.metrics import FrontendMetrics as SimulatedFrontend

    frontend = SimulatedFrontend(model="m", namespace="dyn")
    frontend.on_started()
    frontend.on_first_token(0.1, 1000, cached_tokens=0)
    start = snapshot_from_samples(frontend.exposition_samples())
    for cached in (500, 700, 0):
        frontend.on_started()
        frontend.on_first_token(0.1, 1000, cached_tokens=cached)
    end = snapshot_from_samples(frontend.exposition_samples())
    obs = traffic(
        traffic_from_snapshots(
            start=start, end=end, start_s=0.0, end_s=60.0, model_name="m", namespace="dyn",
            source="frontend",
        )
    )  # fmt: skip
    assert obs.kv_hit_rate == pytest.approx((0.5 + 0.7 + 0.0) / 3)


def test_accept_length_from_the_engines_speculative_counters(metrics: FrontendMetrics) -> None:
    for pod in ("a", "b"):
        metrics.record_spec_decode(
            drafts=500, accepted=900, model="Llama-3.1-8B", namespace="dyn-a", pod=pod
        )
    metrics.record_spec_decode(drafts=10, accepted=70, model="Llama-3.1-8B", namespace="dyn-b")
    before = metrics.text()
    add_window_traffic(metrics)
    # two engines of the model: 600 + 200 steps, 1100 + 500 tokens kept
    metrics.record_spec_decode(
        drafts=600, accepted=1100, model="Llama-3.1-8B", namespace="dyn-a", pod="a"
    )
    metrics.record_spec_decode(
        drafts=200, accepted=500, model="Llama-3.1-8B", namespace="dyn-a", pod="b"
    )
    metrics.record_spec_decode(drafts=10, accepted=70, model="Llama-3.1-8B", namespace="dyn-b")
    obs = traffic(window(metrics, before))
    assert obs.accept_length == pytest.approx(1 + 1600 / 800)
    assert obs.accept_length_missing is None
    idle = traffic(window(metrics, metrics.text()))
    assert idle.accept_length is None
    assert idle.accept_length_missing == "no speculative drafts in the window"


def test_engines_restarting_in_the_window_count_what_they_did_since(
    metrics: FrontendMetrics,
) -> None:
    # The frontend keeps its counters, so the window is covered; the engines' counters start
    # again from 0 and increase() counts their values since the restart.
    metrics.record_spec_decode(drafts=5000, accepted=9000, model="Llama-3.1-8B", namespace="dyn-a")
    before = metrics.text()
    add_window_traffic(metrics)
    metrics.restart_engines()
    metrics.record_spec_decode(drafts=100, accepted=150, model="Llama-3.1-8B", namespace="dyn-a")
    obs = traffic(window(metrics, before))
    assert obs.num_req == 8
    assert obs.accept_length == pytest.approx(2.5)
