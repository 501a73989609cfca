"""What ``planner replay`` does with prompts the engine would refuse and with an initial
sizing far above the load: prompts longer than the model's context are refused as vLLM
refuses them (client errors, counted, warned about, not sized for), and no initial sizing
exceeds the GPU budget or a sane bound without saying why (the README's Mooncake example
once started every policy at 838 prefill replicas, silently)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from disagg_planner.cli.main import main
from disagg_planner.config import load_config
from disagg_planner.replay.bounds import OVERSIZED_FACTOR, OVERSIZED_SLACK_GPUS
from disagg_planner.replay.default_workload import replay_config
from disagg_planner.replay.oracle import initial_replicas
from disagg_planner.replay.session import ORACLE_WINDOW_S, ReplayPlan, WorkloadSpec, prepare

PROFILE = "h200_sxm/vllm/llama-3.1-8b-fp8/tp1"
SHORT_CONTEXT = "sim:llama-3.1-8b-fp8@h200_sxm:tp1:max_model_len=4096"
FAST = ["--no-progress", "--json", "--adjustment-interval", "10", "--startup-delay", "5"]


def mooncake(path: Path, rows: list[tuple[int, int]]) -> Path:
    """A Mooncake trace of (arrival ms, prompt tokens) rows, 20 output tokens each."""
    lines = [
        json.dumps({"timestamp": t_ms, "input_length": isl, "output_length": 20})
        for t_ms, isl in rows
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def plan_of(workload: WorkloadSpec, engine: str | None = None, **settings: object) -> ReplayPlan:
    loaded = load_config(config_arg=None, flags={"profile": PROFILE, **settings})
    return prepare(replay_config(loaded, default_run=False), workload, engine=engine)


@pytest.mark.slow
def test_prompts_beyond_the_context_are_refused_counted_and_not_sized_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # one in six prompts of 5,000 tokens, which do not fit a 4,096-token context
    rows = [(i * 500, 5000 if i % 6 == 4 else 400) for i in range(60)]
    long_ones = sum(1 for _, isl in rows if isl > 4096)
    trace = mooncake(tmp_path / "t.jsonl", rows)
    args = ["--trace", str(trace), "--engine", SHORT_CONTEXT, "--profile", PROFILE]
    assert main(["replay", "-o", str(tmp_path / "o"), *FAST, *args]) == 0
    out, err = capsys.readouterr()
    assert (
        f"{long_ones} of 60 requests exceed the engines' max_model_len (prefill 4096, "
        "decode 4096 tokens, prompt plus output): the engine refuses them on arrival" in err
    )
    summary = json.loads(out)
    assert summary["failed"] == long_ones and summary["completed"] == 60 - long_ones
    # The sizing is that of the requests the engine admits: as if the others never came.
    admitted = mooncake(tmp_path / "a.jsonl", [(t, isl) for t, isl in rows if isl <= 4096])
    with_refused = plan_of(WorkloadSpec(trace=str(trace)), SHORT_CONTEXT)
    without = plan_of(WorkloadSpec(trace=str(admitted)), SHORT_CONTEXT)
    assert with_refused.needs == without.needs
    assert with_refused.setup.initial_replicas == without.setup.initial_replicas


def test_an_initial_sizing_far_above_the_load_is_bounded_and_explained(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # 20,000-token prompts cannot meet a 500 ms TTFT target: the capacity model asks for
    # as many prefill replicas as it can name.
    workload = WorkloadSpec(workload="poisson:rate=3,isl=20000,osl=100,duration=300")
    with caplog.at_level(logging.WARNING):
        plan = plan_of(workload)
    start = plan.setup.initial_replicas
    (warning,) = [r.getMessage() for r in caplog.records if "initial replicas" in r.getMessage()]
    assert "are sized to hold the TTFT target of 500 ms for the windows' mean prompt" in warning
    assert f"starting with {start}" in warning and "--initial ROLE=N" in warning
    gpus = sum(start.values())  # one GPU per replica here
    assert 2 <= gpus < 1000
    fluid_gpus = float(warning.split(" the ")[1].split(" GPUs")[0])
    assert gpus <= OVERSIZED_FACTOR * fluid_gpus + OVERSIZED_SLACK_GPUS + 1


def test_an_initial_sizing_never_exceeds_the_gpu_budget(caplog: pytest.LogCaptureFixture) -> None:
    workload = WorkloadSpec(workload="poisson:rate=3,isl=20000,osl=100,duration=300")
    with caplog.at_level(logging.WARNING):
        plan = plan_of(workload, max_gpu_budget=6)
    assert sum(plan.setup.initial_replicas.values()) <= 6
    assert any("exceed max_gpu_budget 6: starting with" in r.getMessage() for r in caplog.records)


def test_a_sane_sizing_is_left_alone(caplog: pytest.LogCaptureFixture) -> None:
    workload = WorkloadSpec(workload="poisson:rate=3,isl=2000,osl=200,duration=300")
    with caplog.at_level(logging.WARNING):
        plan = plan_of(workload)
    assert not [r for r in caplog.records if "initial replicas" in r.getMessage()]
    lead_s = 120.0 + plan.config.throughput_adjustment_interval_seconds
    sized = initial_replicas(plan.needs, window_s=ORACLE_WINDOW_S, lead_s=lead_s)
    assert plan.setup.initial_replicas == sized
