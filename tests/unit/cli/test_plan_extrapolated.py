"""`planner plan` flags the profile points it sized on outside the profiled samples, with the
note `planner profile show` prints for the same point."""

from __future__ import annotations

import json

import pytest

from disagg_planner.cli.main import main

PROFILE = "h200_sxm/vllm/llama-3.1-8b-fp8/tp1"  # bundled


def run(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(list(args)) == 0
    return capsys.readouterr().out


def plan(*extra: str, isl: str = "3000", osl: str = "300") -> list[str]:
    return ["plan", "--profile", PROFILE, "--num-req", "3000", "--isl", isl, "--osl", osl,
            "--interval", "60", *extra]  # fmt: skip


def show(isl: str, osl: str, itl: str) -> list[str]:
    return ["profile", "show", PROFILE, "--isl", isl, "--osl", osl, "--itl", itl, "--json"]


def test_the_readme_plan_flags_its_extrapolated_decode_point(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # the README's example: at the default 50 ms ITL target the best decode point at context
    # 3150 fills the KV cache (usage 1.0), beyond the profiled samples
    text = run(capsys, *plan()).splitlines()
    decode_line = next(i for i, line in enumerate(text) if line.startswith("decode: "))
    shown = json.loads(run(capsys, *show("3000", "300", "50")))["decode"]
    assert shown["extrapolated"] is True
    assert text[decode_line + 1] == f"  decode profile point extrapolated: {shown['note']}"
    assert not any("prefill profile point" in line for line in text)  # ISL 3000 is profiled

    data = json.loads(run(capsys, *plan("--json")))
    assert data["profile_points"]["decode"] == shown
    # the point flagged is the one the decode replicas were sized on
    assert data["decode_thpt_per_gpu"] == pytest.approx(shown["best_thpt_per_gpu"])
    assert data["profile_points"]["prefill"]["extrapolated"] is False


def test_a_plan_inside_the_profiled_samples_flags_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = run(capsys, *plan("--itl-ms", "20"))
    assert "extrapolated" not in text
    data = json.loads(run(capsys, *plan("--itl-ms", "20", "--json")))
    points = data["profile_points"]
    assert points["decode"]["extrapolated"] is False and points["prefill"]["extrapolated"] is False
    assert points["decode"]["itl_target_ms"] == 20


def test_a_prompt_beyond_the_profiled_isls_flags_the_prefill_point(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = run(capsys, *plan(isl="200000", osl="100")).splitlines()
    shown = json.loads(run(capsys, *show("200000", "100", "50")))["prefill"]
    assert shown["extrapolated"] is True
    prefill_line = next(i for i, line in enumerate(text) if line.startswith("prefill: "))
    assert text[prefill_line + 1] == f"  prefill profile point extrapolated: {shown['note']}"
