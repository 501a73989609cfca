"""The scorecard's table and its per-workload check of issue 16's conditions: the oracle meets
the SLO target wherever best-static does and costs no more; every policy uses at least the
fluid bound. Each says held or VIOLATED, with the figures it compared."""

from __future__ import annotations

import copy
import pickle
from types import ModuleType
from typing import Any

import pytest

from disagg_planner.replay.session import WorkloadSpec
from disagg_planner.simulator.engine_spec import coerce
from disagg_planner.simulator.startup import phase_model
from tests.unit.benchmarks.scripts import load_script


@pytest.fixture(scope="module")
def scorecard() -> ModuleType:
    return load_script("scorecard")


@pytest.fixture(scope="module")
def rows(scorecard: ModuleType) -> list[dict[str, Any]]:
    scenario = scorecard.Scenario(
        "small step",
        WorkloadSpec(workload="step:rates=4/20/4,at=200/400,duration=600,isl=2000,osl=200"),
        400,
        20,
        "a short burst",
    )
    # handed between processes as the scorecard does
    found = pickle.loads(pickle.dumps(scorecard._references((scenario, 60.0))))
    return [
        scorecard._run_one((scenario, p, {}, 60.0, found))
        for p in ("static-peak", "planner", "best-static", "oracle")
    ]


@pytest.mark.slow
def test_the_table_has_every_ratio(scorecard: ModuleType, rows: list[dict[str, Any]]) -> None:
    table = scorecard.markdown(rows).splitlines()
    assert "| x oracle | x best-static | x fluid | actions | flaps |" in table[0]
    fluid = rows[0]["fluid_bound_gpu_hours"]
    for s, line in zip(rows, table[2:], strict=True):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[5] == f"{s['gpu_hours']:.2f}"
        assert cells[6] == f"{s['gpu_hours'] / s['oracle_gpu_hours']:.2f}"
        assert cells[7] == f"{s['gpu_hours'] / s['best_static']['gpu_hours']:.2f}"
        assert cells[8] == f"{s['gpu_hours'] / fluid:.2f}"


@pytest.mark.slow
def test_the_conditions_hold_on_a_burst(scorecard: ModuleType, rows: list[dict[str, Any]]) -> None:
    (line,) = scorecard.conditions(rows)
    assert line.startswith("- **small step**")
    assert line.count("held") == 3 and "VIOLATED" not in line
    oracle = next(s for s in rows if s["label"] == "oracle")
    best = next(s for s in rows if s["label"] == "best-static")
    assert best["slo_attainment"]["both"] >= best["slo_target"]
    assert oracle["slo_attainment"]["both"] >= oracle["slo_target"]
    assert oracle["gpu_hours"] <= best["gpu_hours"]


@pytest.mark.slow
def test_a_violation_is_reported_with_its_figures(
    scorecard: ModuleType, rows: list[dict[str, Any]]
) -> None:
    worse = copy.deepcopy(rows)
    static = worse[0]["best_static"]
    worse[0]["oracle_gpu_hours"] = static["gpu_hours"] * 1.5
    worse[0]["oracle_slo_attainment"] = 0.9
    worse[1]["gpu_hours"] = worse[0]["fluid_bound_gpu_hours"] / 2
    (line,) = scorecard.conditions(worse)
    assert line.count("VIOLATED") == 3
    assert "oracle 90.00% >= 99.00%" in line
    assert f"oracle {static['gpu_hours'] * 1.5:.3f} <= best-static" in line
    assert f"below it: {worse[1]['policy']}" in line


