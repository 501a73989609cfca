"""Issue 35: in replay, a planner told the draft length but not the accept length sizes decode
by the accept length it observes from the simulated engines' speculative-decoding counters,
as the live planner does from vLLM's."""

from __future__ import annotations

import re

import pytest

from disagg_planner.config import PlannerConfig
from disagg_planner.replay.session import WorkloadSpec, prepare, run

PROFILE = "h200_sxm/vllm/llama-3.1-8b-fp8/tp1"
ACCEPT = 2.5
OBSERVED = re.compile(r"spec_decode_accept: decode work / ([0-9.]+) \(observed accept length\)")


def _decision_messages(engine: str, **settings: object) -> list[str]:
    cfg = PlannerConfig(
        profile=PROFILE,
        mode="disagg",
        ttft_ms=500,
        itl_ms=20,
        max_gpu_budget=-1,
        throughput_adjustment_interval_seconds=60,
        **settings,
    )
    workload = WorkloadSpec(workload="poisson:rate=10,duration=240,isl=2000,osl=200")
    plan = prepare(cfg, workload, engine=engine, startup_delay_s=30.0)
    result = run(plan, "planner", progress=False, references=False, write_report=False)
    return [row.message for row in result.timeline if row.event == "tick"]


def test_the_observed_accept_length_reaches_the_decode_sizing() -> None:
    messages = _decision_messages(
        f"sim:llama-3.1-8b-fp8@h200_sxm:tp1:nextn=3:accept={ACCEPT}", num_speculative_tokens=3
    )
    seen = [float(m.group(1)) for text in messages if (m := OBSERVED.search(text))]
    assert seen, messages
    # 199 tokens after the first in ceil(199 / 2.5) = 80 steps: 199 / 80 per step
    assert seen[-1] == pytest.approx(199 / 80, abs=0.005)
    assert not any("configured accept length" in text for text in messages)


def test_engines_that_do_not_speculate_leave_decode_undiscounted_and_say_so() -> None:
    messages = _decision_messages("sim:llama-3.1-8b-fp8@h200_sxm:tp1", num_speculative_tokens=3)
    assert not any(OBSERVED.search(text) for text in messages)
    assert any("accept length neither configured nor seen" in text for text in messages)
