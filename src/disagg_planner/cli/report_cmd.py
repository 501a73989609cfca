"""``planner report``: rebuild a comparison page from earlier replays' output folders."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from disagg_planner.errors import SpecError


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "report",
        help="Build a comparison report from earlier replays' output folders.",
        description="Read the folders planner replay wrote (one per policy: summary.json, "
        "timeline.csv, requests.csv) and write one page with each policy's headline (SLO "
        "attainment, GPU-hours, ratios to the oracle and the best static policy) and their "
        "replica, GPU and latency curves overlaid. A folder holding several policies' "
        "folders (replay -o with several --policy) stands for all of them.",
    )
    parser.add_argument(
        "--compare",
        nargs="+",
        metavar="DIR",
        required=True,
        type=Path,
        help="Replay output folders to compare (a policy's folder, or a run's -o folder).",
    )
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        default=Path("comparison.html"),
        help="Where to write the page (a .html file, or a folder; default comparison.html).",
    )
    parser.add_argument("--title", default="planner replay: comparison", help="Page title.")
    parser.set_defaults(handler=_report)


def policy_folders(paths: list[Path]) -> list[Path]:
    """Each path as given when it holds a summary.json, else its sub-folders that do (the
    ``-o`` folder of a multi-policy replay), in order."""
    out: list[Path] = []
    for path in paths:
        if not path.is_dir():
            raise SpecError(f"--compare {path}: no such directory")
        if (path / "summary.json").is_file():
            out.append(path)
            continue
        children = sorted(p for p in path.iterdir() if (p / "summary.json").is_file())
        if not children:
            raise SpecError(
                f"--compare {path}: neither it nor any folder in it has a summary.json "
                "(expected planner replay's output folder)"
            )
        out.extend(children)
    return out


def _report(args: argparse.Namespace) -> int:
    from disagg_planner.replay.report import write_comparison

    path = write_comparison(args.output, policy_folders(args.compare), title=args.title)
    print(f"wrote {path} (open it in a browser)")
    return 0
