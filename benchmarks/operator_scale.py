"""Kubernetes API calls, CPU and RSS per DGD for 10, 100 and 1,000 deployments in one process,
with the DGD/adapter watch caches against the per-tick GETs they replace.

Usage::

    python benchmarks/operator_scale.py [--counts 10 100 1000] [--rounds 5] [--poll-max 100]
        [--policies 10 100 1000 [--duration-s 150] [--status-interval 30]] [--no-write]

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

``--policies 10 100 1000`` measures the whole planner loops instead (and first, the largest
count once more with every loop's schedule starting when the loop is ready, without the tick
phase of its own each policy has (the same code otherwise: the baseline of the same run,
unless ``--no-baseline``), each count
in its own process (``benchmarks/operator_policies.py``), against the light cluster
(``benchmarks/light_cluster.py``: an API server, the Dynamo operator's convergence and
Prometheus, counting requests instead of keeping them: kmock saturates near 100 DGDs): due ->
decided lag of every tick against its interval, CPU per tick, API calls per DGD per minute in
the steady part (the status writes included), RSS and memory per policy (the slope between
consecutive counts: the first policy also pays the modules the loops import), and what stopping
every loop leaves behind (threads, watch caches, metric series, tasks).

What the read rounds are not: the whole operator (kopf, Prometheus, the core's decisions and
the status patches are left out); the simulated Dynamo operator is not run (no pods, nothing
scales: the reads are the steady state). Output: printed, and
(unless ``--no-write``) the block ``operator-scale`` of ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
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


def run_policies(
    counts: Sequence[int], duration_s: float, status_interval_s: float, *, stagger: bool = True
) -> list[Any]:
    """One process per count (benchmarks/operator_policies.py); their JSON results."""
    results = []
    for n in counts:
        done = subprocess.run(
            [
                sys.executable,
                str(REPO / "benchmarks" / "operator_policies.py"),
                str(n),
                "--duration-s",
                str(duration_s),
                "--status-interval",
                str(status_interval_s),
                *([] if stagger else ["--no-stagger"]),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"{n} policies failed:\n{done.stderr[-3000:]}")
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), flush=True)
    return results


def status_per_min(r: dict[str, Any]) -> float:
    """The policy status writes per DGD per minute in the steady part."""
    writes = r["api_calls"].get("PATCH plannerpolicies/status", 0)
    return float(writes) / r["n"] / (r["steady_s"] / 60.0)


def share(fraction: float) -> str:
    """A share in percent, rounded down: 99.96% shows as 99.9%, never as 100.0%."""
    return f"{math.floor(1000 * fraction) / 10:.1f}%"


def lag_row(r: dict[str, Any]) -> str:
    """Where the steady lag goes: due -> tick started (the event loop busy) and the tick."""
    wake, tick, late = r["steady_wake_s"], r["steady_tick_s"], r["event_loop_late_s"]
    return (
        f"| {r['n']} | {'phase per policy' if r['stagger'] else 'none'} | "
        f"{share(r['steady']['within_10pct'])} / {share(r['within_10pct'])} | "
        f"{r['steady']['lag_p99_s']:.2f} / {r['steady']['lag_max_s']:.2f} | "
        f"{wake['p99']:.2f} / {wake['max']:.2f} | {tick['p50']:.3f} / {tick['p99']:.2f} | "
        f"{late['p99']:.3f} / {late['max']:.2f} | {r['loadavg_1m']:.1f} |"
    )


def policies_block(
    args: argparse.Namespace,
    results: Sequence[dict[str, Any]],
    baseline: dict[str, Any] | None = None,
) -> list[str]:
    lines = [
        "",
        f"`python benchmarks/operator_scale.py --policies "
        f"{' '.join(str(r['n']) for r in results)} --duration-s {args.duration_s:g} "
        f"--status-interval {args.status_interval:g}`: the whole planner loops (throughput "
        "interval 60 s, fast check 15 s, reports on, the operator's status writer), each "
        "count in its own process, against benchmarks/light_cluster.py (kmock saturates near "
        "100 DGDs); kopf itself is not run. Steady: from one throughput interval and one fast "
        "check after the start to the end. A loaded 2-core machine.",
        "",
        "| policies | steady ticks | decided within 10% of interval (steady / whole run) "
        "| steady lag p50 / p99 / max s | CPU ms / tick | planner cores | stand-in cores "
        "| load avg | API calls / DGD / min (status writes) | RSS MiB | MiB / policy |",
        "|---:|---:|---|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    previous: dict[str, Any] | None = None
    for r in results:
        steady = r["steady"]
        if previous is not None:
            slope = (r["rss_mib"] - previous["rss_mib"]) / (r["n"] - previous["n"])
            per_policy = f"{slope:.2f} (slope from {previous['n']})"
        else:
            per_policy = f"{r['mib_per_policy']:.2f} (with the loops' imports)"
        lines.append(
            f"| {r['n']} | {steady['ticks']} | {share(steady['within_10pct'])} / "
            f"{share(r['within_10pct'])} | {steady['lag_p50_s']:.2f} / "
            f"{steady['lag_p99_s']:.2f} / {steady['lag_max_s']:.2f} | "
            f"{r['cpu_ms_per_tick']:.1f} | {r['cpu_cores']:.2f} | {r['server_cores']:.2f} | "
            f"{r['loadavg_1m']:.1f} | {r['api_per_dgd_min']:.2f} ({status_per_min(r):.2f}) | "
            f"{r['rss_mib']:.0f} | {per_policy} |"
        )
        previous = r
    lines.append("")
    for r in results:
        calls = ", ".join(f"{k} {v}" for k, v in sorted(r["api_calls"].items())) or "none"
        down = r["shutdown"]
        lines.append(
            f"- {r['n']} policies: steady API calls {calls} in {r['steady_s']:.0f} s; "
            f"Prometheus {r['prometheus_per_dgd_min']:.1f} queries / DGD / min. All loops "
            f"stopped in {down['stop_s']:.2f} s, leaving {len(down['threads_left'])} "
            f"thread(s){' ' + str(down['threads_left']) if down['threads_left'] else ''}, "
            f"{down['watch_caches_left']} watch "
            f"cache(s), {down['metric_series_left']} metric series, {down['tasks_left']} "
            f"task(s); RSS {down['rss_mib']:.0f} MiB after the stop (the allocator keeps "
            "freed pages)."
        )
    big = results[-1]
    lines += [
        "",
        "Where the tick lag goes (steady part, seconds): loops whose schedules start when "
        "they are ready (no phase: the loops before issue 36's phases, with today's "
        "start-up) against each policy's own phase of its shortest cadence "
        "(core/schedule.py `staggered_start`, what the operator runs), same machine, one "
        "after the other. Wake: due -> the tick starts (the event loop and the worker "
        "threads busy with other ticks); tick: start -> decided, status write included; "
        "event loop: how late a 50 ms timer fires.",
        "",
        "| policies | tick phase | within 10% (steady / whole run) | lag p99 / max "
        "| wake p99 / max | tick p50 / p99 | event loop late p99 / max | load avg |",
        "|---:|---|---|---|---|---|---|---:|",
    ]
    if baseline is not None:
        lines.append(lag_row(baseline))
    lines.append(lag_row(big))
    if baseline is not None:
        lines += [
            "",
            f"- {big['n']} policies, steady lag p99 with phases / without: "
            f"{big['steady']['lag_p99_s'] / baseline['steady']['lag_p99_s']:.2f}; "
            f"ticks within 10% {share(baseline['steady']['within_10pct'])} -> "
            f"{share(big['steady']['within_10pct'])} (steady), "
            f"{share(baseline['within_10pct'])} -> {share(big['within_10pct'])} (whole run).",
        ]
    up = big["startup"]
    pauses = big["gc_pauses"]
    lines += [
        "",
        f"- {big['n']} policies, start-up (the {up['ticks']} ticks before the steady part, "
        f"seconds): {share(up['within_10pct'])} within 10%, {len(up['late_ticks'])} late; "
        f"wake p99 / max {up['wake_s']['p99']:.2f} / {up['wake_s']['max']:.2f}, tick p99 / "
        f"max {up['tick_s']['p99']:.2f} / {up['tick_s']['max']:.2f}, event loop late p99 / "
        f"max {up['event_loop_late_s']['p99']:.3f} / {up['event_loop_late_s']['max']:.2f}. "
        f"Each loop's set-up on the event loop thread (connector, recorder, loop) p50 / p99 "
        f"{1000 * up['setup_on_event_loop_s']['p50']:.2f} / "
        f"{1000 * up['setup_on_event_loop_s']['p99']:.2f} ms (the first, the kubernetes "
        f"client's models imported on first use, {up['setup_on_event_loop_s']['max']:.2f} s); "
        "every loop "
        f"ready (validated, core built, {up['setups_at_once']} at a time, its schedule started "
        f"then) {up['ready_s']['max']:.1f} s after the start; garbage-collector pauses of "
        f"50 ms or more: {len(pauses)} over the run, the longest "
        f"{max((d for *_, d in pauses), default=0.0):.2f} s.",
    ]
    slope = (
        (big["rss_mib"] - results[-2]["rss_mib"]) / (big["n"] - results[-2]["n"])
        if len(results) > 1
        else big["mib_per_policy"]
    )
    lines += [
        "",
        "Targets at the largest count:",
        "",
        f"- every due tick decided within 10% of its interval (steady): "
        f"{share(big['steady']['within_10pct'])} of {big['steady']['ticks']} "
        f"({'met' if big['steady']['within_10pct'] >= 1.0 else 'MISSED'}; the whole run, "
        f"start-up included: {share(big['within_10pct'])} of {big['ticks']}).",
        f"- RSS under 2 GB: {big['rss_mib']:.0f} MiB "
        f"({'met' if big['rss_mib'] * 2**20 < 2e9 else 'MISSED'}).",
        f"- under 2 API calls per DGD per minute: {big['api_per_dgd_min']:.2f} "
        f"({'met' if big['api_per_dgd_min'] < 2 else 'MISSED'}; of which the policy status "
        f"{status_per_min(big):.2f}: written when it changes and, while only measurements "
        f"move, at most every --status-interval {args.status_interval:g} s).",
        f"- at most 1.5 MB per policy: {slope * 2**20 / 1e6:.2f} MB "
        f"({'met' if slope * 2**20 <= 1.5e6 else 'MISSED'}).",
    ]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", nargs="+", type=int, default=[10, 100, 1000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--poll-max", type=int, default=100)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--policies", nargs="*", type=int, default=[])
    parser.add_argument("--duration-s", type=float, default=150.0)
    parser.add_argument("--status-interval", type=float, default=30.0)
    parser.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the largest count without tick phases (the loops before issue 36's phases)",
    )
    args = parser.parse_args(argv)
    baseline = (
        run_policies(args.policies[-1:], args.duration_s, args.status_interval, stagger=False)[0]
        if args.policies and not args.no_baseline
        else None
    )
    policies = run_policies(args.policies, args.duration_s, args.status_interval)
    rows = asyncio.run(run(args.counts, args.rounds, args.poll_max))
    lines = [
        BEGIN,
        "## Operator scale: watch caches against polling; whole policies up to 1,000 (issue 36)",
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
    if policies:
        lines += policies_block(args, policies, baseline)
    lines.append(END)
    block = "\n".join(lines)
    print(block)
    if not args.no_write:
        write_block("operator-scale", block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
