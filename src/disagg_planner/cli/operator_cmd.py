"""``planner operator``: one process planning every DGD that has a ``PlannerPolicy``."""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import logging
import os
import sys
from pathlib import Path
from typing import Any

from disagg_planner.config import load_config
from disagg_planner.config.flags import add_config_arguments, config_flags
from disagg_planner.connectors.kubernetes import API_WORKER_THREADS, SERVICE_ACCOUNT_NAMESPACE
from disagg_planner.errors import SpecError

log = logging.getLogger(__name__)


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "operator",
        help="Run the planner operator: one loop per PlannerPolicy object.",
        description="Run a kopf operator that watches PlannerPolicy objects "
        "(planner.autoscaling.dev/v1alpha1; CRDs in deploy/crds) and runs one planner loop "
        "per policy for the DynamoGraphDeployment its spec.targetRef names. A policy's spec "
        "holds planner settings under config-file keys; the config flags below (and "
        "--config, PLANNER_* variables) are the defaults under every policy. Deleting a "
        "policy stops its loop and leaves the DGD as it is. With peering (the default), "
        "only the replica with the highest priority acts; the KopfPeering object named by "
        "--peering must exist (ClusterKopfPeering with --all-namespaces). Serves /metrics, "
        "/healthz and /readyz on --metric-reporting-prometheus-port when it is not 0.",
    )
    scope = parser.add_argument_group("operator")
    # Neither flag: the operator serves its own namespace (the pod's service account says
    # which), as a namespaced install expects; outside a pod it says in one line what to add.
    where = scope.add_mutually_exclusive_group()
    where.add_argument(
        "--watch-namespace",
        dest="operator_namespaces",
        action="append",
        metavar="NS",
        help="Serve PlannerPolicies in this Kubernetes namespace (repeatable; globs such as "
        "'team-*' need list/watch on namespaces). Not --namespace: that is the Dynamo "
        "namespace setting below. Default: the operator pod's own namespace.",
    )
    where.add_argument(
        "-A",
        "--all-namespaces",
        dest="operator_all_namespaces",
        action="store_true",
        help="Serve PlannerPolicies in every namespace.",
    )
    scope.add_argument(
        "--standalone",
        dest="operator_standalone",
        action="store_true",
        help="Run without peering (only safe with a single operator replica).",
    )
    scope.add_argument(
        "--peering",
        dest="operator_peering",
        default="planner",
        metavar="NAME",
        help="Name of the KopfPeering object the replicas elect the active one through "
        "(default: planner).",
    )
    scope.add_argument(
        "--priority",
        dest="operator_priority",
        default="random",
        metavar="N|random",
        help="Peering priority; the highest acts, equal priorities all pause (default: a "
        "random number per start, so replicas differ).",
    )
    scope.add_argument(
        "--status-interval",
        dest="operator_status_interval",
        type=float,
        default=30.0,
        metavar="S",
        help="Shortest time between status writes that only update measurements; a new "
        "decision or condition is written at once (default: 30).",
    )
    scope.add_argument(
        "--shard",
        dest="operator_shard",
        metavar="KEY=VALUE",
        default=os.environ.get("PLANNER_OPERATOR_SHARD"),
        help="Serve only the PlannerPolicies and PlannerPools labelled KEY=VALUE (one shard "
        "of several operator Deployments, each with its own --peering); label a pool and all "
        "its members alike, so that they are in one shard (env PLANNER_OPERATOR_SHARD).",
    )
    add_config_arguments(parser)
    parser.set_defaults(handler=_run)


def parse_shard(text: str | None) -> dict[str, str]:
    """``KEY=VALUE`` -> ``{KEY: VALUE}`` (none: ``{}``, every object)."""
    if not text:
        return {}
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or not value.strip():
        raise SpecError(f"--shard {text!r}: expected KEY=VALUE, a label and its value")
    return {key.strip(): value.strip()}


def own_namespace(path: Path = SERVICE_ACCOUNT_NAMESPACE) -> str | None:
    """The namespace of the pod this process runs in (its service account's), else None."""
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def _run(args: argparse.Namespace) -> int:
    from disagg_planner.operator.app import OperatorOptions, run_operator
    from disagg_planner.operator.policy import OperatorDefaults

    if not args.operator_namespaces and not args.operator_all_namespaces:
        namespace = own_namespace()
        if namespace is None:
            print(
                "planner operator: not in a pod, so there is no own namespace to serve: add "
                "--watch-namespace NS (repeatable) or --all-namespaces",
                file=sys.stderr,
            )
            return 2
        log.info("serving PlannerPolicies in the operator's own namespace %s", namespace)
        args.operator_namespaces = [namespace]

    flags = config_flags(args)
    # The operator's own settings must be valid on their own (a policy only adds to them).
    base = load_config(config_arg=args.config, flags=flags).config
    priority: int | None = None
    if args.operator_priority != "random":
        try:
            priority = int(args.operator_priority)
        except ValueError:
            raise SystemExit(
                f"planner operator: --priority must be an integer or 'random', "
                f"got {args.operator_priority!r}"
            ) from None
    options = OperatorOptions(
        defaults=OperatorDefaults(config_arg=args.config, flags=flags),
        namespaces=tuple(args.operator_namespaces or ()),
        all_namespaces=args.operator_all_namespaces,
        standalone=args.operator_standalone,
        peering_name=args.operator_peering,
        priority=priority,
        metrics_port=base.metric_reporting_prometheus_port,
        status_min_interval_s=args.operator_status_interval,
        shard_labels=parse_shard(args.operator_shard),
    )

    async def main() -> None:
        asyncio.get_running_loop().set_default_executor(
            concurrent.futures.ThreadPoolExecutor(
                max_workers=API_WORKER_THREADS, thread_name_prefix="planner"
            )
        )
        await run_operator(options)

    asyncio.run(main())
    return 0
