"""`planner plan`: one decision from given numbers, as JSON and as text."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from disagg_planner.cli.main import main
from tests.unit.core.conftest import write_h200_like_profile


@pytest.fixture(scope="module")
def profile_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_h200_like_profile(tmp_path_factory.mktemp("plan") / "h200")


def load_args(profile_dir: Path, num_req: int, *extra: str) -> list[str]:
    """``planner plan`` flags for ``num_req`` requests of ISL 3000 / OSL 300 in 60 s, with no
    GPU budget, plus ``extra``."""
    return [
        "--profile-results-dir",
        str(profile_dir),
        "--num-req",
        str(num_req),
        "--isl",
        "3000",
        "--osl",
        "300",
        "--interval",
        "60",
        "--max-gpu-budget",
        "-1",
        *extra,
    ]


def plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["plan", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_dynamo_worked_example(profile_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = plan_json(
        capsys,
        "--profile-results-dir",
        str(profile_dir),
        "--num-req",
        "10",
        "--isl",
        "3000",
        "--osl",
        "150",
        "--interval",
        "60",
    )
    assert out["prefill_replicas"] == 1 and out["decode_replicas"] == 1
    assert out["prefill_thpt_per_gpu"] == pytest.approx(40000, rel=0.01)
    assert set(out) >= {
        "prefill_replicas",
        "decode_replicas",
        "prefill_thpt_per_gpu",
        "decode_thpt_per_gpu",
        "reasons",
    }


def test_budget_caps_the_plan(profile_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = load_args(profile_dir, 9000, "--itl", "30", "--max-throughput-scaling-replicas", "100")
    free = plan_json(capsys, *args)
    capped = plan_json(capsys, *args, "--max-gpu-budget", "8")
    assert free["gpus"] > 8 >= capped["gpus"]
    assert capped["stages"]["proposed"] == free["stages"]["budget"]
    assert "max_gpu_budget" in capped["message"]


def test_text_output_shows_the_arithmetic(profile_dir: Path, capsys) -> None:
    args = ["plan", *load_args(profile_dir, 3000)]
    assert main([*args, "--ttft-attainment-target", "null"]) == 0
    out = capsys.readouterr().out
    assert "150,000 tok/s / (40,000 tok/s/GPU)" in out and "replicas: prefill=4" in out


def test_queueing_headroom_for_ttft_attainment(profile_dir: Path, capsys) -> None:
    args = load_args(profile_dir, 9000, "--max-throughput-scaling-replicas", "100")
    dynamo = plan_json(capsys, *args, "--ttft-attainment-target", "null")
    strict = plan_json(capsys, *args, "--ttft-attainment-target", "0.99")
    loose = plan_json(capsys, *args, "--ttft-attainment-target", "0.5")
    assert dynamo["prefill_utilisation"] == 1.0
    assert 0.2 <= strict["prefill_utilisation"] < loose["prefill_utilisation"] < 1.0
    assert strict["prefill_replicas"] > loose["prefill_replicas"] >= dynamo["prefill_replicas"]
    # the headroom is what the utilisation says, no more
    assert strict["prefill_replicas"] == math.ceil(
        dynamo["demand_tokens_per_s"]["prefill"]
        / (strict["prefill_thpt_per_gpu"] * strict["prefill_utilisation"])
    )


def test_bad_input_is_one_line(profile_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "plan",
                "--profile-results-dir",
                str(profile_dir / "nope"),
                "--num-req",
                "1",
                "--isl",
                "1",
                "--osl",
                "1",
            ]
        )
        == 2
    )
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert (
        main(
            [
                "plan",
                "--profile-results-dir",
                str(profile_dir),
                "--num-req",
                "-1",
                "--isl",
                "1",
                "--osl",
                "1",
            ]
        )
        == 2
    )
    assert "--num-req" in capsys.readouterr().err


def test_elastic_ep_on_a_dense_model_is_refused_not_ignored(capsys, tmp_path: Path) -> None:
    # replay drives elastic EP (tests/unit/replay/test_elastic_replay.py), on a MoE engine
    # only: the default dense 8B model has no expert-parallel group to resize
    code = main(
        [
            "replay",
            "--workload",
            "poisson:rate=1,isl=100,osl=10,duration=10",
            "--elastic-ep",
            "decode",
            "--elastic-ep-max-dp",
            "8",
            "--no-progress",
            "-o",
            str(tmp_path),
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "expert-parallel group of a MoE engine" in err
    assert "Traceback" not in err
