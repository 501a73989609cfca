"""Issue 29, "learn the model's error, both ways", for prefill without engine metrics (the
load loop off, the default): under load, the frontend's mean TTFT well under what the
profile's queue predicts says the engines carry more than profiled (a batching engine pays
an iteration's fixed cost once for the prompts waiting), and the faster-than-profiled rule
holds the replicas running against the profile's call for more, while the tail is calm."""

from __future__ import annotations

from dataclasses import replace

import pytest

from disagg_planner.core.feedback import CORRECTION_BOUNDS
from disagg_planner.core.latency_capacity import (
    MAX_LATENCY_LEARN_UTILISATION,
    TtftReading,
    latency_capacity_estimate,
    loaded_capacity_estimate,
)
from disagg_planner.core.throughput import ThroughputDecision
from disagg_planner.profiles import Profile
from tests.unit.core.test_feedback import fast, tick, ttft, window
from tests.unit.core.test_throughput import planner, status, traffic

OWN_MS = 40.0


def kingman_mean_ttft(c: float, *, per_engine: float, scv: float = 1.0) -> float:
    """The prompt's own prefill at ``c`` times the profile's work plus Kingman's mean wait
    (Poisson arrivals, service variability ``scv``), written out here as the test's spec."""
    rho = c * per_engine
    return c * OWN_MS + rho / (1 - rho) * (1 + scv) / 2 * c * OWN_MS


def loaded(ttft_ms: float | None, per_engine: float = 0.8, **kw: float) -> float | None:
    reading = TtftReading(ttft_ms, OWN_MS, offered_engines=2 * per_engine, ready=2, **kw)
    return loaded_capacity_estimate(reading)


def test_under_load_a_mean_ttft_under_the_profiles_queue_says_the_engines_carry_more() -> None:
    # at 80% of the profile's work per engine its queue predicts a 200 ms mean
    assert kingman_mean_ttft(1.0, per_engine=0.8) == pytest.approx(200.0)
    c = loaded(100.0)
    assert c is not None and c < 1.0
    assert kingman_mean_ttft(c, per_engine=0.8) == pytest.approx(100.0, rel=1e-6)
    # the first decode step the frontend's TTFT includes is not the prefill's
    assert loaded(110.0, first_token_ms=10.0) == pytest.approx(c)
    # past the engines' modelled capacity, a short wait: the bound's floor
    assert loaded(45.0, per_engine=1.5) == CORRECTION_BOUNDS[0]


def test_the_loaded_estimate_only_lowers_and_only_under_load() -> None:
    # as predicted or slower: nothing (a queue over the model is the breach rules')
    assert loaded(201.0) is None
    assert loaded(400.0) is None
    # no wait beyond the prompt's own prefill: no queue to read (a prompt prefilling faster
    # than profiled, which the light-load estimate does not believe either)
    assert loaded(OWN_MS) is None
    assert loaded(OWN_MS / 2) is None
    # at light load the mean TTFT is the engine's own speed, never below 1
    light = MAX_LATENCY_LEARN_UTILISATION / 2
    assert loaded(30.0, per_engine=light) is None
    assert latency_capacity_estimate(TtftReading(30.0, OWN_MS, light, 1)) == 1.0
    assert loaded(100.0, per_engine=0.8) is not None
    assert loaded(None) is None


def _run(profile: Profile, *, p99_s: float) -> tuple[ThroughputDecision, float]:
    """Three minutes at 11 req/s of ISL 3000 on one prefill engine (83% of the profile's
    40,000 tok/s) with a 160 ms mean TTFT (its queue predicts about 430 ms), then a tick
    at 36 req/s: the decision and the prefill correction learnt before it."""
    tp = planner(profile)
    st = status(1, 1)
    for k in range(1, 13):
        seen = replace(window(15.0 * k, 11, ttft_p99_s=p99_s), ttft_ms=160.0)
        fast(15.0 * k, seen, st)(tp)
    learnt = tp.feedback.correction("prefill")
    obs = traffic(180, 2160, ttft_histogram=ttft(p99_s), ttft_ms=160.0, itl_ms=10.0)
    return tick(180, obs, st)(tp), learnt


def test_a_calm_loaded_engine_holds_replicas_against_the_profiles_call(
    h200_like_profile: Profile,
) -> None:
    decision, learnt = _run(h200_like_profile, p99_s=0.3)  # the tail at 60% of its SLO
    assert learnt < 0.8
    assert decision.replicas == {"prefill": 3, "decode": 4}
    assert (
        "prefill: faster than profiled: the profile asks 4, its mean TTFT at load says x0.69 "
        "the profile's work (tail under its margin): 3 suffice (1 running"
    ) in decision.message


def test_a_tail_past_the_margin_learns_nothing_under_load(h200_like_profile: Profile) -> None:
    decision, learnt = _run(h200_like_profile, p99_s=0.45)  # the tail at 90% of its SLO
    assert learnt == 1.0
    assert decision.replicas == {"prefill": 4, "decode": 4}
    assert "mean TTFT at load" not in decision.message
