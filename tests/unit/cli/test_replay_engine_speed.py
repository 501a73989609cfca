"""``planner replay --engine sim:MODEL@GPU:tpN:speed=X``: the simulated engine runs at X times
the speed its profile says while the planner keeps that profile (issue 29's robustness to a
wrong profile); a bad speed ends with one line naming the spec and value, exit 2."""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

import numpy as np
import pytest

from disagg_planner.cli.main import main
from disagg_planner.config import PlannerConfig
from disagg_planner.replay.session import WorkloadSpec, prepare

PROFILE = "h200_sxm/vllm/llama-3.1-8b-fp8/tp1"
ENGINE = "sim:llama-3.1-8b-fp8@h200_sxm:tp1"
# light load on one prefill and one decode engine: latency is the engines' step times
LIGHT = "poisson:rate=1,isl=2000,osl=100,duration=60"
FAST = ["--no-progress", "--json", "--adjustment-interval", "10", "--startup-delay", "5"]


def replay(out: Path, *extra: str) -> int:
    return main(["replay", "-o", str(out), *FAST, *extra])


def medians(out: Path) -> tuple[float, float]:
    with (out / "requests.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["ok"] == "1" for r in rows)
    return (
        statistics.median(float(r["ttft_ms"]) for r in rows),
        statistics.median(float(r["itl_ms"]) for r in rows),
    )


@pytest.mark.slow
def test_a_half_speed_engine_takes_twice_the_step_time_under_the_same_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    static = ["--workload", LIGHT, "--policy", "static:1,1"]
    assert replay(tmp_path / "own", *static, "--engine", ENGINE) == 0
    assert replay(tmp_path / "half", *static, "--engine", f"{ENGINE}:speed=0.5") == 0
    (ttft, itl), (slow_ttft, slow_itl) = medians(tmp_path / "own"), medians(tmp_path / "half")
    # ITL is decode steps alone; TTFT adds the KV transfer, which the speed leaves alone
    assert slow_itl / itl == pytest.approx(2.0, rel=0.02)
    assert 1.7 < slow_ttft / ttft <= 2.0
    summary = json.loads((tmp_path / "half" / "summary.json").read_text())
    assert summary["engine"] == f"{ENGINE}:speed=0.5"
    assert summary["config"]["profile"] == PROFILE


def test_the_planner_sizes_from_the_profile_it_was_given() -> None:
    config = PlannerConfig(profile=PROFILE, ttft_ms=500, itl_ms=20, max_gpu_budget=-1)
    workload = WorkloadSpec(workload=LIGHT)
    own = prepare(config, workload, engine=ENGINE, startup_delay_s=5)
    half = prepare(config, workload, engine=f"{ENGINE}:speed=0.5", startup_delay_s=5)
    assert own.profile is not None and half.profile is not None
    assert half.profile.source_dir == own.profile.source_dir
    for role in ("prefill", "decode"):
        mine, theirs = getattr(half.profile, role).data, getattr(own.profile, role).data
        for field in vars(mine):
            np.testing.assert_array_equal(getattr(mine, field), getattr(theirs, field))
    # the simulated cluster is the slow one
    assert {s.speed for s in half.setup.specs.values()} == {0.5}


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("speed=0", "speed='0' must be a finite number > 0"),
        ("speed=-1", "speed='-1' must be a finite number > 0"),
        ("speed=nan", "speed='nan' must be a finite number > 0"),
        ("speed=half", "speed='half' is not a number"),
        ("speeed=0.5", "unknown option 'speeed'"),
    ],
)
@pytest.mark.parametrize(
    "engine",
    [ENGINE, pytest.param("aic:llama-3.1-8b-fp8@h200_sxm:vllm:tp1", marks=pytest.mark.aic)],
)
def test_a_bad_speed_ends_with_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], engine: str, option: str, message: str
) -> None:
    spec = f"{engine}:{option}"
    assert replay(tmp_path / "o", "--workload", LIGHT, "--engine", spec) == 2
    err = capsys.readouterr().err
    assert f"engine spec {spec!r}: {message}" in err
    assert "Traceback" not in err
