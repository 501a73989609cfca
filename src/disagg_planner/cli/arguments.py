"""Command-line arguments that several sub-commands share, defined once so that they mean the
same everywhere: durations, ``--skip-bad-rows``, and an output directory that is not
overwritten without ``--force``."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.errors import SpecError
from disagg_planner.predictors.traces.durations import DURATION_HINT, parse_seconds


def positive_seconds(text: str) -> float:
    """argparse type: a duration > 0 (``600``, ``10m``, ``1.5h``)."""
    try:
        value = parse_seconds(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a duration > 0 in {DURATION_HINT}")
    return value


def positive_number(text: str) -> float:
    """argparse type: a finite number > 0 (a time compression, a load factor)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a finite number > 0")
    return value


def non_negative_seconds(text: str) -> float:
    """argparse type: a number of seconds >= 0 (a delay, a spread)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of seconds >= 0")
    return value


def seconds_or_none(text: str) -> float | None:
    """argparse type: seconds >= 0, or ``none`` (no value: e.g. ``--startup-delay none``, the
    start-up phase model)."""
    if text.strip().lower() == "none":
        return None
    try:
        return non_negative_seconds(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected a number of seconds >= 0 or 'none'"
        ) from None


def add_skip_bad_rows(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--skip-bad-rows``: the trace reader counts and skips malformed rows (and warns with
    the first) instead of stopping at the first one."""
    parser.add_argument(
        "--skip-bad-rows",
        action="store_true",
        help="Count and skip malformed trace rows instead of stopping at the first one.",
    )


def add_force(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--force",
        action="store_true",
        help="Write into the output directory even if it already holds files.",
    )


def check_output_dir(path: Path, *, force: bool) -> None:
    """Refuse to write into a directory that already holds something, unless ``force``: a
    second run must not silently replace the first one's results."""
    if path.exists() and not path.is_dir():
        raise SpecError(f"output directory {str(path)!r} is a file: pass -o a directory")
    if not force and path.is_dir() and any(path.iterdir()):
        raise SpecError(
            f"output directory {str(path)!r} already exists and is not empty: pass --force to "
            "overwrite what is there, or -o another directory"
        )


def refuse_pool(config: PlannerConfig, command: str) -> None:
    """A ``pool`` is served by the operator (and ``planner replay --fleet``): ``command``
    plans one deployment alone, so it refuses the setting rather than ignore it."""
    if config.pool is not None:
        raise SpecError(
            f"pool = {config.pool!r}: {command} plans one deployment alone; a pool's members "
            "are planned by `planner operator` (replayed by `planner replay --fleet`)"
        )
