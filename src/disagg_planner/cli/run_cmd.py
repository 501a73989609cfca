"""``planner run``: one planner loop for one deployment (Dynamo's planner-as-a-service)."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from disagg_planner.cli.arguments import refuse_pool
from disagg_planner.config import load_config
from disagg_planner.config.flags import add_config_arguments, config_flags


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "run",
        help="Run one planner loop for one deployment until SIGTERM.",
        description="Run the planner for one deployment: with --environment kubernetes it "
        "scales the DynamoGraphDeployment named by --dgd-name (or DYN_PARENT_DGD_K8S_NAME) "
        "through the Kubernetes API (in-cluster service account, else the kubeconfig); with "
        "--environment virtual it publishes decisions over etcd for another orchestrator. "
        "Traffic comes from Prometheus (throughput loop) and ForwardPassMetrics over ZMQ "
        "(load loop). With --metric-reporting-prometheus-port it serves /metrics, /healthz "
        "and /readyz (ready after the first successful observation). SIGTERM or SIGINT "
        "stops it cleanly. Precedence of settings, lowest first: defaults < --config < "
        "environment (PLANNER_*, Dynamo's names) < flags.",
    )
    add_config_arguments(parser)
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from disagg_planner.runtime.service import serve

    loaded = load_config(config_arg=args.config, flags=config_flags(args))
    refuse_pool(loaded.config, "planner run")
    return asyncio.run(serve(loaded.config))
