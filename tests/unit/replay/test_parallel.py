"""Several policies in parallel processes give the outputs they give one after the other; the
progress bar is redrawn on a terminal, a log gets a plain line now and then."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from disagg_planner.cli.main import main
from disagg_planner.errors import SpecError
from disagg_planner.replay.parallel import available_cores, resolve_jobs
from disagg_planner.replay.progress import BAR_WIDTH, PLAIN_EVERY_S, RunProgress, render_progress

WORKLOAD = "step:rates=3/12,at=120,duration=300,isl=2000,osl=200"
POLICIES = ("planner", "hpa", "static:1,1", "oracle")


def replay(out: Path, jobs: int, *extra: str, policies: tuple[str, ...] = POLICIES) -> int:
    argv = [
        "replay",
        *extra,
        "--workload",
        WORKLOAD,
        "--profile",
        "h200_sxm/vllm/llama-3.1-8b-fp8/tp1",
        "--ttft",
        "300",
        "--itl",
        "20",
        "--jobs",
        str(jobs),
        "-o",
        str(out),
    ]
    for policy in policies:
        argv += ["--policy", policy]
    return main(argv)


REFERENCE_KEYS = ("oracle_gpu_hours", "best_static", "gpu_hours_ratio_to_oracle")


@pytest.mark.slow
@pytest.mark.parametrize("jobs", [1, 2])
def test_no_references_skips_the_searches_and_leaves_the_policies_figures_alone(
    jobs: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    without = ("planner", "hpa")
    assert replay(tmp_path / "with", 1, policies=without) == 0
    capsys.readouterr()
    assert replay(tmp_path / "without", jobs, "--no-references", policies=without) == 0
    assert "finding the references" not in capsys.readouterr().err
    for policy in without:
        full = json.loads((tmp_path / "with" / policy / "summary.json").read_text())
        bare = json.loads((tmp_path / "without" / policy / "summary.json").read_text())
        assert all(key in full for key in REFERENCE_KEYS)
        assert not any(key in bare for key in REFERENCE_KEYS)
        full.pop("wall_s"), bare.pop("wall_s")
        assert {k: v for k, v in full.items() if k in bare} == bare


def test_no_references_refuses_the_policies_that_are_the_searches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert replay(tmp_path, 1, "--no-references", policies=("hpa", "oracle")) == 2
    err = capsys.readouterr().err
    assert "--no-references" in err and "'oracle'" in err


@pytest.mark.slow
def test_parallel_policies_write_what_sequential_ones_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert replay(tmp_path / "one", 1) == 0
    sequential = capsys.readouterr()
    assert replay(tmp_path / "two", 2) == 0
    parallel = capsys.readouterr()
    for policy in ("planner", "hpa", "static-1-1", "oracle"):
        one = json.loads((tmp_path / "one" / policy / "summary.json").read_text())
        two = json.loads((tmp_path / "two" / policy / "summary.json").read_text())
        assert one.pop("wall_s") > 0 and two.pop("wall_s") > 0
        assert one == two, policy
        for name in ("requests.csv", "timeline.csv"):
            first = (tmp_path / "one" / policy / name).read_bytes()
            assert first == (tmp_path / "two" / policy / name).read_bytes(), (policy, name)
    # the table lists the policies in the order given, with the same figures
    assert sequential.out == parallel.out.replace(str(tmp_path / "two"), str(tmp_path / "one"))
    # stderr is not a terminal here: no bar redrawn, and a run this short gets no line
    assert "ETA" not in sequential.err + parallel.err
    assert "\r" not in sequential.err + parallel.err
    # every run says its size before it starts
    assert "requests arriving over 4:59 of simulated time, 4 policies" in parallel.err


@pytest.mark.parametrize("jobs", [0, -2])
def test_fewer_than_one_job_is_refused(
    jobs: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert replay(tmp_path, jobs) != 0
    err = capsys.readouterr().err
    assert f"--jobs {jobs}" in err and "1 or more" in err
    assert not any(tmp_path.iterdir())  # refused before any work
    with pytest.raises(SpecError, match="--jobs 0"):
        resolve_jobs(0)


def test_the_default_is_one_process_per_core() -> None:
    assert resolve_jobs(None) == available_cores() >= 1
    assert resolve_jobs(3) == 3


def test_the_line_shows_the_share_done_and_the_time_left_at_the_rate_so_far() -> None:
    start = render_progress(0.0, 600.0, 0.0, finished=0, runs=2)
    assert "0/2 done" in start and "0.0%" in start and "ETA --:--" in start
    half = render_progress(300.0, 600.0, 40.0, finished=1, runs=2)
    assert f"[{'#' * (BAR_WIDTH // 2):<{BAR_WIDTH}}]" in half
    assert "50.0%" in half and "elapsed 0:40" in half and "ETA 0:40" in half
    late = render_progress(100.0, 4000.0, 100.0, finished=0, runs=4)
    assert "ETA 1:05:00" in late  # 3900 s at 1 simulated s per wall s
    # the rate is that of the simulations, not of the search before them
    searched = render_progress(300.0, 600.0, 100.0, finished=1, runs=2, simulating_s=40.0)
    assert "elapsed 1:40" in searched and "ETA 0:40" in searched
    done = render_progress(600.0, 600.0, 75.0, finished=2, runs=2)
    assert "2/2 done" in done and "100.0%" in done and "ETA 0:00" in done


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def drive(bar: RunProgress, clock: list[float]) -> None:
    bar.note("finding the references")
    for t in (0.0, 0.05, 0.1, 0.5):
        clock[0] = t
        bar.update(0, 100.0 * t)
    bar.finish(0)
    bar.update(1, 60.0)
    bar.finish(1)
    bar.close()


def test_the_bar_is_redrawn_on_a_terminal_and_a_log_gets_a_plain_line_now_and_then() -> None:
    clock = [0.0]
    log = io.StringIO()
    drive(RunProgress(2, 100.0, stream=log, clock=lambda: clock[0]), clock)
    # a run shorter than PLAIN_EVERY_S: its note only, no carriage return
    assert log.getvalue() == "finding the references\n"
    long = io.StringIO()
    bar = RunProgress(1, 3600.0, stream=long, clock=lambda: clock[0])
    for t in (1.0, 10.0, PLAIN_EVERY_S + 1, PLAIN_EVERY_S + 5, 2 * PLAIN_EVERY_S + 2):
        clock[0] = t
        bar.update(0, 10.0 * t)
    clock[0] = 3 * PLAIN_EVERY_S + 3
    bar.searching = True
    bar.tick()  # a search: no simulated time passes, the line still comes
    lines = long.getvalue().splitlines()
    assert "\r" not in long.getvalue()
    assert len(lines) == 3, lines
    assert all(line.startswith("replay 0/1 done") and "ETA" in line for line in lines)
    # the ETA is the policies': a line written while the search runs says so
    assert ["search runs meanwhile" in line for line in lines] == [False, False, True]
    off = Terminal()
    drive(RunProgress(2, 100.0, stream=off, enabled=False, clock=lambda: clock[0]), clock)
    assert off.getvalue() == ""
    terminal = Terminal()
    drive(RunProgress(2, 100.0, stream=terminal, clock=lambda: clock[0]), clock)
    text = terminal.getvalue()
    assert text.startswith("\r\x1b[Kfinding the references\n")
    assert text.endswith("\n")
    lines = [line for line in text.split("\r") if line.startswith("replay")]
    # redrawn at most every REDRAW_S, and at every finished run
    assert len(lines) < 8
    assert "2/2 done" in lines[-1] and "100.0%" in lines[-1]


def test_a_bad_policy_name_is_refused_before_the_searches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from disagg_planner.replay import parallel

    def no_search(*_a: object, **_k: object) -> None:
        raise AssertionError("searched first")

    monkeypatch.setattr(parallel, "compute_references", no_search)
    profile = "h200_sxm/vllm/llama-3.1-8b-fp8/tp1"
    argv = ["replay", "--workload", WORKLOAD, "--profile", profile, "-o", str(tmp_path)]
    code = main([*argv, "--policy", "planner", "--policy", "bogus"])
    assert code != 0
    assert "unknown policy 'bogus'" in capsys.readouterr().err


@pytest.mark.slow
def test_a_failure_finding_the_references_stops_the_policies_waiting_for_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The policies that need no reference simulate while the references are found; when
    # finding them fails, those waiting to write their summaries stop too (no hang) and the
    # error is the one raised.
    from disagg_planner.config.schema import PlannerConfig
    from disagg_planner.replay import parallel
    from disagg_planner.replay.session import WorkloadSpec, prepare

    def failing(*_a: object, **_k: object) -> None:
        raise SpecError("no references today")

    config = PlannerConfig.model_validate(
        {"profile": "h200_sxm/vllm/llama-3.1-8b-fp8/tp1", "max_gpu_budget": -1}
    )
    workload = WorkloadSpec(workload="poisson:rate=2,isl=500,osl=20,duration=30")
    plan = prepare(config, workload, startup_delay_s=5.0)
    monkeypatch.setattr(parallel, "compute_references", failing)
    with pytest.raises(SpecError, match="no references today"):
        parallel.run_policies(
            plan, ["planner", "hpa", "oracle"], out_dir=tmp_path, jobs=2, progress=False
        )
    assert not list(tmp_path.rglob("summary.json"))
