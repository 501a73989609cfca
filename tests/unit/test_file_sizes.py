"""One idea per file where newcomers change things (issue 34): no module of the package runs
past 600 lines. A file that grows past it is split by idea (as core/throughput.py was into
sizing, sizer, guards, fast_check, feedback, observed_capacity and memory), not trimmed."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "disagg_planner"
MAX_LINES = 600


def test_no_module_of_the_package_is_over_600_lines() -> None:
    sizes = {
        str(path.relative_to(PACKAGE)): len(path.read_text().splitlines())
        for path in PACKAGE.rglob("*.py")
    }
    assert len(sizes) > 100  # the walk found the package
    over = {name: n for name, n in sorted(sizes.items()) if n > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines: {over}"
