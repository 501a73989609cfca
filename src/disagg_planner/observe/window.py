"""Frontend traffic over one window, from counter and histogram increases.

Both traffic paths end here:

- live, :class:`disagg_planner.observe.prometheus.PrometheusTrafficObserver` asks Prometheus for
  ``increase(...)`` of every input over ``[end - I, end]`` and hands the sums to
  :func:`observation_from_increases`;
- in replay, where there is no Prometheus, :func:`traffic_from_snapshots` computes the same
  increases from two cumulative snapshots of the metrics (what a scrape would read at the
  start and at the end of the window) and hands them to the same function.

Definitions (one place, both paths):

- ``num_req`` = increase of ``requests_started`` summed over the matching series; when that
  metric has no series (older frontends), the increase of ``requests_finished``, which
  undercounts demand while requests queue;
- the average of a histogram input X = ``increase(X_sum) / increase(X_count)``, each summed
  over the matching series (a request-weighted mean over all frontends); undefined (None)
  when no observation finished in the window; TTFT and ITL are converted from seconds to
  milliseconds, token lengths stay in tokens, request duration stays in seconds;
- the ISL/OSL distributions = increase of ``X_bucket`` per ``le``, summed over series and
  turned from cumulative into per-bucket counts;
- the speculative-decoding accept length = ``1 + increase(accepted) / increase(steps)`` of
  the engines' counters (vLLM's, SGLang's or TensorRT-LLM's:
  :data:`~disagg_planner.signals.frontend.SPEC_DECODE_ENGINES`), summed over the engines
  (:func:`accept_length_from_increases`); None when no engine's speculative counters have a
  series, else None with the reason in ``accept_length_missing`` when one of an engine's
  counters has none, no draft was made in the window, or a value is not a finite number >= 0
  (a bad engine counter never makes the traffic itself missing).

Zero traffic (counters present, no increase) is a valid observation with ``num_req == 0``
and undefined averages. No series at all is *not* zero traffic: it is a missing observation
(``no_series``), since it cannot be told apart from a frontend Prometheus does not scrape.

A window must be covered: every series of the request counter used must have an unbroken
history (no counter reset) reaching back to the window's start, by the rule Prometheus'
``increase()`` itself uses to extrapolate to the start (:func:`history_start`).
A series whose history starts later (Prometheus restarted after a gap longer than the
window, a target newly scraped, a frontend restarted in the window) holds only part of the
window's requests, so reading it would report low traffic at constant load; the
observation is missing instead (``partial_window``), naming how much was covered.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from itertools import pairwise
from typing import Protocol

from prometheus_client.parser import text_string_to_metric_families

from disagg_planner.core.types import Histogram, MissingObservation, TrafficObservation
from disagg_planner.signals.frontend import (
    MODEL_LABEL,
    NAMESPACE_LABEL,
    SOURCES,
    SPEC_DECODE_COUNTERS,
    SPEC_DECODE_ENGINES,
    TrafficMetricNames,
)

logger = logging.getLogger(__name__)


class MissingReason(StrEnum):
    """Why a traffic observation is missing (bounded: the values are metric labels)."""

    PROMETHEUS_UNREACHABLE = "prometheus_unreachable"
    PROMETHEUS_TIMEOUT = "prometheus_timeout"
    PROMETHEUS_ERROR = "prometheus_error"
    BAD_RESPONSE = "bad_response"
    NO_SERIES = "no_series"
    TOKEN_UNREADABLE = "prometheus_token_unreadable"
    PARTIAL_WINDOW = "partial_window"


@dataclass(frozen=True)
class HistogramInput:
    """One histogram-valued traffic input and how it maps onto :class:`TrafficObservation`."""

    key: str  # short name used in query part names ("ttft" -> "ttft_sum", "ttft_count")
    attribute: str  # field of TrafficMetricNames holding the metric family name
    observation_field: str  # field of TrafficObservation receiving the average
    scale: float  # metric unit -> observation unit
    # an input some deployments do not export (no KV router): its absence is not a gap
    optional: bool = False


HISTOGRAM_INPUTS: tuple[HistogramInput, ...] = (
    HistogramInput("ttft", "ttft_seconds", "ttft_ms", 1000.0),
    HistogramInput("itl", "itl_seconds", "itl_ms", 1000.0),
    HistogramInput("isl", "input_tokens", "isl", 1.0),
    HistogramInput("osl", "output_tokens", "osl", 1.0),
    HistogramInput("request_duration", "request_duration_seconds", "request_duration_s", 1.0),
    HistogramInput("kv_hit", "kv_hit_rate", "kv_hit_rate", 1.0, optional=True),
)
# Inputs whose bucket increases are kept as distributions, and the observation field.
DISTRIBUTION_INPUTS: dict[str, str] = {
    "isl": "isl_histogram",
    "osl": "osl_histogram",
    "ttft": "ttft_histogram",  # the fast path's TTFT tail
}


def metric_family(metrics: TrafficMetricNames, item: HistogramInput) -> str:
    """The metric family name of ``item`` in the chosen source's table."""
    name: str = getattr(metrics, item.attribute)
    return name


