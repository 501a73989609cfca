"""timeline.csv reproduces the summary: a row at t = 0, one at every change of any replica's
state and one at the end; integrating it gives gpu_hours and each role's replica-hours."""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
from pathlib import Path

import pytest

from disagg_planner.config import PlannerConfig
from disagg_planner.predictors.traces import TraceRequest
from disagg_planner.replay.runner import (
    ReplayResult,
    replica_timeline,
    run_policy,
    write_outputs,
)
from disagg_planner.replay.session import ReplayPlan, WorkloadSpec, make_policy, prepare
from disagg_planner.simulator.cluster import Cluster

PROFILE = "h200_sxm/vllm/llama-3.1-8b-fp8/tp1"
ENGINE = "sim:llama-3.1-8b-fp8@h200_sxm:tp1"
# quiet, then a step the policies scale up for, then quiet again (they scale down and drain)
WORKLOAD = "step:rates=3/45,at=90,duration=240,isl=1500,osl=100"
POLICIES = ["static:2,1", "hpa", "planner", "dynamo-default", "oracle"]


def run_named(plan: ReplayPlan, name: str, out_dir: Path | None = None) -> ReplayResult:
    """``session.run`` without the reference runs (oracle, best static) it adds to summaries:
    the policy's own run and files, as the runner meters them."""
    policy, cfg = make_policy(name, plan)
    effective = cfg or plan.config
    initial = getattr(policy, "initial_replicas", None)
    setup = dataclasses.replace(plan.setup, initial_replicas=initial) if initial else plan.setup
    result = run_policy(
        policy,
        setup=setup,
        requests=plan.requests,
        ttft_slo_ms=plan.config.ttft_ms,
        itl_slo_ms=plan.config.itl_ms,
        advisory=effective.advisory,
    )
    if out_dir is not None:
        write_outputs(out_dir, result, config=effective, roles=tuple(plan.setup.specs))
    return result


def _integral(rows: list[dict[str, str]], column: str) -> float:
    """Seconds x value, each row holding until the next one."""
    total = 0.0
    for row, after in itertools.pairwise(rows):
        total += float(row[column]) * (float(after["t_s"]) - float(row["t_s"]))
    return total


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    cfg = PlannerConfig(
        profile=PROFILE,
        max_gpu_budget=-1,
        ttft_ms=300,
        itl_ms=30,
        throughput_adjustment_interval_seconds=30,
        load_predictor="constant",
    )
    plan = prepare(
        cfg,
        WorkloadSpec(workload=WORKLOAD, seed=4),
        startup_delay_s=40,
        initial={"prefill": 1, "decode": 1},
    )
    root = tmp_path_factory.mktemp("timeline")
    out = {}
    for name in POLICIES:
        out[name] = root / name.replace(":", "-").replace(",", "-")
        run_named(plan, name, out[name])
    return out


def _read(out: Path) -> tuple[dict, list[dict[str, str]]]:
    summary = json.loads((out / "summary.json").read_text())
    with (out / "timeline.csv").open() as handle:
        return summary, list(csv.DictReader(handle))


@pytest.mark.slow
@pytest.mark.parametrize("name", POLICIES)
def test_integrating_the_timeline_gives_the_summary(outputs: dict[str, Path], name: str) -> None:
    summary, rows = _read(outputs[name])
    assert float(rows[0]["t_s"]) == 0.0
    assert rows[-1]["event"] == "end"
    assert float(rows[-1]["t_s"]) == pytest.approx(summary["metered_span_s"], abs=1e-6)
    times = [float(r["t_s"]) for r in rows]
    assert times == sorted(times)
    gpu_hours = _integral(rows, "gpus_in_use") / 3600.0
    assert gpu_hours == pytest.approx(summary["gpu_hours"], rel=0.005)
    for role in ("prefill", "decode"):
        replica_hours = _integral(rows, f"replicas_{role}") / 3600.0
        assert replica_hours == pytest.approx(summary["replica_hours"][role], rel=0.005)
        # 1 GPU per replica with this engine
        assert replica_hours == pytest.approx(summary["gpu_hours_by_role"][role], rel=0.005)
        for r in rows:
            assert int(r[f"replicas_{role}"]) == sum(
                int(r[f"{state}_{role}"]) for state in ("starting", "ready", "draining")
            )