@pytest.mark.slow
def test_where_best_static_meets_the_target_only_over_the_servable(
    scorecard: ModuleType, rows: list[dict[str, Any]]
) -> None:
    servable = copy.deepcopy(rows)
    n = servable[0]["requests"]
    servable[0]["unservable_requests"] = n // 20
    servable[0]["best_static"] |= {"meets_target": False, "slo_attainment": 0.95}
    servable[0]["oracle_slo_attainment"] = 0.945
    (line,) = scorecard.conditions(servable)
    bar = 0.99 * (n - n // 20) / n
    assert f"held: oracle 94.50% >= {bar:.2%}" in line
    assert f"over the {n - n // 20} servable of {n}" in line


def test_fewer_than_one_job_is_refused(
    scorecard: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        scorecard.main(["--jobs", "0"])
    assert exit_.value.code == 2
    assert "--jobs 0: expected a number of parallel processes" in capsys.readouterr().err


def _as(row: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = copy.deepcopy(row)
    out.update(changes)
    return out


@pytest.mark.slow
def test_the_decision_targets_name_each_figure(
    scorecard: ModuleType, rows: list[dict[str, Any]]
) -> None:
    planner = next(s for s in rows if s["label"] == "planner")
    static = next(s for s in rows if s["label"] == "static-peak")
    # an HPA that serves more of the requests for fewer GPU-hours than the planner
    hpa = _as(
        static,
        label="hpa",
        policy="hpa",
        slo_attainment={**planner["slo_attainment"], "both": 1.0},
        gpu_hours=planner["gpu_hours"] / 2,
    )
    worse = _as(planner, slo_attainment={**planner["slo_attainment"], "both": 0.9})
    worse["flaps"] = {"prefill": 3, "decode": 0}
    (line,) = scorecard.decision_targets([worse, hpa, *(s for s in rows if s is not planner)])
    assert line.startswith("- **small step** (planner): ")
    assert "MISSED attainment above hpa's 100.00%" in line
    hours = worse["duration_s"] / 3600
    assert f"MISSED 3 flaps in {hours * 60:.1f} min <= 2/h ({2 * hours:.2f} allowed)" in line
    if worse["best_static"]["slo_attainment"] >= 0.99:
        assert "MISSED attainment 90.00% >= 99%" in line
    # real traffic adds the ratio to the oracle; both at 99 %: fewer GPU-hours than hpa
    real = _as(
        planner, real_traffic=True, slo_attainment={**planner["slo_attainment"], "both": 1.0}
    )
    (line,) = scorecard.decision_targets([real, hpa])
    ratio = real["gpu_hours"] / real["oracle_gpu_hours"]
    assert f"{ratio:.2f}x oracle <= 1.25x" in line
    assert (
        f"MISSED fewer GPU-h than hpa ({real['gpu_hours']:.2f} vs {hpa['gpu_hours']:.2f})" in line
    )
    # a tie says so: none serves more than every request, none runs fewer than one replica
    one = {role: 1 for role in planner["max_replicas"]}
    tied = _as(real, max_replicas=one, gpu_hours=hpa["gpu_hours"])
    (line,) = scorecard.decision_targets([tied, _as(hpa, max_replicas=one)])
    assert "MISSED attainment above hpa's 100.00% (both serve every request)" in line
    assert "fewer GPU-h than hpa" in line
    assert (
        line.split("fewer GPU-h than hpa")[1]
        .split(";")[0]
        .endswith("(both ran one replica per role throughout)")
    )


@pytest.mark.slow
def test_a_missed_gpu_hour_target_names_its_cause(
    scorecard: ModuleType, rows: list[dict[str, Any]]
) -> None:
    planner = next(s for s in rows if s["label"] == "planner")
    # the run's own account of its GPU-hours above best-static's counts
    cause = planner["over_best_static"]
    static = "/".join(str(n) for n in planner["best_static"]["replicas"].values())
    assert cause.startswith(f"above best-static's {static} for ")
    best = float(planner["best_static"]["gpu_hours"])
    over = _as(planner, gpu_hours=best + 0.5)
    (line,) = scorecard.decision_targets([over])
    assert f"MISSED {best + 0.5:.2f} <= best-static {best:.2f} GPU-h (cause: {cause})" in line
    under = _as(planner, gpu_hours=best - 0.5)
    (line,) = scorecard.decision_targets([under])
    assert f"MET {best - 0.5:.2f} <= best-static {best:.2f} GPU-h;" in line
    assert "cause:" not in line
    # equal to two decimals: told apart with more, so that a miss never reads "4.00 <= 4.00"
    even = _as(planner, best_static=planner["best_static"] | {"gpu_hours": 4.0})
    (line,) = scorecard.decision_targets([_as(even, gpu_hours=4.0)])
    assert "MET 4.00 <= best-static 4.00 GPU-h;" in line  # the same figure
    (line,) = scorecard.decision_targets([_as(even, gpu_hours=4.0014)])
    assert "MISSED 4.001 <= best-static 4.000 GPU-h" in line
    (line,) = scorecard.decision_targets([_as(even, gpu_hours=4.00003)])
    assert "MISSED 4.00003 <= best-static 4.00000 GPU-h" in line


def test_attainment_is_judged_against_best_static_where_it_misses_99(
    scorecard: ModuleType,
) -> None:
    # issue 29: >= 99 %, or within 0.3 points of best-static where best-static misses 99 %
    def row(att: float, static: float, oracle: float = 0.98) -> dict[str, Any]:
        return {
            "slo_attainment": {"both": att},
            "best_static": {"slo_attainment": static},
            "oracle_slo_attainment": oracle,
        }

    assert scorecard.attainment_target(row(0.9734, 0.9836)) == (
        "MISSED attainment 97.34% >= 98.06%, best-static's 98.36% less 0.3 points "
        "(it misses 99%; oracle 98.00%)"
    )
    assert scorecard.attainment_target(row(0.9810, 0.9836)).startswith(
        "MET attainment 98.10% >= 98.06%"
    )
    # best-static at 99 % or more: the 99 % target, whatever the oracle reaches
    assert scorecard.attainment_target(row(0.985, 0.995, oracle=0.97)) == (
        "MISSED attainment 98.50% >= 99% (oracle 97.00%)"
    )
    assert scorecard.attainment_target(row(0.991, 0.995)).startswith("MET attainment 99.10%")


@pytest.mark.slow
def test_the_startup_sweep_checks_attainment_and_growth(
    scorecard: ModuleType, rows: list[dict[str, Any]]
) -> None:
    planner = next(s for s in rows if s["label"] == "planner")
    both = {**planner["slo_attainment"], "both": 0.995}
    sweep = [
        _as(planner, startup_delay_s=30.0, gpu_hours=1.0, slo_attainment=both),
        _as(planner, startup_delay_s=300.0, gpu_hours=1.2, slo_attainment=both),
        _as(planner, startup_delay_s=120.0, gpu_hours=1.1, slo_attainment=both),
    ]
    (line,) = scorecard.startup_sweep(sweep)
    assert "30 s: 99.50% / 1.00 GPU-h (+0%); 120 s: 99.50% / 1.10 GPU-h (+10%); 300 s" in line
    assert "MET attainment >= 99% at every delay" in line
    assert "MISSED GPU-hours +20% <= +15%" in line
    # one delay is no sweep
    assert scorecard.startup_sweep(sweep[:1]) == []


def test_a_bad_startup_sweep_is_refused(
    scorecard: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    for bad in ("30,soon", "30,-5"):
        with pytest.raises(SystemExit) as exit_:
            scorecard.main(["--startup-sweep", bad])
        assert exit_.value.code == 2
        assert f"--startup-sweep {bad!r}" in capsys.readouterr().err


def _scenario(scorecard: ModuleType, prefix: str) -> Any:
    return next(s for s in scorecard.SCENARIOS if s.name.startswith(prefix))


def test_the_default_start_up_is_the_phase_model(scorecard: ModuleType) -> None:
    args = scorecard.build_parser().parse_args([])
    assert args.startup_delay is None
    step = _scenario(scorecard, "step 8->40")
    assert scorecard._plan(step, {}, args.startup_delay).setup.startup_delay_s is None
    # the wide-EP row's followers start for the phase model's median of its own engine
    wide = _scenario(scorecard, "wide-ep")
    variant = scorecard._elastic_variant(wide, args.startup_delay)
    median = phase_model(coerce(scorecard.WIDE_EP_ENGINE)).median_plan().total_s
    assert variant["elastic_ep_follower_ready_seconds"] == median
    assert 570.0 < median < 590.0  # issue 31's 578 s, not the 8B engine's 91 s
    plan = scorecard._plan(wide, variant, args.startup_delay)
    assert plan.setup.startup_delay_s is None
    assert plan.config.elastic_ep_follower_ready_seconds == median
    # the results' header says so, from the phase model's own figures
    said = scorecard.startup_text([None], [step, wide])
    assert said.startswith("start-up: each replica's drawn phase by phase from the phase model")
    assert f"median {median:.0f} s" in said and "`sim:deepseek-v3@gb200:tp1:dp16:ep16`" in said
    small = phase_model(coerce(scorecard.engine_of(step))).median_plan().total_s
    assert f"median {small:.0f} s" in said


def test_an_explicit_startup_delay_is_the_constant(scorecard: ModuleType) -> None:
    args = scorecard.build_parser().parse_args(["--startup-delay", "120"])
    assert args.startup_delay == 120.0
    step, wide = _scenario(scorecard, "step 8->40"), _scenario(scorecard, "wide-ep")
    assert scorecard._plan(step, {}, args.startup_delay).setup.startup_delay_s == 120.0
    variant = scorecard._elastic_variant(wide, args.startup_delay)
    assert variant["elastic_ep_follower_ready_seconds"] == 120.0
    assert scorecard.startup_text([120.0], [step]) == (
        "start-up delay 120 s (constant, GPUs charged throughout)"
    )
    assert scorecard.build_parser().parse_args(["--startup-delay", "none"]).startup_delay is None


def test_a_bad_startup_delay_is_refused_naming_the_flag_and_value(
    scorecard: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    for bad in ("-5", "abc", "inf"):
        with pytest.raises(SystemExit) as exit_:
            scorecard.main(["--startup-delay", bad])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert f"argument --startup-delay: {bad!r}: expected a number of seconds >= 0" in err


@pytest.mark.slow
def test_the_wide_ep_rows_compare_elastic_resizing_with_replicas_and_a_fixed_size(
    scorecard: ModuleType,
) -> None:
    elastic = scorecard.WIDE_EP_ELASTIC | {"elastic_ep_min_dp": 8, "elastic_ep_max_dp": 16}
    scenario = scorecard.Scenario(
        "wide-ep small",
        WorkloadSpec(workload="step:rates=6/40,at=60,duration=330,isl=2000,osl=200", seed=3),
        2000,
        100,
        "a short rise on a DP8 engine",
        profile=scorecard.WIDE_EP_PROFILE,
        engine="sim:deepseek-v3@gb200:tp1:dp8:ep8",
        mode="agg",
        elastic=elastic,
        router="round_robin",
        settings={"throughput_adjustment_interval_seconds": 30.0},
    )
    assert scenario.policies == ("fixed-dp16", "planner", "elastic-ep", "best-static")
    found = scorecard._references((scenario, 60.0))
    rows = [
        scorecard._run_one((scenario, p, {}, 60.0, found))
        for p in ("fixed-dp16", "planner", "elastic-ep")
    ]
    fixed, replicas, resized = rows
    assert fixed["max_replicas"] == {"agg": 1} and "elastic_ep" not in fixed
    assert "elastic_ep" not in replicas  # replica scaling: the planner without elastic_ep
    assert resized["max_replicas"] == {"agg": 1} and resized["elastic_ep"]["dp_max"] > 8
    # the followers start for as long as a new replica does
    assert resized["elastic_ep"]["resizes"][0]["followers_ready_s"] == pytest.approx(60.0)
    table = scorecard.wide_ep_table(rows).splitlines()
    assert "| rejected (503) | failed | replicas max | DP min-max (mean) |" in table[0]
    for s, line in zip(rows, table[2:], strict=True):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[1] == s["policy"] and cells[4] == f"{s['gpu_hours']:.2f}"
        assert cells[6] == str(s["rejected"]) and cells[7] == str(s["failed"])
    assert table[4].split("|")[-3].strip().startswith("8-")  # the elastic row's DP range


@pytest.mark.slow
def test_missed_flap_and_oracle_targets_name_their_causes(
    scorecard: ModuleType, rows: list[dict[str, Any]]
) -> None:
    planner = next(s for s in rows if s["label"] == "planner")
    oracle = next(s for s in rows if s["label"] == "oracle")
    # the planner's run carries the account of its own flaps (empty when it made none)
    assert isinstance(planner["flap_cause"], str)
    assert (planner["flap_cause"] == "") == (sum(planner["flaps"].values()) == 0)
    told = "decode 2 -> 1 at 600 s (...), then -> 2 at 900 s (...)"
    flapping = _as(planner, flaps={"prefill": 0, "decode": 3}, flap_cause=told)
    (line,) = scorecard.decision_targets([flapping])
    assert line.split("MISSED 3 flaps in ")[1].split(";")[0].endswith(f"allowed) (cause: {told})")
    calm = _as(flapping, flaps={"prefill": 0, "decode": 0})
    (line,) = scorecard.decision_targets([calm])
    assert "MET 0 flaps" in line and "cause: decode 2 -> 1" not in line
    # over 1.25x the oracle on real traffic: each role's GPU-hours against the oracle's run,
    # and how many changes the oracle made for its figure
    costly = _as(planner, real_traffic=True, gpu_hours=2.0 * planner["oracle_gpu_hours"], flaps={})
    (line,) = scorecard.decision_targets([costly, oracle])
    ratio_check = line.split("MISSED 2.00x oracle <= 1.25x")[1].split("; MET")[0]
    for role, hours in planner["gpu_hours_by_role"].items():
        theirs = oracle["gpu_hours_by_role"][role]
        assert f"{role} {hours:.2f} against the oracle's {theirs:.2f} GPU-h" in ratio_check
    actions = sum(oracle["scale_actions"].values())
    assert f"the oracle changes replicas {actions} times" in ratio_check
    cheap = _as(costly, gpu_hours=planner["oracle_gpu_hours"])
    (line,) = scorecard.decision_targets([cheap, oracle])
    assert "MET 1.00x oracle <= 1.25x;" in line


@pytest.mark.slow
def test_a_missed_attainment_target_names_where_its_requests_arrived(
    scorecard: ModuleType, rows: list[dict[str, Any]]
) -> None:
    planner = next(s for s in rows if s["label"] == "planner")
    # the run's own account: empty only where every request met both SLOs
    assert isinstance(planner["missed_where"], str)
    assert (planner["missed_where"] == "") == (planner["slo_attainment"]["both"] >= 1.0)
    told = "80% of the 100 missed requests arrived in 200-320 s (...)"
    low = _as(planner, slo_attainment={**planner["slo_attainment"], "both": 0.5}, missed_where=told)
    (line,) = scorecard.decision_targets([low])
    assert line.split("MISSED attainment 50.00% >= ")[1].split(";")[0].endswith(f"(cause: {told})")
    high = _as(low, slo_attainment={**planner["slo_attainment"], "both": 1.0})
    (line,) = scorecard.decision_targets([high])
    assert "MET attainment 100.00%" in line and told not in line