def source_metrics(source: str) -> TrafficMetricNames:
    """The metric names of a traffic source ("frontend" or "router")."""
    try:
        return SOURCES[source]
    except KeyError:
        raise ValueError(
            f"unknown traffic metrics source {source!r}; expected one of {sorted(SOURCES)}"
        ) from None


def namespace_label_value(namespace: str, source: str) -> str:
    """The ``dynamo_namespace`` label value a source exports for a Dynamo namespace.

    The router's component metrics carry the namespace with dashes replaced by
    underscores; the frontend's carry it unchanged.
    """
    return namespace.replace("-", "_") if source == "router" else namespace


# Prometheus' increase() extrapolates a series to the window's start only when its first
# sample lies within 1.1 average sample intervals of it (extrapolatedRate in
# promql/functions.go); a later first sample means the series starts inside the window.
EXTRAPOLATION_THRESHOLD = 1.1

Sample = tuple[float, float]
"""One sample: (time in Unix seconds, value)."""


@dataclass(frozen=True)
class SeriesSamples:
    """The samples one request-counter series has inside the window, oldest first."""

    series: str  # ``name{labels}``, for messages
    samples: tuple[Sample, ...]


def history_start(samples: tuple[Sample, ...], start_s: float) -> float | None:
    """When the series' unbroken history in a window starting at ``start_s`` begins, if it
    begins inside the window; None when the history covers the window.

    A counter reset (a value lower than the one before: the process restarted) makes the
    history begin at the sample after it: the requests between the last sample before the
    restart and the restart are counted nowhere. Without one, the history begins at the
    first sample, and covers the window when that lies within
    :data:`EXTRAPOLATION_THRESHOLD` average sample intervals of the start, as
    ``increase()`` decides whether to extrapolate to the start; a lone sample covers the
    window only when it is at the start.
    """
    resets = [t for (_, before), (t, value) in pairwise(samples) if value < before]
    if resets:
        return resets[-1]
    if not samples:
        return None
    first, n = samples[0][0], len(samples)
    threshold = EXTRAPOLATION_THRESHOLD * (samples[-1][0] - first) / (n - 1) if n > 1 else 0.0
    return first if first - start_s > threshold else None


@dataclass(frozen=True)
class WindowIncreases:
    """Increases over one window, each already summed over the matching series.

    ``None`` (or an absent key) means the metric had no matching series in the window;
    0 means it had series that did not move. ``sums``/``counts`` are keyed by
    :attr:`HistogramInput.key`; ``buckets[key]`` maps each upper bound ``le`` (``inf`` for
    ``+Inf``) to the increase of that *cumulative* bucket. ``counter_series`` holds the
    in-window samples of every series of the counter ``num_req`` comes from, for the
    coverage check (module doc).
    """

    requests_started: float | None
    requests_finished: float | None
    sums: Mapping[str, float] = field(default_factory=dict)
    counts: Mapping[str, float] = field(default_factory=dict)
    buckets: Mapping[str, Mapping[float, float]] = field(default_factory=dict)
    counter_series: tuple[SeriesSamples, ...] = ()
    # not an increase: requests started minus finished at the window's end (None: not read)
    in_flight: float | None = None
    # the engines' speculative-decoding counters by query tag (absent: no series)
    spec_counters: Mapping[str, float] = field(default_factory=dict)

    @property
    def count_metric_used(self) -> str | None:
        """Which counter ``num_req`` comes from: "requests_started", "requests_finished"."""
        if self.requests_started is not None:
            return "requests_started"
        if self.requests_finished is not None:
            return "requests_finished"
        return None


