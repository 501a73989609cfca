"""The profile sweep reports progress in one line (redrawn on a terminal, a plain line every
PLAIN_EVERY_S without one, as a replay does), not one INFO line per point."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest

from disagg_planner.cli.main import main
from disagg_planner.cli.profile_sweep import SweepProgress
from disagg_planner.replay.progress import PLAIN_EVERY_S, REDRAW_S

SWEEP = [
    "profile",
    "--engine",
    "sim:llama-3.1-8b-fp8@h200_sxm:tp1",
    "--granularity-prefill",
    "5",
    "--granularity-decode",
    "3",
    "--granularity-concurrency",
    "3",
    "--max-context-length",
    "4096",
    "--decode-osl",
    "64",
]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_sweep_prints_a_size_line_and_a_closing_line_not_a_line_per_point(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*SWEEP, "-o", str(tmp_path / "p")]) == 0
    captured = capsys.readouterr()
    assert "5 prefill and 9 decode points" in captured.out
    err = [line for line in captured.err.splitlines() if not line.startswith("warning: ")]
    # a short sweep ends before the first plain progress line is due
    assert err[0] == "profile sweep of sim:llama-3.1-8b-fp8@h200_sxm:tp1: at most 14 points"
    assert len(err) == 2 and err[1].startswith("profile sweep: done in ")
    assert "prefill ISL" not in captured.err and "INFO" not in captured.err


def test_debug_logs_every_point_instead_of_the_bar(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*SWEEP, "-o", str(tmp_path / "p"), "--log-level", "DEBUG"]) == 0
    err = capsys.readouterr().err
    assert sum("profile_sweep: prefill ISL " in line for line in err.splitlines()) == 5
    assert "profile sweep: done" not in err


def test_without_a_terminal_a_plain_line_every_plain_every_s(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    clock, stream = Clock(), io.StringIO()
    progress = SweepProgress(10, stream=stream, clock=clock)
    progress.start("sim:x")
    for t in (1.0, PLAIN_EVERY_S - 1, PLAIN_EVERY_S + 1, PLAIN_EVERY_S + 2, 2 * PLAIN_EVERY_S + 2):
        clock.now = t
        progress(f"point at {t:g}")
    clock.now = 70.0
    progress.close()
    assert stream.getvalue().splitlines() == [
        "profile sweep of sim:x: at most 10 points",
        f"profile sweep: [#########                     ] 3 of at most 10 points, "
        f"{PLAIN_EVERY_S + 1:.0f} s; last: point at {PLAIN_EVERY_S + 1:g}",
        f"profile sweep: [###############               ] 5 of at most 10 points, "
        f"{2 * PLAIN_EVERY_S + 2:.0f} s; last: point at {2 * PLAIN_EVERY_S + 2:g}",
        "profile sweep: done in 70 s",
    ]


def test_on_a_terminal_the_line_is_redrawn_in_place(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    clock, stream = Clock(), Terminal()
    progress = SweepProgress(4, stream=stream, clock=clock)
    for i in range(4):
        clock.now = (i + 1) * (REDRAW_S + 0.05)
        progress(f"point {i}")
    text = stream.getvalue()
    assert text.count("\r\x1b[K") == 4 and "\n" not in text
    assert text.endswith("4 of at most 4 points, 1 s; last: point 3")
