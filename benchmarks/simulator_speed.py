"""How much faster than real time the cluster simulator replays a trace, against a baseline.

Usage::

    python benchmarks/simulator_speed.py [TRACE] [--engine SPEC] [--prefill N] [--decode N]
        [--repeat R] [--fpm-callback] [--scale-load K] [--duration S]
        [--planner] [--enable-load-scaling] [--baseline REV | --no-baseline]

Replays every request of ``TRACE`` (any format ``disagg_planner.predictors.traces`` reads;
default: the Azure 2023 conversation trace in ``$PLANNER_TRACE_DIR``, see ``tests/traces.py``)
and prints simulated seconds / wall seconds, the figure issues 5 and 16 ask for (issue 5:
>= 60x, aim 300x, for the one-hour Azure conversation trace on a fixed cluster; issue 16:
>= 300x for that trace at ``--scale-load 8`` under the default planner, >= 150x with the
load-based loop). Two workloads:

- default: a fixed disaggregated cluster (2 prefill + 2 decode replicas of
  ``sim:llama-3.1-8b-fp8@h200_sxm:tp1``) advanced one ``run_until`` per ``--step-s``, the
  trace read lazily inside the timing;
- ``--planner`` (``--enable-load-scaling`` adds the load-based loop): the whole
  ``planner replay --trace TRACE --scale-load 8 --max-gpu-budget -1`` run under the
  default planner on the bundled H200 profile (``--scale-load`` defaults to 8 here, to 1
  otherwise), the time of ``replay.session.run`` (building the cluster, the run, the
  summary) for the planner policy alone; a short replay first warms up the imports (the
  ARIMA predictor's libraries). ``--references`` times the whole replay instead, with the
  references its summary compares with (the oracle's plan search, the best static
  deployment's search, and both runs: about ten more simulations of the trace).

The same measurement is made with the code of ``--baseline REV`` (default ``BASELINE_REV``,
the commit before the simulator was optimised for issue 16): REV is checked out with
``git worktree add`` into a temporary folder, the runs alternate between the two trees (each
one in a subprocess with that tree's ``src`` first on ``PYTHONPATH``) and the folder is
removed afterwards. Both speeds are printed side by side with their ratio, and whether the
two trees produced the same request records (a digest of every record). The best of
``--repeat`` runs of each is reported, since other work on a shared machine only slows a
run; the ratio of the bests is the figure to compare across machines.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

# Run as a script, this folder comes first on sys.path, and benchmarks/predictors.py would
# shadow the predictors package: look in the repository root first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from disagg_planner.predictors.traces import read_trace
from disagg_planner.simulator.cluster import Cluster
from tests.traces import AZURE_CONV, for_script

REPO_ROOT = Path(__file__).resolve().parents[1]
# The last commit before the simulator's speed-ups of issue 16 (item 5): its golden-output
# test, recorded with this code, is tests/unit/simulator/test_golden_replay.py.
BASELINE_REV = "14c27446cf17d68183603c6d1098d480594304be"
PLANNER_PROFILE = "h200_sxm/vllm/llama-3.1-8b-fp8/tp1"  # planner replay's default
FIXED_CLUSTER_ENGINE = "sim:llama-3.1-8b-fp8@h200_sxm:tp1"
CLONE_JITTER_S = 30.0  # planner replay's default --clone-jitter


def _until(requests: Iterable[Any], limit_s: float) -> Iterator[Any]:
    for r in requests:
        if r.arrival_s >= limit_s:
            return
        yield r


def _records_digest(records: Iterable[Any]) -> str:
    """Every field a record's outcome has, exactly (repr of the floats)."""
    h = hashlib.sha256()
    for r in records:
        fields = (r.request_id, r.arrival_s, r.first_token_s, r.finish_s, r.ok, r.preemptions)
        h.update(repr(fields).encode())
    return h.hexdigest()[:16]


