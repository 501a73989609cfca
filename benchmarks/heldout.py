"""Held-out decision quality (issue 29): the planner, with its defaults, on traffic no rule was
tuned to.

The scorecard's workloads are the ones every rule was developed and checked on, so its
figures flatter the planner. This script runs the same policies on the same simulated cluster
(the scorecard's runner, references and start-up) over a second set of workloads kept out of
that loop: other seeds of the synthetic shapes, other shapes and SLOs, other windows and
models of the shared traces, and a 70B TP4 profile. A decision change is judged here as well:
one that gains on the scorecard and loses here is tuning, not a better rule.

The set was fixed before its first run (stop 48), from shapes and windows the scorecard does
not hold; it is not to be edited to make a figure pass. Per workload it prints, for the
planner, ``hpa`` and Dynamo's defaults, SLO attainment and GPU-hours; best-static's (the
cheapest static deployment meeting the target, the references' search) and the
reactive-oracle's attainment; then the planner against each over the whole set, and issue
29's per-workload targets as the scorecard prints them (MET or MISSED, a missed GPU-hour
target with its cause).

    python benchmarks/heldout.py [--write] [--jobs N] [--only NAME] [--duration S]
        [--startup-delay S|none] [--variant K=V ...] [--json]

``--duration S`` keeps each workload's first S seconds (a test's scale); ``--variant`` runs
the planner policy with extra settings, as the scorecard's (a candidate default is judged
here before it becomes one); ``--write`` replaces the held-out block of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent
# as speed_sweep.py: this folder first (scorecard, results_block), then the repository root
for folder in (BENCHMARKS, BENCHMARKS.parent):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

import scorecard  # noqa: E402
from results_block import markers, write_block  # noqa: E402

from disagg_planner.cli.arguments import positive_seconds, seconds_or_none  # noqa: E402
from disagg_planner.errors import SpecError  # noqa: E402
from disagg_planner.replay.parallel import resolve_jobs  # noqa: E402
from disagg_planner.replay.session import WorkloadSpec  # noqa: E402
from tests.traces import AZURE_CONV, MOONCAKE_CONV, servegen_folder  # noqa: E402

# the policies compared; best-static's figures come with every run's references
POLICIES = ("planner", "hpa", "dynamo-default", "reactive-oracle")
SEVENTY_B = "h200_sxm/vllm/llama-3.3-70b-fp8/tp4"
# the on/off shapes (none is the scorecard's rate=4, busy 1-5 min, x5-10, quiet 10 min)
ONOFF_LARGE = "onoff:rate=6,duration=1h,isl=2000,osl=300,busy=2m-8m,factor=4-8,quiet=6m"
ONOFF_MILD = "onoff:rate=10,duration=1h,isl=3000,osl=400,busy=3m-10m,factor=2-4,quiet=5m"
ONOFF_RARE = "onoff:rate=3,duration=1h,isl=3000,osl=200,busy=1m-3m,factor=6-12,quiet=8m"


def _servegen(model: str, day: int, rate: float) -> str:
    """Day ``day`` (counted from 1) of ServeGen ``model``'s clients, compressed to one hour at
    a mean of ``rate`` req/s, as the scorecard's m-large workload is built."""
    return f"servegen:{servegen_folder(model)},start={day - 1}d,span=1d,speedup=24,rate={rate:g}"


