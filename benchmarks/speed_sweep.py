"""Profile-speed sweep (issue 29): the planner against a profile that is wrong by a known factor.

The simulated engine runs at a multiple of the speed its profile says (the engine spec's
``speed=X``: every prefill and decode step takes 1/X as long) while the planner keeps the
profile it was given, on the scorecard's bursty and long-prompt workloads (their definitions
and runner are :mod:`scorecard`'s). Per workload and multiple it prints the planner's SLO
attainment and GPU-hours, the best static deployment of the engine at that multiple (the
references' search, run on the slowed or sped-up engine), and issue 29's targets, each MET or
MISSED with its figures:

- attainment within 1 point of the same workload's 1.0x run (not tested without a 1.0x run);
- reached within 5 minutes of the first breach: the first 60 s window (by arrival) whose
  attainment is under the bar, and the first later window back at it (no breach: met; never
  back: missed). The bar is the SLO target, or where best-static at that multiple misses it,
  best-static's attainment less 0.3 points (:func:`window_bar`); requests no deployment
  serves (the references' unservable ones, e.g. a prompt whose lone prefill exceeds the TTFT
  target, and prompts longer than the engine admits) are left out of the windows;
- GPU-hours within 10 % of best-static at that multiple (at most 1.10x its GPU-hours; fewer
  is not a miss here: a planner that saves GPUs by losing requests misses the first target).

No tuning to a trace passes this: the multiples move the engine away from every profile.

    python benchmarks/speed_sweep.py [--write] [--jobs N] [--only NAME] [--multiples 0.5,1]
        [--quick] [--duration S] [--startup-delay S|none] [--json]

Start-up as the scorecard's: by default each replica's drawn from its engine's phase model
(:mod:`disagg_planner.simulator.startup`), ``--startup-delay S`` a constant S seconds.

``--quick`` cuts every workload to its first 900 s (a test's scale); ``--write`` replaces the
speed-sweep block of benchmarks/RESULTS.md (through ``results_block``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent
# Run as a script, this folder comes first on sys.path (for results_block and scorecard); the
# repository root next, so that benchmarks/predictors.py shadows nothing (scorecard's note).
for folder in (BENCHMARKS, BENCHMARKS.parent):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

import scorecard  # noqa: E402
from excess_gpu_hours import over_static  # noqa: E402
from missed_windows import (  # noqa: E402
    WINDOW_S,
    breach_and_recovery,
    where_missed,
    window_scores,
)
from results_block import markers, write_block  # noqa: E402

from disagg_planner.cli.arguments import (  # noqa: E402
    positive_number,
    positive_seconds,
    seconds_or_none,
)
from disagg_planner.config import PlannerConfig  # noqa: E402
from disagg_planner.errors import SpecError  # noqa: E402
from disagg_planner.replay.bounds import (  # noqa: E402
    References,
    adopt_references,
    context_limits,
    fits_context,
)
from disagg_planner.replay.parallel import resolve_jobs  # noqa: E402
from disagg_planner.replay.runner import engine_spec_for_profile  # noqa: E402
from disagg_planner.replay.session import run, with_searched_start  # noqa: E402
from disagg_planner.runtime.wiring import profile_for  # noqa: E402

MULTIPLES = (0.5, 0.7, 1.0, 1.4, 2.0)
QUICK_MULTIPLES = (0.5, 1.0, 2.0)
QUICK_DURATION_S = 900.0  # on/off's first burst comes at about 650 s
# the scorecard's bursty and long-prompt workloads (scenario names)
WORKLOADS = ("on/off bursts", "heavy-tailed prompts")
# issue 29's targets
ATTAINMENT_POINTS = 0.01
RECOVERY_S = 300.0
STATIC_RATIO = 1.10


def scenarios(only: Sequence[str] | None) -> list[scorecard.Scenario]:
    """The scorecard's scenarios this sweep runs: its bursty and long-prompt workloads, or
    those whose name starts with one of ``only``."""
    names = [s.name for s in scorecard.SCENARIOS]
    chosen = [
        s
        for s in scorecard.SCENARIOS
        if (any(s.name.startswith(o) for o in only) if only else s.name in WORKLOADS)
    ]
    if not chosen:
        raise SpecError(f"--only {only}: no scorecard workload starts so; known: {names}")
    return chosen


def at_speed(scenario: scorecard.Scenario, multiple: float) -> scorecard.Scenario:
    """``scenario`` on its own engine run at ``multiple`` times its profile's speed."""
    cfg = PlannerConfig(profile=scenario.profile, mode=scenario.mode)
    engine = scenario.engine or engine_spec_for_profile(profile_for(cfg))
    return replace(scenario, engine=f"{engine}:speed={multiple:g}")


