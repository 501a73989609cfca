"""``planner replay --fleet``: bad fleet files are refused naming the field; a shared pool
replay lends an idle floor, reclaims it when its owner bursts (the borrower scaled down and
drained), never holds more than the ceiling at any instant, and writes every member's files
and the fleet's; the static split keeps each member within its share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from disagg_planner.cli.main import main
from disagg_planner.errors import SpecError
from disagg_planner.replay.fleet import count_flips, member_plan, run_fleet, start_within_grants
from disagg_planner.replay.fleet_model import load_fleet, static_shares

PROFILE = "h200_sxm/vllm/llama-3.1-8b-fp8/tp1"
# two members of one priority: "chat" idles at half its floor, then bursts tenfold;
# "batch" wants more than its own floor all along and borrows chat's idle part
PAIR = f"""
pool: {{max_total_gpus: 6, stabilization_seconds: 60}}
members:
  - name: chat
    workload: "step:rates=3/45/3,at=150/330,duration=450,isl=2000,osl=150"
    floor_gpus: 4
    ttft: 1000
    itl: 40
    profile: {PROFILE}
  - name: batch
    workload: "poisson:rate=40,duration=450,isl=3000,osl=150"
    floor_gpus: 2
    ttft: 5000
    itl: 60
    profile: {PROFILE}
"""
FLAGS = {"throughput_adjustment_interval_seconds": 60}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("members: []", "pool: Field required"),
        (
            "pool: {max_total_gpus: 4}\nmembers: [{name: a, workload: 'poisson:rate=1,"
            "duration=10,isl=10,osl=10', floor_gpus: 3}, {name: b, workload: 'poisson:rate=1,"
            "duration=10,isl=10,osl=10', floor_gpus: 3}]",
            "floor_gpus add up to 6, above pool.max_total_gpus (4)",
        ),
        (
            "pool: {max_total_gpus: 4}\nmembers: [{name: a, floor_gpus: 1}]",
            "give exactly one of trace or workload",
        ),
        (
            "pool: {max_total_gpus: 4}\nmembers: [{name: a, workload: x, floor_gpus: -1}]",
            "members[0].floor_gpus = -1",
        ),
        (
            "pool: {max_total_gpus: 4}\nmembers: [{name: a, workload: x, floor_gpus: 1, "
            "priorty: 3}]",
            "members[0].priorty = 3: Extra inputs are not permitted",
        ),
        (
            "pool: {max_total_gpus: 0}\nmembers: [{name: a, workload: x, floor_gpus: 0}]",
            "pool.max_total_gpus = 0",
        ),
        (
            "pool: {max_total_gpus: 4}\nmembers: [{name: a, workload: x, floor_gpus: 1}, "
            "{name: a, workload: y, floor_gpus: 1}]",
            "member names must be unique: a repeated",
        ),
        ("[1, 2]", "expected a mapping with pool: and members:"),
    ],
    ids=[
        "no pool",
        "floors over the ceiling",
        "no workload",
        "negative floor",
        "misspelt key",
        "zero ceiling",
        "duplicate names",
        "not a mapping",
    ],
)
def test_a_bad_fleet_file_names_the_field(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as err:
        load_fleet(path)
    assert str(path) in str(err.value)
    assert message in str(err.value)


def test_a_floor_below_the_members_footprint_is_refused(tmp_path: Path) -> None:
    spec = load_fleet(write(tmp_path, PAIR.replace("floor_gpus: 2", "floor_gpus: 1")))
    with pytest.raises(SpecError, match=r"'batch': floor_gpus = 1 is below its minimum footprint"):
        run_fleet(spec, flags=FLAGS, startup_delay_s=30.0, write_report=False)


def _log(*ticks: tuple[float, int, int]) -> list[dict[str, object]]:
    """One member's grant log: (time, grant, held) per arbiter tick."""
    return [{"t_s": t, "m": {"grant": g, "held": h}} for t, g, h in ticks]