def observation_from_increases(
    increases: WindowIncreases,
    *,
    end_s: float,
    duration_s: float,
    where: str = "",
) -> TrafficObservation | MissingObservation:
    """Turn summed increases into a :class:`TrafficObservation` (definitions: module doc).

    ``where`` describes the series filter for the message of a missing observation.
    Non-finite or negative increases (which Prometheus never returns for counters) make the
    observation missing with ``bad_response`` rather than poisoning the averages.
    """
    bad = _first_bad_value(increases)
    if bad is not None:
        return MissingObservation(MissingReason.BAD_RESPONSE, bad)
    if increases.requests_started is not None:
        num_req = increases.requests_started
    elif increases.requests_finished is not None:
        num_req = increases.requests_finished
    else:
        detail = "no request counter series in the window"
        return MissingObservation(MissingReason.NO_SERIES, f"{detail} {where}".strip())
    partial = _partial_window(increases.counter_series, end_s=end_s, duration_s=duration_s)
    if partial is not None:
        return MissingObservation(MissingReason.PARTIAL_WINDOW, f"{partial} {where}".strip())

    averages: dict[str, float | None] = {}
    for item in HISTOGRAM_INPUTS:
        total = increases.sums.get(item.key)
        count = increases.counts.get(item.key)
        average = None
        # count == 0: no request finished in the window; the mean is undefined, not 0.
        if total is not None and count is not None and count > 0:
            average = total / count * item.scale
        averages[item.observation_field] = average

    accept, accept_missing = accept_length_from_increases(increases.spec_counters)
    histograms: dict[str, Histogram | None] = {}
    for key, obs_field in DISTRIBUTION_INPUTS.items():
        cumulative = increases.buckets.get(key)
        histograms[obs_field] = histogram_from_cumulative(cumulative) if cumulative else None

    return TrafficObservation(
        end_s=end_s,
        duration_s=duration_s,
        num_req=num_req,
        ttft_ms=averages["ttft_ms"],
        itl_ms=averages["itl_ms"],
        isl=averages["isl"],
        osl=averages["osl"],
        request_duration_s=averages["request_duration_s"],
        isl_histogram=histograms["isl_histogram"],
        osl_histogram=histograms["osl_histogram"],
        ttft_histogram=histograms["ttft_histogram"],
        kv_hit_rate=averages["kv_hit_rate"],
        accept_length=accept,
        accept_length_missing=accept_missing,
        # counters scraped a moment apart can cross: never fewer than no request in flight
        in_flight=(
            max(0.0, increases.in_flight)
            if increases.in_flight is not None and math.isfinite(increases.in_flight)
            else None
        ),
    )


