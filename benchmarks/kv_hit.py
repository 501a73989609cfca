"""What the KV prefix-hit discount (issue 35) saves: the planner on a trace with prompt reuse,
with the discount (the simulated router's observed hit rate, its default) and without it
(``kv_hit_rate: 0`` configured), on the same simulated cluster.

The simulator models each prefill engine's prefix cache from the trace's ``hash_ids``
(Mooncake's conversation trace has them) and exports the share of each prompt found in it as
Dynamo's router does (``dynamo_component_router_kv_hit_rate``); the planner reads that
histogram like any frontend metric.

    PLANNER_TRACE_DIR=../shared/traces python benchmarks/kv_hit.py [--duration 20m] \
        [--scale-load 4] [--write]

Prints one markdown table (the script's own output): SLO attainment, TTFT p99, GPU-hours, the
prefill share of them and the ratio to the run without the discount; ``--write`` puts the
same text into its block of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from results_block import markers, write_block

from disagg_planner.replay.replay_summary import SUMMARY_FILE, ReplaySummary
from tests.traces import MOONCAKE_CONV, for_script

PROFILE = "h200_sxm/vllm/llama-3.1-8b-fp8/tp1"
RUNS = {"no discount (kv_hit_rate 0)": {"kv_hit_rate": 0}, "observed KV hit rate": {}}


def replay(
    trace: Path, out: Path, config: dict[str, Any], args: argparse.Namespace
) -> ReplaySummary:
    argv = [
        sys.executable, "-m", "disagg_planner", "replay", "--trace", str(trace),
        "--duration", args.duration, "--scale-load", str(args.scale_load),
        "--profile", PROFILE, "--ttft", "5000", "--itl", "20", "--policy", "planner",
        "--jobs", "1", "--config", json.dumps(config), "-o", str(out),
    ]  # fmt: skip
    subprocess.run(argv, check=True, capture_output=True, text=True)
    return ReplaySummary.read(out / SUMMARY_FILE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", default="20m")
    parser.add_argument("--scale-load", type=float, default=4.0)
    parser.add_argument("--write", action="store_true", help="write the RESULTS.md block")
    args = parser.parse_args(argv)
    trace = for_script(MOONCAKE_CONV)
    rows = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, config) in enumerate(RUNS.items()):
            rows.append((name, replay(trace, Path(tmp) / str(i), config, args)))
    base = rows[0][1].gpu_hours
    lines = [
        f"Mooncake conversation trace, first {args.duration}, x{args.scale_load:g}; {PROFILE}; "
        "TTFT 5000 ms, ITL 20 ms",
        "",
        "| planner | SLO both | TTFT p99 ms | GPU-h | prefill GPU-h | x no discount |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in rows:
        lines.append(
            f"| {name} | {s.slo_attainment.both:.2%} | {s.ttft_ms.p99:.0f} | "
            f"{s.gpu_hours:.2f} | {s.gpu_hours_by_role.get('prefill', 0.0):.2f} | "
            f"{s.gpu_hours / base:.2f} |"
        )
    lines += ["", f"{len(rows)} runs in {time.perf_counter() - t0:.0f} s"]
    text = "\n".join(lines)
    print(text)
    if args.write:
        begin, end = markers("kv-hit")
        command = "python benchmarks/kv_hit.py " + " ".join(argv or sys.argv[1:])
        write_block(
            "kv-hit",
            f"{begin}\n## KV prefix-hit discount (`benchmarks/kv_hit.py`, issue 35)\n\n"
            f"Command: `PLANNER_TRACE_DIR=../shared/traces {command.strip()}`; the script's "
            f"own output:\n\n{text}\n{end}",
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
