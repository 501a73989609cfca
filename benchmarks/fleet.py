"""Fleet scorecard: several deployments on one GPU pool, shared through the arbiter against
fixed shares and against planners without a ceiling, on the same traffic in the same run.

Two fleets (``planner replay --fleet``, :mod:`disagg_planner.replay.fleet`):

On Llama-3.3-70B FP8, TP4 on H200 (the bundled profile: 4 GPUs a replica).

- ``servegen trio``: the three ServeGen language models (``$PLANNER_TRACE_DIR/servegen/``)
  as three deployments, their second day compressed 96x into 900 s at a mean of 30 req/s
  each. Their daily peaks do not coincide (m-large and m-mid peak at night, m-small in the
  evening). m-large is the high priority.
- ``burst over batch``: a high-priority chat deployment that bursts (on/off, 5-8x for
  1-3 min) over a low-priority, batch-like one at a steady heavy rate (12 req/s of 3,000
  tokens) with a loose SLO.

The loads are sized on issue 31's refitted vLLM engine so that the pool has something to
share: each member's own peak needs more than one prefill and one decode replica (at the
earlier 15 req/s m-mid and m-small, and at 5 req/s the batch member, never left that
footprint, and the shared pool ran exactly as the static split).

Each fleet runs three ways: ``unbounded`` (each member's planner without a ceiling: what
they would hold sized for their own needs), then, with the pool's ceiling set to 80 % of the
sum of the members' own peaks and each member's floor to a third of its own peak, ``static`` (the
pool cut into fixed shares in proportion to the floors, each planner with its share as its
``max_gpu_budget``) and ``shared`` (the arbiter). ``peak-sized`` is what provisioning each
member at its own peak for the whole span costs (the unbounded run's peaks; GPU-hours only).
Each high-priority member's own best static deployment (the replay's search,
:mod:`disagg_planner.replay.best_static`, on its own traffic) says where the 99 % target
applies: where it reaches 99 % on no more GPUs than the pool can grant that member (the
ceiling less the other members' floors).

The compressed day shortens the planners' clocks with it (throughput interval 60 s,
scale-down stabilisation 120 s, burst memory off, 60 s start-up; the arbiter's window 60 s):
at 96x the defaults' 600 s stabilisation would be 16 hours of the real day.

    python benchmarks/fleet.py [--write] [--jobs N] [--only NAME]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

# Run as a script, this folder comes first on sys.path, and benchmarks/predictors.py would
# shadow the predictors package: look in the repository root first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# loaded as a module (the tests), this folder is not on sys.path: last, for results_block
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.append(str(Path(__file__).resolve().parent))

from results_block import markers, write_block

from disagg_planner.replay.bounds import compute_references
from disagg_planner.replay.fleet import member_plan, run_fleet
from disagg_planner.replay.fleet_model import FleetMemberSpec, FleetSpec, static_shares
from disagg_planner.replay.parallel import resolve_jobs
from disagg_planner.replay.search import DEFAULT_SLO_TARGET
from disagg_planner.replay.session import ORACLE_WINDOW_S
from tests.traces import servegen_folder

ROOT = Path(__file__).resolve().parents[1]
PROFILE = "h200_sxm/vllm/llama-3.3-70b-fp8/tp4"
STARTUP_S = 60.0
FLAGS: dict[str, Any] = {
    "profile": PROFILE,
    "throughput_adjustment_interval_seconds": 60,
    "scale_down_stabilization_seconds": 120,
    "burst_memory_seconds": None,
}
WINDOW_S = 60.0
FOOTPRINT = 8  # one prefill and one decode replica of 4 GPUs: the least a member runs on
CEILING_SHARE = 0.8


def _servegen(model: str) -> str:
    return f"servegen:{servegen_folder(model)},start=1d,span=1d,speedup=96,rate=30"


FLEETS: dict[str, list[dict[str, Any]]] = {
    "servegen trio": [
        {"name": "m-large", "trace": _servegen("m-large"), "priority": 10, "ttft": 2000, "itl": 50},
        {"name": "m-mid", "trace": _servegen("m-mid"), "priority": 0, "ttft": 2000, "itl": 50},
        {"name": "m-small", "trace": _servegen("m-small"), "priority": 0, "ttft": 2000, "itl": 50},
    ],
    "burst over batch": [
        {
            "name": "chat",
            "workload": "onoff:rate=1.5,duration=900,isl=2000,osl=200,busy=1m-3m,"
            "factor=5-8,quiet=4m",
            "priority": 10,
            "ttft": 2000,
            "itl": 50,
        },
        {
            "name": "batch",
            "workload": "poisson:rate=12,duration=900,isl=3000,osl=300",
            "priority": 0,
            "ttft": 20000,
            "itl": 100,
        },
    ],
}


def _spec(members: list[dict[str, Any]], ceiling: int, floors: dict[str, int]) -> FleetSpec:
    return FleetSpec.model_validate(
        {
            "pool": {"max_total_gpus": ceiling, "stabilization_seconds": WINDOW_S},
            "members": [m | {"floor_gpus": floors[m["name"]]} for m in members],
        }
    )


def _run(job: tuple[str, str, int, dict[str, int]]) -> dict[str, Any]:
    fleet, split, ceiling, floors = job
    spec = _spec(FLEETS[fleet], ceiling, floors)
    t0 = time.perf_counter()
    result = run_fleet(
        spec, split=split, flags=FLAGS, startup_delay_s=STARTUP_S, write_report=False
    )  # type: ignore[arg-type]
    out = dict(result.fleet)
    out.pop("events")
    out["fleet"] = fleet
    out["span_h"] = max(r.summary.metered_span_s for r in result.results.values()) / 3600.0
    out["shares"] = static_shares(spec)
    out["wall_s"] = time.perf_counter() - t0
    return out


def _best_static(job: tuple[str, str]) -> dict[str, Any]:
    """A member's own best static deployment (the replay's search: the cheapest fixed
    replicas meeting the SLO target, :mod:`disagg_planner.replay.best_static`) on its own
    traffic, without a ceiling: the GPUs it takes and the attainment it reaches."""
    fleet, name = job
    member = next(m for m in FLEETS[fleet] if m["name"] == name)
    spec = FleetMemberSpec.model_validate(member | {"floor_gpus": FOOTPRINT})
    plan = member_plan(spec, base_config=None, flags=FLAGS, share=-1, startup_delay_s=STARTUP_S)
    refs = compute_references(plan, window_s=ORACLE_WINDOW_S)
    replicas = refs.best_static.replicas
    return {
        "fleet": fleet,
        "member": name,
        "replicas": replicas,
        "gpus": sum(n * plan.setup.specs[r].gpus for r, n in replicas.items()),
        "attainment": refs.best_static_run.slo_attainment,
        "gpu_hours": refs.best_static_run.gpu_hours,
        "qualifies": refs.best_static.qualifies,
    }


def _top_members(fleet: str) -> list[str]:
    top = max(m["priority"] for m in FLEETS[fleet])
    return [m["name"] for m in FLEETS[fleet] if m["priority"] == top]


def _attainment(row: dict[str, Any], name: str) -> float:
    return float(row["members"][name]["slo_attainment"]["both"])


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| fleet | split | ceiling | attainment per member (both SLOs) | high priority | "
        "pool GPU-h | vs static | peak GPUs | reclaims | flips |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for fleet in dict.fromkeys(r["fleet"] for r in rows):
        group = {r["split"]: r for r in rows if r["fleet"] == fleet}
        static = group.get("static")
        for split in ("unbounded", "peak-sized", "static", "shared"):
            r = group.get(split)
            if r is None:
                continue
            per = ", ".join(
                f"{n} (p{m['priority']}) {m['slo_attainment']['both']:.2%}"
                for n, m in r["members"].items()
            )
            high = f"{r['priorities'][max(r['priorities'], key=int)]['slo_attainment_both']:.2%}"
            if split == "peak-sized":
                # GPU-hours only: each member's unbounded peak held all along, not simulated
                per = ", ".join(f"{n} {m['peak_gpus']} GPUs" for n, m in r["members"].items())
                per += " all along (GPU-hours only, not simulated)"
                high = "-"
            ratio = f"{r['gpu_hours'] / static['gpu_hours']:.2f}x" if static else "-"
            ceiling = r["pool"]["max_total_gpus"] if split in ("static", "shared") else "none"
            lines.append(
                f"| {fleet} | {split} | {ceiling} | {per} | {high} | {r['gpu_hours']:.2f} | "
                f"{ratio} | {r['max_gpus_in_use']} | {r['reclaims']} | {r['flips']} |"
            )
    return "\n".join(lines)


def targets(rows: list[dict[str, Any]], best: list[dict[str, Any]]) -> list[str]:
    out = []
    for fleet in dict.fromkeys(r["fleet"] for r in rows):
        group = {r["split"]: r for r in rows if r["fleet"] == fleet}
        shared, static, peak = group["shared"], group["static"], group["peak-sized"]
        top = max(shared["priorities"], key=int)
        hi_shared = shared["priorities"][top]["slo_attainment_both"]
        hi_static = static["priorities"][top]["slo_attainment_both"]
        out.append(
            f"- {fleet}: high-priority attainment shared {hi_shared:.2%} >= static "
            f"{hi_static:.2%}: {_met(hi_shared >= hi_static)}"
        )
        out += [_best_static_target(group, b) for b in best if b["fleet"] == fleet]
        ok = shared["gpu_hours"] <= static["gpu_hours"]
        out.append(
            # three decimals: a difference under 0.005 GPU-h must not print as equal figures
            f"- {fleet}: pool GPU-h shared {shared['gpu_hours']:.3f} <= static "
            f"{static['gpu_hours']:.3f}: {_met(ok)}"
            + ("" if ok else _gpu_hours_cause(shared, static))
        )
        saving = 1 - shared["gpu_hours"] / peak["gpu_hours"]
        out.append(
            f"- {fleet}: shared {shared['gpu_hours']:.2f} GPU-h against {peak['gpu_hours']:.2f} "
            f"for each member provisioned at its own peak: {saving:.0%} fewer (target >= 20%): "
            f"{_met(saving >= 0.2)}"
        )
        for split in ("static", "shared"):
            r = group[split]
            ok = r["max_gpus_in_use"] <= r["pool"]["max_total_gpus"]
            out.append(
                f"- {fleet}: {split} peak {r['max_gpus_in_use']} GPUs in use (starting and "
                f"draining counted) <= ceiling {r['pool']['max_total_gpus']}: {_met(ok)}"
            )
    return out


def _best_static_target(group: dict[str, dict[str, Any]], best: dict[str, Any]) -> str:
    """A high-priority member's attainment in the shared pool >= the target wherever its own
    best static deployment reaches the target within what the pool can grant it (the
    ceiling less the other members' floors, which the pool keeps for them)."""
    shared, unbounded = group["shared"], group["unbounded"]
    name = best["member"]
    reachable = shared["pool"]["max_total_gpus"] - sum(
        m["floor_gpus"] for n, m in shared["members"].items() if n != name
    )
    own = (
        f"its own best static {_replicas(best['replicas'])} ({best['gpus']} GPUs, "
        f"{best['gpu_hours']:.2f} GPU-h) reaches {best['attainment']:.2%}"
    )
    head = f"- {group['shared']['fleet']}: {name} (high priority): {own}"
    if not (best["qualifies"] and best["attainment"] >= DEFAULT_SLO_TARGET):
        return f"{head}, under {DEFAULT_SLO_TARGET:.0%}: target not applicable"
    if best["gpus"] > reachable:
        return (
            f"{head}, but on more than the pool can grant it ({reachable} GPUs: the ceiling "
            "less the other members' floors): target not applicable"
        )
    got, alone = _attainment(shared, name), _attainment(unbounded, name)
    line = (
        f"{head} within the {reachable} GPUs the pool can grant it; shared {got:.2%} >= "
        f"{DEFAULT_SLO_TARGET:.0%}: {_met(got >= DEFAULT_SLO_TARGET)}"
    )
    if got >= DEFAULT_SLO_TARGET:
        return line
    if alone < DEFAULT_SLO_TARGET:
        return line + (
            f" (cause: its own planner without a ceiling reaches only {alone:.2%}: the loss is "
            "the single planner's, reacting to load with a "
            f"{STARTUP_S:.0f} s start-up, not the pool's)"
        )
    return line + f" (cause: the pool; without a ceiling it reaches {alone:.2%})"


def _replicas(replicas: dict[str, int]) -> str:
    return " ".join(f"{n}{r[0].upper()}" for r, n in replicas.items())


def _gpu_hours_cause(shared: dict[str, Any], static: dict[str, Any]) -> str:
    """Where the shared pool's GPU-hours went against the static split's (the cause of a
    missed GPU-hour target): every member's difference, either sign, with its attainment in
    both runs; and where a member's extra is capacity that became ready only after its last
    request arrived (the shared run's replicas that the static run did not start), so said,
    with when it was ordered and when it was ready."""
    parts = []
    for name, member in shared["members"].items():
        other = static["members"][name]
        extra = member["gpu_hours"] - other["gpu_hours"]
        before, after = _attainment(static, name), _attainment(shared, name)
        gain = (
            f"attainment {before:.2%} -> {after:.2%}"
            if abs(after - before) > 1e-4
            else f"attainment {after:.2%} in both"
        )
        part = f"{name} {extra:+.3f} GPU-h, {gain}"
        seen = {(r["role"], r["start_s"]) for r in other.get("ready_after_last_arrival", ())}
        late = [
            r
            for r in member.get("ready_after_last_arrival", ())
            if (r["role"], r["start_s"]) not in seen
        ]
        late_hours = sum(r["gpu_hours"] for r in late)
        if extra > 0 and late_hours > 0:
            what = ", ".join(
                f"{r['gpus']} GPUs of {r['role']} ordered at {r['start_s']:.0f} s, ready at "
                f"{r['ready_s']:.0f} s"
                for r in late
            )
            part += (
                f", of which {late_hours:.3f} GPU-h is capacity ready only after its last "
                f"arrival ({member['last_arrival_s']:.3f} s): {what}"
            )
        parts.append(part)
    return " (cause, per member, shared against static: " + "; ".join(parts) + ")"


def _met(ok: bool) -> str:
    return "met" if ok else "MISSED"


def _peak_sized(unbounded: dict[str, Any]) -> dict[str, Any]:
    """Each member provisioned at its own (unbounded) peak for the whole span."""
    members = {
        n: m | {"gpu_hours": m["peak_gpus"] * unbounded["span_h"]}
        for n, m in unbounded["members"].items()
    }
    return unbounded | {
        "split": "peak-sized",
        "members": members,
        "gpu_hours": sum(m["gpu_hours"] for m in members.values()),
        "max_gpus_in_use": sum(m["peak_gpus"] for m in members.values()),
        "reclaims": 0,
        "flips": 0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="Update benchmarks/RESULTS.md.")
    parser.add_argument("--jobs", type=int, help="Parallel processes (default: the cores).")
    parser.add_argument("--only", action="append", help="Fleet name prefix to run.")
    args = parser.parse_args(argv)
    jobs = resolve_jobs(args.jobs)
    fleets = [f for f in FLEETS if not args.only or any(f.startswith(o) for o in args.only)]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        # each high-priority member's own best static (no ceiling), alongside the rest
        best_jobs = pool.map(_best_static, [(f, n) for f in fleets for n in _top_members(f)])
        # the members' own peaks (no ceiling) size the pool and the floors
        ones = {f: {m["name"]: FOOTPRINT for m in FLEETS[f]} for f in fleets}
        big = {f: FOOTPRINT * len(FLEETS[f]) for f in fleets}
        unbounded = dict(
            zip(
                fleets,
                pool.map(_run, [(f, "unbounded", big[f], ones[f]) for f in fleets]),
                strict=True,
            )
        )
        jobs_left = []
        for f in fleets:
            peaks = {n: m["peak_gpus"] for n, m in unbounded[f]["members"].items()}
            floors = {n: max(FOOTPRINT, math.ceil(p / 3)) for n, p in peaks.items()}
            ceiling = max(sum(floors.values()), math.floor(CEILING_SHARE * sum(peaks.values())))
            jobs_left += [(f, split, ceiling, floors) for split in ("static", "shared")]
        rows = [_peak_sized(u) for u in unbounded.values()] + list(unbounded.values())
        rows += list(pool.map(_run, jobs_left))
        best = list(best_jobs)
    wall = time.perf_counter() - t0
    body = table(rows) + "\n\nTargets:\n\n" + "\n".join(targets(rows, best))
    command = "python benchmarks/fleet.py" + (f" --jobs {args.jobs}" if args.jobs else "")
    note = (
        f"`{command}` ({wall:.0f} s wall). The day compressed 96x into 900 s; planners' "
        "throughput interval 60 s, scale-down stabilisation 120 s, burst memory off, 60 s "
        f"start-up; the arbiter's window {WINDOW_S:.0f} s. Ceiling: {CEILING_SHARE:.0%} of the "
        "sum of the members' own peaks (unbounded run); floors a third of each one's peak; the "
        "static split cuts the ceiling in proportion to the floors, in whole GPUs (a member runs "
        f"whole {FOOTPRINT // 2}-GPU replicas: the rest of its share stays idle)."
    )
    print(note + "\n\n" + body)
    if args.write:
        _write_section(note + "\n\n" + body + "\n")
    return 0


def _write_section(body: str) -> None:
    begin, end = markers("fleet")
    write_block(
        "fleet", f"{begin}\n## Fleet: one GPU pool shared by several deployments\n\n{body}{end}"
    )


if __name__ == "__main__":
    sys.exit(main())