def accept_length_from_increases(
    increases: Mapping[str, float],
) -> tuple[float | None, str | None]:
    """The mean tokens a sequence emitted per speculative step over the window, or None and
    why not, from the increases of the engines' speculative-decoding counters by query tag
    (:data:`~disagg_planner.signals.frontend.SPEC_DECODE_COUNTERS`; absent: no series).

    Each engine's counters give the draft tokens kept and the speculative steps (one per
    sequence per step, :class:`~disagg_planner.signals.frontend.SpecDecodeCounters`), summed
    over the engines that speculate; every step also emits the token the target samples
    itself, so ``A = 1 + accepted / steps`` (the bonus token included; ``1 <= A <= nextn +
    1``; the rule ``spec_decode_accept`` clamps a misread value). Counter resets are already
    folded into the increases (``increase()`` adds what a restarted counter counted since).

    >>> accept_length_from_increases({"spec_accepted": 350.0, "spec_drafts": 200.0})
    (2.75, None)
    >>> accept_length_from_increases({"spec_accepted": 0.0, "spec_drafts": 0.0})
    (None, 'no speculative drafts in the window')
    >>> accept_length_from_increases({"spec_sglang_verify": 100.0,
    ...     "spec_sglang_generated": 310.0, "spec_sglang_requests": 10.0})
    (3.0, None)
    """
    for part, value in increases.items():
        if part in SPEC_DECODE_COUNTERS and not (math.isfinite(value) and value >= 0):
            shown = SPEC_DECODE_COUNTERS[part].shown
            return None, f"increase of {shown} is {value}, expected a finite number >= 0"
    accepted = steps = 0.0
    speculating = False
    for engine in SPEC_DECODE_ENGINES:
        own = [c for c in engine.counters if c not in engine.generic]
        if not any(c.part in increases for c in own):
            continue  # this engine does not speculate (or is not scraped)
        speculating = True
        absent = [c for c in engine.counters if c.part not in increases]
        if absent:
            return None, f"no series of {absent[0].shown}"
        steps += increases[engine.steps.part]
        # scrapes a moment apart can cross: never fewer than no draft token kept
        accepted += max(0.0, math.fsum(k * increases[c.part] for k, c in engine.accepted))
    if not speculating:
        # no engine speculates (or none is scraped): nothing to report on every window
        return None, None
    if steps == 0:
        return None, "no speculative drafts in the window"
    return 1.0 + accepted / steps, None


def histogram_from_cumulative(cumulative: Mapping[float, float]) -> Histogram:
    """Per-bucket counts from cumulative ``le -> count`` increases.

    Buckets summed over frontends with different layouts need not be monotonic; a
    negative difference is clamped to 0 rather than reported as negative requests.
    """
    bounds = sorted(le for le in cumulative if math.isfinite(le))
    counts: list[float] = []
    previous = 0.0
    for le in bounds:
        counts.append(max(0.0, cumulative[le] - previous))
        previous = max(previous, cumulative[le])
    overflow = max(0.0, cumulative.get(math.inf, previous) - previous)
    return Histogram(bounds=tuple(bounds), counts=tuple(counts), overflow=overflow)


def _partial_window(
    counter_series: Iterable[SeriesSamples], *, end_s: float, duration_s: float
) -> str | None:
    """Why the window is not covered (the latest-starting series), or None when it is."""
    series = tuple(counter_series)
    late = [
        (begin, item.series)
        for item in series
        if (begin := history_start(item.samples, end_s - duration_s)) is not None
    ]
    if not late:
        return None
    begin, worst = max(late)
    covered = max(0.0, end_s - begin)
    return (
        f"{worst} has an unbroken history for only the last {covered:.3g} s of the "
        f"{duration_s:g} s window ({covered / duration_s:.0%} covered; {len(late)} of "
        f"{len(series)} series start inside the window): Prometheus restarted, the target "
        "is newly scraped or the counter was reset, so the window holds only part of the "
        "requests"
    )


def _first_bad_value(increases: WindowIncreases) -> str | None:
    named: list[tuple[str, float | None]] = [
        ("requests_started", increases.requests_started),
        ("requests_finished", increases.requests_finished),
    ]
    named += [(f"{k}_sum", v) for k, v in increases.sums.items()]
    named += [(f"{k}_count", v) for k, v in increases.counts.items()]
    for key, buckets in increases.buckets.items():
        named += [(f"{key}_bucket{{le={le:g}}}", v) for le, v in buckets.items()]
    for name, value in named:
        if value is not None and not (math.isfinite(value) and value >= 0):
            return f"increase of {name} is {value}, expected a finite number >= 0"
    return None


# --- snapshots -----------------------------------------------------------------------------

SampleKey = tuple[str, tuple[tuple[str, str], ...]]
"""A sample's identity: its name (``..._total``, ``..._bucket`` ...) and sorted labels."""

Snapshot = Mapping[SampleKey, float]
"""Cumulative metric values at one instant: sample identity -> value."""


