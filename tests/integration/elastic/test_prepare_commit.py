"""The bare-vLLM client and controller against a stand-in of current vLLM's prepare/commit
resize (conftest.py, :class:`FakeCurrentVllmEngine`): issue 32, items 1 and 5."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

import pytest

from disagg_planner.connectors.elastic_ep import (
    DrainTimeout,
    PartialReconfiguration,
    ResizeOutcome,
    ResizeRefused,
    VllmElasticEpAdmin,
)
from tests.integration.elastic.test_admin_api import controller


def _post(url: str) -> int:
    request = urllib.request.Request(
        url, data=b"{}", headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


async def test_a_drain_408_after_a_long_preparation_keeps_the_size_and_later_resizes_work(
    current_engine_factory,
):
    """Issue 32, item 1: the drain's 408 arrives at prepare + drain_timeout, past the old
    elapsed-time window; the phase ("idle" again) says the engine kept its size, so the
    planner is not wedged."""
    engine = current_engine_factory(dp=16, prepare_s=1.0, drain_requests=True)
    engine.stuck_requests = True
    admin = VllmElasticEpAdmin(
        engine.url, drain_timeout_s=1, drains_requests=True, drain_grace_s=0.3
    )

    with pytest.raises(DrainTimeout, match=r"408 .*back to phase 'idle'.*keeps its size"):
        await admin.scale(20, timeout_s=10)
    assert engine.dp == 16 and engine.phase == "idle"

    engine.stuck_requests = False
    assert await admin.scale(20, timeout_s=10) == "Scaled to 20 data parallel engines"
    assert engine.dp == 20


async def test_a_commit_that_fails_leaves_the_engine_committing_a_partial_reconfiguration(
    current_engine_factory,
):
    engine = current_engine_factory(dp=16)
    engine.commit_fails = True
    ctl = controller(engine.url)

    with pytest.raises(PartialReconfiguration, match=r"still reports phase 'committing'"):
        await ctl.resize(20)
    assert await ctl.is_resizing() is True  # the policy holds


async def test_a_preparation_that_times_out_keeps_the_size(current_engine_factory):
    engine = current_engine_factory(dp=16)
    engine.prepare_times_out = True
    ctl = controller(engine.url)

    with pytest.raises(ResizeRefused, match=r"408 .*back to phase 'idle'.*keeps its size"):
        await ctl.resize(20)
    assert await ctl.current_dp() == 16
    engine.prepare_times_out = False
    assert (await ctl.resize(20)).dp == 20


async def test_the_503_window_is_the_commit_only_and_status_routes_stay_open(
    current_engine_factory,
):
    """During the preparation the engine serves (no 503, phase idle); during the commit every
    path but /health and /is_scaling_elastic_ep answers 503."""
    engine = current_engine_factory(dp=16, prepare_s=0.6, commit_s=0.6)
    admin = VllmElasticEpAdmin(engine.url, phase_poll_s=0.05)
    resize = asyncio.create_task(admin.scale(20, timeout_s=10))
    await asyncio.sleep(0.3)

    assert await admin.phase() == "idle" and await admin.is_scaling() is False
    assert await asyncio.to_thread(_post, engine.url + "/v1/completions") == 404  # served

    await asyncio.sleep(0.6)
    assert await admin.phase() == "committing" and await admin.is_scaling() is True
    assert await asyncio.to_thread(_post, engine.url + "/v1/completions") == 503
    assert await asyncio.to_thread(_post, engine.url + "/health") == 200

    assert await resize == "Scaled to 20 data parallel engines"


async def test_the_pause_is_measured_from_the_phase(current_engine_factory):
    """Issue 32, item 5: the resize's pause (phase "committing") and total are measured,
    not taken from the configured mode."""
    engine = current_engine_factory(dp=16, prepare_s=0.8, commit_s=0.5)
    ctl = controller(engine.url)
    ctl.admin.phase_poll_s = 0.05  # type: ignore[attr-defined]

    result = await ctl.resize(20)

    assert result.outcome is ResizeOutcome.RESIZED
    assert result.resize_s is not None and result.resize_s >= 1.3
    assert result.pause_s is not None and 0.3 <= result.pause_s < 1.0


async def test_the_shrink_floor_is_read_from_the_400(current_engine_factory):
    """Issue 32, item 5: vLLM answers its expert-capacity floor as a 400 with the text."""
    engine = current_engine_factory(dp=24, min_dp=20)
    admin = VllmElasticEpAdmin(engine.url)

    with pytest.raises(ResizeRefused, match="minimum is 20") as refused:
        await admin.scale(16, timeout_s=5)
    assert refused.value.status == 400 and refused.value.minimum_dp == 20
    assert engine.dp == 24