def window_bar(summary: dict[str, Any]) -> float:
    """The attainment a 60 s window of servable requests must reach not to count as a breach:
    the SLO target, or, where best-static on this engine is under it over the servable
    requests (the references' ``unservable_requests`` apart), best-static's attainment over
    them less 0.3 points (the scorecard's rule for such workloads in issue 29): a bar no
    deployment reaches would make every window a breach."""
    target = float(summary["slo_target"])
    n, unservable = int(summary["requests"]), int(summary["unservable_requests"])
    servable = n - unservable
    if servable <= 0:
        return target
    # the unservable requests fail under best-static too: its attainment over the others
    static = float(summary["best_static"]["slo_attainment"]) * n / servable
    return target if static >= target else static - scorecard.STATIC_SHORTFALL


def _run_planner(
    args: tuple[scorecard.Scenario, float, float | None, tuple[str, References]],
) -> dict[str, Any]:
    """The planner on one workload at one multiple, with the references found for it."""
    scenario, multiple, startup, found = args
    plan = scorecard._plan(scenario, {}, startup)
    adopt_references(*found)
    plan = with_searched_start(plan)  # the start every scorecard policy has
    result = run(plan, "planner", progress=False)
    s = result.summary.to_json()
    # Requests no deployment serves within the SLO (the references' lone limits: a prompt
    # too long for the TTFT target even alone) or admits at all (longer than the engine's
    # context) miss under every policy, best-static's too: they say nothing about the
    # planner's reaction. A record's id is its request's arrival index.
    limits = context_limits(plan.setup.specs)
    lone = found[1].limits
    servable = {
        i
        for i, r in enumerate(plan.requests)
        if fits_context(r, limits) and lone.servable(r.input_length, r.output_length)
    }
    bar = window_bar(s)
    scores = window_scores(
        [r.arrival_s for i, r in enumerate(plan.requests) if i in servable],
        [r for r in result.records if r.request_id in servable],
        ttft_ms=scenario.ttft_ms,
        itl_ms=scenario.itl_ms,
        window_s=WINDOW_S,
    )
    breach, back = breach_and_recovery(scores, target=bar)
    missed_where = where_missed(scores, result.timeline, target=bar)
    # what a controller sized exactly to the load it observes reaches on this engine
    reactive = run(plan, "reactive-oracle", progress=False, write_report=False)
    print(f"  {scenario.name} x{multiple:g}: done", file=sys.stderr, flush=True)
    return {
        "reactive_attainment": reactive.summary.slo_attainment.both,
        "scenario": scenario.name,
        "multiple": multiple,
        "engine": s["engine"],
        "slo_target": s["slo_target"],
        "window_bar": bar,
        "attainment": s["slo_attainment"]["both"],
        "gpu_hours": s["gpu_hours"],
        "best_static": s["best_static"],
        "first_breach_s": breach,
        "missed_where": missed_where,
        "recovered_s": back,
        "flaps": sum(s["flaps"].values()),
        "max_replicas": s["max_replicas"],
        "over_best_static": over_static(
            result.timeline,
            s["best_static"]["replicas"],
            {role: spec.gpus for role, spec in plan.setup.specs.items()},
        ).text(),
    }


