"""Every benchmark script starts as a user runs it (``python benchmarks/X.py``).

Run that way, ``benchmarks/`` comes first on ``sys.path`` and ``benchmarks/predictors.py``
shadows the ``predictors`` package: two scripts broke on exactly that.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"
# scripts, not the helper modules they share (results_block.py)
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py") if "__main__" in p.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_script_starts(script: str) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=BENCHMARKS.parent,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