SCENARIOS = (
    scorecard.Scenario(
        "on/off large bursts, seed 1",
        WorkloadSpec(workload=ONOFF_LARGE, seed=1),
        500,
        20,
        "on/off at 6 req/s, busy spells of 2-8 min at 4-8x (24-48 req/s) after quiet spells "
        "of 6 min on average; ISL/OSL 2000/300, 1 h",
    ),
    scorecard.Scenario(
        "on/off large bursts, seed 2",
        WorkloadSpec(workload=ONOFF_LARGE, seed=2),
        500,
        20,
        "the same shape, another draw",
    ),
    scorecard.Scenario(
        "on/off mild, seed 1",
        WorkloadSpec(workload=ONOFF_MILD, seed=1),
        500,
        20,
        "on/off at 10 req/s, busy spells of 3-10 min at 2-4x after quiet spells of 5 min; "
        "ISL/OSL 3000/400, 1 h",
    ),
    scorecard.Scenario(
        "on/off rare spikes, seed 1",
        WorkloadSpec(workload=ONOFF_RARE, seed=1),
        500,
        20,
        "on/off at 3 req/s, busy spells of 1-3 min at 6-12x (18-36 req/s) after quiet spells "
        "of 8 min; ISL/OSL 3000/200, 1 h",
    ),
    scorecard.Scenario(
        "long prompts",
        WorkloadSpec(
            workload="heavytail:rate=2,duration=1h,context=131072,median=8192,p99=65536,osl=400",
            seed=1,
        ),
        5000,
        20,
        "2 req/s, lognormal ISL with median 8192 and p99 65536 (mean about 12k), OSL 400, 1 h; "
        "TTFT target 5 s",
    ),
    scorecard.Scenario(
        "servegen m-mid day 5",
        WorkloadSpec(trace=_servegen("m-mid", 5, 120)),
        1000,
        30,
        "ServeGen m-mid's clients (short requests: mean ISL about 250, OSL about 43), day 5 "
        "compressed to one hour at a mean of 120 req/s; TTFT 1 s, ITL 30 ms",
        real=True,
    ),
    scorecard.Scenario(
        "servegen m-large day 10",
        WorkloadSpec(trace=_servegen("m-large", 10, 45)),
        3000,
        30,
        "ServeGen m-large's clients (the scorecard's model, another day), day 10 compressed to "
        "one hour at a mean of 45 req/s; TTFT 3 s, ITL 30 ms",
        real=True,
    ),
    scorecard.Scenario(
        "azure-conv x8, seed 1",
        WorkloadSpec(scale_load=8, seed=1),
        500,
        20,
        "Azure 2023 conversation trace (1 h), each request cloned 8x (the scorecard's is 16x), "
        "another seed",
        trace=AZURE_CONV,
        real=True,
    ),
    scorecard.Scenario(
        "mooncake-conv x3, seed 1",
        WorkloadSpec(scale_load=3, seed=1),
        5000,
        20,
        "Mooncake conversation trace (1 h), each request cloned 3x (the scorecard's is 4x), "
        "another seed; TTFT 5 s",
        trace=MOONCAKE_CONV,
        real=True,
    ),
    scorecard.Scenario(
        "sinusoid 5-50 req/s, 45 min period",
        WorkloadSpec(
            workload="sinusoid:min=5,max=50,period=2700,duration=1h,isl=2500,osl=500", seed=1
        ),
        500,
        20,
        "5 to 50 req/s, period 2700 s, ISL/OSL 2500/500, 1 h",
    ),
    scorecard.Scenario(
        "70B TP4 on/off",
        WorkloadSpec(
            workload="onoff:rate=1.5,duration=1h,isl=2000,osl=300,busy=2m-6m,factor=3-6,quiet=8m",
            seed=1,
        ),
        1000,
        30,
        f"Llama-3.3-70B FP8 at TP4 (bundled profile {SEVENTY_B}, 4 GPUs an engine): on/off at "
        "1.5 req/s, busy spells of 2-6 min at 3-6x; ISL/OSL 2000/300, 1 h; TTFT 1 s, ITL 30 ms",
        profile=SEVENTY_B,
    ),
)


def chosen(only: Sequence[str] | None) -> list[scorecard.Scenario]:
    """The held-out workloads, or those whose name starts with one of ``only``."""
    picked = [s for s in SCENARIOS if not only or any(s.name.startswith(o) for o in only)]
    if not picked:
        names = [s.name for s in SCENARIOS]
        raise SpecError(
            f"--only {list(only or [])}: no held-out workload starts so; known: {names}"
        )
    return picked


