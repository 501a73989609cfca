"""Workloads: synthetic request streams, real traces, and transformations of either.

Spec grammar (``parse_workload``), ``KIND:key=value,key=value``::

    poisson:rate=R,isl=I,osl=O,duration=D
    step:rates=A/B[/C...],at=T[/T2...],duration=D,isl=I,osl=O
    sinusoid:min=A,max=B,period=P,duration=D,isl=I,osl=O[,phase=S]
    diurnal:min=A,max=B,duration=D,isl=I,osl=O[,period=24h][,peak=14h][,sharpness=2]
    onoff:rate=R,duration=D,isl=I,osl=O[,busy=1m-5m][,factor=5-10][,quiet=10m]
    heavytail:rate=R,duration=D,context=C,osl=O[,median=C/32][,p99=C]
    trace:path=FILE[,format=NAME][,speedup=X][,scale=K]

Rates are requests per second; durations accept ``s``, ``m``, ``h`` and ``d`` suffixes.
Arrivals are a (non-homogeneous) Poisson process: ``step`` switches rate at each ``at``
(up and down: ``rates=8/40/8``); ``sinusoid`` is
``min + (max-min) * (1 - cos(2 pi (t + phase) / period)) / 2`` (starting at the minimum,
Dynamo's planner test uses 5 to 45 req/s over 600 s with ISL/OSL 3000/300);
``diurnal`` is ``min + (max-min) * ((1 + cos(2 pi (t - peak) / period)) / 2) ** sharpness``
(a daily peak with a long night trough; ``period=duration`` makes one slow ramp up and down).
``onoff`` is a two-state Markov-modulated Poisson process: quiet spells at ``rate`` lasting
Exp(mean ``quiet``), busy spells lasting U(``busy``) at ``rate`` x U(``factor``), drawn afresh
for each spell. ``heavytail`` is Poisson at ``rate`` with lognormal prompt lengths of median
``median`` and 99th percentile ``p99`` (default: the model's ``context``, so about 1% of
prompts are longer than the engine accepts). Token lengths are a constant or a named
distribution: ``const:V``, ``uniform:A:B``, ``normal:MEAN:STD``, ``lognormal:MEDIAN:SIGMA``,
``exponential:MEAN`` (rounded, at least 1). Every generator is deterministic given ``seed``.
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace

from disagg_planner.predictors.traces import TraceRequest, read_trace
from disagg_planner.predictors.traces.durations import parse_seconds
from disagg_planner.simulator.errors import WorkloadError
from disagg_planner.simulator.request import RequestLike


def parse_duration(text: str, *, field: str = "duration") -> float:
    """``"600"``, ``"600s"``, ``"10m"``, ``"1.5h"``, ``"1d"`` -> seconds (>= 0)."""
    try:
        return parse_seconds(text)
    except ValueError as exc:
        raise WorkloadError(f"{field}={text!r}: {exc}") from None


@dataclass(frozen=True)
class LengthDist:
    """A token-length distribution (see the module doc); ``sample`` returns ints >= 1."""

    kind: str
    a: float
    b: float = 0.0

    def sample(self, rng: random.Random) -> int:
        if self.kind == "const":
            x = self.a
        elif self.kind == "uniform":
            x = rng.uniform(self.a, self.b)
        elif self.kind == "normal":
            x = rng.gauss(self.a, self.b)
        elif self.kind == "lognormal":
            x = self.a * math.exp(rng.gauss(0.0, self.b))
        else:  # exponential
            x = rng.expovariate(1.0 / self.a)
        return max(1, round(x))

    @property
    def mean(self) -> float:
        if self.kind == "const":
            return self.a
        if self.kind == "uniform":
            return (self.a + self.b) / 2
        if self.kind == "lognormal":
            return self.a * math.exp(self.b**2 / 2)
        return self.a


def parse_length(text: str, *, field: str) -> LengthDist:
    parts = text.strip().lower().split(":")
    try:
        if len(parts) == 1:
            return LengthDist("const", float(parts[0]))
        kind, *args = parts
        values = [float(a) for a in args]
    except ValueError:
        raise WorkloadError(f"{field}={text!r}: numbers expected") from None
    arity = {"const": 1, "uniform": 2, "normal": 2, "lognormal": 2, "exponential": 1}
    if kind not in arity:
        raise WorkloadError(
            f"{field}={text!r}: unknown distribution {kind!r}; known: {', '.join(arity)}"
        )
    if len(values) != arity[kind]:
        raise WorkloadError(f"{field}={text!r}: {kind} takes {arity[kind]} parameter(s)")
    if values[0] <= 0 or (kind == "uniform" and values[1] < values[0]) or min(values) < 0:
        raise WorkloadError(f"{field}={text!r}: parameters must be positive (and A <= B)")
    return LengthDist(kind, values[0], values[1] if len(values) > 1 else 0.0)


def _poisson_arrivals(
    rate: Callable[[float], float], rate_max: float, duration: float, rng: random.Random
) -> Iterator[float]:
    """Lewis-Shedler thinning: candidates at ``rate_max``, kept with ``rate(t)/rate_max``."""
    if rate_max <= 0:
        return
    t = 0.0
    while True:
        t += rng.expovariate(rate_max)
        if t >= duration:
            return
        if rng.random() * rate_max <= rate(t):
            yield t


def synthetic(
    rate: Callable[[float], float],
    *,
    rate_max: float,
    duration_s: float,
    isl: LengthDist,
    osl: LengthDist,
    seed: int,
) -> Iterator[TraceRequest]:
    """Requests with Poisson arrivals of intensity ``rate(t)`` (<= ``rate_max``)."""
    rng = random.Random(seed)
    lengths = random.Random(seed + 1_000_003)
    for t in _poisson_arrivals(rate, rate_max, duration_s, rng):
        yield TraceRequest(
            arrival_s=t, input_length=isl.sample(lengths), output_length=osl.sample(lengths)
        )


def _fields(body: str, spec: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in body.split(","))):
        if "=" not in part:
            raise WorkloadError(f"workload {spec!r}: {part!r} is not key=value")
        key, value = (s.strip() for s in part.split("=", 1))
        out[key.lower()] = value
    return out


def _need(fields: dict[str, str], key: str, spec: str) -> str:
    if key not in fields:
        raise WorkloadError(f"workload {spec!r}: missing {key}=")
    return fields.pop(key)


def _rate(text: str, field: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise WorkloadError(f"{field}={text!r}: expected requests per second") from None
    if not math.isfinite(value) or value < 0:
        raise WorkloadError(f"{field}={text!r}: must be finite and >= 0")
    return value


def _positive(text: str, field: str, what: str = "a number") -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise WorkloadError(f"{field}={text!r}: expected {what} > 0")
    return value


def _range(text: str, field: str, *, seconds: bool) -> tuple[float, float]:
    """``A-B`` (or one value ``A`` for A-A) with 0 < A <= B: durations when ``seconds``."""
    parts = text.split("-")
    if len(parts) > 2:
        raise WorkloadError(f"{field}={text!r}: expected LOW-HIGH, e.g. {field}=1m-5m")
    try:
        values = [parse_seconds(p) if seconds else float(p) for p in parts]
    except ValueError:
        values = [math.nan]
    if not all(math.isfinite(v) for v in values):
        what = "durations, e.g. 1m-5m" if seconds else "numbers, e.g. 5-10"
        raise WorkloadError(f"{field}={text!r}: expected LOW-HIGH {what}")
    lo, hi = values[0], values[-1]
    if lo <= 0 or hi < lo:
        raise WorkloadError(f"{field}={text!r}: expected 0 < LOW <= HIGH")
    return lo, hi


KINDS = ("poisson", "step", "sinusoid", "diurnal", "onoff", "heavytail", "trace")
# The 99th percentile of the standard normal: a lognormal's p99 is
# median * exp(Z99 * sigma).
Z99 = 2.3263478740408408


def parse_workload(spec: str, *, seed: int = 0) -> Iterator[RequestLike]:
    """The request stream a workload spec describes (see the module doc)."""
    if ":" not in spec:
        raise WorkloadError(
            f"workload {spec!r}: expected KIND:key=value,... with KIND one of {', '.join(KINDS)}"
        )
    kind, body = spec.split(":", 1)
    kind = kind.strip().lower()
    if kind not in KINDS:
        # The kind first: a spec of an unknown kind is not missing a duration.
        raise WorkloadError(f"workload {spec!r}: unknown kind {kind!r}; known: {', '.join(KINDS)}")
    fields = _fields(body, spec)
    if kind == "trace":
        path = _need(fields, "path", spec)
        fmt = fields.pop("format", None)
        x = _positive(fields.pop("speedup", "1"), "speedup")
        k = _positive(fields.pop("scale", "1"), "scale")
        _reject_unknown(fields, spec)
        stream: Iterable[RequestLike] = read_trace(path, trace_format=fmt)
        if x != 1:
            stream = speedup(stream, x)
        if k != 1:
            stream = scale_load(stream, k, seed=seed)
        return iter(stream)
    duration = parse_duration(_need(fields, "duration", spec))
    if duration <= 0:
        raise WorkloadError(f"workload {spec!r}: duration={duration:g}: expected a duration > 0")
    if kind == "heavytail":
        isl = _heavy_tailed_isl(fields, spec)
    else:
        isl = parse_length(_need(fields, "isl", spec), field="isl")
    osl = parse_length(_need(fields, "osl", spec), field="osl")
    rate_fn: Callable[[float], float]
    if kind in ("poisson", "heavytail"):
        r = _rate(_need(fields, "rate", spec), "rate")
        rate_fn, rate_max = (lambda t: r), r
    elif kind == "step":
        rates = [_rate(x, "rates") for x in _need(fields, "rates", spec).split("/")]
        ats = [parse_duration(x, field="at") for x in _need(fields, "at", spec).split("/")]
        if len(ats) != len(rates) - 1 or ats != sorted(ats):
            raise WorkloadError(
                f"workload {spec!r}: {len(rates)} rates need {len(rates) - 1} increasing at= times"
            )

        def rate_fn(t: float) -> float:
            return rates[bisect.bisect_right(ats, t)]

        rate_max = max(rates)
    elif kind == "onoff":
        spells = onoff_spells(
            quiet_rate=_rate(_need(fields, "rate", spec), "rate"),
            duration_s=duration,
            busy_s=_range(fields.pop("busy", "1m-5m"), "busy", seconds=True),
            factor=_range(fields.pop("factor", "5-10"), "factor", seconds=False),
            quiet_mean_s=_mean_quiet(fields.pop("quiet", "10m")),
            seed=seed,
        )
        starts = [s.start_s for s in spells]

        def rate_fn(t: float) -> float:
            return spells[bisect.bisect_right(starts, t) - 1].rate

        rate_max = max(s.rate for s in spells)
    else:  # sinusoid, diurnal
        lo = _rate(_need(fields, "min", spec), "min")
        hi = _rate(_need(fields, "max", spec), "max")
        if hi < lo:
            raise WorkloadError(f"workload {spec!r}: max={hi} is below min={lo}")
        if kind == "sinusoid":
            period = parse_duration(_need(fields, "period", spec), field="period")
            phase = parse_duration(fields.pop("phase", "0"), field="phase")

            def rate_fn(t: float) -> float:
                return lo + (hi - lo) * (1 - math.cos(2 * math.pi * (t + phase) / period)) / 2

        else:
            period = parse_duration(fields.pop("period", "24h"), field="period")
            peak = parse_duration(fields.pop("peak", "14h"), field="peak")
            sharp = _positive(fields.pop("sharpness", "2"), "sharpness")

            def rate_fn(t: float) -> float:
                wave = (1 + math.cos(2 * math.pi * (t - peak) / period)) / 2
                return lo + (hi - lo) * wave**sharp

        if period <= 0:
            raise WorkloadError(f"workload {spec!r}: period must be > 0")
        rate_max = hi
    _reject_unknown(fields, spec)
    return synthetic(rate_fn, rate_max=rate_max, duration_s=duration, isl=isl, osl=osl, seed=seed)


def _heavy_tailed_isl(fields: dict[str, str], spec: str) -> LengthDist:
    """``heavytail``'s prompt lengths: lognormal with the given median and a p99 at ``p99=``
    (default: the model's ``context=``)."""
    if "isl" in fields:
        raise WorkloadError(
            f"workload {spec!r}: heavytail sets the prompt lengths from context=, median= and "
            "p99=; give no isl= (or use poisson with isl=lognormal:MEDIAN:SIGMA)"
        )
    context = _positive(_need(fields, "context", spec), "context", "the model's context in tokens")
    median = _positive(fields.pop("median", str(context / 32)), "median", "tokens")
    p99 = _positive(fields.pop("p99", str(context)), "p99", "tokens")
    if not median < p99:
        raise WorkloadError(
            f"workload {spec!r}: median={median:g} must be below p99={p99:g} (a tail above the "
            "median)"
        )
    return LengthDist("lognormal", median, math.log(p99 / median) / Z99)


def _mean_quiet(text: str) -> float:
    mean = parse_duration(text, field="quiet")
    if mean <= 0:
        raise WorkloadError(f"quiet={text!r}: expected a mean quiet spell > 0, e.g. quiet=10m")
    return mean


@dataclass(frozen=True, slots=True)
class Spell:
    """A stretch of constant arrival rate of an ``onoff`` workload."""

    start_s: float
    end_s: float
    rate: float
    busy: bool


def onoff_spells(
    *,
    quiet_rate: float,
    duration_s: float,
    busy_s: tuple[float, float],
    factor: tuple[float, float],
    quiet_mean_s: float,
    seed: int,
) -> list[Spell]:
    """The spells of a two-state Markov-modulated Poisson process, from a quiet one at t=0:
    quiet spells last Exp(``quiet_mean_s``) (memoryless: a burst may start at any moment),
    busy spells U(``busy_s``) at ``quiet_rate`` x U(``factor``), drawn afresh for each."""
    rng = random.Random(f"onoff:{seed}")
    spells: list[Spell] = []
    t, busy = 0.0, False
    while t < duration_s:
        if busy:
            length = rng.uniform(*busy_s)
            rate = quiet_rate * rng.uniform(*factor)
        else:
            length, rate = rng.expovariate(1.0 / quiet_mean_s), quiet_rate
        end = min(t + length, duration_s)
        spells.append(Spell(t, end, rate, busy))
        t, busy = end, not busy
    return spells


def _reject_unknown(fields: dict[str, str], spec: str) -> None:
    if fields:
        raise WorkloadError(f"workload {spec!r}: unknown keys {sorted(fields)}")


def speedup(requests: Iterable[RequestLike], x: float) -> Iterator[TraceRequest]:
    """Compress time by ``x`` (arrival ``t`` becomes ``t / x``); lengths unchanged."""
    if not x > 0 or not math.isfinite(x):
        raise WorkloadError(f"speedup x={x}: must be a finite number > 0")
    for r in requests:
        yield TraceRequest(
            arrival_s=r.arrival_s / x,
            input_length=r.input_length,
            output_length=r.output_length,
            hash_ids=r.hash_ids,
        )


def scale_load(
    requests: Iterable[RequestLike], k: float, *, seed: int = 0, jitter_s: float = 1.0
) -> Iterator[TraceRequest]:
    """``k`` times the load with the same shape: each request becomes ``floor(k)`` copies
    plus one more with probability ``k - floor(k)`` (``k < 1`` thins the trace). Copies
    after the first arrive ``U(0, jitter_s)`` seconds later. Prefix hashes of copy ``c`` are
    remapped to ``h * C + c`` (``C`` copies at most), so copies share prefixes among
    themselves as the originals do, never with another copy's. Output is time-sorted.
    """
    if not k > 0 or not math.isfinite(k):
        raise WorkloadError(f"scale_load k={k}: must be a finite number > 0")
    if jitter_s < 0:
        raise WorkloadError(f"scale_load jitter_s={jitter_s}: must be >= 0")
    rng = random.Random(seed)
    whole = math.floor(k)
    frac = k - whole
    copies_max = whole + (1 if frac > 0 else 0)
    pending: list[tuple[float, int, TraceRequest]] = []
    order = 0
    for r in requests:
        base = TraceRequest(r.arrival_s, r.input_length, r.output_length, r.hash_ids)
        while pending and pending[0][0] <= base.arrival_s:
            yield heapq.heappop(pending)[2]
        n = whole + (1 if rng.random() < frac else 0)
        for c in range(n):
            shift = 0.0 if c == 0 else rng.uniform(0.0, jitter_s)
            hashes = base.hash_ids
            if hashes is not None and copies_max > 1:
                hashes = tuple(h * copies_max + c for h in hashes)
            order += 1
            heapq.heappush(
                pending,
                (
                    base.arrival_s + shift,
                    order,
                    replace(base, arrival_s=base.arrival_s + shift, hash_ids=hashes),
                ),
            )
    while pending:
        yield heapq.heappop(pending)[2]
