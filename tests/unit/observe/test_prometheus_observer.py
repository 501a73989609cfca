"""What the Prometheus observer sends and how it reads what comes back (canned API server)."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.core.demand import DemandSignals
from disagg_planner.core.types import Histogram, MissingObservation, TrafficObservation
from disagg_planner.observe import MissingReason, PrometheusTrafficObserver
from tests.unit.observe.canned_prometheus import (
    TLS_DIR,
    CannedPrometheus,
    Reply,
    matrix_reply,
    vector_reply,
)

FULL = {
    "requests_started": 12,
    "requests_finished": 10,
    "ttft_sum": 3.0,  # s
    "ttft_count": 10,
    "itl_sum": 8.0,  # s
    "itl_count": 400,
    "isl_sum": 30000,
    "isl_count": 10,
    "osl_sum": 1500,
    "osl_count": 10,
    "request_duration_sum": 45,
    "request_duration_count": 10,
}
ISL_BUCKETS = {"1024": 2, "4096": 9, "+Inf": 10}


@pytest.fixture
def api() -> Iterator[CannedPrometheus]:
    server = CannedPrometheus()
    yield server
    server.close()


def observer_for(url: str, **settings: Any) -> PrometheusTrafficObserver:
    settings.setdefault("model_name", "Meta-Llama/Llama-3.1-8B")
    settings.setdefault("namespace", "dyn-a")
    return PrometheusTrafficObserver(
        PlannerConfig(metric_pulling_prometheus_endpoint=url, **settings)
    )


def test_averages_units_and_distribution(api: CannedPrometheus) -> None:
    api.reply = vector_reply(FULL, buckets={"isl": ISL_BUCKETS}, at_s=1_700_000_123.5)
    obs = observer_for(api.url).observe(duration_s=60)
    assert obs == TrafficObservation(
        end_s=1_700_000_123.5,  # the server's evaluation time
        duration_s=60,
        num_req=12,  # started, not finished
        ttft_ms=300.0,
        itl_ms=20.0,
        isl=3000.0,
        osl=150.0,
        request_duration_s=4.5,
        isl_histogram=Histogram(bounds=(1024.0, 4096.0), counts=(2.0, 7.0), overflow=1.0),
        osl_histogram=None,
    )


def test_promql_filters_and_window(api: CannedPrometheus) -> None:
    observer_for(api.url).observe()
    (request,) = api.requests
    assert request.path == "/api/v1/query"
    query = request.param("query")
    selector = r'{model=~"(?i)meta\\-llama/llama\\-3\\.1\\-8b",dynamo_namespace="dyn-a"}'
    window = "[180000ms]"  # the default throughput adjustment interval
    for part in (
        f"sum(increase(dynamo_frontend_requests_started_total{selector}{window}))",
        f"sum(increase(dynamo_frontend_requests_total{selector}{window}))",
        f"sum(increase(dynamo_frontend_time_to_first_token_seconds_sum{selector}{window}))",
        f"sum(increase(dynamo_frontend_inter_token_latency_seconds_count{selector}{window}))",
        f"sum by (le) (increase(dynamo_frontend_input_sequence_tokens_bucket{selector}{window}))",
        f"sum by (le) (increase(dynamo_frontend_output_sequence_tokens_bucket{selector}{window}))",
        f"sum(increase(dynamo_frontend_request_duration_seconds_sum{selector}{window}))",
    ):
        assert part in query
    assert "time" not in request.params  # evaluated at the server's now


def test_router_source_names_and_namespace(api: CannedPrometheus) -> None:
    observer_for(api.url, namespace="team-a-graph", throughput_metrics_source="router").observe(
        duration_s=30
    )
    query = api.requests[0].param("query")
    assert 'dynamo_namespace="team_a_graph"' in query
    assert "sum(increase(dynamo_component_router_requests_total{" in query
    assert "dynamo_frontend" not in query


def test_quotes_in_names_stay_inside_the_string(api: CannedPrometheus) -> None:
    observer_for(api.url, model_name='a"b', namespace='x"y').observe(duration_s=30)
    query = api.requests[0].param("query")
    assert r'model=~"(?i)a\"b"' in query
    assert r'dynamo_namespace="x\"y"' in query


def test_no_model_name_filters_by_namespace_only(api: CannedPrometheus) -> None:
    observer_for(api.url, model_name=None).observe(duration_s=30)
    assert "model=~" not in api.requests[0].param("query")


def test_end_time_and_extra_params_on_every_request(api: CannedPrometheus) -> None:
    observer = observer_for(
        api.url, metric_pulling_prometheus_extra_query_params="dedup=true&partial_response=false"
    )
    observer.observe(end_s=1_700_000_000.25, duration_s=30)
    observer.observe(duration_s=30)
    first, second = api.requests
    assert first.param("time") == "1700000000.250"
    for request in (first, second):
        assert request.param("dedup") == "true"
        assert request.param("partial_response") == "false"


def test_extra_params_cannot_replace_query_or_time(api: CannedPrometheus) -> None:
    observer = observer_for(api.url, metric_pulling_prometheus_extra_query_params="time=5&a=1")
    observer.observe(end_s=1_700_000_000, duration_s=30)
    (request,) = api.requests
    assert request.params["time"] == ["1700000000.000"]
    assert request.param("a") == "1"


def test_static_bearer_token(api: CannedPrometheus) -> None:
    observer_for(api.url, metric_pulling_prometheus_token="s3cret").observe(duration_s=30)
    assert api.requests[0].headers["Authorization"] == "Bearer s3cret"


def test_no_token_sends_no_authorization(api: CannedPrometheus) -> None:
    observer_for(api.url).observe(duration_s=30)
    assert "Authorization" not in api.requests[0].headers


def test_token_file_is_reread_on_each_request(api: CannedPrometheus, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    observer = observer_for(api.url, metric_pulling_prometheus_token_file=str(token))
    observer.observe(duration_s=30)
    token.write_text("rotated")  # as the kubelet does with projected tokens
    observer.observe(duration_s=30)
    assert [r.headers["Authorization"] for r in api.requests] == [
        "Bearer first",
        "Bearer rotated",
    ]


@pytest.mark.parametrize("content", [None, "", "  \n"], ids=["missing", "empty", "blank"])
def test_unreadable_token_file_is_missing_without_a_request(
    api: CannedPrometheus, tmp_path: Path, content: str | None
) -> None:
    token = tmp_path / "token"
    if content is not None:
        token.write_text(content)
    obs = observer_for(api.url, metric_pulling_prometheus_token_file=str(token)).observe()
    assert isinstance(obs, MissingObservation)
    assert obs.reason == MissingReason.TOKEN_UNREADABLE
    assert str(token) in obs.detail
    assert api.requests == []


def test_zero_traffic_is_not_missing(api: CannedPrometheus) -> None:
    # Dynamo issue #6985: an idle window is an observation (0 requests), not a hold.
    idle = {name: 0 for name in FULL}
    api.reply = vector_reply(idle, buckets={"isl": {"1024": 0, "+Inf": 0}})
    obs = observer_for(api.url).observe(duration_s=60)
    assert isinstance(obs, TrafficObservation)
    assert obs.num_req == 0
    assert (obs.ttft_ms, obs.itl_ms, obs.isl, obs.osl, obs.request_duration_s) == (None,) * 5
    assert obs.isl_histogram == Histogram(bounds=(1024.0,), counts=(0.0,), overflow=0.0)


def test_speculative_decoding_counters_give_the_accept_length(api: CannedPrometheus) -> None:
    # vLLM's counters over the engines: 1 + accepted / drafts (Dynamo's planner reads the same)
    api.reply = vector_reply({**FULL, "spec_accepted": 3540, "spec_drafts": 2000})
    observer = observer_for(api.url)
    obs = observer.observe(duration_s=60)
    assert isinstance(obs, TrafficObservation)
    assert obs.accept_length == pytest.approx(2.77)
    assert obs.accept_length_missing is None
    query = api.requests[0].param("query")
    selector = r'{model=~"(?i)meta\\-llama/llama\\-3\\.1\\-8b",dynamo_namespace="dyn-a"}'
    for counter in (
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:spec_decode_num_drafts_total",
    ):
        assert f"sum(increase({counter}{selector}[60000ms]))" in query
    # the rule reads it when no accept length is configured, and says so
    demand = DemandSignals()
    demand.observe(obs)
    rule = demand.rules(PlannerConfig(num_speculative_tokens=7)).accept
    assert rule.value == pytest.approx(2.77)
    assert rule.reason == "spec_decode_accept: decode work / 2.77 (observed accept length)"


@pytest.mark.parametrize(
    ("parts", "why"),
    [
        pytest.param({}, None, id="no engine speculates: nothing to say"),
        pytest.param(
            {"spec_accepted": 0, "spec_drafts": 0},
            "no speculative drafts in the window",
            id="idle engines",
        ),
        pytest.param(
            {"spec_accepted": 10, "spec_drafts": "NaN"},
            "increase of vllm:spec_decode_num_drafts_total is nan, expected a finite number",
            id="NaN",
        ),
        pytest.param(
            {"spec_accepted": -4, "spec_drafts": 10},
            "increase of vllm:spec_decode_num_accepted_tokens_total is -4.0",
            id="negative",
        ),
        pytest.param(
            {"spec_drafts": 10},
            "no series of vllm:spec_decode_num_accepted_tokens_total",
            id="one counter without series",
        ),
    ],
)
def test_bad_or_missing_speculative_counters_fall_back_with_the_reason(
    api: CannedPrometheus, parts: dict[str, float | str], why: str | None
) -> None:
    api.reply = vector_reply({**FULL, **parts})
    obs = observer_for(api.url).observe(duration_s=60)
    # the traffic itself is still observed: an engine counter never makes it missing
    assert isinstance(obs, TrafficObservation), obs
    assert (obs.num_req, obs.accept_length) == (12, None)
    if why is None:
        assert obs.accept_length_missing is None
    else:
        assert obs.accept_length_missing is not None and why in obs.accept_length_missing
    demand = DemandSignals()
    demand.observe(obs)
    rule = demand.rules(PlannerConfig(num_speculative_tokens=7)).accept
    assert rule.value == 1.0
    assert rule.reason.startswith("spec_decode_accept: none (accept length neither configured")
    assert why is None or why in rule.reason


def test_started_requests_without_finished_ones_leave_averages_undefined(
    api: CannedPrometheus,
) -> None:
    api.reply = vector_reply({"requests_started": 3, "ttft_sum": 0, "ttft_count": 0})
    obs = observer_for(api.url).observe(duration_s=60)
    assert isinstance(obs, TrafficObservation)
    assert (obs.num_req, obs.ttft_ms) == (3, None)


def test_falls_back_to_finished_requests_once_logged(
    api: CannedPrometheus, caplog: pytest.LogCaptureFixture
) -> None:
    legacy = {k: v for k, v in FULL.items() if k != "requests_started"}
    api.reply = vector_reply(legacy)
    observer = observer_for(api.url)
    with caplog.at_level(logging.WARNING, logger="disagg_planner.observe"):
        first = observer.observe(duration_s=60)
        second = observer.observe(duration_s=60)
    assert isinstance(first, TrafficObservation) and isinstance(second, TrafficObservation)
    assert first.num_req == 10
    assert observer.count_metric_used == "requests_finished"
    fallback_logs = [r for r in caplog.records if "dynamo_frontend_requests_total" in r.message]
    assert len(fallback_logs) == 1  # a state change, not a message per tick


def test_window_the_counter_does_not_cover_is_missing(api: CannedPrometheus) -> None:
    api.reply = vector_reply(FULL, at_s=1_700_000_060.0)
    # Frontend "a" covers the window; "b" was first scraped 50 s into it.
    api.samples_reply = matrix_reply(
        {
            "a": [(1_700_000_000.0 + t, t) for t in range(5, 60, 15)],
            "b": [(1_700_000_050.0 + t, t) for t in range(0, 10, 2)],
        }
    )
    obs = observer_for(api.url, metric_pulling_prometheus_extra_query_params="dedup=true").observe(
        duration_s=60
    )
    assert isinstance(obs, MissingObservation), obs
    assert obs.reason == MissingReason.PARTIAL_WINDOW
    assert 'pod="b"' in obs.detail and "last 10 s of the 60 s window (17% covered" in obs.detail
    _, samples = api.requests
    # The raw samples of the counter the increases came from, at the same evaluation time.
    selector = r'{model=~"(?i)meta\\-llama/llama\\-3\\.1\\-8b",dynamo_namespace="dyn-a"}'
    assert samples.param("query") == f"dynamo_frontend_requests_started_total{selector}[60000ms]"
    assert samples.param("time") == "1700000060.000"
    assert samples.param("dedup") == "true"


def test_unreadable_samples_are_missing(api: CannedPrometheus) -> None:
    api.reply = vector_reply(FULL)
    api.samples_reply = prometheus_error(503, "unavailable", "overloaded")
    obs = observer_for(api.url).observe(duration_s=60)
    assert isinstance(obs, MissingObservation)
    assert (obs.reason, "503" in obs.detail) == (MissingReason.PROMETHEUS_ERROR, True)
    api.samples_reply = body({"status": "success", "data": {"result": [{"metric": {}}]}})
    obs = observer_for(api.url).observe(duration_s=60)
    assert isinstance(obs, MissingObservation)
    assert (obs.reason, "'values'" in obs.detail) == (MissingReason.BAD_RESPONSE, True)


def prometheus_error(status: int, error_type: str, error: str) -> Reply:
    body = {"status": "error", "errorType": error_type, "error": error}
    return Reply(status=status, body=json.dumps(body).encode())


def body(payload: object) -> Reply:
    return Reply(body=json.dumps(payload).encode())


@pytest.mark.parametrize(
    ("reply", "reason", "in_detail"),
    [
        pytest.param(
            prometheus_error(400, "bad_data", "parse error"),
            MissingReason.PROMETHEUS_ERROR,
            "400",
            id="400 bad query",
        ),
        pytest.param(
            Reply(status=401, body=b"Unauthorized", content_type="text/plain"),
            MissingReason.PROMETHEUS_ERROR,
            "401",
            id="401 unauthorized",
        ),
        pytest.param(
            prometheus_error(503, "unavailable", "overloaded"),
            MissingReason.PROMETHEUS_ERROR,
            "503",
            id="503 unavailable",
        ),
        pytest.param(
            Reply(body=b"<html>login</html>", content_type="text/html"),
            MissingReason.BAD_RESPONSE,
            "not a Prometheus query response",
            id="html page",
        ),
        pytest.param(body([1, 2]), MissingReason.BAD_RESPONSE, "", id="json list"),
        pytest.param(
            body({"status": "success", "data": {"resultType": "scalar", "result": [1, "2"]}}),
            MissingReason.BAD_RESPONSE,
            "expected an object",
            id="scalar result",
        ),
        pytest.param(
            vector_reply({"requests_started": 1, "surprise": 1}),
            MissingReason.BAD_RESPONSE,
            "surprise",
            id="unknown part",
        ),
        pytest.param(
            vector_reply({**FULL, "ttft_sum": "NaN"}),
            MissingReason.BAD_RESPONSE,
            "ttft_sum",
            id="NaN value",
        ),
        pytest.param(
            vector_reply({"requests_started": "lots"}),
            MissingReason.BAD_RESPONSE,
            "lots",
            id="non-numeric value",
        ),
        pytest.param(
            vector_reply({"requests_started": -4}),
            MissingReason.BAD_RESPONSE,
            "requests_started",
            id="negative increase",
        ),
        pytest.param(
            vector_reply({}),
            MissingReason.NO_SERIES,
            'dynamo_namespace="dyn-a"',
            id="empty vector",
        ),
    ],
)
def test_failures_are_missing_with_a_reason(
    api: CannedPrometheus, reply: Reply, reason: MissingReason, in_detail: str
) -> None:
    api.reply = reply
    obs = observer_for(api.url).observe(duration_s=60)
    assert isinstance(obs, MissingObservation), obs
    assert obs.reason == reason
    assert in_detail in obs.detail
    assert len(api.requests) == 1  # no retries within a tick


def test_slow_prometheus_times_out(api: CannedPrometheus) -> None:
    api.reply = Reply(body=vector_reply(FULL).body, delay_s=2.0)
    observer = observer_for(api.url, metric_pulling_prometheus_request_timeout_seconds=0.2)
    obs = observer.observe(duration_s=60)
    assert isinstance(obs, MissingObservation)
    assert obs.reason == MissingReason.PROMETHEUS_TIMEOUT
    assert len(api.requests) == 1


def test_nothing_listening_is_unreachable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        obs = observer_for(f"http://127.0.0.1:{port}").observe(duration_s=60)
    assert isinstance(obs, MissingObservation)
    assert obs.reason == MissingReason.PROMETHEUS_UNREACHABLE
    assert "refused" in obs.detail.lower()


@pytest.fixture
def tls_api() -> Iterator[CannedPrometheus]:
    server = CannedPrometheus(tls=True, reply=vector_reply(FULL))
    yield server
    server.close()


def test_tls_unknown_ca_is_unreachable(tls_api: CannedPrometheus) -> None:
    obs = observer_for(tls_api.url).observe(duration_s=60)
    assert isinstance(obs, MissingObservation)
    assert obs.reason == MissingReason.PROMETHEUS_UNREACHABLE
    assert "certificate" in obs.detail.lower()


def test_tls_with_ca_bundle(tls_api: CannedPrometheus) -> None:
    observer = observer_for(
        tls_api.url, metric_pulling_prometheus_ca_bundle=str(TLS_DIR / "cert.pem")
    )
    assert isinstance(observer.observe(duration_s=60), TrafficObservation)


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_tls_without_verification(tls_api: CannedPrometheus) -> None:
    observer = observer_for(tls_api.url, metric_pulling_prometheus_ssl_verify=False)
    assert isinstance(observer.observe(duration_s=60), TrafficObservation)


@pytest.mark.parametrize("duration_s", [0.0, -1.0, float("nan"), float("inf")])
def test_invalid_duration_is_a_programming_error(api: CannedPrometheus, duration_s: float) -> None:
    with pytest.raises(ValueError, match="duration_s"):
        observer_for(api.url).observe(duration_s=duration_s)
