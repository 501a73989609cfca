"""``planner replay`` traps a new user fell into: each message names the right thing, a given
``--engine`` finds its profile, ``--skip-bad-rows`` works as in backtest, and a second run
does not silently replace the first one's results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from disagg_planner.cli.main import main

PROFILE = "h200_sxm/vllm/llama-3.1-8b-fp8/tp1"
TINY = "poisson:rate=2,isl=500,osl=20,duration=30"
FAST = ["--no-progress", "--json", "--adjustment-interval", "10", "--startup-delay", "5"]


def replay(out: Path, *extra: str) -> int:
    return main(["replay", "-o", str(out), *FAST, *extra])


def test_an_unknown_workload_kind_is_named_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert replay(tmp_path / "o", "--workload", "nonsense:foo=1") == 2
    err = capsys.readouterr().err
    assert "unknown kind 'nonsense'; known: poisson, step, sinusoid, diurnal, onoff" in err
    assert "missing" not in err


@pytest.mark.parametrize("value", ["-5", "0", "soon"])
def test_a_bad_duration_is_called_a_bad_duration(
    value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        replay(tmp_path / "o", "--workload", TINY, "--duration", value)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"--duration: {value!r}: expected a duration > 0" in err
    assert "no requests" not in err


@pytest.mark.slow
def test_a_duration_cuts_the_workload(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        replay(tmp_path / "o", "--workload", TINY, "--profile", PROFILE, "--duration", "10s") == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert summary["requests"] > 0 and summary["last_arrival_s"] < 10


@pytest.mark.slow
def test_an_engine_with_a_bundled_profile_needs_no_profile_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = "sim:llama-3.1-8b-fp8@h200_sxm:tp1"
    assert replay(tmp_path / "o", "--workload", TINY, "--engine", engine) == 0
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["engine"] == engine and summary["config"]["profile"] == PROFILE


def test_an_engine_without_a_profile_says_how_to_get_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = "sim:llama-3.1-8b-fp8@b200:tp1"
    assert replay(tmp_path / "o", "--workload", TINY, "--engine", engine) == 2
    err = capsys.readouterr().err
    assert "profiling_results" not in err
    assert f"--engine {engine}: the throughput loop sizes from a profile" in err
    assert f"planner profile --engine {engine} -o DIR" in err
    # Without the throughput loop no profile is needed at all.
    load_only = ["--no-enable-throughput-scaling", "--enable-load-scaling"]
    assert replay(tmp_path / "p", "--workload", TINY, "--engine", engine, *load_only) == 0


def mooncake(path: Path, *, bad_line: int | None = None) -> Path:
    lines = [
        json.dumps({"timestamp": i * 500, "input_length": 400, "output_length": 20})
        for i in range(60)
    ]
    if bad_line is not None:
        lines[bad_line - 1] = '{"timestamp": 1, "input_length": "many", "output_length": 2}'
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.slow
def test_skip_bad_rows_in_replay_as_in_backtest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = mooncake(tmp_path / "t.jsonl", bad_line=7)
    args = ["--trace", str(trace), "--profile", PROFILE]
    assert replay(tmp_path / "a", *args) == 2
    assert f"{trace}:7: input_length = 'many'" in capsys.readouterr().err
    assert replay(tmp_path / "b", *args, "--skip-bad-rows") == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["requests"] == 59
    assert f"skipped 1 bad row(s), first: {trace}:7: input_length = 'many'" in err
    backtest = ["backtest", "--trace", str(trace), "--interval", "5", "--json"]
    assert main([*backtest, "--predictor", "constant"]) == 2
    assert main([*backtest, "--predictor", "constant", "--skip-bad-rows"]) == 0


@pytest.mark.slow
def test_an_existing_output_directory_is_kept_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert replay(out, "--workload", TINY, "--profile", PROFILE) == 0
    first = (out / "summary.json").read_bytes()
    capsys.readouterr()
    other = "poisson:rate=4,isl=500,osl=20,duration=30"
    assert replay(out, "--workload", other, "--profile", PROFILE) == 2
    err = capsys.readouterr().err
    assert f"output directory '{out}' already exists and is not empty: pass --force" in err
    assert (out / "summary.json").read_bytes() == first
    assert replay(out, "--workload", other, "--profile", PROFILE, "--force") == 0
    assert (out / "summary.json").read_bytes() != first
    # An empty directory is fine; a file is not a directory.
    (tmp_path / "empty").mkdir()
    assert replay(tmp_path / "empty", "--workload", TINY, "--profile", PROFILE) == 0
    (tmp_path / "file").write_text("x")
    assert replay(tmp_path / "file", "--workload", TINY, "--profile", PROFILE, "--force") == 2
    assert "is a file" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "value", "expected"),
    [
        ("--scale-load", "-1", "expected a finite number > 0"),
        ("--speedup", "0", "expected a finite number > 0"),
        ("--speedup", "nan", "expected a finite number > 0"),
        ("--startup-delay", "-5", "expected a number of seconds >= 0"),
        ("--clone-jitter", "inf", "expected a number of seconds >= 0"),
    ],
)
@pytest.mark.parametrize("debug", [[], ["--debug"]], ids=["plain", "debug"])
def test_a_bad_number_is_refused_by_its_flag_before_any_work(
    flag: str,
    value: str,
    expected: str,
    debug: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # ``planner --debug replay --scale-load -1`` used to print a traceback from deep in the
    # workload generator, after the default workload had been generated.
    with pytest.raises(SystemExit) as exit_info:
        main([*debug, "replay", "-o", str(tmp_path / "o"), flag, value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"{flag}: {value!r}: {expected}" in err
    assert "Traceback" not in err
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_the_default_output_directory_is_kept_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["replay", *FAST, "--workload", TINY, "--profile", PROFILE]
    assert main(args) == 0
    first = (tmp_path / "replay-out" / "summary.json").read_bytes()
    capsys.readouterr()
    assert main([*args, "--seed", "1"]) == 2
    assert "output directory 'replay-out' already exists" in capsys.readouterr().err
    assert (tmp_path / "replay-out" / "summary.json").read_bytes() == first