# dynamo-default decides every 180 s: too rarely to answer this short step
@pytest.mark.slow
@pytest.mark.parametrize("name", ["hpa", "planner", "oracle"])
def test_a_replica_becoming_ready_between_ticks_has_its_row(
    outputs: dict[str, Path], name: str
) -> None:
    summary, rows = _read(outputs[name])
    assert summary["max_replicas"]["prefill"] > 1, "the step should make every policy scale"
    starts = [
        (float(r["t_s"]), int(r["starting_prefill"]))
        for r in rows
        if int(r["starting_prefill"]) > 0
    ]
    assert starts
    # 40 s after a replica is asked for, the row that shows it ready is there, whether or
    # not the policy ticked then
    t_start = starts[0][0]
    ready_rows = [r for r in rows if abs(float(r["t_s"]) - (t_start + 40.0)) < 1e-6]
    assert ready_rows, f"no row at {t_start + 40.0}"
    before = next(r for r in rows if float(r["t_s"]) == t_start)
    assert int(ready_rows[-1]["ready_prefill"]) > int(before["ready_prefill"])


def test_rows_follow_every_state_change_of_a_bare_cluster() -> None:
    cluster = Cluster(engines={"prefill": ENGINE, "decode": ENGINE}, startup_delay_s=20.0)
    cluster.run_until(10.0)
    cluster.set_replicas("prefill", 3)  # two start at 10 s, ready at 30 s
    cluster.run_until(15.0)
    cluster.set_replicas("decode", 2)  # one starts at 15 s ...
    cluster.run_until(25.0)
    cluster.set_replicas("decode", 1)  # ... and is cancelled while starting, at 25 s
    cluster.run_until(40.0)
    cluster.set_replicas("prefill", 1)  # two idle ones stop at once
    cluster.run_until(70.0)
    rows = replica_timeline(
        cluster.replicas,
        [],
        roles=cluster.roles,
        initial_desired={"prefill": 1, "decode": 1},
        end_s=70.0,
    )
    assert [r.t_s for r in rows] == [0.0, 10.0, 15.0, 25.0, 30.0, 40.0, 70.0]
    assert [r.event for r in rows] == ["start"] + ["state"] * 5 + ["end"]
    assert [r.gpus_in_use for r in rows] == [2, 4, 5, 4, 4, 2, 2]
    assert rows[1].starting == {"prefill": 2, "decode": 0}
    assert rows[4].ready == {"prefill": 3, "decode": 1}
    seconds = sum(a.gpus_in_use * (b.t_s - a.t_s) for a, b in itertools.pairwise(rows))
    assert seconds == pytest.approx(cluster.gpu_seconds, rel=1e-12)


def test_a_draining_replica_is_shown_until_it_stops() -> None:
    cluster = Cluster(
        engines={"prefill": ENGINE, "decode": ENGINE}, replicas={"prefill": 1, "decode": 2}
    )
    cluster.submit(
        TraceRequest(arrival_s=0.0, input_length=200, output_length=3000) for _ in range(4)
    )
    cluster.run_until(5.0)
    cluster.set_replicas("decode", 1)  # the busier-free one drains while serving
    cluster.run_until(8.0)
    cluster.run_to_completion()
    end = cluster.now
    rows = replica_timeline(
        cluster.replicas,
        [],
        roles=cluster.roles,
        initial_desired={"prefill": 1, "decode": 2},
        end_s=end,
    )
    draining = [r for r in rows if r.draining["decode"] == 1]
    assert draining and draining[0].t_s == 5.0
    assert all(r.replicas["decode"] == 2 for r in draining)
    stopped = [r for r in rows if r.t_s > draining[-1].t_s]
    assert stopped and stopped[0].replicas["decode"] == 1
    seconds = sum(a.gpus_in_use * (b.t_s - a.t_s) for a, b in itertools.pairwise(rows))
    assert seconds == pytest.approx(cluster.gpu_seconds, rel=1e-12)
