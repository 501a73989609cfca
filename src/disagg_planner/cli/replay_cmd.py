"""``planner replay``: the planner (and baselines) against the simulated cluster on a trace."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from disagg_planner.cli.arguments import (
    add_force,
    add_skip_bad_rows,
    check_output_dir,
    non_negative_seconds,
    positive_number,
    positive_seconds,
    refuse_pool,
    seconds_or_none,
)
from disagg_planner.cli.profile_cmd import bundled_profile_of, missing_engine_profile
from disagg_planner.config import load_config
from disagg_planner.config.flags import add_config_arguments, config_flags
from disagg_planner.errors import SpecError
from disagg_planner.replay.comparison import outputs_message, winner_line
from disagg_planner.replay.default_workload import (
    DEFAULT_DURATION_S,
    DEFAULT_POLICIES,
    DEFAULT_PROFILE,
    DEFAULT_SCALE_LOAD,
    DEFAULT_SPEEDUP,
    replay_config,
)
from disagg_planner.replay.parallel import available_cores, resolve_jobs, run_policies
from disagg_planner.replay.session import WorkloadSpec, prepare
from disagg_planner.replay.summary import summary_table
from disagg_planner.simulator.cluster import DEFAULT_DRAIN_GRACE_S
from disagg_planner.simulator.workloads import KINDS


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "replay",
        help="Replay a trace against a simulated cluster under the planner or a baseline.",
        description="Run the planner's decision core, exactly as configured, in virtual time "
        "against a simulated Dynamo deployment driven by a request trace, and score it: SLO "
        "attainment, latency percentiles, GPU-hours against a clairvoyant oracle, the cheapest "
        "static deployment meeting the SLO target and the fluid bound. With "
        "no arguments it replays, on a bundled profile, a workload generated from facts measured "
        "from the hour of the Azure 2023 conversation trace (per-minute request counts, "
        "ISL/OSL distribution), compressed 2x, four times its load, under the planner (load "
        "loop on), an HPA and best-static. Writes summary.json, requests.csv, timeline.csv and "
        "report.html to -o (to -o/<policy>/ with several policies, and comparison.html to -o). "
        "With --elastic-ep ROLE (a MoE --engine), the planner resizes that role's one engine "
        "by its data-parallel size instead of scaling its replicas (docs/elastic-ep.md).",
    )
    src = parser.add_argument_group("workload")
    src.add_argument(
        "--trace",
        metavar="FILE",
        help="Request trace (file, glob, dir, .gz), or servegen:DIR[,clients=..,start=..,"
        "span=..,speedup=..,rate=..] (see README).",
    )
    src.add_argument(
        "--trace-format", help="mooncake|azure|burstgpt|dynamo|servegen (default: detect)."
    )
    src.add_argument(
        "--workload",
        metavar="SPEC",
        help=f"Synthetic workload KIND:key=value,... with KIND one of {', '.join(KINDS)} "
        "(keys: README, Workloads and traces), e.g. 'sinusoid:min=5,max=45,period=600,"
        "duration=1800,isl=3000,osl=300' or 'onoff:rate=4,duration=1h,isl=2000,osl=200'.",
    )
    src.add_argument("--speedup", type=positive_number, help="Compress time by X.")
    src.add_argument(
        "--scale-load", type=positive_number, help="Clone each request K times (jittered)."
    )
    src.add_argument(
        "--duration", type=positive_seconds, help="Keep arrivals before this time (600, 10m)."
    )
    add_skip_bad_rows(src)
    src.add_argument(
        "--clone-jitter",
        type=non_negative_seconds,
        default=30.0,
        help="Seconds over which the clones of --scale-load spread (default 30).",
    )
    sim = parser.add_argument_group("simulated cluster")
    sim.add_argument(
        "--engine",
        metavar="SPEC",
        help="Engine model of the simulated cluster: sim:MODEL@GPU[:tpN][:dpN][:key=value] "
        "(the roofline model, default: the profile's) or aic:MODEL@GPU[:BACKEND][:tpN] "
        "(AIConfigurator's kernel timings; pip install 'disagg-planner[aic]'); see "
        "simulator/CALIBRATION.md for their errors. Either takes :speed=X, the engine running "
        "at X times its model's speed while the planner keeps the profile (0.5: every step "
        "takes twice as long as the profile says).",
    )
    sim.add_argument(
        "--startup-delay",
        type=seconds_or_none,
        help="Seconds from scale-up to ready, the same for every replica, GPUs charged "
        "throughout (default, or 'none': each replica's start-up drawn phase by phase for "
        "its model, scheduling, image pull, weight load, engine init, first request; see "
        "CALIBRATION.md).",
    )
    sim.add_argument(
        "--drain-grace",
        type=seconds_or_none,
        default=DEFAULT_DRAIN_GRACE_S,
        help="Seconds a removed replica may drain before the requests left on it are "
        f"cancelled (default {DEFAULT_DRAIN_GRACE_S:g}, as Dynamo; 'none': no limit).",
    )
    sim.add_argument(
        "--migrate-on-drain",
        action="store_true",
        help="After the grace period, move the removed replica's requests to another replica "
        "(Dynamo's request migration) instead of cancelling them.",
    )
    sim.add_argument(
        "--worker-shutdown-budget",
        type=_budget_seconds,
        default=None,
        help="Simulate Dynamo's staged worker shutdown with this total budget (s; Dynamo's "
        "DYN_WORKER_SHUTDOWN_TOTAL_TIMEOUT_SECS, 30 by default there): a removed replica "
        "serves through a 5 s router grace, its requests until the budget less a 5 s cleanup "
        "reserve (then the rest is cancelled), its KV transfers, then cleanup, and reports "
        "the stages; summary.json's drain block counts how each ended (default: none, the "
        "older drain until empty or --drain-grace).",
    )
    sim.add_argument("--seed", type=int, default=0, help="Seed of every random choice.")
    sim.add_argument(
        "--router",
        choices=["least_loaded", "round_robin"],
        default="least_loaded",
        help="How the frontend picks an engine (default: least_loaded, as Dynamo's shared "
        "prefill queue and KV router behave).",
    )
    sim.add_argument(
        "--initial",
        metavar="ROLE=N",
        action="append",
        default=[],
        help="Replicas at time 0 (default: what the first minutes need).",
    )
    parser.add_argument(
        "--policy",
        action="append",
        metavar="NAME",
        help="planner (default), dynamo-default, static:NP,ND, hpa, oracle (the clairvoyant "
        "plan), reactive-oracle (the same plan, each minute's need ordered only once seen) or "
        "best-static (the cheapest fixed replicas meeting the SLO target); repeat to compare "
        "several (outputs go to OUTDIR/<policy>/).",
    )
    fleet = parser.add_argument_group("fleet: several deployments on one GPU pool")
    fleet.add_argument(
        "--fleet",
        metavar="FILE",
        help="Replay a fleet (YAML: pool: {max_total_gpus: N} and members: a list of {name, "
        "trace or workload, scale_load, speedup, profile, ttft, itl, priority, floor_gpus, "
        "ceiling_gpus, config}) on one simulated pool; writes OUTDIR/<member>/ and "
        "OUTDIR/fleet.json and fleet.html (README, Fleet).",
    )
    fleet.add_argument(
        "--fleet-split",
        choices=["shared", "static", "unbounded"],
        default="shared",
        help="shared: the pool's arbiter grants GPUs by floors, priority and urgency "
        "(default); static: fixed shares in proportion to the floors, each member's planner "
        "with its share as its max_gpu_budget; unbounded: no ceiling.",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="Run several --policy values in N parallel processes (default: the number of "
        f"cores, {available_cores()} here); the outputs do not depend on N.",
    )
    parser.add_argument(
        "--no-references",
        action="store_true",
        help="Skip the references' searches (the oracle plan and the cheapest static "
        "deployment, which simulate every window at several replica counts and can take "
        "longer than the policies themselves): the summaries then compare with nothing, and "
        "the oracle and best-static policies, which are those searches, are refused.",
    )
    parser.add_argument("-o", "--output-dir", default="replay-out", help="Output directory.")
    add_force(parser)
    parser.add_argument("--json", action="store_true", help="Print the summaries as JSON.")
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="No progress on stderr (a bar redrawn in place on a terminal, else a plain "
        "line every 30 s).",
    )
    add_config_arguments(parser)
    parser.set_defaults(handler=_replay)


def _replay(args: argparse.Namespace) -> int:
    jobs = resolve_jobs(args.jobs)  # refused before any work
    check_output_dir(Path(args.output_dir), force=args.force)
    flags = config_flags(args)
    if args.fleet:
        return _replay_fleet(args, flags)
    no_workload = not (args.trace or args.workload)
    if no_workload:
        flags.setdefault("profile", DEFAULT_PROFILE)
    # Replay has no deployment to read engine sizes from and no GPU budget unless asked.
    config = replay_config(
        load_config(config_arg=args.config, flags=flags), default_run=no_workload
    )
    refuse_pool(config, "planner replay without --fleet")
    if config.profile is None and "profile_results_dir" not in flags:
        # No profile given: the engine's bundled one (the default engine's without --engine).
        profile = DEFAULT_PROFILE if args.engine is None else bundled_profile_of(args.engine)
        if profile is not None:
            config = config.model_copy(update={"profile": profile})
        elif config.throughput_scaling_active:
            raise missing_engine_profile(args.engine)
    speed, scale, duration = (
        (DEFAULT_SPEEDUP, DEFAULT_SCALE_LOAD, DEFAULT_DURATION_S)
        if no_workload
        else (1.0, 1.0, None)
    )
    workload = WorkloadSpec(
        trace=args.trace,
        workload=args.workload,
        trace_format=args.trace_format,
        speedup=args.speedup if args.speedup is not None else speed,
        scale_load=args.scale_load if args.scale_load is not None else scale,
        duration_s=args.duration if args.duration is not None else duration,
        seed=args.seed,
        clone_jitter_s=args.clone_jitter,
        skip_bad_rows=args.skip_bad_rows,
    )
    plan = prepare(
        config,
        workload,
        engine=args.engine,
        startup_delay_s=args.startup_delay,
        initial=_parse_initial(args.initial) or None,
        router=args.router,
        drain_grace_s=args.drain_grace,
        migrate_on_drain=args.migrate_on_drain,
        worker_shutdown_s=args.worker_shutdown_budget,
    )
    out_dir = Path(args.output_dir)
    policies = args.policy or (list(DEFAULT_POLICIES) if no_workload else ["planner"])
    results = run_policies(
        plan,
        policies,
        out_dir=out_dir,
        jobs=jobs,
        progress=not args.no_progress,
        references=not args.no_references,
    )
    summaries = [r.summary for r in results]
    if args.json:
        as_json = [s.to_json() for s in summaries]
        print(json.dumps(as_json if len(as_json) > 1 else as_json[0], indent=2, default=str))
    else:
        print(summary_table(summaries))
        if len(summaries) > 1:
            print(winner_line(summaries))
        print(outputs_message(out_dir, policies))
    return 0


def _replay_fleet(args: argparse.Namespace, flags: dict[str, Any]) -> int:
    """``--fleet FILE``: the members' own words replace the workload and policy flags."""
    from disagg_planner.replay.fleet import run_fleet
    from disagg_planner.replay.fleet_model import load_fleet
    from disagg_planner.replay.fleet_page import fleet_table

    given = [
        name
        for name, value in (
            ("--trace", args.trace),
            ("--workload", args.workload),
            ("--policy", args.policy),
            ("--engine", args.engine),
            ("--initial", args.initial),
        )
        if value
    ]
    if given:
        raise SpecError(
            f"--fleet: {', '.join(given)} belong to each member in the fleet file, not the "
            "command line"
        )
    spec = load_fleet(args.fleet)
    out_dir = Path(args.output_dir)
    result = run_fleet(
        spec,
        split=args.fleet_split,
        out_dir=out_dir,
        base_config=args.config,
        flags=flags,
        startup_delay_s=args.startup_delay,
    )
    if args.json:
        print(json.dumps(result.fleet, indent=2, default=str))
    else:
        print(fleet_table([result]))
        print(f"wrote {out_dir}/fleet.html (open it in a browser), fleet.json and <member>/")
    return 0


def _budget_seconds(text: str) -> float:
    """argparse type: a total shutdown budget, seconds > 0 (Dynamo refuses 0 too)."""
    value = seconds_or_none(text) if text.strip().lower() != "none" else None
    if value is None or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of seconds > 0")
    return value


def _parse_initial(items: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        role, _, value = item.partition("=")
        if role not in ("prefill", "decode", "agg") or not value.isdigit():
            raise SpecError(f"--initial {item!r}: expected ROLE=N (prefill, decode or agg)")
        out[role] = int(value)
    return out
