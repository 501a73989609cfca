"""Peak memory of the README's "policies side by side on my traffic" replay.

Usage::

    python benchmarks/replay_memory.py [--trace FILE] [--scale-load 8] [--duration 10m]
        [--limit-gib 4] [--timeout-s 7200]

Runs, as a child process, exactly the README's command::

    planner replay --trace FILE --scale-load 8 --policy planner --policy dynamo-default \\
        --policy hpa --policy oracle -o OUT

on the Mooncake conversation trace (``$PLANNER_TRACE_DIR/mooncake_conversation_trace.jsonl``
by default), its stderr passed through (progress lines every 30 s without a terminal), and
prints the peak resident set of its largest process (``getrusage(RUSAGE_CHILDREN)``: the
replay and its worker processes), the wall time, and whether it stayed under ``--limit-gib``
(issue 33: 21.7 GB before the reference searches were bounded). ``--duration`` keeps only the
first arrivals (a shorter run on a busy machine; say so when quoting it).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
POLICIES = ("planner", "dynamo-default", "hpa", "oracle")
TRACE = "mooncake_conversation_trace.jsonl"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_trace = Path(os.environ.get("PLANNER_TRACE_DIR", "traces")) / TRACE
    parser.add_argument("--trace", type=Path, default=default_trace)
    parser.add_argument("--scale-load", default="8")
    parser.add_argument("--duration", help="keep arrivals before this time (e.g. 10m)")
    parser.add_argument("--limit-gib", type=float, default=4.0)
    parser.add_argument("--timeout-s", type=float, default=7200.0)
    args = parser.parse_args(argv)
    if not args.trace.is_file():
        parser.error(
            f"--trace {args.trace}: no such file (download the Mooncake conversation trace and "
            "point PLANNER_TRACE_DIR at its folder)"
        )
    with tempfile.TemporaryDirectory() as out:
        command = [
            sys.executable, "-m", "disagg_planner", "replay",
            "--trace", str(args.trace), "--scale-load", args.scale_load,
            *(("--duration", args.duration) if args.duration else ()),
            *(arg for policy in POLICIES for arg in ("--policy", policy)),
            "-o", out,
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
        started = time.monotonic()
        try:
            done = subprocess.run(command, env=env, timeout=args.timeout_s, check=False)
            code: int | str = done.returncode
        except subprocess.TimeoutExpired:
            code = f"stopped after {args.timeout_s:g} s"
        wall = time.monotonic() - started
    peak_gib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024 / 2**30
    verdict = "under" if peak_gib < args.limit_gib else "OVER"
    print(
        f"planner {' '.join(command[3:-2])}\n"
        f"exit {code}, wall {wall:.0f} s, peak RSS of its largest process {peak_gib:.2f} GiB: "
        f"{verdict} the {args.limit_gib:g} GiB target"
    )
    return 0 if code == 0 and peak_gib < args.limit_gib else 1


if __name__ == "__main__":
    sys.exit(main())