class SampleLike(Protocol):
    """Anything with a sample's name, labels and value (``prometheus_client`` ``Sample``)."""

    @property
    def name(self) -> str: ...
    @property
    def labels(self) -> Mapping[str, str]: ...
    @property
    def value(self) -> float: ...


def sample_key(name: str, labels: Mapping[str, str]) -> SampleKey:
    """The :data:`SampleKey` of a sample (labels sorted, so the key is order-independent)."""
    return (name, tuple(sorted(labels.items())))


def snapshot_from_samples(samples: Iterable[SampleLike]) -> dict[SampleKey, float]:
    """Build a snapshot from samples, e.g. the ``samples`` of parsed metric families.

    Raises ValueError when the same sample appears twice (two values for one instant).
    """
    snapshot: dict[SampleKey, float] = {}
    for sample in samples:
        key = sample_key(sample.name, sample.labels)
        if key in snapshot:
            raise ValueError(f"sample {_render(key)} appears twice in one snapshot")
        snapshot[key] = float(sample.value)
    return snapshot


def snapshot_from_text(text: str) -> dict[SampleKey, float]:
    """Parse Prometheus text exposition (a ``/metrics`` page) into a snapshot.

    Raises ValueError naming the problem when the text is not valid exposition format.
    """
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as exc:
        raise ValueError(f"not Prometheus text exposition format: {exc}") from exc
    return snapshot_from_samples(s for family in families for s in family.samples)


def traffic_from_snapshots(
    *,
    start: Snapshot,
    end: Snapshot,
    start_s: float,
    end_s: float,
    model_name: str | None,
    namespace: str,
    source: str = "frontend",
) -> TrafficObservation | MissingObservation:
    """Traffic over ``[start_s, end_s]`` from two cumulative snapshots, without Prometheus.

    Snapshot shape: a mapping ``(sample_name, sorted((label, value), ...)) -> value`` of
    cumulative values, one entry per exposed sample: counters under their ``_total`` name,
    histograms as ``<name>_sum``, ``<name>_count`` and ``<name>_bucket`` (with an ``le``
    label, ``"+Inf"`` for the last bucket). This is exactly the set of samples that
    ``prometheus_client.parser.text_string_to_metric_families`` yields for a ``/metrics``
    page, so :func:`snapshot_from_text` turns the simulator's text exposition into one,
    and :func:`snapshot_from_samples` turns parsed families or any structured source of
    ``(name, labels, value)`` samples into one. Other samples (``_created``, unrelated
    metrics) are ignored.

    Series are filtered as the PromQL is: ``model`` equal to ``model_name`` ignoring case
    (no filter when None) and ``dynamo_namespace`` equal to ``namespace`` (dashes turned to
    underscores for the router source). Each series contributes what Prometheus'
    ``increase()`` gives over a window holding exactly two samples, at ``start_s`` and
    ``end_s``: ``end - start``, or ``end`` when the value went down (a counter reset, the
    process restarted). A series missing from either snapshot contributes nothing, as a
    series with a single sample in the window contributes nothing to ``increase()``.

    The coverage rule (module doc) reads the request counter's series as two-sample
    histories: a series only in ``end`` (it appeared during the window) or whose value went
    down (reset) starts inside the window, and makes the window ``partial_window``, as live.

    Returns the same :class:`TrafficObservation` the PromQL path returns for the same two
    scrapes, or a :class:`MissingObservation` (``no_series`` when no request counter
    matches, ``partial_window`` when the window is not covered).
    """
    if not end_s > start_s:
        raise ValueError(f"end_s ({end_s}) must be after start_s ({start_s})")
    metrics = source_metrics(source)
    ns_value = namespace_label_value(namespace, source)
    wanted_model = model_name.lower() if model_name is not None else None

    # Per-series increases of the matching series, grouped by sample name.
    by_name: dict[str, list[tuple[dict[str, str], float]]] = {}
    # Every matching series' samples in the window, for the coverage check.
    histories: dict[str, list[SeriesSamples]] = {}
    for key, end_value in end.items():
        sample_name, label_pairs = key
        labels = dict(label_pairs)
        if labels.get(NAMESPACE_LABEL) != ns_value:
            continue
        if wanted_model is not None and labels.get(MODEL_LABEL, "").lower() != wanted_model:
            continue
        start_value = start.get(key)
        samples = ((start_s, start_value),) if start_value is not None else ()
        histories.setdefault(sample_name, []).append(
            SeriesSamples(_render(key), (*samples, (end_s, end_value)))
        )
        if start_value is None:
            continue
        delta = end_value - start_value if end_value >= start_value else end_value
        by_name.setdefault(sample_name, []).append((labels, delta))

    def total(name: str) -> float | None:
        deltas = by_name.get(name)
        return None if deltas is None else math.fsum(d for _, d in deltas)

    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    for item in HISTOGRAM_INPUTS:
        family = metric_family(metrics, item)
        item_sum, item_count = total(f"{family}_sum"), total(f"{family}_count")
        if item_sum is not None:
            sums[item.key] = item_sum
        if item_count is not None:
            counts[item.key] = item_count
        if item.key in DISTRIBUTION_INPUTS:
            per_le: dict[float, float] = {}
            for labels, delta in by_name.get(f"{family}_bucket", []):
                bound = _parse_le(labels.get("le"), family)
                per_le[bound] = per_le.get(bound, 0.0) + delta
            if per_le:
                buckets[item.key] = per_le
    increases = WindowIncreases(
        requests_started=total(metrics.requests_started),
        requests_finished=total(metrics.requests_finished),
        sums=sums,
        counts=counts,
        buckets=buckets,
        in_flight=_in_flight(end, metrics, ns_value, wanted_model),
        spec_counters=_spec_counters(by_name),
    )
    used = increases.count_metric_used
    if used is not None:
        counter: str = getattr(metrics, used)
        increases = replace(increases, counter_series=tuple(histories[counter]))
    where = f"for model={model_name!r} namespace={ns_value!r}"
    return observation_from_increases(
        increases, end_s=float(end_s), duration_s=float(end_s - start_s), where=where
    )


