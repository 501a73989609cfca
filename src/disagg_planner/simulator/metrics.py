"""Frontend metrics as Dynamo's HTTP frontend exports them: cumulative counters and histograms.

Names and default bucket bounds come from :mod:`disagg_planner.signals.frontend` (the one table).
What is observed when follows Dynamo's frontend: requests started at arrival; TTFT and ISL at the
first token; one inter-token-latency observation per token after the first (the gap since the
previous token); OSL, request duration and the finished-requests counter when the request
ends (failed requests included). Values are cumulative since the start of the simulation,
exactly what a Prometheus scrape at that moment would read.

Where the engines run speculative decoding, the page also carries vLLM's two
speculative-decoding counters (``vllm:spec_decode_num_drafts_total``, one per sequence per
speculative step; ``vllm:spec_decode_num_accepted_tokens_total``, the draft tokens kept), with
the frontend's labels, so that the replay observes the accept length as the live planner
does. They are counted when a request leaves its decode engine, for all of its steps at once
(vLLM counts each step as it runs: the ratio over a window is the same up to which window a
long request's steps fall in).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from disagg_planner.signals import frontend as names


@dataclass(frozen=True)
class CounterSample:
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True)
class HistogramSample:
    """``buckets``: cumulative ``(upper bound, count)`` pairs ending with ``(inf, count)``."""

    labels: Mapping[str, str]
    sum: float
    count: int
    buckets: tuple[tuple[float, int], ...]


@dataclass(frozen=True)
class MetricsSnapshot:
    """Every frontend series at ``time_s``, as plain values."""

    time_s: float
    counters: Mapping[str, tuple[CounterSample, ...]]
    histograms: Mapping[str, tuple[HistogramSample, ...]]

    def counter(self, name: str) -> float:
        """Sum of a counter over its label sets (0 when absent)."""
        return float(sum(s.value for s in self.counters.get(name, ())))

    def histogram(self, name: str) -> HistogramSample | None:
        """The single series of a histogram (the simulator has one label set)."""
        series = self.histograms.get(name, ())
        return series[0] if series else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: ``{name: {"type": ..., "series": [...]}}``; bucket bounds are
        Prometheus ``le`` strings ("+Inf" last)."""
        out: dict[str, Any] = {}
        for name, counters in self.counters.items():
            series = [{"labels": dict(s.labels), "value": s.value} for s in counters]
            out[name] = {"type": "counter", "series": series}
        for name, hists in self.histograms.items():
            out[name] = {
                "type": "histogram",
                "series": [
                    {
                        "labels": dict(h.labels),
                        "sum": h.sum,
                        "count": h.count,
                        "buckets": [
                            ["+Inf" if math.isinf(b) else repr(b), c] for b, c in h.buckets
                        ],
                    }
                    for h in hists
                ],
            }
        return {"time_s": self.time_s, "metrics": out}


def array_sum(values: list[float]) -> float:
    """``float(np.asarray(values).sum())``, without building an array for a short list.

    The simulated figures were defined with numpy sums; numpy adds fewer than 8 float64 in
    order (its pairwise summation starts at blocks of 8), so a short list is summed the same
    way here (an explicit loop: ``sum()`` of floats is compensated from Python 3.12 on).
    """
    if len(values) >= 8:
        return float(np.asarray(values, dtype=np.float64).sum())
    total = 0.0
    for v in values:
        total += v
    return total


