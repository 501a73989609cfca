"""``planner profile show|plot|list`` through the real entry point."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from disagg_planner.cli.main import main
from disagg_planner.profiles import load_profile
from tests.unit.profiles.engine_model import Engine, write_dynamo_layout
from tests.unit.profiles.test_registry import MANIFEST, write_engine_profile

PREFILL_KEYS = {"isl", "ttft_ms", "thpt_per_gpu", "extrapolated", "note"}
DECODE_KEYS = {
    "context_length",
    "itl_target_ms",
    "best_thpt_per_gpu",
    "itl_ms",
    "kv_usage",
    "feasible",
    "extrapolated",
    "note",
}


@pytest.fixture
def dynamo_dir(tmp_path: Path) -> Path:
    return write_dynamo_layout(tmp_path / "H200_TP1P_TP1D", Engine().arrays())


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_show_json_on_a_dynamo_layout_profile(
    dynamo_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(
        capsys,
        "profile",
        "show",
        str(dynamo_dir),
        "--isl",
        "3000",
        "--osl",
        "150",
        "--itl",
        "10",
        "--json",
    )
    assert code == 0, err
    answer = json.loads(out)
    assert list(answer) == ["prefill", "decode", "max_kv_tokens"]
    assert set(answer["prefill"]) == PREFILL_KEYS
    assert set(answer["decode"]) == DECODE_KEYS
    profile = load_profile(dynamo_dir)
    assert answer["prefill"] == {
        "isl": 3000,
        "ttft_ms": profile.prefill.ttft_ms(3000),
        "thpt_per_gpu": profile.prefill.thpt_per_gpu(3000),
        "extrapolated": False,
        "note": None,
    }
    best = profile.decode.find_best_throughput_per_gpu(10, 3075)
    assert answer["decode"] == {
        "context_length": 3075,  # isl + osl/2
        "itl_target_ms": 10,
        "best_thpt_per_gpu": best.thpt_per_gpu,
        "itl_ms": best.itl_ms,
        "kv_usage": best.kv_usage,
        "feasible": True,
        "extrapolated": False,
        "note": None,
    }
    assert answer["max_kv_tokens"] == 200_000


def test_show_json_parts_follow_the_query(
    dynamo_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, _ = run(capsys, "profile", "show", str(dynamo_dir), "--isl", "50000", "--json")
    answer = json.loads(out)
    assert list(answer) == ["prefill", "max_kv_tokens"]
    assert answer["prefill"]["extrapolated"] is True
    assert "outside the profiled 100-16000" in answer["prefill"]["note"]
    # Extrapolated from the cost fit, not the profile's last value.
    assert answer["prefill"]["ttft_ms"] > 3 * load_profile(dynamo_dir).prefill.ttft_ms(16000)

    _, out, _ = run(
        capsys,
        "profile",
        "show",
        str(dynamo_dir),
        "--itl",
        "2.5",
        "--context-length",
        "4096",
        "--json",
    )
    answer = json.loads(out)
    assert list(answer) == ["decode", "max_kv_tokens"]
    decode = answer["decode"]
    assert decode["feasible"] is False and decode["best_thpt_per_gpu"] == 0.0
    assert decode["itl_ms"] > 2.5  # the lowest ITL there is

    _, out, _ = run(capsys, "profile", "show", str(dynamo_dir), "--json")
    assert json.loads(out) == {"max_kv_tokens": 200_000}


def test_show_text_answer_and_summary_table(
    dynamo_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, _ = run(
        capsys,
        "profile",
        "show",
        str(dynamo_dir),
        "--isl",
        "3000",
        "--itl",
        "2",
        "--context-length",
        "99999",
    )
    lines = out.splitlines()
    assert lines[0] == f"profile        {dynamo_dir}"
    assert lines[1] == "max_kv_tokens  200000"
    assert lines[2].startswith("prefill        ISL 3000: TTFT 83.")
    assert "infeasible: the lowest ITL at this context is" in lines[3]
    assert "(extrapolated: context 99999 is outside the profiled 512-16384" in lines[3]

    code, out, _ = run(capsys, "profile", "show", str(dynamo_dir))
    assert code == 0
    assert "prefill (7 points, TTFT cubic, throughput cubic)" in out
    assert "decode (56 points, contexts 512-16384" in out
    rows = [ln.split() for ln in out.splitlines() if ln.strip().startswith(("512", "16384"))]
    assert [r[0] for r in rows] == ["512", "16384"]
    # Best throughput per GPU falls with context length at every ITL target.
    assert all(float(a) > float(b) for a, b in zip(rows[0][1:], rows[1][1:], strict=True))


def test_show_by_bundled_name_with_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_engine_profile(tmp_path / "h200_sxm/vllm/llama-3.1-8b-fp8/tp1", MANIFEST)
    monkeypatch.setenv("PLANNER_PROFILES_DIR", str(tmp_path))
    code, out, _ = run(
        capsys, "profile", "show", "h200_sxm/vllm/llama-3.1-8b-fp8/tp1", "--isl", "1000"
    )
    assert code == 0
    assert "manifest       llama-3.1-8b-fp8 on h200_sxm, vllm, tp1, modelled" in out

    code, out, _ = run(capsys, "profile", "list")
    assert code == 0
    assert out == (
        "h200_sxm/vllm/llama-3.1-8b-fp8/tp1  llama-3.1-8b-fp8 on h200_sxm, vllm, tp1, modelled\n"
    )
    _, out, _ = run(capsys, "profile", "list", "--json")
    assert json.loads(out) == [
        {"name": "h200_sxm/vllm/llama-3.1-8b-fp8/tp1", "manifest": MANIFEST.to_dict()}
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--itl", "10"],
            "planner: invalid input: --itl needs --context-length, or --isl and "
            "--osl (context = isl + osl/2)",
        ),
        (["--isl", "abc"], "planner: invalid input: --isl must be a number, got 'abc'"),
        (["--osl", "-5"], "planner: invalid input: --osl must be a positive number, got '-5'"),
        (["--context-length", "100"], "planner: invalid input: --context-length needs --itl"),
    ],
)
def test_bad_queries_exit_2_with_one_line(
    dynamo_dir: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, out, err = run(capsys, "profile", "show", str(dynamo_dir), *args)
    assert code == 2
    assert out == ""
    assert len(err.splitlines()) == 1
    assert err.startswith(message)


def test_bad_profiles_exit_2_with_one_line(
    tmp_path: Path, dynamo_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "profile", "show", str(tmp_path / "missing"))
    assert code == 2
    assert err.startswith("planner: invalid profile: no profile directory")
    assert len(err.splitlines()) == 1

    arrays = Engine().arrays()
    arrays["z_itl"][7] = np.nan
    write_dynamo_layout(dynamo_dir, arrays)
    code, _, err = run(capsys, "profile", "show", str(dynamo_dir), "--json")
    assert code == 2
    decode_file = dynamo_dir / "selected_decode_interpolation/raw_data.npz"
    assert (
        err == f"planner: invalid profile: {decode_file}: z_itl[7] = nan: must be a finite number\n"
    )


def test_plot_writes_html_with_both_roles(
    dynamo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "profile.html"
    code, out, _ = run(capsys, "profile", "plot", str(dynamo_dir), "-o", str(target), "--cdn")
    assert code == 0 and out == f"wrote {target}\n"
    html = target.read_text()
    for name in (
        "prefill TTFT (cubic)",
        "prefill throughput samples",
        "decode ITL (ms) samples",
        '"type":"surface"',
    ):
        assert name in html


def test_profile_without_action_prints_help_and_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "profile")
    assert code == 2
    assert out.startswith("usage: planner profile")
    for action in ("show", "plot", "list"):
        assert action in out


def test_sweep_options_without_action_go_to_the_sweep(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "profile", "--engine", "sim:llama-3.1-8b-fp8@h200_sxm:tp1")
    assert code == 2
    assert err == "planner: invalid input: -o/--output DIR is required with --engine\n"
    code, _, err = run(capsys, "profile", "-o", str(tmp_path / "out"))
    assert code == 2
    assert err == "planner: invalid input: --engine is required for a profiling sweep\n"
