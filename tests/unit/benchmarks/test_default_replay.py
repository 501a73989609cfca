"""benchmarks/default_replay.py: README's figures of the default ``planner replay`` come from
the script, and ``--check`` fails naming the drift when they differ from a fresh run. The run
itself (about 40 s of CPU) is ``.ci/run``'s ``--check``; here the script's own logic runs on
summaries of the shape ``planner replay`` writes."""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "default_replay.py"
README = SCRIPT.parents[1] / "README.md"


@pytest.fixture(scope="module")
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("default_replay_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def summary(attainment: float, gpu_hours: float, actions: int) -> dict[str, Any]:
    return {
        "slo_attainment": {"both": attainment},
        "ttft_ms": {"p99": 250.0},
        "itl_ms": {"p99": 6.2},
        "gpu_hours": gpu_hours,
        "gpu_hours_ratio_to_best_static": gpu_hours / 2.0,
        "gpu_hours_ratio_to_oracle": gpu_hours / 1.5,
        "scale_actions": {"prefill": actions, "decode": 0},
        "max_replicas": {"prefill": 4, "decode": 1},
    }


RUN = {
    "planner": summary(0.9990, 1.80, 3),
    "hpa": summary(0.9950, 1.90, 4),
    "best-static": summary(0.9999, 2.00, 0),
}


def test_the_block_shows_each_policy_and_the_target_from_the_figures(
    script: ModuleType,
) -> None:
    text = script.block(RUN)
    assert text.startswith("<!-- BEGIN default-replay -->")
    assert text.endswith("<!-- END default-replay -->")
    assert "| planner | 99.90% | 250 | 6.2 | 1.80 | 0.90 | 1.20 | 3 | 4/1 |" in text
    assert "- MET planner GPU-hours at or under hpa's: 1.80 vs 1.90" in text
    assert "- MET planner attainment at least hpa's: 99.90% vs 99.50%" in text
    worse = copy.deepcopy(RUN)
    worse["planner"]["gpu_hours"] = 2.10
    worse["planner"]["slo_attainment"]["both"] = 0.99
    text = script.block(worse)
    assert "- MISSED planner GPU-hours at or under hpa's: 2.10 vs 1.90" in text
    assert "- MISSED planner attainment at least hpa's: 99.00% vs 99.50%" in text


def test_readme_carries_the_generated_block(script: ModuleType) -> None:
    mine = script.readme_block(README.read_text())
    assert mine is not None
    assert "| policy | SLO both | TTFT p99 ms |" in mine
    assert {"| planner |", "| hpa |", "| best-static |"} <= {
        line[: line.index(" |", 2) + 2] for line in mine.splitlines() if line.startswith("| ")
    }


def test_check_names_the_drift_and_write_fixes_it(
    script: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# Planner\n\nintro\n\n" + script.block(RUN) + "\n\nmore\n")
    monkeypatch.setattr(script, "README", readme)
    fresh = copy.deepcopy(RUN)
    fresh["hpa"]["gpu_hours"] = 1.70
    monkeypatch.setattr(script, "run_default", lambda jobs=None: fresh)
    assert script.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert "README.md's default-replay figures differ from a fresh `planner replay`" in err
    assert "-| hpa | 99.50% | 250 | 6.2 | 1.90 |" in err
    assert "+| hpa | 99.50% | 250 | 6.2 | 1.70 |" in err
    assert "+- MISSED planner GPU-hours at or under hpa's: 1.80 vs 1.70" in err
    assert script.main(["--write"]) == 0
    text = readme.read_text()
    assert text.startswith("# Planner\n\nintro\n\n") and text.endswith("\n\nmore\n")
    assert script.main(["--check"]) == 0
    readme.write_text("# Planner\n")
    assert script.main(["--check"]) == 1
    assert "README.md has no <!-- BEGIN default-replay --> block" in capsys.readouterr().err
