"""Reading a Dynamo worker's staged-shutdown page (``signals/shutdown.py``): what the drain
trusts, and what it refuses to read as "drained"."""

from __future__ import annotations

import pytest

from disagg_planner.signals.shutdown import (
    INFLIGHT_REQUESTS,
    KV_QUIESCENT,
    REMAINING_SECONDS,
    STAGE_SECONDS,
    ShutdownReading,
    read_shutdown,
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
        inflight=2, kv_quiescent=True, remaining_s=9.0
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
    ],
)
def test_a_page_that_cannot_prove_a_drain_says_why(text: str, reason: str) -> None:
    answer = read_shutdown(text)
    assert isinstance(answer, str) and reason in answer, answer
