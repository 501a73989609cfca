"""The traffic PromQL against a real Prometheus scraping a frontend exporter.

One Prometheus (1 s scrapes) reads one exporter through a timeline of published states:
baseline, known traffic, idle, counter reset, the engines restarting (their
speculative-decoding counters reset, the frontend's not). Each test evaluates the observer over the
window between two consecutive scrapes (so ``increase()`` has nothing to extrapolate and
every expected value is exact) and checks it, and checks that the replay path gives the
same observation from the two scraped texts.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.core.types import Histogram, MissingObservation, TrafficObservation
from disagg_planner.observe import (
    MissingReason,
    PrometheusTrafficObserver,
    snapshot_from_text,
    traffic_from_snapshots,
)
from disagg_planner.signals.frontend import TOKEN_BUCKETS
from tests.integration.conftest import PrometheusFactory, PrometheusServer, poll
from tests.integration.prometheus.exporter import GENERATION_METRIC, FrontendExporter, Requests

MODEL = "Llama-3.1-8B"  # as served; the planner is configured with the lower-case name
# Names a sloppy filter would also match: "." as a regex wildcard, a missing anchor.
DOT_TWIN = "llama-3x1-8b"
PREFIX_TWIN = "Llama-3.1-8B-Instruct"
LEGACY = "legacy-model"  # a frontend without dynamo_frontend_requests_started_total

R_A = Requests(n=1, ttft_s=0.25, itl_s=1 / 64, isl=1000, osl=200, duration_s=4.25)
R_B = Requests(n=1, ttft_s=0.5, itl_s=1 / 32, isl=3000, osl=100, duration_s=3.5)
R_C = Requests(n=1, ttft_s=0.125, itl_s=1 / 128, isl=100, osl=50, duration_s=1.0)


def times(requests: Requests, n: int) -> Requests:
    return Requests(n, requests.ttft_s, requests.itl_s, requests.isl, requests.osl,
                    requests.duration_s)  # fmt: skip


@dataclass(frozen=True)
class Timeline:
    prometheus: PrometheusServer
    exporter: FrontendExporter
    scrapes: list[tuple[float, float]]  # (time_s, generation) of every scrape
    baseline: int
    traffic: int
    idle: int
    reset: int
    engine_restart: int

    def window(self, first: int, last: int) -> tuple[float, float]:
        """(start_s, end_s): the last scrape of ``first`` and the first scrape of ``last``."""
        start = max(t for t, g in self.scrapes if g == first)
        end = min(t for t, g in self.scrapes if g == last)
        return start, end

    def observer(self, model: str | None, namespace: str) -> PrometheusTrafficObserver:
        config = PlannerConfig(
            model_name=model,
            namespace=namespace,
            metric_pulling_prometheus_endpoint=self.prometheus.url,
        )
        return PrometheusTrafficObserver(config)

    def observe(
        self, model: str | None, namespace: str, first: int, last: int
    ) -> TrafficObservation | MissingObservation:
        start, end = self.window(first, last)
        with self.observer(model, namespace) as observer:
            return observer.observe(end_s=end, duration_s=round((end - start) * 1000) / 1000)

    def replay(
        self, model: str | None, namespace: str, first: int, last: int
    ) -> TrafficObservation | MissingObservation:
        start, end = self.window(first, last)
        return traffic_from_snapshots(
            start=snapshot_from_text(self.exporter.texts[first]),
            end=snapshot_from_text(self.exporter.texts[last]),
            start_s=start,
            end_s=end,
            model_name=model,
            namespace=namespace,
        )


def wait_for_generation(prometheus: PrometheusServer, exporter: FrontendExporter) -> None:
    """Block until Prometheus has scraped the exporter's latest published state."""
    selector = f'{GENERATION_METRIC}{{instance="{exporter.target}"}}'
    wanted = exporter.generation
    poll(
        lambda: True if any(g == wanted for _, g in prometheus.samples(selector)) else None,
        timeout_s=15,
        what=f"generation {wanted} scraped",
    )