@pytest.mark.parametrize(
    ("log", "flips"),
    [
        (_log((0, 16, 16), (840, 12, 16), (870, 16, 16)), 1),
        # the drain's ticks (grant still below held) are the same withdrawal: the window runs
        # from 840, and the grant raised at 915 comes after it
        (_log((0, 16, 16), (840, 12, 16), (870, 12, 16), (885, 12, 16), (915, 24, 12)), 0),
        # a grant lowered to what the member holds withdrew nothing: raising it is no flip
        (_log((0, 16, 12), (840, 12, 12), (870, 16, 12)), 0),
    ],
    ids=["re-granted within the window", "after the window, drain ticks apart", "idle trimmed"],
)
def test_a_flip_is_a_withdrawal_regranted_within_the_window(
    log: list[dict[str, object]], flips: int
) -> None:
    assert sum(count_flips(log, 60.0).values()) == flips


def test_static_shares_follow_the_floors(tmp_path: Path) -> None:
    spec = load_fleet(write(tmp_path, PAIR.replace("max_total_gpus: 6", "max_total_gpus: 10")))
    assert static_shares(spec) == {"chat": 7, "batch": 3}  # 6.67 and 3.33


def test_the_shared_split_starts_within_its_grants_not_the_static_shares(tmp_path: Path) -> None:
    """batch's first minutes need more than its static share (2 GPUs of 6) while chat's
    need less than its floor: the shared pool starts batch on what one arbitration grants
    it, the ceiling held."""
    spec = load_fleet(write(tmp_path, PAIR))
    plans = {
        m.name: member_plan(m, base_config=None, flags=FLAGS, share=-1, startup_delay_s=30.0)
        for m in spec.members
    }

    def gpus(replicas: dict[str, int]) -> int:
        return sum(replicas.values())  # TP1: one GPU a replica

    wanted = {n: gpus(p.setup.initial_replicas) for n, p in plans.items()}
    assert wanted["batch"] > static_shares(spec)["batch"]
    started = {
        n: gpus(p.setup.initial_replicas) for n, p in start_within_grants(spec, plans).items()
    }
    assert started["batch"] > static_shares(spec)["batch"]
    assert started["chat"] == wanted["chat"]
    assert sum(started.values()) <= spec.pool.max_total_gpus


@pytest.mark.slow
def test_shared_pool_lends_reclaims_and_holds_the_ceiling(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code = main(
        [
            "replay",
            "--fleet",
            str(write(tmp_path, PAIR)),
            "--startup-delay",
            "30",
            "--throughput-adjustment-interval",
            "60",
            "--no-progress",
            "-o",
            str(out),
        ]
    )
    assert code == 0
    fleet = json.loads((out / "fleet.json").read_text())
    for name in ("chat", "batch"):
        for file in ("summary.json", "requests.csv", "timeline.csv", "report.html"):
            assert (out / name / file).is_file()
        assert 0 <= fleet["members"][name]["slo_attainment"]["both"] <= 1
    assert (out / "fleet.html").read_text().count("max_total_gpus 6") >= 1
    # the ceiling held at every instant any replica changed state (starting and draining
    # replicas counted), and it was reached: the pool was contended
    assert fleet["max_gpus_in_use"] == 6 and not fleet["budget_exceeded"]
    kinds = [(e["kind"], e["member"], e["reason"]) for e in fleet["events"]]
    assert ("borrow", "batch", "need_met") in kinds
    reclaims = [e for e in fleet["events"] if e["kind"] == "reclaim"]
    assert reclaims and all(e["member"] == "batch" and e["held"] > e["grant"] for e in reclaims)
    assert all(e["reason"] == "reclaimed" for e in reclaims)
    assert fleet["flips"] == 0
    assert fleet["gpu_hours"] == pytest.approx(
        sum(m["gpu_hours"] for m in fleet["members"].values())
    )
    # the capacity that became ready only after a member's last arrival is part of its meter
    for m in fleet["members"].values():
        late = m["ready_after_last_arrival"]
        assert all(r["ready_s"] > m["last_arrival_s"] and r["gpus"] > 0 for r in late)
        assert sum(r["gpu_hours"] for r in late) <= m["gpu_hours"]


@pytest.mark.slow
def test_static_split_keeps_each_member_within_its_share(tmp_path: Path) -> None:
    spec = load_fleet(write(tmp_path, PAIR))
    result = run_fleet(spec, split="static", flags=FLAGS, startup_delay_s=30.0, write_report=False)
    shares = static_shares(spec)
    for name, member in result.fleet["members"].items():
        assert member["peak_gpus"] <= shares[name]
    assert result.fleet["events"] == [] and result.fleet["reclaims"] == 0
