"""``planner plan``: one throughput decision from given numbers, with its arithmetic.

It runs the same core as the live loop (a constant forecast of the given load, the same
sizing formulas and guards), so what it prints is what the controller would do. A profile
point the sizing read outside the profiled samples is flagged, with the note ``planner
profile show`` prints for it (``profile_points`` in the JSON: the same answer as that
command's).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from disagg_planner.cli.profile_cmd import capacity_answer
from disagg_planner.config import load_config
from disagg_planner.config.flags import add_config_arguments, config_flags
from disagg_planner.core.throughput import ThroughputPlanner
from disagg_planner.core.types import DeploymentStatus, RoleStatus, TrafficObservation
from disagg_planner.errors import SpecError
from disagg_planner.runtime.wiring import gpus_per_replica, predictor_factory, profile_for

# The profile phases each role's sizing reads (an aggregated engine runs both).
ROLE_PHASES: dict[str, tuple[str, ...]] = {
    "prefill": ("prefill",),
    "decode": ("decode",),
    "agg": ("prefill", "decode"),
}


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "plan",
        help="Size prefill/decode replicas for a given load and show the arithmetic.",
        description="One throughput-loop decision for NUM_REQ requests per interval at the "
        "given mean ISL/OSL, with every guard of the live planner (min endpoints, per-tick "
        "cap, GPU budget). Give the profile with --profile NAME or --profile-results-dir DIR.",
    )
    parser.add_argument("--num-req", type=float, required=True, help="Requests per interval.")
    parser.add_argument("--isl", type=float, required=True, help="Mean input length, tokens.")
    parser.add_argument("--osl", type=float, required=True, help="Mean output length, tokens.")
    parser.add_argument(
        "--interval",
        type=float,
        help="Interval length in seconds (default: --adjustment-interval).",
    )
    parser.add_argument(
        "--current",
        metavar="ROLE=N",
        action="append",
        default=[],
        help="Replicas running now (default: each role's min endpoint); repeatable.",
    )
    parser.add_argument("--json", action="store_true", help="Print the decision as JSON.")
    add_config_arguments(parser)
    parser.set_defaults(handler=_plan)


def _plan(args: argparse.Namespace) -> int:
    flags = config_flags(args)
    if args.interval is not None:
        flags["throughput_adjustment_interval_seconds"] = args.interval
    # `plan` sizes from the given numbers: no latency observed, so no correction applies,
    # and only the throughput loop is asked.
    flags.setdefault("enable_load_scaling", False)
    flags.setdefault("enable_throughput_scaling", True)
    flags.setdefault("load_predictor", "constant")
    config = load_config(config_arg=args.config, flags=flags).config
    for name, value in (("--num-req", args.num_req), ("--isl", args.isl), ("--osl", args.osl)):
        if not value >= 0:
            raise SpecError(f"{name} must be a number >= 0, got {value}")
    profile = profile_for(config)
    current = _parse_current(args.current, config.roles)
    roles = {
        role: RoleStatus(
            desired=current.get(role, config.min_endpoint_for(role)),
            ready=current.get(role, config.min_endpoint_for(role)),
            gpus_per_replica=gpus_per_replica(config, profile, role),
        )
        for role in config.roles
    }
    planner = ThroughputPlanner(
        config=config, profile=profile, predictor_factory=predictor_factory(config)
    )
    interval = config.throughput_adjustment_interval_seconds
    busy = args.num_req > 0
    observation = TrafficObservation(
        end_s=interval,
        duration_s=interval,
        num_req=args.num_req,
        isl=args.isl if busy else None,
        osl=args.osl if busy else None,
    )
    decision = planner.tick(interval, observation, DeploymentStatus(roles))
    # The profile points the sizing read (no latency is observed, so no correction tightens
    # the ITL target), as `profile show` answers them: flagged where they are extrapolated.
    points = (
        capacity_answer(
            profile,
            isl=args.isl if args.isl > 0 else None,
            itl=config.itl_ms,
            context=max(args.isl + args.osl / 2, 1.0),
        )
        if busy
        else {}
    )
    sizing = decision.diagnostics.sizing
    replicas = decision.replicas or {r: s.desired for r, s in roles.items()}
    result: dict[str, Any] = {f"{role}_replicas": replicas[role] for role in config.roles} | {
        f"{role}_thpt_per_gpu": sizing[role].thpt_per_gpu if role in sizing else None
        for role in config.roles
    }
    result |= {
        f"{role}_utilisation": sizing[role].utilisation for role in config.roles if role in sizing
    }
    result |= {
        "gpus_per_replica": {r: s.gpus_per_replica for r, s in roles.items()},
        "gpus": sum(replicas[r] * roles[r].gpus_per_replica for r in config.roles),
        "demand_tokens_per_s": {r: s.demand_tokens_per_s for r, s in sizing.items()},
        "profile_points": points,
        "stages": decision.diagnostics.stages,
        "reasons": [decision.reason.value],
        "message": decision.message,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"profile: {config.profile or config.profile_results_dir}")
    print(f"load: {args.num_req:g} requests per {interval:g} s, ISL {args.isl:g}, OSL {args.osl:g}")
    for role in config.roles:
        if role not in sizing:
            continue
        s = sizing[role]
        stages = " -> ".join(
            f"{name} {values[role]}" for name, values in decision.diagnostics.stages.items()
        )
        at = f" x {s.utilisation:.0%} utilisation" if s.utilisation < 1 else ""
        print(
            f"{role}: {s.demand_tokens_per_s:,.0f} tok/s / ({s.thpt_per_gpu:,.0f} tok/s/GPU{at}) "
            f"/ {s.gpus_per_replica} GPU/replica = {stages}"
        )
        for phase in ROLE_PHASES.get(role, ()):
            point = points.get(phase)
            if point is not None and point["extrapolated"]:
                print(f"  {phase} profile point extrapolated: {point['note']}")
    print(f"decision: {decision.reason.value}: {decision.message}")
    print("replicas: " + ", ".join(f"{r}={replicas[r]}" for r in config.roles))
    return 0


def _parse_current(items: list[str], roles: tuple[str, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        role, _, value = item.partition("=")
        if role not in roles or not value.isdigit():
            raise SpecError(f"--current {item!r}: expected ROLE=N with ROLE in {', '.join(roles)}")
        out[role] = int(value)
    return out
