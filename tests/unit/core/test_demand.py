"""Issue 35: the prefix-cache discount of prefill and the speculative-decoding gain of decode
(core/demand.py), as table rows and through the throughput loop's sizing."""

from __future__ import annotations

import pytest

from disagg_planner.config import PlannerConfig
from disagg_planner.core.demand import (
    MAX_KV_HIT_RATE,
    DemandSignals,
    accept_length,
    decode_requests,
    kv_hit_rate,
    prefill_requests,
)
from disagg_planner.profiles import Profile
from tests.unit.core.test_throughput import planner, status, traffic

KV_ROWS = [
    # (name, configured, observed, expected hit rate, words in the reason)
    ("no signal: no discount", None, None, 0.0, "none"),
    ("observed by the router", None, 0.4, 0.4, "observed by the router hit 40%"),
    ("configured wins over observed", 0.5, 0.2, 0.5, "configured hit 50%"),
    ("a negative reading is no hit", None, -0.1, 0.0, "observed"),
    ("a full cache still computes a token", None, 1.0, MAX_KV_HIT_RATE, "observed"),
    ("NaN is no signal", None, float("nan"), 0.0, "none"),
]


@pytest.mark.parametrize(
    ("configured", "observed", "expected", "words"),
    [row[1:] for row in KV_ROWS],
    ids=[row[0] for row in KV_ROWS],
)
def test_kv_hit_rate(configured, observed, expected, words) -> None:
    rule = kv_hit_rate(configured=configured, observed=observed)
    assert rule.value == pytest.approx(expected)
    assert rule.reason.startswith("kv_hit_discount")
    assert words in rule.reason


ACCEPT_ROWS = [
    # (name, configured, observed, nextn, expected accept length, words in the reason)
    ("no speculative decoding: 1", 2.5, 2.5, None, 1.0, "no speculative tokens"),
    ("configured", 2.0, 3.0, 3, 2.0, "configured accept length"),
    ("observed when not configured", None, 2.6, 3, 2.6, "observed"),
    ("not seen yet: 1", None, None, 2, 1.0, "neither configured nor seen"),
    ("configured wins over observed", 2.0, 2.6, 3, 2.0, "configured"),
    ("clamped to nextn + 1", None, 5.0, 1, 2.0, "clamped to [1, 2]"),
    ("clamped to 1", None, 0.5, 1, 1.0, "clamped"),
]


@pytest.mark.parametrize(
    ("configured", "observed", "nextn", "expected", "words"),
    [row[1:] for row in ACCEPT_ROWS],
    ids=[row[0] for row in ACCEPT_ROWS],
)
def test_accept_length(configured, observed, nextn, expected, words) -> None:
    rule = accept_length(configured=configured, observed=observed, num_speculative_tokens=nextn)
    assert rule.value == pytest.approx(expected)
    assert rule.reason.startswith("spec_decode_accept")
    assert words in rule.reason


def test_the_requests_each_role_sees() -> None:
    half = kv_hit_rate(configured=0.5, observed=None)
    assert prefill_requests(120.0, half) == 60.0
    two = accept_length(configured=2.0, observed=None, num_speculative_tokens=3)
    assert decode_requests(120.0, two) == 60.0


def _sizing(profile: Profile, **cfg):
    p = planner(profile, **cfg)
    decision = p.tick(60.0, traffic(60.0, 9000, isl=3000, osl=300), status(4, 4))
    return decision.diagnostics.sizing, decision.message


def test_a_kv_hit_rate_of_half_halves_prefill_demand(h200_like_profile: Profile) -> None:
    base, plain = _sizing(h200_like_profile)
    half, message = _sizing(h200_like_profile, kv_hit_rate=0.5)
    assert half["prefill"].demand_tokens_per_s == pytest.approx(
        base["prefill"].demand_tokens_per_s / 2
    )
    assert half["prefill"].replicas < base["prefill"].replicas
    assert half["decode"] == base["decode"]  # decode still decodes every token
    assert "kv_hit_discount: prefill work x 0.50 (configured hit 50%)" in message
    assert "kv_hit_discount" not in plain and "spec_decode_accept" not in plain