def runs(
    scenarios: Sequence[scorecard.Scenario],
    *,
    jobs: int,
    startup: float | None,
    duration_s: float | None = None,
    variant: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Every policy on every workload (cut to ``duration_s``; the planner with ``variant``'s
    settings), each workload's references found once first; in ``jobs`` processes (1: in
    this one)."""
    settings = variant or {}
    located = []
    for s in scenarios:
        s = s.located()
        if duration_s is not None:
            s = replace(s, workload=replace(s.workload, duration_s=duration_s))
        located.append(s)
    pool = ProcessPoolExecutor(jobs) if jobs > 1 else None
    with pool if pool is not None else contextlib.nullcontext():
        found = _map(scorecard._references, [(s, startup) for s in located], pool)
        tasks = [
            (s, p, settings if p == "planner" else {}, startup, f)
            for s, f in zip(located, found, strict=True)
            for p in POLICIES
        ]
        rows = _map(scorecard._run_one, tasks, pool)
    for (_s, _p, given, _startup, _f), row in zip(tasks, rows, strict=True):
        row["settings"] = given  # what the policy ran with beyond its defaults
    return rows


def _map(fn: Callable[[Any], Any], items: Sequence[Any], pool: Executor | None) -> list[Any]:
    """``fn`` over ``items`` in ``pool``'s processes, or in this one without a pool."""
    return [fn(x) for x in items] if pool is None else list(pool.map(fn, items))