def run_cluster(args: argparse.Namespace) -> dict[str, Any]:
    from disagg_planner.simulator.workloads import scale_load

    fpm_count = 0

    def count(_fpm: object) -> None:
        nonlocal fpm_count
        fpm_count += 1

    engine = args.engine or FIXED_CLUSTER_ENGINE
    cluster = Cluster(
        engines={"prefill": engine, "decode": engine},
        replicas={"prefill": args.prefill, "decode": args.decode},
        on_fpm=count if args.fpm_callback else None,
    )
    start = time.perf_counter()
    cpu0 = time.process_time()
    source: Iterable[Any] = read_trace(args.trace)
    if args.duration is not None:
        source = _until(source, args.duration)
    if args.scale_load != 1.0:
        source = scale_load(source, args.scale_load, jitter_s=CLONE_JITTER_S)
    cluster.submit(source)
    # Advance the way a replay drives it: one call per scrape interval.
    t = 0.0
    while not cluster.idle:
        t += args.step_s
        cluster.run_until(t)
    wall = time.perf_counter() - start
    ok = [r for r in cluster.records if r.ok]
    ttft = [r.ttft_ms for r in ok if r.ttft_ms is not None]
    itl = [r.itl_ms for r in ok if r.itl_ms is not None]
    return {
        "sim_s": cluster.now,
        "wall_s": wall,
        "cpu_s": time.process_time() - cpu0,
        "requests": len(cluster.records),
        "ok": len(ok),
        "fpms": fpm_count,
        "digest": _records_digest(cluster.records),
        "note": (
            f"mean TTFT {statistics.fmean(ttft):.1f} ms, mean ITL {statistics.fmean(itl):.2f} "
            f"ms, GPU-hours {cluster.gpu_seconds / 3600:.2f}"
            if ttft and itl
            else ""
        ),
    }


