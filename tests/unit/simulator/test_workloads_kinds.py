"""The scorecard's synthetic kinds: on/off bursts (a Markov-modulated Poisson process),
heavy-tailed prompts, and the existing step / sinusoid / diurnal shapes it uses; their
statistics, seeds, and the errors of bad parameters."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from disagg_planner.simulator.errors import WorkloadError
from disagg_planner.simulator.workloads import Spell, onoff_spells, parse_workload

ONOFF = "onoff:rate=2,duration=4h,isl=1000,osl=100"


def spells_of(seed: int = 0, **kw: object) -> list[Spell]:
    args: dict = dict(
        quiet_rate=2.0, duration_s=4 * 3600, busy_s=(60, 300), factor=(5, 10), quiet_mean_s=600
    )
    args.update(kw)
    return onoff_spells(seed=seed, **args)


def test_onoff_spells_alternate_with_the_stated_lengths_and_rates() -> None:
    spells = spells_of(seed=3)
    assert spells[0].start_s == 0 and not spells[0].busy and spells[-1].end_s == 4 * 3600
    assert all(a.end_s == b.start_s and a.busy != b.busy for a, b in itertools.pairwise(spells))
    busy = [s for s in spells if s.busy][:-1]  # the last may be cut by the end
    quiet = [s for s in spells if not s.busy][:-1]
    assert len(busy) >= 10
    assert all(60 <= s.end_s - s.start_s <= 300 for s in busy)
    assert all(5 * 2 <= s.rate <= 10 * 2 for s in busy)
    assert all(s.rate == 2 for s in quiet)
    # Quiet spells are exponential: mean near 600 s, CV near 1.
    lengths = [s.end_s - s.start_s for s in spells_of(seed=4, duration_s=200 * 3600) if not s.busy]
    assert statistics.fmean(lengths) == pytest.approx(600, rel=0.15)
    assert statistics.pstdev(lengths) / statistics.fmean(lengths) == pytest.approx(1, abs=0.15)


def test_onoff_arrivals_follow_the_spells() -> None:
    arrivals = [r.arrival_s for r in parse_workload(ONOFF, seed=3)]
    spells = spells_of(seed=3)
    for kind in (True, False):
        chosen = [s for s in spells if s.busy is kind]
        seconds = sum(s.end_s - s.start_s for s in chosen)
        count = sum(1 for t in arrivals for s in chosen if s.start_s <= t < s.end_s)
        expected = sum(s.rate * (s.end_s - s.start_s) for s in chosen) / seconds
        assert count / seconds == pytest.approx(expected, rel=0.05)
    busy_rate = sum(s.rate * (s.end_s - s.start_s) for s in spells if s.busy)
    busy_rate /= sum(s.end_s - s.start_s for s in spells if s.busy)
    assert 5 * 2 <= busy_rate <= 10 * 2


def test_onoff_options_and_seeds() -> None:
    narrow = onoff_spells(
        quiet_rate=1, duration_s=3600, busy_s=(120, 120), factor=(8, 8), quiet_mean_s=60, seed=1
    )
    assert {s.rate for s in narrow if s.busy} == {8}
    assert {round(s.end_s - s.start_s, 6) for s in narrow[:-1] if s.busy} == {120}
    spec = "onoff:rate=1,duration=1h,isl=10,osl=5,busy=2m,factor=8,quiet=1m"
    got = list(parse_workload(spec, seed=1))
    in_busy = sum(1 for r in got for s in narrow if s.busy and s.start_s <= r.arrival_s < s.end_s)
    busy_s = sum(s.end_s - s.start_s for s in narrow if s.busy)
    assert in_busy / busy_s == pytest.approx(8, rel=0.1)
    assert got == list(parse_workload(spec, seed=1))
    assert got != list(parse_workload(spec, seed=2))


@pytest.mark.slow
def test_heavytail_prompts_reach_the_context_at_p99() -> None:
    spec = "heavytail:rate=40,duration=1000,context=32768,median=2048,osl=200"
    got = list(parse_workload(spec, seed=5))
    assert len(got) == pytest.approx(40_000, rel=0.03)
    isl = sorted(r.input_length for r in got)
    assert statistics.median(isl) == pytest.approx(2048, rel=0.05)
    assert isl[int(0.99 * len(isl))] == pytest.approx(32768, rel=0.12)
    over = sum(1 for x in isl if x > 32768) / len(isl)
    assert over == pytest.approx(0.01, abs=0.003)  # about 1% longer than the context
    assert {r.output_length for r in got} == {200}
    assert got == list(parse_workload(spec, seed=5))
    # Defaults: median context/32, p99 at the context; an explicit p99 moves the tail.
    default = sorted(
        r.input_length
        for r in parse_workload("heavytail:rate=40,duration=500,context=8192,osl=10", seed=1)
    )
    assert statistics.median(default) == pytest.approx(256, rel=0.08)
    lower = sorted(
        r.input_length
        for r in parse_workload(
            "heavytail:rate=40,duration=500,context=8192,p99=4096,osl=10", seed=1
        )
    )
    assert lower[int(0.99 * len(lower))] == pytest.approx(4096, rel=0.15)


def sinusoid(lo: float, hi: float, period: float):
    return lambda t: lo + (hi - lo) * (1 - math.cos(2 * math.pi * t / period)) / 2


@pytest.mark.slow
@pytest.mark.parametrize(
    ("spec", "rate", "duration"),
    [
        # step up and down, the 600 s and 1800 s sinusoids, one slow diurnal ramp up and down
        (
            "step:rates=8/40/8,at=600/1200,duration=1800,isl=1,osl=1",
            lambda t: 40 if 600 <= t < 1200 else 8,
            1800,
        ),
        ("sinusoid:min=5,max=45,period=600,duration=1800,isl=1,osl=1", sinusoid(5, 45, 600), 1800),
        ("sinusoid:min=5,max=45,period=1800,duration=1h,isl=1,osl=1", sinusoid(5, 45, 1800), 3600),
        (
            "diurnal:min=2,max=30,period=1h,peak=30m,duration=1h,isl=1,osl=1",
            lambda t: 2 + 28 * ((1 + math.cos(2 * math.pi * (t - 1800) / 3600)) / 2) ** 2,
            3600,
        ),
    ],
)
def test_scorecard_shapes(spec: str, rate, duration: float) -> None:
    arrivals = [r.arrival_s for r in parse_workload(spec, seed=0)]
    assert arrivals and arrivals[-1] < duration
    for start in range(0, int(duration), 60):
        count = sum(1 for t in arrivals if start <= t < start + 60)
        expected = statistics.fmean(rate(start + k + 0.5) for k in range(60)) * 60
        # Poisson: within five standard deviations of the minute's expected count.
        assert abs(count - expected) < 5 * math.sqrt(expected) + 1, start


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nonsense:foo=1", "unknown kind 'nonsense'; known: poisson, step"),
        ("poisson:rate=1,isl=1,osl=1,duration=0", "duration=0: expected a duration > 0"),
        ("poisson:rate=1,isl=1,osl=1,duration=-5", "duration='-5': expected a finite duration"),
        (ONOFF + ",busy=5m-1m", "busy='5m-1m': expected 0 < LOW <= HIGH"),
        (ONOFF + ",busy=1m-2m-3m", "busy='1m-2m-3m': expected LOW-HIGH"),
        (ONOFF + ",factor=0-3", "factor='0-3': expected 0 < LOW <= HIGH"),
        (ONOFF + ",factor=lots", "factor='lots': expected LOW-HIGH numbers"),
        (ONOFF + ",quiet=0", "quiet='0': expected a mean quiet spell > 0"),
        (ONOFF + ",burst=3", "unknown keys ['burst']"),
        ("onoff:duration=1h,isl=1,osl=1", "missing rate="),
        ("heavytail:rate=1,duration=1h,osl=1", "missing context="),
        ("heavytail:rate=1,duration=1h,osl=1,context=big", "context='big': expected the model"),
        ("heavytail:rate=1,duration=1h,osl=1,context=4096,median=8000", "median=8000 must be"),
        ("heavytail:rate=1,duration=1h,osl=1,context=4096,isl=5", "give no isl="),
        ("diurnal:min=1,max=2,duration=1h,isl=1,osl=1,sharpness=x", "sharpness='x': expected"),
        ("trace:path=x.csv,speedup=fast", "speedup='fast': expected a number > 0"),
    ],
)
def test_bad_parameters_are_named(spec: str, message: str) -> None:
    with pytest.raises(WorkloadError) as info:
        list(parse_workload(spec, seed=0))
    assert message in str(info.value)


def test_lognormal_sigma_from_p99() -> None:
    # The heavy tail is the lognormal whose 99th percentile is p99: sigma = ln(p99/median)/z99.
    z99 = statistics.NormalDist().inv_cdf(0.99)
    got = sorted(
        r.input_length
        for r in parse_workload(
            "heavytail:rate=100,duration=300,context=1000,median=100,osl=1", seed=2
        )
    )
    sigma = statistics.pstdev(math.log(x) for x in got)
    assert sigma == pytest.approx(math.log(10) / z99, rel=0.05)