def _by_workload(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(r["scenario"], {})[r["label"]] = r
    return out


def _att(row: dict[str, Any] | None) -> str:
    return "-" if row is None else f"{row['slo_attainment']['both']:.2%}"


def _cell(row: dict[str, Any] | None) -> str:
    return "-" if row is None else f"{_att(row)} / {row['gpu_hours']:.2f}"


def table(rows: Sequence[dict[str, Any]]) -> str:
    """One line per workload: each policy's attainment / GPU-hours, best-static's, the
    reactive-oracle's attainment, and the planner's GPU-hours over best-static's."""
    head = (
        "| workload | planner | hpa | dynamo-default | best-static | reactive-oracle SLO "
        "| planner x best-static | planner - hpa (points) |"
    )
    lines = [head, "|" + "---|" * 8]
    for name, mine in _by_workload(rows).items():
        me = mine["planner"]
        static = me["best_static"]
        hpa = mine.get("hpa")
        gap = (
            "-"
            if hpa is None
            else f"{(me['slo_attainment']['both'] - hpa['slo_attainment']['both']) * 100:+.2f}"
        )
        lines.append(
            f"| {name} | {_cell(me)} | {_cell(hpa)} | {_cell(mine.get('dynamo-default'))} "
            f"| {float(static['slo_attainment']):.2%} / {float(static['gpu_hours']):.2f} "
            f"| {_att(mine.get('reactive-oracle'))} "
            f"| {scorecard._r(me.get('gpu_hours_ratio_to_best_static'))} | {gap} |"
        )
    return "\n".join(lines)


def summary(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The planner against each other policy over the whole set: mean attainment, total
    GPU-hours, and on how many workloads it served at least as many requests within the SLO."""
    grouped = _by_workload(rows)
    planner = [m["planner"] for m in grouped.values()]
    n = len(planner)

    def mean_att(rs: Sequence[dict[str, Any]]) -> float:
        return sum(r["slo_attainment"]["both"] for r in rs) / len(rs)

    met = sum(scorecard.attainment_target(r).startswith("MET") for r in planner)
    lines = [
        f"- planner: mean attainment {mean_att(planner):.2%} over {n} workloads, "
        f"{sum(r['gpu_hours'] for r in planner):.2f} GPU-h in all; attainment target "
        f"(issue 29) met on {met} of {n}"
    ]
    statics = [float(r["best_static"]["gpu_hours"]) for r in planner]
    static_att = [float(r["best_static"]["slo_attainment"]) for r in planner]
    lines.append(
        f"- best-static: mean attainment {sum(static_att) / n:.2%}, {sum(statics):.2f} GPU-h; "
        f"the planner at or under its GPU-hours on "
        f"{sum(r['gpu_hours'] <= s + 1e-9 for r, s in zip(planner, statics, strict=True))} of {n}"
    )
    for other in POLICIES[1:]:
        pairs = [(m["planner"], m[other]) for m in grouped.values() if other in m]
        if not pairs:
            continue
        theirs = [o for _, o in pairs]
        at_least = sum(
            p["slo_attainment"]["both"] >= o["slo_attainment"]["both"] - 1e-12 for p, o in pairs
        )
        cheaper = sum(p["gpu_hours"] <= o["gpu_hours"] + 1e-9 for p, o in pairs)
        lines.append(
            f"- {other}: mean attainment {mean_att(theirs):.2%}, "
            f"{sum(o['gpu_hours'] for o in theirs):.2f} GPU-h; the planner's attainment at "
            f"least its on {at_least} of {len(pairs)}, its GPU-hours at most its on "
            f"{cheaper} of {len(pairs)}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--write", action="store_true", help="Update benchmarks/RESULTS.md.")
    parser.add_argument("--jobs", type=int, help="Parallel processes (default: the cores).")
    parser.add_argument("--only", action="append", help="Held-out workload name prefix to run.")
    parser.add_argument(
        "--duration", type=positive_seconds, help="Keep each workload's first S seconds only."
    )
    parser.add_argument(
        "--startup-delay",
        type=seconds_or_none,
        metavar="S|none",
        help="Seconds from scale-up to ready, the same for every replica. Default, or 'none': "
        "each replica's start-up drawn from its engine's phase model, as the scorecard's.",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="A setting of the planner policy (e.g. prefill_batching=true).",
    )
    parser.add_argument("--json", action="store_true", help="Print the rows as JSON.")
    args = parser.parse_args(argv)
    try:
        jobs = resolve_jobs(args.jobs)
        picked = chosen(args.only)
    except SpecError as e:
        parser.error(str(e))
    given = scorecard.variants(args.variant)
    t0 = time.perf_counter()
    rows = runs(
        picked,
        jobs=jobs,
        startup=args.startup_delay,
        duration_s=args.duration,
        variant=given,
    )
    wall = time.perf_counter() - t0
    body = (
        (f"The planner with {given}.\n\n" if given else "")
        + table(rows)
        + "\n\nOver the set:\n\n"
        + "\n".join(summary(rows))
        + "\n\nTargets (issue 29, as the scorecard's):\n\n"
        + "\n".join(scorecard.decision_targets(rows))
    )
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
    else:
        print(body)
        print(f"\n{len(rows)} runs in {wall:.0f} s")
    if args.write:
        command = "python benchmarks/heldout.py " + " ".join(sys.argv[1:] if argv is None else argv)
        said = scorecard.startup_text([args.startup_delay], picked)
        notes = "\n".join(f"- **{s.name}**: {s.note}" for s in picked)
        note = (
            f"Command: `{command.strip()}` ({len(rows)} runs, {wall:.0f} s wall on the 2-core "
            "dev machine). Workloads no rule was tuned to, on the scorecard's cluster and "
            "runner (Llama-3.1-8B FP8 on H200 at TP1 unless named), every policy with its "
            "defaults and the same searched start. "
            + said[:1].upper()
            + said[1:]
            + (f"; each workload's first {args.duration:g} s only" if args.duration else "")
            + ". Cells are SLO attainment (TTFT and ITL both within target) / GPU-hours.\n\n"
            + notes
        )
        begin, end = markers("heldout")
        write_block(
            "heldout",
            f"{begin}\n## Held-out workloads (`benchmarks/heldout.py`)\n\n{note}\n\n{body}\n{end}",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
