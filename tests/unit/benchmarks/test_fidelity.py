"""benchmarks/fidelity.py judges validation points only, and its check fails when one of them
is outside its tolerance (issue 31: a validation table that can fail)."""

from __future__ import annotations

from types import ModuleType

import pytest

from disagg_planner.simulator.calibration import CalibrationPoint
from tests.unit.benchmarks.scripts import load_script

# the nightly build's engine (a V0 release), whose batch-8 step the roofline is fitted to
H200_8B = "sim:llama-3.1-8b@h200_sxm:tp1:version=0.6"


@pytest.fixture(scope="module")
def fidelity() -> ModuleType:
    return load_script("fidelity")


def _decode_point(name: str, target_ms: float, point_set: str) -> CalibrationPoint:
    return CalibrationPoint(
        name,
        H200_8B,
        "decode_step",
        target_ms,
        "ms",
        "vllm-latency",
        point_set=point_set,
        batch=8,
        context=96,
        tolerance=0.15 if point_set == "training" else None,
    )


def test_a_point_outside_tolerance_is_missed_and_fails_the_check(fidelity: ModuleType) -> None:
    # The roofline's batch-8 step of the nightly build on the H200 8B is 6.5 ms (its training
    # point): a reference
    # of 6.6 ms is met (within 10%), one of 9 ms is not (-28%).
    near = _decode_point("near", 6.6, "validation")
    far = _decode_point("far", 9.0, "validation")
    trained = _decode_point("trained", 9.0, "training")
    rows = fidelity.rows([near, far, trained])
    assert [(r.point.name, r.met) for r in rows] == [("near", True), ("far", False)]
    assert [r.point.name for r in fidelity.missed(rows)] == ["far"]
    table = fidelity.point_table(rows)
    assert "| 2 | far | itl | sim | 9.00 ms |" in table and "| missed |" in table
    # One of two ITL points met: under the 80% the goal asks, so the metric is missed too.
    assert "| sim | itl | 2 | " in fidelity.metric_table(rows, ["sim"])
    assert fidelity.metric_table(rows, ["sim"]).rstrip().endswith("| missed |")


@pytest.mark.slow
def test_the_check_exits_1_while_a_sim_validation_point_misses(
    fidelity: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    near = _decode_point("near", 6.6, "validation")
    far = _decode_point("far", 9.0, "validation")
    assert fidelity.main(["--check"], points=(near,)) == 0
    assert fidelity.main(["--check"], points=(near, far)) == 1
    assert (
        "FAILED: 1 validation point(s) outside tolerance on sim: #2 -2" in capsys.readouterr().err
    )
    # Without --check the table is printed and the run succeeds.
    assert fidelity.main([], points=(near, far)) == 0