def sweep(
    chosen: Sequence[scorecard.Scenario],
    multiples: Sequence[float],
    *,
    jobs: int,
    startup: float | None,
    duration_s: float | None = None,
) -> list[dict[str, Any]]:
    """One planner run per workload and multiple (workloads cut to ``duration_s``), with the
    references of each found first; in ``jobs`` processes (1: in this one). ``startup``: the
    constant start-up of every replica, or None (the phase model)."""
    runs = []
    for s in chosen:
        s = s.located()
        if duration_s is not None:
            s = replace(s, workload=replace(s.workload, duration_s=duration_s))
        runs += [(at_speed(s, m), m) for m in multiples]
    if jobs == 1:
        found = [scorecard._references((s, startup)) for s, _ in runs]
        tasks = [(s, m, startup, f) for (s, m), f in zip(runs, found, strict=True)]
        return [_run_planner(t) for t in tasks]
    with ProcessPoolExecutor(jobs) as pool:
        found = list(pool.map(scorecard._references, [(s, startup) for s, _ in runs]))
        tasks = [(s, m, startup, f) for (s, m), f in zip(runs, found, strict=True)]
        return list(pool.map(_run_planner, tasks))


def _base(rows: Sequence[dict[str, Any]], row: dict[str, Any]) -> dict[str, Any] | None:
    return next((r for r in rows if r["scenario"] == row["scenario"] and r["multiple"] == 1), None)


def _static_ratio(row: dict[str, Any]) -> float:
    static = float(row["best_static"]["gpu_hours"])
    return row["gpu_hours"] / static if static > 0 else math.inf


def _recovery(row: dict[str, Any]) -> float | None:
    """Seconds from the first breach until the SLO is met again (inf: never; None: no breach)."""
    if row["first_breach_s"] is None:
        return None
    if row["recovered_s"] is None:
        return math.inf
    return float(row["recovered_s"] - row["first_breach_s"])


def table(rows: Sequence[dict[str, Any]]) -> str:
    head = (
        "| workload | speed | planner SLO both | planner GPU-h | best-static | best-static SLO "
        "| best-static GPU-h | x best-static | reactive-oracle SLO | window bar "
        "| first breach s | back at bar s | flaps |"
    )
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        bs = r["best_static"]
        replicas = "/".join(str(v) for v in bs["replicas"].values())
        lines.append(
            f"| {r['scenario']} | {r['multiple']:g}x | {r['attainment']:.2%} "
            f"| {r['gpu_hours']:.2f} | {replicas} | {bs['slo_attainment']:.2%} "
            f"| {bs['gpu_hours']:.2f} | {_static_ratio(r):.2f} "
            f"| {r['reactive_attainment']:.2%} | {r['window_bar']:.2%} "
            f"| {_t(r['first_breach_s'])} "
            f"| {_t(r['recovered_s'])} | {r['flaps']} |"
        )
    return "\n".join(lines)


