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
replay and its worker processes), the peak of the whole tree's resident sets summed (the
replay and its ``--jobs`` workers are alive together, so the machine needs their sum: sampled
from ``/proc`` every ``--sample-s`` seconds), the wall time and CPU time, and whether the tree's
peak stayed under ``--limit-gib`` (issue 33: 21.7 GB before the reference searches were
bounded). ``--duration`` keeps only the
first arrivals (a shorter run on a busy machine; say so when quoting it).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
POLICIES = ("planner", "dynamo-default", "hpa", "oracle")
TRACE = "mooncake_conversation_trace.jsonl"


def tree_rss_bytes(root: int) -> int:
    """The resident sets of ``root`` and all its descendants summed, read from ``/proc``
    (0 where ``/proc`` is absent: not Linux)."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            # field 4 of stat is the parent; the name (field 2) may hold spaces, so split
            # after its closing parenthesis
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            pages = int((entry / "statm").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # the process ended while being read
        parents[int(entry.name)] = int(stat[1])
        rss[int(entry.name)] = pages * page
    tree = {root}
    grew = True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return sum(rss.get(pid, 0) for pid in tree)


class TreeSampler:
    """Samples :func:`tree_rss_bytes` of one process on a thread; keeps the peak."""

    def __init__(self, pid: int, every_s: float) -> None:
        self.peak = 0
        self._pid = pid
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss_bytes(self._pid))
            self._stop.wait(self._every_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_trace = Path(os.environ.get("PLANNER_TRACE_DIR", "traces")) / TRACE
    parser.add_argument("--trace", type=Path, default=default_trace)
    parser.add_argument("--scale-load", default="8")
    parser.add_argument("--duration", help="keep arrivals before this time (e.g. 10m)")
    parser.add_argument("--limit-gib", type=float, default=4.0)
    parser.add_argument("--timeout-s", type=float, default=7200.0)
    parser.add_argument("--sample-s", type=float, default=1.0, help="RSS sampling period")
    parser.add_argument("--jobs", help="passed to planner replay (default: its own)")
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
            *(("--jobs", args.jobs) if args.jobs else ()),
            *(arg for policy in POLICIES for arg in ("--policy", policy)),
            "-o", out,
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
        started = time.monotonic()
        child = subprocess.Popen(command, env=env)
        sampler = TreeSampler(child.pid, args.sample_s)
        try:
            code: int | str = child.wait(timeout=args.timeout_s)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            code = f"stopped after {args.timeout_s:g} s"
        finally:
            sampler.stop()
        wall = time.monotonic() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    largest_gib = usage.ru_maxrss * 1024 / 2**30
    tree_gib = sampler.peak / 2**30
    verdict = "under" if tree_gib < args.limit_gib and largest_gib < args.limit_gib else "OVER"
    print(
        f"planner {' '.join(command[3:-2])}\n"
        f"exit {code}, wall {wall:.0f} s, CPU {usage.ru_utime + usage.ru_stime:.0f} s; peak RSS "
        f"of its largest process {largest_gib:.2f} GiB, of all its processes together "
        f"{tree_gib:.2f} GiB (sampled every {args.sample_s:g} s): {verdict} the "
        f"{args.limit_gib:g} GiB target"
    )
    return 0 if code == 0 and verdict == "under" else 1


if __name__ == "__main__":
    sys.exit(main())
