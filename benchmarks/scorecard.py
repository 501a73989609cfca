"""Decision-quality scorecard: every policy on the same simulated cluster and workload.

Runs ``planner replay`` policies (static peak provisioning, a Kubernetes HPA, Dynamo's
defaults, our planner with its defaults, and the clairvoyant oracle) on two real traces
(read from ``$PLANNER_TRACE_DIR``, see ``tests/traces.py``) and two synthetic workloads,
and prints one markdown table of SLO attainment, GPU-hours, the ratio to the oracle lower
bound, scale actions and flaps. GPU-hours ratios are against the oracle bound computed in
the same run.

    python benchmarks/scorecard.py [--write] [--only NAME] [--jobs N] [--variant K=V ...]

``--write`` replaces the scorecard section of benchmarks/RESULTS.md. ``--variant`` runs the
planner policy with extra settings (for tuning), e.g. ``--variant load_predictor=kalman``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

# Run as a script, this folder comes first on sys.path, and benchmarks/predictors.py would
# shadow the predictors package: look in the repository root first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from disagg_planner.config import PlannerConfig
from disagg_planner.replay.session import WorkloadSpec, prepare, run
from tests.traces import AZURE_CONV, MOONCAKE_CONV, SharedTrace, for_script, servegen_folder

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
PROFILE = "h200_sxm/vllm/llama-3.1-8b-fp8/tp1"
POLICIES = ("static-peak", "hpa", "dynamo-default", "planner", "oracle")


@dataclass(frozen=True)
class Scenario:
    name: str
    workload: WorkloadSpec
    ttft_ms: float
    itl_ms: float
    note: str
    # A shared trace: main puts its path into the workload (located) only for the scenarios
    # it runs, so the others' traces need not be there.
    trace: SharedTrace | None = None

    def located(self) -> Scenario:
        if self.trace is None:
            return self
        return replace(self, workload=replace(self.workload, trace=str(for_script(self.trace))))


SCENARIOS = (
    Scenario(
        "azure-conv x16",
        WorkloadSpec(scale_load=16),
        500,
        20,
        "Azure 2023 conversation trace (1 h), each request cloned 16x",
        trace=AZURE_CONV,
    ),
    Scenario(
        "mooncake-conv x4",
        WorkloadSpec(scale_load=4),
        5000,
        20,
        "Mooncake conversation trace (1 h, mean ISL 12k, p99 85k: TTFT target 5 s, because a "
        "lone 85k-token prefill alone takes ~2 s on one H200)",
        trace=MOONCAKE_CONV,
    ),
    Scenario(
        "sinusoid 5-45 req/s",
        WorkloadSpec(workload="sinusoid:min=5,max=45,period=600,duration=1800,isl=3000,osl=300"),
        500,
        20,
        "Dynamo's test load: 5 to 45 req/s, period 600 s, ISL/OSL 3000/300, 30 min",
    ),
    Scenario(
        "step 8->40 req/s",
        WorkloadSpec(workload="step:rates=8/40/8,at=600/1200,duration=1800,isl=2000,osl=200"),
        500,
        20,
        "a burst: 8 req/s, 40 req/s from 600 s to 1200 s, then 8 again",
    ),
    Scenario(
        "servegen m-large day",
        WorkloadSpec(
            trace=f"servegen:{servegen_folder('m-large')},start=1d,span=1d,speedup=24,rate=15"
        ),
        500,
        20,
        "ServeGen m-large (its ten largest clients, generated from their per-window rates, "
        "fitted inter-arrival laws and length PMFs), day 2 compressed to one hour at a mean "
        "of 15 req/s (peak about 3x the mean, minimum 0.4x)",
    ),
    Scenario(
        "on/off bursts",
        WorkloadSpec(workload="onoff:rate=4,duration=1h,isl=2000,osl=200"),
        500,
        20,
        "Markov-modulated Poisson: 4 req/s, busy spells of 1-5 min at 5-10x (20-40 req/s) "
        "after quiet spells of 10 min on average; ISL/OSL 2000/200, 1 h",
    ),
    Scenario(
        "heavy-tailed prompts",
        WorkloadSpec(workload="heavytail:rate=3,duration=1800,context=131072,osl=200"),
        5000,
        20,
        "3 req/s, lognormal ISL with median 4096 and p99 at the model's 131072-token context "
        "(about 1% of prompts longer than the engine accepts), OSL 200, 30 min; TTFT target "
        "5 s, as for Mooncake",
    ),
    Scenario(
        "diurnal ramp 3-30 req/s",
        WorkloadSpec(
            workload="diurnal:min=3,max=30,period=1h,peak=30m,duration=1h,isl=2000,osl=200"
        ),
        500,
        20,
        "a day's shape in one hour: 3 req/s rising slowly to 30 at 30 min and back, ISL/OSL "
        "2000/200",
    ),
    Scenario(
        "sinusoid 5-45 req/s, 1800 s",
        WorkloadSpec(workload="sinusoid:min=5,max=45,period=1800,duration=1h,isl=3000,osl=300"),
        500,
        20,
        "the test load with a slower period: 5 to 45 req/s, period 1800 s, ISL/OSL 3000/300, 1 h",
    ),
)


def _run_one(args: tuple[Scenario, str, dict[str, Any], float]) -> dict[str, Any]:
    scenario, policy, variant, startup = args
    cfg = PlannerConfig(
        profile=PROFILE,
        ttft_ms=scenario.ttft_ms,
        itl_ms=scenario.itl_ms,
        max_gpu_budget=-1,
        **variant,
    )
    plan = prepare(cfg, scenario.workload, startup_delay_s=startup)
    name = policy
    if policy == "static-peak":
        peak = {r: max(n.replicas[r] for n in plan.needs) for r in plan.setup.specs}
        name = "static:" + ",".join(str(peak[r]) for r in plan.setup.specs)
        plan = prepare(cfg, scenario.workload, startup_delay_s=startup, initial=peak)
    summary = run(plan, name, progress=False).summary
    summary["scenario"] = scenario.name
    summary["label"] = policy
    return summary


def markdown(rows: list[dict[str, Any]]) -> str:
    head = (
        "| scenario | policy | SLO both | TTFT p99 ms | ITL p99 ms | GPU-h | x oracle "
        "| actions | flaps | max P/D |"
    )
    lines = [head, "|" + "---|" * 10]
    for s in rows:
        ratio = s.get("gpu_hours_ratio_to_oracle")
        mx = s["max_replicas"]
        lines.append(
            f"| {s['scenario']} | {s['policy']} | {s['slo_attainment']['both']:.2%} "
            f"| {_f(s['ttft_ms']['p99'])} | {_f(s['itl_ms']['p99'])} | {s['gpu_hours']:.2f} "
            f"| {'-' if ratio is None else f'{ratio:.2f}'} | {sum(s['scale_actions'].values())} "
            f"| {sum(s['flaps'].values())} | {'/'.join(str(v) for v in mx.values())} |"
        )
    return "\n".join(lines)


def _f(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.0f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="Update benchmarks/RESULTS.md.")
    parser.add_argument("--only", action="append", help="Scenario name prefix to run.")
    parser.add_argument("--policy", action="append", help="Policies (default: all).")
    parser.add_argument("--jobs", type=int, default=1, help="Parallel processes.")
    parser.add_argument("--startup-delay", type=float, default=120.0)
    parser.add_argument("--variant", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    variant: dict[str, Any] = {}
    for item in args.variant:
        key, _, value = item.partition("=")
        variant[key] = None if value.lower() in {"none", "null"} else value
    scenarios = [
        s.located()
        for s in SCENARIOS
        if not args.only or any(s.name.startswith(o) for o in args.only)
    ]
    policies = args.policy or list(POLICIES)
    jobs = [
        (s, p, variant if p == "planner" else {}, args.startup_delay)
        for s in scenarios
        for p in policies
    ]
    t0 = time.perf_counter()
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            rows = list(pool.map(_run_one, jobs))
    else:
        rows = [_run_one(j) for j in jobs]
    wall = time.perf_counter() - t0
    table = markdown(rows)
    command = "python benchmarks/scorecard.py " + " ".join(argv or sys.argv[1:])
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
    else:
        print(table)
        print(f"\n{len(rows)} runs in {wall:.0f} s")
    if args.write:
        notes = "\n".join(f"- **{s.name}**: {s.note}" for s in scenarios)
        section = (
            f"Command: `{command.strip()}` (wall {wall:.0f} s on the 2-core dev machine).\n"
            f"Engine `sim:llama-3.1-8b-fp8@h200_sxm:tp1` (bundled profile {PROFILE}), "
            f"startup delay {args.startup_delay:g} s, ITL target 20 ms; every policy starts "
            "with the replicas the first minutes need. `x oracle` is GPU-hours over the "
            "oracle lower bound (the fewest replicas per 60 s window meeting 99 % TTFT "
            "attainment for the true load, no startup or drain time).\n\n"
            f"{notes}\n\n{table}\n"
        )
        _write_section(section)
    return 0


def _write_section(body: str) -> None:
    begin, end = "<!-- BEGIN scorecard -->", "<!-- END scorecard -->"
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    block = f"{begin}\n## Decision-quality scorecard\n\n{body}{end}"
    if begin in text and end in text:
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    RESULTS.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
