"""Load-based decisions: one named row per rule (HPA replica_calculator_test style), and
properties that must hold for any input.

Models are fitted on exact synthetic laws (``tests/unit/regression/fpm_factory.py``), so
each row's estimates are known: prefill TTFT of a request behind ``Q`` queued tokens is the
chunked prefill of ``Q + 3000`` tokens (own prompt ~79 ms, SLA 500 ms, scale-down below
400 ms); decode ITL is ``8 ms + 0.1 ms/request + 0.2 us/KV token`` (SLA 50 ms, 40 ms).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.core.load_scaling import (
    EngineKey,
    EngineLimits,
    LoadDecision,
    decide_load,
    make_load_model,
    resolve_engine_limits,
)
from disagg_planner.core.types import LoadReason, Role
from disagg_planner.regression.models import AggModel, DecodeModel, LoadModel, PrefillModel
from disagg_planner.signals.fpm import ForwardPassMetrics
from tests.unit.regression.fpm_factory import agg_law, decode_law, fpm, heartbeat, prefill_law

R = LoadReason
LIMITS = EngineLimits(max_num_batched_tokens=8192, max_num_seqs=512, max_kv_tokens=2_000_000)


def config(**overrides: Any) -> PlannerConfig:
    base: dict[str, Any] = {
        "enable_load_scaling": True,
        "ttft_ms": 500.0,
        "itl_ms": 50.0,
        "load_scaling_down_sensitivity": 80,
        "mode": "agg" if overrides.pop("agg", False) else "disagg",
    }
    base.update(overrides)
    return PlannerConfig(**base)


# --- models fitted on exact laws -------------------------------------------------------------


@cache
def prefill_model() -> PrefillModel:
    model = PrefillModel()
    counter = 1000
    for tokens in (500, 1500, 3000, 4500, 6000, 8192):
        model.observe(
            fpm(counter=counter, wall=prefill_law(tokens), prefill_reqs=1, prefill_tokens=tokens)
        )
        counter += 1
    for _ in range(64):  # the average prompt: 3000 tokens
        model.observe(
            fpm(counter=counter, wall=prefill_law(3000), prefill_reqs=1, prefill_tokens=3000)
        )
        counter += 1
    return model


@cache
def decode_model() -> DecodeModel:
    model = DecodeModel()
    for i, num in enumerate(range(2, 260, 4)):  # 65 iterations, context 1500 / 2500
        kv = num * (2000 + (500 if i % 2 else -500))
        model.observe(
            fpm(counter=1000 + i, wall=decode_law(num, kv), decode_reqs=num, decode_kv=kv)
        )
    return model


@cache
def agg_model() -> AggModel:
    model = AggModel()
    counter = 1000
    for prefill in (0, 1000, 4000, 8000):
        for num in (4, 32, 96):
            kv = num * 1500
            model.observe(
                fpm(
                    counter=counter,
                    wall=agg_law(prefill, kv),
                    decode_reqs=num,
                    decode_kv=kv,
                    prefill_reqs=1 if prefill else 0,
                    prefill_tokens=prefill,
                )
            )
            counter += 1
    for _ in range(64):  # averages: prompt 3000, decode context 1500
        model.observe(
            fpm(
                counter=counter,
                wall=agg_law(3000, 15_000),
                prefill_reqs=1,
                prefill_tokens=3000,
                decode_reqs=10,
                decode_kv=15_000,
            )
        )
        counter += 1
    return model


def model_for(role: Role) -> LoadModel:
    if role == "prefill":
        return prefill_model()
    return decode_model() if role == "decode" else agg_model()


# --- engine snapshots ------------------------------------------------------------------------


def prefill_engines(*queued: int, dp: int = 1) -> dict[EngineKey, ForwardPassMetrics]:
    """One prefill engine per queue depth (tokens); ``dp`` consecutive ones share a worker."""
    return {
        (f"p{i // dp}", i % dp): fpm(
            worker=f"p{i // dp}",
            dp_rank=i % dp,
            wall=0.05,
            prefill_reqs=1,
            prefill_tokens=3000,
            queued_prefill_reqs=q // 3000,
            queued_prefill_tokens=q,
        )
        for i, q in enumerate(queued)
    }


def decode_engines(*batches: tuple[int, int]) -> dict[EngineKey, ForwardPassMetrics]:
    """One decode engine per ``(running requests, KV tokens)``."""
    return {
        (f"d{i}", 0): fpm(worker=f"d{i}", wall=0.03, decode_reqs=n, decode_kv=kv)
        for i, (n, kv) in enumerate(batches)
    }


def agg_engines(*loads: tuple[int, int, int]) -> dict[EngineKey, ForwardPassMetrics]:
    """One agg engine per ``(queued prompt tokens, running requests, KV tokens)``."""
    return {
        (f"a{i}", 0): fpm(
            worker=f"a{i}",
            wall=0.03,
            decode_reqs=n,
            decode_kv=kv,
            queued_prefill_reqs=q // 3000,
            queued_prefill_tokens=q,
        )
        for i, (q, n, kv) in enumerate(loads)
    }


# --- the decision table ----------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    name: str
    role: Role
    engines: Mapping[EngineKey, ForwardPassMetrics]
    ready: int
    expect: int
    reason: LoadReason
    desired: int | None = None
    dp: int = 1
    cfg: dict[str, Any] = field(default_factory=dict)
    limits: EngineLimits = LIMITS
    floor: int | None = None
    last_seen: dict[EngineKey, float] | None = None
    model: LoadModel | None = None
    message: str = ""


NOT_READY = PrefillModel()

ROWS = [
    Row(
        "disabled: load loop off holds at desired",
        "prefill",
        prefill_engines(30_000, 30_000),
        ready=2,
        expect=2,
        reason=R.DISABLED,
        cfg={"enable_load_scaling": False, "enable_throughput_scaling": True},
    ),
    Row(
        "pending: desired 3 != ready 2 holds at desired, even when overloaded",
        "prefill",
        prefill_engines(30_000, 30_000),
        ready=2,
        desired=3,
        expect=3,
        reason=R.SCALING_IN_PROGRESS,
    ),
    Row("no data: no engine reports", "prefill", {}, ready=2, expect=2, reason=R.NO_FPM_DATA),
    Row(
        "stale: an idle-looking engine silent past the timeout never reads as idle",
        "prefill",
        prefill_engines(0, 0),
        ready=2,
        expect=2,
        reason=R.STALE_FPM_DATA,
        last_seen={("p0", 0): 99.0, ("p1", 0): 80.0},
        message="silent for more than 10 s",
    ),
    Row(
        "fresh: last seen within the timeout decides normally",
        "prefill",
        prefill_engines(30_000, 30_000),
        ready=2,
        expect=4,
        reason=R.SCALE_UP,
        last_seen={("p0", 0): 99.0, ("p1", 0): 95.0},
    ),
    Row(
        "mismatch: 2 workers report but 3 are ready (a missing one never means idle)",
        "prefill",
        prefill_engines(0, 0),
        ready=3,
        expect=3,
        reason=R.WORKER_COUNT_MISMATCH,
    ),
    Row(
        "mismatch: a worker reports 1 of its 2 DP ranks",
        "prefill",
        {k: v for k, v in prefill_engines(0, 0, 0, 0, dp=2).items() if k != ("p1", 1)},
        ready=2,
        dp=2,
        expect=2,
        reason=R.WORKER_COUNT_MISMATCH,
        message="expected 2",
    ),
    Row(
        "dp: 2 workers x 2 ranks, all 1.7x over the SLA: up by what that asks for (2 -> 4)",
        "prefill",
        prefill_engines(30_000, 30_000, 30_000, 30_000, dp=2),
        ready=2,
        dp=2,
        expect=4,
        reason=R.SCALE_UP,
    ),
    Row(
        "invalid: a NaN wall time holds",
        "prefill",
        {**prefill_engines(0), ("p1", 0): fpm(worker="p1", wall=math.nan)},
        ready=2,
        expect=2,
        reason=R.INVALID_FPM_DATA,
    ),
    Row(
        "insufficient: model not ready",
        "prefill",
        prefill_engines(30_000, 30_000),
        ready=2,
        expect=2,
        reason=R.INSUFFICIENT_DATA,
        model=NOT_READY,
    ),
    Row(
        "prefill up: every engine over the TTFT SLA",
        "prefill",
        prefill_engines(20_000, 30_000),
        ready=2,
        expect=3,
        reason=R.SCALE_UP,
    ),
    Row(
        "prefill hold: one engine under the SLA blocks the scale-up",
        "prefill",
        prefill_engines(30_000, 0),
        ready=2,
        expect=2,
        reason=R.NO_CHANGE,
    ),
    Row(
        "prefill hold: between SLA x sensitivity and SLA",
        "prefill",
        prefill_engines(14_000, 14_000),
        ready=2,
        expect=2,
        reason=R.NO_CHANGE,
    ),
    Row(
        "prefill down: light, and the queues of 2 fit on 1",
        "prefill",
        prefill_engines(5000, 5000),
        ready=2,
        expect=1,
        reason=R.SCALE_DOWN,
    ),
    Row(
        "prefill down refused: 2 -> 1 would breach (Dynamo PR #9294, no 2<->1 oscillation)",
        "prefill",
        prefill_engines(8000, 8000),
        ready=2,
        expect=2,
        reason=R.SCALE_DOWN_REFUSED_CONSOLIDATION,
    ),
    Row(
        "prefill down from 3: c = 1.5 lets the same queues consolidate",
        "prefill",
        prefill_engines(8000, 8000, 8000),
        ready=3,
        expect=2,
        reason=R.SCALE_DOWN,
    ),
    Row(
        "min endpoint: no scale-down below prefill_min_endpoint",
        "prefill",
        prefill_engines(0, 0),
        ready=2,
        expect=2,
        reason=R.NO_CHANGE,
        cfg={"prefill_min_endpoint": 2},
        message="at the minimum of 2",
    ),
    Row(
        "min endpoint: never to zero even with min_endpoint 0",
        "prefill",
        prefill_engines(0),
        ready=1,
        expect=1,
        reason=R.NO_CHANGE,
        cfg={"min_endpoint": 0},
    ),
    Row(
        "scale to zero: a role at 0 replicas (min_endpoint 0) is not woken by load",
        "prefill",
        {},
        ready=0,
        expect=0,
        reason=R.NO_FPM_DATA,
        cfg={"min_endpoint": 0},
    ),
    Row(
        "sensitivity 0: never scales down",
        "prefill",
        prefill_engines(0, 0),
        ready=2,
        expect=2,
        reason=R.NO_CHANGE,
        cfg={"load_scaling_down_sensitivity": 0},
    ),
    Row(
        "decode up: every engine over the ITL SLA",
        "decode",
        decode_engines((150, 300_000), (160, 320_000)),
        ready=2,
        expect=4,
        reason=R.SCALE_UP,
    ),
    Row(
        "decode hold: one engine under the SLA",
        "decode",
        decode_engines((150, 300_000), (10, 20_000)),
        ready=2,
        expect=2,
        reason=R.NO_CHANGE,
    ),
    Row(
        "decode down: 4 -> 3 keeps ITL under SLA x sensitivity",
        "decode",
        decode_engines(*[(40, 80_000)] * 4),
        ready=4,
        expect=3,
        reason=R.SCALE_DOWN,
    ),
    Row(
        "decode down refused: 2 -> 1 would push ITL over SLA x sensitivity",
        "decode",
        decode_engines((40, 80_000), (40, 80_000)),
        ready=2,
        expect=2,
        reason=R.SCALE_DOWN_REFUSED_CONSOLIDATION,
        message="ITL after consolidation",
    ),
    Row(
        "decode down refused: consolidated KV exceeds the cache",
        "decode",
        decode_engines(*[(40, 80_000)] * 4),
        ready=4,
        expect=4,
        reason=R.SCALE_DOWN_REFUSED_CONSOLIDATION,
        limits=EngineLimits(max_kv_tokens=100_000),
        message="capacity 100000",
    ),
    Row(
        "decode down refused: consolidated batch exceeds max_num_seqs",
        "decode",
        decode_engines(*[(40, 80_000)] * 4),
        ready=4,
        expect=4,
        reason=R.SCALE_DOWN_REFUSED_CONSOLIDATION,
        limits=EngineLimits(max_num_seqs=50),
        message="max_num_seqs 50",
    ),
    Row(
        "decode down: KV check skipped when capacity unknown",
        "decode",
        decode_engines(*[(40, 80_000)] * 4),
        ready=4,
        expect=3,
        reason=R.SCALE_DOWN,
        limits=EngineLimits(max_kv_tokens=None),
    ),
    Row(
        "agg up: TTFT alone says so",
        "agg",
        agg_engines((30_000, 10, 15_000))
        | {
            ("a1", 0): fpm(
                worker="a1",
                wall=0.03,
                decode_reqs=10,
                decode_kv=15_000,
                queued_prefill_tokens=40_000,
            )
        },
        ready=2,
        expect=4,
        reason=R.SCALE_UP,
        cfg={"agg": True},
        message="TTFT",
    ),
    Row(
        "agg up: ITL alone says so",
        "agg",
        agg_engines((0, 200, 300_000), (0, 220, 330_000)),
        ready=2,
        expect=3,
        reason=R.SCALE_UP,
        cfg={"agg": True},
        message="ITL",
    ),
    Row(
        "agg down: both TTFT and ITL light and consolidation fits",
        "agg",
        agg_engines((0, 10, 15_000), (0, 10, 15_000)),
        ready=2,
        expect=1,
        reason=R.SCALE_DOWN,
        cfg={"agg": True},
    ),
    Row(
        "agg hold: ITL light but TTFT between SLA x sensitivity and SLA",
        "agg",
        agg_engines((14_000, 10, 15_000), (14_000, 10, 15_000)),
        ready=2,
        expect=2,
        reason=R.NO_CHANGE,
        cfg={"agg": True},
    ),
    Row(
        "agg idle heartbeats: empty queues, scale down",
        "agg",
        {("a0", 0): heartbeat(worker="a0"), ("a1", 0): heartbeat(worker="a1")},
        ready=2,
        expect=1,
        reason=R.SCALE_DOWN,
        cfg={"agg": True},
    ),
    Row(
        "floor: throughput result caps a scale-down",
        "prefill",
        prefill_engines(5000, 5000),
        ready=2,
        expect=2,
        reason=R.SCALE_DOWN_CAPPED_BY_THROUGHPUT,
        floor=2,
    ),
    Row(
        "floor: below the load result, the scale-down stands",
        "prefill",
        prefill_engines(5000, 5000),
        ready=2,
        expect=1,
        reason=R.SCALE_DOWN,
        floor=1,
    ),
    Row(
        "floor: lifts a hold to the throughput result",
        "prefill",
        prefill_engines(14_000, 14_000),
        ready=2,
        expect=4,
        reason=R.RECONCILE_CLAMPED_TO_FLOOR,
        floor=4,
        message="no_change lifted",
    ),
    Row(
        "floor: not applied while a change is pending",
        "prefill",
        prefill_engines(0, 0),
        ready=2,
        desired=3,
        expect=3,
        reason=R.SCALING_IN_PROGRESS,
        floor=5,
    ),
]


def decide(row: Row) -> LoadDecision:
    return decide_load(
        role=row.role,
        now_s=100.0,
        engines=row.engines,
        model=row.model or model_for(row.role),
        ready_replicas=row.ready,
        desired_replicas=row.ready if row.desired is None else row.desired,
        dp_size=row.dp,
        config=config(**row.cfg),
        engine_limits=row.limits,
        throughput_floor=row.floor,
        last_seen_s=row.last_seen,
    )


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_decision_table(row: Row) -> None:
    decision = decide(row)
    assert (decision.replicas, decision.reason) == (row.expect, row.reason), decision.message
    assert row.message in decision.message
    assert decision.role == row.role


def test_estimates_are_reported_per_engine() -> None:
    decision = decide(
        ROWS[[r.name for r in ROWS].index("prefill up: every engine over the TTFT SLA")]
    )
    assert set(decision.estimates) == {("p0", 0), ("p1", 0)}
    # engine p0: 23000 tokens -> two full 8192 chunks and 6616 tokens
    expected = 1000 * (2 * prefill_law(8192) + prefill_law(23_000 - 2 * 8192))
    assert decision.estimates[("p0", 0)].ttft_ms == pytest.approx(expected, rel=1e-6)
    assert decision.estimates[("p0", 0)].itl_ms is None
    assert decision.max_ttft_ms == max(e.ttft_ms or 0 for e in decision.estimates.values())


def test_wrong_model_for_role_is_a_programming_error() -> None:
    with pytest.raises(TypeError, match="role 'decode' needs a DecodeModel, got PrefillModel"):
        decide_load(
            role="decode",
            now_s=0.0,
            engines={},
            model=PrefillModel(),
            ready_replicas=1,
            desired_replicas=1,
            dp_size=1,
            config=config(),
            engine_limits=LIMITS,
            throughput_floor=None,
        )


def test_make_load_model_and_limits_follow_config() -> None:
    cfg = config(
        max_num_fpm_samples=32,
        load_min_observations=7,
        fpm_warmup_iterations=3,
        max_num_batched_tokens=4096,
    )
    model = make_load_model("agg", cfg)
    assert isinstance(model, AggModel)
    assert (model.min_observations, model.warmup_iterations) == (7, 3)
    published = EngineLimits(max_num_batched_tokens=16384, max_num_seqs=256, max_kv_tokens=9000)
    assert resolve_engine_limits(cfg, published) == EngineLimits(4096, 256, 9000)
    assert resolve_engine_limits(config()) == EngineLimits(8192, 512, None)


# --- properties ------------------------------------------------------------------------------

ROLES: tuple[Role, ...] = ("prefill", "decode", "agg")


@st.composite
def snapshots(draw: st.DrawFn) -> dict[str, Any]:
    """Mostly well-formed ticks over light to heavy load, some with missing or bad data."""
    role = draw(st.sampled_from(ROLES))
    ready = draw(st.integers(0, 6))
    dp = draw(st.sampled_from([1, 2]))
    consistent = draw(st.integers(0, 9)) < 7
    workers = ready if consistent else draw(st.integers(0, 7))
    level = draw(st.sampled_from([0.0, 0.02, 0.1, 0.4, 1.0, 3.0]))  # share of the heavy load
    nan_engine = draw(st.integers(0, 9)) == 0
    engines: dict[EngineKey, ForwardPassMetrics] = {}
    for w in range(workers):
        ranks = dp if consistent else draw(st.integers(1, 2))
        for r in range(ranks):
            engines[(f"w{w}", r)] = fpm(
                worker=f"w{w}",
                dp_rank=r,
                wall=draw(st.floats(0.0, 2.0)),
                decode_reqs=draw(st.integers(0, int(300 * level))),
                decode_kv=draw(st.integers(0, int(600_000 * level))),
                queued_prefill_tokens=draw(st.integers(0, int(60_000 * level))),
                queued_decode_reqs=draw(st.integers(0, int(20 * level))),
            )
    if nan_engine and engines:
        key = draw(st.sampled_from(sorted(engines)))
        engines[key] = fpm(worker=key[0], dp_rank=key[1], wall=math.nan)
    last_seen = {k: 100.0 for k in engines}
    if engines and draw(st.integers(0, 9)) == 0:
        last_seen[draw(st.sampled_from(sorted(engines)))] = 0.0
    return {
        "role": role,
        "ready": ready,
        "desired": draw(st.sampled_from([ready] * 6 + [ready + 1, max(0, ready - 1)])),
        "dp": dp,
        "engines": engines,
        "last_seen": last_seen,
        "sensitivity": draw(st.integers(0, 100)),
        "min_endpoint": draw(st.integers(0, 3)),
    }


def _decide_snapshot(snap: dict[str, Any]) -> LoadDecision:
    role = snap["role"]
    return decide_load(
        role=role,
        now_s=100.0,
        engines=snap["engines"],
        model=model_for(role),
        ready_replicas=snap["ready"],
        desired_replicas=snap["desired"],
        dp_size=snap["dp"],
        config=config(
            agg=role == "agg",
            load_scaling_down_sensitivity=snap["sensitivity"],
            min_endpoint=snap["min_endpoint"],
        ),
        engine_limits=LIMITS,
        throughput_floor=None,
        last_seen_s=snap["last_seen"],
    )


def _missing_data(snap: dict[str, Any]) -> bool:
    engines = snap["engines"]
    workers = {w for w, _ in engines}
    return (
        len(engines) != snap["ready"] * snap["dp"]
        or len(workers) != snap["ready"]
        or any(math.isnan(f.wall_time) for f in engines.values())
        or any(t < 100.0 for t in snap["last_seen"].values())
    )


PROPERTY_SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@PROPERTY_SETTINGS
@given(snapshots())
def test_property_down_one_step_per_tick_up_by_the_breach(snap: dict[str, Any]) -> None:
    decision = _decide_snapshot(snap)
    if snap["desired"] != snap["ready"]:
        assert decision.replicas == snap["desired"]
        assert decision.reason is R.SCALING_IN_PROGRESS
    elif snap["ready"] >= snap["min_endpoint"]:
        # down by one at most; up by more than one only for latency over the SLA, by what
        # it asks for (the rule's sentence says so)
        assert decision.replicas >= snap["ready"] - 1
        if decision.replicas > snap["ready"] + 1:
            assert decision.reason is R.SCALE_UP
            assert "up by what the latency over the SLA asks for" in decision.message


@PROPERTY_SETTINGS
@given(snapshots())
def test_property_never_below_min_endpoint(snap: dict[str, Any]) -> None:
    decision = _decide_snapshot(snap)
    if snap["desired"] == snap["ready"]:
        assert decision.replicas >= snap["min_endpoint"]


@PROPERTY_SETTINGS
@given(snapshots())
def test_property_never_scales_down_on_missing_data(snap: dict[str, Any]) -> None:
    decision = _decide_snapshot(snap)
    if snap["desired"] == snap["ready"] and _missing_data(snap):
        assert decision.replicas >= snap["ready"]
        assert decision.reason is not R.SCALE_DOWN


@PROPERTY_SETTINGS
@given(snapshots())
def test_property_reason_matches_the_step(snap: dict[str, Any]) -> None:
    decision = _decide_snapshot(snap)
    if decision.reason is R.SCALE_DOWN:
        assert decision.replicas == snap["ready"] - 1
    if decision.reason is R.SCALE_UP:  # up by what is needed, at least one
        assert decision.replicas >= snap["ready"] + 1
    if decision.replicas < snap["ready"] and snap["desired"] == snap["ready"]:
        assert decision.reason is R.SCALE_DOWN


@pytest.mark.parametrize(
    ("busy", "expect", "reason"),
    [
        (0.10, 1, R.SCALE_DOWN),  # 20 % on one engine: the TTFT tail holds
        (0.45, 2, R.SCALE_DOWN_REFUSED_CONSOLIDATION),  # 90 % on one engine would queue
    ],
)
def test_prefill_scale_down_respects_busy_time(busy: float, expect: int, reason: R) -> None:
    # Empty queues say nothing of how busy the engines are: the same snapshot that lets the
    # queue-only rule scale down is refused when the engines' busy time would not fit.
    engines = prefill_engines(5000, 5000)
    decision = decide_load(
        role="prefill",
        now_s=100.0,
        engines=engines,
        model=model_for("prefill"),
        ready_replicas=2,
        desired_replicas=2,
        dp_size=1,
        config=config(),
        engine_limits=EngineLimits(),
        throughput_floor=None,
        busy_fraction=dict.fromkeys(engines, busy),
    )
    assert (decision.replicas, decision.reason) == (expect, reason), decision.message
    if reason is R.SCALE_DOWN_REFUSED_CONSOLIDATION:
        assert "would be 90%" in decision.message
