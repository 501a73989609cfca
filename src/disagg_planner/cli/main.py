"""Entry point of the ``planner`` command.

Each sub-command lives in its own module with ``register(subparsers)``, which adds its parser
and sets ``handler`` (a function of the parsed arguments returning an exit status). User
mistakes end with one line on stderr and the exit code of their error class; a traceback is
shown only with ``--debug``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from types import ModuleType

from disagg_planner import __version__
from disagg_planner.cli import (
    backtest_cmd,
    config_cmd,
    operator_cmd,
    plan_cmd,
    profile_cmd,
    replay_cmd,
    run_cmd,
)
from disagg_planner.config.flags import flag_summary
from disagg_planner.errors import classify
from disagg_planner.logging_setup import configure_logging

log = logging.getLogger(__name__)

COMMANDS: tuple[ModuleType, ...] = (
    config_cmd,
    profile_cmd,
    plan_cmd,
    replay_cmd,
    run_cmd,
    operator_cmd,
    backtest_cmd,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="planner",
        description="SLO-driven autoscaler for disaggregated LLM inference on Kubernetes.",
        epilog=flag_summary(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"planner {__version__}")
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
        help="Least severe log level shown (default: INFO).",
    )
    parser.add_argument(
        "--log-format", default="text", choices=["text", "json"], help="Log line format."
    )
    parser.add_argument("--debug", action="store_true", help="Show tracebacks for user errors too.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return int(args.handler(args))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        user_error = classify(exc)
        if user_error is None or args.debug:
            raise
        print(f"planner: {user_error.kind}: {exc}", file=sys.stderr)
        return user_error.exit_code


if __name__ == "__main__":
    sys.exit(main())
