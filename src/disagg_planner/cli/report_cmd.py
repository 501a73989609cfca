"""``planner report``: rebuild a comparison page from earlier replays' output folders, or
fetch a running planner's diagnostics report of one deployment (``--live``)."""

from __future__ import annotations

import argparse
import urllib.error
import urllib.request
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
        "folders (replay -o with several --policy) stands for all of them. With --live, "
        "fetch the diagnostics report a running planner or operator renders on demand from "
        "its rolling window of ticks instead.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--compare",
        nargs="+",
        metavar="DIR",
        type=Path,
        help="Replay output folders to compare (a policy's folder, or a run's -o folder).",
    )
    source.add_argument(
        "--live",
        metavar="URL",
        help="A running planner's metrics address (http://host:port, the "
        "metric_reporting_prometheus_port); needs --deployment.",
    )
    parser.add_argument(
        "--deployment",
        metavar="NAMESPACE/NAME",
        help="With --live: the DynamoGraphDeployment whose report to fetch.",
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


def live_report_url(base: str, deployment: str | None) -> str:
    """The report endpoint of ``deployment`` (``namespace/name``) on the server ``base``."""
    parts = (deployment or "").split("/")
    if len(parts) != 2 or not all(parts):
        raise SpecError(f"--deployment {deployment!r}: expected NAMESPACE/NAME with --live")
    return f"{base.rstrip('/')}/report/{parts[0]}/{parts[1]}"


def _fetch_live(args: argparse.Namespace) -> int:
    url = live_report_url(args.live, args.deployment)
    try:
        with urllib.request.urlopen(url, timeout=120) as answer:
            html = answer.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace").strip()
        raise SpecError(f"{url}: {exc.code} {detail}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise SpecError(f"{url}: cannot reach the planner ({exc})") from exc
    output = args.output / "report.html" if args.output.is_dir() else args.output
    if output == Path("comparison.html"):
        output = Path(f"{args.deployment.replace('/', '-')}.html")
    output.write_bytes(html)
    print(f"wrote {output} (open it in a browser)")
    return 0


def _report(args: argparse.Namespace) -> int:
    from disagg_planner.replay.comparison import write_comparison

    if args.live is not None:
        return _fetch_live(args)
    path = write_comparison(args.output, policy_folders(args.compare), title=args.title)
    print(f"wrote {path} (open it in a browser)")
    return 0
