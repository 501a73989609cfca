"""Kubernetes API calls, CPU and RSS per DGD for 10, 100 and 1,000 deployments in one process,
with the DGD/adapter watch caches against the per-tick GETs they replace.

Usage::

    python benchmarks/operator_scale.py [--counts 10 100 1000] [--rounds 5] [--no-write]

Starts kmock as a stand-alone API server (``tests/e2e/kmock_server.py``, its request log
counts every request), creates N DGDs (a frontend, a prefill and a decode worker each, no
scaling adapter), builds N :class:`KubernetesConnector` as the operator does (the planner's
API client, 64-connection pool, urllib3 retries off), and reads every deployment once per
round (``status()``, what every tick does before it decides), all N concurrently, for
``--rounds`` rounds: first without watch caches (a GET of the DGD and one of each role's
adapter per read: the code before issue 36), then with one shared :class:`WatchCaches`.
kmock saturates before the planner does (it matches each request against its whole
in-memory request log and serves one request at a time: tens of milliseconds per request on
this machine), so the polling baseline is run only up to ``--poll-max`` deployments. Printed
per N: API requests per DGD per tick and per minute at the 15 s fast-check cadence,
CPU seconds per tick and DGD, RSS after the rounds, and the wall time of a round (all N
reads: the lag from "due" to "read" for the last of them).

What this is not: the whole operator (kopf, Prometheus, the core's decisions and the status
patches, rate-limited by ``--status-interval``, are left out); the simulated Dynamo operator
is not run (no pods, nothing scales: the reads are the steady state). Output: printed, and
(unless ``--no-write``) the block ``operator-scale`` of ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
for path in (REPO / "src", REPO):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from kubernetes import client as k8s_client  # noqa: E402
from results_block import markers, write_block  # noqa: E402

from disagg_planner.config.schema import PlannerConfig  # noqa: E402
from disagg_planner.connectors.kubernetes import (  # noqa: E402
    KubernetesConnector,
    planner_api_client,
)
from disagg_planner.connectors.kubernetes.cache import WatchCaches  # noqa: E402
from disagg_planner.runtime.connector_settings import kubernetes_settings  # noqa: E402

BEGIN, END = markers("operator-scale")
NS = "default"
FAST_CHECK_S = 15.0


def rss_bytes() -> int:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def dgd(name: str) -> dict[str, Any]:
    def worker(sub: str) -> dict[str, Any]:
        return {
            "componentType": "worker",
            "subComponentType": sub,
            "replicas": 1,
            "resources": {"limits": {"gpu": "1"}},
        }

    return {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
        "spec": {
            "backendFramework": "vllm",
            "services": {
                "Frontend": {"componentType": "frontend", "replicas": 1},
                "prefill": worker("prefill"),
                "decode": worker("decode"),
            },
        },
        "status": {
            "state": "successful",
            "services": {
                s: {"replicas": 1, "readyReplicas": 1} for s in ("Frontend", "prefill", "decode")
            },
        },
    }


def count_lines(path: Path) -> int:
    with path.open("rb") as handle:
        return sum(1 for _ in handle)


async def measure(url: str, log: Path, n: int, rounds: int, *, cached: bool) -> dict[str, float]:
    configuration = k8s_client.Configuration()
    configuration.host = url
    api = planner_api_client(configuration)
    caches = WatchCaches(api) if cached else None
    connectors = []
    for i in range(n):
        config = PlannerConfig(
            dgd_name=f"g{i:04d}",
            kubernetes_namespace=NS,
            backend="vllm",
            max_gpu_budget=-1,
            report_interval_hours=None,
        )
        connectors.append(
            KubernetesConnector(kubernetes_settings(config), api_client=api, caches=caches)
        )
    await asyncio.gather(*(c.validate() for c in connectors))  # starts the watches
    if caches is not None:
        deadline = time.monotonic() + 60
        while not all(w.synced for c in connectors for w in c._watched.values()):
            if time.monotonic() > deadline:
                raise SystemExit("the watch caches did not sync within 60 s")
            await asyncio.sleep(0.05)
        await asyncio.gather(*(c.status() for c in connectors))  # warm
    before_requests, before_cpu = count_lines(log), time.process_time()
    walls = []
    for _ in range(rounds):
        start = time.monotonic()
        await asyncio.gather(*(c.status() for c in connectors))
        walls.append(time.monotonic() - start)
    requests = count_lines(log) - before_requests
    cpu = time.process_time() - before_cpu
    rss = rss_bytes()
    for c in connectors:
        await c.close()
    if caches is not None:
        caches.close()
    await asyncio.to_thread(api.close)
    per_tick = requests / (n * rounds)
    return {
        "calls_per_tick": per_tick,
        "calls_per_min": per_tick * 60.0 / FAST_CHECK_S,
        "cpu_ms_per_tick": 1000.0 * cpu / (n * rounds),
        "rss_mib": rss / 2**20,
        "round_s": max(walls),
    }


async def run(
    counts: Sequence[int], rounds: int, poll_max: int
) -> list[tuple[int, dict[str, Any]]]:
    rows = []
    for n in counts:
        with tempfile.TemporaryDirectory(prefix="planner-scale-") as folder:
            log = Path(folder) / "requests.jsonl"
            server = subprocess.Popen(
                [sys.executable, "-m", "tests.e2e.kmock_server", "--request-log", str(log)],
                cwd=REPO,
                stdout=subprocess.PIPE,
                text=True,
                env={**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{REPO}"},
            )
            try:
                assert server.stdout is not None
                url = server.stdout.readline().strip().removeprefix("KMOCK_URL=")
                configuration = k8s_client.Configuration()
                configuration.host = url
                api = planner_api_client(configuration)
                custom = k8s_client.CustomObjectsApi(api)
                for i in range(n):
                    custom.create_namespaced_custom_object(
                        "nvidia.com", "v1alpha1", NS, "dynamographdeployments", dgd(f"g{i:04d}")
                    )
                api.close()
                polled = await measure(url, log, n, rounds, cached=False) if n <= poll_max else None
                watched = await measure(url, log, n, rounds, cached=True)
            finally:
                server.terminate()
                server.wait(10)
        rows.append((n, {"poll": polled, "watch": watched}))
        print(n, rows[-1][1], flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", nargs="+", type=int, default=[10, 100, 1000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--poll-max", type=int, default=100)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    rows = asyncio.run(run(args.counts, args.rounds, args.poll_max))
    lines = [
        BEGIN,
        "## Operator scale: API calls per DGD, watch caches against polling (issue 36)",
        "",
        f"`python benchmarks/operator_scale.py --counts {' '.join(map(str, args.counts))} "
        f"--rounds {args.rounds} --poll-max {args.poll_max}` (kmock stand-alone, every DGD "
        "read once per round, all concurrently; a loaded 2-core machine). Calls per minute "
        "at the 15 s fast-check cadence; the operator's status patches are not counted.",
        "",
        "| DGDs | mode | API calls / DGD / tick | API calls / DGD / min | CPU ms / DGD / tick "
        "| RSS MiB | slowest round s |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for n, modes in rows:
        for mode in ("poll", "watch"):
            m = modes[mode]
            if m is None:
                lines.append(f"| {n} | {mode} | not run (kmock saturates) | | | | |")
                continue
            lines.append(
                f"| {n} | {mode} | {m['calls_per_tick']:.2f} | {m['calls_per_min']:.2f} | "
                f"{m['cpu_ms_per_tick']:.2f} | {m['rss_mib']:.0f} | {m['round_s']:.2f} |"
            )
    lines.append("")
    for n, modes in rows:
        poll, watch = modes["poll"], modes["watch"]
        if poll is None:
            lines.append(
                f"- {n} DGDs: watch only: {watch['calls_per_min']:.2f} API calls per DGD per "
                f"minute (target < 2), {watch['rss_mib']:.0f} MiB RSS."
            )
            continue
        lines.append(
            f"- {n} DGDs: CPU per read, watch / poll = "
            f"{watch['cpu_ms_per_tick'] / poll['cpu_ms_per_tick']:.2f}; API calls per DGD per "
            f"minute {poll['calls_per_min']:.2f} -> {watch['calls_per_min']:.2f} (target < 2)."
        )
    lines.append(END)
    block = "\n".join(lines)
    print(block)
    if not args.no_write:
        write_block("operator-scale", block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
