"""Workload generators and transformations: rates and shapes, determinism, errors."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from disagg_planner.predictors.traces import TraceRequest
from disagg_planner.simulator.errors import WorkloadError
from disagg_planner.simulator.workloads import (
    parse_duration,
    parse_length,
    parse_workload,
    scale_load,
    speedup,
)


def arrivals(spec: str, seed: int = 0) -> list[float]:
    return [r.arrival_s for r in parse_workload(spec, seed=seed)]


def rate_between(ts: list[float], lo: float, hi: float) -> float:
    return sum(1 for t in ts if lo <= t < hi) / (hi - lo)


def test_poisson_rate_lengths_and_determinism():
    reqs = list(parse_workload("poisson:rate=20,isl=3000,osl=300,duration=600", seed=7))
    assert len(reqs) == pytest.approx(12000, rel=0.05)
    assert all(r.input_length == 3000 and r.output_length == 300 for r in reqs)
    ts = [r.arrival_s for r in reqs]
    assert ts == sorted(ts) and ts[0] >= 0 and ts[-1] < 600
    gaps = [b - a for a, b in itertools.pairwise(ts)]
    cv = statistics.pstdev(gaps) / statistics.fmean(gaps)
    assert cv == pytest.approx(1.0, abs=0.05)  # exponential inter-arrivals
    assert reqs == list(parse_workload("poisson:rate=20,isl=3000,osl=300,duration=600", seed=7))
    assert reqs != list(parse_workload("poisson:rate=20,isl=3000,osl=300,duration=600", seed=8))


def test_step_switches_rate():
    ts = arrivals("step:rates=5/40/10,at=100/200,duration=300,isl=100,osl=10")
    assert rate_between(ts, 0, 100) == pytest.approx(5, rel=0.2)
    assert rate_between(ts, 100, 200) == pytest.approx(40, rel=0.1)
    assert rate_between(ts, 200, 300) == pytest.approx(10, rel=0.2)


def test_sinusoid_follows_dynamo_test_shape():
    ts = arrivals("sinusoid:min=5,max=45,period=600,duration=1200,isl=3000,osl=300", seed=1)
    assert rate_between(ts, 0, 30) == pytest.approx(5.6, rel=0.3)  # starts near the minimum
    assert rate_between(ts, 285, 315) == pytest.approx(45, rel=0.1)  # peak at half a period
    assert len(ts) / 1200 == pytest.approx(25, rel=0.05)  # mean of min and max


def test_diurnal_peaks_at_peak_time():
    # A compressed "day" of two hours peaking after one hour.
    ts = arrivals("diurnal:min=1,max=20,duration=2h,period=2h,isl=500,osl=100,peak=1h", seed=2)
    assert rate_between(ts, 3600 - 120, 3600 + 120) == pytest.approx(20, rel=0.1)
    assert rate_between(ts, 0, 300) == pytest.approx(1, abs=0.4)
    assert rate_between(ts, 6900, 7200) == pytest.approx(1, abs=0.4)


def test_length_distributions():
    for spec, mean in [
        ("const:700", 700),
        ("uniform:100:300", 200),
        ("normal:1000:100", 1000),
        ("exponential:400", 400),
        ("lognormal:1000:0.5", 1000 * math.exp(0.125)),
    ]:
        reqs = list(parse_workload(f"poisson:rate=50,isl={spec},osl=10,duration=100", seed=3))
        assert statistics.fmean(r.input_length for r in reqs) == pytest.approx(mean, rel=0.05)
        assert parse_length(spec, field="isl").mean == pytest.approx(mean)
        assert min(r.input_length for r in reqs) >= 1


def test_durations():
    assert parse_duration("90") == 90
    assert parse_duration("10m") == 600
    assert parse_duration("1.5h") == 5400
    assert parse_duration("1d") == 86400


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("poisson", "expected KIND:key=value"),
        ("gamma:rate=1,isl=1,osl=1,duration=1", "unknown kind 'gamma'"),
        ("poisson:rate=1,isl=1,duration=1", "missing osl="),
        ("poisson:rate=fast,isl=1,osl=1,duration=1", "rate='fast'"),
        ("poisson:rate=1,isl=1,osl=1,duration=1,burst=3", "unknown keys ['burst']"),
        ("poisson:rate=1,isl=zipf:2,osl=1,duration=1", "unknown distribution 'zipf'"),
        ("poisson:rate=1,isl=uniform:5,osl=1,duration=1", "uniform takes 2 parameter"),
        ("step:rates=1/2,at=5/6,duration=9,isl=1,osl=1", "2 rates need 1 increasing at="),
        ("sinusoid:min=9,max=1,period=60,duration=60,isl=1,osl=1", "max=1.0 is below min=9.0"),
        ("poisson:rate=1,isl=1,osl=1,duration=soon", "duration='soon'"),
    ],
)
def test_bad_specs_name_the_problem(spec, message):
    with pytest.raises(WorkloadError) as info:
        list(parse_workload(spec, seed=0))
    assert message in str(info.value)


def test_speedup_compresses_time():
    reqs = [TraceRequest(10.0, 5, 6, (1, 2)), TraceRequest(30.0, 7, 8)]
    assert list(speedup(reqs, 10)) == [TraceRequest(1.0, 5, 6, (1, 2)), TraceRequest(3.0, 7, 8)]
    with pytest.raises(WorkloadError, match="speedup x=0"):
        list(speedup(reqs, 0))


def test_scale_load_keeps_shape_and_order():
    base = list(parse_workload("step:rates=2/8,at=300,duration=600,isl=500,osl=50", seed=4))
    scaled = list(scale_load(base, 3, seed=5, jitter_s=2.0))
    assert len(scaled) == 3 * len(base)
    ts = [r.arrival_s for r in scaled]
    assert ts == sorted(ts)
    ratio_low = rate_between(ts, 0, 300) / rate_between([r.arrival_s for r in base], 0, 300)
    ratio_high = rate_between(ts, 300, 600) / rate_between([r.arrival_s for r in base], 300, 600)
    assert ratio_low == pytest.approx(3, rel=0.03) and ratio_high == pytest.approx(3, rel=0.03)
    half = list(scale_load(base, 0.5, seed=5))
    assert len(half) == pytest.approx(len(base) / 2, rel=0.1)
    frac = list(scale_load(base, 1.5, seed=5))
    assert len(frac) == pytest.approx(1.5 * len(base), rel=0.05)


def test_scale_load_remaps_prefix_hashes_per_copy():
    reqs = [TraceRequest(0.0, 1024, 10, (0, 1)), TraceRequest(1.0, 1024, 10, (0, 2))]
    out = list(scale_load(reqs, 2, seed=0, jitter_s=0.5))
    hashes: list[tuple[int, ...]] = []
    for r in out:
        assert r.hash_ids is not None
        hashes.append(r.hash_ids)
    hashes.sort()
    # Copies keep sharing the common first block among themselves, never across copies.
    assert hashes == [(0, 2), (0, 4), (1, 3), (1, 5)]


def test_trace_workload_reads_through_the_predictors_reader(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
        "2023-11-16 18:15:52.6805900,1200,7\n",
        encoding="utf-8",
    )
    reqs = list(parse_workload(f"trace:path={path},speedup=2", seed=0))
    assert [(r.input_length, r.output_length) for r in reqs] == [(374, 44), (396, 109), (1200, 7)]
    assert [r.arrival_s for r in reqs] == pytest.approx([0.0, 2.1572895, 3.0])
    assert len(list(parse_workload(f"trace:path={path},scale=2", seed=0))) == 6
