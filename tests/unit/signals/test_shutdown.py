"""Reading a Dynamo worker's staged-shutdown page (``signals/shutdown.py``): what the drain
trusts, and what it refuses to read as "drained"."""

from __future__ import annotations

import pytest

from disagg_planner.signals.shutdown import (
    INFLIGHT_REQUESTS,
    KV_QUIESCENT,
    REMAINING_SECONDS,
    STAGE_SECONDS,
    TOTAL_BUDGET_ENV,
    TOTAL_BUDGET_LEGACY_ENV,
    ShutdownReading,
    read_shutdown,
    total_budget_s,
)


def page(*series: tuple[str, float, float, float], stage: bool = True) -> str:
    """A page with one series per endpoint: (endpoint, in flight, kv quiescent, remaining)."""
    lines = []
    if stage:
        lines.append(f'{STAGE_SECONDS}{{stage="router_grace",reason="completed"}} 5.0')
    for endpoint, inflight, kv, remaining in series:
        labels = f'{{dynamo_endpoint="{endpoint}"}}'
        lines += [
            f"{INFLIGHT_REQUESTS}{labels} {inflight}",
            f"{KV_QUIESCENT}{labels} {kv}",
            f"{REMAINING_SECONDS}{labels} {remaining}",
        ]
    return "\n".join(lines) + "\n"


def test_a_worker_with_several_endpoints_is_drained_only_when_all_are() -> None:
    """In-flight requests add up, the least remaining budget counts, one busy KV series (0)
    makes the worker busy, one unknown (-1) among idle ones makes it unknown."""
    assert read_shutdown(page(("generate", 0, 1, 12), ("clear_kv", 2, 1, 9))) == ShutdownReading(
        inflight=2, kv_quiescent=True, remaining_s=9.0, stage="router_grace", outcome="completed"
    )
    busy = read_shutdown(page(("generate", 0, 1, 12), ("clear_kv", 0, 0, 12)))
    assert isinstance(busy, ShutdownReading) and busy.kv_quiescent is False and not busy.drained
    unknown = read_shutdown(page(("generate", 0, 1, 12), ("clear_kv", 0, -1, 12)))
    assert isinstance(unknown, ShutdownReading) and unknown.kv_quiescent is None
    assert not unknown.drained
    done = read_shutdown(page(("generate", 0, 1, 3)))
    assert isinstance(done, ShutdownReading) and done.drained


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (page(("generate", 0, 1, 30), stage=False), "not shutting down"),
        (page(("generate", -1, 1, 30)), "expected whole numbers >= 0"),
        (page(("generate", 1.5, 1, 30)), "expected whole numbers >= 0"),
        (page(("generate", 0, 0.5, 30)), "expected 1, 0 or -1"),
        (page(("generate", 0, 1, float("inf"))), "not a finite number"),
        (page(("generate", float("nan"), 1, 30)), "not a finite number"),
        ("}{ not a page", "not Prometheus text"),
        # an older worker: Dynamo's other metrics, no shutdown gauge at all
        ("dynamo_component_requests_total 3\n", "a worker without the staged shutdown"),
    ],
)
def test_a_page_that_cannot_prove_a_drain_says_why(text: str, reason: str) -> None:
    answer = read_shutdown(text)
    assert isinstance(answer, str) and reason in answer, answer


def stages_page(*stages: tuple[str, str]) -> str:
    lines = [
        f'{STAGE_SECONDS}{{stage="{stage}",reason="{outcome}"}} 1.0' for stage, outcome in stages
    ]
    return "\n".join(
        [*lines, f"{INFLIGHT_REQUESTS} 0", f"{KV_QUIESCENT} -1", f"{REMAINING_SECONDS} 9"]
    )


@pytest.mark.parametrize(
    ("stages", "furthest", "serving_over"),
    [
        ((("unregister", "completed"), ("router_grace", "started")), "router_grace started", False),
        ((("inflight", "completed"), ("kv_transfer", "started")), "kv_transfer started", False),
        # the end of kv_transfer, whatever its outcome: the worker cancels what is left
        (
            (("kv_transfer", "started"), ("kv_transfer", "unsupported")),
            "kv_transfer unsupported",
            True,
        ),
        ((("kv_transfer", "skipped"),), "kv_transfer skipped", True),
        ((("inflight", "timed_out"), ("cleanup", "started")), "cleanup started", True),
        # a stage this planner does not know is no evidence
        ((("inflight", "started"), ("warp_drive", "completed")), "inflight started", False),
    ],
)
def test_the_furthest_stage_says_whether_the_worker_still_serves(
    stages: tuple[tuple[str, str], ...], furthest: str, serving_over: bool
) -> None:
    reading = read_shutdown(stages_page(*stages))
    assert isinstance(reading, ShutdownReading)
    assert (reading.stage_text, reading.serving_over) == (furthest, serving_over)


@pytest.mark.parametrize(
    ("env", "budget"),
    [
        ({}, None),
        ({TOTAL_BUDGET_ENV: "45"}, 45.0),
        ({TOTAL_BUDGET_LEGACY_ENV: "12"}, 12.0),
        ({TOTAL_BUDGET_ENV: "45", TOTAL_BUDGET_LEGACY_ENV: "12"}, 45.0),  # canonical first
        ({TOTAL_BUDGET_ENV: " ", TOTAL_BUDGET_LEGACY_ENV: "12"}, 12.0),  # empty: the alias
        ({TOTAL_BUDGET_ENV: "2.5"}, 30.0),  # not a positive whole number: Dynamo's default
        ({TOTAL_BUDGET_ENV: "0"}, 30.0),
        ({TOTAL_BUDGET_ENV: "999999999999"}, 30.0),
    ],
)
def test_the_declared_total_budget_is_read_as_the_worker_reads_it(
    env: dict[str, str], budget: float | None
) -> None:
    assert total_budget_s(env) == budget