class Histogram:
    """A cumulative Prometheus histogram with fixed upper bounds (``le``); +Inf implied."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Iterable[float]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        if list(self.bounds) != sorted(set(self.bounds)):
            raise ValueError(f"histogram bounds must be strictly increasing: {self.bounds}")
        self.counts = [0] * (len(self.bounds) + 1)  # non-cumulative; last is the +Inf bucket
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, n: int = 1) -> None:
        """Record ``value`` ``n`` times (``le`` semantics: a value equal to a bound is in it)."""
        self.counts[bisect_left(self.bounds, value)] += n
        self.sum += value * n
        self.count += n

    def observe_seq(self, values: list[float]) -> None:
        """``observe`` each value in turn: the same counts and the same float ``sum`` (added
        one value at a time, in order) without a call per value."""
        counts = self.counts
        bounds = self.bounds
        total = self.sum
        for value in values:
            counts[bisect_left(bounds, value)] += 1
            total += value
        self.sum = total
        self.count += len(values)

    def observe_repeat(self, value: float, n: int) -> None:
        """``observe(value)`` ``n`` times in a row: the float ``sum`` gets ``value`` added
        ``n`` times, as ``n`` calls would add it (``value * n`` can round differently)."""
        self.counts[bisect_left(self.bounds, value)] += n
        total = self.sum
        for _ in range(n):
            total += value
        self.sum = total
        self.count += n

    def observe_weighted(self, values: list[float], total: float, weight: int) -> None:
        """Record every value of ``values`` ``weight`` times, ``total`` being their sum
        (``array_sum``); ``sum`` grows by ``total * weight``, as it does for a planned run of
        decode iterations (each duration is a gap of every request of the batch)."""
        if not values or weight == 0:
            return
        counts = self.counts
        bounds = self.bounds
        for value in values:
            counts[bisect_left(bounds, value)] += weight
        self.sum += total * weight
        self.count += len(values) * weight

    def cumulative(self) -> tuple[tuple[float, int], ...]:
        out = []
        running = 0
        for bound, c in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += c
            out.append((bound, running))
        return tuple(out)


class PerTokenItl:
    """The frontend's ITL histogram as an engine running speculative decoding feeds it: each
    decode iteration emits ``accept`` tokens per sequence on average, so a gap between two
    iterations is ``accept`` tokens' worth, recorded as ``gap / accept`` (the amortised
    per-token cadence, as a request's ``itl_ms`` and the planner's ITL estimate count it).
    The same calls as :class:`Histogram`'s, each value divided before it is recorded."""

    __slots__ = ("_accept", "histogram")

    def __init__(self, histogram: Histogram, accept: float) -> None:
        self.histogram = histogram
        self._accept = accept

    def observe(self, value: float, n: int = 1) -> None:
        self.histogram.observe(value / self._accept, n)

    def observe_seq(self, values: list[float]) -> None:
        a = self._accept
        self.histogram.observe_seq([v / a for v in values])

    def observe_repeat(self, value: float, n: int) -> None:
        self.histogram.observe_repeat(value / self._accept, n)

    def observe_weighted(self, values: list[float], total: float, weight: int) -> None:
        a = self._accept
        self.histogram.observe_weighted([v / a for v in values], total / a, weight)


# What an engine records its inter-token gaps into.
ItlSink = Histogram | PerTokenItl