def run_planner(args: argparse.Namespace) -> dict[str, Any]:
    from disagg_planner.config import load_config
    from disagg_planner.replay.session import WorkloadSpec, prepare, run

    flags: dict[str, Any] = {"profile": PLANNER_PROFILE, "max_gpu_budget": -1}
    if args.enable_load_scaling:
        flags["enable_load_scaling"] = True
    config = load_config(config_arg=None, flags=flags).config

    def plan_for(duration: float | None) -> Any:
        spec = WorkloadSpec(
            trace=str(args.trace),
            scale_load=args.scale_load,
            duration_s=duration,
            clone_jitter_s=CLONE_JITTER_S,
        )
        # --engine: the simulated cluster's engine model (the planner still sizes from the
        # bundled profile); by default the profile's own
        return prepare(config, spec, engine=args.engine)

    # The policy's own run: the references its summary compares with (the oracle's and the
    # best static deployment's searches and runs, replay/bounds.py) are other simulations,
    # timed apart with --references; a baseline older than them has no such parameter.
    kwargs: dict[str, Any] = {}
    if "references" in inspect.signature(run).parameters:
        kwargs["references"] = args.references
    elif args.references:
        raise SystemExit("--references: this tree's replay has no references to time")
    run(plan_for(30.0), "planner", progress=False, **kwargs)  # warm-up: imports, tables
    plan = plan_for(args.duration)
    start = time.perf_counter()
    cpu0 = time.process_time()
    result = run(plan, "planner", progress=False, **kwargs)
    wall = time.perf_counter() - start
    # the baseline's tree (--baseline REV) may predate the typed summary: a dict there
    s = result.summary if isinstance(result.summary, dict) else result.summary.to_json()
    return {
        "sim_s": float(s["duration_s"]),
        "wall_s": wall,
        "cpu_s": time.process_time() - cpu0,
        "requests": int(s["requests"]),
        "ok": int(s["completed"]),
        "fpms": 0,
        "digest": _records_digest(result.records),
        "note": (
            f"SLO both {s['slo_attainment']['both']:.2%}, TTFT p99 {s['ttft_ms']['p99']:.0f} ms, "
            f"GPU-hours {s['gpu_hours']:.3f}, scale actions {s['scale_actions']}"
        ),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    return run_planner(args) if args.planner else run_cluster(args)


def _speed(m: dict[str, Any]) -> float:
    return float(m["sim_s"] / m["wall_s"])


def _line(m: dict[str, Any]) -> str:
    return (
        f"{m['requests']} requests ({m['ok']} ok), simulated {m['sim_s']:.1f} s in "
        f"{m['wall_s']:.2f} s wall ({m['cpu_s']:.2f} s CPU) -> {_speed(m):.0f}x real time"
        + (f", {m['fpms']} FPMs" if m["fpms"] else "")
    )


def _in_subprocess(argv: list[str], src: Path | None) -> dict[str, Any]:
    """One measurement in a fresh interpreter; ``src``: the tree whose code it runs."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(src), env.get("PYTHONPATH")]))
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), *argv, "--worker"],
        env=env,
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def compare(args: argparse.Namespace, argv: list[str]) -> int:
    rev = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "rev-parse", "--verify", f"{args.baseline}^{{commit}}"],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout.strip()
    short = rev[:7]
    workload = "planner replay" if args.planner else "fixed cluster"
    if args.enable_load_scaling:
        workload += " with the load-based loop"
    print(f"{Path(args.trace).name} x{args.scale_load:g}, {workload}; baseline {short}")
    with tempfile.TemporaryDirectory(prefix="simulator-speed-") as tmp:
        tree = Path(tmp) / "baseline"
        subprocess.run(
            ["git", "-C", str(REPO_ROOT), "worktree", "add", "--detach", "-q", str(tree), rev],
            check=True,
        )
        try:
            base: list[dict[str, Any]] = []
            new: list[dict[str, Any]] = []
            for i in range(max(1, args.repeat)):
                # Alternate, so that a slow spell of the shared machine hits both alike.
                base.append(_in_subprocess(argv, tree / "src"))
                new.append(_in_subprocess(argv, REPO_ROOT / "src"))
                print(f"run {i + 1}: baseline   {_line(base[-1])}")
                print(f"run {i + 1}: this tree  {_line(new[-1])}")
        finally:
            subprocess.run(
                ["git", "-C", str(REPO_ROOT), "worktree", "remove", "--force", str(tree)],
                check=False,
            )
    for label, ms in (("baseline", base), ("this tree", new)):
        if ms[-1]["note"]:
            print(f"{label}: {ms[-1]['note']}")
    b = max(_speed(m) for m in base)
    n = max(_speed(m) for m in new)
    same = len({m["digest"] for m in base + new}) == 1
    print(
        f"speed (best of {len(new)}): baseline {short} {b:.0f}x real time, this tree "
        f"{n:.0f}x real time -> {n / b:.2f}x faster"
    )
    print(f"same request records as the baseline: {'yes' if same else 'NO'}")
    return 0 if math.isfinite(n) and same else 1


def main(argv: list[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "trace",
        nargs="?",
        help=f"trace file (Azure CSV, Mooncake JSONL, ...; default: {AZURE_CONV.name} in "
        "$PLANNER_TRACE_DIR)",
    )
    parser.add_argument(
        "--engine",
        help=f"engine model of the simulated cluster (default {FIXED_CLUSTER_ENGINE}; with "
        "--planner the profile's own), e.g. aic:llama-3.1-8b-fp8@h200_sxm",
    )
    parser.add_argument("--prefill", type=int, default=2)
    parser.add_argument("--decode", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--step-s", type=float, default=5.0, help="virtual seconds per run_until call"
    )
    parser.add_argument(
        "--fpm-callback", action="store_true", help="also build every iteration's FPM"
    )
    parser.add_argument(
        "--scale-load",
        type=float,
        default=None,
        help="clone each request K times, as planner replay does (default 8 with --planner, "
        "else 1)",
    )
    parser.add_argument("--duration", type=float, help="keep arrivals before this time (s)")
    parser.add_argument(
        "--planner", action="store_true", help="the whole replay under the default planner"
    )
    parser.add_argument(
        "--enable-load-scaling",
        action="store_true",
        help="with --planner: the load-based loop too (implies --planner)",
    )
    parser.add_argument(
        "--references",
        action="store_true",
        help="with --planner: time the whole replay, the references' searches and runs "
        "included (oracle, best static; one process, as `planner replay --jobs 1`); "
        "implies --no-baseline",
    )
    parser.add_argument(
        "--baseline",
        default=BASELINE_REV,
        metavar="REV",
        help=f"git revision to compare against (default {BASELINE_REV[:7]})",
    )
    parser.add_argument(
        "--no-baseline", action="store_true", help="measure this tree only, in this process"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(raw)
    args.trace = args.trace or for_script(AZURE_CONV)
    args.planner = args.planner or args.enable_load_scaling or args.references
    if args.references:
        args.no_baseline = True
    if args.scale_load is None:
        args.scale_load = 8.0 if args.planner else 1.0
    if args.worker:
        print(json.dumps(measure(args)))
        return 0
    if not args.no_baseline:
        worker_argv = [a for a in raw if a != "--no-baseline"]
        if not any(a == str(args.trace) for a in worker_argv):
            worker_argv.insert(0, str(args.trace))
        return compare(args, worker_argv)
    results = []
    m: dict[str, Any] = {}
    for i in range(max(1, args.repeat)):
        m = measure(args)
        results.append(_speed(m))
        print(f"run {i + 1}: {_line(m)}")
    if m["note"]:
        print(m["note"])
    best = max(results)
    print(f"speed: {best:.0f}x real time (best of {len(results)})")
    return 0 if math.isfinite(best) else 1


if __name__ == "__main__":
    sys.exit(main())