def targets(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Per workload and multiple, issue 29's three targets, MET or MISSED with the figures
    they compare (all from ``rows``)."""
    lines = []
    for r in rows:
        checks = []
        base = _base(rows, r)
        att = r["attainment"]
        if base is None:
            checks.append(f"attainment {att:.2%} (not tested: no 1.0x run)")
        else:
            points = (att - base["attainment"]) * 100  # above the 1.0x run's is fine
            met = points >= -ATTAINMENT_POINTS * 100
            # a miss says what the yardsticks reach on the same engine: the fixed deployment
            # that knows the whole trace, and the controller sized to each minute once seen
            beside = (
                ""
                if met
                else f" (on this engine best-static reaches "
                f"{float(r['best_static']['slo_attainment']):.2%}, reactive-oracle "
                f"{r['reactive_attainment']:.2%})"
                + (f" (cause: {r['missed_where']})" if r.get("missed_where") else "")
            )
            checks.append(
                f"{scorecard._met(met)} attainment {att:.2%} within "
                f"{ATTAINMENT_POINTS * 100:g} point of 1.0x's {base['attainment']:.2%} "
                f"({points:+.2f} points){beside}"
            )
        recovery = _recovery(r)
        bar = f"{r['window_bar']:.2%}"
        if recovery is None:
            checks.append(f"MET no 60 s window under {bar}")
        elif math.isinf(recovery):
            checks.append(
                f"MISSED first window under {bar} at {r['first_breach_s']:.0f} s, never back "
                f"(<= {RECOVERY_S:.0f} s)"
            )
        else:
            met = scorecard._met(recovery <= RECOVERY_S)
            checks.append(
                f"{met} back at {bar} {recovery:.0f} s after the first "
                f"window under it at {r['first_breach_s']:.0f} s (<= {RECOVERY_S:.0f} s)"
            )
        ratio = _static_ratio(r)
        over = r.get("over_best_static") if ratio > STATIC_RATIO else None
        checks.append(
            f"{scorecard._met(ratio <= STATIC_RATIO)} {r['gpu_hours']:.2f} GPU-h = {ratio:.3f}x "
            f"best-static's {float(r['best_static']['gpu_hours']):.2f} (<= {STATIC_RATIO:.2f}x)"
            + (f" (cause: {over})" if over else "")
        )
        lines.append(f"- **{r['scenario']} at {r['multiple']:g}x**: " + "; ".join(checks))
    return lines


def _t(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def _multiples(text: str) -> tuple[float, ...]:
    """argparse type: comma-separated multiples of the engine's speed, each > 0."""
    return tuple(positive_number(x) for x in text.split(","))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--write", action="store_true", help="Update benchmarks/RESULTS.md.")
    parser.add_argument("--jobs", type=int, help="Parallel processes (default: the cores).")
    parser.add_argument(
        "--only",
        action="append",
        help="Scorecard workload name prefix to run (default: " + ", ".join(WORKLOADS) + ").",
    )
    parser.add_argument(
        "--multiples",
        type=_multiples,
        help="Engine speed multiples (default: "
        + ",".join(f"{m:g}" for m in MULTIPLES)
        + f"; --quick: {','.join(f'{m:g}' for m in QUICK_MULTIPLES)}).",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"A test's scale: each workload's first {QUICK_DURATION_S:g} s, multiples "
        + ",".join(f"{m:g}" for m in QUICK_MULTIPLES)
        + ".",
    )
    parser.add_argument(
        "--duration", type=positive_seconds, help="Keep each workload's first S seconds only."
    )
    parser.add_argument(
        "--startup-delay",
        type=seconds_or_none,
        metavar="S|none",
        help="Seconds from scale-up to ready, the same for every replica (e.g. 120). Default, "
        "or 'none': each replica's start-up drawn from its engine's phase model, as the "
        "scorecard's.",
    )
    parser.add_argument("--json", action="store_true", help="Print the rows as JSON.")
    args = parser.parse_args(argv)
    try:
        jobs = resolve_jobs(args.jobs)
        chosen = scenarios(args.only)
    except SpecError as e:
        parser.error(str(e))
    multiples = args.multiples or (QUICK_MULTIPLES if args.quick else MULTIPLES)
    duration = args.duration or (QUICK_DURATION_S if args.quick else None)
    t0 = time.perf_counter()
    rows = sweep(chosen, multiples, jobs=jobs, startup=args.startup_delay, duration_s=duration)
    wall = time.perf_counter() - t0
    body = table(rows) + "\n\nTargets (issue 29):\n\n" + "\n".join(targets(rows))
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
    else:
        print(body)
        print(f"\n{len(rows)} runs in {wall:.0f} s")
    if args.write:
        command = "python benchmarks/speed_sweep.py " + " ".join(
            sys.argv[1:] if argv is None else argv
        )
        said = scorecard.startup_text([args.startup_delay], chosen)
        note = (
            f"Command: `{command.strip()}` ({len(rows)} runs, {wall:.0f} s wall). The engine "
            "of each workload runs at the multiple of its profile's speed (`--engine "
            "...:speed=X`) while the planner sizes from the unchanged profile; best-static is "
            "found on the engine at that multiple. "
            + said[:1].upper()
            + said[1:]
            + (f"; each workload's first {duration:g} s only" if duration else "")
            + ". The planner starts, as on the scorecard, with what the oracle's searched "
            "plan on the engine at that multiple has until a first decision could land. "
            "Breach windows: 60 s, by arrival, against the window bar (the 99 % SLO "
            "target, or best-static's attainment at that multiple less 0.3 points where it "
            "misses 99 %). `reactive-oracle SLO`: the oracle's per-minute needs on the "
            "engine at that multiple, each ordered only once its minute has begun (one 15 s "
            "fast check in), no backlog term: what a controller sized exactly to each "
            "minute's load as it is seen reaches (a yardstick, not a bound)."
        )
        begin, end = markers("speed-sweep")
        write_block(
            "speed-sweep",
            f"{begin}\n## Profile-speed sweep (`benchmarks/speed_sweep.py`)\n\n"
            f"{note}\n\n{body}\n{end}",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