def _spec_counters(
    by_name: Mapping[str, list[tuple[dict[str, str], float]]],
) -> dict[str, float]:
    """The summed increase of each speculative-decoding counter with a matching series (its
    extra label matchers applied), by query tag: the PromQL path's ``sum(increase(...))``."""
    out: dict[str, float] = {}
    for part, counter in SPEC_DECODE_COUNTERS.items():
        deltas = [
            d
            for labels, d in by_name.get(counter.name, [])
            if all(labels.get(k) == v for k, v in counter.labels)
        ]
        if deltas:
            out[part] = math.fsum(deltas)
    return out


def _in_flight(
    end: Snapshot, metrics: TrafficMetricNames, ns_value: str, wanted_model: str | None
) -> float | None:
    """Requests started minus requests finished in ``end``, over the matching series (the
    PromQL path's ``sum(started) - sum(finished)``); None when either counter is absent, or
    when both are one counter (the router's)."""
    if metrics.requests_started == metrics.requests_finished:
        return None
    totals: dict[str, float] = {}
    for (sample_name, label_pairs), value in end.items():
        if sample_name not in (metrics.requests_started, metrics.requests_finished):
            continue
        labels = dict(label_pairs)
        if labels.get(NAMESPACE_LABEL) != ns_value:
            continue
        if wanted_model is not None and labels.get(MODEL_LABEL, "").lower() != wanted_model:
            continue
        totals[sample_name] = totals.get(sample_name, 0.0) + value
    started = totals.get(metrics.requests_started)
    finished = totals.get(metrics.requests_finished)
    return None if started is None or finished is None else started - finished


def _parse_le(le: str | None, family: str) -> float:
    try:
        if le is None:
            raise ValueError
        return float(le)
    except ValueError:
        expected = "expected a number or +Inf"
        raise ValueError(f"{family}_bucket sample has le={le!r}; {expected}") from None


def _render(key: SampleKey) -> str:
    name, labels = key
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}"
