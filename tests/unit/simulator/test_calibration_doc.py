"""CALIBRATION.md's tables are what ``python -m disagg_planner.simulator.calibration`` prints
(the doc cannot go stale), and its point sets are named, disjoint and sourced.

Needs the extra ``disagg-planner[aic]`` (the tables put both engine models side by side)."""

from __future__ import annotations

import pytest

from disagg_planner.simulator import calibration
from disagg_planner.simulator.calibration import DOC, POINTS, SOURCES
from disagg_planner.simulator.engine_spec import parse


def test_the_point_sets_are_disjoint_named_and_sourced() -> None:
    by_set = {s: {p.name for p in POINTS if p.point_set == s} for s in calibration.POINT_SETS}
    assert by_set["training"] and by_set["validation"]
    assert not by_set["training"] & by_set["validation"]
    assert len({p.name for p in POINTS}) == len(POINTS)
    assert all(p.source in SOURCES for p in POINTS)
    # The roofline's regression guard is on what it was fitted to, only (outliers aside).
    fitted = {p.name for p in POINTS if p.fitted}
    assert {p.name for p in POINTS if p.tolerance is not None} == fitted
    assert all(p.point_set == "training" for p in POINTS if p.outlier)


def test_an_outlier_mark_on_a_validation_point_is_refused() -> None:
    with pytest.raises(ValueError, match="outlier is a mark of training points only"):
        calibration.CalibrationPoint(
            "x",
            "sim:llama-3.1-8b@h200_sxm",
            "decode_step",
            1.0,
            "ms",
            "vllm-latency",
            point_set="validation",
            outlier="because",
        )


@pytest.mark.slow
@pytest.mark.aic
def test_the_recorded_aic_references_are_what_the_aic_engine_computes() -> None:
    # The aic-vllm training points' reference values are generated, never typed.
    recorded = {p.name: p.target for p in POINTS if p.source == "aic-vllm"}
    assert recorded and calibration.aic_references() == recorded


@pytest.mark.aic
def test_every_point_runs_on_both_engine_models() -> None:
    for p in POINTS:
        sim, aic = parse(p.spec("sim")), parse(p.spec("aic"))
        assert (sim.timing, aic.timing) == ("sim", "aic")
        assert aic.model == sim.model and aic.tp == sim.tp
        assert aic.max_num_seqs == sim.max_num_seqs and aic.backend == p.backend


def test_an_offline_point_without_fixed_lengths_is_refused() -> None:
    # Issue 31: an offline point's requests have known lengths (no assumed spread decides it).
    with pytest.raises(ValueError, match=r"fixed lengths and count \(isl=128, osl=0"):
        calibration.CalibrationPoint(
            "x",
            "sim:llama-3.1-8b@h200_sxm",
            "offline_thpt",
            1.0,
            "tok/s/GPU",
            "trtllm",
            point_set="validation",
            isl=128,
            requests=100,
        )


def test_a_tp_group_figure_is_judged_per_gpu() -> None:
    # The perf-overview page gives the TP group's output tokens/s: 6,651 for the H100 70B TP2.
    (row,) = [p for p in POINTS if p.name.startswith("H100 70B-FP8 TP2") and "128/2048" in p.name]
    assert parse(row.engine).tp == 2 and row.target == 6651 / 2 and row.unit == "tok/s/GPU"


def test_the_issue_targets_are_the_ones_reported() -> None:
    kinds = {p.kind: p.target_tolerance for p in POINTS}
    assert kinds["prefill_ttft"] == 0.15
    assert kinds["decode_step"] == kinds["offline_thpt"] == kinds["prefill_thpt"] == 0.10


@pytest.mark.slow
@pytest.mark.aic
def test_calibration_md_has_the_tables_the_script_prints() -> None:
    # A few minutes: the offline points simulate up to 10,000 requests on each engine model.
    assert calibration.doc_tables(DOC.read_text()) == calibration.tables(), (
        "CALIBRATION.md is stale: python -m disagg_planner.simulator.calibration --write"
    )
