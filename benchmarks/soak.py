"""Soak of the diagnostics recorder: RSS and bytes on disk over 30 simulated days.

Usage::

    python benchmarks/soak.py [--days 30] [--cadence-s 5] [--window-hours 24]
        [--report-hours 24] [--keep 3] [--max-mib 768] [--no-write]

Feeds a :class:`disagg_planner.report.recorder.DiagnosticsRecorder`, configured as the
operator configures it (``report_window_hours``, a scheduled report every
``report_interval_hours`` keeping ``report_keep_files``, ``report_max_bytes`` over the whole
folder), one tick every ``--cadence-s`` simulated seconds (the load loop's 5 s cadence) for
``--days`` days, each tick shaped like a live one (four engines' queues, reasons, a
message). After every simulated day it samples the process RSS, the bytes the recorder holds
and the bytes of reports on disk. Both must be flat after the first window: the last day
within 10% of day 1.

Reports are rendered as the operator renders them, in a child process
(:mod:`disagg_planner.report.child`): rendered in place, the first report left plotly and
the render's peak heap in the process (RSS 74 -> 182 MiB at the first report, 1.89x day 1
on the last day, never back).

Baseline, measured in the same run: the recorder before issue 36 kept every tick as a
``TickSnapshot`` object in a ``deque(maxlen=50_000)``; the same ticks are held that way and
their size measured with ``tracemalloc``, against the bytes the rolling window holds.

What this is not: the whole live loop on the replay clock (Prometheus, the connector and the
core are left out); the recorder is what grew without bound. Output: printed, and (unless
``--no-write``) the block ``soak`` of ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import tracemalloc
from collections import deque
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

from results_block import markers, write_block  # noqa: E402

from disagg_planner.report.recorder import MAX_SNAPSHOTS, DiagnosticsRecorder  # noqa: E402
from disagg_planner.report.snapshot import EngineQueues, TickSnapshot  # noqa: E402

BEGIN, END = markers("soak")
DAY_S = 86_400


def rss_bytes() -> int:
    """The process's resident set now (Linux /proc)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def tick(t_s: float, i: int) -> TickSnapshot:
    engines = tuple(
        EngineQueues("decode" if k % 2 else "prefill", f"worker-{k}", 0, 300 + i % 97, 0, 9000 + k)
        for k in range(4)
    )
    return TickSnapshot(
        t_s=t_s,
        desired={"prefill": 2, "decode": 2 + (i // 720) % 2},
        ready={"prefill": 2, "decode": 2},
        gpus_in_use=8,
        gpu_hours=t_s / 3600 * 8,
        load_reason="hold_within_band",
        message="load loop: decode 2 ok (p95 ITL 18.2 ms within 25 ms)",
        observed_rps=3.0 + (i % 60) / 10,
        observed_ttft_ms=80.0 + i % 13,
        observed_itl_ms=18.0 + (i % 7) / 10,
        engines=engines,
    )


def disk_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def baseline_bytes_per_tick(ticks: int) -> float:
    """Bytes per tick of the old representation: TickSnapshot objects in a deque."""
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    old: deque[TickSnapshot] = deque(maxlen=MAX_SNAPSHOTS)
    for i in range(ticks):
        old.append(tick(float(i * 5), i))
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return held / len(old)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--cadence-s", type=float, default=5.0)
    parser.add_argument("--window-hours", type=float, default=24.0)
    parser.add_argument("--report-hours", type=float, default=24.0)
    parser.add_argument("--keep", type=int, default=3)
    parser.add_argument("--max-mib", type=int, default=768)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)

    per_tick_old = baseline_bytes_per_tick(20_000)
    rows = []
    started = time.process_time()
    with tempfile.TemporaryDirectory(prefix="planner-soak-") as folder:
        root = Path(folder)
        recorder = DiagnosticsRecorder(
            output_dir=root / "ns" / "dgd",
            report_interval_hours=args.report_hours,
            window_hours=args.window_hours,
            keep_files=args.keep,
            max_bytes=args.max_mib * 1024 * 1024,
            disk_root=root,
            stagger_key="ns/dgd",
            title="soak",
            render_in_child=True,  # as the operator's (runtime/service.make_recorder)
        )
        ticks_per_day = int(DAY_S / args.cadence_s)
        reports = 0
        i = 0
        for day in range(1, args.days + 1):
            for _ in range(ticks_per_day):
                if recorder.record(tick(i * args.cadence_s, i)) is not None:
                    reports += 1
                i += 1
            rows.append(
                (day, rss_bytes(), recorder.ticks.nbytes, len(recorder), disk_bytes(root), reports)
            )
            _, rss, held, kept, disk, _ = rows[-1]
            print(
                f"day {day:2d}: RSS {rss / 2**20:7.1f} MiB, window {held / 2**20:6.2f} MiB "
                f"({kept} ticks), reports on disk {disk / 2**20:7.1f} MiB, {reports} written",
                flush=True,
            )
    cpu_s = time.process_time() - started
    first, last = rows[0], rows[-1]
    window_per_tick = last[2] / max(1, last[3])
    lines = [
        BEGIN,
        "## Soak: the diagnostics recorder over 30 simulated days (issue 36)",
        "",
        f"`python benchmarks/soak.py --days {args.days} --cadence-s {args.cadence_s:g} "
        f"--window-hours {args.window_hours:g} --report-hours {args.report_hours:g} --keep "
        f"{args.keep} --max-mib {args.max_mib}` ({cpu_s:.0f} s CPU in this process; a loaded "
        "2-core machine). Reports are rendered in a child process, as the operator renders "
        "them (disagg_planner.report.child); the RSS is this process's.",
        "",
        "| day | RSS MiB | window MiB | ticks kept | reports on disk MiB | reports written |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for day, rss, held, kept, disk, written in rows:
        lines.append(
            f"| {day} | {rss / 2**20:.1f} | {held / 2**20:.2f} | {kept} | {disk / 2**20:.1f} |"
            f" {written} |"
        )
    rss_ratio = last[1] / first[1]
    disk_ratio = last[4] / first[4] if first[4] else float("nan")
    full = next((row for row in rows if row[5] >= args.keep), last)  # K reports on disk
    full_ratio = last[4] / full[4] if full[4] else float("nan")
    lines += [
        "",
        f"- RSS last day / day 1: {rss_ratio:.3f} (target within 10%: "
        f"{'met' if abs(rss_ratio - 1) <= 0.10 else 'MISSED'}).",
        f"- Report bytes on disk, last day / day 1: {disk_ratio:.3f} (day 1 holds "
        f"{first[5]} report(s); the folder is capped at {args.max_mib} MiB and {args.keep} "
        f"reports); last day / day {full[0]}, the first with {args.keep} reports: "
        f"{full_ratio:.3f}.",
        f"- Bytes per tick held: {window_per_tick:.0f} in the rolling window against "
        f"{per_tick_old:.0f} as TickSnapshot objects (the old deque, tracemalloc): "
        f"{per_tick_old / window_per_tick:.1f}x less.",
        END,
    ]
    block = "\n".join(lines)
    print(block)
    if not args.no_write:
        write_block("soak", block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