class FrontendMetrics:
    """The frontend's counters and histograms for one model in one Dynamo namespace."""

    def __init__(
        self,
        *,
        model: str,
        namespace: str,
        ttft_buckets: Iterable[float] = names.TTFT_BUCKETS_S,
        itl_buckets: Iterable[float] = names.ITL_BUCKETS_S,
        duration_buckets: Iterable[float] = names.DURATION_BUCKETS_S,
        token_buckets: Iterable[float] = names.TOKEN_BUCKETS,
        speculative: bool = False,
    ) -> None:
        # Dynamo's frontend lower-cases the model label.
        self.labels: Mapping[str, str] = {
            names.MODEL_LABEL: model.lower(),
            names.NAMESPACE_LABEL: namespace,
        }
        self.requests_started = 0
        self.requests_finished = 0
        self.ttft = Histogram(ttft_buckets)
        self.itl = Histogram(itl_buckets)
        self.duration = Histogram(duration_buckets)
        self.isl = Histogram(token_buckets)
        self.osl = Histogram(token_buckets)
        # the KV router's per-request share of the prompt found in the engine's prefix cache
        self.kv_hit = Histogram(names.KV_HIT_BUCKETS)
        # the engines' speculative-decoding counters, on the page only where they speculate
        self.speculative = speculative
        self.spec_drafts = 0
        self.spec_accepted = 0
        self.time_s = 0.0

    # -- observation hooks (called by the cluster) ---------------------------------------------
    def on_started(self) -> None:
        self.requests_started += 1

    def on_first_token(self, ttft_s: float, isl: int, cached_tokens: int = 0) -> None:
        self.ttft.observe(ttft_s)
        self.isl.observe(float(isl))
        self.kv_hit.observe(min(cached_tokens, isl) / isl if isl > 0 else 0.0)

    def on_decoded(self, osl: int, iterations: int) -> None:
        """A request left its decode engine after ``iterations`` engine iterations for its
        ``osl`` tokens: the first comes with the prefill's (or the KV transfer's) iteration,
        each later iteration is one speculative step that drafted for it and emitted the
        target's token plus the drafts it kept."""
        steps = max(iterations - 1, 0)
        self.spec_drafts += steps
        self.spec_accepted += max(osl - 1 - steps, 0)

    def on_finished(self, duration_s: float, osl: int) -> None:
        self.requests_finished += 1
        self.duration.observe(duration_s)
        self.osl.observe(float(osl))

    # -- views ----------------------------------------------------------------------------
    def _histograms(self) -> dict[str, Histogram]:
        f = names.FRONTEND
        return {
            f.ttft_seconds: self.ttft,
            f.itl_seconds: self.itl,
            f.request_duration_seconds: self.duration,
            f.input_tokens: self.isl,
            f.output_tokens: self.osl,
            names.ROUTER_KV_HIT_RATE: self.kv_hit,
        }

    def _counters(self) -> dict[str, int]:
        f = names.FRONTEND
        counters = {
            f.requests_started: self.requests_started,
            f.requests_finished: self.requests_finished,
        }
        if self.speculative:
            counters[names.SPEC_DECODE_DRAFTS] = self.spec_drafts
            counters[names.SPEC_DECODE_ACCEPTED_TOKENS] = self.spec_accepted
        return counters

    def snapshot(self) -> MetricsSnapshot:
        labels = dict(self.labels)
        return MetricsSnapshot(
            time_s=self.time_s,
            counters={
                name: (CounterSample(labels=labels, value=float(v)),)
                for name, v in self._counters().items()
            },
            histograms={
                name: (
                    HistogramSample(
                        labels=labels, sum=h.sum, count=h.count, buckets=h.cumulative()
                    ),
                )
                for name, h in self._histograms().items()
            },
        )

    def _families(self) -> list[tuple[str, str, list[ExpositionSample]]]:
        """Every metric family of the ``/metrics`` page: (name, type, samples), each sample
        as a scrape's parser reads it (``le`` as the page writes it, values as floats)."""
        labels = dict(self.labels)
        families: list[tuple[str, str, list[ExpositionSample]]] = []
        for name, value in self._counters().items():
            families.append((name, "counter", [ExpositionSample(name, labels, float(value))]))
        for name, h in self._histograms().items():
            samples = [
                ExpositionSample(
                    f"{name}_bucket",
                    labels | {"le": "+Inf" if math.isinf(bound) else _fmt(bound)},
                    float(cum),
                )
                for bound, cum in h.cumulative()
            ]
            samples.append(ExpositionSample(f"{name}_sum", labels, float(h.sum)))
            samples.append(ExpositionSample(f"{name}_count", labels, float(h.count)))
            families.append((name, "histogram", samples))
        return families

    def exposition_samples(self) -> list[ExpositionSample]:
        """The samples a scrape of :meth:`render_prometheus_text` yields, without writing and
        parsing the text (a replay reads its simulated frontend every few seconds)."""
        return [sample for _, _, samples in self._families() for sample in samples]

    def render_prometheus_text(self) -> str:
        """The Prometheus text exposition format (version 0.0.4) of every series."""
        lines: list[str] = []
        for name, kind, samples in self._families():
            lines.append(f"# HELP {name} {_HELP.get(name, name)}")
            lines.append(f"# TYPE {name} {kind}")
            for sample in samples:
                label_text = ",".join(
                    f'{k}="{_escape(v)}"' for k, v in sorted(sample.labels.items()) if k != "le"
                )
                if "le" in sample.labels:
                    label_text += f',le="{sample.labels["le"]}"'
                lines.append(f"{sample.name}{{{label_text}}} {_value_text(sample)}")
        return "\n".join(lines) + "\n"


class ExpositionSample(NamedTuple):
    """One sample of the page (``prometheus_client``'s parsed ``Sample`` has these fields)."""

    name: str
    labels: Mapping[str, str]
    value: float


def _value_text(sample: ExpositionSample) -> str:
    # counts as integers, as the page always wrote them; sums as the float's repr
    if sample.name.endswith("_sum"):
        return _fmt(sample.value)
    return str(int(sample.value))


def _fmt(x: float) -> str:
    return repr(float(x))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


_HELP = {
    names.FRONTEND.requests_started: "Requests received by the frontend",
    names.FRONTEND.requests_finished: "Requests the frontend finished (successful or not)",
    names.FRONTEND.ttft_seconds: "Time to first token in seconds",
    names.FRONTEND.itl_seconds: "Inter-token latency in seconds",
    names.FRONTEND.request_duration_seconds: "Request duration in seconds",
    names.FRONTEND.input_tokens: "Input sequence length in tokens",
    names.FRONTEND.output_tokens: "Output sequence length in tokens",
    names.ROUTER_KV_HIT_RATE: "Share of each request's prompt in the chosen worker's KV cache",
    names.SPEC_DECODE_DRAFTS: "Speculative steps, one per sequence per step",
    names.SPEC_DECODE_ACCEPTED_TOKENS: "Draft tokens the target model accepted",
}
