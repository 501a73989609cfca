"""``planner replay`` with several policies names the comparison page's winner under its
table, by the page's rule: the cheapest policy meeting the SLO target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from disagg_planner.cli.main import main
from disagg_planner.replay.parallel import output_dir_for

PROFILE = "h200_sxm/vllm/llama-3.1-8b-fp8/tp1"
WORKLOAD = "poisson:rate=2,duration=120,isl=1000,osl=100"
POLICIES = ("static:2,2", "static:1,1")


def test_several_policies_end_on_the_winner_and_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "o"
    args = ["replay", "--workload", WORKLOAD, "--profile", PROFILE, "--no-progress"]
    args += ["--no-references", "--startup-delay", "5", "--jobs", "1", "-o", str(out_dir)]
    # one replica of each serves 2 req/s of 1,000-token prompts: both meet the target, the
    # smaller deployment on fewer GPU-hours
    assert main([*args, *(a for p in POLICIES for a in ("--policy", p))]) == 0
    out = capsys.readouterr().out
    summaries = {
        p: json.loads((output_dir_for(out_dir, p, POLICIES) / "summary.json").read_text())
        for p in POLICIES
    }
    assert all(
        s["slo_attainment"]["both"] >= s["slo"]["attainment_target"] for s in summaries.values()
    ), summaries
    assert summaries["static:1,1"]["gpu_hours"] < summaries["static:2,2"]["gpu_hours"]
    winner = [line for line in out.splitlines() if line.startswith("winner: ")]
    assert winner == [
        "winner: static:1,1 (cheapest_meeting_target: the fewest GPU-hours "
        f"({summaries['static:1,1']['gpu_hours']:.2f}) of the 2 policies meeting the target)"
    ]
    # the table comes first, the page's path last
    lines = out.splitlines()
    assert lines.index(winner[0]) == len(lines) - 2 and "comparison.html" in lines[-1]


def test_one_policy_names_no_winner(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["replay", "--workload", WORKLOAD, "--profile", PROFILE, "--no-progress"]
    args += ["--no-references", "--startup-delay", "5", "-o", str(tmp_path / "o")]
    assert main([*args, "--policy", "static:1,1"]) == 0
    assert "winner" not in capsys.readouterr().out
