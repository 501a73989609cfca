"""Entry point of the ``planner`` command.

Each sub-command lives in its own module with ``register(subparsers)``, which adds its parser
and sets ``handler`` (a function of the parsed arguments returning an exit status). User
mistakes end with one line on stderr and the exit code of their error class; a traceback is
shown only with ``--debug``, which never changes the exit code.

The global options (``--log-level``, ``--log-format``, ``--debug``) are accepted before or
after the sub-command: ``planner replay --log-level WARNING`` is ``planner --log-level WARNING
replay``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
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
    report_cmd,
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
    report_cmd,
    run_cmd,
    operator_cmd,
    backtest_cmd,
)


GLOBAL_DEFAULTS = {"log_level": "INFO", "log_format": "text", "debug": False}


def _global_options(*, suppress_defaults: bool) -> argparse.ArgumentParser:
    """The options every command takes. On the sub-commands their defaults are suppressed, so
    a value given before the sub-command is not reset by the sub-parser's default."""
    options = argparse.ArgumentParser(add_help=False)

    def default(name: str) -> object:
        return argparse.SUPPRESS if suppress_defaults else GLOBAL_DEFAULTS[name]

    options.add_argument(
        "--log-level",
        default=default("log_level"),
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
        help="Least severe log level shown (default: INFO).",
    )
    options.add_argument(
        "--log-format",
        default=default("log_format"),
        choices=["text", "json"],
        help="Log line format.",
    )
    options.add_argument(
        "--debug",
        action="store_true",
        default=default("debug"),
        help="Show tracebacks for user errors too (the exit code stays the same).",
    )
    return options


class _SubParsers(argparse._SubParsersAction):
    """Adds the global options to every sub-command's parser, nested ones (``config show``)
    included."""

    def add_parser(self, name: str, **kwargs: object) -> argparse.ArgumentParser:
        parents = list(kwargs.pop("parents", None) or [])  # type: ignore[call-overload]
        kwargs["parents"] = [*parents, _global_options(suppress_defaults=True)]
        parser = super().add_parser(name, **kwargs)  # type: ignore[arg-type]
        parser.register("action", "parsers", _SubParsers)
        return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="planner",
        description="SLO-driven autoscaler for disaggregated LLM inference on Kubernetes.",
        epilog=flag_summary(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[_global_options(suppress_defaults=False)],
    )
    parser.add_argument("--version", action="version", version=f"planner {__version__}")
    parser.register("action", "parsers", _SubParsers)
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
        if user_error is None:
            raise
        if args.debug:
            # The traceback is for the reader; scripts keep seeing the error's own exit code.
            traceback.print_exception(exc, file=sys.stderr)
        print(f"planner: {user_error.kind}: {exc}", file=sys.stderr)
        return user_error.exit_code


if __name__ == "__main__":
    sys.exit(main())