def test_accept_length_two_halves_decode_demand(h200_like_profile: Profile) -> None:
    base, _ = _sizing(h200_like_profile)
    spec, message = _sizing(
        h200_like_profile, num_speculative_tokens=3, speculative_accept_length=2.0
    )
    assert spec["decode"].demand_tokens_per_s == pytest.approx(
        base["decode"].demand_tokens_per_s / 2
    )
    assert spec["decode"].replicas < base["decode"].replicas
    assert spec["prefill"] == base["prefill"]
    assert "spec_decode_accept: decode work / 2.00 (configured accept length)" in message


def test_the_observed_hit_rate_is_used_and_kept_through_idle_windows(
    h200_like_profile: Profile,
) -> None:
    p = planner(h200_like_profile)
    p.tick(60.0, traffic(60.0, 9000, kv_hit_rate=0.5), status(4, 4))
    later = p.tick(120.0, traffic(120.0, 9000), status(4, 4))  # no reading this window
    assert "observed by the router hit 50%" in later.message


@pytest.mark.parametrize(
    ("values", "field", "words"),
    [
        ({"speculative_accept_length": 2.0}, "speculative_accept_length", "needs num_spec"),
        (
            {"speculative_accept_length": 4.0, "num_speculative_tokens": 2},
            "speculative_accept_length",
            "must be <= num_speculative_tokens + 1 (3)",
        ),
        ({"kv_hit_rate": 1.0}, "kv_hit_rate", "less than 1"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(values, field, words) -> None:
    with pytest.raises(ValueError, match=field) as info:
        PlannerConfig(**values)
    assert words in str(info.value)


def test_the_aliases_are_accepted() -> None:
    # The pydantic mypy plugin does not see the AliasChoices of validation_alias.
    cfg = PlannerConfig(nextn=3, accept_length=2.5, prefix_hit_rate=0.3)  # type: ignore[call-arg]
    assert (cfg.num_speculative_tokens, cfg.speculative_accept_length, cfg.kv_hit_rate) == (
        3,
        2.5,
        0.3,
    )


def _load_decode_itl(**cfg) -> tuple[float, str]:
    """The load loop's ITL estimate of one decode engine through the planner core."""
    from disagg_planner.core.planner import Observation, PlannerCore
    from disagg_planner.core.types import DeploymentStatus, RoleStatus
    from tests.unit.core.test_load_scaling import config, decode_engines, decode_model

    core = PlannerCore(
        config=config(enable_throughput_scaling=False, mode="decode", **cfg), start_s=0.0
    )
    core.load_models["decode"] = decode_model()  # fitted on the exact decode law
    status = DeploymentStatus({"decode": RoleStatus(2, 2, 1)})
    engines = decode_engines((64, 128_000), (64, 128_000))  # one per ready replica
    decision = core._decide_load(
        100.0, Observation(status=status, engines={"decode": engines}), status
    )["decode"]
    itl = decision.max_itl_ms
    assert itl is not None
    return itl, decision.message


def test_the_load_loop_divides_its_itl_estimate_by_the_accept_length() -> None:
    plain, plain_message = _load_decode_itl()
    spec, message = _load_decode_itl(num_speculative_tokens=3, speculative_accept_length=2.0)
    assert spec == pytest.approx(plain / 2)
    assert "spec_decode_accept" in message and "spec_decode_accept" not in plain_message


def test_the_waiting_prompts_are_discounted_too(h200_like_profile: Profile) -> None:
    # the queues count whole prompts: only their uncached share is prefill work
    def prefill_demand(queued: float, **cfg) -> float:
        p = planner(h200_like_profile, **cfg)
        tick = p.tick(60.0, traffic(60.0, 600), status(4, 4), queued_prefill_tokens=queued)
        return tick.diagnostics.sizing["prefill"].demand_tokens_per_s

    base = prefill_demand(3_000_000, kv_hit_rate=0.0)
    assert base > prefill_demand(0.0, kv_hit_rate=0.0)  # the backlog is part of the demand
    assert prefill_demand(3_000_000, kv_hit_rate=0.5) == pytest.approx(base / 2)


def test_the_observed_accept_length_sizes_decode_and_is_kept_through_idle_windows(
    h200_like_profile: Profile,
) -> None:
    # num_speculative_tokens without speculative_accept_length: the engines' counters decide
    p = planner(h200_like_profile, num_speculative_tokens=3)
    first = p.tick(
        60.0,
        traffic(60.0, 9000, accept_length_missing="no speculative drafts in the window"),
        status(4, 4),
    )
    assert (
        "spec_decode_accept: none (accept length neither configured nor seen: "
        "no speculative drafts in the window)" in first.message
    )
    seen = p.tick(120.0, traffic(120.0, 9000, accept_length=2.0), status(4, 4))
    assert "spec_decode_accept: decode work / 2.00 (observed accept length)" in seen.message
    assert seen.diagnostics.sizing["decode"].demand_tokens_per_s == pytest.approx(
        first.diagnostics.sizing["decode"].demand_tokens_per_s / 2
    )
    idle = p.tick(
        180.0,
        traffic(180.0, 9000, accept_length_missing="no speculative drafts in the window"),
        status(4, 4),
    )
    assert "decode work / 2.00 (observed accept length)" in idle.message


def test_an_observed_accept_length_goes_stale_after_two_intervals_without_one(
    h200_like_profile: Profile,
) -> None:
    # interval 60 s: read at 60 s, kept through one window without drafts (120 s), stale
    # at 181 s (ended 121 s ago): decode is sized for one token per iteration, and says why
    p = planner(h200_like_profile, num_speculative_tokens=3)
    seen = p.tick(60.0, traffic(60.0, 9000, accept_length=2.0), status(4, 4))
    no_drafts = "no series of vllm:spec_decode_num_drafts_total"
    kept = p.tick(120.0, traffic(120.0, 9000, accept_length_missing=no_drafts), status(4, 4))
    assert "decode work / 2.00 (observed accept length)" in kept.message
    stale = p.tick(181.0, traffic(181.0, 9000, accept_length_missing=no_drafts), status(4, 4))
    assert (
        "spec_decode_accept: none (accept length neither configured nor seen: stale: the last "
        f"observed (2.00) was read 121 s ago, over 2 intervals of 60 s; since: {no_drafts})"
        in stale.message
    )
    assert stale.diagnostics.sizing["decode"].demand_tokens_per_s == pytest.approx(
        2 * seen.diagnostics.sizing["decode"].demand_tokens_per_s
    )
    again = p.tick(240.0, traffic(240.0, 9000, accept_length=2.5), status(4, 4))
    assert "decode work / 2.50 (observed accept length)" in again.message


def test_the_load_loop_does_not_use_a_stale_accept_length() -> None:
    # no traffic window at all for longer than two intervals (Prometheus down): the memory
    # the load loop sizes with is forgotten at its own tick, not only at the throughput's
    signals = DemandSignals()
    signals.observe(traffic(60.0, 9000, accept_length=2.0))
    config = PlannerConfig(num_speculative_tokens=3, throughput_adjustment_interval_seconds=60)
    signals.expire(180.0, 60.0)
    assert signals.rules(config).accept.value == 2.0
    signals.expire(181.0, 60.0)
    rule = signals.rules(config).accept
    assert rule.value == 1.0 and "stale: the last observed (2.00) was read 121 s ago" in rule.reason


def test_an_observed_kv_hit_rate_goes_stale_after_two_intervals_without_one(
    h200_like_profile: Profile,
) -> None:
    # interval 60 s: the router's hit rate read at 60 s, kept through one window without it
    # (an idle router reports none), stale at 181 s: prefill is sized for every prompt token
    # again (more replicas, never fewer on old data), and the decision says why
    p = planner(h200_like_profile)
    seen = p.tick(60.0, traffic(60.0, 9000, kv_hit_rate=0.5), status(4, 4))
    assert "kv_hit_discount: prefill work x 0.50 (observed by the router hit 50%)" in seen.message
    kept = p.tick(120.0, traffic(120.0, 9000), status(4, 4))
    assert "prefill work x 0.50 (observed by the router hit 50%)" in kept.message
    stale = p.tick(181.0, traffic(181.0, 9000), status(4, 4))
    assert (
        "kv_hit_discount: none (no KV hit rate configured or observed: stale: the last "
        "observed (0.50) was read 121 s ago, over 2 intervals of 60 s)" in stale.message
    )
    assert stale.diagnostics.sizing["prefill"].demand_tokens_per_s == pytest.approx(
        2 * seen.diagnostics.sizing["prefill"].demand_tokens_per_s
    )
    again = p.tick(240.0, traffic(240.0, 9000, kv_hit_rate=0.25), status(4, 4))
    assert "prefill work x 0.75 (observed by the router hit 25%)" in again.message
    assert "stale" not in again.message
