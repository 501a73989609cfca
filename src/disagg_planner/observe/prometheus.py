"""Frontend traffic over the last interval, read from Prometheus (the throughput loop's input).

One PromQL request reads every input (request counters, the ``_sum`` and ``_count`` of each
histogram, the ISL/OSL buckets): each is a separate ``sum(increase(...))`` tagged with a
``planner_part`` label and joined with ``or``, so all parts are evaluated at the same
instant over the same window. The model and namespace filters are in the selectors, and
``sum`` adds up every matching series (several frontends, several pods). When a request
counter matched, a second request at the same evaluation time reads that counter's raw
samples in the window, so that a window the series do not cover (Prometheus restarted,
a target newly scraped, a counter reset) is missing rather than low traffic (module doc of
:mod:`disagg_planner.observe.window`, which turns the increases into averages and
distributions; the replay path shares that code). Each request has its own timeout.

Failures never look like traffic: an unreachable or slow server, an HTTP error, a body
that is not a Prometheus vector, or no matching series gives a
:class:`~disagg_planner.core.types.MissingObservation` with a bounded reason
(:class:`~disagg_planner.observe.window.MissingReason`), and the planner holds.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import requests
from prometheus_api_client.exceptions import PrometheusApiClientException
from prometheus_api_client.prometheus_connect import PrometheusConnect
from urllib3.exceptions import NewConnectionError
from urllib3.exceptions import TimeoutError as Urllib3TimeoutError
from urllib3.util.retry import Retry

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.core.types import MissingObservation, TrafficObservation
from disagg_planner.observe.window import (
    DISTRIBUTION_INPUTS,
    HISTOGRAM_INPUTS,
    MissingReason,
    SeriesSamples,
    WindowIncreases,
    metric_family,
    namespace_label_value,
    observation_from_increases,
    source_metrics,
)
from disagg_planner.signals.frontend import (
    MODEL_LABEL,
    NAMESPACE_LABEL,
    SPEC_DECODE_COUNTERS,
)

logger = logging.getLogger(__name__)

PART_LABEL = "planner_part"
# Query parameters the observer sets itself; extra parameters may not override them.
_RESERVED_PARAMS = frozenset({"query", "time"})
_DETAIL_LIMIT = 300


def promql_string(value: str) -> str:
    """``value`` as a double-quoted PromQL string literal (Go escapes, which JSON's are)."""
    return json.dumps(value, ensure_ascii=False)


def model_regex(model_name: str) -> str:
    """An RE2 pattern matching exactly ``model_name`` ignoring case.

    PromQL anchors ``=~`` matchers at both ends; ``re.escape`` output is valid RE2 (RE2
    reads any escaped punctuation as itself), so dots or slashes in a model name match only
    themselves.
    """
    return "(?i)" + re.escape(model_name)


class PrometheusTrafficObserver:
    """Reads one window of frontend (or router) traffic for one model in one namespace.

    Settings come from the ``metric_pulling_prometheus_*`` fields of ``config``, the source
    from ``throughput_metrics_source``, the filters from ``model_name`` (or the
    ``model_name`` argument, e.g. read from the deployment; no model filter when neither
    is set) and ``namespace``. No retries: a failed read is reported, and the next tick
    reads again.
    """

    def __init__(self, config: PlannerConfig, *, model_name: str | None = None) -> None:
        self._config = config
        self._source = config.throughput_metrics_source
        self._metrics = source_metrics(self._source)
        self._model_name = model_name if model_name is not None else config.model_name
        self._namespace_value = namespace_label_value(config.namespace, self._source)
        self._endpoint = config.metric_pulling_prometheus_endpoint
        self._extra_params = self._parse_extra_params(
            config.metric_pulling_prometheus_extra_query_params
        )
        session = requests.Session()
        if not config.metric_pulling_prometheus_ssl_verify:
            session.verify = False
        elif config.metric_pulling_prometheus_ca_bundle:
            session.verify = config.metric_pulling_prometheus_ca_bundle
        self._client = PrometheusConnect(
            url=self._endpoint,
            session=session,
            # read=False: a read timeout surfaces as a timeout instead of a retry error.
            retry=Retry(total=0, read=False, redirect=0),
            # Annotated int upstream, but handed to requests, which takes float seconds.
            timeout=config.metric_pulling_prometheus_request_timeout_seconds,  # type: ignore[arg-type]
        )
        self._count_metric_used: str | None = None
        if self._model_name is None:
            logger.warning(
                "no model name configured: traffic of every model in namespace %r is summed",
                self._namespace_value,
            )

    # --- queries ----------------------------------------------------------------------

    @property
    def selector(self) -> str:
        """The label matchers every query uses, e.g. ``{model=~"(?i)x",dynamo_namespace="y"}``."""
        matchers = []
        if self._model_name is not None:
            matchers.append(f"{MODEL_LABEL}=~{promql_string(model_regex(self._model_name))}")
        matchers.append(f"{NAMESPACE_LABEL}={promql_string(self._namespace_value)}")
        return "{" + ",".join(matchers) + "}"

    def queries(self, duration_s: float) -> dict[str, str]:
        """The PromQL of each part over a window of ``duration_s`` seconds, by part name."""
        window = _range(duration_s)
        sel = self.selector

        def summed(metric: str) -> str:
            return f"sum(increase({metric}{sel}[{window}]))"

        parts = {
            "requests_started": summed(self._metrics.requests_started),
            "requests_finished": summed(self._metrics.requests_finished),
        }
        if self._metrics.requests_started != self._metrics.requests_finished:
            # not an increase: the requests in flight at the window's end
            parts["in_flight"] = (
                f"sum({self._metrics.requests_started}{sel}) - "
                f"sum({self._metrics.requests_finished}{sel})"
            )
        # the engines' speculative-decoding counters (the accept length), same filters
        for part, counter in SPEC_DECODE_COUNTERS.items():
            extra = "".join(f",{k}={promql_string(v)}" for k, v in counter.labels)
            parts[part] = (
                f"sum(increase({counter.name}{sel[:-1]}{extra}}}[{window}]))"
                if extra
                else summed(counter.name)
            )
        for item in HISTOGRAM_INPUTS:
            family = metric_family(self._metrics, item)
            parts[f"{item.key}_sum"] = summed(f"{family}_sum")
            parts[f"{item.key}_count"] = summed(f"{family}_count")
            if item.key in DISTRIBUTION_INPUTS:
                parts[f"{item.key}_bucket"] = (
                    f"sum by (le) (increase({family}_bucket{sel}[{window}]))"
                )
        return parts

    def query(self, duration_s: float) -> str:
        """All parts in one PromQL expression, each tagged with its ``planner_part``."""
        tagged = (
            f'label_replace({expr}, "{PART_LABEL}", "{name}", "", "")'
            for name, expr in self.queries(duration_s).items()
        )
        return " or ".join(tagged)

    def samples_query(self, counter: str, duration_s: float) -> str:
        """The PromQL of ``counter``'s raw samples in the window, one series per frontend."""
        return f"{counter}{self.selector}[{_range(duration_s)}]"

    @property
    def count_metric_used(self) -> str | None:
        """Which counter the last observation's ``num_req`` came from, if any."""
        return self._count_metric_used

    # --- observing --------------------------------------------------------------------

    def observe(
        self, *, end_s: float | None = None, duration_s: float | None = None
    ) -> TrafficObservation | MissingObservation:
        """Traffic over ``[end_s - duration_s, end_s]``.

        ``end_s`` (Unix seconds, millisecond resolution) defaults to the server's now;
        ``duration_s`` to the throughput adjustment interval. Runtime problems come back
        as a MissingObservation; only invalid arguments raise (ValueError).
        """
        duration = (
            self._config.throughput_adjustment_interval_seconds
            if duration_s is None
            else duration_s
        )
        if not (math.isfinite(duration) and duration >= 0.001):
            raise ValueError(f"duration_s must be a finite number >= 0.001 s, got {duration}")
        if end_s is not None and not math.isfinite(end_s):
            raise ValueError(f"end_s must be a finite Unix time in seconds, got {end_s}")
        result = self._read(end_s=end_s, duration_s=duration)
        if isinstance(result, MissingObservation):
            logger.warning("traffic observation missing: %s (%s)", result.reason, result.detail)
        return result

    def _read(
        self, *, end_s: float | None, duration_s: float
    ) -> TrafficObservation | MissingObservation:
        headers = self._headers()
        if isinstance(headers, MissingObservation):
            return headers
        self._client.headers = headers
        vector = self._query(self.query(duration_s), end_s)
        if isinstance(vector, MissingObservation):
            return vector
        try:
            increases, eval_s = _parse_vector(vector)
        except _BadResponse as exc:
            return MissingObservation(MissingReason.BAD_RESPONSE, f"{self._endpoint}: {exc}")
        where = f"matching {self.selector} over {_range(duration_s)} at {self._endpoint}"
        observed_end = end_s if end_s is not None else eval_s
        if observed_end is None:  # an empty vector: nothing matched, no timestamp either
            return MissingObservation(MissingReason.NO_SERIES, f"no series {where}")
        used = increases.count_metric_used
        self._note_count_metric(used)
        observation = observation_from_increases(
            increases, end_s=observed_end, duration_s=duration_s, where=where
        )
        if isinstance(observation, MissingObservation):
            return observation
        observation = self._note_missing_histograms(increases, observation)
        if used is None:
            return observation
        # Same evaluation time as the increases: the samples are those they came from.
        counter: str = getattr(self._metrics, used)
        matrix = self._query(self.samples_query(counter, duration_s), observed_end)
        if isinstance(matrix, MissingObservation):
            return matrix
        try:
            series = _parse_matrix(matrix)
        except _BadResponse as exc:
            return MissingObservation(MissingReason.BAD_RESPONSE, f"{self._endpoint}: {exc}")
        final = observation_from_increases(
            replace(increases, counter_series=series),
            end_s=observed_end,
            duration_s=duration_s,
            where=where,
        )
        if isinstance(final, MissingObservation):
            return final
        return self._note_missing_histograms(increases, final)

    def _note_missing_histograms(
        self, increases: WindowIncreases, observation: TrafficObservation
    ) -> TrafficObservation:
        """Name the histogram families without series in a window whose request counters
        moved (a scrape config or relabelling that drops histograms keeps the counters)."""
        if observation.num_req <= 0:
            return observation
        missing = tuple(
            getattr(self._metrics, item.attribute)
            for item in HISTOGRAM_INPUTS
            if not item.optional
            and (increases.sums.get(item.key) is None or increases.counts.get(item.key) is None)
        )
        return replace(observation, missing_series=missing) if missing else observation

    def _query(self, promql: str, time_s: float | None) -> Any | MissingObservation:
        """The ``result`` of one instant query at ``time_s`` (the server's now when None)."""
        params = dict(self._extra_params)
        if time_s is not None:
            params["time"] = f"{time_s:.3f}"
        try:
            return self._client.custom_query(promql, params=params)
        except PrometheusApiClientException as exc:  # a non-200 status
            return MissingObservation(
                MissingReason.PROMETHEUS_ERROR, f"{self._endpoint}: {_clip(str(exc))}"
            )
        except (requests.exceptions.JSONDecodeError, KeyError, TypeError) as exc:
            # A 200 whose body is not JSON or not shaped like a query response.
            return MissingObservation(
                MissingReason.BAD_RESPONSE,
                f"{self._endpoint}: not a Prometheus query response ({type(exc).__name__}: "
                f"{_clip(str(exc))})",
            )
        except requests.RequestException as exc:
            return self._request_failure(exc)

    def _request_failure(self, exc: requests.RequestException) -> MissingObservation:
        # The innermost cause says what happened ("Connection refused"); the outer ones
        # repeat the whole query URL.
        cause = _causes(exc)[-1]
        detail = f"{self._endpoint}: {type(cause).__name__}: {_clip(str(cause))}"
        if _is_timeout(exc):
            timeout = self._config.metric_pulling_prometheus_request_timeout_seconds
            return MissingObservation(
                MissingReason.PROMETHEUS_TIMEOUT, f"no answer within {timeout:g} s; {detail}"
            )
        if isinstance(exc, requests.ConnectionError):
            return MissingObservation(MissingReason.PROMETHEUS_UNREACHABLE, detail)
        return MissingObservation(MissingReason.PROMETHEUS_ERROR, detail)

    def _headers(self) -> dict[str, str] | MissingObservation:
        token = self._config.metric_pulling_prometheus_token
        token_file = self._config.metric_pulling_prometheus_token_file
        if token_file:
            # Re-read each time: projected service-account tokens are rotated in place.
            try:
                token = Path(token_file).read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as exc:
                return MissingObservation(
                    MissingReason.TOKEN_UNREADABLE, f"token file {token_file}: {exc}"
                )
            if not token:
                return MissingObservation(
                    MissingReason.TOKEN_UNREADABLE, f"token file {token_file} is empty"
                )
        return {"Authorization": f"Bearer {token}"} if token else {}

    def _note_count_metric(self, used: str | None) -> None:
        if used is not None and used != self._count_metric_used:
            if used == "requests_finished":
                logger.warning(
                    "%s has no series matching %s; counting requests with %s instead, "
                    "which undercounts demand while requests queue",
                    self._metrics.requests_started,
                    self.selector,
                    self._metrics.requests_finished,
                )
            elif self._count_metric_used is not None:
                logger.info("counting requests with %s again", self._metrics.requests_started)
            self._count_metric_used = used

    @staticmethod
    def _parse_extra_params(query_string: str | None) -> dict[str, str]:
        params: dict[str, str] = {}
        for key, value in parse_qsl(query_string or "", keep_blank_values=True):
            if key in _RESERVED_PARAMS:
                logger.warning(
                    "ignoring extra Prometheus query parameter %r: the observer sets it", key
                )
                continue
            params[key] = value
        return params

    def close(self) -> None:
        """Close the HTTP session."""
        self._client.close()

    def __enter__(self) -> PrometheusTrafficObserver:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _BadResponse(Exception):
    """The body parsed as JSON but is not the instant vector the query returns."""


def _parse_vector(vector: Any) -> tuple[WindowIncreases, float | None]:
    """Split the tagged vector into per-part increases, and the evaluation time."""
    if not isinstance(vector, list):
        raise _BadResponse(f"result is a {type(vector).__name__}, expected an instant vector")
    known = {"requests_started", "requests_finished", "in_flight", *SPEC_DECODE_COUNTERS}
    for item in HISTOGRAM_INPUTS:
        known |= {f"{item.key}_sum", f"{item.key}_count"}
    scalars: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    eval_s: float | None = None
    for index, sample in enumerate(vector):
        labels, timestamp, value = _parse_sample(sample, index)
        eval_s = timestamp if eval_s is None else eval_s
        part = labels.get(PART_LABEL, "")
        key = part.removesuffix("_bucket")
        if part.endswith("_bucket") and key in DISTRIBUTION_INPUTS:
            le = _parse_float(labels.get("le"), f"result[{index}] label le")
            if le in buckets.setdefault(key, {}):
                raise _BadResponse(f"result[{index}]: bucket le={le:g} of {part} repeated")
            buckets[key][le] = value
        elif part in known:
            if part in scalars:
                raise _BadResponse(f"result[{index}]: part {part!r} repeated")
            scalars[part] = value
        else:
            raise _BadResponse(f"result[{index}]: unexpected {PART_LABEL}={part!r}")
    increases = WindowIncreases(
        requests_started=scalars.get("requests_started"),
        requests_finished=scalars.get("requests_finished"),
        sums=_by_input(scalars, "_sum"),
        counts=_by_input(scalars, "_count"),
        buckets=buckets,
        in_flight=scalars.get("in_flight"),
        spec_counters={k: v for k, v in scalars.items() if k in SPEC_DECODE_COUNTERS},
    )
    return increases, eval_s


def _parse_matrix(matrix: Any) -> tuple[SeriesSamples, ...]:
    """The series of a range-vector result, each with its samples oldest first."""
    if not isinstance(matrix, list):
        raise _BadResponse(f"result is a {type(matrix).__name__}, expected a range vector")
    series: list[SeriesSamples] = []
    for index, item in enumerate(matrix):
        labels = item.get("metric") if isinstance(item, dict) else None
        values = item.get("values") if isinstance(item, dict) else None
        if not isinstance(labels, dict) or not isinstance(values, list):
            raise _BadResponse(f"result[{index}] lacks 'metric' labels or 'values'")
        samples: list[tuple[float, float]] = []
        for pair in values:
            if not isinstance(pair, list) or len(pair) != 2:
                raise _BadResponse(f"result[{index}] value {pair!r} is not a [time, value] pair")
            samples.append(
                (
                    _parse_float(pair[0], f"result[{index}] timestamp"),
                    _parse_float(pair[1], f"result[{index}] value"),
                )
            )
        name = labels.get("__name__", "")
        rendered = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
        series.append(SeriesSamples(f"{name}{{{rendered}}}", tuple(sorted(samples))))
    return tuple(series)


def _by_input(scalars: Mapping[str, float], suffix: str) -> dict[str, float]:
    return {i.key: scalars[i.key + suffix] for i in HISTOGRAM_INPUTS if i.key + suffix in scalars}


def _parse_sample(sample: Any, index: int) -> tuple[Mapping[str, str], float, float]:
    if not isinstance(sample, dict):
        raise _BadResponse(f"result[{index}] is a {type(sample).__name__}, expected an object")
    labels = sample.get("metric")
    pair = sample.get("value")
    if not isinstance(labels, dict) or not isinstance(pair, list) or len(pair) != 2:
        raise _BadResponse(f"result[{index}] lacks 'metric' labels or a [time, value] pair")
    timestamp = _parse_float(pair[0], f"result[{index}] timestamp")
    if not isinstance(pair[1], str):
        raise _BadResponse(f"result[{index}] value {pair[1]!r} is not a string")
    return labels, timestamp, _parse_float(pair[1], f"result[{index}] value")


def _parse_float(raw: Any, what: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise _BadResponse(f"{what} is {raw!r}, expected a number")
    try:
        return float(raw)
    except ValueError:
        raise _BadResponse(f"{what} is {raw!r}, expected a number") from None


def _range(duration_s: float) -> str:
    # Whole milliseconds: PromQL durations take no fractions.
    return f"{max(1, round(duration_s * 1000))}ms"


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and what it wraps (requests -> urllib3 MaxRetryError -> reason), outermost first."""
    chain: list[BaseException] = []
    pending: list[Any] = [exc]
    while pending:
        current = pending.pop(0)
        if not isinstance(current, BaseException) or any(current is c for c in chain):
            continue
        chain.append(current)
        pending += [*current.args, getattr(current, "reason", None), current.__cause__]
    return chain


def _is_timeout(exc: BaseException) -> bool:
    """Whether a requests failure was a timeout, however deep urllib3 wrapped it."""
    chain = _causes(exc)
    # urllib3 2 derives "connection refused" (NewConnectionError) from ConnectTimeoutError.
    if any(isinstance(c, NewConnectionError) for c in chain):
        return False
    return any(isinstance(c, requests.Timeout | Urllib3TimeoutError) for c in chain)


def _clip(text: str) -> str:
    return text if len(text) <= _DETAIL_LIMIT else text[:_DETAIL_LIMIT] + "..."