@pytest.fixture(scope="module")
def timeline(module_prometheus_factory: PrometheusFactory) -> Iterator[Timeline]:
    exporter = FrontendExporter()
    try:
        # Baseline: every series exists, with history.
        exporter.record(times(R_A, 10), model=MODEL, namespace="dyn-a", pod="a")
        exporter.record(times(R_B, 4), model=MODEL, namespace="dyn-a", pod="b")
        exporter.record(times(R_C, 7), model=MODEL, namespace="dyn-b")
        exporter.record(times(R_C, 5), model=DOT_TWIN, namespace="dyn-a")
        exporter.record(times(R_C, 9), model=PREFIX_TWIN, namespace="dyn-a")
        exporter.record(times(R_A, 6), model=LEGACY, namespace="dyn-a", count_started=False)
        # the model's two engines speculate (vLLM's counters), another namespace's too
        for pod in ("a", "b"):
            exporter.record_spec_decode(
                drafts=700, accepted=1200, model=MODEL, namespace="dyn-a", pod=pod
            )
        exporter.record_spec_decode(drafts=50, accepted=300, model=MODEL, namespace="dyn-b")
        baseline = exporter.publish()
        prometheus = module_prometheus_factory([exporter.target])
        wait_for_generation(prometheus, exporter)
        # The window's traffic.
        exporter.record(times(R_A, 6), model=MODEL, namespace="dyn-a", pod="a")
        exporter.record(times(R_B, 2), model=MODEL, namespace="dyn-a", pod="b")
        exporter.record(times(R_C, 3), model=MODEL, namespace="dyn-b")
        exporter.record(times(R_C, 40), model=DOT_TWIN, namespace="dyn-a")
        exporter.record(times(R_C, 50), model=PREFIX_TWIN, namespace="dyn-a")
        exporter.record(times(R_A, 4), model=LEGACY, namespace="dyn-a", count_started=False)
        exporter.record_spec_decode(drafts=300, accepted=500, model=MODEL, namespace="dyn-a")
        exporter.record_spec_decode(
            drafts=100, accepted=177, model=MODEL, namespace="dyn-a", pod="b"
        )
        exporter.record_spec_decode(drafts=50, accepted=300, model=MODEL, namespace="dyn-b")
        traffic = exporter.publish()
        wait_for_generation(prometheus, exporter)
        idle = exporter.publish()  # nothing new: the frontends are up but idle
        wait_for_generation(prometheus, exporter)
        exporter.reset()  # the frontends restart: every counter starts again from 0
        exporter.record(times(R_A, 3), model=MODEL, namespace="dyn-a", pod="a")
        exporter.record(times(R_B, 3), model=MODEL, namespace="dyn-a", pod="b")
        exporter.record(times(R_A, 2), model=LEGACY, namespace="dyn-a", count_started=False)
        reset = exporter.publish()
        wait_for_generation(prometheus, exporter)
        exporter.restart_engines()  # the engines restart, the frontends keep counting
        exporter.record(times(R_A, 2), model=MODEL, namespace="dyn-a", pod="a")
        exporter.record_spec_decode(drafts=40, accepted=70, model=MODEL, namespace="dyn-a")
        engine_restart = exporter.publish()
        wait_for_generation(prometheus, exporter)
        scrapes = prometheus.samples(f'{GENERATION_METRIC}{{instance="{exporter.target}"}}')
        yield Timeline(
            prometheus, exporter, scrapes, baseline, traffic, idle, reset, engine_restart
        )
    finally:
        exporter.close()


def token_histogram(**counts: float) -> Histogram:
    """A histogram over TOKEN_BUCKETS with ``le<bound>=count`` entries, zero elsewhere."""
    by_bound = {float(k.removeprefix("le")): v for k, v in counts.items()}
    bounds = tuple(float(b) for b in TOKEN_BUCKETS)
    return Histogram(bounds=bounds, counts=tuple(by_bound.get(b, 0.0) for b in bounds))


def assert_traffic(obs: object, **expected: float | None) -> TrafficObservation:
    assert isinstance(obs, TrafficObservation), obs
    for name, value in expected.items():
        actual = getattr(obs, name)
        if value is None:
            assert actual is None, f"{name}: {actual}"
        else:
            assert actual == pytest.approx(value, rel=1e-9), f"{name}: {actual} != {value}"
    return obs


