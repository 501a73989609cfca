"""An engine spec's ``speed=X`` runs the simulated engine at X times its timing model's speed:
every step, prefill and decode, of either timing (roofline ``sim:`` or AIConfigurator's
``aic:``) takes 1/X as long, and nothing else about the engine changes. Bad values are
refused naming the spec and the value (issue 29: a planner measured against a profile that
is wrong by a known factor)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from disagg_planner.cli.profile_cmd import bundled_profile_of
from disagg_planner.simulator.engine_spec import parse
from disagg_planner.simulator.engines import engine_for
from disagg_planner.simulator.errors import EngineSpecError

OUT_OF_RANGE = (
    "must be a finite number > 0 (the multiple of the engine's own speed: 0.5 is half as fast)"
)
SIM = "sim:llama-3.1-8b-fp8@h200_sxm:tp1"
AIC = "aic:llama-3.1-8b-fp8@h200_sxm:vllm:tp1"

# (name, iteration_time_s arguments): a prefill chunk, a decode batch, both in one step
STEPS = [
    ("prefill 2000 tokens", (2000, 0, 0, 0), {}),
    ("chunk after 6000 tokens of context", (2048, 6000, 0, 0), {}),
    ("decode 64 requests", (0, 0, 64, 64 * 3000), {}),
    ("mixed: 2 prefills and 32 decodes", (1024, 500, 32, 32 * 2000), {"prefill_requests": 2}),
]


@pytest.mark.parametrize("base", [SIM, pytest.param(AIC, marks=pytest.mark.aic)])
@pytest.mark.parametrize("speed", [0.5, 0.7, 2.0])
@pytest.mark.parametrize(("name", "args", "kwargs"), STEPS, ids=[s[0] for s in STEPS])
def test_every_step_takes_one_over_speed_as_long(
    base: str, speed: float, name: str, args: tuple[int, ...], kwargs: dict[str, int]
) -> None:
    own = engine_for(base)
    slowed = engine_for(f"{base}:speed={speed:g}")
    expected = own.iteration_time_s(*args, **kwargs) / speed
    assert slowed.iteration_time_s(*args, **kwargs) == pytest.approx(expected, rel=1e-12), name


@pytest.mark.parametrize("base", [SIM, pytest.param(AIC, marks=pytest.mark.aic)])
def test_decode_runs_arrays_and_the_convenience_views_slow_down_alike(base: str) -> None:
    own, half = engine_for(base), engine_for(f"{base}:speed=0.5")
    run, slow_run = own.decode_run_s(16, 16 * 1000, 100), half.decode_run_s(16, 16 * 1000, 100)
    assert slow_run == pytest.approx([2 * d for d in run], rel=1e-12)
    kv = np.array([1000.0, 5000.0, 20000.0])
    assert half.iteration_time_s(0, 0, 8, kv) == pytest.approx(
        2 * own.iteration_time_s(0, 0, 8, kv), rel=1e-12
    )
    assert half.prefill_time_s(20000) == pytest.approx(2 * own.prefill_time_s(20000), rel=1e-12)
    assert half.decode_step_time_s(32, 4000) == pytest.approx(
        2 * own.decode_step_time_s(32, 4000), rel=1e-12
    )


def test_speed_changes_the_timing_only() -> None:
    own, fast = engine_for(SIM), engine_for(f"{SIM}:speed=1.4")
    assert fast.capabilities == own.capabilities
    assert fast.max_decode_batch(3000) == own.max_decode_batch(3000)
    # the spec is the same engine otherwise, and prints and parses back with its speed
    assert dataclasses.replace(fast.spec, speed=1.0) == own.spec
    assert str(fast.spec) == f"{SIM}:speed=1.4"
    assert parse(str(fast.spec)) == fast.spec
    assert str(parse(f"{SIM}:speed=1")) == SIM
    odd = parse(f"{SIM}:speed=0.123456789")
    assert parse(str(odd)) == odd and str(parse(f"{SIM}:speed=2.0")) == f"{SIM}:speed=2"
    # a resized (elastic EP) engine keeps its speed
    moe = parse("sim:deepseek-v3@gb200:tp1:dp16:ep16:speed=0.5")
    assert moe.with_dp(20).speed == 0.5


@pytest.mark.parametrize("base", [SIM, pytest.param(AIC, marks=pytest.mark.aic)])
def test_the_planner_keeps_the_profile_of_the_engine_at_its_own_speed(base: str) -> None:
    # the bundled profile a replay sizes from is found without the speed
    assert bundled_profile_of(f"{base}:speed=0.5") == bundled_profile_of(base) is not None


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("0", OUT_OF_RANGE),
        ("-0.5", OUT_OF_RANGE),
        ("nan", OUT_OF_RANGE),
        ("inf", OUT_OF_RANGE),
        ("fast", "is not a number"),
        ("", "is not a number"),
    ],
)
@pytest.mark.parametrize("base", [SIM, pytest.param(AIC, marks=pytest.mark.aic)])
def test_a_bad_speed_is_refused_naming_the_spec_and_value(base: str, value: str, why: str) -> None:
    text = f"{base}:speed={value}"
    with pytest.raises(EngineSpecError) as err:
        parse(text)
    assert str(err.value) == f"engine spec {text!r}: speed={value!r} {why}"


def test_a_misspelt_speed_key_is_refused() -> None:
    with pytest.raises(EngineSpecError, match=r"unknown option 'speeed'; known: .*speed"):
        parse(f"{SIM}:speeed=0.5")


def test_a_spec_built_in_code_is_checked_too() -> None:
    with pytest.raises(EngineSpecError, match=r"speed=0\.0 must be a finite number > 0"):
        dataclasses.replace(parse(SIM), speed=0.0)
