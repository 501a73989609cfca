"""benchmarks/heldout.py (issue 29): the policies on workloads no rule was tuned to. The set is
kept apart from the scorecard's by construction, and a run at a test's scale (the first 600 s
of one held-out workload) prints each policy's own figures and the comparison over the set
from them (changing a figure changes the count)."""

from __future__ import annotations

import contextlib
import copy
import io
import json
from types import ModuleType
from typing import Any

import pytest

from tests.unit.benchmarks.scripts import load_script

WORKLOAD = "on/off large bursts, seed 1"


@pytest.fixture(scope="module")
def heldout() -> ModuleType:
    return load_script("heldout")


@pytest.fixture(scope="module")
def rows(heldout: ModuleType) -> list[dict[str, Any]]:
    buffer = io.StringIO()  # capsys is function-scoped: the module's run is captured here
    with contextlib.redirect_stdout(buffer):
        code = heldout.main(["--only", WORKLOAD, "--duration", "600", "--jobs", "1", "--json"])
    assert code == 0
    result: list[dict[str, Any]] = json.loads(buffer.getvalue())
    return result


def _identity(s: Any) -> tuple[Any, ...]:
    w = s.workload
    return (w.trace, w.workload, w.scale_load, w.seed, s.profile, s.engine, s.ttft_ms, s.itl_ms)


def test_no_held_out_workload_is_one_the_scorecard_tunes_on(heldout: ModuleType) -> None:
    scorecard = heldout.scorecard  # the scorecard module the script itself runs
    tuned = {_identity(s) for s in scorecard.SCENARIOS}
    names = [s.name for s in heldout.SCENARIOS]
    assert len(set(names)) == len(names)
    assert not {_identity(s) for s in heldout.SCENARIOS} & tuned
    assert not set(names) & {s.name for s in scorecard.SCENARIOS}
    # the synthetic shapes are other draws than the scorecard's seed 0
    synthetic = [s for s in heldout.SCENARIOS if s.workload.workload is not None]
    assert synthetic and all(s.workload.seed != 0 for s in synthetic)


def test_an_unknown_workload_is_refused_naming_the_known_ones(
    heldout: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        heldout.main(["--only", "no such workload"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "--only ['no such workload']: no held-out workload starts so" in err
    assert WORKLOAD in err


@pytest.mark.slow
def test_every_policy_runs_on_the_workload_cut_to_the_duration(
    heldout: ModuleType, rows: list[dict[str, Any]]
) -> None:
    assert [r["label"] for r in rows] == list(heldout.POLICIES)
    assert {r["scenario"] for r in rows} == {WORKLOAD}
    # the first 600 s only: every arrival before it, metered until the last one finished
    assert all(600.0 <= r["duration_s"] < 900.0 for r in rows)


@pytest.mark.slow
def test_the_table_shows_each_policy_s_own_figures(
    heldout: ModuleType, rows: list[dict[str, Any]]
) -> None:
    lines = heldout.table(rows).splitlines()
    assert len(lines) == 3
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    by = {r["label"]: r for r in rows}
    planner, hpa = by["planner"], by["hpa"]
    static = planner["best_static"]
    assert cells[0] == WORKLOAD
    assert cells[1] == f"{planner['slo_attainment']['both']:.2%} / {planner['gpu_hours']:.2f}"
    assert cells[2] == f"{hpa['slo_attainment']['both']:.2%} / {hpa['gpu_hours']:.2f}"
    assert cells[4] == f"{static['slo_attainment']:.2%} / {static['gpu_hours']:.2f}"
    assert cells[5] == f"{by['reactive-oracle']['slo_attainment']['both']:.2%}"
    gap = (planner["slo_attainment"]["both"] - hpa["slo_attainment"]["both"]) * 100
    assert cells[7] == f"{gap:+.2f}"


@pytest.mark.slow
def test_the_comparison_over_the_set_counts_the_run_s_figures(
    heldout: ModuleType, rows: list[dict[str, Any]]
) -> None:
    def hpa_line(rs: list[dict[str, Any]]) -> str:
        return next(x for x in heldout.summary(rs) if x.startswith("- hpa:"))

    worse = copy.deepcopy(rows)
    by = {r["label"]: r for r in worse}
    by["hpa"]["slo_attainment"]["both"] = by["planner"]["slo_attainment"]["both"] + 0.01
    by["hpa"]["gpu_hours"] = by["planner"]["gpu_hours"] + 1.0
    line = hpa_line(worse)
    assert "the planner's attainment at least its on 0 of 1" in line
    assert "its GPU-hours at most its on 1 of 1" in line
    by["hpa"]["slo_attainment"]["both"] = by["planner"]["slo_attainment"]["both"] - 0.01
    by["hpa"]["gpu_hours"] = by["planner"]["gpu_hours"] - 1.0
    line = hpa_line(worse)
    assert "the planner's attainment at least its on 1 of 1" in line
    assert "its GPU-hours at most its on 0 of 1" in line
    first = heldout.summary(worse)[0]
    assert first.startswith(
        f"- planner: mean attainment {by['planner']['slo_attainment']['both']:.2%} over 1 workloads"
    )


@pytest.mark.slow
def test_a_variant_reaches_the_planner_only(
    heldout: ModuleType, rows: list[dict[str, Any]]
) -> None:
    # the module's own run: no variant, every policy with its defaults
    assert all(r["settings"] == {} for r in rows)
    scenario = heldout.chosen([WORKLOAD])
    varied = heldout.runs(
        scenario, jobs=1, startup=None, duration_s=300, variant={"prefill_batching": "true"}
    )
    given = {r["label"]: r["settings"] for r in varied}
    assert given == {
        "planner": {"prefill_batching": "true"},
        **{p: {} for p in heldout.POLICIES if p != "planner"},
    }