def assert_same_observation(live: object, replay: object) -> None:
    assert type(live) is type(replay), (live, replay)
    if isinstance(live, MissingObservation):
        assert isinstance(replay, MissingObservation)
        assert live.reason == replay.reason
        return
    assert isinstance(live, TrafficObservation) and isinstance(replay, TrafficObservation)
    assert live.end_s == pytest.approx(replay.end_s, abs=1e-6)
    assert live.duration_s == pytest.approx(replay.duration_s, abs=1e-6)
    assert live.accept_length_missing == replay.accept_length_missing
    averages = ("ttft_ms", "itl_ms", "isl", "osl", "request_duration_s")
    for name in ("num_req", *averages, "accept_length"):
        a, b = getattr(live, name), getattr(replay, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert a == pytest.approx(b, rel=1e-12), name
    for name in ("isl_histogram", "osl_histogram"):
        a, b = getattr(live, name), getattr(replay, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert a.bounds == b.bounds
            assert a.counts == pytest.approx(b.counts, rel=1e-12)
            assert a.overflow == pytest.approx(b.overflow, rel=1e-12)


def test_known_traffic_summed_over_two_frontends(timeline: Timeline) -> None:
    obs = assert_traffic(
        timeline.observe(MODEL.lower(), "dyn-a", timeline.baseline, timeline.traffic),
        num_req=8,
        ttft_ms=(6 * 250 + 2 * 500) / 8,
        itl_ms=(6 * 1000 / 64 + 2 * 1000 / 32) / 8,
        isl=(6 * 1000 + 2 * 3000) / 8,
        osl=(6 * 200 + 2 * 100) / 8,
        request_duration_s=(6 * 4.25 + 2 * 3.5) / 8,
    )
    _, end = timeline.window(timeline.baseline, timeline.traffic)
    assert obs.end_s == pytest.approx(end, abs=1e-3)
    assert obs.isl_histogram == token_histogram(le1024=6, le4096=2)
    assert obs.osl_histogram == token_histogram(le128=2, le256=6)


@pytest.mark.parametrize(
    ("model", "namespace", "num_req", "ttft_ms"),
    [
        pytest.param(MODEL, "dyn-b", 3, 125, id="same model, other namespace"),
        pytest.param(DOT_TWIN, "dyn-a", 40, 125, id="dot in the name is literal"),
        pytest.param(PREFIX_TWIN, "dyn-a", 50, 125, id="match is anchored"),
        pytest.param("LLAMA-3.1-8B-INSTRUCT", "dyn-a", 50, 125, id="case-insensitive"),
        pytest.param(None, "dyn-b", 3, 125, id="no model filter: whole namespace"),
    ],
)
def test_model_and_namespace_filters(
    timeline: Timeline, model: str | None, namespace: str, num_req: float, ttft_ms: float
) -> None:
    obs = timeline.observe(model, namespace, timeline.baseline, timeline.traffic)
    assert_traffic(obs, num_req=num_req, ttft_ms=ttft_ms)


def test_unknown_model_or_namespace_is_missing_not_zero(timeline: Timeline) -> None:
    for model, namespace in (("mistral-7b", "dyn-a"), (MODEL, "dyn-c")):
        obs = timeline.observe(model, namespace, timeline.baseline, timeline.traffic)
        assert isinstance(obs, MissingObservation), obs
        assert obs.reason == MissingReason.NO_SERIES
        assert "dynamo_namespace" in obs.detail


def test_zero_traffic_is_an_observation_with_undefined_averages(timeline: Timeline) -> None:
    # Dynamo issue #6985: idle windows must reach the planner so that it scales down.
    obs = assert_traffic(
        timeline.observe(MODEL, "dyn-a", timeline.traffic, timeline.idle),
        num_req=0,
        ttft_ms=None,
        itl_ms=None,
        isl=None,
        osl=None,
        request_duration_s=None,
    )
    assert obs.isl_histogram is not None and obs.isl_histogram.total == 0


def test_counter_reset_in_the_window_is_missing_not_low_traffic(timeline: Timeline) -> None:
    # Issue 19: what the frontends served between their last scrape and their restart is
    # counted nowhere, so the window would read low.
    obs = timeline.observe(MODEL, "dyn-a", timeline.idle, timeline.reset)
    assert isinstance(obs, MissingObservation), obs
    assert obs.reason == MissingReason.PARTIAL_WINDOW
    assert "0% covered; 2 of 2 series" in obs.detail


def test_accept_length_from_the_engines_speculative_counters(timeline: Timeline) -> None:
    # two engines of the model: 300 + 100 speculative steps, 500 + 177 draft tokens kept
    obs = timeline.observe(MODEL, "dyn-a", timeline.baseline, timeline.traffic)
    assert_traffic(obs, num_req=8, accept_length=1 + 677 / 400)
    other = timeline.observe(MODEL, "dyn-b", timeline.baseline, timeline.traffic)
    assert_traffic(other, accept_length=1 + 300 / 50)


def test_idle_engines_give_no_accept_length_and_say_why(timeline: Timeline) -> None:
    obs = timeline.observe(MODEL, "dyn-a", timeline.traffic, timeline.idle)
    assert_traffic(obs, num_req=0, accept_length=None)
    assert isinstance(obs, TrafficObservation)
    assert obs.accept_length_missing == "no speculative drafts in the window"
    # a frontend whose engines do not speculate has nothing to say about it
    legacy = timeline.observe(LEGACY, "dyn-a", timeline.baseline, timeline.traffic)
    assert_traffic(legacy, accept_length=None)
    assert isinstance(legacy, TrafficObservation) and legacy.accept_length_missing is None


def test_engines_restarting_count_what_they_did_since(timeline: Timeline) -> None:
    # increase() takes a counter that went down as restarted from 0: 40 steps, 70 kept
    obs = timeline.observe(MODEL, "dyn-a", timeline.reset, timeline.engine_restart)
    assert_traffic(obs, num_req=2, accept_length=1 + 70 / 40)


def test_falls_back_to_finished_requests_and_says_so(
    timeline: Timeline, caplog: pytest.LogCaptureFixture
) -> None:
    start, end = timeline.window(timeline.baseline, timeline.traffic)
    with (
        caplog.at_level(logging.WARNING, logger="disagg_planner.observe"),
        timeline.observer(LEGACY, "dyn-a") as observer,
    ):
        obs = observer.observe(end_s=end, duration_s=round((end - start) * 1000) / 1000)
    assert_traffic(obs, num_req=4, ttft_ms=250, osl=200)
    assert observer.count_metric_used == "requests_finished"
    assert "dynamo_frontend_requests_total" in caplog.text


@pytest.mark.parametrize("model", [MODEL, DOT_TWIN, LEGACY, "mistral-7b", None])
@pytest.mark.parametrize("window", ["traffic", "idle", "reset", "engine_restart"])
def test_replay_from_snapshots_equals_promql(
    timeline: Timeline, model: str | None, window: str
) -> None:
    last = getattr(timeline, window)
    for namespace in ("dyn-a", "dyn-b"):
        live = timeline.observe(model, namespace, last - 1, last)
        replay = timeline.replay(model, namespace, last - 1, last)
        assert_same_observation(live, replay)


def test_prometheus_or_frontend_outage_is_missing_not_zero(
    prometheus_factory: PrometheusFactory,
) -> None:
    exporter = FrontendExporter()
    stop = threading.Event()

    def steady() -> None:  # 8 requests/s, published every 0.25 s
        while not stop.wait(0.25):
            exporter.record(times(R_A, 2), model=MODEL, namespace="dyn-a")
            exporter.publish()

    feeder = threading.Thread(target=steady, daemon=True)
    try:
        exporter.record(times(R_A, 0), model=MODEL, namespace="dyn-a")
        exporter.publish()
        feeder.start()
        prometheus = prometheus_factory([exporter.target])
        selector = f'{GENERATION_METRIC}{{instance="{exporter.target}"}}'

        def span_s() -> float:
            scrapes = prometheus.samples(selector)
            return scrapes[-1][0] - scrapes[0][0] if scrapes else 0.0

        poll(lambda: True if span_s() >= 5 else None, timeout_s=20, what="5 s of scrapes")
        config = PlannerConfig(
            model_name=MODEL,
            namespace="dyn-a",
            metric_pulling_prometheus_endpoint=prometheus.url,
            metric_pulling_prometheus_request_timeout_seconds=2,
            throughput_adjustment_interval_seconds=4,
        )
        with PrometheusTrafficObserver(config) as observer:
            # Live: the window ends now and lasts one adjustment interval.
            steady_obs = assert_traffic(observer.observe(), ttft_ms=250, isl=1000)
            assert steady_obs.duration_s == 4
            assert 4 <= steady_obs.request_rate <= 12  # 8/s, give or take a scrape
            assert abs(steady_obs.end_s - time.time()) < 5

            prometheus.stop()
            down = observer.observe()
            assert isinstance(down, MissingObservation), down
            assert down.reason == MissingReason.PROMETHEUS_UNREACHABLE

            prometheus.restart(wait_for_targets=False)

            def observed() -> TrafficObservation | None:
                obs = observer.observe()
                return obs if isinstance(obs, TrafficObservation) else None

            back = poll(observed, timeout_s=15, what="an observation after the restart")
            assert back.num_req > 0

            # The frontend dies: its series go stale; once the window holds no samples the
            # observation is missing. Until then it only ever reports real, positive traffic.
            stop.set()
            feeder.join(timeout=5)
            exporter.close()
            seen: list[TrafficObservation | MissingObservation] = []

            def missing() -> MissingObservation | None:
                seen.append(observer.observe())
                return seen[-1] if isinstance(seen[-1], MissingObservation) else None

            gone = poll(missing, timeout_s=15, what="a missing observation", interval_s=0.5)
            assert gone.reason == MissingReason.NO_SERIES
            for obs in seen[:-1]:
                assert isinstance(obs, TrafficObservation) and obs.num_req > 0, obs
    finally:
        stop.set()
        exporter.close()


class SteadyFrontend:
    """A frontend serving 8 requests/s, published every 0.25 s, until closed."""

    RATE = 8.0

    def __init__(self) -> None:
        self.exporter = FrontendExporter()
        self.exporter.record(times(R_A, 0), model=MODEL, namespace="dyn-a")
        self.exporter.publish()
        self._stop = threading.Event()
        self._restart = threading.Event()
        self._restarted: queue.Queue[int] = queue.Queue()
        self._feeder = threading.Thread(target=self._feed, daemon=True)
        self._feeder.start()

    def _feed(self) -> None:
        while not self._stop.wait(0.25):
            restart = self._restart.is_set()
            if restart:
                self.exporter.reset()
                self._restart.clear()
            self.exporter.record(times(R_A, 2), model=MODEL, namespace="dyn-a")
            generation = self.exporter.publish()
            if restart:
                self._restarted.put(generation)

    def restart(self) -> int:
        """The frontend process restarts (its counters start again from 0), load unchanged;
        returns the first generation published after the restart."""
        self._restart.set()
        return self._restarted.get(timeout=5)

    def close(self) -> None:
        self._stop.set()
        self._feeder.join(timeout=5)
        self.exporter.close()


def until_observed(
    observer: PrometheusTrafficObserver,
) -> list[TrafficObservation | MissingObservation]:
    """Observe every 0.25 s until the first traffic observation; every observation made."""
    seen: list[TrafficObservation | MissingObservation] = []

    def observed() -> TrafficObservation | None:
        seen.append(observer.observe())
        return seen[-1] if isinstance(seen[-1], TrafficObservation) else None

    poll(observed, timeout_s=30, what="a traffic observation", interval_s=0.25)
    return seen


def assert_held_then_steady(seen: list[TrafficObservation | MissingObservation]) -> None:
    """Partial windows were missing, and the first traffic read is the real load."""
    first = seen[-1]
    assert isinstance(first, TrafficObservation)
    # 8/s, give or take a publication between scrapes; a partial window reads ~2-3/s.
    assert 6 <= first.request_rate <= 10, seen
    reasons = [obs.reason for obs in seen if isinstance(obs, MissingObservation)]
    assert MissingReason.PARTIAL_WINDOW in reasons, seen


def test_uncovered_window_at_constant_load_is_missing_not_low_traffic(
    prometheus_factory: PrometheusFactory,
) -> None:
    """Issue 19: at a steady 8 req/s, the windows right after a target is first scraped,
    after Prometheus comes back from an outage longer than the window, and after the
    frontend restarts hold only part of the load; each is missing, never low traffic."""
    # Scrapes every 0.5 s over a 4 s window: eight scrapes a window, as many as 1 s scrapes
    # give a 6 s window (half the wall time), and more than 3 s from the first scrape to the
    # end of the first partial window, to see it in.
    window_s = 4
    frontend = SteadyFrontend()
    try:
        prometheus = prometheus_factory([frontend.exporter.target], scrape_interval_s=0.5)
        config = PlannerConfig(
            model_name=MODEL,
            namespace="dyn-a",
            metric_pulling_prometheus_endpoint=prometheus.url,
            metric_pulling_prometheus_request_timeout_seconds=2,
            throughput_adjustment_interval_seconds=window_s,
        )
        with PrometheusTrafficObserver(config) as observer:
            # A newly scraped target: Prometheus has its samples from a moment ago only.
            assert_held_then_steady(until_observed(observer))

            # Prometheus is down for longer than the window; the load goes on.
            prometheus.stop()
            time.sleep(window_s + 2)
            prometheus.start(wait_for_targets=False)
            seen = until_observed(observer)
            assert_held_then_steady(seen)
            partial = next(
                o
                for o in seen
                if isinstance(o, MissingObservation) and o.reason == MissingReason.PARTIAL_WINDOW
            )
            assert isinstance(partial, MissingObservation)
            assert f"of the {window_s} s window" in partial.detail

            generation = frontend.restart()
            selector = f'{GENERATION_METRIC}{{instance="{frontend.exporter.target}"}}'
            poll(
                lambda: (
                    True if any(g >= generation for _, g in prometheus.samples(selector)) else None
                ),
                timeout_s=10,
                what="the restarted frontend scraped",
            )
            assert_held_then_steady(until_observed(observer))
    finally:
        frontend.close()
